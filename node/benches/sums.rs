//! The per-block checksum (`replica::block_sum`, the CRC32C of a 4 KiB
//! block) against the `crc32c` crate, which takes it with the SSE4.2
//! instruction alone: the way Ballast took it until 2026-11-29. Every
//! write pays it once per block at the engine, and every read of a layer
//! once per block it verifies.
//!
//! Two cases: one 64 KiB write's blocks, hot in the cache as a payload
//! just read from a socket is, and 64 MiB of blocks read in order (beyond
//! the cache, as a scrub or a copy's checksum reads them). Five rounds in
//! turns; prints each side's nanoseconds per block (the medians) and our
//! time over the peer's. Checks first that both give the same value for
//! blocks all through the data. Run: `cargo bench -p ballast-node --bench
//! sums`.

use std::hint::black_box;
use std::time::Instant;

use ballast_node::replica::{BLOCK, block_sum};

/// The replica's block, as a slice length.
const BLOCK_LEN: usize = BLOCK as usize;

/// Nanoseconds per block to checksum every block of `data`, `passes` times.
fn per_block(data: &[u8], passes: usize, f: fn(&[u8]) -> u32) -> f64 {
    let mut acc = 0u32;
    let t = Instant::now();
    for _ in 0..passes {
        for block in data.chunks(BLOCK_LEN) {
            acc ^= f(black_box(block));
        }
    }
    black_box(acc);
    t.elapsed().as_nanos() as f64 / (passes * data.len() / BLOCK_LEN) as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    // Bytes that are not all alike, as data is not (a multiplicative hash
    // of the offset).
    let data: Vec<u8> = (0..64u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let peer: fn(&[u8]) -> u32 = crc32c::crc32c;
    for block in data.chunks(BLOCK_LEN).step_by(97) {
        assert_eq!(block_sum(block), peer(block), "the two CRC32Cs differ");
    }
    println!(
        "per-block checksum (CRC32C of 4 KiB): Ballast's (crc-fast) vs the crc32c crate (SSE4.2), \
         ns per block (medians of 5 in turns)"
    );
    let cases: [(&str, &[u8], usize); 2] = [
        ("one 64k write, hot", &data[..64 << 10], 20_000),
        ("64 MiB in order", &data, 20),
    ];
    for (name, bytes, passes) in cases {
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for round in 0..5 {
            if round % 2 == 0 {
                ours.push(per_block(bytes, passes, block_sum));
                theirs.push(per_block(bytes, passes, peer));
            } else {
                theirs.push(per_block(bytes, passes, peer));
                ours.push(per_block(bytes, passes, block_sum));
            }
        }
        let (o, t) = (median(ours), median(theirs));
        println!(
            "{name:<20} Ballast {o:>6.1} ns  crc32c crate {t:>6.1} ns  ({:.2}x of its time)",
            o / t
        );
    }
}
