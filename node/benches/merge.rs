//! Merging a 1 GiB layer that holds 512 MiB of data (every other MiB) into
//! the frozen layer above it, which rewrote a quarter of that data, against
//! `cp --sparse=always` of the lower layer's file on the same disk (the
//! least it costs to move that data once). Median of 3.
//!
//! Prints the merge's time, the ratio to `cp`, the peak extra space (the
//! layers' allocated bytes above where they started, sampled after every
//! step) against the lower layer's size, and the bytes given back.
//! Run: `cargo bench -p ballast-node --bench merge` (BENCH_DIR picks the
//! disk).

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use ballast_node::replica::{MERGE_CHUNK, Replica};
use common::{drop_caches, fill, median};

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
    let mut r = Replica::create(dir, SIZE).unwrap();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut buf = vec![0u8; MIB as usize];
    for k in (0..SIZE / MIB).step_by(2) {
        fill(&mut x, &mut buf);
        r.write(k * MIB, &buf, None).unwrap();
    }
    r.snapshot(None).unwrap();
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
}
