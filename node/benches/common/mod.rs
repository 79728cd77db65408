//! What the node's benches share: the median of their runs, the page
//! cache dropped before a cold run, and pseudo-random data to write.
//! Each bench uses what it needs of it.
#![allow(dead_code)]

use std::time::Duration;

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
