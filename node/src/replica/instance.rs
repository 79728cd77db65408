//! Which page cache a replica's unsynced state lived in: the boot of the
//! machine. A replica's checksums and write log are mapped into memory
//! and made durable at flushes (the checksums at most once per interval
//! of the dirty regions), while its data may reach the disk at
//! any time before (its early writeback, the kernel's own). After a
//! process dies, the page cache still holds all three as they were; after
//! a power cut or a crash of the kernel (a new boot), what the disk kept
//! of each is anyone's guess. `Replica::open` compares the boot it
//! records in the revision file with this one to tell the two apart.
//!
//! The boot, not the mount: a node plugin restarted in a new container
//! sees its disks through new mounts of the same filesystems, whose page
//! cache lived on. A disk let go and mounted again within one boot (its
//! cache lost without a new boot) is not told apart.
//!
//! It reads only the kernel's answer; it writes nothing.

/// The boot's id; all zeros when unknown.
pub type Instance = [u8; 16];

/// The boot this process runs in: `/proc/sys/kernel/random/boot_id`, a
/// UUID new at every boot.
pub fn here() -> Instance {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .and_then(|text| uuid::Uuid::parse_str(text.trim()).ok())
        .map(|id| *id.as_bytes())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_boot_is_known_and_the_same_each_time() {
        let a = here();
        assert_ne!(a, [0u8; 16], "the boot id is read");
        assert_eq!(a, here());
    }
}
