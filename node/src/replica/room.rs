//! The room a replica keeps for a new boot. After a power cut the open
//! must record, durably and before it serves, which blocks of the head it
//! found suspect (`integrity`), in a new file; on a full disk there is no
//! block for it, and such an open failed until space was freed, with the
//! volume's data whole on the disk. So each replica keeps a file (`room`)
//! of `ROOM` bytes, allocated when it is opened and the disk has them; an
//! open that finds no room gives it up and tries once more, and a later
//! open with room makes it again.
//!
//! It owns only that file: what is written in its place is the caller's.

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::ReplicaError;

/// The kept room's file in a replica's directory.
pub const ROOM_FILE: &str = "room";

/// Bytes kept: the list of 47,000 suspect blocks at least (about 22
/// bytes a block with its checksum, 11 without), 184 MiB of the head.
pub const ROOM: u64 = 1 << 20;

/// Makes the room of the replica in `dir` when it is not there whole.
/// Best effort: on a disk without `ROOM` bytes free (or a filesystem that
/// cannot allocate ahead) none is made.
pub(super) fn keep(dir: &Path) {
    let path = dir.join(ROOM_FILE);
    if std::fs::metadata(&path).is_ok_and(|m| m.blocks() * 512 >= ROOM) {
        return;
    }
    let tmp = dir.join(format!(".{ROOM_FILE}.tmp"));
    let made = File::create(&tmp).and_then(|f| {
        nix::fcntl::fallocate(
            f.as_fd(),
            nix::fcntl::FallocateFlags::empty(),
            0,
            ROOM as i64,
        )?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        File::open(dir)?.sync_all()
    });
    if let Err(e) = made {
        let _ = std::fs::remove_file(&tmp);
        tracing::debug!(dir = %dir.display(), error = %e, "no room kept for a new boot's records");
    }
}

/// Runs `f`, and when it fails for want of room on the disk, gives up the
/// room of the replica in `dir` (committed, so that its blocks are free)
/// and runs it once more. `what` names the work in the log.
pub(super) fn or_given_up<T>(
    dir: &Path,
    what: &str,
    mut f: impl FnMut() -> Result<T, ReplicaError>,
) -> Result<T, ReplicaError> {
    match f() {
        Err(e) if e.is_no_space() && give_up(dir) => {
            tracing::warn!(dir = %dir.display(), error = %e,
                "no room on the disk to {what}: the room the replica kept for it given up (made again at an open with room)");
            f()
        }
        done => done,
    }
}

/// Removes the room, its blocks freed once the directory's change is
/// committed; whether there was one.
fn give_up(dir: &Path) -> bool {
    if std::fs::remove_file(dir.join(ROOM_FILE)).is_err() {
        return false;
    }
    let _ = File::open(dir).and_then(|d| d.sync_all());
    true
}
