//! The live revision counter of a replica: 8 bytes in the file `revision`,
//! mapped into memory, so that recording each write's revision is a store
//! rather than a system call. The mapping is shared, so the value is in the
//! page cache like the data it counts (it survives the process), and it is
//! made durable with the data at each flush.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use memmap2::MmapMut;

use super::ReplicaError;

pub struct RevisionCounter {
    path: PathBuf,
    file: File,
    map: MmapMut,
}

impl RevisionCounter {
    /// Opens (or creates) the counter at `path`; returns it and the value
    /// it holds.
    pub fn open(path: &Path) -> Result<(RevisionCounter, u64), ReplicaError> {
        let io = |e| ReplicaError::io(path, e);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(io)?;
        let mut buf = [0u8; 8];
        let stored = match file.read_exact_at(&mut buf, 0) {
            Ok(()) => u64::from_le_bytes(buf),
            Err(_) => 0,
        };
        if file.metadata().map_err(io)?.len() < 8 {
            file.set_len(8).map_err(io)?;
        }
        // SAFETY: the file belongs to this replica's directory and is only
        // mapped and written here; nothing truncates it while it is open.
        let map = unsafe { memmap2::MmapOptions::new().len(8).map_mut(&file) }.map_err(io)?;
        Ok((
            RevisionCounter {
                path: path.to_path_buf(),
                file,
                map,
            },
            stored,
        ))
    }

    /// Records `value` (durable at the next `sync`).
    pub fn store(&mut self, value: u64) {
        self.map[..8].copy_from_slice(&value.to_le_bytes());
    }

    /// Makes the stored value durable.
    pub fn sync(&self) -> Result<(), ReplicaError> {
        self.map
            .flush()
            .and_then(|()| self.file.sync_data())
            .map_err(|e| ReplicaError::io(&self.path, e))
    }
}
