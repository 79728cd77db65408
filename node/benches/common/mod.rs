//! What the node's benches share: the median of their runs, the page
//! cache dropped before a cold run, pseudo-random data to write, and a
//! writer into a replica's head beside other work.
//! Each bench uses what it needs of it.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ballast_node::replica::Replica;

/// The median of `v` (the upper one of an even count).
pub fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Writes back every dirty page and drops the page cache, so that the
/// next read comes from the disk. Needs root: a cold run that could not
/// drop it would read warm and say nothing.
pub fn drop_caches() {
    nix::unistd::sync();
    std::fs::write("/proc/sys/vm/drop_caches", "3")
        .unwrap_or_else(|e| panic!("dropping the page cache needs root: {e}"));
}

/// Fills `buf` with pseudo-random bytes, carrying the xorshift state `x`
/// from call to call (data no compression or deduplication shortens).
pub fn fill(x: &mut u64, buf: &mut [u8]) {
    for b in buf.iter_mut() {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *b = *x as u8;
    }
}

/// Writes 4 KiB blocks of pseudo-random data at random places of the
/// head of `r`, a replica of `size` bytes, one at a time, until `done`;
/// the longest write (its wait for the replica with it) and how many.
pub fn writer(
    r: Arc<RwLock<Replica>>,
    size: u64,
    done: Arc<AtomicBool>,
) -> JoinHandle<(Duration, u64)> {
    std::thread::spawn(move || {
        let (mut x, mut buf) = (0x9e37_79b9_7f4a_7c15u64, vec![0u8; 4096]);
        let (mut worst, mut n) = (Duration::ZERO, 0u64);
        while !done.load(Ordering::SeqCst) {
            fill(&mut x, &mut buf);
            let at = (x % (size / 4096)) * 4096;
            let t = Instant::now();
            r.write().unwrap().write(at, &buf, None).unwrap();
            worst = worst.max(t.elapsed());
            n += 1;
        }
        (worst, n)
    })
}

/// A replica of `size` bytes at `dir` whose head holds every other MiB of
/// the volume, pseudo-random data.
pub fn every_other_mib(dir: &std::path::Path, size: u64) -> Replica {
    const MIB: u64 = 1 << 20;
    let mut r = Replica::create(dir, size).unwrap();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut buf = vec![0u8; MIB as usize];
    for k in (0..size / MIB).step_by(2) {
        fill(&mut x, &mut buf);
        r.write(k * MIB, &buf, None).unwrap();
    }
    r
}
