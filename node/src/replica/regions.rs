//! The head's dirty regions: which parts of the volume may hold data whose
//! checksums the disk may lack. A power cut loses the page cache, and with
//! it the checksums and write-log entries of unflushed writes whose data
//! may have reached the disk anyway (and the checksums of flushed writes
//! not synced yet, below), so a new boot must check those blocks
//! (`Replica::repair_head_sums`). Which blocks those are is kept here, so
//! that it checks them rather than the whole head.
//!
//! The volume is cut into regions of `REGION` bytes, one bit each in the
//! file `dirty-regions`. A region's bit is written and synced before the
//! first write into it since it was last cleared: set on the disk before
//! any of that write's data can reach it (the kernel writes a head's pages
//! back whenever it likes). A sync is a flush of the disk's cache, which
//! under a stream of writes waits for what the disk has in flight (some
//! 6 ms here), so a mark sets the rest of its group after it too (`GROUP`
//! regions, 256 MiB, aligned; one sync). Bits are cleared one region at a
//! time: at a flush, once every write is durable, a region no write
//! touched over the last `IDLE_FLUSHES` flush intervals is cleared (not
//! synced: a clear lost to a cut only costs a check). A region written
//! all the time stays set, and one the writes have just left is not set
//! again by the next mark of its group.
//!
//! The head's checksums are synced at a flush that ends an interval, and
//! so before any region is cleared (`Replica::flush`): the blocks of a
//! region set may hold flushed writes whose checksums the disk lacks.
//!
//! A flush interval lasts at least `INTERVAL`: flushes closer than that to
//! the last one counted count with it. A database that flushes after each
//! of its random writes would otherwise find most regions cleared a few
//! writes after it left them, and pay a mark's sync on nearly every write
//! (5,720 marks for 6,000 such writes over 8 GiB, a quarter of a
//! millisecond each here); a region now stays set for `IDLE_FLUSHES`
//! intervals of `INTERVAL` at least after its last write.
//!
//! A missing file (a replica from before it existed, or a crash before
//! its first write) counts every region as dirty. It owns only the file;
//! what a region holds and how it is checked is the replica's.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{BLOCK, ReplicaError, meta};

/// Bytes of the volume per bit.
pub const REGION: u64 = 1 << 20;

/// Regions set together by one mark (whole groups, aligned).
const GROUP: u64 = 256;

/// Flush intervals a region must go without a write to be cleared.
pub const IDLE_FLUSHES: u8 = 4;

/// The shortest flush interval counted towards a region's idleness.
pub const INTERVAL: Duration = Duration::from_millis(500);

pub(super) const REGIONS_FILE: &str = "dirty-regions";

const BLOCKS_PER_REGION: u64 = REGION / BLOCK;

pub(super) struct DirtyRegions {
    dir: PathBuf,
    /// Opened for writing at the first mark (a view never writes).
    file: Option<File>,
    /// The bits as the file has them, one per region.
    on_disk: Vec<u8>,
    /// The regions written since the last flush.
    touched: Vec<u8>,
    /// For each region set, the flushes since it was last written or set.
    idle: Vec<u8>,
    /// Whether the file existed when read: if not, every region is dirty
    /// until the first mark writes them all set.
    known: bool,
    /// Whether this is the replica's owner (`own`), whose flushes clear
    /// regions; a view of a replica another holds clears nothing.
    owned: bool,
    /// When the last flush counted as the end of an interval.
    counted: Option<Instant>,
    /// The shortest interval (`INTERVAL` unless set).
    interval: Duration,
}

fn get(bits: &[u8], i: u64) -> bool {
    bits.get((i / 8) as usize)
        .is_some_and(|b| b & (1 << (i % 8)) != 0)
}

fn set(bits: &mut Vec<u8>, i: u64, on: bool) {
    let at = (i / 8) as usize;
    if bits.len() <= at {
        bits.resize(at + 1, 0);
    }
    if on {
        bits[at] |= 1 << (i % 8);
    } else {
        bits[at] &= !(1 << (i % 8));
    }
}

impl DirtyRegions {
    /// The regions as the file in `dir` records them.
    pub(super) fn read(dir: &Path) -> DirtyRegions {
        let read = std::fs::read(dir.join(REGIONS_FILE));
        DirtyRegions {
            dir: dir.to_path_buf(),
            file: None,
            known: read.is_ok(),
            on_disk: read.unwrap_or_default(),
            touched: Vec::new(),
            idle: Vec::new(),
            owned: false,
            counted: None,
            interval: INTERVAL,
        }
    }

    /// The file of a new replica of `size` bytes: every region clean.
    pub(super) fn create(dir: &Path, size: u64) -> Result<(), ReplicaError> {
        let bytes = size.div_ceil(REGION).div_ceil(8);
        meta::write_durably(dir, REGIONS_FILE, &vec![0u8; bytes as usize])
    }

    /// Room in the file for the bits of a volume grown to `size` bytes,
    /// zeros allocated now (the new regions hold nothing yet), so that a
    /// mark there needs no room on a full disk. Without a file, nothing:
    /// the first mark writes it whole.
    pub(super) fn room_for(&mut self, size: u64) -> Result<(), ReplicaError> {
        let bytes = size.div_ceil(REGION).div_ceil(8) as usize;
        if !self.known || self.on_disk.len() >= bytes {
            return Ok(());
        }
        let from = self.on_disk.len();
        self.on_disk.resize(bytes, 0);
        self.write(from, bytes - 1, true)
    }

    /// Sets the shortest interval (for tests that need every flush after
    /// the first to fall within one).
    pub(super) fn set_interval(&mut self, interval: Duration) {
        self.interval = interval;
    }

    /// Taken by the replica's owner: its flushes clear regions. They count
    /// a region it has not written as idle from its open, which is sound:
    /// a flush syncs the head's file whole, whoever wrote it before.
    pub(super) fn own(&mut self) {
        self.owned = true;
    }

    /// The block ranges of the regions that may hold unflushed data, of a
    /// volume of `blocks` blocks, in order; `None` when every region must
    /// count as dirty (no file).
    pub(super) fn dirty_runs(&self, blocks: u64) -> Option<Vec<(u64, u64)>> {
        if !self.known {
            return None;
        }
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for i in 0..blocks.div_ceil(BLOCKS_PER_REGION) {
            if !get(&self.on_disk, i) {
                continue;
            }
            let (first, last) = (
                i * BLOCKS_PER_REGION,
                ((i + 1) * BLOCKS_PER_REGION).min(blocks),
            );
            match runs.last_mut() {
                Some((_, end)) if *end == first => *end = last,
                _ => runs.push((first, last)),
            }
        }
        Some(runs)
    }

    /// Before blocks `first..last` of a volume of `blocks` blocks are
    /// written: their regions set on the disk, durably, where they are not.
    pub(super) fn mark(&mut self, first: u64, last: u64, blocks: u64) -> Result<(), ReplicaError> {
        if !self.known {
            // Every region set, durably, before the first write relies on
            // the file.
            let all = blocks.div_ceil(BLOCKS_PER_REGION);
            let mut bits = Vec::new();
            for i in 0..all {
                set(&mut bits, i, true);
            }
            meta::write_durably(&self.dir, REGIONS_FILE, &bits)?;
            self.on_disk = bits;
            self.known = true;
        }
        let (r0, r1) = (first / BLOCKS_PER_REGION, last.div_ceil(BLOCKS_PER_REGION));
        let mut changed: Option<(usize, usize)> = None;
        let mut newly = Vec::new();
        for i in r0..r1 {
            set(&mut self.touched, i, true);
            if get(&self.on_disk, i) {
                continue;
            }
            // With the rest of its group after it, so that the writes
            // that follow find their regions set (not the regions before
            // it, which the writes may have left and a flush cleared).
            let end = (i / GROUP + 1) * GROUP;
            for j in i..end.min(blocks.div_ceil(BLOCKS_PER_REGION)).max(i + 1) {
                if !get(&self.on_disk, j) {
                    set(&mut self.on_disk, j, true);
                    newly.push(j);
                    self.idle_of(j, 0);
                    let at = (j / 8) as usize;
                    changed = Some(changed.map_or((at, at), |(a, b)| (a.min(at), b.max(at))));
                }
            }
        }
        let Some((a, b)) = changed else {
            return Ok(());
        };
        let written = self.write(a, b, true);
        if written.is_err() {
            // Not on the disk: the next write there marks them again.
            for j in newly {
                set(&mut self.on_disk, j, false);
            }
        }
        written
    }

    /// After a flush made every write so far durable, at `now`: the regions
    /// no write touched over the last `IDLE_FLUSHES` flush intervals are
    /// cleared (written, not synced). A flush within `INTERVAL` of the last
    /// one counted ends no interval: what was written since counts in the
    /// next.
    pub(super) fn flushed(&mut self, now: Instant) -> Result<(), ReplicaError> {
        if !self.owned || !self.ends_interval(now) {
            return Ok(());
        }
        self.counted = Some(now);
        let mut changed: Option<(usize, usize)> = None;
        for at in 0..self.on_disk.len() {
            if self.on_disk[at] == 0 {
                continue;
            }
            for i in at as u64 * 8..at as u64 * 8 + 8 {
                if !get(&self.on_disk, i) {
                    continue;
                }
                let idle = if get(&self.touched, i) {
                    0
                } else {
                    self.idle
                        .get(i as usize)
                        .copied()
                        .unwrap_or(0)
                        .saturating_add(1)
                };
                self.idle_of(i, idle);
                if idle >= IDLE_FLUSHES {
                    set(&mut self.on_disk, i, false);
                    changed = Some(changed.map_or((at, at), |(a, _)| (a, at)));
                }
            }
        }
        self.touched.clear();
        match changed {
            Some((a, b)) => self.write(a, b, false),
            None => Ok(()),
        }
    }

    /// Whether a flush at `now` ends an interval, and so may clear
    /// regions: the checksums of their blocks must be durable before it
    /// does. Always for a view, which clears nothing but keeps nothing
    /// back either.
    pub(super) fn ends_interval(&self, now: Instant) -> bool {
        !self.owned
            || self
                .counted
                .is_none_or(|at| now.saturating_duration_since(at) >= self.interval)
    }

    fn idle_of(&mut self, i: u64, n: u8) {
        let i = i as usize;
        if self.idle.len() <= i {
            self.idle.resize(i + 1, 0);
        }
        self.idle[i] = n;
    }

    /// Writes bytes `a..=b` of the bits to the file (synced with `sync`).
    fn write(&mut self, a: usize, b: usize, sync: bool) -> Result<(), ReplicaError> {
        let path = self.dir.join(REGIONS_FILE);
        let io = |e| ReplicaError::io(&path, e);
        if self.file.is_none() {
            let f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(io)?;
            self.file = Some(f);
        }
        if let Some(f) = &self.file {
            f.write_all_at(&self.on_disk[a..=b], a as u64).map_err(io)?;
            if sync {
                f.sync_data().map_err(io)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOCKS: u64 = (2 * GROUP + 8) * BLOCKS_PER_REGION;

    /// The time of the next flush, an interval after the last.
    fn later(clock: &mut Instant) -> Instant {
        *clock += INTERVAL;
        *clock
    }

    #[test]
    fn a_missing_file_counts_every_region_dirty_until_the_first_mark_sets_them_all() {
        let dir = tempfile::tempdir().unwrap();
        let r = DirtyRegions::read(dir.path());
        assert_eq!(r.dirty_runs(BLOCKS), None);
        let mut r = r;
        r.mark(0, 1, BLOCKS).unwrap();
        let again = DirtyRegions::read(dir.path());
        assert_eq!(again.dirty_runs(BLOCKS), Some(vec![(0, BLOCKS)]));
    }

    #[test]
    fn a_mark_sets_its_region_and_the_rest_of_its_group_and_a_region_idle_for_some_flushes_is_cleared()
     {
        let dir = tempfile::tempdir().unwrap();
        DirtyRegions::create(dir.path(), BLOCKS * BLOCK).unwrap();
        let mut r = DirtyRegions::read(dir.path());
        r.own();
        let clock = &mut Instant::now();
        assert_eq!(r.dirty_runs(BLOCKS), Some(vec![]));
        let on_disk = || DirtyRegions::read(dir.path()).dirty_runs(BLOCKS).unwrap();
        let region = |i: u64| i * BLOCKS_PER_REGION;
        // A write over the end of region 2 and the start of region 3 sets
        // regions 2 to the end of the first group; one in the fifth region
        // of the second group (g4) sets g4 to the end of that group.
        r.mark(region(3) - 1, region(3) + 1, BLOCKS).unwrap();
        r.mark(region(GROUP + 4) + 5, region(GROUP + 4) + 6, BLOCKS)
            .unwrap();
        assert_eq!(
            on_disk(),
            vec![
                (region(2), region(GROUP)),
                (region(GROUP + 4), region(2 * GROUP))
            ]
        );
        // Region g4 written in every flush interval, 2 and 3 in the first
        // only: the others go once idle for IDLE_FLUSHES flushes, 2 and 3
        // one flush later, g4 never.
        r.flushed(later(clock)).unwrap();
        for _ in 1..IDLE_FLUSHES {
            assert_eq!(on_disk().len(), 2, "not idle long enough yet");
            r.mark(region(GROUP + 4), region(GROUP + 4) + 1, BLOCKS)
                .unwrap();
            r.flushed(later(clock)).unwrap();
        }
        assert_eq!(
            on_disk(),
            vec![
                (region(2), region(4)),
                (region(GROUP + 4), region(GROUP + 5))
            ]
        );
        r.mark(region(GROUP + 4), region(GROUP + 4) + 1, BLOCKS)
            .unwrap();
        r.flushed(later(clock)).unwrap();
        assert_eq!(on_disk(), vec![(region(GROUP + 4), region(GROUP + 5))]);
        // A write into region 2 again sets 2 to the group's end again,
        // not 0 or 1.
        r.mark(region(2), region(2) + 1, BLOCKS).unwrap();
        assert_eq!(
            on_disk(),
            vec![
                (region(2), region(GROUP)),
                (region(GROUP + 4), region(GROUP + 5))
            ]
        );
        for _ in 0..=IDLE_FLUSHES {
            r.flushed(later(clock)).unwrap();
        }
        assert_eq!(on_disk(), vec![]);

        // A view of the replica clears nothing.
        r.mark(0, 1, BLOCKS).unwrap();
        let mut view = DirtyRegions::read(dir.path());
        for _ in 0..=IDLE_FLUSHES {
            view.flushed(later(clock)).unwrap();
        }
        assert_eq!(on_disk(), vec![(0, region(GROUP))]);
    }

    #[test]
    fn flushes_closer_than_an_interval_count_as_one() {
        let dir = tempfile::tempdir().unwrap();
        DirtyRegions::create(dir.path(), BLOCKS * BLOCK).unwrap();
        let mut r = DirtyRegions::read(dir.path());
        r.own();
        let on_disk = || DirtyRegions::read(dir.path()).dirty_runs(BLOCKS).unwrap();
        let start = Instant::now();
        r.mark(0, 1, BLOCKS).unwrap();
        // Many flushes within one interval, as a writer that flushes after
        // each write makes them: the region is not idle yet.
        for k in 0..4 * u32::from(IDLE_FLUSHES) {
            r.flushed(start + INTERVAL / 8 * (k % 8)).unwrap();
        }
        let mut clock = start;
        for _ in 1..IDLE_FLUSHES {
            r.flushed(later(&mut clock)).unwrap();
            r.flushed(clock + INTERVAL / 2).unwrap();
        }
        // The rest of the group, never written, went one interval sooner.
        assert_eq!(
            on_disk(),
            vec![(0, BLOCKS_PER_REGION)],
            "region 0 idle for fewer than IDLE_FLUSHES intervals"
        );
        r.flushed(later(&mut clock)).unwrap();
        assert_eq!(on_disk(), vec![]);
    }

    #[test]
    fn a_mark_that_did_not_reach_the_disk_is_made_again_by_the_next_write() {
        let dir = tempfile::tempdir().unwrap();
        DirtyRegions::create(dir.path(), BLOCKS * BLOCK).unwrap();
        let mut r = DirtyRegions::read(dir.path());
        r.own();
        // The file cannot be opened (a directory in its place).
        let path = dir.path().join(REGIONS_FILE);
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        assert!(r.mark(0, 1, BLOCKS).is_err());
        std::fs::remove_dir(&path).unwrap();
        DirtyRegions::create(dir.path(), BLOCKS * BLOCK).unwrap();
        r.mark(0, 1, BLOCKS).unwrap();
        assert_eq!(
            DirtyRegions::read(dir.path()).dirty_runs(BLOCKS),
            Some(vec![(0, GROUP * BLOCKS_PER_REGION)])
        );
    }

    #[test]
    fn a_grown_volume_has_room_for_its_new_regions_and_they_are_clean() {
        let dir = tempfile::tempdir().unwrap();
        DirtyRegions::create(dir.path(), BLOCKS * BLOCK).unwrap();
        let mut r = DirtyRegions::read(dir.path());
        r.own();
        r.mark(0, 1, BLOCKS).unwrap();
        let grown = 4 * BLOCKS;
        r.room_for(grown * BLOCK).unwrap();
        let file = std::fs::metadata(dir.path().join(REGIONS_FILE)).unwrap();
        assert_eq!(file.len(), grown.div_ceil(BLOCKS_PER_REGION).div_ceil(8));
        assert_eq!(
            DirtyRegions::read(dir.path()).dirty_runs(grown),
            Some(vec![(0, GROUP * BLOCKS_PER_REGION)]),
            "the regions set stay set, the new ones are clean"
        );
    }

    #[test]
    fn the_last_region_of_a_volume_not_a_multiple_of_a_region_ends_with_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(REGIONS_FILE), []).unwrap();
        let mut r = DirtyRegions::read(dir.path());
        let blocks = 2 * BLOCKS_PER_REGION + 3;
        r.mark(blocks - 1, blocks, blocks).unwrap();
        assert_eq!(
            DirtyRegions::read(dir.path()).dirty_runs(blocks),
            Some(vec![(2 * BLOCKS_PER_REGION, blocks)])
        );
    }
}
