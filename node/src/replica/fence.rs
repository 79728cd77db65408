//! A replica's engine fence (`engine-epoch`): the latest attachment of its
//! volume that an engine opened it for. The controller counts a volume's
//! attachments (`status.engineEpoch`, one more at every start of an
//! engine); an engine claims its own when it opens a replica, and the
//! server raises the fence to it. From then on the replica takes no
//! mutation from an engine of an earlier attachment: one left running on
//! a node the cluster gave up on cannot write under the new one.
//!
//! The file is the server's alone: an engine that borrows the replica
//! (LEND) writes `meta.json` and the layers, never this. It is written
//! before the fence is raised in memory, so a crash never lowers it.
//!
//! It holds the number in a fixed width (`WIDTH` bytes), written in place
//! and synced: a raise needs no new room on the disk, so a replica on a
//! full disk can still be opened by a new engine (before 2026-12-05 each
//! raise wrote a new file and renamed it, and a volume whose replicas'
//! disks were full could not attach at all). Its size never changes once
//! it has that width, so a cut cannot leave new bytes under an old size.
//! A file of another width (a replica from before, or none yet) is
//! replaced whole, as before, which needs room. (On a copy-on-write
//! filesystem such as btrfs every overwrite needs room, this one too.)

use std::path::Path;

use super::ReplicaError;

pub const FENCE_FILE: &str = "engine-epoch";

/// The fence of the replica in `dir` (0 when none was raised).
pub fn read(dir: &Path) -> Result<u64, ReplicaError> {
    let path = dir.join(FENCE_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => text.trim().parse().map_err(|_| {
            ReplicaError::Corrupt(format!(
                "{}: {:?} is not an attachment number",
                path.display(),
                text.trim()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(ReplicaError::io(&path, e)),
    }
}

/// The file's size: the largest number, and a newline.
const WIDTH: usize = 21;

fn record(epoch: u64) -> Vec<u8> {
    format!("{epoch:020}\n").into_bytes()
}

/// Sets the fence of the replica in `dir` to `epoch`, durably.
pub fn write(dir: &Path, epoch: u64) -> Result<(), ReplicaError> {
    use std::os::unix::fs::FileExt;
    let path = dir.join(FENCE_FILE);
    let io = |e| ReplicaError::io(&path, e);
    let fixed = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|f| Ok((f.metadata()?.len() == WIDTH as u64).then_some(f)));
    match fixed {
        Ok(Some(f)) => {
            f.write_all_at(&record(epoch), 0).map_err(io)?;
            f.sync_data().map_err(io)
        }
        Ok(None) => super::meta::write_durably(dir, FENCE_FILE, &record(epoch)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            super::meta::write_durably(dir, FENCE_FILE, &record(epoch))
        }
        Err(e) => Err(io(e)),
    }
}

/// The file of the replica in `dir`, whose fence is `epoch`, given the
/// fixed width when it has another (a replica from before it, or one
/// never fenced), while there is room: its raises need none from then on.
/// Best effort: without room it stays, and a raise replaces it whole, as
/// before.
pub fn keep_fixed_width(dir: &Path, epoch: u64) {
    let fixed = std::fs::metadata(dir.join(FENCE_FILE)).is_ok_and(|m| m.len() == WIDTH as u64);
    if !fixed && let Err(e) = super::meta::write_durably(dir, FENCE_FILE, &record(epoch)) {
        tracing::debug!(dir = %dir.display(), error = %e, "the fence file keeps its width for now");
    }
}

/// The file of a new replica: no fence yet, in its fixed width.
pub(super) fn create(dir: &Path) -> Result<(), ReplicaError> {
    super::meta::write_durably(dir, FENCE_FILE, &record(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_reads_back_as_written_and_none_is_zero() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).unwrap(), 0);
        write(dir.path(), 3).unwrap();
        assert_eq!(read(dir.path()).unwrap(), 3);
        write(dir.path(), 41).unwrap();
        assert_eq!(read(dir.path()).unwrap(), 41);
        std::fs::write(dir.path().join(FENCE_FILE), "x\n").unwrap();
        assert!(matches!(read(dir.path()), Err(ReplicaError::Corrupt(_))));
    }

    /// A file from before the fixed width reads as it was, and its next
    /// raise gives it the width; one of the width is raised in place, the
    /// same file (no new one to make room for).
    #[test]
    fn a_fence_is_raised_in_place_in_its_fixed_width() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FENCE_FILE);
        std::fs::write(&path, "3\n").unwrap();
        assert_eq!(read(dir.path()).unwrap(), 3);
        write(dir.path(), 4).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), WIDTH as u64);
        let inode = std::fs::metadata(&path).unwrap().ino();
        write(dir.path(), u64::MAX).unwrap();
        assert_eq!(read(dir.path()).unwrap(), u64::MAX);
        write(dir.path(), 5).unwrap();
        assert_eq!(read(dir.path()).unwrap(), 5);
        let after = std::fs::metadata(&path).unwrap();
        assert_eq!((after.ino(), after.len()), (inode, WIDTH as u64));
        let fresh = tempfile::tempdir().unwrap();
        create(fresh.path()).unwrap();
        assert_eq!(read(fresh.path()).unwrap(), 0);
        let inode = std::fs::metadata(fresh.path().join(FENCE_FILE))
            .unwrap()
            .ino();
        write(fresh.path(), 1).unwrap();
        let after = std::fs::metadata(fresh.path().join(FENCE_FILE)).unwrap();
        assert_eq!((after.ino(), read(fresh.path()).unwrap()), (inode, 1));
    }

    /// A replica's file from before the fixed width, or none, takes it
    /// when the server first reads the fence, with the same number.
    #[test]
    fn a_fence_file_of_another_width_or_none_takes_the_fixed_width() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FENCE_FILE);
        keep_fixed_width(dir.path(), 0);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), WIDTH as u64);
        assert_eq!(read(dir.path()).unwrap(), 0);
        std::fs::write(&path, "7\n").unwrap();
        keep_fixed_width(dir.path(), 7);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), WIDTH as u64);
        assert_eq!(read(dir.path()).unwrap(), 7);
    }
}
