//! The data plane with real processes and real NBD clients: three
//! `ballast node` processes hold the replicas, a `ballast engine` process
//! replicates over them and serves NBD on a unix socket, and `qemu-io` and
//! `qemu-img` write, read and compare through it.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ballast::proto::agent::v1::CreateReplicaRequest;
use ballast::proto::agent::v1::node_agent_client::NodeAgentClient;
use ballast::tls::Role;
use common::*;
use nix::sys::signal::Signal;

const SIZE: u64 = 1 << 30;

struct Cluster {
    dir: tempfile::TempDir,
    _ctl: ControllerProc,
    nodes: Vec<NodeProc>,
    replica_addrs: Vec<String>,
}

fn cluster(n: usize) -> Cluster {
    let dir = tempfile::tempdir().unwrap();
    let ctl = start_controller(dir.path(), "30s");
    let agent = format!("http://{}", ctl.agent);
    let nodes: Vec<NodeProc> = (1..=n)
        .map(|i| start_node(dir.path(), &format!("node-{i}"), &agent))
        .collect();
    for node in &nodes {
        wait_for(Duration::from_secs(30), "node ready", || {
            common::node(&ctl.api, &node.id).filter(node_is_up)
        });
    }
    let replica_addrs = nodes
        .iter()
        .map(|n| flag(&n.args, "--replica-listen"))
        .collect();
    Cluster {
        dir,
        _ctl: ctl,
        nodes,
        replica_addrs,
    }
}

impl Cluster {
    fn create_replicas(&self, volume: &str) -> Vec<String> {
        let rt = runtime();
        let mut specs = Vec::new();
        for (i, node) in self.nodes.iter().enumerate() {
            let name = format!("{volume}-r{}", i + 1);
            let agent = format!("http://{}", flag(&node.args, "--agent-listen"));
            rt.block_on(async {
                // The agent wants the cluster's token and the controller's
                // certificate.
                let me = member_as(self.dir.path(), Role::Controller);
                let ch = me.channel(&agent, &Role::Node(node.id.clone())).unwrap();
                let mut c = NodeAgentClient::new(ch);
                c.create_replica(CreateReplicaRequest {
                    name: name.clone(),
                    volume: volume.into(),
                    disk_id: "disk-1".into(),
                    size: SIZE,
                })
                .await
                .unwrap();
            });
            specs.push(format!("{name}@{}", self.replica_addrs[i]));
        }
        specs
    }

    fn start_engine(&self, volume: &str, replicas: &[String]) -> (Proc, PathBuf) {
        let socket = self
            .dir
            .path()
            .join("frontends")
            .join(format!("{volume}.sock"));
        let mut args = vec![
            "engine".to_string(),
            "--volume".into(),
            volume.into(),
            "--size".into(),
            "1Gi".into(),
            "--socket".into(),
            socket.display().to_string(),
            "--local".into(),
            replicas[0].split('@').next().unwrap().to_string(),
            // As the node agent starts it: the first replica is on the
            // engine's node and is lent to it.
            "--local-dir".into(),
            self.replica_head(1, volume)
                .parent()
                .unwrap()
                .display()
                .to_string(),
            "--status-file".into(),
            self.status_file(volume).display().to_string(),
            // As the node agent starts it: with the credentials the
            // controller issues for the volume's first attachment on
            // node-1.
            "--node-id".into(),
            "node-1".into(),
            "--tls-dir".into(),
            engine_tls_dir(self.dir.path(), volume, "node-1", 1)
                .display()
                .to_string(),
            "--epoch".into(),
            "1".into(),
        ];
        for r in replicas {
            args.push("--replica".into());
            args.push(r.clone());
        }
        let p = Proc::spawn(&args, self.dir.path().join(format!("engine-{volume}.log")));
        wait_for(Duration::from_secs(30), "the engine's NBD socket", || {
            socket.exists().then_some(())
        });
        (p, socket)
    }

    /// A blocking connection to the replica server at `addr` as node-1.
    fn replica_tls(
        &self,
        tcp: std::net::TcpStream,
    ) -> rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream> {
        common::replica_tls(self.dir.path(), "node-1", tcp)
    }

    /// Where the engine of `volume` writes its replicas' modes.
    fn status_file(&self, volume: &str) -> PathBuf {
        self.dir.path().join(format!("engine-{volume}.status.json"))
    }

    /// The modes of `volume`'s replicas as its engine reports them.
    fn modes(&self, volume: &str) -> Vec<String> {
        let status: serde_json::Value = std::fs::read(self.status_file(volume))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        status["replicas"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|r| r["mode"].as_str().unwrap_or_default().to_string())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn replica_head(&self, node: usize, volume: &str) -> PathBuf {
        self.dir
            .path()
            .join(format!("node-{node}"))
            .join("disk-1/replicas")
            .join(format!("{volume}-r{node}"))
            .join("layer-000001.img")
    }
}

fn uri(volume: &str, socket: &Path) -> String {
    format!("nbd+unix:///{volume}?socket={}", socket.display())
}

const WRITES: [&str; 4] = [
    "write -P 0xab 0 64k",
    "write -P 0xcd 512M 1M",
    "write -P 0x11 1073737728 4k",
    "write -P 0x5a 3k 2k",
];
const READS: [&str; 4] = [
    "read -P 0xab 0 3k",
    "read -P 0xcd 512M 1M",
    "read -P 0x11 1073737728 4k",
    "read -P 0x5a 3k 2k",
];

#[test]
fn qemu_io_round_trip_through_three_replicas_and_qemu_img_compare() {
    let c = cluster(3);
    let replicas = c.create_replicas("v1");
    let (_engine, socket) = c.start_engine("v1", &replicas);
    let log = std::fs::read_to_string(c.dir.path().join("engine-v1.log")).unwrap();
    assert!(
        log.contains("local replica lent to the engine"),
        "the local replica's I/O goes to its files: {log}"
    );
    let target = uri("v1", &socket);
    let (ok, out) = qemu_io(&target, &WRITES);
    assert!(ok, "{out}");
    let (ok, out) = qemu_io(&target, &READS);
    assert!(ok, "{out}");
    assert!(out.contains("read 1048576/1048576 bytes"), "{out}");

    // The same writes on a local file: qemu-img compare must match.
    let local = c.dir.path().join("local.img");
    let st = Command::new("qemu-img")
        .args(["create", "-f", "raw"])
        .arg(&local)
        .arg(SIZE.to_string())
        .status()
        .unwrap();
    assert!(st.success());
    let (ok, out) = qemu_io(local.to_str().unwrap(), &WRITES);
    assert!(ok, "{out}");
    let cmp = qemu_compare(local.to_str().unwrap(), &target);
    assert!(
        cmp.status.success(),
        "{}{}",
        String::from_utf8_lossy(&cmp.stdout),
        String::from_utf8_lossy(&cmp.stderr)
    );

    // Every replica holds the same bytes: compare their head layers.
    qemu_io(&target, &["flush"]);
    for n in [2, 3] {
        let cmp = Command::new("qemu-img")
            .args(["compare", "-f", "raw", "-F", "raw"])
            .arg(c.replica_head(1, "v1"))
            .arg(c.replica_head(n, "v1"))
            .output()
            .unwrap();
        assert!(
            cmp.status.success(),
            "replica {n} differs: {}",
            String::from_utf8_lossy(&cmp.stdout)
        );
    }
}

#[test]
fn a_killed_replica_node_degrades_the_volume_and_writes_go_on() {
    let mut c = cluster(3);
    let replicas = c.create_replicas("v2");
    let (_engine, socket) = c.start_engine("v2", &replicas);
    let target = uri("v2", &socket);
    let (ok, out) = qemu_io(&target, &["write -P 0x01 0 1M"]);
    assert!(ok, "{out}");
    c.nodes[2].proc.signal(Signal::SIGKILL);
    c.nodes[2].proc.wait_exit(Duration::from_secs(5)).unwrap();
    // Writes after the loss succeed, and every acknowledged write reads back.
    let (ok, out) = qemu_io(
        &target,
        &["write -P 0x02 1M 1M", "write -P 0x03 100M 64k", "flush"],
    );
    assert!(ok, "{out}");
    let (ok, out) = qemu_io(
        &target,
        &[
            "read -P 0x01 0 1M",
            "read -P 0x02 1M 1M",
            "read -P 0x03 100M 64k",
        ],
    );
    assert!(ok, "{out}");
    // The volume is degraded: the engine dropped the lost replica to err
    // and kept the other two rw.
    wait_for(Duration::from_secs(10), "the lost replica err", || {
        let modes = c.modes("v2");
        (modes.iter().filter(|m| *m == "err").count() == 1
            && modes.iter().filter(|m| *m == "rw").count() == 2)
            .then_some(())
    });
    // The survivors agree with each other.
    let cmp = Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(c.replica_head(1, "v2"))
        .arg(c.replica_head(2, "v2"))
        .output()
        .unwrap();
    assert!(cmp.status.success());
}

#[test]
fn acknowledged_writes_survive_sigkill_of_the_engine_and_a_restart() {
    let c = cluster(2);
    let replicas = c.create_replicas("v3");
    let (mut engine, socket) = c.start_engine("v3", &replicas);
    let target = uri("v3", &socket);
    let (ok, out) = qemu_io(&target, &["write -P 0x77 0 4M", "write -P 0x66 700M 128k"]);
    assert!(ok, "{out}");
    engine.signal(Signal::SIGKILL);
    engine.wait_exit(Duration::from_secs(5)).unwrap();
    let _ = std::fs::remove_file(&socket);
    let (_engine, socket) = c.start_engine("v3", &replicas);
    let (ok, out) = qemu_io(
        &uri("v3", &socket),
        &["read -P 0x77 0 4M", "read -P 0x66 700M 128k"],
    );
    assert!(ok, "{out}");
}

#[test]
fn bad_nbd_requests_get_errors_and_the_server_stays_up() {
    let c = cluster(1);
    let replicas = c.create_replicas("v4");
    let (_engine, socket) = c.start_engine("v4", &replicas);
    let target = uri("v4", &socket);
    // Out of range, through a real client.
    let (_, out) = qemu_io(&target, &["read 1073741312 4k"]);
    assert!(
        out.contains("Invalid argument")
            || out.contains("error")
            || out.contains("out of range")
            || out.contains("Input/output"),
        "{out}"
    );
    // Raw frames: unknown command, oversize read, out-of-range write.
    raw_nbd(&socket, "v4");
    // Still serving.
    let (ok, out) = qemu_io(&target, &["write -P 0x42 0 4k", "read -P 0x42 0 4k"]);
    assert!(ok, "{out}");
    // An unknown export is refused.
    let (ok, _) = qemu_io(&uri("nope", &socket), &["read 0 4k"]);
    assert!(!ok);
}

/// An NBD connection by hand, through the handshake (NBD_OPT_GO).
fn nbd_connect(socket: &Path, export: &str) -> std::os::unix::net::UnixStream {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).unwrap();
    assert_eq!(&hello[..8], b"NBDMAGIC");
    s.write_all(&3u32.to_be_bytes()).unwrap();
    let mut opt = Vec::new();
    opt.extend_from_slice(b"IHAVEOPT");
    opt.extend_from_slice(&7u32.to_be_bytes());
    let mut data = (export.len() as u32).to_be_bytes().to_vec();
    data.extend_from_slice(export.as_bytes());
    data.extend_from_slice(&0u16.to_be_bytes());
    opt.extend_from_slice(&(data.len() as u32).to_be_bytes());
    opt.extend_from_slice(&data);
    s.write_all(&opt).unwrap();
    // Option replies until ACK (type 1).
    loop {
        let mut h = [0u8; 20];
        s.read_exact(&mut h).unwrap();
        let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
        let mut body = vec![0u8; len as usize];
        s.read_exact(&mut body).unwrap();
        assert!(kind < (1 << 31), "option refused: {kind:#x}");
        if kind == 1 {
            break;
        }
    }
    s
}

/// An NBD request frame.
fn request(cmd: u16, handle: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut r = Vec::new();
    r.extend_from_slice(&0x2560_9513u32.to_be_bytes());
    r.extend_from_slice(&0u16.to_be_bytes());
    r.extend_from_slice(&cmd.to_be_bytes());
    r.extend_from_slice(&handle.to_be_bytes());
    r.extend_from_slice(&offset.to_be_bytes());
    r.extend_from_slice(&len.to_be_bytes());
    r
}

/// Speaks NBD by hand: handshake with NBD_OPT_GO, then bad requests.
fn raw_nbd(socket: &Path, export: &str) {
    use std::io::{Read, Write};
    let mut s = nbd_connect(socket, export);
    let reply = |s: &mut std::os::unix::net::UnixStream| {
        let mut h = [0u8; 16];
        s.read_exact(&mut h).unwrap();
        (
            u32::from_be_bytes(h[4..8].try_into().unwrap()),
            u64::from_be_bytes(h[8..16].try_into().unwrap()),
        )
    };
    s.write_all(&request(99, 1, 0, 0)).unwrap();
    assert_eq!(reply(&mut s), (22, 1), "unknown command: EINVAL");
    s.write_all(&request(0, 2, 0, 64 << 20)).unwrap();
    assert_eq!(reply(&mut s), (22, 2), "oversize read: EINVAL");
    s.write_all(&request(0, 3, SIZE, 4096)).unwrap();
    assert_eq!(reply(&mut s), (22, 3), "read past the end: EINVAL");
    let mut w = request(1, 4, SIZE - 512, 4096);
    w.extend_from_slice(&[0u8; 4096]);
    s.write_all(&w).unwrap();
    assert_eq!(reply(&mut s), (28, 4), "write past the end: ENOSPC");
    s.write_all(&request(0, 5, 0, 512)).unwrap();
    let (err, handle) = reply(&mut s);
    assert_eq!((err, handle), (0, 5), "a good read after the bad ones");
    let mut data = [0u8; 512];
    s.read_exact(&mut data).unwrap();
}

/// Resident memory of a process, in bytes.
fn rss(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb << 10
}

/// A client that asks for 100 reads of 32 MiB (3.2 GiB of replies) and
/// never reads one: the engine stops reading its requests once a bounded
/// amount of replies waits, so its memory stays flat; and it still serves
/// other clients.
#[test]
fn a_client_that_never_reads_its_replies_leaves_the_engines_memory_bounded() {
    use std::io::Write;
    let c = cluster(1);
    let replicas = c.create_replicas("v5");
    let (engine, socket) = c.start_engine("v5", &replicas);
    let before = rss(engine.pid());
    let mut greedy = nbd_connect(&socket, "v5");
    for handle in 0..100u64 {
        greedy.write_all(&request(0, handle, 0, 32 << 20)).unwrap();
    }
    let mut peak = 0;
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(150));
        peak = peak.max(rss(engine.pid()));
    }
    assert!(
        peak < before + (256 << 20),
        "the engine grew from {} MiB to {} MiB",
        before >> 20,
        peak >> 20
    );
    let (ok, out) = qemu_io(
        &uri("v5", &socket),
        &["write -P 0x5a 0 64k", "read -P 0x5a 0 64k"],
    );
    assert!(ok, "another client is served meanwhile: {out}");
    drop(greedy);
}

/// A raw connection (TLS, as node-1) to a replica server that has opened
/// `name`.
fn replica_conn(
    c: &Cluster,
    addr: &str,
    name: &str,
) -> rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream> {
    use ballast_node::wire::protocol::Op;
    use std::io::{Read, Write};
    let mut s = c.replica_tls(std::net::TcpStream::connect(addr).unwrap());
    s.write_all(&replica_header(Op::Open, 1, name.len() as u32))
        .unwrap();
    s.write_all(name.as_bytes()).unwrap();
    s.flush().unwrap();
    let mut head = [0u8; ballast_node::wire::protocol::RESPONSE_HEADER];
    s.read_exact(&mut head).unwrap();
    s
}

/// A peer that asks a replica server for 100 reads of 32 MiB (3.2 GiB of
/// replies) and never reads one: the server stops reading its requests
/// once a bounded amount waits, so the node's memory stays flat, and it
/// still serves other peers.
#[test]
fn a_peer_that_never_reads_its_replies_leaves_the_replica_servers_memory_bounded() {
    use ballast_node::wire::protocol::Op;
    use std::io::Write;
    let c = cluster(1);
    let replicas = c.create_replicas("v6");
    let (name, addr) = replicas[0].split_once('@').unwrap();
    let node = c.nodes[0].proc.pid();
    let before = rss(node);
    let mut greedy = replica_conn(&c, addr, name);
    for id in 0..100u64 {
        greedy
            .write_all(&replica_header(Op::Read, 10 + id, 32 << 20))
            .unwrap();
    }
    greedy.flush().unwrap();
    let mut peak = 0;
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(150));
        peak = peak.max(rss(node));
    }
    assert!(
        peak < before + (256 << 20),
        "the node grew from {} MiB to {} MiB",
        before >> 20,
        peak >> 20
    );
    let rt = runtime();
    rt.block_on(async {
        let wire = engine_wire_as(c.dir.path(), "v6", "node-1", 1);
        let other = ballast_node::wire::client::ReplicaClient::dial(&wire, addr, name)
            .await
            .unwrap();
        other.write(0, &[0x5a; 65536], 1, false).await.unwrap();
        let back = other.read(0, 65536).await.unwrap();
        assert!(back.iter().all(|b| *b == 0x5a), "another peer is served");
    });
    drop(greedy);
}

/// A connection that opens no replica is closed after the handshake
/// timeout, and one peer gets no more than its share of connections
/// while the ones it has keep working.
#[test]
fn the_replica_server_limits_connections_per_peer_and_closes_silent_ones() {
    use ballast_node::server::MAX_CONNECTIONS_PER_PEER;
    use ballast_node::wire::HANDSHAKE_TIMEOUT;
    use std::io::Read;
    let c = cluster(1);
    let replicas = c.create_replicas("v7");
    let (name, addr) = replicas[0].split_once('@').unwrap();
    let opened = replica_conn(&c, addr, name);
    let silent: Vec<std::net::TcpStream> = (1..MAX_CONNECTIONS_PER_PEER)
        .map(|_| std::net::TcpStream::connect(addr).unwrap())
        .collect();
    // One too many: closed at once.
    let mut extra = std::net::TcpStream::connect(addr).unwrap();
    extra
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut b = [0u8; 1];
    assert_eq!(extra.read(&mut b).unwrap(), 0, "closed by the server");
    // The silent ones are closed after the timeout; the one that opened a
    // replica is not.
    std::thread::sleep(HANDSHAKE_TIMEOUT + Duration::from_secs(2));
    for mut s in silent {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(s.read(&mut b).unwrap(), 0, "a silent connection is closed");
    }
    let mut opened = opened.sock;
    opened.set_nonblocking(true).unwrap();
    let still = opened.read(&mut b).unwrap_err();
    assert_eq!(
        still.kind(),
        std::io::ErrorKind::WouldBlock,
        "open: {still}"
    );
    drop(opened);
    let rt = runtime();
    rt.block_on(async {
        let wire = wire_as(c.dir.path(), "node-1");
        let c = ballast_node::wire::client::ReplicaClient::dial(&wire, addr, name)
            .await
            .unwrap();
        c.read(0, 4096).await.unwrap();
    });
}

/// With TLS on, a replica opens only for its own node, its volume's
/// engine, and a reader of its volume (the controller's certificate for
/// a fill): another node's certificate, an engine of another volume and a
/// reader of another volume are refused at OPEN. It takes changes only
/// from its volume's engine: its node and a reader read a replica that no
/// engine has opened yet, and every WRITE, TRIM and FLUSH of theirs, and a
/// SNAPSHOT giving up blocks as lost, is refused; the engine's are taken,
/// and the data is what the engine wrote.
#[test]
fn a_replica_opens_for_its_node_its_engine_and_its_readers_and_only_its_engine_changes_it() {
    use ballast_node::wire::client::ReplicaClient;
    use ballast_node::wire::protocol::status;
    let c = cluster(1);
    let replicas = c.create_replicas("v8");
    let (name, addr) = replicas[0].split_once('@').unwrap();
    let rt = runtime();
    let dir = c.dir.path();
    rt.block_on(async {
        for (who, wire) in [
            ("another node", wire_as(dir, "node-2")),
            (
                "an engine of another volume",
                engine_wire_as(dir, "v9", "node-2", 1),
            ),
            (
                "an engine of another volume on the replica's own node",
                engine_wire_as(dir, "v9", "node-1", 1),
            ),
            (
                "a reader of another volume",
                reader_wire_as(dir, "v9", "node-2"),
            ),
        ] {
            let e = ReplicaClient::dial(&wire, addr, name).await.err();
            let e = e.unwrap_or_else(|| panic!("{who} opened the replica"));
            assert_eq!(refusal(&e), status::DENIED, "{who}: {e}");
            assert!(e.to_string().contains("opens only for"), "{who}: {e}");
        }
        let node = ReplicaClient::dial(&wire_as(dir, "node-1"), addr, name)
            .await
            .unwrap();
        let reader = ReplicaClient::dial(&reader_wire_as(dir, "v8", "node-2"), addr, name)
            .await
            .unwrap();
        for client in [&node, &reader] {
            let refused = [
                client.write(0, &[0xa5; 4096], 1, false).await.unwrap_err(),
                client.trim(0, 4096, 1).await.unwrap_err(),
                client.flush().await.unwrap_err(),
                client
                    .snapshot_losing(None, &std::collections::BTreeSet::from([0]))
                    .await
                    .unwrap_err(),
            ];
            for e in refused {
                assert_eq!(refusal(&e), status::DENIED, "{e}");
            }
        }
        let engine = engine_wire_as(c.dir.path(), "v8", "node-1", 1);
        let engine = ReplicaClient::dial(&engine, addr, name).await.unwrap();
        engine.write(0, &[0x5a; 8192], 1, false).await.unwrap();
        engine.trim(4096, 4096, 2).await.unwrap();
        engine.flush().await.unwrap();
        // Block 0 is sound: nothing is given up, and the head is frozen.
        engine
            .snapshot_losing(None, &std::collections::BTreeSet::from([0]))
            .await
            .unwrap();
        for client in [&node, &reader] {
            let back = client.read(0, 8192).await.unwrap();
            assert!(
                back[..4096].iter().all(|b| *b == 0x5a),
                "the engine's write"
            );
            assert!(back[4096..].iter().all(|b| *b == 0), "the engine's trim");
        }
    });
}
