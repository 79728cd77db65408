//! Rebuild copy paths against their peers, in one run, on one disk,
//! median of 3. Two layers of 8 GiB apparent size:
//!
//! - even: 800 extents of 1 MiB, spread evenly;
//! - fragmented: 46k extents of 16 KiB, written in random order with a
//!   flush every few thousand, so that they lie scattered on the disk too
//!   (like the layer measured in ../shared/MEASURED.md).
//!
//! What is compared:
//!
//! - Ballast's local copy (`copy_layer`) vs `cp --sparse=always`, on both
//!   layers, warm and cold (the page cache dropped before each run, and
//!   the target fsynced within the time).
//! - Both cold copies vs what the disk alone takes for the same work: the
//!   data extents read with direct I/O, as many at once as the copy keeps
//!   in flight, then as many bytes written in order and synced (the floor
//!   of a copy).
//! - A remote fill (the layer over the replica protocol on loopback TCP)
//!   vs a local fill (the source on the same node): both through replica
//!   servers, both ending the same way (the layer synced and checked by
//!   checksum), both cold.
//! - A reused replica's remote fill, its layer seeded with the source's
//!   data but for the first block of one extent in a hundred rewritten (a node back after
//!   its replica missed some writes), vs the full remote fill: cold, the
//!   same way; it prints the bytes that travelled and those kept.
//! - The local copy on an xfs filesystem with reflink=1 (a loop device;
//!   needs root and mkfs.xfs), where Ballast clones instead of copying.
//!
//! Prints each time, the ratios, and the bytes every target holds in data
//! extents, which must equal the source's. Dropping the cache needs root.
//! Run: `cargo bench -p ballast-node --bench copy` (BENCH_DIR picks the disk).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ballast_node::replica::replica_dir;
use ballast_node::replica::{BLOCK, Replica, allocation};
use ballast_node::server::ReplicaServer;
use ballast_node::sync::local::copy_layer;
use ballast_node::wire::JoinSpec;
use ballast_node::wire::client::ReplicaClient;
use common::{drop_caches, median};

const SIZE: u64 = 8 << 30;

/// Where a layer's data lies.
#[derive(Clone, Copy)]
enum Layout {
    /// 800 extents of 1 MiB, spread evenly.
    Even,
    /// 46k extents of 16 KiB, written in random order.
    Fragmented,
}

impl Layout {
    fn label(self) -> &'static str {
        match self {
            Layout::Even => "even layer (800 extents of 1 MiB)",
            Layout::Fragmented => "fragmented layer (46k extents of 16 KiB)",
        }
    }

    /// The extents (offset, length), in the order they are written.
    fn extents(self, rng: &mut Rng) -> Vec<(u64, u64)> {
        let (count, len) = match self {
            Layout::Even => (800u64, 1u64 << 20),
            Layout::Fragmented => (46_000, 16 << 10),
        };
        let region = SIZE / count / BLOCK * BLOCK;
        let mut out: Vec<(u64, u64)> = (0..count)
            .map(|k| {
                // Somewhere in its region, never touching the next one.
                let slack = (region - len) / BLOCK - 1;
                let jitter = match self {
                    Layout::Even => 0,
                    Layout::Fragmented => rng.next() % slack,
                };
                (k * region + jitter * BLOCK, len)
            })
            .collect();
        if let Layout::Fragmented = self {
            for i in (1..out.len()).rev() {
                out.swap(i, (rng.next() % (i as u64 + 1)) as usize);
            }
        }
        out
    }
}

/// xorshift64: the same layers on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The bytes the file holds in data extents (SEEK_DATA / SEEK_HOLE).
/// `st_blocks` also counts a file's extent tree, which depends on how it
/// was written, not on what it holds.
fn allocated(p: &Path) -> u64 {
    std::fs::File::open(p)
        .and_then(|f| allocation(&f, SIZE / BLOCK))
        .map(|m| m.count() * BLOCK)
        .unwrap_or(0)
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1 << 20) as f64)
}

/// Bytes in MiB, or KiB below one MiB.
fn size(b: u64) -> String {
    if b < 1 << 20 {
        format!("{:.1} KiB", b as f64 / 1024.0)
    } else {
        mib(b)
    }
}

/// A replica `name` at `disk` whose first layer is frozen with the data
/// of `layout`; the layer's path.
fn source_replica(disk: &Path, name: &str, layout: Layout) -> PathBuf {
    let dir = replica_dir(disk, name);
    let mut r = Replica::create(&dir, SIZE).unwrap();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let extents = layout.extents(&mut rng);
    let mut buf = vec![0u8; 1 << 20];
    for (k, &(at, len)) in extents.iter().enumerate() {
        let data = &mut buf[..len as usize];
        for b in data.iter_mut() {
            *b = rng.next() as u8;
        }
        r.write(at, data, None).unwrap();
        // Flushed in batches: each batch is allocated where the disk is
        // free then, so extents near in the file lie apart on the disk.
        if k % 4000 == 3999 {
            r.flush().unwrap();
        }
    }
    r.snapshot(None).unwrap();
    dir.join("layer-000001.img")
}

/// Ballast's local copy and `cp --sparse=always` of `src`, median of 3;
/// both times. Cold: the cache is dropped before each run and the target
/// is fsynced within the time.
fn local_vs_cp(src: &Path, label: &str, cold: bool) -> (Duration, Duration) {
    let f = std::fs::File::open(src).unwrap();
    let map = allocation(&f, SIZE / BLOCK).unwrap();
    let dst = src.with_file_name("copy.img");
    let cp_dst = src.with_file_name("cp.img");
    let sync = |p: &Path| std::fs::File::open(p).unwrap().sync_all().unwrap();
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    let mut way = None;
    for _ in 0..3 {
        let _ = std::fs::remove_file(&dst);
        if cold {
            drop_caches();
        }
        let t = Instant::now();
        way = Some(copy_layer(src, &map, &dst, SIZE).unwrap());
        if cold {
            sync(&dst);
        }
        ours.push(t.elapsed());
        let _ = std::fs::remove_file(&cp_dst);
        if cold {
            drop_caches();
        }
        let t = Instant::now();
        let ok = Command::new("cp")
            .arg("--sparse=always")
            .arg(src)
            .arg(&cp_dst)
            .status()
            .unwrap();
        assert!(ok.success());
        if cold {
            sync(&cp_dst);
        }
        theirs.push(t.elapsed());
    }
    let (o, t) = (median(ours), median(theirs));
    let how = if cold {
        "cold, target fsynced"
    } else {
        "warm, not synced"
    };
    println!(
        "{label}, {how}: Ballast local copy ({}) {o:.2?} vs cp --sparse=always {t:.2?}: {:.2}x cp's time",
        way.map(|w| w.as_str()).unwrap_or_default(),
        o.as_secs_f64() / t.as_secs_f64()
    );
    let (a_src, a_ours, a_cp) = (allocated(src), allocated(&dst), allocated(&cp_dst));
    println!(
        "{label}: allocated: source {}, Ballast target {}, cp target {}",
        mib(a_src),
        mib(a_ours),
        mib(a_cp)
    );
    assert_eq!(
        a_ours, a_src,
        "the local copy allocates what the source does"
    );
    let _ = std::fs::remove_file(&dst);
    let _ = std::fs::remove_file(&cp_dst);
    (o, t)
}

/// What this disk takes, alone, for the work any copy of `src` must do,
/// median of 3: its data extents read with direct I/O on as many threads
/// as the local copy keeps reads in flight (no page cache, no copy), then
/// the same number of bytes written in order to a new file and synced.
/// Reads and writes one after the other, where the copy overlaps them (it
/// starts its writeback behind its reads): this disk shares its time
/// between the two, so the overlap gains less than the shorter of them.
fn disk_floor(src: &Path, label: &str, ours: Duration, cp: Duration) {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    use std::sync::atomic::{AtomicUsize, Ordering};
    let runs: Vec<(u64, u64)> = {
        let f = std::fs::File::open(src).unwrap();
        allocation(&f, SIZE / BLOCK)
            .unwrap()
            .runs()
            .into_iter()
            .map(|(a, b)| (a * BLOCK, (b - a) * BLOCK))
            .collect()
    };
    let total: u64 = runs.iter().map(|r| r.1).sum();
    let longest = runs.iter().map(|r| r.1).max().unwrap_or(BLOCK) as usize;
    let out = src.with_file_name("floor.img");
    let (mut reads, mut writes) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        drop_caches();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(src)
            .unwrap();
        let next = AtomicUsize::new(0);
        let t = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..ballast_node::sync::local::RING_DEPTH {
                s.spawn(|| {
                    // Direct I/O wants a block-aligned buffer.
                    let mut buf = vec![0u8; longest + BLOCK as usize];
                    let skip = buf.as_ptr().align_offset(BLOCK as usize);
                    while let Some(&(at, len)) = runs.get(next.fetch_add(1, Ordering::Relaxed)) {
                        f.read_exact_at(&mut buf[skip..skip + len as usize], at)
                            .unwrap();
                    }
                });
            }
        });
        reads.push(t.elapsed());
        let _ = std::fs::remove_file(&out);
        let t = Instant::now();
        let w = std::fs::File::create(&out).unwrap();
        let chunk = vec![0x5au8; 1 << 20];
        let mut left = total;
        while left > 0 {
            let n = left.min(chunk.len() as u64);
            std::io::Write::write_all(&mut &w, &chunk[..n as usize]).unwrap();
            left -= n;
        }
        w.sync_all().unwrap();
        writes.push(t.elapsed());
        let _ = std::fs::remove_file(&out);
    }
    let (r, w) = (median(reads), median(writes));
    let floor = r + w;
    println!(
        "{label}, cold: the disk alone for this copy's work: {} read direct in {} extents on {} threads {r:.2?} + written in order and synced {w:.2?} = {floor:.2?}; Ballast's local copy {:.2}x of it, cp {:.2}x; this floor is {:.2}x cp's time",
        mib(total),
        runs.len(),
        ballast_node::sync::local::RING_DEPTH,
        ours.as_secs_f64() / floor.as_secs_f64(),
        cp.as_secs_f64() / floor.as_secs_f64(),
        floor.as_secs_f64() / cp.as_secs_f64()
    );
}

/// A local fill and a remote fill of the layer of replica `source`, cold,
/// median of 3 each: both through replica servers, both ending with the
/// layer synced and checked.
fn fills(disk: &Path, source: &str, label: &str, local_copy: Duration) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let far_disk = disk.join(format!("{source}-far"));
        std::fs::create_dir_all(&far_disk).unwrap();
        let serve = |d: PathBuf| async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap().to_string();
            tokio::spawn(ReplicaServer::new(vec![d]).serve(l));
            addr
        };
        // The near server holds the source; the far one, a disk of its own
        // on the same filesystem, is another node.
        let (near, far) = (serve(disk.to_path_buf()).await, serve(far_disk.clone()).await);
        let src = ReplicaClient::connect(&near, source).await.unwrap();
        let info = src.info().await.unwrap();
        let spec = JoinSpec::following(
            &src.layers().await.unwrap(),
            info["revision"].as_u64().unwrap(),
        )
        .unwrap();
        let source_layer = replica_dir(disk, source).join("layer-000001.img");
        let source_alloc = allocated(&source_layer);
        let runs = {
            let f = std::fs::File::open(&source_layer).unwrap();
            allocation(&f, SIZE / BLOCK).unwrap().runs()
        };
        let mut times = [Vec::new(), Vec::new(), Vec::new()];
        let mut moved = (0, 0);
        for i in 0..3 {
            for (k, (addr, d, path)) in [
                // Cold: the source's extents are read through the ring
                // (the target's checksum is the check; the source is read
                // once).
                (&near, disk, "io-uring"),
                (&far, far_disk.as_path(), "remote"),
            ]
            .into_iter()
            .enumerate()
            {
                let name = format!("{source}-fill{k}{i}");
                Replica::create(&replica_dir(d, &name), SIZE).unwrap();
                let dst = ReplicaClient::connect(addr, &name).await.unwrap();
                dst.join(&spec).await.unwrap();
                drop_caches();
                let t = Instant::now();
                let report = dst.fill(&format!("{source}@{near}"), 0).await.unwrap();
                times[k].push(t.elapsed());
                assert_eq!(report["path"], path, "{report}");
                let a = allocated(&replica_dir(d, &name).join("layer-000001.img"));
                assert_eq!(a, source_alloc, "the {path} fill allocates what the source does");
                std::fs::remove_dir_all(replica_dir(d, &name)).unwrap();
            }
            // A reused replica: first a fill that ends pending (the join
            // named another checksum), so that its layer holds the
            // source's data; then a block of one extent in a hundred
            // rewritten in it.
            let name = format!("{source}-reuse{i}");
            let dir = replica_dir(&far_disk, &name);
            Replica::create(&dir, SIZE).unwrap();
            let dst = ReplicaClient::connect(&far, &name).await.unwrap();
            let mut wrong = spec.clone();
            wrong.frozen[0].checksum = "0".repeat(64);
            dst.join(&wrong).await.unwrap();
            dst.fill(&format!("{source}@{near}"), 0).await.unwrap_err();
            let changed = rewrite_every_hundredth(&dir.join("layer-000001.img"), &runs);
            let joined = dst.join(&spec).await.unwrap();
            assert_eq!(joined.seeded, ["layer-000001.img"], "{joined:?}");
            drop_caches();
            let t = Instant::now();
            let report = dst.fill(&format!("{source}@{near}"), 0).await.unwrap();
            times[2].push(t.elapsed());
            assert_eq!(report["bytes"], changed, "{report}");
            moved = (changed, report["reused"].as_u64().unwrap());
            let a = allocated(&dir.join("layer-000001.img"));
            assert_eq!(a, source_alloc, "the seeded fill allocates what the source does");
            std::fs::remove_dir_all(&dir).unwrap();
        }
        let [local, remote, reused] = times.map(median);
        println!(
            "{label}, cold: a reused replica's remote fill, a block of one extent in a hundred changed {reused:.2?} vs the full remote fill {remote:.2?}: {:.2}x its time; {} travelled, {} kept",
            reused.as_secs_f64() / remote.as_secs_f64(),
            size(moved.0),
            size(moved.1)
        );
        println!(
            "{label}, cold: remote fill over loopback TCP {remote:.2?} vs local fill {local:.2?}: {:.2}x the local fill's time; both allocate {}",
            remote.as_secs_f64() / local.as_secs_f64(),
            mib(source_alloc)
        );
        println!(
            "{label}, cold: remote fill {remote:.2?} vs the local copy alone (copy_layer, target fsynced) {local_copy:.2?}: {:.2}x its time",
            remote.as_secs_f64() / local_copy.as_secs_f64()
        );
    })
}

/// Rewrites the first block of every hundredth run of `layer` with other
/// bytes, synced; returns the bytes changed.
fn rewrite_every_hundredth(layer: &Path, runs: &[(u64, u64)]) -> u64 {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(layer).unwrap();
    let other = vec![0x5au8; BLOCK as usize];
    let mut changed = 0;
    for &(start, _) in runs.iter().step_by(100) {
        f.write_all_at(&other, start * BLOCK).unwrap();
        changed += BLOCK;
    }
    f.sync_all().unwrap();
    changed
}

/// An xfs filesystem with reflink on a loop device, or why there is none.
struct Xfs {
    dir: PathBuf,
}

impl Xfs {
    fn mount(base: &Path) -> Result<Xfs, String> {
        if !nix::unistd::geteuid().is_root() {
            return Err("needs root".into());
        }
        let image = base.join("xfs.img");
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(12 << 30))
            .map_err(|e| e.to_string())?;
        let dir = base.join("xfs");
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let mkfs = Command::new("mkfs.xfs")
            .args(["-q", "-f", "-m", "reflink=1"])
            .arg(&image)
            .status()
            .map_err(|e| format!("mkfs.xfs: {e} (install xfsprogs)"))?;
        if !mkfs.success() {
            return Err("mkfs.xfs failed".into());
        }
        let mount = Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(&dir)
            .status()
            .map_err(|e| e.to_string())?;
        if !mount.success() {
            return Err("mount failed".into());
        }
        Ok(Xfs { dir })
    }
}

impl Drop for Xfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
    }
}

fn main() {
    let base = std::env::var("BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| std::env::temp_dir());
    let work = tempfile::tempdir_in(&base).unwrap();
    println!("layers of {} apparent, on {}", mib(SIZE), base.display());
    for (name, layout) in [("even", Layout::Even), ("frag", Layout::Fragmented)] {
        let src = source_replica(work.path(), name, layout);
        let f = std::fs::File::open(&src).unwrap();
        let extents = allocation(&f, SIZE / BLOCK).unwrap().runs().len();
        let label = layout.label();
        println!(
            "{label}: {extents} extents, {} allocated",
            mib(allocated(&src))
        );
        local_vs_cp(&src, label, false);
        let (cold, cp) = local_vs_cp(&src, label, true);
        disk_floor(&src, label, cold, cp);
        fills(work.path(), name, label, cold);
    }
    match Xfs::mount(work.path()) {
        Ok(xfs) => {
            let src = source_replica(&xfs.dir, "src", Layout::Even);
            local_vs_cp(&src, "xfs reflink=1, even layer", false);
            drop(xfs);
        }
        Err(why) => println!("xfs reflink=1: skipped: {why}"),
    }
}
