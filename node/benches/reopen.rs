//! What a new boot costs a replica's open, and what a clean close spares
//! it. A replica of 512 MiB whose head holds all of it, flushed, is
//! opened from a cold cache as the next boot finds it:
//! - after a power cut (its record of the boot it was opened in set to
//!   another boot's, as `node/tests/support/forgetful.rs` does), its last
//!   writes all of it: every block of the head is read and checked;
//! - after a power cut, with 16 MiB written lately (each of its regions
//!   written in each of the last flush intervals, the others left alone
//!   long enough to be cleared, `replica/regions.rs`): only those are
//!   checked;
//! - after a planned reboot: closed clean first (`Replica::close_clean`),
//!   so nothing of the head is read.
//!
//! The peer is `cat` of the head's file to /dev/null from a cold cache:
//! the least it costs to read the head once. Median of 5. Prints both
//! opens' times and their ratios to the peer.
//!
//! Also what a starting engine asks of each replica to compare them over
//! their regions written lately (`engine/equalize.rs`), here the whole
//! head: the CRC32C of each block a read returns (`Replica::view_sums`),
//! from a cold cache, against the same `cat`.
//!
//! Then what suspect blocks cost the writes after a cut: a replica of 64
//! MiB whose every block went bad while the machine was off (so all are
//! suspect after its open) takes 4,096 writes of 4 KiB over them, each
//! settling one, and a flush; the peer is the same writes and flush over
//! the same blocks again, no longer suspect.
//!
//! Last, what the dirty regions cost a writer that flushes after each
//! write, as a database does: 1,500 writes of 4 KiB at random over a
//! replica of 8 GiB, each followed by a flush; the peer is the same
//! writes at the same offsets on a raw file of the same size, each
//! followed by an `fdatasync`. The sides take turns, five runs.
//! Run: `cargo bench -p ballast-node --bench reopen` (BENCH_DIR picks the
//! disk).

mod common;
#[allow(dead_code)] // its other half, the disk that forgets, is the tests'
#[path = "../tests/support/forgetful.rs"]
mod forgetful;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ballast_node::replica::Replica;
use common::{drop_caches, fill, median};

const SIZE: u64 = 512 << 20;
const MIB: u64 = 1 << 20;

/// A replica whose head holds the whole volume, flushed.
fn replica(dir: &Path) -> Replica {
    let mut r = Replica::create(dir, SIZE).unwrap();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut buf = vec![0u8; MIB as usize];
    for k in 0..SIZE / MIB {
        fill(&mut x, &mut buf);
        r.write(k * MIB, &buf, None).unwrap();
    }
    r.flush().unwrap();
    r
}

/// Opens the replica in `dir` as a new boot finds it, from a cold cache.
fn open_in_a_new_boot(dir: &Path) -> Duration {
    forgetful::as_after_a_reboot(dir);
    drop_caches();
    let t = Instant::now();
    let r = Replica::open(dir).unwrap();
    let took = t.elapsed();
    drop(r);
    took
}

/// 4,096 writes of 4 KiB spread over the first 64 MiB of `r`, then a
/// flush.
fn scattered_writes(r: &mut Replica, byte: u8) -> Duration {
    let t = Instant::now();
    for i in 0..4096u64 {
        r.write(i * 7 % 16384 * 4096, &[byte; 4096], None).unwrap();
    }
    r.flush().unwrap();
    t.elapsed()
}

/// The writes over suspect blocks and over the same blocks again.
fn writes_over_suspects(base: &Path) -> (Duration, Duration) {
    use std::os::unix::fs::FileExt;
    let tmp = tempfile::tempdir_in(base).unwrap();
    let dir = tmp.path().join("r");
    let mut r = Replica::create(&dir, 64 * MIB).unwrap();
    r.write(0, &vec![1u8; (64 * MIB) as usize], None).unwrap();
    r.flush().unwrap();
    drop(r);
    let head = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("layer-000001.img"))
        .unwrap();
    head.write_all_at(&vec![0xeeu8; (64 * MIB) as usize], 0)
        .unwrap();
    head.sync_all().unwrap();
    forgetful::as_after_a_reboot(&dir);
    let mut r = Replica::open(&dir).unwrap();
    assert_eq!(r.suspects().len(), 16384, "every block suspect");
    r.flush().unwrap();
    let suspect = scattered_writes(&mut r, 2);
    let sound = scattered_writes(&mut r, 3);
    (suspect, sound)
}

/// 1,500 random 4k writes over 8 GiB, each flushed: on a replica, then
/// (or first, in odd runs) on a raw file with `fdatasync`.
fn flushed_random_writes(base: &Path, run: u32) -> (Duration, Duration) {
    use std::os::unix::fs::FileExt;
    const BIG: u64 = 8 << 30;
    let tmp = tempfile::tempdir_in(base).unwrap();
    let mut r = Replica::create(&tmp.path().join("r"), BIG).unwrap();
    let raw = std::fs::File::create(tmp.path().join("raw")).unwrap();
    raw.set_len(BIG).unwrap();
    let offsets: Vec<u64> = {
        let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(run);
        (0..1500)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x % (BIG / 4096) * 4096
            })
            .collect()
    };
    let block = [9u8; 4096];
    let mut replica = || {
        let t = Instant::now();
        for &at in &offsets {
            r.write(at, &block, None).unwrap();
            r.flush().unwrap();
        }
        t.elapsed()
    };
    let file = || {
        let t = Instant::now();
        for &at in &offsets {
            raw.write_all_at(&block, at).unwrap();
            raw.sync_data().unwrap();
        }
        t.elapsed()
    };
    if run.is_multiple_of(2) {
        let a = replica();
        (a, file())
    } else {
        let b = file();
        (replica(), b)
    }
}

fn main() {
    let base = std::env::var_os("BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let (mut cats, mut cut, mut clean, mut recent, mut compare) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for run in 0..5 {
        let tmp = tempfile::tempdir_in(&base).unwrap();
        let dir = tmp.path().join("r");
        drop(replica(&dir));

        drop_caches();
        let t = Instant::now();
        let out = Command::new("cat")
            .arg(dir.join("layer-000001.img"))
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(out.success());
        cats.push(t.elapsed());

        cut.push(open_in_a_new_boot(&dir));

        // What a starting engine asks of each replica to compare them
        // (`engine/equalize.rs`), here over the whole head, from a cold
        // cache: the CRC32C of each block a read returns.
        drop_caches();
        let r = Replica::open(&dir).unwrap();
        let t = Instant::now();
        let sums = r.view_sums(0, SIZE).unwrap();
        compare.push(t.elapsed());
        assert_eq!(sums.len() as u64, SIZE / 4096 * 4);
        drop(r);

        let mut r = Replica::open(&dir).unwrap();
        assert!(r.close_clean("the bench's planned reboot").unwrap());
        drop(r);
        clean.push(open_in_a_new_boot(&dir));

        // 16 MiB written, then written to in every flush interval until
        // the other regions are idle long enough to be cleared.
        let mut r = Replica::open(&dir).unwrap();
        r.write(64 * MIB, &vec![7u8; (16 * MIB) as usize], None)
            .unwrap();
        let region = ballast_node::replica::DIRTY_REGION;
        for _ in 0..=ballast_node::replica::IDLE_FLUSHES {
            for at in (64 * MIB..80 * MIB).step_by(region as usize) {
                r.write(at, &[8u8; 4096], None).unwrap();
            }
            r.flush().unwrap();
            std::thread::sleep(ballast_node::replica::DIRTY_INTERVAL);
        }
        drop(r);
        recent.push(open_in_a_new_boot(&dir));
        println!(
            "run {run}: cat {:?}, open after a cut {:?}, after a cut with 16 MiB written lately {:?}, after a clean close {:?}, the sums a comparison asks of the whole head {:?}",
            cats[run], cut[run], recent[run], clean[run], compare[run]
        );
    }
    let e = median(compare);
    let (c, a, b, d) = (median(cats), median(cut), median(clean), median(recent));
    println!(
        "the CRC32C of each block of a head of 512 MiB, as a starting engine compares replicas (VIEW_SUMS), cold, vs cat of the head: {:.3}x of its time ({e:?} against {c:?})",
        e.as_secs_f64() / c.as_secs_f64()
    );
    println!(
        "a replica's open in a new boot (head of 512 MiB), cold: after a power cut {a:?}, after one with 16 MiB written lately {d:?}, after a clean close {b:?}; cat of the head {c:?}"
    );
    println!(
        "open after a power cut, 16 MiB written lately, vs cat of the head: {:.3}x of its time",
        d.as_secs_f64() / c.as_secs_f64()
    );
    println!(
        "open after a power cut vs cat of the head: {:.2}x of its time",
        a.as_secs_f64() / c.as_secs_f64()
    );
    println!(
        "open after a clean close vs cat of the head: {:.3}x of its time",
        b.as_secs_f64() / c.as_secs_f64()
    );

    let (mut suspect, mut sound) = (Vec::new(), Vec::new());
    for run in 0..5 {
        let (a, b) = writes_over_suspects(&base);
        println!(
            "run {run}: 4,096 4k writes and a flush over suspect blocks {a:?}, over sound ones {b:?}"
        );
        suspect.push(a);
        sound.push(b);
    }
    let (a, b) = (median(suspect), median(sound));
    println!(
        "4k writes settling suspect blocks vs the same writes over sound blocks: {:.2}x of their time ({a:?} against {b:?})",
        a.as_secs_f64() / b.as_secs_f64()
    );

    let (mut replica, mut file) = (Vec::new(), Vec::new());
    for run in 0..5 {
        let (a, b) = flushed_random_writes(&base, run);
        println!(
            "run {run}: 1,500 random 4k writes over 8 GiB, each flushed: replica {a:?}, raw file {b:?}"
        );
        replica.push(a);
        file.push(b);
    }
    let (a, b) = (median(replica), median(file));
    println!(
        "random 4k writes over 8 GiB, each flushed, replica vs a raw file with fdatasync: {:.2}x of its time ({a:?} against {b:?}; {:.0} against {:.0} us a write)",
        a.as_secs_f64() / b.as_secs_f64(),
        a.as_secs_f64() * 1e6 / 1500.0,
        b.as_secs_f64() * 1e6 / 1500.0
    );
}
