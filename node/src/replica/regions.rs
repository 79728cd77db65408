//! The head's dirty regions: which parts of the volume may hold data that
//! no flush covered. A power cut loses the page cache, and with it the
//! checksums and write-log entries of unflushed writes whose data may
//! have reached the disk anyway, so a new boot must check those blocks
//! (`Replica::repair_head_sums`). Which blocks those are is kept here, so
//! that it checks them rather than the whole head.
//!
//! The volume is cut into regions of `REGION` bytes, one bit each in the
//! file `dirty-regions`. A region's bit is written and synced before the
//! first write into it since it was last cleared: set on the disk before
//! any of that write's data can reach it (the kernel writes a head's pages
//! back whenever it likes). At each flush, once every write is durable,
//! the regions no write touched since the flush before are cleared (not
//! synced: a clear lost to a cut only costs a check), so that a region
//! written all the time stays set and costs no sync per flush.
//!
//! A missing file (a replica from before it existed, or a crash before
//! its first write) counts every region as dirty. It owns only the file;
//! what a region holds and how it is checked is the replica's.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::{BLOCK, ReplicaError, meta};

/// Bytes of the volume per bit.
pub const REGION: u64 = 16 << 20;

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
    /// Whether the file existed when read: if not, every region is dirty
    /// until the first mark writes them all set.
    known: bool,
    /// Whether this is the replica's owner (`own`), whose flushes clear
    /// regions; a view of a replica another holds clears nothing.
    owned: bool,
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
            owned: false,
        }
    }

    /// The file of a new replica of `size` bytes: every region clean.
    pub(super) fn create(dir: &Path, size: u64) -> Result<(), ReplicaError> {
        let bytes = size.div_ceil(REGION).div_ceil(8);
        meta::write_durably(dir, REGIONS_FILE, &vec![0u8; bytes as usize])
    }

    /// Taken by the replica's owner: its flushes clear regions. Its first
    /// flush clears every region it did not write, which is sound: a flush
    /// syncs the head's file whole, whoever wrote it before.
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
        for i in r0..r1 {
            set(&mut self.touched, i, true);
            if !get(&self.on_disk, i) {
                set(&mut self.on_disk, i, true);
                let at = (i / 8) as usize;
                changed = Some(changed.map_or((at, at), |(a, b)| (a.min(at), b.max(at))));
            }
        }
        match changed {
            Some((a, b)) => self.write(a, b, true),
            None => Ok(()),
        }
    }

    /// After a flush made every write so far durable: the regions no write
    /// touched since the flush before are cleared (written, not synced).
    pub(super) fn flushed(&mut self) -> Result<(), ReplicaError> {
        if !self.owned {
            return Ok(());
        }
        let mut changed: Option<(usize, usize)> = None;
        for (at, byte) in self.on_disk.iter_mut().enumerate() {
            let keep = *byte & self.touched.get(at).copied().unwrap_or(0);
            if keep != *byte {
                *byte = keep;
                changed = Some(changed.map_or((at, at), |(a, _)| (a, at)));
            }
        }
        self.touched.clear();
        match changed {
            Some((a, b)) => self.write(a, b, false),
            None => Ok(()),
        }
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

    const BLOCKS: u64 = 10 * BLOCKS_PER_REGION;

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
    fn a_region_is_set_on_the_disk_at_its_first_write_and_cleared_after_a_flush_interval_without_one()
     {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(REGIONS_FILE), []).unwrap();
        let mut r = DirtyRegions::read(dir.path());
        r.own();
        assert_eq!(r.dirty_runs(BLOCKS), Some(vec![]));
        let on_disk = || DirtyRegions::read(dir.path()).dirty_runs(BLOCKS).unwrap();
        // A write over the end of region 2 and the start of region 3, and
        // one in region 7.
        r.mark(3 * BLOCKS_PER_REGION - 1, 3 * BLOCKS_PER_REGION + 1, BLOCKS)
            .unwrap();
        r.mark(7 * BLOCKS_PER_REGION + 5, 7 * BLOCKS_PER_REGION + 6, BLOCKS)
            .unwrap();
        let set = vec![
            (2 * BLOCKS_PER_REGION, 4 * BLOCKS_PER_REGION),
            (7 * BLOCKS_PER_REGION, 8 * BLOCKS_PER_REGION),
        ];
        assert_eq!(on_disk(), set);
        // Written in this interval: kept at its flush.
        r.flushed().unwrap();
        assert_eq!(on_disk(), set);
        // Region 7 written again, the others not: they go at the next.
        r.mark(7 * BLOCKS_PER_REGION, 7 * BLOCKS_PER_REGION + 1, BLOCKS)
            .unwrap();
        r.flushed().unwrap();
        assert_eq!(
            on_disk(),
            vec![(7 * BLOCKS_PER_REGION, 8 * BLOCKS_PER_REGION)]
        );
        r.flushed().unwrap();
        assert_eq!(on_disk(), vec![]);

        // A view of the replica clears nothing.
        r.mark(0, 1, BLOCKS).unwrap();
        let mut view = DirtyRegions::read(dir.path());
        view.flushed().unwrap();
        view.flushed().unwrap();
        assert_eq!(on_disk(), vec![(0, BLOCKS_PER_REGION)]);
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
