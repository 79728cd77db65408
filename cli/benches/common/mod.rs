//! What the benchmarks share: node and engine processes on one disk.

pub mod bare_pipeline;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The `ballast` binary of this build.
pub const BALLAST: &str = env!("CARGO_BIN_EXE_ballast");
pub const SIZE: u64 = 1 << 30;

pub struct Kill(pub Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn wait_for(path: &Path) {
    let end = Instant::now() + Duration::from_secs(30);
    while !path.exists() {
        assert!(Instant::now() < end, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn quiet(cmd: &mut Command) -> &mut Command {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
}

/// A node process holding one replica of `volume`; returns NAME@ADDR.
/// Without `block_sums`, the replica is in the format from before
/// per-block checksums.
pub fn node_with(dir: &Path, i: usize, volume: &str, block_sums: bool) -> (Kill, String) {
    node_of(Path::new(BALLAST), dir, i, volume, block_sums, &[])
}

/// Like `node_with`, run from the `ballast` binary `bin` (another build, for
/// an A/B), with more flags for the node.
pub fn node_of(
    bin: &Path,
    dir: &Path,
    i: usize,
    volume: &str,
    block_sums: bool,
    extra: &[&str],
) -> (Kill, String) {
    let disk = dir.join(format!("node-{i}/disk"));
    std::fs::create_dir_all(&disk).unwrap();
    let name = format!("{volume}-r{i}");
    let at = ballast_node::replica::replica_dir(&disk, &name);
    if block_sums {
        ballast_node::replica::Replica::create_for(&at, volume, SIZE).unwrap();
    } else {
        ballast_node::replica::Replica::create_without_block_sums(&at, SIZE).unwrap();
    }
    let replica_port = free_port();
    let child = quiet(
        Command::new(bin)
            .args(["node", "--node-id", &format!("bench-{i}")])
            .arg("--disk")
            .arg(&disk)
            .args([
                "--controller",
                "http://127.0.0.1:1",
                "--csi-endpoint",
                &format!("unix://{}", dir.join(format!("node-{i}.sock")).display()),
                "--agent-listen",
                &format!("127.0.0.1:{}", free_port()),
                "--replica-listen",
                &format!("127.0.0.1:{replica_port}"),
            ])
            .arg("--state-dir")
            .arg(dir.join(format!("node-{i}/state")))
            .args(extra),
    )
    .spawn()
    .unwrap();
    wait_for(&dir.join(format!("node-{i}.sock")));
    (Kill(child), format!("{name}@127.0.0.1:{replica_port}"))
}

/// The engine of `volume`, on the node of its first replica (`local_node`).
pub fn engine(
    dir: &Path,
    volume: &str,
    replicas: &[String],
    local_node: usize,
    extra: &[&str],
) -> (Kill, PathBuf) {
    engine_of(Path::new(BALLAST), dir, volume, replicas, local_node, extra)
}

/// Like `engine`, run from the `ballast` binary `bin` (another build, for
/// an A/B against the same node processes).
pub fn engine_of(
    bin: &Path,
    dir: &Path,
    volume: &str,
    replicas: &[String],
    local_node: usize,
    extra: &[&str],
) -> (Kill, PathBuf) {
    let socket = dir.join(format!("{volume}.sock"));
    // A socket left by an engine before this one would look ready.
    let _ = std::fs::remove_file(&socket);
    let mut c = Command::new(bin);
    c.args(["engine", "--volume", volume, "--size", "1Gi"])
        .arg("--socket")
        .arg(&socket);
    for r in replicas {
        c.args(["--replica", r]);
    }
    // The first replica is on the engine's node, as attach arranges it: its
    // reads go straight to its files.
    let local = replicas[0].split('@').next().unwrap();
    c.args(["--local", local]);
    c.arg("--local-dir").arg(ballast_node::replica::replica_dir(
        &dir.join(format!("node-{local_node}/disk")),
        local,
    ));
    c.args(extra);
    let child = quiet(&mut c).spawn().unwrap();
    wait_for(&socket);
    (Kill(child), socket)
}

/// The cases picked on the command line (words not starting with `--`):
/// `wanted(word, all)` says whether to run `word`, one of `all` (every
/// one of them when none was named).
pub struct Picked(pub Vec<String>);

impl Picked {
    pub fn from_args() -> Picked {
        Picked(
            std::env::args()
                .skip(1)
                .filter(|a| !a.starts_with("--"))
                .collect(),
        )
    }

    pub fn wanted(&self, word: &str, all: &[&str]) -> bool {
        !self.0.iter().any(|p| all.contains(&p.as_str())) || self.0.iter().any(|p| p == word)
    }

    pub fn has(&self, word: &str) -> bool {
        self.0.iter().any(|p| p == word)
    }
}

/// How many rounds `in_turns` runs.
pub const ROUNDS: usize = 5;

/// Runs each of `runs` once per round, `ROUNDS` rounds, each round starting
/// one further along, so that what drifts during a case (the page cache,
/// writeback, the host under this virtual machine) falls on all of them
/// alike. Every other round goes the other way round, so that no run
/// always follows the same one: what a run leaves behind (the host still
/// writing a flush out) would otherwise fall on one side every round.
/// Returns each run's results, in rounds.
pub fn in_turns<T>(runs: &mut [&mut dyn FnMut() -> T]) -> Vec<Vec<T>> {
    let mut out: Vec<Vec<T>> = runs.iter().map(|_| Vec::new()).collect();
    for round in 0..ROUNDS {
        for i in turn_order(round, runs.len()) {
            out[i].push(runs[i]());
        }
    }
    out
}

/// The order of `n` runs in round `round` of `in_turns`.
fn turn_order(round: usize, n: usize) -> Vec<usize> {
    (0..n)
        .map(|k| {
            if round.is_multiple_of(2) {
                (round + k) % n
            } else {
                (round + n - k) % n
            }
        })
        .collect()
}

/// How `in_turns` figures are made, for a bench's heading.
pub fn in_turns_said() -> String {
    format!("medians of {ROUNDS} in turns; a ratio is the median of each round's own")
}

/// The middle one of `v`.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// `ours` against `peer`: the median over rounds of the ratio of the two
/// runs of the same round, which a drift between rounds does not move.
pub fn ratio(ours: &[f64], peer: &[f64]) -> f64 {
    median(ours.iter().zip(peer).map(|(o, p)| o / p).collect())
}

/// Runs fio with `cmd`'s arguments plus the case's; its JSON output
/// (after any notices the nbd engine prints first).
pub fn fio_json(cmd: &mut Command, rw: &str, bs: &str) -> serde_json::Value {
    let out = cmd
        .arg(format!("--rw={rw}"))
        .arg(format!("--bs={bs}"))
        .output()
        .expect("fio is installed");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let json = &text[text.find('{').unwrap_or(0)..];
    serde_json::from_str(json).expect("fio's JSON")
}

/// The CPU time the whole machine has spent busy so far (user, nice,
/// system, irq and softirq in `/proc/stat`; not idle, iowait or steal),
/// in seconds. Taken around a run, it counts every process and kernel
/// thread the run kept busy (node processes, writeback, the loopback's
/// softirq), whoever's they are, and not the time the host took from
/// this virtual machine, which moves rates but not the work done.
pub fn machine_busy() -> f64 {
    machine_times().busy
}

/// The whole machine's CPU time so far, in seconds: busy (see
/// `machine_busy`), idle (idle and iowait: no task to run) and steal (the
/// host ran something else on this machine's cores, such as its own work
/// for the virtual disk).
#[derive(Clone, Copy, Default)]
pub struct MachineTimes {
    pub busy: f64,
    pub idle: f64,
    pub steal: f64,
}

impl std::ops::Sub for MachineTimes {
    type Output = MachineTimes;
    fn sub(self, earlier: MachineTimes) -> MachineTimes {
        MachineTimes {
            busy: self.busy - earlier.busy,
            idle: self.idle - earlier.idle,
            steal: self.steal - earlier.steal,
        }
    }
}

/// `/proc/stat`'s first line, in seconds.
pub fn machine_times() -> MachineTimes {
    let stat = std::fs::read_to_string("/proc/stat").expect("/proc/stat");
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .map(|n| n.parse().unwrap_or(0))
        .collect();
    // user nice system idle iowait irq softirq steal ...
    let sum = |fields: &[usize]| -> u64 {
        fields
            .iter()
            .map(|&i| ticks.get(i).copied().unwrap_or(0))
            .sum()
    };
    let per_sec = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    MachineTimes {
        busy: sum(&[0, 1, 2, 5, 6]) as f64 / per_sec,
        idle: sum(&[3, 4]) as f64 / per_sec,
        steal: sum(&[7]) as f64 / per_sec,
    }
}

/// `machine_times` every 5 ms on a thread of its own, from `start` until
/// `until`: to count what the machine did in part of a run (up to a time
/// known only when the run ends, such as qemu-img's I/O phase). Reading
/// `/proc/stat` 200 times a second costs both sides of a run alike.
pub struct Sampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<(Instant, MachineTimes)>>,
}

impl Sampler {
    pub fn start() -> Sampler {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut samples = vec![(Instant::now(), machine_times())];
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(5));
                samples.push((Instant::now(), machine_times()));
            }
            samples
        });
        Sampler { stop, thread }
    }

    /// Ends the sampling; what the machine did from the first sample to
    /// the one nearest `until` after it.
    pub fn until(self, until: Duration) -> MachineTimes {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let samples = self.thread.join().expect("the sampler thread");
        let (first, at_first) = samples[0];
        let nearest = samples
            .iter()
            .min_by_key(|(t, _)| t.duration_since(first).abs_diff(until))
            .map(|(_, m)| *m)
            .unwrap_or(at_first);
        nearest - at_first
    }
}

/// What the host takes from this machine's cores to write its disk: the
/// steal (`/proc/stat`) that writing 512 MiB to a file in `dir` and
/// syncing it adds, in ms per GiB, while both cores are kept busy (two
/// threads spinning; their own steal over the same time, measured alone
/// just before, taken off) and while they are idle (the writing thread
/// alone, which mostly waits for the disk). On a virtual machine
/// whose disk the host emulates on the cores it also runs the machine
/// on, the first is what disk work done inside a run's I/O phase costs
/// it, and the second what the same work costs in a closing flush, while
/// the cores wait. Nothing of Ballast runs.
pub fn host_disk_steal(dir: &Path) -> (f64, f64) {
    use std::io::Write;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    const BYTES: usize = 512 << 20;
    let path = dir.join("host-disk-steal");
    let write = || {
        let chunk: Vec<u8> = (0..1usize << 20).map(|i| (i % 251) as u8 + 1).collect();
        let mut f = std::fs::File::create(&path).expect("create the probe's file");
        for _ in 0..BYTES / chunk.len() {
            f.write_all(&chunk).expect("write the probe's file");
        }
        f.sync_data().expect("sync the probe's file");
        let _ = std::fs::remove_file(&path);
    };
    // Both cores spinning while `work` runs; the steal over that time.
    let spinning = |work: &dyn Fn()| -> (f64, Duration) {
        let stop = Arc::new(AtomicBool::new(false));
        let spinners: Vec<_> = (0..2)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        let (before, t) = (machine_times(), Instant::now());
        work();
        let (after, took) = (machine_times(), t.elapsed());
        stop.store(true, Ordering::Relaxed);
        for s in spinners {
            s.join().expect("a spinning thread");
        }
        ((after - before).steal, took)
    };
    // A first write, not counted, so that neither measure pays for a
    // first use (the file's blocks, the page cache's pages).
    nix::unistd::sync();
    write();
    nix::unistd::sync();
    let (with_writes, took) = spinning(&write);
    let (alone, _) = spinning(&|| std::thread::sleep(took));
    nix::unistd::sync();
    let before = machine_times();
    write();
    let idle = (machine_times() - before).steal;
    let per_gib = (1u64 << 30) as f64 / BYTES as f64 * 1000.0;
    (((with_writes - alone).max(0.0)) * per_gib, idle * per_gib)
}

/// `host_disk_steal`, as one line for a bench's output.
pub fn host_disk_steal_said(dir: &Path) -> String {
    let (busy, idle) = host_disk_steal(dir);
    format!(
        "the host's steal for disk writes (512 MiB written and synced, no Ballast): {busy:.0} ms per GiB with both cores busy, {idle:.0} ms with them idle"
    )
}
