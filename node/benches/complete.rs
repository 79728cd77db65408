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
//!
//! Then a reused replica's join, which the engine makes with the volume's
//! I/O paused: the replica's old frozen layer of 512 MiB, named in no
//! layer of the source's chain, is dropped. Prints the join's time
//! against `rm` of a copy of that layer's file (the work of freeing its
//! blocks, which the join's close of the layer did until 2026-12-07);
//! median of 3.
//! Run: `cargo bench -p ballast-node --bench complete` (BENCH_DIR picks
//! the disk).

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use ballast_node::replica::{Replica, complete_apart};
use ballast_node::wire::JoinSpec;
use common::{drop_caches, every_other_mib, fill, median, writer};

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
    let spec = JoinSpec::following(&source.layers(), source.revision()).unwrap();
    let mut t = Replica::create(dir, SIZE).unwrap();
    t.join(&spec.frozen, &spec.head, spec.revision).unwrap();
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
    joins_dropping_a_layer(&src, tmp.path());
}

/// A replica whose frozen `layer-000002.img` holds 512 MiB joined to
/// `src`'s chain (`layer-000001.img` frozen, head `layer-000002.img`):
/// the layer is dropped. The join's time against `rm` of a copy of the
/// layer's file; median of 3.
fn joins_dropping_a_layer(src: &Replica, base: &Path) {
    let spec = JoinSpec::following(&src.layers(), src.revision()).unwrap();
    let (mut joins, mut rms) = (Vec::new(), Vec::new());
    for run in 0..3 {
        let dir = base.join(format!("reused-{run}"));
        let mut t = Replica::create(&dir, SIZE).unwrap();
        t.write(0, &[7u8; 4096], None).unwrap();
        t.snapshot(None).unwrap();
        let dropped = dir.join(t.chain().last().unwrap());
        let (mut x, mut buf) = (0x2545_f491_4f6c_dd1du64 + run, vec![0u8; MIB as usize]);
        for k in (0..SIZE / MIB).step_by(2) {
            fill(&mut x, &mut buf);
            t.write(k * MIB, &buf, None).unwrap();
        }
        t.snapshot(None).unwrap();
        t.flush().unwrap();
        let copy = base.join(format!("copy-{run}.img"));
        let out = std::process::Command::new("cp")
            .arg("--sparse=always")
            .arg(&dropped)
            .arg(&copy)
            .status()
            .unwrap();
        assert!(out.success());
        drop_caches();
        let at = Instant::now();
        let report = t.join(&spec.frozen, &spec.head, spec.revision).unwrap();
        let join = at.elapsed();
        // Its name is the new head's, an empty file now.
        let blocks = std::fs::metadata(&dropped).unwrap().blocks();
        assert_eq!(blocks, 0, "{report:?}");
        let at = Instant::now();
        std::fs::remove_file(&copy).unwrap();
        nix::unistd::sync();
        let rm = at.elapsed();
        println!(
            "run {run}: a join dropping a layer of 512 MiB {join:?}; rm of a copy of its file {rm:?}"
        );
        joins.push(join);
        rms.push(rm);
        drop(t);
        std::fs::remove_dir_all(&dir).unwrap();
    }
    let (j, r) = (median(joins), median(rms));
    println!(
        "a reused replica's join dropping a layer of 512 MiB vs rm of a copy of the layer's file: {:.3}x ({j:?} against {r:?})",
        j.as_secs_f64() / r.as_secs_f64()
    );
}
