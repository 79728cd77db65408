//! Freezing a head of 1 GiB of data: the time a snapshot (and the start
//! of every rebuild, which freezes the heads) holds the volume's I/O
//! paused, per replica, since the freeze reads the whole head to take its
//! layer checksum (and check each block). Against `cat` of the head's file
//! to /dev/null (the least it costs to read it once), both with the page
//! cache dropped first, and both with the head just written (cached).
//! Median of 3.
//!
//! Run: `cargo bench -p ballast-node --bench freeze` (BENCH_DIR picks the
//! disk).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ballast_node::replica::Replica;

const SIZE: u64 = 1 << 30;
const DATA: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn drop_caches() {
    let _ = Command::new("sync").status();
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
}

/// A replica whose head holds `DATA` bytes of pseudo-random data: all of
/// the volume, so that `cat` reads no hole.
fn replica(dir: &Path) -> Replica {
    let mut r = Replica::create(dir, SIZE).unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut buf = vec![0u8; 4 * MIB as usize];
    for k in 0..DATA / buf.len() as u64 {
        for b in buf.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
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
}
