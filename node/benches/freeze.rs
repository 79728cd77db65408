//! Freezing a head of 1 GiB of data: the time a snapshot (and the start
//! of every rebuild, which freezes the heads) holds the volume's I/O
//! paused, per replica. A freeze takes the head's layer checksum (and
//! checks each block): read whole, it reads the whole head; read ahead
//! (`warm`, as the engine asks before it pauses the I/O), only the
//! chunks written since. Against `cat` of the head's file to /dev/null
//! (the least it costs to read it once), with the page cache dropped
//! first, and with the head just written (cached): the freeze that reads
//! the whole head, the read ahead (I/O running), and the freeze after it
//! with 16 MiB written meanwhile over 16 chunks. Median of 3.
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
//! Run: `cargo bench -p ballast-node --bench freeze` (BENCH_DIR picks the
//! disk).

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

/// Reads a replica's head ahead of its freeze, as its server does.
fn read_ahead(r: &Replica) -> Duration {
    let t = Instant::now();
    warm(r).unwrap();
    t.elapsed()
}

fn main() {
    let base = std::env::var_os("BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    for cold in [true, false] {
        let (mut freezes, mut cats) = (Vec::new(), Vec::new());
        let (mut aheads, mut after) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            let tmp = tempfile::tempdir_in(&base).unwrap();
            let dir = tmp.path().join("r");
            let mut r = replica(&dir);
            let head = dir.join(&r.layers()[0].name);
            if cold {
                drop_caches();
            }
            cats.push(cat(&head));
            if cold {
                drop_caches();
            }
            let t = Instant::now();
            r.snapshot(None).unwrap();
            freezes.push(t.elapsed());
            drop(r);
            drop(tmp);
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
        println!(
            "freeze of a head of 1 GiB ({how}), read whole: {f:?}, the volume's I/O paused per replica; cat of its file: {c:?}; freeze vs cat: {:.2}x of its time",
            f.as_secs_f64() / c.as_secs_f64()
        );
        println!(
            "freeze of a head of 1 GiB ({how}), read ahead in {a:?} with the I/O running ({:.2}x of cat's time), 16 MiB written since: {p:?} paused; freeze vs cat: {:.3}x of its time",
            a.as_secs_f64() / c.as_secs_f64(),
            p.as_secs_f64() / c.as_secs_f64()
        );
    }
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
