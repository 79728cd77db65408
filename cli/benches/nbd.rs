//! The engine's NBD endpoint against nbdkit's file plugin, in one run, on
//! one disk: `qemu-img bench` at queue depth 16, 4k and 64k, read and
//! write, through a unix socket. Prints each figure and the ratio, twice:
//! over each `qemu-img` run as a whole (its closing flush included: the
//! time until the data is durable), and over its I/O phase alone. Then
//! the CPU time the whole machine spent busy per operation over the whole
//! run: a measure of the work done that the host's stolen time does not
//! move (for three replicas, and for three nbdkit servers, an operation
//! is one write of the same bytes to all three). For writes, the seconds
//! of each run outside its I/O phase: the closing flush, with the
//! client's start and exit (a few milliseconds).
//!
//! - Ballast, 1 replica: `ballast node` (replica server on loopback TCP)
//!   and `ballast engine` serving NBD; the replica is on the engine's node,
//!   so it is lent to the engine.
//! - Ballast, 3 replicas: three node processes, writes to all three.
//! - The same with mutual TLS on the replica protocol (certificates of a
//!   CA made for the run), against TLS off.
//! - For writes, Ballast with 1 replica again with its writeback left to
//!   the kernel (`--writeback-every 0`), as nbdkit's is: the early
//!   writeback's share of the I/O phase, in the same run; and 3 replicas
//!   again the same way (their nodes and engine).
//! - Peer: `nbdkit file` serving a file on the same disk.
//! - For writes, a reference for three replicas: three `nbdkit file`
//!   servers written at once by three clients, the same bytes as three
//!   replicas to the same disk, with writeback left to the kernel.
//! - With 64k writes, the transport's own cost: the machine's CPU per
//!   64 KiB frame over loopback TCP (the replica protocol), sent one at a
//!   time and three at a time, and over a unix socket (the peers'
//!   clients) (`transport_floor`); and what three
//!   replicas' I/O phase would be against three nbdkit servers with no
//!   core idle, and with no core idle and TCP at a unix socket's cost.
//! - For writes, the bare pipeline of three replicas
//!   (`common/bare_pipeline.rs`): the same shape (one NBD endpoint sending
//!   each write to two processes over loopback TCP and writing it to a
//!   file, the two writing it to theirs) in plain blocking threads, with
//!   nothing of Ballast in it: what the shape costs on this machine,
//!   apart from the implementation.
//! - For writes, first, what the host takes from the cores to write the
//!   disk, while they are busy and while they are idle, with nothing of
//!   Ballast running (`common::host_disk_steal`): what disk work inside
//!   an I/O phase costs on this machine.
//! - With 64k writes, the issue's goals for them, each as this run's
//!   ratio, met or not (`goals`).
//! - With 4k writes, first, writes at queue depth 1, each followed by a
//!   flush, as a database commits (`flushed_writes`): 1 and 3 replicas
//!   against nbdkit and three nbdkit servers at once; and 1 replica that
//!   guards its checksums (its engine told of a stale replica, `--stale`:
//!   synced at every flush) against 1 that does not.
//!
//! Needs qemu-img and nbdkit. Run: `cargo bench -p ballast-cli --bench nbd`.
//! Words after `--` pick cases: a size (`4k`, `64k`) and/or a kind
//! (`read`, `write`), e.g. `-- 64k write`; `-- hold` prints every
//! endpoint and keeps them up until Enter, for profiling by hand;
//! `-- flushed` runs the flushed writes alone;
//! `-- ab=PATH` compares this build with another `ballast` binary, three
//! replicas each, or one with `1r`, over mutual TLS with `tls` (see `ab`).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

#[allow(dead_code)] // shared by the benchmarks; each uses a part
mod common;

use common::{Kill, SIZE, engine_of, quiet, wait_for};

/// Operations per second: over the whole run of `qemu-img` (its closing
/// flush included), and over its I/O phase alone (what it prints as "Run
/// completed in"); the machine's busy CPU time per operation over the
/// whole run, in µs (`common::machine_busy`); and, over the I/O phase
/// alone, the machine's busy and idle time per operation, in µs (sampled
/// every 5 ms, `common::Sampler`): idle is what the two cores had no task
/// for.
#[derive(Clone, Copy)]
struct Rate {
    wall: f64,
    io: f64,
    cpu: f64,
    io_busy: f64,
    io_idle: f64,
    io_steal: f64,
}

// The targets of a case, in the order they run in turns: their places in
// what `common::in_turns` returns. The last four run for writes only.
const PEER: usize = 0;
const ONE: usize = 1;
const THREE: usize = 2;
const TLS: usize = 3;
const PEERS3: usize = 4;
const LAZY: usize = 5;
const BARE: usize = 6;
const LAZY3: usize = 7;

/// The issue's goals for 64k writes, each a ratio of this run and met or
/// not (at least 1.00x): three replicas against three nbdkit servers at
/// once, until durable and in the I/O phase, both in the same run; one
/// replica against nbdkit in the I/O phase. Each for the default and for
/// the writeback left to the kernel (`--writeback-every 0`).
fn goals(runs: &[Vec<Rate>]) -> String {
    let ratio = |ours: usize, peer: usize, get: fn(&Rate) -> f64| {
        let col = |i: usize| runs[i].iter().map(get).collect::<Vec<f64>>();
        common::ratio(&col(ours), &col(peer))
    };
    let met = |ok: bool| if ok { "met" } else { "not met" };
    let wall: fn(&Rate) -> f64 = |r| r.wall;
    let io: fn(&Rate) -> f64 = |r| r.io;
    let three = |i: usize| {
        let (w, o) = (ratio(i, PEERS3, wall), ratio(i, PEERS3, io));
        format!("{w:.2}x / {o:.2}x ({})", met(w >= 1.0 && o >= 1.0))
    };
    let one = |i: usize| {
        let o = ratio(i, PEER, io);
        format!("{o:.2}x ({})", met(o >= 1.0))
    };
    format!(
        "64k write  goals, at least 1.00x: 3 replicas of 3 nbdkit file at once, until durable / I/O phase, in this run: default {}, writeback left to the kernel {}; 1 replica of nbdkit file, I/O phase: default {}, writeback left to the kernel {}",
        three(THREE),
        three(LAZY3),
        one(ONE),
        one(LAZY),
    )
}

/// A volume of `copies` replicas on the node processes of `bin` numbered
/// from `first`, each started with `node_extra(i)`, and its engine on the
/// first of them, started with `engine_extra`: what keeps them up, and the
/// volume's NBD URI.
fn volume_set(
    bin: &Path,
    dir: &Path,
    (volume, first, copies): (&str, usize, usize),
    node_extra: &dyn Fn(usize) -> Vec<String>,
    engine_extra: &[String],
) -> (Vec<Kill>, String) {
    fn strs(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    let mut kept = Vec::new();
    let mut replicas = Vec::new();
    for i in first..first + copies {
        let (k, r) = common::node_of(bin, dir, i, volume, true, &strs(&node_extra(i)));
        kept.push(k);
        replicas.push(r);
    }
    let (e, socket) = engine_of(bin, dir, volume, &replicas, first, &strs(engine_extra));
    kept.push(e);
    (
        kept,
        format!("nbd+unix:///{volume}?socket={}", socket.display()),
    )
}

/// The flags of an engine of `volume` on node `i` with credentials from
/// `ca` as the controller issues them (replicas take changes only from
/// their volume's engine). It claims no attachment, as one started by
/// hand.
fn engine_tls(ca: &ballast::tls::Ca, dir: &Path, volume: &str, i: usize) -> Vec<String> {
    let node = format!("bench-{i}");
    let d = dir.join(format!("{volume}-engine-tls"));
    ca.issue_engine(volume, &node, 1).unwrap().save(&d).unwrap();
    vec![
        "--tls-dir".into(),
        d.display().to_string(),
        "--node-id".into(),
        node,
    ]
}

/// `-- ab=PATH`: this build against the `ballast` binary at PATH, on a
/// volume of three replicas each (one with the word `1r`; speaking mutual
/// TLS with the word `tls`): its node processes and an engine from each
/// binary, both sets up side by side. They run in turns, five
/// rounds, two runs each after a warm-up; prints the medians of the rate
/// (until durable, I/O phase) and of the machine's CPU per operation, and
/// the ratios of this build's over the other's. The picked cases apply:
/// `4k` and `64k` writes at QD16, `flushed` 4k writes at QD1 each followed
/// by a flush (all three without a word).
fn ab(dir: &Path, other: &Path, picked: &common::Picked) {
    let this = Path::new(common::BALLAST);
    assert!(other.is_file(), "no ballast binary at {}", other.display());
    let copies = if picked.has("1r") { 1 } else { 3 };
    let ca = ballast::tls::Ca::generate().unwrap();
    // Each node's credentials, when the sets speak TLS.
    let tls = |i: usize| -> Vec<String> {
        if !picked.has("tls") {
            return Vec::new();
        }
        let d = dir.join(format!("tls-{i}"));
        ca.issue(&ballast::tls::Role::Node(format!("bench-{i}")))
            .unwrap()
            .save(&d)
            .unwrap();
        vec!["--tls-dir".into(), d.display().to_string()]
    };
    let set = |bin: &Path, first: usize, volume: &str| {
        // The engine is on the first node, with its own credentials.
        let engine_extra = if picked.has("tls") {
            engine_tls(&ca, dir, volume, first)
        } else {
            Vec::new()
        };
        volume_set(bin, dir, (volume, first, copies), &tls, &engine_extra)
    };
    let (_a, a) = set(this, 11, "a");
    let (_b, b) = set(other, 21, "b");
    println!(
        "A/B, {copies} replica(s){}, writes: this build against {} ({})",
        if picked.has("tls") {
            ", mutual TLS"
        } else {
            ""
        },
        other.display(),
        common::in_turns_said()
    );
    let cases = [
        ("4k", "4k", Kind::Write, 40_000u32),
        ("64k", "64k", Kind::Write, 8_000),
        ("flushed", "4k", Kind::Flushed, 2_000),
    ];
    for (word, size, kind, count) in cases {
        if !picked.wanted(word, &["4k", "64k", "flushed"]) {
            continue;
        }
        let side = |target: &str| {
            bench_at_once(&[target], size, kind, count / 4);
            [0, 1].map(|_| bench_at_once(&[target], size, kind, count))
        };
        let label = match kind {
            Kind::Flushed => "4k writes at QD1, each flushed:".to_string(),
            _ => format!("{size} writes at QD16:"),
        };
        let (mut x, mut y) = (|| side(&a), || side(&b));
        let runs = common::in_turns(&mut [&mut x, &mut y]);
        let of = |i: usize, get: fn(&Rate) -> f64| -> Vec<f64> {
            runs[i].iter().flatten().map(get).collect()
        };
        for (what, get, more_is_better) in [
            (
                "until durable, op/s",
                (|r: &Rate| r.wall) as fn(&Rate) -> f64,
                true,
            ),
            ("I/O phase, op/s", |r: &Rate| r.io, true),
            ("CPU per op, whole machine, µs", |r: &Rate| r.cpu, false),
            ("CPU per op, I/O phase, µs", |r: &Rate| r.io_busy, false),
        ] {
            let (x, y) = (of(0, get), of(1, get));
            let ratio = if more_is_better {
                common::ratio(&x, &y)
            } else {
                common::ratio(&y, &x)
            };
            println!(
                "{label} {what:<30} this {:>9.1}  other {:>9.1}  {:.2}x{}",
                common::median(x.clone()),
                common::median(y.clone()),
                ratio,
                if more_is_better {
                    " (this over other)"
                } else {
                    " (other's CPU over this one's)"
                }
            );
        }
        println!(
            "{label} {:<30} this {:>9.1}  other {:>9.1}",
            "idle cores per op, I/O phase, µs",
            common::median(of(0, |r| r.io_idle)),
            common::median(of(1, |r| r.io_idle)),
        );
        println!(
            "{label} {:<30} this {:>9.1}  other {:>9.1}",
            "steal per op, I/O phase, µs",
            common::median(of(0, |r| r.io_steal)),
            common::median(of(1, |r| r.io_steal)),
        );
    }
}

/// What a qemu-img bench run does: reads or writes at queue depth 16, or
/// writes at queue depth 1, each followed by a flush (as a database
/// commits).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
    Flushed,
}

/// One qemu-img bench per target, all at once; returns the operations per
/// second of one of them (`count` over the time until the last ends).
/// Each run starts settled (`sync`): a run's closing flush has made its
/// own data durable, but what was still under way after it fell on the
/// next run. The run after three nbdkit servers' 1.5 GB took up to twice
/// as long without it (data-plane.md, "the run before").
fn bench_at_once(targets: &[&str], size: &str, kind: Kind, count: u32) -> Rate {
    nix::unistd::sync();
    let busy = common::machine_busy();
    let sampler = common::Sampler::start();
    let start = Instant::now();
    let running: Vec<Child> = targets
        .iter()
        .map(|t| {
            qemu_img_bench(t, size, kind, count)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("qemu-img is installed")
        })
        .collect();
    let mut io: f64 = 0.0;
    for r in running {
        let out = r.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let printed = String::from_utf8_lossy(&out.stdout);
        let secs = printed
            .split("Run completed in ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no run time in qemu-img's output: {printed}"));
        io = io.max(secs);
    }
    let wall = start.elapsed().as_secs_f64();
    let cpu = (common::machine_busy() - busy) * 1e6 / f64::from(count);
    let phase = sampler.until(std::time::Duration::from_secs_f64(io));
    Rate {
        wall: f64::from(count) / wall,
        io: f64::from(count) / io,
        cpu,
        io_busy: phase.busy * 1e6 / f64::from(count),
        io_idle: phase.idle * 1e6 / f64::from(count),
        io_steal: phase.steal * 1e6 / f64::from(count),
    }
}

fn qemu_img_bench(target: &str, size: &str, kind: Kind, count: u32) -> Command {
    let mut c = Command::new("qemu-img");
    let depth = if kind == Kind::Flushed { "1" } else { "16" };
    c.args([
        "bench",
        "-f",
        "raw",
        "-d",
        depth,
        "-s",
        size,
        "-c",
        &count.to_string(),
    ]);
    if kind != Kind::Read {
        c.arg("-w");
    }
    if kind == Kind::Flushed {
        c.arg("--flush-interval=1");
    }
    c.arg(target);
    c
}

/// The transport's own cost: the whole machine's busy CPU per frame of
/// `payload` bytes (and a replica request's header) written by one thread
/// and read by another over a connected pair of sockets, loopback TCP (as
/// the replica protocol: `TCP_NODELAY`, the host's congestion control,
/// read 256 KiB at a time like its server) against a unix socket (as
/// `qemu-img` talks to nbdkit). TCP twice: a frame per send, and
/// [`FRAMES_PER_SEND`] frames per send, as the engine's writer sends the
/// frames that queued meanwhile (a frame a little over 64 KiB does not fit
/// one loopback segment, so one frame alone takes two). In turns; returns
/// the medians, in µs per frame: TCP one at a time, TCP batched, unix.
fn transport_floor(payload: usize, frames: usize) -> (f64, f64, f64) {
    use std::io::{Read, Write};
    fn pump<S: Read + Write + Send + 'static>(
        mut tx: S,
        mut rx: S,
        frame: usize,
        n: usize,
        per_send: usize,
    ) -> f64 {
        assert_eq!(n % per_send, 0, "{n} frames do not go {per_send} per send");
        let busy = common::machine_busy();
        let reader = std::thread::spawn(move || {
            let mut buf = vec![0u8; ballast_node::wire::IO_BUFFER];
            let mut left = frame * n;
            while left > 0 {
                let got = rx.read(&mut buf).unwrap();
                assert!(got > 0, "the sender closed early");
                left -= got.min(left);
            }
        });
        let bytes = vec![0x5au8; frame * per_send];
        for _ in 0..n / per_send {
            tx.write_all(&bytes).unwrap();
        }
        reader.join().unwrap();
        (common::machine_busy() - busy) / n as f64 * 1e6
    }
    let frame = payload + ballast_node::wire::protocol::REQUEST_HEADER;
    let tcp = |per_send: usize| {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let tx = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (rx, _) = l.accept().unwrap();
        tx.set_nodelay(true).unwrap();
        rx.set_nodelay(true).unwrap();
        pump(tx, rx, frame, frames, per_send)
    };
    let mut unix = || {
        let (tx, rx) = std::os::unix::net::UnixStream::pair().unwrap();
        pump(tx, rx, frame, frames, 1)
    };
    let runs = common::in_turns(&mut [&mut || tcp(1), &mut || tcp(FRAMES_PER_SEND), &mut unix]);
    let mid = |i: usize| common::median(runs[i].clone());
    (mid(0), mid(1), mid(2))
}

/// Frames per send in `transport_floor`'s batched case: about what the
/// engine's writer sends at a time to each replica with 64k writes at QD16
/// (1.37 loopback segments per frame counted with `ss -ti` on 2026-11-26,
/// which is batches of 2.7 frames).
const FRAMES_PER_SEND: usize = 3;

/// `nbdkit file` on a new file `name`.img of the disk; returns it and its URI.
fn nbdkit_file(dir: &Path, name: &str) -> (Kill, String) {
    let file = dir.join(format!("{name}.img"));
    std::fs::File::create(&file).unwrap().set_len(SIZE).unwrap();
    let sock = dir.join(format!("{name}.sock"));
    let child = quiet(
        Command::new("nbdkit")
            .args(["-f", "-U"])
            .arg(&sock)
            .arg("file")
            .arg(format!("file={}", file.display())),
    )
    .spawn()
    .expect("nbdkit is installed");
    wait_for(&sock);
    (
        Kill(child),
        format!("nbd+unix://?socket={}", sock.display()),
    )
}

/// 4k writes at queue depth 1, each followed by a flush, in turns: what a
/// flush costs through the engine (every replica's flush) against nbdkit's
/// (an `fdatasync`), until durable, as a database's commits see it. And
/// one replica that guards its checksums (`guarded`: synced at every
/// flush, as a volume's only rw replica does while another exists)
/// against one that does not.
fn flushed_writes(peer: &str, one: &str, three: &str, peers3: &[&str], guarded: &str) {
    const COUNT: u32 = 2_000;
    let run = |targets: &[&str]| bench_at_once(targets, "4k", Kind::Flushed, COUNT);
    let (mut p, mut a, mut b, mut c, mut g) = (
        || run(&[peer]),
        || run(&[one]),
        || run(&[three]),
        || run(peers3),
        || run(&[guarded]),
    );
    let runs = common::in_turns(&mut [&mut p, &mut a, &mut b, &mut c, &mut g]);
    let rates: Vec<Vec<f64>> = runs
        .iter()
        .map(|rs| rs.iter().map(|r| r.wall).collect())
        .collect();
    let mid = |i: usize| common::median(rates[i].clone());
    println!(
        " 4k writes at QD1, each flushed, until durable  nbdkit file {:>6.0}  ballast 1 replica {:>6.0} ({:.2}x)  ballast 3 replicas {:>6.0}  3 nbdkit file at once {:>6.0}; 3 replicas: {:.2}x of them",
        mid(0),
        mid(1),
        common::ratio(&rates[1], &rates[0]),
        mid(2),
        mid(3),
        common::ratio(&rates[2], &rates[3]),
    );
    println!(
        " 4k writes at QD1, each flushed, until durable  ballast 1 replica guarding its checksums {:>6.0}: {:.2}x of 1 replica, {:.2}x of nbdkit file",
        mid(4),
        common::ratio(&rates[4], &rates[1]),
        common::ratio(&rates[4], &rates[0]),
    );
}

/// A volume of one replica on node `first`, whose engine is told of a
/// stale replica of it on node `first + 1` (`--stale`): its one replica
/// guards its checksums, as a volume's only rw replica does while another
/// exists (the engine's `guard`). What keeps them up, and the NBD URI.
fn guarded_set(bin: &Path, dir: &Path, (volume, first): (&str, usize)) -> (Vec<Kill>, String) {
    let (k0, r0) = common::node_of(bin, dir, first, volume, true, &[]);
    let (k1, r1) = common::node_of(bin, dir, first + 1, volume, true, &[]);
    let (e, socket) = engine_of(bin, dir, volume, &[r0], first, &["--stale", &r1]);
    (
        vec![k0, k1, e],
        format!("nbd+unix:///{volume}?socket={}", socket.display()),
    )
}

fn main() {
    common::bare_pipeline::run_if_asked();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let picked = common::Picked::from_args();
    if let Some(other) = picked.0.iter().find_map(|w| w.strip_prefix("ab=")) {
        ab(dir.path(), Path::new(other), &picked);
        return;
    }
    // The peer: nbdkit's file plugin on a file of the same disk; and three
    // more, for the three-replica reference.
    let (_peer, peer) = nbdkit_file(dir.path(), "peer");
    let (peers3_kill, peers3): (Vec<Kill>, Vec<String>) = (1..=3)
        .map(|i| nbdkit_file(dir.path(), &format!("peer3-{i}")))
        .unzip();
    let peers3: Vec<&str> = peers3.iter().map(String::as_str).collect();

    let bin = Path::new(common::BALLAST);
    let none = |_: usize| Vec::new();
    let (_one, one) = volume_set(bin, dir.path(), ("one", 1, 1), &none, &[]);
    // One replica again, its writeback left to the kernel (as nbdkit's):
    // the early writeback's share of the I/O phase, in the same run.
    let no_writeback: Vec<String> = vec!["--writeback-every".into(), "0".into()];
    let (_lazy, lazy) = volume_set(bin, dir.path(), ("lazy", 8, 1), &none, &no_writeback);
    let (_three, three) = volume_set(bin, dir.path(), ("three", 2, 3), &none, &[]);
    // Three replicas again, their writeback left to the kernel everywhere.
    let lazy_nodes = |_: usize| no_writeback.clone();
    let (_lazy3, lazy3) = volume_set(bin, dir.path(), ("lazy3", 9, 3), &lazy_nodes, &no_writeback);
    // One replica guarding its checksums (nodes 12 and 13).
    let (_guarded, guarded) = guarded_set(bin, dir.path(), ("guarded", 12));
    // The same shape with nothing of Ballast in it (`common::bare_pipeline`).
    let (_bare, bare) = common::bare_pipeline::start(dir.path());

    // Three replicas again, with mutual TLS between the engine and them.
    let ca = ballast::tls::Ca::generate().unwrap();
    let tls_dir = |i: usize| {
        let d = dir.path().join(format!("tls-{i}"));
        ca.issue(&ballast::tls::Role::Node(format!("bench-{i}")))
            .unwrap()
            .save(&d)
            .unwrap();
        vec!["--tls-dir".into(), d.display().to_string()]
    };
    let engine_tls = engine_tls(&ca, dir.path(), "tls", 5);
    let (_tls, tls) = volume_set(bin, dir.path(), ("tls", 5, 3), &tls_dir, &engine_tls);

    let wanted = |word: &str, all: &[&str]| picked.wanted(word, all);
    if picked.has("hold") {
        println!(
            "bare pipeline of three replicas: {bare}\nnbdkit file: {peer}\n1 replica: {one}\n1 replica, writeback left to the kernel: {lazy}\n3 replicas: {three}\n3 replicas, writeback left to the kernel: {lazy3}\n3 replicas, TLS: {tls}\nEnter ends."
        );
        let _ = std::io::stdin().read_line(&mut String::new());
        return;
    }
    println!(
        "qemu-img bench, QD16, unix socket, operations per second ({})",
        common::in_turns_said()
    );
    if wanted("write", &["read", "write"]) {
        println!("{}", common::host_disk_steal_said(dir.path()));
    }
    if wanted("4k", &["4k", "64k"]) && wanted("write", &["read", "write"]) {
        flushed_writes(&peer, &one, &three, &peers3, &guarded);
    }
    if picked.has("flushed") {
        return;
    }
    for (size, count) in [("4k", 40_000u32), ("64k", 8_000)] {
        // Writes first fill the images, so that reads read data.
        for write in [true, false] {
            let kind = if write { "write" } else { "read" };
            if !wanted(size, &["4k", "64k"]) || !wanted(kind, &["read", "write"]) {
                continue;
            }
            // In turns (see `common::in_turns`), in the order of the
            // indexes (`PEER` ...); the last four run for writes only.
            let load = if write { Kind::Write } else { Kind::Read };
            let run = |targets: &[&str]| bench_at_once(targets, size, load, count);
            let mut turns: Vec<&mut dyn FnMut() -> Rate> = Vec::new();
            let (mut p, mut a, mut b, mut t, mut c, mut l, mut f, mut l3) = (
                || run(&[&peer]),
                || run(&[&one]),
                || run(&[&three]),
                || run(&[&tls]),
                || run(&peers3),
                || run(&[&lazy]),
                || run(&[&bare]),
                || run(&[&lazy3]),
            );
            turns.extend([&mut p as &mut dyn FnMut() -> Rate, &mut a, &mut b, &mut t]);
            if write {
                turns.extend([&mut c as &mut dyn FnMut() -> Rate, &mut l, &mut f, &mut l3]);
            }
            let runs = common::in_turns(&mut turns);
            for (what, get) in [
                ("", (|r: &Rate| r.wall) as fn(&Rate) -> f64),
                ("  I/O phase only", |r: &Rate| r.io),
            ] {
                let rates: Vec<Vec<f64>> =
                    runs.iter().map(|rs| rs.iter().map(get).collect()).collect();
                let mid = |i: usize| common::median(rates[i].clone());
                let of_peer = |i: usize| common::ratio(&rates[i], &rates[PEER]);
                print!(
                    "{size:>3} {kind:<5}{what}  nbdkit file {:>8.0}  ballast 1 replica {:>8.0} ({:.2}x)  ballast 3 replicas {:>8.0} ({:.2}x)",
                    mid(PEER),
                    mid(ONE),
                    of_peer(ONE),
                    mid(THREE),
                    of_peer(THREE),
                );
                if write {
                    print!(
                        "  3 nbdkit file at once {:>8.0} ({:.2}x); 3 replicas: {:.2}x of them",
                        mid(PEERS3),
                        of_peer(PEERS3),
                        common::ratio(&rates[THREE], &rates[PEERS3]),
                    );
                }
                println!();
                if write {
                    println!(
                        "{size:>3} {kind:<5}{what}  ballast 1 replica, writeback left to the kernel (--writeback-every 0) {:>8.0} ({:.2}x of nbdkit file)",
                        mid(LAZY),
                        of_peer(LAZY),
                    );
                    println!(
                        "{size:>3} {kind:<5}{what}  ballast 3 replicas, writeback left to the kernel (--writeback-every 0) {:>8.0} ({:.2}x of 3 nbdkit file at once; {:.2}x of the default)",
                        mid(LAZY3),
                        common::ratio(&rates[LAZY3], &rates[PEERS3]),
                        common::ratio(&rates[LAZY3], &rates[THREE]),
                    );
                    println!(
                        "{size:>3} {kind:<5}{what}  bare pipeline of three replicas' shape, nothing of Ballast (common/bare_pipeline.rs) {:>8.0} ({:.2}x of 3 nbdkit file at once); 3 replicas: {:.2}x of it",
                        mid(BARE),
                        common::ratio(&rates[BARE], &rates[PEERS3]),
                        common::ratio(&rates[THREE], &rates[BARE]),
                    );
                }
                println!(
                    "{size:>3} {kind:<5}{what}  ballast 3 replicas, TLS on the replica protocol {:>8.0}: {:.2}x of TLS off",
                    mid(TLS),
                    common::ratio(&rates[TLS], &rates[THREE]),
                );
            }
            if write && size == "64k" {
                println!("{}", goals(&runs));
            }
            // The work done, whatever the host took: the machine's CPU per
            // operation, and the peer's over ours (above 1: Ballast spends
            // less).
            let cpu: Vec<Vec<f64>> = runs
                .iter()
                .map(|rs| rs.iter().map(|r| r.cpu).collect())
                .collect();
            let mid = |i: usize| common::median(cpu[i].clone());
            let peer_over = |i: usize, peer: usize| common::ratio(&cpu[peer], &cpu[i]);
            print!(
                "{size:>3} {kind:<5}  CPU per operation, whole machine, until durable (µs; peer's over ours)  nbdkit file {:>6.1}  ballast 1 replica {:>6.1} ({:.2}x)  ballast 3 replicas {:>6.1}",
                mid(PEER),
                mid(ONE),
                peer_over(ONE, PEER),
                mid(THREE),
            );
            if write {
                print!(
                    "  3 nbdkit file at once {:>6.1}; 3 replicas: {:.2}x of them; 1 replica, writeback left to the kernel {:>6.1} ({:.2}x); 3 replicas, writeback left to the kernel {:>6.1} (3 nbdkit file at once over it: {:.2}x)",
                    mid(PEERS3),
                    peer_over(THREE, PEERS3),
                    mid(LAZY),
                    peer_over(LAZY, PEER),
                    mid(LAZY3),
                    peer_over(LAZY3, PEERS3),
                );
            }
            println!(
                "  TLS {:>6.1} ({:.2}x of TLS off)",
                mid(TLS),
                peer_over(TLS, THREE)
            );
            // Inside the I/O phase alone: what the two cores did per
            // operation, and how long they had nothing to run.
            let of = |i: usize, get: fn(&Rate) -> f64| -> f64 {
                common::median(runs[i].iter().map(get).collect())
            };
            let phase = |i: usize| {
                let (busy, idle) = (of(i, |r| r.io_busy), of(i, |r| r.io_idle));
                format!("{busy:.1} / {idle:.1} / {:.1}", of(i, |r| r.io_steal))
            };
            print!(
                "{size:>3} {kind:<5}  I/O phase, whole machine per operation (µs busy / idle / steal)  nbdkit file {}  ballast 1 replica {}  ballast 3 replicas {}",
                phase(PEER),
                phase(ONE),
                phase(THREE),
            );
            if write {
                print!(
                    "  3 nbdkit file at once {}  ballast 1 replica, writeback left to the kernel {}  ballast 3 replicas, writeback left to the kernel {}  bare pipeline {}",
                    phase(PEERS3),
                    phase(LAZY),
                    phase(LAZY3),
                    phase(BARE)
                );
            }
            println!("  TLS {}", phase(TLS));
            if write {
                // Outside the I/O phase: the closing flush, with the
                // clients' start and exit, in seconds. The three peers'
                // clients end apart, so one's flush runs under another's
                // last writes; a volume's one client flushes every replica
                // at once (data-plane.md).
                let after = |i: usize| {
                    let n = f64::from(count);
                    common::median(runs[i].iter().map(|r| n / r.wall - n / r.io).collect())
                };
                println!(
                    "{size:>3} {kind:<5}  outside the I/O phase (the closing flush, with the client's start and exit; s)  3 nbdkit file at once {:.3}  ballast 3 replicas {:.3}  ballast 3 replicas, writeback left to the kernel {:.3}  nbdkit file {:.3}  ballast 1 replica {:.3}  ballast 1 replica, writeback left to the kernel {:.3}",
                    after(PEERS3),
                    after(THREE),
                    after(LAZY3),
                    after(PEER),
                    after(ONE),
                    after(LAZY),
                );
            }
            if write && size == "64k" {
                // What the transport costs three replicas on one box: their
                // two frames cross loopback TCP where the peers' cross unix
                // sockets (measured alone, so an estimate of its share).
                let (tcp, batched, unix) = transport_floor(64 * 1024, 15_000);
                let extra = 2.0 * (tcp - unix);
                let extra_batched = 2.0 * (batched - unix);
                // Two cores' time per write, over the I/O phase: the peers'
                // busy and idle, against the three replicas' busy alone
                // (no core idle), and without the transport's extra too.
                let peers = of(PEERS3, |r| r.io_busy) + of(PEERS3, |r| r.io_idle);
                let busy = of(THREE, |r| r.io_busy);
                println!(
                    "{size:>3} {kind:<5}  transport, whole machine's CPU per 64 KiB frame (µs): loopback TCP {tcp:.1} one frame per send, {batched:.1} {FRAMES_PER_SEND} per send; unix socket {unix:.1} ({:.2}x, {:.2}x); a write to 3 replicas sends 2 over TCP where 3 nbdkit servers' clients use unix sockets: {extra:+.1} µs per write one at a time, {extra_batched:+.1} batched. 3 replicas against them in the I/O phase, from the busy and idle time above: with no core idle {:.2}x, with no core idle and no transport's extra {:.2}x (batched: {:.2}x)",
                    tcp / unix,
                    batched / unix,
                    peers / busy,
                    peers / (busy - extra),
                    peers / (busy - extra_batched),
                );
            }
        }
    }
    drop(peers3_kill);
}
