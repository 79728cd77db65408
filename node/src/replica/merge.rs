//! Merging: folding a frozen layer that no snapshot needs into the frozen
//! layer above it, so that a chain does not grow with every rebuild and a
//! deleted snapshot gives its space back.
//!
//! The blocks the lower layer holds and the upper one lacks are copied
//! into the upper one, a chunk at a time; then the chain drops the lower
//! layer and its files go. What any read returns never changes: a block
//! copied up is the block a read found below it. The merge is recorded
//! in `meta.json` before it starts (`merging`), so that an open after a
//! crash finishes it: a block of the upper layer that fails its checksum
//! there can only be one the merge was writing, and is copied again. The
//! extra space a merge needs is at most the lower layer's data. The head
//! is never merged into (an engine writes it); a labelled layer is never
//! merged away. A block the lower layer lost (`Meta::lost`) and the upper
//! one lacks moves up as it is and is recorded lost there, so it fails its
//! reads as before; one the upper layer holds goes with the lower layer.
//! A block that fails its checksum as the merge copies it up (gone bad on
//! the disk since its write) moves up as it is too, with the checksum it
//! was written with, so that it fails its reads above as it did below and
//! another replica's copy with that checksum still mends it; the upper
//! layer is marked for it, and so is one of its own blocks that fails at
//! the merge's end. The merge ends either way: a merge that stopped at a
//! bad block left its journal for ever, and the layer it merged into
//! without a checksum, so the replica was never again a rebuild's source
//! (2026-12-06). Its caller is told (`merge_paced`), as for a scrub.
//!
//! A merge's end reads the whole upper layer for its checksum (each block
//! checked on the way) after making it durable: work of the layer's size,
//! done without the replica (`MergeEnd`), so that the volume's I/O, which
//! needs the replica for every write, goes on meanwhile. Until 2026-12-07
//! it was done under the replica's lock, and every write waited for it:
//! after a rebuild's merge, about a read of the whole volume.

use std::collections::BTreeSet;
use std::os::unix::fs::FileExt;

use super::{BLOCK, Layer, Mark, Replica, ReplicaError, checksum, sums};

/// A merge under way: `from` is being folded into `into`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MergeJournal {
    pub from: String,
    pub into: String,
}

/// The end of a merge, taken apart from the replica once every block was
/// copied (`Replica::merge_end`): a second handle on the upper layer, so
/// that making it durable and taking its checksum (`take`) need no lock
/// on the replica. The layer no longer changes by then: the volume's
/// writes go to the head, and a layer being merged into is given up
/// nothing (`losable`), scrubbed by no one and copied by no rebuild. Only
/// a join can end the merge meanwhile (it replaces the chain), or, were
/// two run at once, another merge: the end is then not recorded
/// (`Replica::record_merge_end`).
pub struct MergeEnd {
    j: MergeJournal,
    /// `Replica::epoch` when it was taken.
    began: u64,
    /// The upper layer: its file, a copy of its map, its table mapped
    /// again (read only, though mapped as the owner's).
    layer: Layer,
    /// Its blocks recorded lost: they fail their checksums by their nature.
    lost: BTreeSet<u64>,
}

/// What `MergeEnd::take` found of the upper layer.
pub struct MergeSum {
    /// Its checksum, in the chunked form.
    sum: String,
    /// Its blocks that failed their checksums (not those recorded lost).
    bad: Vec<u64>,
}

impl MergeEnd {
    /// Makes the upper layer durable and takes its checksum, checking each
    /// of its blocks on the way (one that fails is taken as it is, and
    /// marked when the end is recorded). Holds nothing of the replica.
    pub fn take(&self) -> Result<MergeSum, ReplicaError> {
        let l = &self.layer;
        l.file
            .sync_all()
            .map_err(|e| ReplicaError::io(&l.path, e))?;
        if let Some(s) = &l.sums {
            s.sync()?;
        }
        let mut bad = Vec::new();
        let sum = checksum::take(l, checksum::Form::Chunked, |b, chunk| {
            if let Some(s) = &l.sums {
                bad.extend(
                    s.failing(b, chunk)
                        .into_iter()
                        .filter(|x| !self.lost.contains(x)),
                );
            }
            Ok(())
        })?;
        Ok(MergeSum { sum, bad })
    }
}

/// What one step of a merge did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MergeStep {
    /// The block to go on from; None once every block was looked at.
    pub next: Option<u64>,
    /// Bytes copied into the upper layer.
    pub copied: u64,
    /// Blocks copied up that failed their checksums (each marked).
    pub bad: Vec<u64>,
}

impl Replica {
    /// Forgets the snapshot labels that `keep` does not name (snapshots
    /// deleted): their layers may then be merged. Returns the ids dropped.
    pub fn keep_snapshots(&mut self, keep: &[String]) -> Result<Vec<String>, ReplicaError> {
        self.check(0, 0)?;
        let dropped: Vec<String> = self
            .meta
            .snapshots
            .values()
            .filter(|id| !keep.contains(id))
            .cloned()
            .collect();
        if dropped.is_empty() {
            return Ok(dropped);
        }
        let mut meta = self.meta.clone();
        meta.snapshots.retain(|_, id| keep.contains(id));
        meta.write(&self.dir)?;
        self.meta = meta;
        Ok(dropped)
    }

    /// The merge to do next, if any: the oldest complete frozen layer
    /// without a snapshot label whose upper neighbour is a complete frozen
    /// layer too. None while layers are being filled or one is corrupt.
    pub fn next_merge(&self) -> Option<MergeJournal> {
        if let Some(j) = &self.meta.merging {
            return Some(j.clone());
        }
        if !self.meta.pending.is_empty() || !self.meta.block_sums || self.broken.is_some() {
            return None;
        }
        let chain = &self.meta.chain;
        let frozen = |n: &String| self.meta.frozen.contains_key(n) && !self.is_corrupt(n);
        chain
            .windows(2)
            .take(chain.len().saturating_sub(2))
            .find_map(|w| {
                let (from, into) = (&w[0], &w[1]);
                (frozen(from) && frozen(into) && !self.meta.snapshots.contains_key(from)).then(
                    || MergeJournal {
                        from: from.clone(),
                        into: into.clone(),
                    },
                )
            })
    }

    /// Records that `j` starts (crash-safely, before any block moves).
    /// The blocks the lower layer lost (`Meta::lost`) that the upper one
    /// lacks are recorded lost in the upper one in the same write: a read
    /// of one fails as lost before it moves up and after.
    pub fn begin_merge(&mut self, j: &MergeJournal) -> Result<(), ReplicaError> {
        self.check(0, 0)?;
        if self.meta.merging.as_ref() == Some(j) {
            return Ok(());
        }
        if self.next_merge().as_ref() != Some(j) {
            return Err(ReplicaError::Invalid(format!(
                "{} cannot be merged into {} now",
                j.from, j.into
            )));
        }
        let into = self.layer_at(&j.into)?;
        let mut meta = self.meta.clone();
        let carried: Vec<u64> = self
            .lost_of(&j.from)
            .iter()
            .copied()
            .filter(|b| !self.layers[into].map.get(*b))
            .collect();
        if !carried.is_empty() {
            meta.lost.entry(j.into.clone()).or_default().extend(carried);
        }
        meta.merging = Some(j.clone());
        meta.write(&self.dir)?;
        self.meta = meta;
        self.epoch += 1;
        Ok(())
    }

    /// Copies into the upper layer the blocks of the lower one in
    /// `at..at + blocks` that it lacks. With `recheck` (after a crash),
    /// an upper block the lower one also holds is read and copied again
    /// when it fails its checksum and the merge may have torn it
    /// (`torn_by_merge`; a block the upper layer records lost fails by its
    /// nature, and stays).
    /// A lost block moves up as it is, with a checksum that fails it, as a
    /// fill copies one.
    pub fn merge_some(
        &mut self,
        at: u64,
        blocks: u64,
        recheck: bool,
    ) -> Result<MergeStep, ReplicaError> {
        let j = self.merge_under_way()?;
        let (from, into) = (self.layer_at(&j.from)?, self.layer_at(&j.into)?);
        let total = self.meta.size / BLOCK;
        let end = at.saturating_add(blocks).min(total);
        // First what to copy, as runs of sound blocks, and lost ones each a
        // run of its own; then the copies.
        let (from_lost, into_lost) = (self.lost_of(&j.from), self.lost_of(&j.into));
        let mut runs: Vec<(u64, u64, bool)> = Vec::new();
        for b in at..end {
            if !self.layers[from].map.get(b) {
                continue;
            }
            if self.layers[into].map.get(b)
                && (!recheck
                    || into_lost.contains(&b)
                    || !self.torn_by_merge(from, into, b)
                    || self.block_sound(into, b)?)
            {
                continue;
            }
            let lost = from_lost.contains(&b);
            match runs.last_mut() {
                Some((_, e, false)) if *e == b && !lost => *e += 1,
                _ => runs.push((b, b + 1, lost)),
            }
        }
        let mut copied = 0;
        let mut bad = Vec::new();
        for (first, last, lost) in runs {
            let mut data = vec![0u8; ((last - first) * BLOCK) as usize];
            let f = &self.layers[from];
            f.file
                .read_exact_at(&mut data, first * BLOCK)
                .map_err(|e| ReplicaError::io(&f.path, e))?;
            // Each failing block with the checksum it was written with.
            let failed: Vec<(u64, u32)> = match &f.sums {
                Some(s) if !lost => s
                    .failing(first, &data)
                    .into_iter()
                    .map(|b| (b, s.get(b)))
                    .collect(),
                _ => Vec::new(),
            };
            let l = &mut self.layers[into];
            l.file
                .write_all_at(&data, first * BLOCK)
                .map_err(|e| ReplicaError::io(&l.path, e))?;
            l.map.set_range(first, last, true);
            if let Some(s) = &mut l.sums {
                if lost {
                    s.set(first, !sums::of(&data))?;
                } else {
                    s.set_all(first, &data)?;
                    for &(b, written) in &failed {
                        s.set(b, written)?;
                    }
                }
            }
            bad.extend(failed.iter().map(|&(b, _)| b));
            copied += (last - first) * BLOCK;
        }
        self.mark_bad(&j, &bad, "as the merge copied it up")?;
        Ok(MergeStep {
            next: (end < total).then_some(end),
            copied,
            bad,
        })
    }

    /// Marks blocks `bad` of the upper layer of merge `j` (see the
    /// module's head), `when` they were found failing.
    fn mark_bad(&self, j: &MergeJournal, bad: &[u64], when: &str) -> Result<(), ReplicaError> {
        for &block in bad {
            tracing::error!(dir = %self.dir.display(), layer = %j.into, block, from = %j.from,
                "a block failed its checksum {when}: it keeps failing its reads, and the layer is marked");
            self.mark_corrupt(&Mark {
                layer: j.into.clone(),
                block: Some(block),
            })?;
        }
        Ok(())
    }

    /// The merge under way, on a replica that can still be written.
    fn merge_under_way(&self) -> Result<MergeJournal, ReplicaError> {
        self.check(0, 0)?;
        self.meta
            .merging
            .clone()
            .ok_or_else(|| ReplicaError::Invalid("no merge under way".into()))
    }

    /// Whether block `b` of the upper layer `into` may be one the merge
    /// from `from` copied up and a crash tore: the upper layer records no
    /// checksum for it (its data landed, its checksum not), or the lower
    /// layer's (its checksum landed, its data not). Any other checksum is
    /// of the upper layer's own write: a block of it that fails has gone
    /// bad on the disk, and the lower layer's older data must not take its
    /// place (it fails its reads, and the merge's end marks it).
    fn torn_by_merge(&self, from: usize, into: usize, b: u64) -> bool {
        let sum = |i: usize| self.layers[i].sums.as_ref().map(|s| s.get(b));
        matches!(sum(into), Some(0)) || sum(into) == sum(from)
    }

    /// Whether block `b` of layer `i` matches its checksum.
    fn block_sound(&self, i: usize, b: u64) -> Result<bool, ReplicaError> {
        let l = &self.layers[i];
        let mut block = vec![0u8; BLOCK as usize];
        l.file
            .read_exact_at(&mut block, b * BLOCK)
            .map_err(|e| ReplicaError::io(&l.path, e))?;
        Ok(l.sums.as_ref().is_none_or(|s| s.get(b) == sums::of(&block)))
    }

    /// Ends the merge once every block was copied: the upper layer is made
    /// durable and its checksum taken (each of its blocks checked on the
    /// way: one that fails is marked, and taken as it is), the chain drops
    /// the lower layer, and its files go. Returns the blocks that failed.
    /// The same as `merge_end`, `MergeEnd::take` and `record_merge_end`
    /// with the replica held throughout (at its open, and where nothing
    /// else needs it).
    pub fn finish_merge(&mut self) -> Result<Vec<u64>, ReplicaError> {
        let end = self.merge_end()?;
        let got = end.take()?;
        self.record_merge_end(end, got)?
            .ok_or_else(|| ReplicaError::Invalid("the merge ended under its end".into()))
    }

    /// What ending the merge under way needs, to be taken without the
    /// replica (`MergeEnd`), once every block was copied.
    pub fn merge_end(&self) -> Result<MergeEnd, ReplicaError> {
        let j = self.merge_under_way()?;
        let layer = self.layers[self.layer_at(&j.into)?].second_handle(self.meta.size / BLOCK)?;
        Ok(MergeEnd {
            began: self.epoch,
            lost: self.lost_of(&j.into).clone(),
            layer,
            j,
        })
    }

    /// Whether the merge `end` was taken of is still under way, the
    /// replica's layers unchanged since (`epoch`): no join ended it.
    pub fn merge_end_stands(&self, end: &MergeEnd) -> bool {
        self.meta.merging.as_ref() == Some(&end.j) && self.epoch == end.began
    }

    /// Records the end of the merge that `end` was taken of, with what its
    /// `take` found: the upper layer's bad blocks marked, its checksum
    /// recorded, the lower layer dropped from the chain and its files
    /// removed (and closed apart: `close_apart`). None,
    /// recording nothing, when the merge ended otherwise since `end` was
    /// taken (a join).
    pub fn record_merge_end(
        &mut self,
        end: MergeEnd,
        got: MergeSum,
    ) -> Result<Option<Vec<u64>>, ReplicaError> {
        self.check(0, 0)?;
        if !self.merge_end_stands(&end) {
            return Ok(None);
        }
        let j = end.j.clone();
        self.mark_bad(&j, &got.bad, "at the end of the merge into its layer")?;
        let mut meta = self.meta.clone();
        meta.chain.retain(|n| n != &j.from);
        meta.frozen.remove(&j.from);
        meta.snapshots.remove(&j.from);
        meta.lost.remove(&j.from);
        meta.frozen.insert(j.into.clone(), got.sum);
        meta.merging = None;
        meta.write(&self.dir)?;
        self.meta = meta;
        self.epoch += 1;
        let from = self.layer_at(&j.from)?;
        let gone = self.layers.remove(from);
        remove_layer_files(&gone.path);
        super::close_apart(gone);
        Ok(Some(got.bad))
    }

    /// Runs a whole merge (or the rest of one), `pace` told the bytes of
    /// each chunk copied. Returns the bytes copied.
    pub fn merge(
        &mut self,
        j: &MergeJournal,
        recheck: bool,
        mut pace: impl FnMut(u64),
    ) -> Result<u64, ReplicaError> {
        self.begin_merge(j)?;
        let mut at = Some(0);
        let mut copied = 0;
        while let Some(b) = at {
            let step = self.merge_some(b, MERGE_CHUNK, recheck)?;
            pace(step.copied);
            copied += step.copied;
            at = step.next;
        }
        // A bad block found is marked and logged; the merge ends.
        self.finish_merge()?;
        Ok(copied)
    }

    /// At open: finishes a merge a crash cut off.
    pub(super) fn finish_cut_off_merge(&mut self) -> Result<(), ReplicaError> {
        let Some(j) = self.meta.merging.clone() else {
            return Ok(());
        };
        tracing::info!(dir = %self.dir.display(), from = %j.from, into = %j.into, "finishing a merge cut off by a stop");
        self.merge(&j, true, |_| {})?;
        Ok(())
    }

    /// What a merge's caller is told of block `b` of layer `name`, found
    /// failing its checksum and marked.
    pub(super) fn found_bad(&self, name: &str, b: u64) -> ReplicaError {
        match self.layer_at(name) {
            Ok(i) => self.layers[i].corrupt(b),
            Err(e) => e,
        }
    }

    /// Whether `name` is the upper layer of a merge under way (its recorded
    /// checksum is being replaced).
    pub(super) fn merging_into(&self, name: &str) -> bool {
        self.meta.merging.as_ref().is_some_and(|j| j.into == name)
    }
}

/// Blocks a merge copies per step (4 MiB): a step holds the replica.
pub const MERGE_CHUNK: u64 = 1024;

fn remove_layer_files(path: &std::path::Path) {
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(sums::path_of(path));
}
