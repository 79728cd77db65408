//! Harness for the end-to-end tests: the real `ballast` binary started as
//! controller and node processes on loopback, with temp directories as
//! disks. Every process is killed in Drop, even when a test fails.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const BALLAST: &str = env!("CARGO_BIN_EXE_ballast");
pub const BALLASTCTL: &str = env!("CARGO_BIN_EXE_ballastctl");

/// A loopback address whose port is free and stays this test's: see
/// [`reserve_ports`].
pub fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], reserve_ports(SINGLE_PORTS, 1)))
}

/// Ports handed out one by one, and blocks of [`LOCAL_SPAN`] for
/// `ballast local`. Both lie below the kernel's ephemeral range (32768 and
/// up), which port-0 listeners and outgoing connections take from.
const SINGLE_PORTS: std::ops::Range<u16> = 20000..28000;
const LOCAL_BLOCKS: std::ops::Range<u16> = 28000..32000;
const LOCAL_SPAN: u16 = 150;

/// Reserves `span` ports in a row within `range` for the rest of this test
/// process, and returns the first. Each test runs in a process of its own
/// and the daemons it starts bind their ports later, so a port that is
/// merely free now can be taken meanwhile. A reservation is an exclusive
/// lock on a file named after the block, under the temp directory; the
/// kernel drops it when the process ends, however it ends. A block whose
/// ports some other program holds is skipped.
pub fn reserve_ports(range: std::ops::Range<u16>, span: u16) -> u16 {
    static HELD: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());
    let locks = std::env::temp_dir().join("ballast-test-ports");
    std::fs::create_dir_all(&locks).unwrap();
    let blocks = (range.end - range.start) / span;
    let first = (std::process::id() % u32::from(blocks)) as u16;
    for i in 0..blocks {
        let port = range.start + (first + i) % blocks * span;
        let file = std::fs::File::create(locks.join(format!("{port}.lock"))).unwrap();
        if file.try_lock().is_err() {
            continue;
        }
        if (port..port + span).all(|q| TcpListener::bind(("127.0.0.1", q)).is_ok()) {
            HELD.lock().unwrap().push(file);
            return port;
        }
    }
    panic!("no free block of {span} port(s) in {range:?}");
}

/// The soft limit of open files a container gets under containerd 2 and
/// systemd's defaults.
pub const CONTAINER_OPEN_FILES: u64 = 1024;

/// A process's soft and hard limits of open files, from
/// `/proc/PID/limits`.
pub fn open_files_limits(pid: i32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let n: Vec<u64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    (n[0], n[1])
}

/// A running daemon; SIGKILLed on drop.
pub struct Proc {
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    pub fn spawn(args: &[String], log: PathBuf) -> Proc {
        Proc::spawn_env(args, log, &[])
    }

    /// Like `spawn`, with environment variables set.
    pub fn spawn_env(args: &[String], log: PathBuf, env: &[(&str, &str)]) -> Proc {
        Proc::spawn_under(&[], args, log, env)
    }

    /// Like `spawn`, in a mount namespace of its own whose mounts are
    /// peers of this one's where these are shared (`unshare --mount
    /// --propagation unchanged`): as in a container whose volumes
    /// propagate both ways. The namespace ends with its last process.
    pub fn spawn_in_own_mounts(args: &[String], log: PathBuf) -> Proc {
        let unshare = ["unshare", "--mount", "--propagation", "unchanged", "--"];
        Proc::spawn_under(&unshare, args, log, &[])
    }

    /// Like `spawn`, with the soft limit of open files a container gets
    /// under containerd 2 (`CONTAINER_OPEN_FILES`), its hard limit this
    /// process's.
    pub fn spawn_as_in_a_container(args: &[String], log: PathBuf) -> Proc {
        Proc::spawn_limited(&[], args, log, &[], Some(CONTAINER_OPEN_FILES))
    }

    /// Runs `ballast args` under the command `prefix` (none: directly).
    fn spawn_under(prefix: &[&str], args: &[String], log: PathBuf, env: &[(&str, &str)]) -> Proc {
        Proc::spawn_limited(prefix, args, log, env, None)
    }

    /// `spawn_under`, with the soft limit of open files set to `open_files`
    /// when given.
    fn spawn_limited(
        prefix: &[&str],
        args: &[String],
        log: PathBuf,
        env: &[(&str, &str)],
        open_files: Option<u64>,
    ) -> Proc {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        use std::os::unix::process::CommandExt;
        let mut command = match prefix.split_first() {
            Some((program, rest)) => {
                let mut c = Command::new(program);
                c.args(rest).arg(BALLAST);
                c
            }
            None => Command::new(BALLAST),
        };
        if let Some(soft) = open_files {
            use nix::sys::resource::{Resource, getrlimit, setrlimit};
            let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
            // SAFETY: between fork and exec the hook makes one system call
            // and allocates nothing.
            unsafe {
                command.pre_exec(move || {
                    setrlimit(Resource::RLIMIT_NOFILE, soft, hard).map_err(std::io::Error::from)
                });
            }
        }
        // Its own process group, so that Drop also stops what it started
        // (a node's engine processes outlive the node by design).
        let child = command
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .process_group(0)
            .spawn()
            .unwrap();
        Proc { child, log }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig).unwrap();
    }

    /// Waits for the process to exit, up to `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let end = Instant::now() + limit;
        while Instant::now() < end {
            if let Some(s) = self.child.try_wait().unwrap() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(self.pid()),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `f` every 50 ms until it returns Some, or panics with `what`
/// after `limit`.
pub fn wait_for<T>(limit: Duration, what: &str, f: impl FnMut() -> Option<T>) -> T {
    wait_for_or(limit, what, f, String::new)
}

/// Like `wait_for`; on a timeout the panic also carries what `why`
/// returns then (the state that says why it never came).
pub fn wait_for_or<T>(
    limit: Duration,
    what: &str,
    mut f: impl FnMut() -> Option<T>,
    why: impl FnOnce() -> String,
) -> T {
    let end = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() >= end {
            panic!("timed out after {limit:?} waiting for {what}\n{}", why());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A blocking GET of a text body; None when the server is not answering.
pub fn get_text(url: &str) -> Option<String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let r = reqwest::Client::new()
            .get(url)
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .ok()?;
        r.text().await.ok()
    })
}

/// A blocking JSON GET; None when the server is not answering.
pub fn get_json(url: &str) -> Option<Value> {
    serde_json::from_str(&get_text(url)?).ok()
}

pub struct ControllerProc {
    pub proc: Proc,
    pub api: String,
    pub agent: SocketAddr,
    pub socket: PathBuf,
    pub store: PathBuf,
    /// What it was started with, to start it again.
    pub args: Vec<String>,
}

impl ControllerProc {
    /// A controller process just started with `args` (which name its
    /// `--api-listen` and `--agent-listen`), once its REST API answers.
    pub fn up(proc: Proc, args: Vec<String>, socket: PathBuf, store: PathBuf) -> ControllerProc {
        let api = format!("http://{}", flag(&args, "--api-listen"));
        let agent = flag(&args, "--agent-listen").parse().unwrap();
        wait_api(&api, &proc);
        ControllerProc {
            proc,
            api,
            agent,
            socket,
            store,
            args,
        }
    }

    /// Starts the controller again (after a crash) with the same flags,
    /// and waits until its API answers.
    pub fn restart(&mut self) {
        let log = self.proc.log.clone();
        self.proc = Proc::spawn(&self.args, log);
        wait_api(&self.api, &self.proc);
    }
}

pub fn wait_api(api: &str, proc: &Proc) {
    let end = Instant::now() + Duration::from_secs(30);
    while get_json(&format!("{api}/healthz")).is_none() {
        assert!(
            Instant::now() < end,
            "the controller's API did not answer in 30s; its log:\n{}",
            proc.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn controller_args(
    store: &Path,
    socket: &Path,
    api: SocketAddr,
    agent: SocketAddr,
    timeout: &str,
) -> Vec<String> {
    vec![
        "controller".into(),
        "--store".into(),
        format!("embedded:{}", store.display()),
        "--csi-endpoint".into(),
        format!("unix://{}", socket.display()),
        "--api-listen".into(),
        api.to_string(),
        "--agent-listen".into(),
        agent.to_string(),
        "--node-down-timeout".into(),
        timeout.into(),
        // The cluster token and CA of the test's directory (the store's):
        // every test runs with TLS on.
        "--cluster-token-file".into(),
        cluster_token(store.parent().unwrap()).display().to_string(),
        "--cluster-ca-dir".into(),
        cluster_ca_dir(store.parent().unwrap())
            .display()
            .to_string(),
    ]
}

/// The cluster CA's directory of the test directory `dir` (the
/// controller makes the CA there at its first start).
pub fn cluster_ca_dir(dir: &Path) -> PathBuf {
    dir.join("cluster-ca")
}

/// The token every controller and node of the test directory `dir`
/// shares (`--cluster-token-file`), made when first asked for.
pub fn cluster_token(dir: &Path) -> PathBuf {
    let path = dir.join("cluster-token");
    if !path.exists() {
        std::fs::write(
            &path,
            format!("test-cluster-token-{}\n", std::process::id()),
        )
        .unwrap();
    }
    path
}

/// Credentials for `role` from the CA of the test directory `dir` (which
/// its controller made): what a member of that cluster holds, for tests
/// that act as one.
pub fn credentials_as(dir: &Path, role: ballast::tls::Role) -> ballast::tls::Credentials {
    let ca = ballast::tls::Ca::in_dir(&cluster_ca_dir(dir)).unwrap();
    ca.issue(&role).unwrap()
}

/// A member of the cluster of `dir` as `role`: its token and a certificate.
pub fn member_as(dir: &Path, role: ballast::tls::Role) -> ballast::tls::Member {
    ballast::tls::Member {
        token: ballast::cluster_token::ClusterToken::read(&cluster_token(dir)).unwrap(),
        tls: ballast::tls::Tls::on(credentials_as(dir, role)).unwrap(),
    }
}

/// Node `node`'s replica transport in the cluster of `dir`.
pub fn wire_as(dir: &Path, node: &str) -> ballast_node::wire::tls::WireTls {
    let creds = credentials_as(dir, ballast::tls::Role::Node(node.into()));
    ballast_node::wire::tls::WireTls::new(&creds, node).unwrap()
}

/// Node `node`'s replica transport as a reader of `volume`, with a
/// certificate as the controller gives one (IssueReader), in the cluster
/// of `dir`.
pub fn reader_wire_as(dir: &Path, volume: &str, node: &str) -> ballast_node::wire::tls::WireTls {
    let ca = ballast::tls::Ca::in_dir(&cluster_ca_dir(dir)).unwrap();
    let key = ballast::tls::Enrollment::new(node).unwrap();
    let cert = ca.sign_reader(node, volume, &key.csr_pem).unwrap();
    let creds = key.finish(ca.cert_pem(), &cert);
    ballast_node::wire::tls::WireTls::new(&creds, node).unwrap()
}

/// The replica transport of an engine of `volume` on `node`, started for
/// the volume's attachment `epoch` (which it claims), with credentials as
/// the controller issues them, in the cluster of `dir`.
pub fn engine_wire_as(
    dir: &Path,
    volume: &str,
    node: &str,
    epoch: u64,
) -> ballast_node::wire::tls::WireTls {
    let creds = engine_credentials(dir, volume, node, epoch);
    ballast_node::wire::tls::WireTls::new(&creds, node)
        .unwrap()
        .for_attachment(epoch)
}

/// A member of the cluster of `dir` as the engine of `volume` on `node`
/// started for its attachment `epoch`: the token and that engine's
/// certificate, as the controller issues it.
pub fn engine_member_as(dir: &Path, volume: &str, node: &str, epoch: u64) -> ballast::tls::Member {
    ballast::tls::Member {
        token: ballast::cluster_token::ClusterToken::read(&cluster_token(dir)).unwrap(),
        tls: ballast::tls::Tls::on(engine_credentials(dir, volume, node, epoch)).unwrap(),
    }
}

/// The credentials of an engine of `volume` on `node` for the volume's
/// attachment `epoch`, as the controller issues them, in the cluster of
/// `dir`.
fn engine_credentials(
    dir: &Path,
    volume: &str,
    node: &str,
    epoch: u64,
) -> ballast::tls::Credentials {
    let ca = ballast::tls::Ca::in_dir(&cluster_ca_dir(dir)).unwrap();
    ca.issue_engine(volume, node, epoch).unwrap()
}

/// The status of a replica client's refusal (DENIED, FENCED, ...).
pub fn refusal(e: &ballast_node::wire::client::ClientError) -> u32 {
    match e {
        ballast_node::wire::client::ClientError::Failed { status, .. } => *status,
        other => panic!("not a refusal: {other}"),
    }
}

/// A credentials directory (`ballast engine --tls-dir`) of an engine of
/// `volume` on `node` for the volume's attachment `epoch`, as the
/// controller issues them, in the cluster of `dir`.
pub fn engine_tls_dir(dir: &Path, volume: &str, node: &str, epoch: u64) -> PathBuf {
    let path = dir.join(format!("{volume}.engine-tls"));
    engine_credentials(dir, volume, node, epoch)
        .save(&path)
        .unwrap();
    path
}

/// The header of a replica protocol request `op` at offset 0, with `len`
/// bytes of payload (or of data to read).
pub fn replica_header(op: ballast_node::wire::protocol::Op, id: u64, len: u32) -> Vec<u8> {
    ballast_node::wire::protocol::Request {
        op,
        flags: 0,
        id,
        offset: 0,
        len,
        revision: 0,
    }
    .encode()
    .to_vec()
}

/// A blocking TLS connection to the replica server at `addr`, as node
/// `node` of the cluster of `dir`, from `tcp` (already connected).
pub fn replica_tls(
    dir: &Path,
    node: &str,
    tcp: std::net::TcpStream,
) -> rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream> {
    let creds = credentials_as(dir, ballast::tls::Role::Node(node.into()));
    let name = rustls::pki_types::ServerName::try_from(ballast::tls::Role::AnyNode.name()).unwrap();
    let conn = rustls::ClientConnection::new(creds.rustls_client().unwrap(), name).unwrap();
    rustls::StreamOwned::new(conn, tcp)
}

/// Starts a controller in `dir` and waits until its API answers.
pub fn start_controller(dir: &Path, node_down_timeout: &str) -> ControllerProc {
    start_controller_with(dir, node_down_timeout, &[])
}

/// Like `start_controller`, with more flags.
pub fn start_controller_with(
    dir: &Path,
    node_down_timeout: &str,
    extra: &[&str],
) -> ControllerProc {
    let (api, agent) = (free_addr(), free_addr());
    let socket = dir.join("controller.sock");
    let store = dir.join("store.redb");
    let mut args = controller_args(&store, &socket, api, agent, node_down_timeout);
    args.extend(extra.iter().map(|a| a.to_string()));
    let proc = Proc::spawn(&args, dir.join("controller.log"));
    ControllerProc::up(proc, args, socket, store)
}

pub struct NodeProc {
    pub proc: Proc,
    pub id: String,
    pub socket: PathBuf,
    pub args: Vec<String>,
}

/// The value given to flag `name` in `args` (which must hold it).
pub fn flag(args: &[String], name: &str) -> String {
    let at = args.iter().position(|a| a == name).unwrap();
    args[at + 1].clone()
}

/// Node arguments: one disk `dir/<id>/disk-1`, zone `zone-<id>`.
pub fn node_args(dir: &Path, id: &str, controller_agent: &str) -> (Vec<String>, PathBuf) {
    let disk = dir.join(id).join("disk-1");
    std::fs::create_dir_all(&disk).unwrap();
    let socket = dir.join(format!("{id}.sock"));
    let args = vec![
        "node".into(),
        "--node-id".into(),
        id.into(),
        "--zone".into(),
        format!("zone-{id}"),
        "--disk".into(),
        disk.display().to_string(),
        "--controller".into(),
        controller_agent.into(),
        "--csi-endpoint".into(),
        format!("unix://{}", socket.display()),
        "--agent-listen".into(),
        free_addr().to_string(),
        "--replica-listen".into(),
        free_addr().to_string(),
        "--state-dir".into(),
        dir.join(id).join("state").display().to_string(),
        // The test's directory stands for the kubelet's.
        "--kubelet-dir".into(),
        dir.display().to_string(),
        "--cluster-token-file".into(),
        cluster_token(dir).display().to_string(),
        "--cluster-ca-file".into(),
        cluster_ca_dir(dir).join("ca.crt").display().to_string(),
    ];
    (args, socket)
}

pub fn start_node(dir: &Path, id: &str, controller_agent: &str) -> NodeProc {
    start_node_with(dir, id, controller_agent, &[])
}

/// Like `start_node`, with more flags.
pub fn start_node_with(dir: &Path, id: &str, controller_agent: &str, extra: &[&str]) -> NodeProc {
    start_node_by(Proc::spawn, dir, id, controller_agent, extra)
}

/// Like `start_node_with`, the process started by `spawn`.
pub fn start_node_by(
    spawn: fn(&[String], PathBuf) -> Proc,
    dir: &Path,
    id: &str,
    controller_agent: &str,
    extra: &[&str],
) -> NodeProc {
    let (mut args, socket) = node_args(dir, id, controller_agent);
    args.extend(extra.iter().map(|a| a.to_string()));
    let proc = spawn(&args, dir.join(format!("{id}.log")));
    NodeProc {
        proc,
        id: id.into(),
        socket,
        args,
    }
}

/// A controller and one ready node, `node-1`, whose volumes may use its
/// disk however full the host's filesystem is (the disk is a directory of
/// it): the setting `storage-minimal-available-percentage` is 0.
pub fn controller_with_one_node(dir: &Path) -> (ControllerProc, NodeProc) {
    controller_with_one_node_with(dir, &[])
}

/// Like `controller_with_one_node`, with more flags for the node.
pub fn controller_with_one_node_with(
    dir: &Path,
    node_flags: &[&str],
) -> (ControllerProc, NodeProc) {
    controller_with_one_node_by(Proc::spawn, dir, node_flags)
}

/// Like `controller_with_one_node_with`, the node started by `spawn`.
pub fn controller_with_one_node_by(
    spawn: fn(&[String], PathBuf) -> Proc,
    dir: &Path,
    node_flags: &[&str],
) -> (ControllerProc, NodeProc) {
    let ctl = start_controller(dir, "30s");
    let agent = format!("http://{}", ctl.agent);
    let n = start_node_by(spawn, dir, "node-1", &agent, node_flags);
    // Generous: the whole suite shares two cores.
    wait_for(Duration::from_secs(90), "node-1 ready", || {
        node(&ctl.api, "node-1").filter(node_is_up)
    });
    let (code, body) = call(
        "PUT",
        &format!(
            "{}/v1/settings/storage-minimal-available-percentage",
            ctl.api
        ),
        Some(serde_json::json!({"value": "0"})),
    );
    assert_eq!(code, 200, "{body}");
    (ctl, n)
}

/// The node as the API shows it, if it exists.
pub fn node(api: &str, id: &str) -> Option<Value> {
    get_json(&format!("{api}/v1/nodes/{id}")).filter(|v| v["id"] == id)
}

/// Ready with every disk measured.
pub fn node_is_up(n: &Value) -> bool {
    n["status"]["ready"] == true
        && n["status"]["disks"].as_object().is_some_and(|d| {
            !d.is_empty()
                && d.values()
                    .all(|d| d["ready"] == true && d["storageMaximum"].as_u64() > Some(0))
        })
}

/// Up, on a heartbeat received after `since` (not a status left over
/// from before a restart).
pub fn node_up_since(n: &Value, since: chrono::DateTime<chrono::Utc>) -> bool {
    node_is_up(n) && heard_since(n, since)
}

/// Whether the node's last heartbeat was received after `since`.
pub fn heard_since(n: &Value, since: chrono::DateTime<chrono::Utc>) -> bool {
    n["status"]["lastHeartbeat"]
        .as_str()
        .and_then(|t| t.parse::<chrono::DateTime<chrono::Utc>>().ok())
        .is_some_and(|t| t > since)
}

/// Reasons of the events on `object`, oldest first.
pub fn event_reasons(api: &str, object: &str) -> Vec<String> {
    get_json(&format!("{api}/v1/events?object={object}"))
        .and_then(|v| v["items"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .map(|e| e["reason"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Runs `cmd args`, which must succeed; its stdout.
pub fn must(cmd: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(cmd).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A controller (`node_down` its node-down timeout) and `n` nodes
/// (`node-1`...), each with `flags`, all ready. The disks are directories
/// on this machine's filesystem, whatever its free space: the 25% free
/// minimum is set to 0, so that it does not decide the tests.
pub fn cluster_of_nodes(
    dir: &Path,
    node_down: &str,
    n: usize,
    flags: &[&str],
) -> (ControllerProc, Vec<NodeProc>) {
    let ctl = start_controller(dir, node_down);
    let agent = format!("http://{}", ctl.agent);
    let nodes: Vec<NodeProc> = (1..=n)
        .map(|i| start_node_with(dir, &format!("node-{i}"), &agent, flags))
        .collect();
    for n in &nodes {
        wait_for(Duration::from_secs(30), "node ready", || {
            node(&ctl.api, &n.id).filter(node_is_up)
        });
    }
    let (s, _) = call(
        "PUT",
        &format!(
            "{}/v1/settings/storage-minimal-available-percentage",
            ctl.api
        ),
        Some(serde_json::json!({"value": 0})),
    );
    assert_eq!(s, 200);
    (ctl, nodes)
}

/// The nodes of `volume`'s replicas, as the API answers, in order.
pub fn replica_nodes(api: &str, volume: &str) -> Vec<String> {
    let (_, body) = call("GET", &format!("{api}/v1/volumes/{volume}"), None);
    let mut at: Vec<String> = body["status"]["replicas"]
        .as_array()
        .unwrap_or_else(|| panic!("{body}"))
        .iter()
        .map(|r| r["nodeId"].as_str().unwrap().to_string())
        .collect();
    at.sort();
    at
}

/// Waits at most `limit` until `volume`'s robustness is `want`.
pub fn wait_robustness_within(api: &str, volume: &str, want: &str, limit: Duration) {
    wait_for(limit, &format!("robustness {want}"), || {
        call("GET", &format!("{api}/v1/volumes/{volume}"), None).1["status"]["robustness"]
            .as_str()
            .filter(|r| *r == want)
            .map(drop)
    });
}

/// Makes `node`'s disk (`node/disk-1` under `dir`) an ext4 of its own, on
/// a loop device, so that it can be frozen; returns where it is mounted.
/// The test's `Teardown` unmounts it.
pub fn ext4_disk(dir: &Path, node: &str) -> PathBuf {
    let disk = dir.join(node).join("disk-1");
    std::fs::create_dir_all(&disk).unwrap();
    let image = dir.join(format!("{node}-disk.img"));
    std::fs::File::create(&image)
        .unwrap()
        .set_len(256 << 20)
        .unwrap();
    let (image, point) = (image.display().to_string(), disk.display().to_string());
    must("mkfs.ext4", &["-q", &image]);
    must("mount", &["-o", "loop", &image, &point]);
    disk
}

/// A filesystem frozen (`fsfreeze`: every write to it waits, as on a
/// disk that hangs) until dropped.
pub struct Frozen(pub PathBuf);

impl Frozen {
    pub fn freeze(mountpoint: &Path) -> Frozen {
        must("fsfreeze", &["--freeze", &mountpoint.display().to_string()]);
        Frozen(mountpoint.to_path_buf())
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = std::process::Command::new("fsfreeze")
            .args(["--unfreeze", &self.0.display().to_string()])
            .status();
    }
}

/// Continues stopped processes, however the test ends.
pub struct Thaw(pub Vec<i32>);

impl Drop for Thaw {
    fn drop(&mut self) {
        for pid in &self.0 {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid),
                nix::sys::signal::Signal::SIGCONT,
            );
        }
    }
}

/// Stops process `pid` (SIGSTOP): it keeps its sockets and answers
/// nothing, as a hung process does.
pub fn stop_process(pid: i32) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .unwrap();
}

/// Waits until the controller has recorded an event `reason` of `object`
/// (an engine's restart is recorded once the start call returned, which
/// may be after the new engine serves).
pub fn wait_event(api: &str, object: &str, reason: &str) {
    wait_for_or(
        Duration::from_secs(30),
        &format!("event {reason} of {object}"),
        || {
            event_reasons(api, object)
                .iter()
                .any(|r| r == reason)
                .then_some(())
        },
        || format!("{:?}", event_reasons(api, object)),
    );
}

/// Runs `ballastctl` and returns (success, stdout, stderr).
pub fn ballastctl(api: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BALLASTCTL)
        .arg("--api")
        .arg(api)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `ballastctl` and expects it to succeed; its standard output.
pub fn ctl_ok(api: &str, args: &[&str]) -> String {
    let (ok, out, err) = ballastctl(api, args);
    assert!(ok, "ballastctl {}: {err}", args.join(" "));
    out
}

/// Runs qemu-io on `target` with commands; returns (success, output).
/// Success means exit 0 and no failed command or pattern mismatch.
/// The disks of a local cluster are directories of this machine's
/// filesystem: its free space must not decide a test
/// (storage-minimal-available-percentage 0, set with ballastctl).
pub fn free_space_is_not_the_test(api: &str) {
    let (ok, _, err) = ballastctl(
        api,
        &[
            "setting",
            "set",
            "storage-minimal-available-percentage",
            "0",
        ],
    );
    assert!(ok, "{err}");
}

/// Attaches `volume` at `node` through the REST API; its NBD endpoint.
pub fn attach(api: &str, volume: &str, node: &str) -> String {
    let (s, v) = call(
        "POST",
        &format!("{api}/v1/volumes/{volume}/attach"),
        Some(serde_json::json!({ "nodeId": node })),
    );
    assert_eq!(s, 200, "{v}");
    v["status"]["frontendEndpoint"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Detaches `volume`; the volume as the API answers.
pub fn detach(api: &str, volume: &str) -> Value {
    let (s, v) = call("POST", &format!("{api}/v1/volumes/{volume}/detach"), None);
    assert_eq!(s, 200, "{v}");
    v
}

/// A runtime for a test's async calls.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// How long one qemu-img or qemu-io run may take before the test calls its
/// endpoint hung.
pub const QEMU_LIMIT: Duration = Duration::from_secs(120);

/// Runs `tool` (qemu-img, qemu-io) with `args` to its end, killed after
/// [`QEMU_LIMIT`]: an NBD request that is never answered fails the test,
/// naming the command, instead of holding it until nextest gives up.
pub fn qemu<S: AsRef<std::ffi::OsStr>>(
    tool: &str,
    args: impl IntoIterator<Item = S>,
) -> std::process::Output {
    let args: Vec<std::ffi::OsString> = args.into_iter().map(|a| a.as_ref().into()).collect();
    let out = Command::new("timeout")
        .args(["-s", "KILL", &QEMU_LIMIT.as_secs().to_string(), tool])
        .args(&args)
        .output()
        .expect("timeout (coreutils) runs");
    let line = format!("{tool} {}", args.join(std::ffi::OsStr::new(" ")).display());
    match out.status.code() {
        Some(127) => panic!("{tool} is not installed: ./test installs it (package qemu-utils)"),
        // `timeout -s KILL` answers 128 + 9 for a command it killed.
        Some(137) | None => panic!(
            "`{line}` did not finish in {}s: its endpoint stopped answering",
            QEMU_LIMIT.as_secs()
        ),
        _ => out,
    }
}

/// `qemu-img compare` of two raw images (files or NBD endpoints).
pub fn qemu_compare(a: &str, b: &str) -> std::process::Output {
    qemu("qemu-img", ["compare", "-f", "raw", "-F", "raw", a, b])
}

pub fn qemu_io(target: &str, cmds: &[&str]) -> (bool, String) {
    qemu_io_with(target, &[], cmds)
}

/// `qemu_io` with more options, such as `-t writeback` (qemu-io's default
/// cache mode, writethrough, sends every write with FUA).
pub fn qemu_io_with(target: &str, options: &[&str], cmds: &[&str]) -> (bool, String) {
    let mut args = vec!["-f", "raw"];
    args.extend(options);
    for cmd in cmds {
        args.extend(["-c", cmd]);
    }
    args.push(target);
    let out = qemu("qemu-io", args);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let ok = out.status.success()
        && !text.contains("Pattern verification failed")
        && !text.contains("failed");
    (ok, text)
}

/// A blocking REST call: (status, JSON body).
pub fn call(method: &str, url: &str, body: Option<Value>) -> (u16, Value) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let c = reqwest::Client::new();
        let mut r = c
            .request(method.parse().unwrap(), url)
            .timeout(Duration::from_secs(60))
            // Every change is JSON, with or without a body.
            .header("content-type", "application/json");
        if let Some(b) = body {
            r = r.json(&b);
        }
        let resp = r.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    })
}

/// An API port for `ballast local`, its followers free too (+1 for the
/// agent, +10..+15 for three nodes, +138..+140 for their metrics), all of
/// them reserved for this test ([`reserve_ports`]).
pub fn local_api_port() -> u16 {
    reserve_ports(LOCAL_BLOCKS, LOCAL_SPAN)
}

/// A running `ballast local`, with the lines it printed; killed on drop
/// (its children stop with it).
pub struct Local {
    pub child: Child,
    pub lines: std::sync::mpsc::Receiver<String>,
    /// Every line read so far.
    pub seen: Vec<String>,
    /// Its API port (`--api-listen`).
    pub port: u16,
    /// Its REST API, `http://127.0.0.1:PORT`.
    pub api: String,
}

impl Drop for Local {
    /// Stops it as an operator would (SIGTERM), so that it stops its
    /// nodes' process groups, engines included; SIGKILL only if it has not
    /// stopped in 30 s. A SIGKILL alone stops the nodes (their parent-death
    /// signal) but leaves their engines running, as an engine outlives its
    /// node agent by design.
    fn drop(&mut self) {
        // Already stopped (and reaped): its pid may be another's now.
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let end = Instant::now() + Duration::from_secs(30);
        while Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `ballast local` with three nodes in three zones on `dir`, and
/// waits until it says it is up.
pub fn start_local(dir: &Path) -> Local {
    start_local_with(dir, &[])
}

/// [`start_local`] with more arguments, e.g. `--store kubernetes`. A start
/// that failed because a port was taken meanwhile is tried again on other
/// ports; any other failed start panics with what `ballast local` said.
pub fn start_local_with(dir: &Path, more: &[&str]) -> Local {
    let mut last = String::new();
    for _ in 0..5 {
        match start_local_at(dir, local_api_port(), more) {
            Ok(local) => return local,
            Err(said) if said.contains("Address already in use") => last = said,
            Err(said) => panic!("{said}"),
        }
    }
    panic!("five port ranges were taken before `ballast local` could bind them:\n{last}")
}

/// One start of `ballast local` with its API on `port` (a second run on a
/// cluster's directory keeps its port). Err holds what it said on stderr
/// and in its logs when it exits before it is up.
pub fn start_local_at(dir: &Path, port: u16, more: &[&str]) -> Result<Local, String> {
    std::fs::create_dir_all(dir).unwrap();
    let stderr_file = dir.join("ballast-local.stderr");
    let mut child = Command::new(BALLAST)
        .args([
            "local",
            "--nodes",
            "3",
            "--zones",
            "3",
            "--node-down-timeout",
            "3s",
            "--dir",
        ])
        .arg(dir)
        .args(["--api-listen", &format!("127.0.0.1:{port}")])
        .args(more)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr_file).unwrap())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut local = Local {
        child,
        lines,
        seen: Vec::new(),
        port,
        api: format!("http://127.0.0.1:{port}"),
    };
    // `ballast local` gives up by itself after 60 s; the test waits longer
    // so that it hears why.
    let up = wait_for(
        Duration::from_secs(120),
        "`ballast local` to say it is up or exit",
        || {
            while let Ok(l) = local.lines.try_recv() {
                local.seen.push(l);
            }
            if local
                .seen
                .iter()
                .any(|l| l.contains("Press Ctrl-C to stop"))
            {
                return Some(true);
            }
            local.child.try_wait().unwrap().map(|_| false)
        },
    );
    if up {
        return Ok(local);
    }
    let mut said = format!(
        "`ballast local` exited before it was up; it said:\n{}\n{}",
        local.seen.join("\n"),
        std::fs::read_to_string(&stderr_file).unwrap_or_default()
    );
    if let Ok(logs) = std::fs::read_dir(dir.join("logs")) {
        for log in logs.flatten() {
            let text = std::fs::read_to_string(log.path()).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            said.push_str(&format!("\n--- {} (last lines)\n", log.path().display()));
            for l in tail.iter().rev() {
                said.push_str(l);
                said.push('\n');
            }
        }
    }
    Err(said)
}

/// Stops `ballast local` as a user does, and asserts a clean exit.
pub fn stop_with_ctrl_c(mut local: Local) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(local.child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = wait_for(Duration::from_secs(30), "`ballast local` to stop", || {
        local.child.try_wait().unwrap()
    });
    assert!(status.success(), "exit status {status}");
}

/// On drop, takes down whatever a test left under a directory, however it
/// ended: filesystems and bind mounts, then loop devices backed by files
/// there, then FUSE exports, then the engine processes whose pid files
/// are there (engines outlive their node process by design).
pub struct Teardown(pub PathBuf);

impl Drop for Teardown {
    fn drop(&mut self) {
        teardown_under(&self.0);
        // A test that failed leaves its logs in its output: its directory
        // goes with it.
        if std::thread::panicking() {
            print_logs_under(&self.0);
        }
    }
}

/// Lines of each log printed by `print_logs_under`, the last ones.
const LOG_TAIL: usize = 60;

/// Prints the last lines of every `*.log` file under `dir` (passing over
/// what is still mounted there) to stderr.
fn print_logs_under(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            if !mounts_under(&path)
                .iter()
                .any(|(p, _)| Path::new(p) == path)
            {
                print_logs_under(&path);
            }
        } else if path.extension().is_some_and(|x| x == "log") {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let from = lines.len().saturating_sub(LOG_TAIL);
            eprintln!(
                "--- {} (its last {} lines) ---",
                path.display(),
                lines.len() - from
            );
            for l in &lines[from..] {
                eprintln!("{l}");
            }
        }
    }
}

fn run_quietly(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// (mount point, filesystem type) of every mount under `dir`, deepest first.
fn mounts_under(dir: &Path) -> Vec<(String, String)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut found: Vec<(String, String)> = info
        .lines()
        .filter_map(|l| {
            let point = l.split(' ').nth(4)?;
            let fstype = l.split(" - ").nth(1)?.split(' ').next()?;
            Path::new(point)
                .starts_with(dir)
                .then(|| (point.to_string(), fstype.to_string()))
        })
        .collect();
    found.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
    found
}

pub fn teardown_under(dir: &Path) {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let mounts = mounts_under(&dir);
    let is_fuse = |t: &str| t == "fuse" || t.starts_with("fuse.");
    for (point, _) in mounts.iter().filter(|(_, t)| !is_fuse(t)) {
        run_quietly("umount", &["-l", point]);
    }
    // `/dev/loop3: []: (/path/to/file)`
    for line in run_quietly("losetup", &["-a"]).lines() {
        if let (Some(dev), Some(file)) = (
            line.split(':').next(),
            line.rsplit_once('(').map(|(_, f)| f.trim_end_matches(')')),
        ) && Path::new(file).starts_with(&dir)
        {
            run_quietly("losetup", &["-d", dev]);
        }
    }
    for (point, _) in mounts.iter().filter(|(_, t)| is_fuse(t)) {
        run_quietly("umount", &["-l", point]);
    }
    kill_engines_under(&dir);
}

/// SIGKILLs the processes named by `frontends/*.pid` files under `dir`.
fn kill_engines_under(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            let pid_file = path.extension().is_some_and(|x| x == "pid")
                && path
                    .parent()
                    .and_then(|p| p.file_name())
                    .is_some_and(|n| n == "frontends");
            let pid = pid_file
                .then(|| std::fs::read_to_string(&path).ok())
                .flatten()
                .and_then(|t| t.lines().next().and_then(|l| l.trim().parse().ok()));
            if let Some(pid) = pid {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        } else if !mounts_under(&path)
            .iter()
            .any(|(p, _)| Path::new(p) == path)
        {
            kill_engines_under(&path);
        }
    }
}

/// The pid of a volume's engine on a node, from its pid file in the
/// node's state directory.
pub fn engine_pid(state: &std::path::Path, volume: &str) -> Option<i32> {
    std::fs::read_to_string(state.join("frontends").join(format!("{volume}.pid")))
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}
