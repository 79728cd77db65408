//! Freezing a head of 1 GiB of data: the time a snapshot (and the start
//! of every rebuild, which freezes the heads) holds the volume's I/O
//! paused, per replica. A freeze takes the head's layer checksum (and
//! checks each block): read whole, it reads the whole head; read ahead
//! (`warm`, as the engine asks before it pauses the I/O), only the
//! chunks written since. Against `cat` of the head's file to /dev/null
//! (the least it costs to read it once), with the page cache dropped
//! first, and with the head just written (cached): the freeze that reads
//! the whole head, the read ahead (I/O running), and the freeze after it
//! with 16 MiB written meanwhile over 16 chunks. The freeze that reads
//! the whole head runs twice, on the threads a freeze reads with here
//! (`Replica::set_freeze_readers`, by default the cores, at most four)
//! and on one, as every freeze read until 2026-12-07. Median of 3.
//!
//! Then a head of 1 GiB just written, read ahead while a writer of 4 KiB
//! blocks at random places writes 1,000 and then 10,000 of them a second
//! (a database's writes, spread over the whole head), then frozen: what
//! the freeze read (chunks, of 1,024) and how long the I/O stayed paused,
//! against `cat` of the head's file.
//!
//! Then an engine's snapshot of three replicas (each served by a replica
//! server of its own on loopback) whose heads hold 512 MiB just written,
//! with a writer of 4 KiB blocks at queue depth 1 over the volume's first
//! 32 MiB all along: the longest wait of one of its writes during the
//! snapshot (the volume's I/O pause, and a write's own time), and the
//! snapshot's whole time, against the three replicas' freezes of such
//! heads, read whole, one after the other (the pause when the engine
//! froze them in turn and read no head ahead). Median of 3.
//!
//! Then the same small head on volumes of 1 GiB and of 1 TiB: 64 MiB
//! written in 64 pieces of 1 MiB spread over the volume, read ahead,
//! then a block written in 16 of the pieces, then frozen. What the freeze
//! reads is the same; only the volume's size differs, and the pause
//! should not follow it (it did: each walk of the head's map of blocks
//! went bit by bit, half a second per TiB). The 1 TiB volume against the
//! 1 GiB one. Median of 3.
//!
//! Run: `cargo bench -p ballast-node --bench freeze` (BENCH_DIR picks the
//! disk; `-- size` runs only the part by the volume's size).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ballast_node::engine::{Engine, ReplicaAddr, ReplicaSet};
use ballast_node::replica::{Replica, replica_dir, warm};
use ballast_node::server::ReplicaServer;
use common::{drop_caches, fill, median};

const SIZE: u64 = 1 << 30;
const DATA: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// A replica whose head holds `DATA` bytes of pseudo-random data: all of
/// the volume, so that `cat` reads no hole.
fn replica(dir: &Path) -> Replica {
    let mut r = Replica::create(dir, SIZE).unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut buf = vec![0u8; 4 * MIB as usize];
    for k in 0..DATA / buf.len() as u64 {
        fill(&mut x, &mut buf);
        r.write(k * buf.len() as u64, &buf, None).unwrap();
    }
    r.flush().unwrap();
    r
}

fn cat(file: &Path) -> Duration {
    let t = Instant::now();
    let out = Command::new("cat")
        .arg(file)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(out.success());
    t.elapsed()
}

const HEADS: u64 = 512 << 20;

/// What the engine's snapshot of three replicas cost: the longest wait of
/// a write during it, its whole time; and the same three freezes, reading
/// their heads whole, in turn.
struct Engine3 {
    /// The longest write in the half second before the snapshot.
    longest_before: Duration,
    longest_write: Duration,
    snapshot: Duration,
    in_turn: Duration,
}

/// One engine's snapshot of three served replicas whose heads hold
/// `HEADS` bytes, with a writer over the first 32 MiB all along, and the
/// same three freezes in turn on replicas of their own.
async fn engine_against_in_turn(base: &Path) -> Engine3 {
    let tmp = tempfile::tempdir_in(base).unwrap();
    let mut addrs = Vec::new();
    for i in 0..3 {
        let disk = tmp.path().join(format!("disk-{i}"));
        std::fs::create_dir_all(&disk).unwrap();
        let name = format!("v-r{i}");
        Replica::create(&replica_dir(&disk, &name), HEADS).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(ReplicaServer::new(vec![disk]).serve(listener));
        addrs.push(ReplicaAddr { name, addr });
    }
    let engine = Engine::start(
        "v",
        HEADS,
        &addrs,
        None,
        ReplicaSet::default(),
        None,
        Default::default(),
    )
    .await
    .unwrap();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut buf = vec![0u8; 4 * MIB as usize];
    for k in 0..HEADS / buf.len() as u64 {
        fill(&mut x, &mut buf);
        engine
            .write(k * buf.len() as u64, &buf, false)
            .await
            .unwrap();
    }
    engine.flush().await.unwrap();
    let engine = std::sync::Arc::new(engine);
    // 0: before the snapshot, 1: during it, 2: stop.
    let phase = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let writer = {
        let (engine, phase) = (engine.clone(), phase.clone());
        tokio::spawn(async move {
            let (mut longest, mut i) = ([Duration::ZERO; 2], 0u64);
            let block = vec![7u8; 4096];
            loop {
                let at_start = phase.load(std::sync::atomic::Ordering::SeqCst);
                if at_start == 2 {
                    return longest;
                }
                let at = (i * 7919 % (32 * MIB / 4096)) * 4096;
                let t = Instant::now();
                engine.write(at, &block, false).await.unwrap();
                // A write that began before the snapshot and ended in it
                // counts for it.
                let p = phase.load(std::sync::atomic::Ordering::SeqCst).min(1);
                longest[p] = longest[p].max(t.elapsed());
                i += 1;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    phase.store(1, std::sync::atomic::Ordering::SeqCst);
    let t = Instant::now();
    engine.snapshot(None).await.unwrap();
    let snapshot = t.elapsed();
    phase.store(2, std::sync::atomic::Ordering::SeqCst);
    let [longest_before, longest_write] = writer.await.unwrap();
    let mut in_turn = Duration::ZERO;
    for i in 0..3 {
        let mut r = Replica::create(&tmp.path().join(format!("alone-{i}")), HEADS).unwrap();
        for k in 0..HEADS / buf.len() as u64 {
            fill(&mut x, &mut buf);
            r.write(k * buf.len() as u64, &buf, None).unwrap();
        }
        r.flush().unwrap();
        let t = Instant::now();
        r.snapshot(None).unwrap();
        in_turn += t.elapsed();
    }
    Engine3 {
        longest_before,
        longest_write,
        snapshot,
        in_turn,
    }
}

/// A head of `DATA` bytes just written (or `cold`), frozen whole on
/// `readers` threads (None: as many as a freeze takes here): the pause;
/// with `cat` of its file first into `cats`.
fn whole(
    base: &Path,
    cold: bool,
    readers: Option<usize>,
    cats: Option<&mut Vec<Duration>>,
) -> Duration {
    let tmp = tempfile::tempdir_in(base).unwrap();
    let dir = tmp.path().join("r");
    let mut r = replica(&dir);
    if let Some(n) = readers {
        r.set_freeze_readers(n);
    }
    if let Some(cats) = cats {
        if cold {
            drop_caches();
        }
        cats.push(cat(&dir.join(&r.layers()[0].name)));
    }
    if cold {
        drop_caches();
    }
    let t = Instant::now();
    r.snapshot(None).unwrap();
    t.elapsed()
}

/// Reads a replica's head ahead of its freeze, as its server does.
fn read_ahead(r: &Replica) -> Duration {
    let t = Instant::now();
    warm(r).unwrap();
    t.elapsed()
}

/// A head of `DATA` bytes just written, read ahead while a writer writes
/// `rate` blocks of 4 KiB a second at random places of it, then frozen
/// as soon as the read ahead ends: the pause, and the chunks the freeze
/// read itself.
fn random_writer(base: &Path, rate: u64) -> (Duration, u64) {
    let tmp = tempfile::tempdir_in(base).unwrap();
    let r = std::sync::Arc::new(std::sync::RwLock::new(replica(&tmp.path().join("r"))));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (r, stop) = (r.clone(), stop.clone());
        std::thread::spawn(move || {
            let (t, mut done, mut x) = (Instant::now(), 0u64, 0x5851_f42d_4c95_7f2du64);
            let block = vec![9u8; 4096];
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let due = (t.elapsed().as_secs_f64() * rate as f64) as u64;
                if done >= due {
                    std::thread::sleep(Duration::from_micros(200));
                    continue;
                }
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let at = (x % (DATA / 4096)) * 4096;
                r.write().unwrap().write(at, &block, None).unwrap();
                done += 1;
            }
        })
    };
    warm(&*r).unwrap();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    writer.join().unwrap();
    let mut r = r.write().unwrap();
    let t = Instant::now();
    r.snapshot(None).unwrap();
    (t.elapsed(), r.last_freeze().1)
}

/// A head of 64 MiB in 64 pieces of 1 MiB spread over a volume of
/// `size` bytes, read ahead, then a block written in 16 of the pieces,
/// then frozen: the read ahead's time and the pause.
fn small_head_of(base: &Path, size: u64) -> (Duration, Duration) {
    let tmp = tempfile::tempdir_in(base).unwrap();
    let mut r = Replica::create(&tmp.path().join("r"), size).unwrap();
    let mut x = 0x6a09_e667_f3bc_c908u64;
    let mut buf = vec![0u8; MIB as usize];
    let step = size / 64;
    for k in 0..64 {
        fill(&mut x, &mut buf);
        r.write(k * step, &buf, None).unwrap();
    }
    r.flush().unwrap();
    let ahead = read_ahead(&r);
    let block = vec![3u8; 4096];
    for k in 0..16 {
        r.write(k * 4 * step + 8192, &block, None).unwrap();
    }
    let t = Instant::now();
    r.snapshot(None).unwrap();
    (ahead, t.elapsed())
}

/// The small head's freeze on a volume of 1 GiB and of 1 TiB
/// (`small_head_of`), printed.
fn by_size(base: &Path) {
    let mut by_size = Vec::new();
    for size in [SIZE, 1 << 40] {
        let (mut aheads, mut pauses) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            let (a, p) = small_head_of(base, size);
            aheads.push(a);
            pauses.push(p);
        }
        by_size.push((median(aheads), median(pauses)));
    }
    let [(a1, p1), (a2, p2)] = [by_size[0], by_size[1]];
    println!(
        "freeze of a head of 64 MiB in 64 pieces, 16 blocks written since its read ahead: on a volume of 1 TiB read ahead in {a2:?}, {p2:?} paused; on a volume of 1 GiB {a1:?} and {p1:?}; 1 TiB vs 1 GiB: {:.2}x of its read ahead's time, {:.2}x of its pause",
        a2.as_secs_f64() / a1.as_secs_f64(),
        p2.as_secs_f64() / p1.as_secs_f64()
    );
}

fn main() {
    let base = std::env::var_os("BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    if std::env::args().any(|a| a == "size") {
        by_size(&base);
        return;
    }
    let readers = {
        let tmp = tempfile::tempdir_in(&base).unwrap();
        Replica::create(&tmp.path().join("r"), MIB)
            .unwrap()
            .freeze_readers()
    };
    for cold in [true, false] {
        let (mut freezes, mut cats, mut alone) = (Vec::new(), Vec::new(), Vec::new());
        let (mut aheads, mut after) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            freezes.push(whole(&base, cold, None, Some(&mut cats)));
            alone.push(whole(&base, cold, Some(1), None));
            // Read ahead, then 16 MiB written over 16 chunks, then frozen.
            let tmp = tempfile::tempdir_in(&base).unwrap();
            let mut r = replica(&tmp.path().join("r"));
            if cold {
                drop_caches();
            }
            aheads.push(read_ahead(&r));
            let block = vec![5u8; 4096];
            for k in 0..16 * 256u64 {
                r.write((k % 16) * 64 * MIB + (k / 16) * 4096, &block, None)
                    .unwrap();
            }
            let t = Instant::now();
            r.snapshot(None).unwrap();
            after.push(t.elapsed());
        }
        let (f, c) = (median(freezes), median(cats));
        let (a, p) = (median(aheads), median(after));
        let how = if cold {
            "page cache dropped"
        } else {
            "just written"
        };
        let one = median(alone);
        println!(
            "freeze of a head of 1 GiB ({how}), read whole by {} readers: {f:?}, the volume's I/O paused per replica; cat of its file: {c:?}; freeze vs cat: {:.2}x of its time; by one reader: {one:?} ({:.2}x of cat's); {} readers vs one: {:.2}x of its time",
            readers,
            f.as_secs_f64() / c.as_secs_f64(),
            one.as_secs_f64() / c.as_secs_f64(),
            readers,
            f.as_secs_f64() / one.as_secs_f64()
        );
        println!(
            "freeze of a head of 1 GiB ({how}), read ahead in {a:?} with the I/O running ({:.2}x of cat's time), 16 MiB written since: {p:?} paused; freeze vs cat: {:.3}x of its time",
            a.as_secs_f64() / c.as_secs_f64(),
            p.as_secs_f64() / c.as_secs_f64()
        );
    }
    for rate in [1_000, 10_000] {
        let (mut pauses, mut reads, mut cats) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..3 {
            let (p, read) = random_writer(&base, rate);
            pauses.push(p);
            reads.push(read);
            let tmp = tempfile::tempdir_in(&base).unwrap();
            let dir = tmp.path().join("r");
            let r = replica(&dir);
            cats.push(cat(&dir.join(&r.layers()[0].name)));
        }
        reads.sort();
        let (p, c) = (median(pauses), median(cats));
        println!(
            "freeze of a head of 1 GiB just written, read ahead while {rate} random 4k writes a second land all over it: {p:?} paused, {} of 1024 chunks read under the pause; freeze vs cat ({c:?}): {:.3}x of its time",
            reads[reads.len() / 2],
            p.as_secs_f64() / c.as_secs_f64()
        );
    }
    by_size(&base);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (mut waits, mut snapshots, mut turns) = (Vec::new(), Vec::new(), Vec::new());
    let mut before = Vec::new();
    for _ in 0..3 {
        let e = rt.block_on(engine_against_in_turn(&base));
        before.push(e.longest_before);
        waits.push(e.longest_write);
        snapshots.push(e.snapshot);
        turns.push(e.in_turn);
    }
    let (w, s, t) = (median(waits), median(snapshots), median(turns));
    let b = median(before);
    println!(
        "an engine's snapshot of 3 replicas, heads of 512 MiB just written, a writer over 32 MiB all along: its longest write {w:?} (the I/O pause; {b:?} in the half second before), the snapshot {s:?} in all; their freezes in turn, read whole: {t:?}; pause vs in turn: {:.3}x of its time",
        w.as_secs_f64() / t.as_secs_f64()
    );
}
