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

/// Sets the fence of the replica in `dir` to `epoch`, durably.
pub fn write(dir: &Path, epoch: u64) -> Result<(), ReplicaError> {
    super::meta::write_durably(dir, FENCE_FILE, format!("{epoch}\n").as_bytes())
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
}
