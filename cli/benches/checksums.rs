//! What per-block checksums cost, in one run, on one disk: the same engine
//! over one replica (on its node, lent to it) in today's format — every
//! 4 KiB block's CRC32C kept with the data and checked on every read — and
//! in the format from before them.
//!
//! - NBD: fio's nbd engine on the engine's socket, QD16: 4k random write
//!   and read, 64k sequential write and read.
//! - The block device (as root): fio (libaio, direct) on a loop device on
//!   the engine's FUSE export, the same four.
//!
//! Prints each figure and the ratio with checksums to without (the goal is
//! at least 0.90x on 4k random I/O). Needs fio. Run:
//! `cargo bench -p ballast-cli --bench checksums`; words after `--` pick
//! cases: `nbd` or `block`, and an fio rw such as `randread`.

#[allow(dead_code)] // shared by the benchmarks; each uses a part
mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ballast_node::frontend::blockdev::LoopDevice;
use common::{Kill, engine, fio_json, node_with};

const CASES: [(&str, &str); 4] = [
    ("randwrite", "4k"),
    ("randread", "4k"),
    ("write", "64k"),
    ("read", "64k"),
];

/// fio on an NBD URI (`Err(uri)`) or a block device; operations per second.
fn fio(target: Result<&Path, &str>, rw: &str, bs: &str) -> f64 {
    let mut c = Command::new("fio");
    c.args([
        "--name=bench",
        "--iodepth=16",
        "--runtime=3",
        "--time_based",
        "--size=512M",
        "--output-format=json",
    ]);
    match target {
        Ok(dev) => {
            c.args(["--ioengine=libaio", "--direct=1"])
                .arg(format!("--filename={}", dev.display()));
        }
        Err(uri) => {
            c.arg("--ioengine=nbd").arg(format!("--uri={uri}"));
        }
    }
    let v = fio_json(&mut c, rw, bs);
    let side = if rw.contains("write") {
        "write"
    } else {
        "read"
    };
    v["jobs"][0][side]["iops"]
        .as_f64()
        .expect("fio reports iops")
}

/// `with` and `without`, in turns (see `common::in_turns`), each after a
/// sync, so that neither inherits the other's writeback: the medians of
/// their rates, and the median ratio of a round's two.
fn compare(mut with: impl FnMut() -> f64, mut without: impl FnMut() -> f64) -> (f64, f64, f64) {
    let runs = common::in_turns(&mut [
        &mut || {
            nix::unistd::sync();
            with()
        },
        &mut || {
            nix::unistd::sync();
            without()
        },
    ]);
    (
        common::median(runs[0].clone()),
        common::median(runs[1].clone()),
        common::ratio(&runs[0], &runs[1]),
    )
}

/// Waits for the engine's FUSE export and puts a loop device on it.
fn block_device(fuse: &Path) -> LoopDevice {
    let file = fuse.join(ballast_node::frontend::blockdev::FILE_NAME);
    let end = Instant::now() + Duration::from_secs(30);
    while !file.exists() {
        assert!(Instant::now() < end, "the FUSE export never appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
    LoopDevice::attach(&file).unwrap()
}

fn main() {
    let picked = common::Picked::from_args();
    let wanted = |word: &str, all: &[&str]| picked.wanted(word, all);
    let rws: Vec<&str> = CASES.iter().map(|(rw, _)| *rw).collect();
    let root = nix::unistd::geteuid().is_root();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut engines: Vec<(Kill, String, Option<std::path::PathBuf>)> = Vec::new();
    let mut nodes = Vec::new();
    for (i, (volume, sums)) in [("sums", true), ("plain", false)].into_iter().enumerate() {
        let (n, r) = node_with(dir.path(), i + 1, volume, sums);
        nodes.push(n);
        let fuse = dir.path().join(format!("{volume}.fuse"));
        let fuse_arg = fuse.display().to_string();
        let extra: Vec<&str> = if root {
            vec!["--fuse-dir", &fuse_arg]
        } else {
            vec![]
        };
        let (e, socket) = engine(dir.path(), volume, std::slice::from_ref(&r), i + 1, &extra);
        let uri = format!("nbd+unix:///{volume}?socket={}", socket.display());
        engines.push((e, uri, root.then_some(fuse)));
    }

    println!(
        "per-block checksums vs none, 1 replica, QD16, operations per second ({})",
        common::in_turns_said()
    );
    for (rw, bs) in CASES {
        if !wanted("nbd", &["nbd", "block"]) || !wanted(rw, &rws) {
            continue;
        }
        let (with, without, ratio) = compare(
            || fio(Err(&engines[0].1), rw, bs),
            || fio(Err(&engines[1].1), rw, bs),
        );
        println!(
            "NBD          {bs:>3} {rw:<9}  without {without:>8.0}  with {with:>8.0}  ({:.2}x)",
            ratio
        );
    }
    if !root {
        println!("(the block device needs root: not measured)");
        return;
    }
    if !wanted("block", &["nbd", "block"]) {
        return;
    }
    let devs: Vec<LoopDevice> = engines
        .iter()
        .map(|(_, _, fuse)| block_device(fuse.as_deref().unwrap()))
        .collect();
    for (rw, bs) in CASES {
        if !wanted(rw, &rws) {
            continue;
        }
        let (with, without, ratio) = compare(
            || fio(Ok(&devs[0].path), rw, bs),
            || fio(Ok(&devs[1].path), rw, bs),
        );
        println!(
            "block device {bs:>3} {rw:<9}  without {without:>8.0}  with {with:>8.0}  ({:.2}x)",
            ratio
        );
    }
    // Teardown in order: the loop devices, then the engines (which unmount
    // their exports on SIGTERM), then the rest.
    drop(devs);
    for (mut e, _, fuse) in engines {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(e.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = e.0.wait();
        if let Some(f) = fuse {
            let _ = Command::new("umount").arg("-l").arg(&f).output();
        }
    }
    drop(nodes);
}
