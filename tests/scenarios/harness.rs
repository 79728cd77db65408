//! The scenario harness: a real controller and real node processes on
//! loopback (directories as disks), driven through the REST API, with data
//! written through NBD by `qemu-img` before a move and verified by checksum
//! after it. Nothing is mocked.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

#[path = "../../node/tests/support/fill.rs"]
mod fill;
pub use fill::fill_disk;

pub use crate::common::*;

/// Volume size in the scenarios: small, so that rebuilds are quick.
pub const SIZE: u64 = 64 << 20;

/// Fields drop in this order: processes first, then mounts, then files.
/// How long a node may take to start and report ready.
const NODE_START: Duration = Duration::from_secs(90);

pub struct Cluster {
    pub nodes: Vec<NodeProc>,
    /// The controller; its process stops with the cluster.
    pub ctl: ControllerProc,
    pub _mounts: Vec<LoopFs>,
    /// Each node's disk, on a disk that forgets (`start_on_forgetful_disks`).
    #[allow(dead_code)] // read by the fault suite's power cuts
    pub forgetful: Vec<crate::forgetful::ForgetfulFs>,
    pub api: String,
    pub dir: tempfile::TempDir,
}

/// A small ext4 filesystem on a loop device, mounted at `dir` (as root):
/// a disk whose usage the test controls.
pub struct LoopFs {
    pub dir: PathBuf,
}

impl LoopFs {
    pub fn mount(image: &Path, dir: &Path, size: u64) -> LoopFs {
        assert!(
            nix::unistd::geteuid().is_root(),
            "loop-mounted disks need root (CI runs as root)"
        );
        std::fs::create_dir_all(dir).unwrap();
        std::fs::File::create(image).unwrap().set_len(size).unwrap();
        let run = |cmd: &mut Command| {
            let out = cmd.output().unwrap();
            assert!(
                out.status.success(),
                "{cmd:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(image));
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(image)
            .arg(dir));
        LoopFs {
            dir: dir.to_path_buf(),
        }
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

/// `disks` disks per node: `<dir>/<node>/disk-1` ...
pub fn node_args_with(dir: &Path, id: &str, agent: &str, disks: usize) -> Vec<String> {
    let (mut args, _) = node_args(dir, id, agent);
    for d in 2..=disks {
        let path = dir.join(id).join(format!("disk-{d}"));
        std::fs::create_dir_all(&path).unwrap();
        args.push("--disk".into());
        args.push(path.display().to_string());
    }
    args
}

impl Cluster {
    /// `n` nodes of `disks` disks each, all ready; scheduling not limited
    /// by this machine's free space.
    pub fn start(n: usize, disks: usize) -> Cluster {
        Cluster::start_with(n, disks, None)
    }

    /// Like `start`; with `loop_size`, every disk is its own ext4
    /// filesystem of that size.
    pub fn start_with(n: usize, disks: usize, loop_size: Option<u64>) -> Cluster {
        Cluster::start_with_args(n, disks, loop_size, &[])
    }

    /// Like `start_with`, the controller run with `controller_args` too.
    pub fn start_with_args(
        n: usize,
        disks: usize,
        loop_size: Option<u64>,
        controller_args: &[&str],
    ) -> Cluster {
        Cluster::start_with_all_args(n, disks, loop_size, controller_args, &[])
    }

    /// Like `start_with_args`, every node run with `node_args` too.
    pub fn start_with_all_args(
        n: usize,
        disks: usize,
        loop_size: Option<u64>,
        controller_args: &[&str],
        node_args: &[&str],
    ) -> Cluster {
        Cluster::start_inner(n, disks, loop_size, false, controller_args, node_args)
    }

    /// `n` nodes of one disk each, an ext4 filesystem of `size` bytes on
    /// a disk that forgets what no flush kept, so that a test can cut a
    /// node's power (`forgetful[i].power_cut()`).
    #[allow(dead_code)] // the fault suite's power cuts
    pub fn start_on_forgetful_disks(n: usize, size: u64) -> Cluster {
        Cluster::start_inner(n, 1, Some(size), true, &[], &[])
    }

    fn start_inner(
        n: usize,
        disks: usize,
        loop_size: Option<u64>,
        forgetful: bool,
        controller_args: &[&str],
        node_args: &[&str],
    ) -> Cluster {
        let mut dir = tempfile::tempdir().unwrap();
        // BALLAST_KEEP_TEST_DIRS=1 keeps the logs and disks for a post-mortem.
        if std::env::var_os("BALLAST_KEEP_TEST_DIRS").is_some() {
            dir.disable_cleanup(true);
            eprintln!("test directory: {}", dir.path().display());
        }
        let (mut mounts, mut forgetfuls) = (Vec::new(), Vec::new());
        if let Some(size) = loop_size {
            for i in 1..=n {
                for d in 1..=disks {
                    let at = dir
                        .path()
                        .join(format!("node-{i}"))
                        .join(format!("disk-{d}"));
                    let image = dir.path().join(format!("node-{i}-disk-{d}.img"));
                    if forgetful {
                        forgetfuls.push(crate::forgetful::ForgetfulFs::mount(&image, &at, size));
                    } else {
                        mounts.push(LoopFs::mount(&image, &at, size));
                    }
                }
            }
        }
        // 4 s to take a silent node for down, unless the test gives its own.
        let mut down = "4s";
        let mut args = vec!["--resync-interval", "1s"];
        let mut i = 0;
        while i < controller_args.len() {
            match (controller_args[i], controller_args.get(i + 1)) {
                ("--node-down-timeout", Some(&v)) => {
                    down = v;
                    i += 2;
                }
                (a, _) => {
                    args.push(a);
                    i += 1;
                }
            }
        }
        let ctl = start_controller_with(dir.path(), down, &args);
        let agent = format!("http://{}", ctl.agent);
        let nodes: Vec<NodeProc> = (1..=n)
            .map(|i| {
                let id = format!("node-{i}");
                let mut args = node_args_with(dir.path(), &id, &agent, disks);
                args.extend(node_args.iter().map(|a| a.to_string()));
                let proc = Proc::spawn(&args, dir.path().join(format!("{id}.log")));
                NodeProc {
                    proc,
                    socket: dir.path().join(format!("{id}.sock")),
                    id,
                    args,
                }
            })
            .collect();
        let api = ctl.api.clone();
        for n in &nodes {
            // Generous: with two scenarios and the rest of the suite on
            // two cores, a node's first heartbeat can take a while. A node
            // that never comes up says why: the end of its log.
            let deadline = std::time::Instant::now() + NODE_START;
            while node(&api, &n.id).filter(node_is_up).is_none() {
                if std::time::Instant::now() > deadline {
                    let log = n.proc.log_text();
                    let tail: Vec<&str> = log.lines().rev().take(20).collect();
                    panic!(
                        "{} not ready after {}s; its log ends:\n{}",
                        n.id,
                        NODE_START.as_secs(),
                        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let c = Cluster {
            nodes,
            ctl,
            _mounts: mounts,
            forgetful: forgetfuls,
            api,
            dir,
        };
        // Directories as disks share this machine's filesystem, however
        // full it is: neither its free space nor its used share (disk
        // pressure) may decide a scenario that is not about them.
        c.set("storage-minimal-available-percentage", json!(0));
        c.set("replica-auto-balance-disk-pressure-percentage", json!(0));
        c
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.api)
    }

    /// A REST call that must succeed (2xx); returns the body.
    pub fn ok(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let (s, v) = call(method, &self.url(path), body);
        assert!((200..300).contains(&s), "{method} {path}: {s} {v}");
        v
    }

    pub fn set(&self, name: &str, value: Value) {
        self.ok(
            "PUT",
            &format!("/v1/settings/{name}"),
            Some(json!({ "value": value })),
        );
    }

    pub fn patch_node(&self, id: &str, body: Value) {
        self.ok("PATCH", &format!("/v1/nodes/{id}"), Some(body));
    }

    pub fn node(&self, id: &str) -> Value {
        self.ok("GET", &format!("/v1/nodes/{id}"), None)
    }

    pub fn volume(&self, name: &str) -> Value {
        self.ok("GET", &format!("/v1/volumes/{name}"), None)
    }

    /// The volume record's `Scheduled` condition, when it has one.
    pub fn scheduled(&self, volume: &str) -> Option<Value> {
        self.volume(volume)["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|k| k["type"] == "Scheduled")
            .cloned()
    }

    pub fn create_volume(&self, body: Value) -> Value {
        self.ok("POST", "/v1/volumes", Some(body))
    }

    /// Attaches and returns the NBD endpoint.
    pub fn attach(&self, volume: &str, node: &str) -> String {
        let v = self.ok(
            "POST",
            &format!("/v1/volumes/{volume}/attach"),
            Some(json!({ "nodeId": node })),
        );
        v["status"]["frontendEndpoint"]
            .as_str()
            .unwrap()
            .to_string()
    }

    pub fn replicas(&self, volume: &str) -> Vec<Value> {
        self.ok("GET", &format!("/v1/replicas?volume={volume}"), None)["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Replicas in `rw` mode per node.
    pub fn rw_per_node(&self, volume: &str) -> std::collections::BTreeMap<String, usize> {
        let mut m = std::collections::BTreeMap::new();
        for r in self.replicas(volume) {
            if r["status"]["mode"] == "rw" {
                *m.entry(r["spec"]["nodeId"].as_str().unwrap().to_string())
                    .or_default() += 1;
            }
        }
        m
    }

    /// Waits until the volume has exactly `n` replicas, all `rw`.
    /// On a timeout it prints the replicas and the events of the volume
    /// and of each replica, which say why it did not settle.
    /// `n` replicas, all rw; for an attached volume, as its engine reported
    /// them (an attach records its replicas rw before any report).
    pub fn wait_settled(&self, volume: &str, n: usize, limit: Duration) -> Vec<Value> {
        let settled = || {
            let attached = self.volume(volume)["status"]["attachedNode"].is_string();
            let reps = self.replicas(volume);
            let rw = |r: &Value| {
                r["status"]["mode"] == "rw" && (!attached || r["status"]["running"] == true)
            };
            (reps.len() == n && reps.iter().all(rw)).then_some(reps)
        };
        let why = || {
            let reps = self.replicas(volume);
            let mut events = self.events(&format!("volume/{volume}"));
            for r in &reps {
                let name = r["name"].as_str().unwrap_or_default();
                events.extend(self.events(&format!("replica/{name}")));
            }
            format!("replicas: {reps:#?}\nevents: {events:#?}")
        };
        wait_for_or(limit, &format!("{volume}: {n} rw replicas"), settled, why)
    }

    /// The changes the controller would make to `volume` now (`/v1/plan`,
    /// a dry run; events left out).
    pub fn planned_changes(&self, volume: &str) -> Vec<Value> {
        self.ok("GET", &format!("/v1/plan?volume={volume}"), None)["actions"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|a| a["type"] != "recordEvent")
            .collect()
    }

    /// Nothing will move for `volume`: the controller plans no change for
    /// it, and still none on every plan over the next resync ticks (until
    /// the plan's own clock is 3 s on, three passes of the loop), while
    /// its replicas stay where they are. Returns where they are.
    pub fn stays_put(&self, volume: &str) -> Vec<String> {
        wait_for(
            Duration::from_secs(120),
            &format!("{volume}: no change planned"),
            || self.planned_changes(volume).is_empty().then_some(()),
        );
        let holders = self.holders(volume);
        let time = |c: &Cluster| -> chrono::DateTime<chrono::Utc> {
            let t = c.ok("GET", &format!("/v1/plan?volume={volume}"), None)["time"].clone();
            serde_json::from_value(t).expect("the plan's time")
        };
        let start = time(self);
        while time(self) < start + chrono::Duration::seconds(3) {
            let changes = self.planned_changes(volume);
            assert!(
                changes.is_empty(),
                "{volume}: a change planned after it settled: {changes:?}"
            );
            assert_eq!(
                self.holders(volume),
                holders,
                "{volume}'s replicas moved after it settled"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        holders
    }

    pub fn events(&self, object: &str) -> Vec<Value> {
        self.ok("GET", &format!("/v1/events?object={object}"), None)["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Every event with `reason`, on any object.
    pub fn all_events(&self, reason: &str) -> Vec<Value> {
        self.ok("GET", "/v1/events", None)["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e["reason"] == reason)
            .collect()
    }

    /// The `ReplicaRebuilt` events: (replica, message).
    pub fn rebuilds(&self) -> Vec<(String, String)> {
        self.all_events("ReplicaRebuilt")
            .iter()
            .map(|e| {
                (
                    e["object"].as_str().unwrap_or_default().to_string(),
                    e["message"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    }

    /// The nodes holding the volume's replicas, sorted.
    pub fn holders(&self, volume: &str) -> Vec<String> {
        let mut n: Vec<String> = self
            .replicas(volume)
            .iter()
            .map(|r| r["spec"]["nodeId"].as_str().unwrap().to_string())
            .collect();
        n.sort();
        n
    }

    /// The volume's replica on `node`, if it has one.
    pub fn replica_on(&self, volume: &str, node: &str) -> Option<Value> {
        self.replicas(volume)
            .into_iter()
            .find(|r| r["spec"]["nodeId"] == node)
    }

    /// Where node `id` is in `nodes`.
    pub fn node_index(&self, id: &str) -> usize {
        self.nodes.iter().position(|n| n.id == id).unwrap()
    }

    pub fn event_reasons(&self, object: &str) -> Vec<String> {
        self.events(object)
            .iter()
            .map(|e| e["reason"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Stops a node's process (SIGKILL), as a crash would.
    pub fn kill_node(&mut self, i: usize) {
        let n = &mut self.nodes[i];
        n.proc.signal(nix::sys::signal::Signal::SIGKILL);
        n.proc.wait_exit(Duration::from_secs(10));
    }

    /// Starts a stopped node again with the same flags and waits for it.
    pub fn restart_node(&mut self, i: usize) {
        let since = chrono::Utc::now();
        self.respawn_node(i);
        let (api, id) = (self.api.clone(), self.nodes[i].id.clone());
        wait_for(NODE_START, "node back", || {
            node(&api, &id).filter(|v| node_up_since(v, since))
        });
    }

    /// Starts a stopped node again with the same flags, without waiting
    /// for it to register (with the controller down it cannot yet).
    pub fn respawn_node(&mut self, i: usize) {
        let n = &mut self.nodes[i];
        let log = self.dir.path().join(format!("{}.log", n.id));
        n.proc = Proc::spawn(&n.args, log);
    }
}

/// Data written to a volume: a sparse image of scattered pseudo-random
/// extents, and its checksum.
pub struct Data {
    pub sum: String,
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// Writes `seed`-dependent data through the NBD endpoint with qemu-img.
pub fn write_data(dir: &Path, endpoint: &str, seed: u64) -> Data {
    use std::os::unix::fs::FileExt;
    let image = dir.join(format!("data-{seed}.img"));
    let f = std::fs::File::create(&image).unwrap();
    f.set_len(SIZE).unwrap();
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    for k in 0..12u64 {
        let mut buf = vec![0u8; 256 << 10];
        for b in buf.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        let at = (k * 5 + seed % 3) << 20;
        f.write_all_at(&buf, at).unwrap();
    }
    f.sync_all().unwrap();
    let image_path = image.to_str().unwrap();
    let out = qemu(
        "qemu-img",
        [
            "convert", "-n", "-f", "raw", "-O", "raw", image_path, endpoint,
        ],
    );
    assert!(
        out.status.success(),
        "qemu-img convert: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sum = sha256(&image);
    std::fs::remove_file(&image).unwrap();
    Data { sum }
}

/// Volume `v` with one replica on one of two nodes, attached there, and
/// what it holds.
pub struct OneOfTwo {
    pub c: Cluster,
    pub live: Expected,
    pub endpoint: String,
    /// The node holding `v`'s replica, where it is attached.
    pub holder: String,
    pub other: String,
}

/// Two nodes with `setting` set to `value`, and volume `v` (one replica,
/// [`SIZE`]) attached where its replica is, `bytes` of `pattern` written
/// from its start.
pub fn one_replica_of_two_nodes(
    (setting, value): (&str, &str),
    bytes: u64,
    pattern: u8,
) -> OneOfTwo {
    let c = Cluster::start(2, 1);
    c.set(setting, json!(value));
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 1}));
    let holder = c.holders("v").remove(0);
    let other = if holder == "node-1" {
        "node-2"
    } else {
        "node-1"
    }
    .to_string();
    let endpoint = c.attach("v", &holder);
    let live = Expected::new(c.dir.path(), "v", SIZE);
    live.write(&endpoint, 0, bytes, pattern);
    OneOfTwo {
        c,
        live,
        endpoint,
        holder,
        other,
    }
}

/// Asks for a second replica of volume `v`, and waits until its copy on
/// `node` has written some; the new replica's name.
pub fn a_second_replica_copying(c: &Cluster, node: &str) -> String {
    c.ok(
        "PATCH",
        "/v1/volumes/v",
        Some(json!({"numberOfReplicas": 2})),
    );
    wait_for(Duration::from_secs(60), "the copy under way", || {
        let r = c.replica_on("v", node)?;
        let done = r["status"]["rebuildProgress"]["done"].as_u64()?;
        (done > 0).then(|| r["name"].as_str().unwrap().to_string())
    })
}

/// Waits until `node`'s log says a fill of it was called off.
pub fn wait_fill_called_off(c: &Cluster, node: &str) {
    let log = c.path(node).with_extension("log");
    wait_for(Duration::from_secs(30), "the node stopped copying", || {
        let text = std::fs::read_to_string(&log).ok()?;
        text.contains("the fill was called off").then_some(())
    });
}

/// How long a disk is held frozen under a freeze: longer than an agent
/// call's 10 s (`ballast::grpc::CALL_TIMEOUT`).
pub const HUNG: Duration = Duration::from_secs(16);

/// Holds the disk at `mountpoint` frozen (fsfreeze: every write waits)
/// for `HUNG`, from now, in a thread of its own.
pub fn hang_disk_for_a_while(mountpoint: PathBuf) -> std::thread::JoinHandle<()> {
    let frozen = Frozen::freeze(&mountpoint);
    std::thread::spawn(move || {
        std::thread::sleep(HUNG);
        drop(frozen);
    })
}

/// What a volume must hold: a local image written alike.
pub struct Expected {
    image: PathBuf,
}

impl Expected {
    pub fn new(dir: &Path, name: &str, size: u64) -> Expected {
        let image = dir.join(format!("expected-{name}.img"));
        std::fs::File::create(&image)
            .unwrap()
            .set_len(size)
            .unwrap();
        Expected { image }
    }

    /// Writes `pattern` over `len` bytes at `offset` of the volume behind
    /// `endpoint` (through NBD, by qemu-io) and of the image.
    pub fn write(&self, endpoint: &str, offset: u64, len: u64, pattern: u8) {
        let cmd = format!("write -P {pattern:#x} {offset} {len}");
        let (ok, out) = qemu_io(endpoint, &[&cmd, "flush"]);
        assert!(ok, "qemu-io {cmd}: {out}");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&self.image)
            .unwrap()
            .write_all_at(&vec![pattern; len as usize], offset)
            .unwrap();
    }

    /// The image as it is now, as its own file of `size` bytes.
    pub fn copy(&self, dir: &Path, name: &str, size: u64) -> Expected {
        let image = dir.join(format!("expected-{name}.img"));
        std::fs::copy(&self.image, &image).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&image)
            .unwrap()
            .set_len(size)
            .unwrap();
        Expected { image }
    }

    pub fn data(&self) -> Data {
        let out = Command::new("sha256sum").arg(&self.image).output().unwrap();
        assert!(out.status.success());
        let sum = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .to_string();
        Data { sum }
    }
}

/// Reads the whole volume back through NBD and checks it against `data`.
pub fn verify_data(dir: &Path, endpoint: &str, data: &Data) {
    let back = dir.join("read-back.img");
    let _ = std::fs::remove_file(&back);
    let back_path = back.to_str().unwrap();
    let out = qemu(
        "qemu-img",
        ["convert", "-f", "raw", "-O", "raw", endpoint, back_path],
    );
    assert!(
        out.status.success(),
        "qemu-img convert: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(sha256(&back), data.sum, "the volume's data changed");
    std::fs::remove_file(&back).unwrap();
}

/// Reads every `rw` replica of `volume` straight from its files on disk
/// (the newest layer holding a block wins) and checks each against `data`.
/// The directory of replica `r` (its record) on its node's disk.
pub fn replica_dir_of(c: &Cluster, r: &Value) -> PathBuf {
    c.path(r["spec"]["nodeId"].as_str().unwrap())
        .join(r["spec"]["diskId"].as_str().unwrap())
        .join("replicas")
        .join(r["name"].as_str().unwrap())
}

pub fn verify_replicas(c: &Cluster, volume: &str, data: &Data) {
    let reps: Vec<Value> = c
        .replicas(volume)
        .into_iter()
        .filter(|r| r["status"]["mode"] == "rw")
        .collect();
    assert!(!reps.is_empty(), "{volume} has no rw replica");
    for r in reps {
        let node = r["spec"]["nodeId"].as_str().unwrap();
        let disk = r["spec"]["diskId"].as_str().unwrap();
        let name = r["name"].as_str().unwrap();
        let dir = replica_dir_of(c, &r);
        // A view: the replica is live, and its holder may be merging it (an
        // open would finish that merge from here, beside its holder). A
        // merge writes a block it copies up, then its checksum, under the
        // holder's lock, which a view does not take: it reads once the
        // merge has ended (a read between the two fails as changed under
        // the view, `Replica::as_seen`; before that it failed its
        // checksum, seen once under load, 2026-12-06).
        wait_for(
            Duration::from_secs(120),
            &format!("{name}'s merge to end"),
            || {
                ballast_node::replica::Meta::read(&dir)
                    .ok()
                    .filter(|m| m.merging.is_none())
            },
        );
        let replica = ballast_node::replica::Replica::open_view(&dir).unwrap();
        assert!(replica.pending().is_empty(), "{name} has pending layers");
        let mut buf = vec![0u8; SIZE as usize];
        replica.read(0, &mut buf).unwrap();
        let copy = c.path(&format!("{name}.img"));
        std::fs::write(&copy, &buf).unwrap();
        assert_eq!(
            sha256(&copy),
            data.sum,
            "replica {name} on {node}/{disk} differs"
        );
        std::fs::remove_file(&copy).unwrap();
    }
}

/// Inverts 4 KiB of a file in place, as a bad disk would: in the page
/// cache every reader of the file shares.
pub fn flip_block(file: &std::path::Path, offset: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)?;
    let mut b = vec![0u8; 4096];
    f.read_exact_at(&mut b, offset)?;
    for x in b.iter_mut() {
        *x = !*x;
    }
    f.write_all_at(&b, offset)
}
