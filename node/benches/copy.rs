//! Rebuild copy paths against `cp`, in one run, on one disk, median of 3:
//!
//! - Local copy of an 8 GiB sparse layer holding ~800 MiB of scattered data
//!   (Ballast's `copy_layer`) vs `cp --sparse=always`.
//! - The same on an xfs filesystem with reflink=1 (a loop device; needs
//!   root and mkfs.xfs), where Ballast clones instead of copying.
//! - Remote sync (the layer over the replica protocol on loopback TCP,
//!   checked by checksum on arrival) vs the local copy.
//!
//! Prints each time, the ratios, and the allocated bytes of every target.
//! Run: `cargo bench -p ballast-node --bench copy` (BENCH_DIR picks the disk).

use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ballast_node::replica::replica_dir;
use ballast_node::replica::{BLOCK, Replica, allocation};
use ballast_node::server::ReplicaServer;
use ballast_node::sync::local::copy_layer;
use ballast_node::wire::JoinSpec;
use ballast_node::wire::client::ReplicaClient;

const SIZE: u64 = 8 << 30;
/// 800 extents of 1 MiB, spread over the 8 GiB.
const EXTENTS: u64 = 800;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn allocated(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.blocks() * 512).unwrap_or(0)
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1 << 20) as f64)
}

/// A replica at `disk` whose first layer is frozen with the data.
fn source_replica(disk: &Path) -> PathBuf {
    let dir = replica_dir(disk, "src");
    let mut r = Replica::create(&dir, SIZE).unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut buf = vec![0u8; 1 << 20];
    for k in 0..EXTENTS {
        for b in buf.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        let at = k * (SIZE / EXTENTS) / BLOCK * BLOCK;
        r.write(at, &buf, None).unwrap();
    }
    r.snapshot(None).unwrap();
    dir.join("layer-000001.img")
}

/// Ballast's local copy and `cp --sparse=always` of `src`, median of 3.
fn local_vs_cp(src: &Path, label: &str) -> Duration {
    let f = std::fs::File::open(src).unwrap();
    let map = allocation(&f, SIZE / BLOCK).unwrap();
    let dst = src.with_file_name("copy.img");
    let cp_dst = src.with_file_name("cp.img");
    let sync = |p: &Path| std::fs::File::open(p).unwrap().sync_all().unwrap();
    let (mut ours, mut theirs, mut ours_synced, mut theirs_synced) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut way = None;
    for _ in 0..3 {
        let _ = std::fs::remove_file(&dst);
        let t = Instant::now();
        way = Some(copy_layer(src, &map, &dst, SIZE).unwrap());
        ours.push(t.elapsed());
        sync(&dst);
        ours_synced.push(t.elapsed());
        let _ = std::fs::remove_file(&cp_dst);
        let t = Instant::now();
        let ok = Command::new("cp")
            .arg("--sparse=always")
            .arg(src)
            .arg(&cp_dst)
            .status()
            .unwrap();
        assert!(ok.success());
        theirs.push(t.elapsed());
        sync(&cp_dst);
        theirs_synced.push(t.elapsed());
    }
    let (o, t) = (median(ours), median(theirs));
    let (os, ts) = (median(ours_synced), median(theirs_synced));
    println!(
        "{label}: Ballast local copy ({}) {o:.2?} vs cp --sparse=always {t:.2?}: {:.2}x cp's time",
        way.map(|w| w.as_str()).unwrap_or_default(),
        o.as_secs_f64() / t.as_secs_f64()
    );
    println!(
        "{label}: with the target fsynced: Ballast {os:.2?} vs cp {ts:.2?}: {:.2}x",
        os.as_secs_f64() / ts.as_secs_f64()
    );
    println!(
        "{label}: allocated: source {}, Ballast target {}, cp target {}",
        mib(allocated(src)),
        mib(allocated(&dst)),
        mib(allocated(&cp_dst))
    );
    let _ = std::fs::remove_file(&dst);
    let _ = std::fs::remove_file(&cp_dst);
    o
}

/// The layer over the replica protocol from one replica server to another.
fn remote(disk: &Path) -> (Duration, u64) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let src_disk = disk.to_path_buf();
        let dst_disk = disk.join("remote-target");
        std::fs::create_dir_all(&dst_disk).unwrap();
        let serve = |d: PathBuf| async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap().to_string();
            tokio::spawn(ReplicaServer::new(vec![d]).serve(l));
            addr
        };
        let (sa, da) = (serve(src_disk).await, serve(dst_disk.clone()).await);
        let src = ReplicaClient::connect(&sa, "src").await.unwrap();
        let info = src.info().await.unwrap();
        let spec = JoinSpec::following(
            &src.layers().await.unwrap(),
            info["revision"].as_u64().unwrap(),
        )
        .unwrap();
        let mut times = Vec::new();
        let mut target_alloc = 0;
        for i in 0..3 {
            let name = format!("dst{i}");
            Replica::create(&replica_dir(&dst_disk, &name), SIZE).unwrap();
            let dst = ReplicaClient::connect(&da, &name).await.unwrap();
            dst.join(&spec).await.unwrap();
            let t = Instant::now();
            let report = dst.fill(&format!("src@{sa}")).await.unwrap();
            times.push(t.elapsed());
            assert_eq!(report["path"], "remote");
            target_alloc = allocated(&replica_dir(&dst_disk, &name).join("layer-000001.img"));
            std::fs::remove_dir_all(replica_dir(&dst_disk, &name)).unwrap();
        }
        (median(times), target_alloc)
    })
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
    println!(
        "layer: {} apparent, {EXTENTS} extents of 1 MiB ({}), on {}",
        mib(SIZE),
        mib(EXTENTS << 20),
        base.display()
    );
    let src = source_replica(work.path());
    // A sanity check on the source: what a copy must match.
    let mut probe = vec![0u8; 16];
    std::fs::File::open(&src)
        .unwrap()
        .read_exact_at(&mut probe, 0)
        .unwrap();
    let local = local_vs_cp(&src, "local (same filesystem)");
    let (r, alloc) = remote(work.path());
    println!(
        "remote sync over loopback TCP {r:.2?} vs the local copy {local:.2?}: {:.2}x the local copy's time; target allocated {}",
        r.as_secs_f64() / local.as_secs_f64(),
        mib(alloc)
    );
    match Xfs::mount(work.path()) {
        Ok(xfs) => {
            let src = source_replica(&xfs.dir);
            local_vs_cp(&src, "xfs reflink=1");
            drop(xfs);
        }
        Err(why) => println!("xfs reflink=1: skipped: {why}"),
    }
}
