//! NodeStage's building block, as root: an engine over a real replica
//! server, exposed as a FUSE file, a loop device on it (direct I/O), then
//! mkfs.ext4, mount, files written, unmount, mount again, files verified.
//! Every mount and loop device is cleaned up, even when the test fails.

use std::path::{Path, PathBuf};
use std::process::Command;

use ballast_node::engine::{Engine, ReplicaAddr, ReplicaSet};
use ballast_node::frontend::blockdev::{self, LoopDevice};
use ballast_node::replica::Replica;
use ballast_node::replica::replica_dir;
use ballast_node::server::ReplicaServer;

fn run(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Unmounts the filesystem on drop, first of the teardown.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn mount(dev: &Path, at: &Path) -> Mounted {
    std::fs::create_dir_all(at).unwrap();
    run("mount", &[dev.to_str().unwrap(), at.to_str().unwrap()]);
    Mounted(at.to_path_buf())
}

fn pattern(i: usize) -> Vec<u8> {
    (0..(64 * 1024 + i * 4099))
        .map(|b| ((b * 31 + i * 7) % 251) as u8)
        .collect()
}

#[test]
fn fuse_and_loop_make_a_block_device_that_carries_an_ext4_filesystem() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (CI runs as root)"
    );
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let size = 256u64 << 20;
    let disk = dir.path().join("disk");
    Replica::create(&replica_dir(&disk, "bd-r1"), size).unwrap();
    let engine = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(ReplicaServer::new(vec![disk.clone()]).serve(listener));
        Engine::start(
            "bd",
            size,
            &[ReplicaAddr {
                name: "bd-r1".into(),
                addr,
            }],
            None,
            ReplicaSet::default(),
            None,
            Default::default(),
        )
        .await
        .unwrap()
    });

    // Teardown runs in reverse order of these bindings: filesystem, loop, FUSE.
    let fuse = blockdev::mount(engine, rt.handle().clone(), &dir.path().join("fuse")).unwrap();
    assert_eq!(std::fs::metadata(fuse.file()).unwrap().len(), size);
    let dev = LoopDevice::attach(&fuse.file()).unwrap();
    run("mkfs.ext4", &["-q", "-F", dev.path.to_str().unwrap()]);

    let mnt = dir.path().join("mnt");
    {
        let _m = mount(&dev.path, &mnt);
        for i in 0..8 {
            std::fs::write(mnt.join(format!("file-{i}")), pattern(i)).unwrap();
        }
        // This filesystem only, not every one on the machine.
        run("sync", &["-f", mnt.to_str().unwrap()]);
    }
    {
        let _m = mount(&dev.path, &mnt);
        for i in 0..8 {
            let got = std::fs::read(mnt.join(format!("file-{i}"))).unwrap();
            assert!(got == pattern(i), "file-{i} differs after a remount");
        }
    }
    drop(dev);
    drop(fuse);
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(dir.path().to_str().unwrap()),
        "nothing stays mounted"
    );
}
