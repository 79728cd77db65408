//! A node's replicas under the soft limit of open files a container is
//! given (1,024 under containerd 2), once the daemon has raised it as it
//! does at its start (`ballast::limits`). Alone in its test binary: it
//! changes the limits of its process.

use std::path::Path;

use ballast_node::replica::{Replica, Replicas, replica_dir};
use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// What containerd 2 leaves a container as its soft limit.
const CONTAINER_SOFT: u64 = 1024;

fn open_files() -> u64 {
    std::fs::read_dir("/proc/self/fd").unwrap().count() as u64
}

/// A replica of 1 MiB with two snapshots (three layers), its head holding
/// block `i`'s mark at offset 0.
fn replica_with_layers(disk: &Path, name: &str, i: u64) {
    let mut r = Replica::create(&replica_dir(disk, name), 1 << 20).unwrap();
    r.write(4096, &[1u8; 4096], None).unwrap();
    r.snapshot(None).unwrap();
    r.write(8192, &[2u8; 4096], None).unwrap();
    r.snapshot(None).unwrap();
    r.write(0, &mark(i), None).unwrap();
    r.flush().unwrap();
}

fn mark(i: u64) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    for (k, x) in b.iter_mut().enumerate() {
        *x = (i as usize * 31 + k) as u8;
    }
    b
}

/// A node holds every replica it serves open, with each of its layers.
/// Under the soft limit a container gets, the node (its limit raised as
/// the daemon raises it) opens more replicas than that limit allows
/// files, and each serves its data, checked. Without the raise the opens
/// fail with "too many open files".
#[test]
fn a_node_under_a_containers_soft_limit_of_open_files_opens_its_replicas_once_it_raised_it() {
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, CONTAINER_SOFT, hard).unwrap();
    let (before, after) = ballast::limits::raise_open_files().unwrap();
    assert_eq!(before, CONTAINER_SOFT);
    assert_eq!(after, hard.min(ballast::limits::OPEN_FILES));

    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk-1");
    std::fs::create_dir_all(&disk).unwrap();
    let table = Replicas::new(vec![disk.clone()]);
    // How many files one open replica of three layers holds.
    replica_with_layers(&disk, "v-r0", 0);
    let idle = open_files();
    let mut held = vec![table.find("v-r0").unwrap()];
    let each = open_files() - idle;
    assert!(
        each >= 6,
        "an open replica of three layers holds {each} files"
    );
    // Twice the container's limit in files.
    let count = 2 * CONTAINER_SOFT / each + 1;
    let needed = idle + count * each + 64;
    assert!(
        hard >= needed,
        "the hard limit of open files is {hard}; this test needs {needed}: raise it (ulimit -Hn)"
    );
    for i in 1..count {
        let name = format!("v-r{i}");
        replica_with_layers(&disk, &name, i);
        held.push(
            table
                .find(&name)
                .unwrap_or_else(|e| panic!("replica {i} of {count}: {e}")),
        );
    }
    assert!(open_files() > CONTAINER_SOFT);
    for (i, r) in held.iter().enumerate() {
        let r = r.read().unwrap();
        let mut got = vec![0u8; 3 * 4096];
        r.read(0, &mut got).unwrap();
        assert_eq!(got[..4096], mark(i as u64)[..], "replica {i}: its head");
        assert_eq!(got[4096..8192], [1u8; 4096], "replica {i}: its first layer");
        assert_eq!(got[8192..], [2u8; 4096], "replica {i}: its second layer");
    }
}
