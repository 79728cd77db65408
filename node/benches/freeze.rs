//! Freezing a head of 1 GiB of data: the time a snapshot (and the start
//! of every rebuild, which freezes the heads) holds the volume's I/O
//! paused, per replica, since the freeze reads the whole head to take its
//! layer checksum (and check each block). Against `cat` of the head's file
//! to /dev/null (the least it costs to read it once), both with the page
//! cache dropped first, and both with the head just written (cached).
//! Median of 3.
//!
//! Then an engine's snapshot of three replicas (each served by a replica
//! server of its own on loopback) whose heads hold 512 MiB just written:
//! the volume's I/O pause, against the three replicas' freezes of such
//! heads one after the other (what the pause was when the engine froze
//! them in turn). Median of 3.
//!
//! Run: `cargo bench -p ballast-node --bench freeze` (BENCH_DIR picks the
//! disk).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ballast_node::engine::{Engine, ReplicaAddr, ReplicaSet};
use ballast_node::replica::{Replica, replica_dir};
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

/// One engine's snapshot of three served replicas whose heads hold
/// `HEADS` bytes, and the same three freezes in turn on replicas of their
/// own: (the engine's pause, the freezes in turn).
async fn engine_against_in_turn(base: &Path) -> (Duration, Duration) {
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
    let t = Instant::now();
    engine.snapshot(None).await.unwrap();
    let paused = t.elapsed();
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
    (paused, in_turn)
}

fn main() {
    let base = std::env::var_os("BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    for cold in [true, false] {
        let (mut freezes, mut cats) = (Vec::new(), Vec::new());
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
        }
        let (f, c) = (median(freezes), median(cats));
        let how = if cold {
            "page cache dropped"
        } else {
            "just written"
        };
        println!(
            "freeze of a head of 1 GiB ({how}): {f:?}, the volume's I/O paused per replica; cat of its file: {c:?}; freeze vs cat: {:.2}x of its time",
            f.as_secs_f64() / c.as_secs_f64()
        );
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (mut pauses, mut turns) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        let (p, t) = rt.block_on(engine_against_in_turn(&base));
        pauses.push(p);
        turns.push(t);
    }
    let (p, t) = (median(pauses), median(turns));
    println!(
        "an engine's snapshot of 3 replicas, heads of 512 MiB just written: I/O paused {p:?}; their freezes in turn: {t:?}; engine vs in turn: {:.2}x of its time",
        p.as_secs_f64() / t.as_secs_f64()
    );
}
