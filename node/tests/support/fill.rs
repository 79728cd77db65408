//! Filling a test's filesystem to its last block: the full disk of the
//! fault and scenario suites and of the node's power-loss tests.

/// Fills the filesystem holding `dir` with files there, to the last 4 KiB
/// block (as root, who may also use the blocks ext4 reserves).
pub fn fill_disk(dir: &std::path::Path) -> std::path::PathBuf {
    let filler = dir.join("filler");
    std::fs::create_dir_all(&filler).unwrap();
    let mut n = 0;
    for chunk in [64u64 << 20, 1 << 20, 64 << 10, 4 << 10] {
        loop {
            let f = std::fs::File::create(filler.join(n.to_string())).unwrap();
            n += 1;
            let took = nix::fcntl::fallocate(
                std::os::fd::AsFd::as_fd(&f),
                nix::fcntl::FallocateFlags::empty(),
                0,
                chunk as i64,
            );
            if took.is_err() {
                break;
            }
        }
    }
    // This filesystem only: a sync of every one would also make durable
    // what a test beside this one leaves unsynced on its own forgetful
    // disk before its power cut, and that test would find less suspect
    // than its flushes left (seen once under `./test`, 2026-12-07).
    let at = std::fs::File::open(&filler).unwrap();
    nix::unistd::syncfs(&at).unwrap();
    filler
}
