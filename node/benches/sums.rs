//! The per-block checksum (`replica::block_sum`, the CRC32C of a 4 KiB
//! block, and `replica::each_block_sum`, every block of a buffer) against
//! the `crc32c` crate, which takes one block at a time with the SSE4.2
//! instruction in three streams. Every write pays it once per block at
//! the engine, and every read of a layer once per block it verifies.
//! Ballast takes it the way its CPU is fastest at (`replica::SumWay`);
//! `crc-fast` alone, Ballast's way on every CPU from 2026-11-29 to
//! 2026-12-03, is printed beside it, and so are the two ways a CPU
//! without 512-bit carry-less multiplies chooses from at its first use
//! (the CRC instruction in four streams, `Lanes`, and 128-bit carry-less
//! multiplies, `Clmul`).
//!
//! Three cases: one block at a time, hot; one 64 KiB write's blocks, hot
//! in the cache as a payload just read from a socket is; and 64 MiB of
//! blocks read in order (beyond the cache, as a scrub or a copy's
//! checksum reads them). Five rounds in turns; prints each side's
//! nanoseconds per block (the medians) and our time over the peer's.
//! Checks first that every way gives the same values for blocks all
//! through the data. Run: `cargo bench -p ballast-node --bench sums`.

use std::hint::black_box;
use std::time::Instant;

use ballast_node::replica::{BLOCK, SumWay, block_sum, each_block_sum};

/// The replica's block, as a slice length.
const BLOCK_LEN: usize = BLOCK as usize;

/// One block's CRC32C with crc-fast alone.
fn folded(block: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, block) as u32
}

/// A way to take one block's checksum.
type Way = fn(&[u8]) -> u32;

/// Nanoseconds per block to checksum every block of `data`, `passes`
/// times: one block at a time with `f`, or with `None`, Ballast's
/// `each_block_sum` over each 64 KiB buffer.
fn per_block(data: &[u8], passes: usize, f: Option<Way>) -> f64 {
    let mut acc = 0u32;
    let t = Instant::now();
    for _ in 0..passes {
        match f {
            Some(f) => {
                for block in data.chunks(BLOCK_LEN) {
                    acc ^= f(black_box(block));
                }
            }
            None => {
                for buffer in data.chunks(64 << 10) {
                    each_block_sum(black_box(buffer), |_, sum| acc ^= sum);
                }
            }
        }
    }
    black_box(acc);
    t.elapsed().as_nanos() as f64 / (passes * data.len() / BLOCK_LEN) as f64
}

/// Nanoseconds per block to checksum every block of `data`, `passes`
/// times, each 64 KiB buffer taken `way` (`SumWay::each`).
fn per_block_taken(data: &[u8], passes: usize, way: SumWay) -> f64 {
    let mut acc = 0u32;
    let t = Instant::now();
    for _ in 0..passes {
        for buffer in data.chunks(64 << 10) {
            way.each(black_box(buffer), |_, sum| acc ^= sum);
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
    let peer: Way = crc32c::crc32c;
    for buffer in data.chunks(64 << 10).step_by(97) {
        let mut sums = Vec::new();
        each_block_sum(buffer, |_, sum| sums.push(sum));
        for (block, sum) in buffer.chunks(BLOCK_LEN).zip(sums) {
            let want = peer(block);
            assert_eq!(sum, want, "the CRC32Cs differ");
            assert_eq!(block_sum(block), want, "the CRC32Cs differ");
            assert_eq!(folded(block), want, "the CRC32Cs differ");
        }
    }
    println!(
        "per-block checksum (CRC32C of 4 KiB): Ballast's ({:?} on this CPU) vs the crc32c crate \
         (SSE4.2, one block at a time), ns per block (medians of 5 in turns)",
        SumWay::of_this_cpu()
    );
    let cases: [(&str, &[u8], usize, Option<Way>); 3] = [
        (
            "one block at a time",
            &data[..64 << 10],
            20_000,
            Some(block_sum),
        ),
        ("one 64k write, hot", &data[..64 << 10], 20_000, None),
        ("64 MiB in order", &data, 20, None),
    ];
    for (name, bytes, passes, ours_f) in cases {
        let (mut ours, mut theirs, mut alone) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..5 {
            let mut runs: [(&mut Vec<f64>, Option<Way>); 3] = [
                (&mut ours, ours_f),
                (&mut theirs, Some(peer)),
                (&mut alone, Some(folded)),
            ];
            if round % 2 == 1 {
                runs.reverse();
            }
            for (into, f) in runs {
                into.push(per_block(bytes, passes, f));
            }
        }
        let (o, t, a) = (median(ours), median(theirs), median(alone));
        println!(
            "{name:<20} Ballast {o:>6.1} ns  crc32c crate {t:>6.1} ns  ({:.2}x of its time)  crc-fast alone {a:>6.1} ns ({:.2}x)",
            o / t,
            a / t
        );
        if ours_f.is_none() {
            let (mut lanes, mut clmul) = (Vec::new(), Vec::new());
            for _ in 0..5 {
                lanes.push(per_block_taken(bytes, passes, SumWay::Lanes));
                clmul.push(per_block_taken(bytes, passes, SumWay::Clmul));
            }
            let (l, c) = (median(lanes), median(clmul));
            println!(
                "{:<20} the ways chosen from: Lanes {l:>6.1} ns  Clmul {c:>6.1} ns ({:.2}x of Lanes' time)",
                "",
                c / l
            );
        }
    }
}
