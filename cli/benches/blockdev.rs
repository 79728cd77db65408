//! The block device a pod gets against its peer, in one run, on one disk:
//! `fio` (libaio, direct I/O, queue depth 16) on
//!
//! - Ballast: a loop device on the engine's FUSE export (what
//!   NodeStageVolume sets up), the engine with one replica on its own node
//!   (lent to it);
//! - peer: a loop device (direct I/O) on a raw file of the same disk.
//!
//! 4k random and 64k sequential, write then read; prints each figure and
//! the ratio. Reads run twice: warm, as a pod would see them (the engine
//! reads its replica through the page cache, the peer's loop device reads
//! its file with direct I/O), and cold, like for like: the page cache
//! dropped before each run, and each block read once, so both read the
//! disk. Each case also prints the whole machine's busy CPU per operation
//! (with the writeback of what a run left dirty), a measure of the work
//! that the host's stolen time does not move. First, what the host
//! takes from the cores to write the disk (`common::host_disk_steal`).
//! Needs root, FUSE and fio.
//! Run:
//! `cargo bench -p ballast-cli --bench blockdev`. Words after `--` pick
//! cases, as for the nbd bench: a size (`4k`, `64k`) and/or a kind
//! (`randwrite`, `randread`, `write`, `read`), e.g. `-- 64k write`. A read
//! case reads what the write case of its size wrote: picked alone, it
//! reads holes, which cost neither side a disk read. `-- hold` prints the
//! two devices and keeps them up until Enter, for profiling by hand.

#[allow(dead_code)] // shared by the benchmarks; each uses a part
mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ballast_node::frontend::blockdev::LoopDevice;
use common::{Kill, SIZE, engine, fio_json, node_with};

/// Writes the dirty pages out and drops the page cache.
fn drop_caches() {
    nix::unistd::sync();
    std::fs::write("/proc/sys/vm/drop_caches", "3").expect("drop the page cache (root)");
}

/// One fio run: operations per second, and the whole machine's busy CPU
/// per operation in µs (`common::machine_busy`), the writeback of what
/// the run left dirty included.
#[derive(Clone, Copy)]
struct Run {
    iops: f64,
    cpu: f64,
}

/// fio on `dev`. `cold`: the page cache is dropped first, and the 512 MiB
/// are read once (not for a time).
fn fio(dev: &Path, rw: &str, bs: &str, cold: bool) -> Run {
    let mut cmd = Command::new("fio");
    cmd.args([
        "--name=bench",
        "--ioengine=libaio",
        "--direct=1",
        "--iodepth=16",
        "--size=512M",
        "--output-format=json",
    ])
    .arg(format!("--filename={}", dev.display()));
    if cold {
        drop_caches();
    } else {
        // Each run starts with nothing dirty: what one left behind would
        // be written back during the next, whoever's it is.
        nix::unistd::sync();
        cmd.args(["--runtime=4", "--time_based"]);
    }
    let busy = common::machine_busy();
    let v = fio_json(&mut cmd, rw, bs);
    // What the run left dirty (the engine's replica is written through
    // the page cache) is part of its work.
    nix::unistd::sync();
    let busy = common::machine_busy() - busy;
    let job = &v["jobs"][0];
    let side = if rw.contains("write") {
        "write"
    } else {
        "read"
    };
    let ios = job[side]["total_ios"]
        .as_f64()
        .expect("fio reports total_ios");
    Run {
        iops: job[side]["iops"].as_f64().expect("fio reports iops"),
        cpu: busy * 1e6 / ios.max(1.0),
    }
}

fn main() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this benchmark needs root (loop devices, FUSE)"
    );
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();

    let raw = dir.path().join("peer.img");
    std::fs::File::create(&raw).unwrap().set_len(SIZE).unwrap();
    let peer = LoopDevice::attach(&raw).unwrap();

    let (_node, r1) = node_with(dir.path(), 1, "bd", true);
    let fuse = dir.path().join("fuse");
    let fuse_arg = fuse.display().to_string();
    let (mut eng, _socket) = engine(
        dir.path(),
        "bd",
        std::slice::from_ref(&r1),
        1,
        &["--fuse-dir", &fuse_arg],
    );
    let file = fuse.join(ballast_node::frontend::blockdev::FILE_NAME);
    let end = Instant::now() + Duration::from_secs(30);
    while !file.exists() {
        assert!(Instant::now() < end, "the FUSE export never appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
    let ours = LoopDevice::attach(&file).unwrap();

    let picked = common::Picked::from_args();
    if picked.has("hold") {
        println!(
            "loop on a raw file: {}\nballast block device: {} (engine pid {})\nEnter ends.",
            peer.path.display(),
            ours.path.display(),
            eng.0.id()
        );
        let _ = std::io::stdin().read_line(&mut String::new());
    } else {
        println!(
            "fio, libaio, direct, QD16, operations per second ({})",
            common::in_turns_said()
        );
        println!("{}", common::host_disk_steal_said(dir.path()));
    }
    for (rw, bs, cold) in [
        ("randwrite", "4k", false),
        ("randread", "4k", false),
        ("randread", "4k", true),
        ("write", "64k", false),
        ("read", "64k", false),
        ("read", "64k", true),
    ] {
        if picked.has("hold")
            || !picked.wanted(bs, &["4k", "64k"])
            || !picked.wanted(rw, &["randwrite", "randread", "write", "read"])
        {
            continue;
        }
        // In turns (see `common::in_turns`): what drifts during the case
        // (the disk's cache, writeback, the host) falls on both.
        let runs = common::in_turns(&mut [&mut || fio(&peer.path, rw, bs, cold), &mut || {
            fio(&ours.path, rw, bs, cold)
        }]);
        let of = |get: fn(&Run) -> f64| -> Vec<Vec<f64>> {
            runs.iter().map(|r| r.iter().map(get).collect()).collect()
        };
        let (iops, cpu) = (of(|r| r.iops), of(|r| r.cpu));
        let mid = |v: &Vec<f64>| common::median(v.clone());
        let case = format!("{bs} {rw}{}", if cold { " (cold)" } else { "" });
        println!(
            "{case:<17}  loop on a raw file {:>8.0}  ballast block device, 1 replica {:>8.0} ({:.2}x)  CPU per operation, whole machine {:>6.1} / {:>6.1} µs (loop's over ours: {:.2}x)",
            mid(&iops[0]),
            mid(&iops[1]),
            common::ratio(&iops[1], &iops[0]),
            mid(&cpu[0]),
            mid(&cpu[1]),
            common::ratio(&cpu[0], &cpu[1]),
        );
    }

    // Teardown in order: the loop devices, then the engine (which
    // unmounts its export on SIGTERM), then the rest.
    drop(ours);
    drop(peer);
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(eng.0.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = eng.0.wait();
    let _ = Command::new("umount").arg("-l").arg(&fuse).output();
    drop::<Kill>(eng);
}
