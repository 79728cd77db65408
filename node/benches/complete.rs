//! A rebuild's check of a filled layer, beside the volume's writes. The
//! target of a rebuild takes every write of the volume into its head
//! from its join on, and its engine gives it up when one waits past the
//! replica timeout; each filled layer is then checked, a read of the whole
//! layer. A source of 1 GiB whose frozen layer holds 512 MiB (every other
//! MiB) is joined by a target, the layer filled, the page cache dropped,
//! and the layer checked while a writer puts 4 KiB blocks at random
//! places of the target's head, one at a time, as fast as the replica
//! takes them: with the replica held throughout (`complete_layer` under
//! its lock, every check until 2026-12-07), then without it
//! (`complete_apart`). Prints the writer's longest write in each, and the
//! ratio; median of 3.
//! Run: `cargo bench -p ballast-node --bench complete` (BENCH_DIR picks
//! the disk).

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use ballast_node::replica::{LayerSpec, Replica, complete_apart};
use common::{drop_caches, every_other_mib, median, writer};

const SIZE: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// The source: a frozen layer holding every other MiB of the volume.
fn source(dir: &Path) -> (Replica, String) {
    let mut r = every_other_mib(dir, SIZE);
    let frozen = r.snapshot(None).unwrap();
    r.flush().unwrap();
    (r, frozen)
}

/// A target joined to `source`, its pending layer filled, flushed and
/// out of the page cache.
fn filled(source: &Replica, frozen: &str, dir: &Path) -> Replica {
    let specs: Vec<LayerSpec> = source
        .layers()
        .into_iter()
        .filter_map(|l| {
            Some(LayerSpec {
                name: l.name,
                checksum: l.checksum?,
                snapshot: l.snapshot,
            })
        })
        .collect();
    let mut t = Replica::create(dir, SIZE).unwrap();
    let head = source.chain().last().unwrap().clone();
    t.join(&specs, &head, source.revision()).unwrap();
    let mut buf = vec![0u8; MIB as usize];
    for k in (0..SIZE / MIB).step_by(2) {
        source.read_layer(frozen, k * MIB, &mut buf).unwrap();
        t.write_layer(frozen, k * MIB, &buf).unwrap();
    }
    t.flush().unwrap();
    drop_caches();
    t
}

/// The check of `frozen` in `t` beside the writer: its time, the writer's
/// longest write and how many it made.
fn checked(t: Replica, frozen: &str, apart: bool) -> (Duration, Duration, u64) {
    let t = Arc::new(RwLock::new(t));
    let done = Arc::new(AtomicBool::new(false));
    let writing = writer(t.clone(), SIZE, done.clone());
    let at = Instant::now();
    if apart {
        complete_apart(&t, frozen, &[]).unwrap();
    } else {
        t.write().unwrap().complete_layer(frozen, &[]).unwrap();
    }
    let took = at.elapsed();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let (worst, n) = writing.join().unwrap();
    assert!(t.read().unwrap().pending().is_empty());
    (took, worst, n)
}

fn main() {
    let base = std::env::var_os("BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let tmp = tempfile::tempdir_in(&base).unwrap();
    let (src, frozen) = source(&tmp.path().join("source"));
    let (mut held, mut apart) = (Vec::new(), Vec::new());
    for run in 0..3 {
        for (way, longest) in [("held", &mut held), ("apart", &mut apart)] {
            let dir = tmp.path().join(format!("target-{run}-{way}"));
            let t = filled(&src, &frozen, &dir);
            let (took, worst, n) = checked(t, &frozen, way == "apart");
            println!(
                "run {run}, the replica {way}: the check {took:?}, {n} writes into the head, the longest {worst:?}"
            );
            longest.push(worst);
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
    let (h, a) = (median(held), median(apart));
    println!(
        "longest write into a rebuild target's head during its layer's check, apart vs held: {:.3}x ({a:?} against {h:?})",
        a.as_secs_f64() / h.as_secs_f64()
    );
}
