//! Merging a 1 GiB layer that holds 512 MiB of data (every other MiB) into
//! the frozen layer above it, which rewrote a quarter of that data, against
//! `cp --sparse=always` of the lower layer's file on the same disk (the
//! least it costs to move that data once). Median of 3.
//!
//! Prints the merge's time, the ratio to `cp`, the peak extra space (the
//! layers' allocated bytes above where they started, sampled after every
//! step) against the lower layer's size, and the bytes given back.
//!
//! Then the volume's writes during a merge: `merge_paced` (as a server or
//! an engine runs it, unpaced here) merges the same layers while a writer
//! writes 4 KiB blocks into the head at random places, one at a time, as
//! fast as the replica takes them; prints the longest write against `cat`
//! of the merged layer from the disk (what a merge's end reads: until
//! 2026-12-07 it read it with the replica held, and a write waited for it
//! all).
//! Run: `cargo bench -p ballast-node --bench merge` (BENCH_DIR picks the
//! disk).

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use ballast_node::replica::{MERGE_CHUNK, Replica, merge_paced};
use common::{drop_caches, every_other_mib, fill, median, writer};

const SIZE: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn mib(b: u64) -> String {
    format!("{:.0} MiB", b as f64 / MIB as f64)
}

/// Bytes the files of the replica's layers take on the disk.
fn on_disk(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("layer-"))
        .map(|e| e.metadata().map(|m| m.blocks() * 512).unwrap_or(0))
        .sum()
}

/// A replica whose first frozen layer holds every other MiB of the
/// volume, and whose second rewrote a quarter of those.
fn replica(dir: &Path) -> Replica {
    let mut r = every_other_mib(dir, SIZE);
    r.snapshot(None).unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut buf = vec![0u8; MIB as usize];
    for k in (0..SIZE / MIB).step_by(8) {
        fill(&mut x, &mut buf);
        r.write(k * MIB, &buf, None).unwrap();
    }
    r.snapshot(None).unwrap();
    r.flush().unwrap();
    r
}

fn main() {
    let base = std::env::var_os("BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let mut merges = Vec::new();
    let mut cps = Vec::new();
    let (mut peak_extra, mut given_back, mut lower_size) = (0, 0, 0);
    for run in 0..3 {
        let tmp = tempfile::tempdir_in(&base).unwrap();
        let dir = tmp.path().join("r");
        let mut r = replica(&dir);
        let lower = dir.join("layer-000001.img");
        lower_size = r.layers()[0].allocated;

        drop_caches();
        let t = Instant::now();
        let out = Command::new("cp")
            .arg("--sparse=always")
            .arg(&lower)
            .arg(tmp.path().join("cp.img"))
            .status()
            .unwrap();
        assert!(out.success());
        let _ = Command::new("sync").status();
        cps.push(t.elapsed());
        std::fs::remove_file(tmp.path().join("cp.img")).unwrap();

        drop_caches();
        let start = on_disk(&dir);
        let mut peak = start;
        let j = r.next_merge().expect("the lower layer merges");
        let t = Instant::now();
        r.begin_merge(&j).unwrap();
        let mut at = Some(0);
        while let Some(b) = at {
            at = r.merge_some(b, MERGE_CHUNK, false).unwrap().next;
            peak = peak.max(on_disk(&dir));
        }
        r.finish_merge().unwrap();
        merges.push(t.elapsed());
        peak_extra = peak - start;
        given_back = start.saturating_sub(on_disk(&dir));
        println!("run {run}: merge {:?}, cp {:?}", merges[run], cps[run]);
    }
    let (m, c) = (median(merges), median(cps));
    println!(
        "merge of a 1 GiB layer holding {} into the frozen layer above: {m:?}; cp --sparse=always of that layer: {c:?}",
        mib(lower_size)
    );
    println!(
        "merge vs cp --sparse=always of the merged layer: {:.2}x of its time",
        m.as_secs_f64() / c.as_secs_f64()
    );
    println!(
        "peak extra space: {} = {:.2}x of the merged layer's {}; given back: {}",
        mib(peak_extra),
        peak_extra as f64 / lower_size as f64,
        mib(lower_size),
        mib(given_back)
    );
    writes_during_merges(&base);
}

/// The longest of the writes into the head made while `merge_paced` ran,
/// against `cat` of the merged layer from the disk, and the same writer
/// as long without a merge; median of 3.
fn writes_during_merges(base: &Path) {
    let (mut longest, mut cats, mut alone) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..3 {
        let tmp = tempfile::tempdir_in(base).unwrap();
        let dir = tmp.path().join("r");
        let r = Arc::new(RwLock::new(replica(&dir)));
        drop_caches();
        let done = Arc::new(AtomicBool::new(false));
        let writing = writer(r.clone(), SIZE, done.clone());
        let t = Instant::now();
        let report = merge_paced(&r, &[], u64::MAX, &|| false).unwrap();
        let took = t.elapsed();
        done.store(true, Ordering::SeqCst);
        let (worst, n) = writing.join().unwrap();
        assert_eq!(report.merged, 1, "{report:?}");

        drop_caches();
        let done = Arc::new(AtomicBool::new(false));
        let writing = writer(r.clone(), SIZE, done.clone());
        std::thread::sleep(took);
        done.store(true, Ordering::SeqCst);
        let (worst_alone, n_alone) = writing.join().unwrap();

        let merged = dir.join(&r.read().unwrap().chain()[0]);
        drop(r);
        drop_caches();
        let t = Instant::now();
        let out = Command::new("cat")
            .arg(&merged)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(out.success());
        cats.push(t.elapsed());
        println!(
            "run {run}: merge_paced {took:?} with {n} writes into the head, the longest {worst:?}; as long without a merge {n_alone} writes, the longest {worst_alone:?}; cat of the merged layer {:?}",
            cats[run]
        );
        longest.push(worst);
        alone.push(worst_alone);
    }
    let (w, c, a) = (median(longest), median(cats), median(alone));
    println!(
        "longest write into the head during a merge vs cat of the merged layer: {:.3}x ({w:?} against {c:?}); without a merge, the longest {a:?}",
        w.as_secs_f64() / c.as_secs_f64()
    );
}
