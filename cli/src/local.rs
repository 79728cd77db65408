//! `ballast local`: a whole cluster on this machine. One controller with
//! an embedded store and `--nodes` node processes on loopback, with
//! directories under `--dir` as their disks. Every child's output goes to
//! `<dir>/logs/`. Ctrl-C (or SIGTERM) stops them all; run again on the same
//! `--dir` and the cluster comes back with its state.
//!
//! Layout of `--dir`:
//! ```text
//! controller/store.redb          the store
//! sockets/controller.sock        CSI sockets
//! sockets/node-N.sock
//! node-N/disk-M/                 disks
//! node-N/state/                  the node's state dir
//! logs/controller.log, node-N.log
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use crate::args::LocalArgs;

/// How long children get to stop after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// How long start-up waits for the controller and the nodes.
const START_DEADLINE: Duration = Duration::from_secs(60);

struct Proc {
    name: String,
    child: Child,
    /// What it was started with, to start it again.
    args: Vec<String>,
}

/// The ports of the cluster, all derived from the API port.
struct Ports {
    api: SocketAddr,
    agent: SocketAddr,
}

impl Ports {
    fn new(api: SocketAddr) -> Result<Self, String> {
        if api.port() > u16::MAX - 200 {
            return Err(format!(
                "--api-listen port {} is too high; the other ports follow it",
                api.port()
            ));
        }
        Ok(Ports {
            api,
            agent: SocketAddr::new(api.ip(), api.port() + 1),
        })
    }

    /// Node `i` (1-based): agent and replica ports.
    fn node(&self, i: u16) -> (SocketAddr, SocketAddr) {
        let base = self.api.port() + 10 + 2 * (i - 1);
        (
            SocketAddr::new(self.api.ip(), base),
            SocketAddr::new(self.api.ip(), base + 1),
        )
    }

    /// Node `i`'s `/metrics` (after the 64 nodes' agent and replica ports).
    fn metrics(&self, i: u16) -> SocketAddr {
        SocketAddr::new(self.api.ip(), self.api.port() + 10 + 128 + (i - 1))
    }
}

fn mkdir(p: &Path) -> Result<(), String> {
    std::fs::create_dir_all(p).map_err(|e| format!("cannot create {}: {e}", p.display()))
}

fn log_file(dir: &Path, name: &str) -> Result<(std::fs::File, std::fs::File), String> {
    let path = dir.join("logs").join(format!("{name}.log"));
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let err = out
        .try_clone()
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    Ok((out, err))
}

fn spawn(dir: &Path, name: &str, args: &[String]) -> Result<Proc, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find own binary: {e}"))?;
    let (out, err) = log_file(dir, name)?;
    let mut cmd = Command::new(exe);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        // Each child leads its own process group, which also holds the
        // engine processes a node starts; stopping the group stops them.
        .process_group(0)
        .kill_on_drop(true);
    // Children stop when this process dies, even by SIGKILL.
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(std::io::Error::from)
        });
    }
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {name}: {e}"))?;
    Ok(Proc {
        name: name.to_string(),
        child,
        args: args.to_vec(),
    })
}

/// Polls `url` until `until` holds, failing early when a child exits.
async fn wait_http(
    procs: &mut [Proc],
    url: &str,
    deadline: Instant,
    what: &str,
    until: impl Fn(&serde_json::Value) -> bool,
) -> Result<(), String> {
    let client = reqwest::Client::new();
    loop {
        for p in procs.iter_mut() {
            if let Ok(Some(status)) = p.child.try_wait() {
                return Err(format!("{} exited during start-up ({status})", p.name));
            }
        }
        if let Ok(resp) = client.get(url).timeout(Duration::from_secs(2)).send().await
            && let Ok(v) = resp.json::<serde_json::Value>().await
            && until(&v)
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{what} did not come up in {}s",
                START_DEADLINE.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn stop_all(procs: &mut [Proc]) {
    for p in procs.iter() {
        if let Some(pid) = p.child.id() {
            let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGTERM);
        }
    }
    // Nodes first in the list is fine: every child got SIGTERM at once.
    for p in procs.iter_mut() {
        match tokio::time::timeout(STOP_GRACE, p.child.wait()).await {
            Ok(_) => {}
            Err(_) => {
                eprintln!(
                    "{} did not stop in {}s; killing it",
                    p.name,
                    STOP_GRACE.as_secs()
                );
                let _ = p.child.kill().await;
            }
        }
    }
}

/// Runs the local cluster until Ctrl-C or SIGTERM.
pub async fn run(args: LocalArgs) -> Result<(), String> {
    mkdir(&args.dir)?;
    let dir: PathBuf = std::fs::canonicalize(&args.dir)
        .map_err(|e| format!("cannot open {}: {e}", args.dir.display()))?;
    for sub in ["controller", "sockets", "logs"] {
        mkdir(&dir.join(sub))?;
    }
    let ports = Ports::new(args.api_listen)?;
    let token = cluster_token_file(&dir)?;
    let deadline = Instant::now() + START_DEADLINE;
    let mut procs = Vec::new();
    let api = format!("http://{}", ports.api);
    let ca_dir = dir.join("controller").join("tls");
    let mut controller = with_token(controller_args(&dir, &ports, &args), &token);
    controller.extend(["--cluster-ca-dir".into(), ca_dir.display().to_string()]);
    procs.push(spawn(&dir, "controller", &controller)?);
    if let Err(e) = wait_http(
        &mut procs,
        &format!("{api}/healthz"),
        deadline,
        "the controller",
        |v| v["status"] == "ok",
    )
    .await
    {
        stop_all(&mut procs).await;
        let log = dir.join("logs/controller.log");
        return Err(format!("{e}; see {}", log.display()));
    }
    // A node is up once it heartbeats in this run: a restarted cluster's
    // store still says "ready" from the last one.
    let started = chrono::Utc::now();
    let mut node_socks = Vec::new();
    for i in 1..=args.nodes {
        let name = format!("node-{i}");
        let sock = dir.join("sockets").join(format!("{name}.sock"));
        let mut node_args = with_token(node_args(&dir, &ports, &args, i, &sock)?, &token);
        let ca = ca_dir.join(ballast::tls::CA_CERT_FILE);
        node_args.extend(["--cluster-ca-file".into(), ca.display().to_string()]);
        procs.push(spawn(&dir, &name, &node_args)?);
        node_socks.push((name, sock));
    }
    let want = usize::from(args.nodes);
    let all_up = |v: &serde_json::Value| {
        v["items"]
            .as_array()
            .is_some_and(|items| items.iter().filter(|n| node_up(n, started)).count() >= want)
    };
    if let Err(e) = wait_http(
        &mut procs,
        &format!("{api}/v1/nodes"),
        deadline,
        "the nodes",
        all_up,
    )
    .await
    {
        stop_all(&mut procs).await;
        return Err(format!(
            "{e}; see the logs in {}",
            dir.join("logs").display()
        ));
    }
    print_endpoints(&dir, &ports, &args, &node_socks);
    let outcome = tokio::select! {
        _ = ballast::grpc::shutdown_signal() => Ok(()),
        r = watch_children(&dir, &mut procs) => r,
    };
    println!("Stopping...");
    stop_all(&mut procs).await;
    println!("Stopped. State is kept in {}.", dir.display());
    outcome
}

/// The cluster's token file, `controller/cluster-token` under the
/// cluster's directory: made (random, readable by its owner only) when
/// missing, kept across runs.
fn cluster_token_file(dir: &Path) -> Result<PathBuf, String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join("controller").join("cluster-token");
    if path.exists() {
        return Ok(path);
    }
    let token = ballast::cluster_token::ClusterToken::random_text()
        .map_err(|e| format!("cannot make a cluster token: /dev/urandom: {e}"))?;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .and_then(|mut f| writeln!(f, "{token}"))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(path)
}

/// A daemon's command line with the cluster token's file.
fn with_token(mut args: Vec<String>, token: &Path) -> Vec<String> {
    args.extend(["--cluster-token-file".into(), token.display().to_string()]);
    args
}

fn controller_args(dir: &Path, ports: &Ports, args: &LocalArgs) -> Vec<String> {
    let sock = dir.join("sockets").join("controller.sock");
    let mut store = vec!["--store".to_string(), store_spec(dir, args)];
    if args.store == "kubernetes" {
        let k = &args.kubernetes;
        store.extend([
            "--namespace".into(),
            k.namespace.clone(),
            "--install-crds".into(),
        ]);
        if let Some(kubeconfig) = &k.kubeconfig {
            store.extend(["--kubeconfig".into(), kubeconfig.display().to_string()]);
        }
    }
    [
        "controller".into(),
        "--csi-endpoint".into(),
        format!("unix://{}", sock.display()),
        "--api-listen".into(),
        ports.api.to_string(),
        "--agent-listen".into(),
        ports.agent.to_string(),
        "--node-down-timeout".into(),
        humantime::format_duration(args.node_down_timeout).to_string(),
    ]
    .into_iter()
    .chain(store)
    .collect()
}

/// The controller's `--store`: the redb file under `dir`, or kubernetes.
fn store_spec(dir: &Path, args: &LocalArgs) -> String {
    if args.store == "kubernetes" {
        "kubernetes".into()
    } else {
        format!(
            "embedded:{}",
            dir.join("controller").join("store.redb").display()
        )
    }
}

/// Node `i`'s command line; makes its disk directories.
fn node_args(
    dir: &Path,
    ports: &Ports,
    args: &LocalArgs,
    i: u16,
    sock: &Path,
) -> Result<Vec<String>, String> {
    let name = format!("node-{i}");
    let node_dir = dir.join(&name);
    let (agent, replica) = ports.node(i);
    let mut out = vec![
        "node".to_string(),
        "--node-id".into(),
        name,
        "--zone".into(),
        format!("zone-{}", (i - 1) % args.zones + 1),
        "--controller".into(),
        format!("http://{}", ports.agent),
        "--csi-endpoint".into(),
        format!("unix://{}", sock.display()),
        "--agent-listen".into(),
        agent.to_string(),
        "--replica-listen".into(),
        replica.to_string(),
        "--state-dir".into(),
        node_dir.join("state").display().to_string(),
        "--kubelet-dir".into(),
        args.kubelet_dir.display().to_string(),
        "--max-volumes-per-node".into(),
        args.max_volumes_per_node.to_string(),
        "--metrics-listen".into(),
        ports.metrics(i).to_string(),
    ];
    for j in 1..=args.disks_per_node {
        let disk = node_dir.join(format!("disk-{j}"));
        mkdir(&disk)?;
        out.push("--disk".into());
        out.push(disk.display().to_string());
    }
    Ok(out)
}

/// Up: ready, on a heartbeat of this run (after `started`), and every disk
/// measured.
fn node_up(n: &serde_json::Value, started: chrono::DateTime<chrono::Utc>) -> bool {
    n["status"]["ready"] == true
        && n["status"]["lastHeartbeat"]
            .as_str()
            .and_then(|t| t.parse::<chrono::DateTime<chrono::Utc>>().ok())
            .is_some_and(|t| t > started)
        && n["status"]["disks"]
            .as_object()
            .is_some_and(|d| !d.is_empty() && d.values().all(|d| d["ready"] == true))
}

fn print_endpoints(dir: &Path, ports: &Ports, args: &LocalArgs, nodes: &[(String, PathBuf)]) {
    let api = format!("http://{}", ports.api);
    println!(
        "Ballast local cluster is up ({} node(s), {} zone(s)).",
        args.nodes, args.zones
    );
    println!("  REST API        {api}");
    println!("  agent endpoint  http://{}", ports.agent);
    let controller_sock = dir.join("sockets").join("controller.sock");
    println!("  controller CSI  unix://{}", controller_sock.display());
    for (i, (name, sock)) in (1..).zip(nodes) {
        println!(
            "  {name:<15} unix://{}  metrics http://{}/metrics",
            sock.display(),
            ports.metrics(i)
        );
    }
    println!("  metrics         {api}/metrics");
    if args.store == "kubernetes" {
        println!(
            "  store           kubernetes, namespace {} (kubectl get volumes.ballast.csi.dev -n {})",
            args.kubernetes.namespace, args.kubernetes.namespace
        );
    } else {
        println!(
            "  store           {}",
            dir.join("controller/store.redb").display()
        );
    }
    println!("  logs            {}", dir.join("logs").display());
    println!("Try: cargo run --bin ballastctl -- --api {api} node list");
    println!("Press Ctrl-C to stop.");
}

/// How often the controller may die within [`RESTART_WINDOW`] before
/// `ballast local` gives up and stops the cluster.
const RESTART_LIMIT: usize = 5;
const RESTART_WINDOW: Duration = Duration::from_secs(60);

/// Watches the children. A controller that exits is started again: the
/// nodes and the engines of attached volumes keep running (a node marks
/// nothing down on its own, and the engines serve I/O without the
/// controller). Resolves with an error only when the controller keeps
/// dying. A node that exits is reported and left down (the controller
/// marks it not ready).
async fn watch_children(dir: &Path, procs: &mut [Proc]) -> Result<(), String> {
    let mut reported = vec![false; procs.len()];
    let mut restarts: Vec<Instant> = Vec::new();
    loop {
        for (i, p) in procs.iter_mut().enumerate() {
            if reported[i] {
                continue;
            }
            let Ok(Some(status)) = p.child.try_wait() else {
                continue;
            };
            eprintln!("{} exited ({status})", p.name);
            if p.name != "controller" {
                reported[i] = true;
                continue;
            }
            restarts.retain(|t| t.elapsed() < RESTART_WINDOW);
            if restarts.len() >= RESTART_LIMIT {
                return Err(format!(
                    "the controller exited {} times in {}s ({status})",
                    restarts.len() + 1,
                    RESTART_WINDOW.as_secs()
                ));
            }
            restarts.push(Instant::now());
            tokio::time::sleep(Duration::from_millis(500)).await;
            let again = spawn(dir, &p.name, &p.args)?;
            eprintln!("controller started again; nodes and engines kept running");
            *p = again;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
