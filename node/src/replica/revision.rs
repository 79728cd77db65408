//! The live revision counter of a replica, and its write log: the file
//! `revision`, mapped into memory, so that recording each write is a store
//! rather than a system call. The mapping is shared, so what it holds is in
//! the page cache like the data it describes (it survives the process), and
//! it is made durable with the data at a flush that ends an interval of the
//! dirty regions (`Replica::flush` says why not at every flush), at a clean
//! close and at a snapshot.
//!
//! Layout: bytes 0..8 the revision of the last write; 8..16 the revision
//! of the last flush (when they differ at open, the replica was not closed
//! cleanly: the writes in between may be half done); 16..32 the boot its
//! owner last opened it in (`instance`), durable from that open; 32..40
//! the clean-close mark: the revision it was closed at, plus one, when its
//! owner closed it with everything durable and nothing left to write
//! (`Replica::close_clean`), else 0, cleared durably by the next owner's
//! open before any write; 40..48 the first revision the ring may be asked about
//! (`since`), raised when a power cut may have lost its entries; 48..56
//! the mark that the head's checksums are synced at every flush
//! ([`SUMS_EVERY_FLUSH`] while they are, else 0; `Replica::set_sums_every_flush`),
//! set durably after a sync of them and cleared durably before the first
//! flush without one, so that a new boot that finds it may take the
//! disk's checksum of a block as its state at the last flush or later; from byte
//! [`LOG_START`], a ring of [`LOG_ENTRIES`] entries of 32 bytes — revision,
//! offset, length (u64 each) and the op — where each write records its
//! intent (slot `revision % LOG_ENTRIES`) before its data goes to the
//! layer. After a crash the ring tells which ranges may differ between two
//! replicas of one volume (`since`), so that the engine makes them equal by
//! copying those ranges only. A file from before the ring (8 bytes) grows
//! into one with an empty ring.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::MmapMut;

use super::ReplicaError;

/// Where the ring starts in the file.
pub const LOG_START: usize = 64;
/// Where the header keeps the boot the replica was last opened in.
const OPENED_IN: usize = 16;
/// Where the header keeps the clean-close mark.
const CLOSED_CLEAN: usize = 32;
/// Where the header keeps the first revision the ring may be asked about.
const LOG_FROM: usize = 40;
/// Where the header keeps the mark that the checksums are synced at every
/// flush.
const EVERY_FLUSH: usize = 48;
/// The mark's value: a word that bytes gone bad do not make by chance (a
/// mark read where none was set would trust checksums a flush left
/// behind).
pub const SUMS_EVERY_FLUSH: u64 = u64::from_le_bytes(*b"SUMSSYNC");
/// Entries in the ring: more than the writes an engine has in flight at
/// once, by far.
pub const LOG_ENTRIES: u64 = 4096;
const ENTRY: usize = 32;
const FILE_LEN: usize = LOG_START + LOG_ENTRIES as usize * ENTRY;
/// Past any revision a replica reaches (a write a nanosecond would take
/// three centuries to get there): a file that holds a higher one, as its
/// last write or its last flush, is corrupt, and is never counted on
/// (the next revision would not fit).
pub const MAX_REVISION: u64 = 1 << 63;

/// What a logged write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogOp {
    Write,
    Trim,
}

/// One write intent of the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LogEntry {
    pub revision: u64,
    pub op: LogOp,
    pub offset: u64,
    pub len: u64,
}

pub struct RevisionCounter {
    path: PathBuf,
    file: File,
    map: MmapMut,
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

impl RevisionCounter {
    /// Opens (or creates) the counter at `path`; returns it and the value
    /// it holds.
    pub fn open(path: &Path) -> Result<(RevisionCounter, u64), ReplicaError> {
        let io = |e| ReplicaError::io(path, e);
        let file = super::open_or_create(path)?;
        let mut buf = [0u8; 8];
        let stored = match file.read_exact_at(&mut buf, 0) {
            Ok(()) => u64::from_le_bytes(buf),
            Err(_) => 0,
        };
        let mut flush = [0u8; 8];
        let flushed = match file.read_exact_at(&mut flush, 8) {
            Ok(()) => u64::from_le_bytes(flush),
            Err(_) => 0,
        };
        if stored > MAX_REVISION || flushed > MAX_REVISION {
            return Err(ReplicaError::Corrupt(format!(
                "{}: its last write's revision ({stored}) or its last flush's ({flushed}) is past any a replica reaches ({MAX_REVISION}): the file is corrupt",
                path.display()
            )));
        }
        if (file.metadata().map_err(io)?.len() as usize) < FILE_LEN {
            file.set_len(FILE_LEN as u64).map_err(io)?;
        }
        // The file holds every page of the mapping before any store: a
        // store into a page it lacks would allocate it then, and on a full
        // disk that fault kills the process (SIGBUS). Here a full disk
        // fails the open instead (a file written whole needs nothing new).
        nix::fcntl::fallocate(
            std::os::fd::AsFd::as_fd(&file),
            nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE,
            0,
            FILE_LEN as i64,
        )
        .map_err(|e| io(std::io::Error::from(e)))?;
        // SAFETY: the file belongs to this replica's directory and is only
        // mapped and written here; nothing truncates it while it is open.
        let map =
            unsafe { memmap2::MmapOptions::new().len(FILE_LEN).map_mut(&file) }.map_err(io)?;
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

    /// The flush mark, bytes 8..16 of the mapping: an atomic, so that
    /// flushes (which share the replica) may set it together.
    fn flush_mark(&self) -> &AtomicU64 {
        // SAFETY: the mapping is page aligned and at least LOG_START bytes
        // long, so bytes 8..16 are an aligned u64 that lives as long as
        // `self`; it is only ever accessed through this atomic.
        unsafe { &*(self.map.as_ptr().add(8) as *const AtomicU64) }
    }

    /// The revision of the last flush.
    pub fn flushed(&self) -> u64 {
        u64::from_le(self.flush_mark().load(Ordering::Acquire))
    }

    /// Records that every write up to `revision` is durable (made durable
    /// itself by the `sync` that follows); never moves back.
    pub fn mark_flushed(&self, revision: u64) {
        self.flush_mark()
            .fetch_max(revision.to_le(), Ordering::AcqRel);
    }

    /// The boot the replica was last opened in (`instance::here`), or
    /// zeros.
    pub fn opened_in(&self) -> super::instance::Instance {
        let mut id = [0u8; 16];
        id.copy_from_slice(&self.map[OPENED_IN..OPENED_IN + 16]);
        id
    }

    /// Records the boot the replica is opened in (durable at the next
    /// `sync`).
    pub fn set_opened_in(&mut self, id: &super::instance::Instance) {
        self.map[OPENED_IN..OPENED_IN + 16].copy_from_slice(id);
    }

    /// Whether the replica's owner closed it at `revision` with every
    /// write, checksum and log entry durable (the mark `mark_closed_clean`
    /// made, not cleared since).
    pub fn closed_clean_at(&self, revision: u64) -> bool {
        u64_at(&self.map, CLOSED_CLEAN) == revision.wrapping_add(1) && self.flushed() == revision
    }

    /// Marks the replica closed clean at `revision` (durable at the next
    /// `sync`); the caller has made everything before it durable.
    pub fn mark_closed_clean(&mut self, revision: u64) {
        self.map[CLOSED_CLEAN..CLOSED_CLEAN + 8]
            .copy_from_slice(&revision.wrapping_add(1).to_le_bytes());
    }

    /// Clears the clean-close mark (durable at the next `sync`, which must
    /// come before any write).
    pub fn clear_closed_clean(&mut self) {
        self.map[CLOSED_CLEAN..CLOSED_CLEAN + 8].fill(0);
    }

    /// Whether a clean-close mark is set (whatever revision it names).
    pub fn has_clean_mark(&self) -> bool {
        u64_at(&self.map, CLOSED_CLEAN) != 0
    }

    /// Whether the head's checksums were synced at every flush since the
    /// mark was set (`set_sums_every_flush`).
    pub fn sums_every_flush(&self) -> bool {
        u64::from_le(self.every_flush_mark().load(Ordering::Acquire)) == SUMS_EVERY_FLUSH
    }

    /// Sets or clears the mark that the head's checksums are synced at
    /// every flush (durable at the next `sync`). Set it only once they are
    /// synced; clear it, durably, before the first flush that leaves them.
    pub fn set_sums_every_flush(&mut self, on: bool) {
        let word = if on { SUMS_EVERY_FLUSH } else { 0 };
        self.every_flush_mark()
            .store(word.to_le(), Ordering::Release);
    }

    /// The mark, bytes 48..56 of the mapping: an atomic, since another
    /// instance of the replica (its server's and its engine's share the
    /// file's pages) may read it while this one sets it.
    fn every_flush_mark(&self) -> &AtomicU64 {
        // SAFETY: as `flush_mark`: the mapping is page aligned and at least
        // LOG_START bytes long, so bytes 48..56 are an aligned u64 that
        // lives as long as `self`, only ever accessed through this atomic.
        unsafe { &*(self.map.as_ptr().add(EVERY_FLUSH) as *const AtomicU64) }
    }

    /// The ring cannot tell what came after any revision below `revision`
    /// (durable at the next `sync`): a power cut may have lost entries of
    /// writes that reached the data.
    pub fn forget_log_before(&mut self, revision: u64) {
        self.map[LOG_FROM..LOG_FROM + 8].copy_from_slice(&revision.to_le_bytes());
    }

    fn log_from(&self) -> u64 {
        u64_at(&self.map, LOG_FROM)
    }

    /// Records the intent of write `revision` (before its data is written).
    pub fn log(&mut self, revision: u64, op: LogOp, offset: u64, len: u64) {
        let at = LOG_START + (revision % LOG_ENTRIES) as usize * ENTRY;
        let e = &mut self.map[at..at + ENTRY];
        e[8..16].copy_from_slice(&offset.to_le_bytes());
        e[16..24].copy_from_slice(&len.to_le_bytes());
        e[24] = match op {
            LogOp::Write => 1,
            LogOp::Trim => 2,
        };
        // The revision last: a slot is whole once it names its revision.
        e[..8].copy_from_slice(&revision.to_le_bytes());
    }

    fn entry(&self, slot: u64) -> Option<LogEntry> {
        let at = LOG_START + slot as usize * ENTRY;
        let e = &self.map[at..at + ENTRY];
        let op = match e[24] {
            1 => LogOp::Write,
            2 => LogOp::Trim,
            _ => return None,
        };
        Some(LogEntry {
            revision: u64_at(e, 0),
            op,
            offset: u64_at(e, 8),
            len: u64_at(e, 16),
        })
    }

    /// Every logged write after revision `since`, in order: `since + 1`,
    /// `since + 2`, ... with none missing. None when the ring cannot say
    /// (it wrapped past `since`, holds a later entry after a gap, or may
    /// have lost entries after `since` to a power cut).
    pub fn since(&self, since: u64) -> Option<Vec<LogEntry>> {
        if since < self.log_from() {
            return None;
        }
        let mut out = Vec::new();
        let mut next = since.checked_add(1)?;
        while let Some(e) = self.entry(next % LOG_ENTRIES) {
            if e.revision != next {
                break;
            }
            out.push(e);
            next = next.checked_add(1)?;
        }
        let later = (0..LOG_ENTRIES)
            .filter_map(|s| self.entry(s))
            .any(|e| e.revision >= next);
        (!later).then_some(out)
    }

    /// Empties the ring (a replica that joined a rebuild starts a new
    /// history), which can then be asked about any revision.
    pub fn clear_log(&mut self) {
        self.map[LOG_START..].fill(0);
        self.forget_log_before(0);
    }

    /// Makes the stored value and the ring durable: one `fdatasync`. The
    /// mapping is shared, so a store into it dirties the page in the page
    /// cache (Linux write-protects a clean page and marks it dirty at the
    /// first store after its writeback), and `fdatasync` writes back every
    /// dirty page of the file. An `msync` before it would be a second
    /// flush of the disk's cache for nothing (`msync(MS_SYNC)` is itself an
    /// `fdatasync` of the mapped range).
    pub fn sync(&self) -> Result<(), ReplicaError> {
        self.file
            .sync_data()
            .map_err(|e| ReplicaError::io(&self.path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_lists_every_write_after_a_revision_or_says_it_cannot() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("revision");
        let (mut c, stored) = RevisionCounter::open(&path).unwrap();
        assert_eq!(stored, 0);
        assert_eq!(c.since(0), Some(vec![]), "nothing written yet");
        for r in 1..=10 {
            c.log(r, LogOp::Write, r * 4096, 4096);
            c.store(r);
        }
        c.log(11, LogOp::Trim, 0, 8192); // an intent whose write never ended
        let after7: Vec<u64> = c.since(7).unwrap().iter().map(|e| e.revision).collect();
        assert_eq!(after7, [8, 9, 10, 11]);
        assert_eq!(c.since(10).unwrap()[0].op, LogOp::Trim);
        drop(c);
        // It survives the process (it is in the file).
        let (c, stored) = RevisionCounter::open(&path).unwrap();
        assert_eq!(stored, 10);
        assert_eq!(c.since(9).unwrap().len(), 2);
        // A ring that wrapped past the asked revision cannot say.
        let (mut c, _) = RevisionCounter::open(&path).unwrap();
        for r in 12..=(LOG_ENTRIES + 20) {
            c.log(r, LogOp::Write, 0, 4096);
        }
        assert_eq!(c.since(7), None);
        assert_eq!(c.since(LOG_ENTRIES + 18).unwrap().len(), 2);
        c.clear_log();
        assert_eq!(c.since(LOG_ENTRIES + 18), Some(vec![]));
    }

    #[test]
    fn a_log_that_a_power_cut_may_have_cut_short_answers_nothing_before_it() {
        let d = tempfile::tempdir().unwrap();
        let (mut c, _) = RevisionCounter::open(&d.path().join("revision")).unwrap();
        for r in 1..=5 {
            c.log(r, LogOp::Write, r * 4096, 4096);
            c.store(r);
        }
        c.forget_log_before(6);
        assert_eq!(c.since(3), None);
        assert_eq!(c.since(5), None);
        c.log(6, LogOp::Write, 0, 4096);
        assert_eq!(c.since(6), Some(vec![]));
        c.sync().unwrap();
        drop(c);
        // It is in the file, and a new history asks about anything.
        let (mut c, stored) = RevisionCounter::open(&d.path().join("revision")).unwrap();
        assert_eq!(stored, 5);
        assert_eq!(c.since(5), None);
        c.clear_log();
        assert_eq!(c.since(0), Some(vec![]));
    }

    #[test]
    fn a_clean_mark_holds_only_at_its_revision_with_everything_flushed() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("revision");
        let (mut c, _) = RevisionCounter::open(&path).unwrap();
        assert!(
            !c.has_clean_mark() && !c.closed_clean_at(0),
            "a new file is not marked"
        );
        c.store(7);
        c.mark_flushed(7);
        c.mark_closed_clean(7);
        c.sync().unwrap();
        drop(c);
        let (mut c, stored) = RevisionCounter::open(&path).unwrap();
        assert!(c.has_clean_mark());
        assert!(c.closed_clean_at(stored), "it is in the file");
        assert!(
            !c.closed_clean_at(8),
            "another revision than the one closed at"
        );
        // A write after the mark (which no owner's open lets happen) moves
        // the revision past it: the mark no longer covers the replica.
        c.store(8);
        assert!(!c.closed_clean_at(8));
        c.clear_closed_clean();
        assert!(!c.has_clean_mark() && !c.closed_clean_at(7));
    }

    #[test]
    fn an_old_eight_byte_counter_grows_a_ring() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("revision");
        std::fs::write(&path, 42u64.to_le_bytes()).unwrap();
        let (c, stored) = RevisionCounter::open(&path).unwrap();
        assert_eq!(stored, 42);
        assert_eq!(c.since(42), Some(vec![]));
        assert_eq!(std::fs::metadata(&path).unwrap().len() as usize, FILE_LEN);
    }

    #[test]
    fn a_revision_past_any_a_replica_reaches_is_corrupt_and_the_log_never_overflows() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("revision");
        for (at, value) in [(0, MAX_REVISION + 1), (8, u64::MAX)] {
            let mut bytes = vec![0u8; FILE_LEN];
            bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
            std::fs::write(&path, &bytes).unwrap();
            let e = RevisionCounter::open(&path).err().expect("refused");
            assert!(matches!(e, ReplicaError::Corrupt(_)), "{e}");
            assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        }
        // At the bound it opens, and a ring asked past it cannot say.
        std::fs::write(&path, MAX_REVISION.to_le_bytes()).unwrap();
        let (mut c, stored) = RevisionCounter::open(&path).unwrap();
        assert_eq!(stored, MAX_REVISION);
        c.log(u64::MAX, LogOp::Write, u64::MAX, u64::MAX);
        assert_eq!(c.since(u64::MAX), None);
        assert_eq!(c.since(u64::MAX - 1).map(|l| l.len()), None);
    }

    #[test]
    fn the_guards_mark_is_its_word_alone_and_lasts_once_synced() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("revision");
        let (mut c, _) = RevisionCounter::open(&path).unwrap();
        assert!(!c.sums_every_flush(), "a new file: off");
        c.set_sums_every_flush(true);
        c.sync().unwrap();
        drop(c);
        let (mut c, _) = RevisionCounter::open(&path).unwrap();
        assert!(c.sums_every_flush(), "on after a reopen");
        c.set_sums_every_flush(false);
        c.sync().unwrap();
        drop(c);
        let (c, _) = RevisionCounter::open(&path).unwrap();
        assert!(!c.sums_every_flush(), "off after a reopen");
        drop(c);
        // Bytes gone bad there are not the mark: it is off, and the
        // checksums are not trusted.
        for word in [1u64, u64::MAX, SUMS_EVERY_FLUSH ^ 1] {
            let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            f.write_all_at(&word.to_le_bytes(), EVERY_FLUSH as u64)
                .unwrap();
            drop(f);
            let (c, _) = RevisionCounter::open(&path).unwrap();
            assert!(!c.sums_every_flush(), "{word:#x} is not the mark");
        }
    }
}
