//! Rebuild support of the replica format: joining a volume's layer chain,
//! and filling, checking and completing frozen layers one at a time.
//!
//! A replica joins a rebuild with the source's frozen layers (name and
//! checksum). It keeps the oldest of its own frozen layers that match them
//! one for one, drops the rest (its old head included), lists the layers it
//! lacks as `pending`, and starts an empty head under the source's head
//! name. A pending layer of a name it already had (its old head, frozen
//! since on the source: both began at the same point) keeps its old data
//! as a seed: the fill copies only the blocks that differ from the
//! source's. A pending layer is filled (locally or over the network),
//! checked against its checksum and then completed; a replica with no
//! pending layer holds the whole volume. Completed layers survive a
//! restart, so a rebuild cut off resumes from them.
//!
//! The check reads the whole layer. The replica takes the volume's writes
//! from its join on (into its head), and its engine gives it up when one
//! waits past the replica timeout (`engine-replica-timeout`, 8 to 30 s):
//! so the check runs on a second handle of the layer, without the
//! replica (`Completion`). Until 2026-12-07 it ran with the replica held:
//! a write waited for the whole read (the complete bench), and a layer
//! whose read took longer than that timeout, on a volume being written,
//! could fail its rebuild at every attempt.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::{BLOCK, Bitmap, Layer, Replica, ReplicaError, allocation, open_rw};

/// A frozen layer of the volume: its name and checksum.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LayerSpec {
    pub name: String,
    pub checksum: String,
    /// The user snapshot the layer is, if it is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
}

/// What a join kept and what it still needs.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JoinReport {
    /// Frozen layers kept, because they already matched.
    pub kept: Vec<String>,
    /// Bytes of data in the kept layers (not to be copied again).
    pub kept_bytes: u64,
    /// Layers to fill, oldest first.
    pub pending: Vec<String>,
    /// Pending layers that keep the replica's old data of the same name as
    /// a seed (the fill copies only the blocks that differ).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub seeded: Vec<String>,
}

/// Creates (or empties) a sparse layer file of `size` bytes.
pub(super) fn empty_layer(path: &Path, size: u64) -> Result<(), ReplicaError> {
    let io = |e| ReplicaError::io(path, e);
    let f = File::create(path).map_err(io)?;
    f.set_len(size).map_err(io)?;
    f.sync_all().map_err(io)
}

/// `layer-<n>.img`-shaped: a file name, never a path.
pub(super) fn valid_layer_name(name: &str) -> bool {
    name.starts_with("layer-")
        && name.ends_with(".img")
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
}

/// A filled layer's check, taken apart from the replica
/// (`Replica::completion`): a second handle on the layer, so that making
/// it durable and reading it whole for its checksum (`take`) need no lock
/// on the replica, which takes the volume's writes meanwhile. Its fill
/// is done by then and writes it no more.
pub struct Completion {
    /// `Replica::epoch` when it was taken.
    began: u64,
    layer: Layer,
    /// The source's checksum of the layer.
    want: String,
    /// The blocks the source's layer records lost.
    lost: Vec<u64>,
}

impl Completion {
    /// Makes the layer durable and takes its checksum in the form of the
    /// source's, recording each block's checksum in the layer's table as
    /// it is read. Holds nothing of the replica.
    pub fn take(&mut self) -> Result<String, ReplicaError> {
        let l = &mut self.layer;
        l.file
            .sync_all()
            .map_err(|e| ReplicaError::io(&l.path, e))?;
        l.checksum_taking_sums(&self.want)
    }
}

impl Replica {
    /// Joins the chain whose frozen layers are `frozen` (oldest first),
    /// with a new empty head called `head`, at `revision`.
    pub fn join(
        &mut self,
        frozen: &[LayerSpec],
        head: &str,
        revision: u64,
    ) -> Result<JoinReport, ReplicaError> {
        for name in frozen.iter().map(|l| l.name.as_str()).chain([head]) {
            if !valid_layer_name(name) {
                return Err(ReplicaError::Invalid(format!(
                    "{name:?} is not a layer name"
                )));
            }
        }
        if frozen.is_empty() {
            return Err(ReplicaError::Invalid(
                "a join names no frozen layer; every join follows the snapshot taken at its point"
                    .into(),
            ));
        }
        if let Some(bad) = frozen
            .iter()
            .filter_map(|l| l.snapshot.as_deref())
            .find(|id| !super::valid_snapshot_id(id))
        {
            return Err(ReplicaError::Invalid(format!(
                "{bad:?} is not a snapshot id"
            )));
        }
        if frozen.iter().any(|l| l.name == head) {
            return Err(ReplicaError::Invalid(format!(
                "head {head} is also a frozen layer"
            )));
        }
        // The longest prefix of our complete frozen layers that matches.
        let mut report = JoinReport::default();
        for (want, have) in frozen.iter().zip(&self.layers) {
            let ours = self.meta.frozen.get(&have.name);
            let complete = !self.meta.pending.contains(&have.name);
            let corrupt = self.is_corrupt(&have.name);
            if have.name != want.name || ours != Some(&want.checksum) || !complete || corrupt {
                break;
            }
            report.kept.push(want.name.clone());
            report.kept_bytes += have.map.count() * BLOCK;
        }
        report.pending = frozen[report.kept.len()..]
            .iter()
            .map(|l| l.name.clone())
            .collect();
        self.check_claim(frozen, &report, revision)?;
        // A layer of ours named as a pending one began at the same point
        // of the volume's history: what it holds is most of what the
        // source's holds. It stays, pending, as the fill's seed; a block
        // of it is served only once the layer's checksum has matched.
        report.seeded = report
            .pending
            .iter()
            .filter(|name| {
                self.layers
                    .iter()
                    .any(|l| &&l.name == name && l.map.count() > 0)
            })
            .cloned()
            .collect();
        // The new chain is recorded first; the files follow (and `open`
        // makes any a crash left out).
        let mut meta = self.meta.clone();
        meta.chain = frozen
            .iter()
            .map(|l| l.name.clone())
            .chain([head.to_string()])
            .collect();
        meta.frozen = frozen
            .iter()
            .map(|l| (l.name.clone(), l.checksum.clone()))
            .collect();
        meta.pending = report.pending.iter().cloned().collect();
        // A merge under way ends with the chain it was merging.
        meta.merging = None;
        self.epoch += 1;
        // A kept layer is the source's, lost blocks and all; a pending one
        // learns its lost blocks from the source as it completes.
        meta.lost.retain(|name, _| report.kept.contains(name));
        meta.snapshots = frozen
            .iter()
            .filter_map(|l| Some((l.name.clone(), l.snapshot.clone()?)))
            .collect();
        meta.revision = revision;
        meta.write(&self.dir)?;
        self.meta = meta;
        let keep: Vec<String> = report.kept.clone();
        // A layer marked corrupt is never kept: it is filled again, sound.
        self.clear_corrupt_marks(None)?;
        for l in &self.layers {
            if !keep.contains(&l.name) && !report.seeded.contains(&l.name) {
                let _ = std::fs::remove_file(&l.path);
                let _ = std::fs::remove_file(super::sums::path_of(&l.path));
            }
        }
        for name in report.pending.iter().map(String::as_str).chain([head]) {
            let path = self.dir.join(name);
            if report.seeded.iter().any(|s| s == name) {
                open_rw(&path)?
                    .set_len(self.meta.size)
                    .map_err(|e| ReplicaError::io(&path, e))?;
            } else {
                empty_layer(&path, self.meta.size)?;
            }
            // A filled layer's checksums are taken as it completes.
            let _ = std::fs::remove_file(super::sums::path_of(&path));
        }
        self.revision = revision;
        self.revision_file.store(revision);
        // Its old history is not the volume's: the write log starts anew,
        // from a state that is whole.
        self.revision_file.clear_log();
        self.revision_file.mark_flushed(revision);
        // The layers it dropped close apart: their blocks are freed then.
        super::close_apart(self.reload()?);
        Ok(report)
    }

    /// A join must not make this replica claim what it does not hold. With
    /// layers left to fill it serves nothing until they are filled. With
    /// none, it keeps only layers it already has, so it must already be at
    /// `revision`, and the layers it drops must hold no data: otherwise
    /// the join would pass off an emptied replica as the newest one.
    fn check_claim(
        &self,
        frozen: &[LayerSpec],
        report: &JoinReport,
        revision: u64,
    ) -> Result<(), ReplicaError> {
        if !report.pending.is_empty() {
            return Ok(());
        }
        if revision != self.revision {
            return Err(ReplicaError::Invalid(format!(
                "a join at revision {revision} brings no layer to fill, and this replica is at revision {}: it would claim writes it does not hold",
                self.revision
            )));
        }
        let dropped = self.layers.iter().skip(frozen.len());
        if let Some(l) = dropped.into_iter().find(|l| l.map.count() > 0) {
            return Err(ReplicaError::Invalid(format!(
                "a join that brings no layer to fill would drop layer {}, which holds data",
                l.name
            )));
        }
        Ok(())
    }

    /// Re-reads every layer's file, allocation and checksums; returns the
    /// layers it held before (for `close_apart`).
    fn reload(&mut self) -> Result<Vec<Layer>, ReplicaError> {
        let blocks = self.meta.size / BLOCK;
        // A new head: what was read ahead of the old one's freeze goes.
        self.warm
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
        let layers = self
            .meta
            .chain
            .iter()
            .map(|name| Layer::open(&self.dir, name, blocks, self.meta.block_sums))
            .collect::<Result<_, _>>()?;
        Ok(std::mem::replace(&mut self.layers, layers))
    }

    pub(super) fn layer_at(&self, name: &str) -> Result<usize, ReplicaError> {
        self.layers
            .iter()
            .position(|l| l.name == name)
            .ok_or_else(|| ReplicaError::Invalid(format!("no layer {name:?} in this replica")))
    }

    /// The layer at `index` of the chain (oldest is 0).
    pub fn layer_name_at(&self, index: u64) -> Result<String, ReplicaError> {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.layers.get(i))
            .map(|l| l.name.clone())
            .ok_or_else(|| {
                ReplicaError::Invalid(format!(
                    "layer index {index} outside a chain of {}",
                    self.layers.len()
                ))
            })
    }

    /// Where a layer's file is.
    pub fn layer_path(&self, name: &str) -> Result<PathBuf, ReplicaError> {
        Ok(self.layers[self.layer_at(name)?].path.clone())
    }

    /// Byte ranges holding data in a complete frozen layer.
    pub fn layer_extents(&self, name: &str) -> Result<Vec<(u64, u64)>, ReplicaError> {
        let i = self.layer_at(name)?;
        if !self.meta.frozen.contains_key(name) || self.meta.pending.contains(name) {
            return Err(ReplicaError::Invalid(format!(
                "layer {name} is not a complete frozen layer"
            )));
        }
        Ok(self.layers[i]
            .map
            .runs()
            .into_iter()
            .map(|(s, e)| (s * BLOCK, (e - s) * BLOCK))
            .collect())
    }

    /// Reads raw bytes of one layer (holes read as zeros). The blocks it
    /// holds are checked against its checksums: a rebuild never copies a
    /// corrupt block.
    pub fn read_layer(&self, name: &str, offset: u64, buf: &mut [u8]) -> Result<(), ReplicaError> {
        self.check(offset, buf.len() as u64)?;
        let i = self.layer_at(name)?;
        let l = &self.layers[i];
        l.file
            .read_exact_at(buf, offset)
            .map_err(|e| ReplicaError::io(&l.path, e))?;
        if self.meta.pending.contains(name) {
            return Ok(());
        }
        // A layer marked for a block gives the others: each is checked
        // here, and the fill checks the layer whole on arrival.
        if self.is_unserved(name) {
            return Err(ReplicaError::Corrupt(format!(
                "layer {name} was found corrupt"
            )));
        }
        let end = offset + buf.len() as u64;
        let (first, last) = (offset / BLOCK, end.div_ceil(BLOCK));
        // A block lost when the layer was frozen goes as it is: the fill
        // records it lost, and the layer's checksum covers it.
        let lost = self.lost_of(name);
        for b in (first..last).filter(|b| l.map.get(*b) && !lost.contains(b)) {
            let (bs, be) = ((b * BLOCK).max(offset), ((b + 1) * BLOCK).min(end));
            if bs == b * BLOCK && be == (b + 1) * BLOCK {
                let at = (bs - offset) as usize;
                if let Some(s) = &l.sums
                    && s.check(b, &buf[at..at + BLOCK as usize]).is_err()
                {
                    return Err(self.as_seen(l.corrupt(b)));
                }
            } else {
                let mut block = vec![0u8; BLOCK as usize];
                l.read_checked(b, &mut block).map_err(|e| self.as_seen(e))?;
            }
        }
        Ok(())
    }

    /// The CRC32C of each 4 KiB block a read returns over `offset..offset
    /// + len` (block aligned), 4 bytes each, little endian: the sum the
    /// topmost layer holding the block records, that of a block of zeros
    /// where no layer holds it. Two replicas of one volume hold the same
    /// blocks where these are equal. After an unclean stop the head's sums
    /// of the blocks it may have written since its last flush were taken
    /// again from the data at open (`repair_head_sums`), so they are those
    /// of the data there too. A starting engine compares them over the
    /// regions written lately (`engine::equalize`).
    pub fn view_sums(&self, offset: u64, len: u64) -> Result<Vec<u8>, ReplicaError> {
        self.check_blocks("view sums", offset, len)?;
        let zeros = super::sums::of(&[0u8; BLOCK as usize]);
        let mut out = Vec::with_capacity((len / BLOCK * 4) as usize);
        let mut block = vec![0u8; BLOCK as usize];
        for b in offset / BLOCK..(offset + len) / BLOCK {
            let sum = match self.holder(b) {
                None => zeros,
                Some(i) => self.layers[i].sum_of(b, &mut block)?,
            };
            out.extend_from_slice(&sum.to_le_bytes());
        }
        Ok(out)
    }

    /// The CRC32C of each 4 KiB block of a complete frozen layer over
    /// `offset..offset + len` (block aligned), 4 bytes each, little
    /// endian; 0 for a block the layer does not hold. Taken from the
    /// layer's table, without reading its data, when it has one; else from
    /// its data. A rebuild compares them with its seed's blocks.
    pub fn layer_sums(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>, ReplicaError> {
        self.check_blocks("layer sums", offset, len)?;
        let i = self.layer_at(name)?;
        if !self.meta.frozen.contains_key(name) || self.meta.pending.contains(name) {
            return Err(ReplicaError::Invalid(format!(
                "layer {name} is not a complete frozen layer"
            )));
        }
        // The table of a layer marked for a block still says what the
        // layer held when frozen: a seed's block equal to it is kept, and
        // the layer is checked whole once filled.
        if self.is_unserved(name) {
            return Err(ReplicaError::Corrupt(format!(
                "layer {name} was found corrupt"
            )));
        }
        let l = &self.layers[i];
        let mut out = Vec::with_capacity((len / BLOCK * 4) as usize);
        let mut block = vec![0u8; BLOCK as usize];
        for b in offset / BLOCK..(offset + len) / BLOCK {
            let sum = if l.map.get(b) {
                l.sum_of(b, &mut block)?
            } else {
                0
            };
            out.extend_from_slice(&sum.to_le_bytes());
        }
        Ok(out)
    }

    /// Punches blocks `offset..offset + len` out of a pending layer: its
    /// seed held them, the source's layer does not.
    pub fn punch_layer(&mut self, name: &str, offset: u64, len: u64) -> Result<(), ReplicaError> {
        self.check_blocks("layer punch", offset, len)?;
        let i = self.pending_mut(name)?;
        self.layers[i].punch(offset / BLOCK, (offset + len) / BLOCK)
    }

    /// A range of a layer operation (`what`): within the volume, and in
    /// whole blocks.
    fn check_blocks(&self, what: &str, offset: u64, len: u64) -> Result<(), ReplicaError> {
        self.check(offset, len)?;
        if !offset.is_multiple_of(BLOCK) || !len.is_multiple_of(BLOCK) {
            return Err(ReplicaError::Invalid(format!(
                "{what} {offset}+{len} is not block aligned"
            )));
        }
        Ok(())
    }

    fn pending_at(&self, name: &str) -> Result<usize, ReplicaError> {
        if !self.meta.pending.contains(name) {
            return Err(ReplicaError::Invalid(format!(
                "layer {name} is not being filled"
            )));
        }
        self.layer_at(name)
    }

    /// `pending_at`, for a change of the layer (`epoch` counts it).
    fn pending_mut(&mut self, name: &str) -> Result<usize, ReplicaError> {
        let i = self.pending_at(name)?;
        self.epoch += 1;
        Ok(i)
    }

    /// Writes block-aligned data into a pending layer.
    pub fn write_layer(
        &mut self,
        name: &str,
        offset: u64,
        data: &[u8],
    ) -> Result<(), ReplicaError> {
        self.check_blocks("layer write", offset, data.len() as u64)?;
        let i = self.pending_mut(name)?;
        let l = &mut self.layers[i];
        l.file
            .write_all_at(data, offset)
            .map_err(|e| ReplicaError::io(&l.path, e))?;
        l.map
            .set_range(offset / BLOCK, (offset + data.len() as u64) / BLOCK, true);
        Ok(())
    }

    /// Empties a pending layer again (after a failed copy).
    pub fn reset_layer(&mut self, name: &str) -> Result<(), ReplicaError> {
        let i = self.pending_mut(name)?;
        let l = &mut self.layers[i];
        // A new empty file in its place; the old one's blocks are freed as
        // it closes, apart (a crash between the two leaves the pending
        // layer's file missing, and `open` makes it empty).
        std::fs::remove_file(&l.path).map_err(|e| ReplicaError::io(&l.path, e))?;
        empty_layer(&l.path, self.meta.size)?;
        super::close_apart(std::mem::replace(&mut l.file, open_rw(&l.path)?));
        l.map = Bitmap::new(self.meta.size / BLOCK);
        if let Some(s) = &mut l.sums {
            s.resize(0)?;
            s.resize(self.meta.size / BLOCK)?;
        }
        Ok(())
    }

    /// Re-reads a pending layer whose file was replaced (by a local copy).
    pub fn reopen_layer(&mut self, name: &str) -> Result<(), ReplicaError> {
        let i = self.pending_mut(name)?;
        let path = self.layers[i].path.clone();
        let file = open_rw(&path)?;
        // A layer copied from a smaller volume (a restore into a larger
        // one) grows by a hole to this volume's size.
        let len = file
            .metadata()
            .map_err(|e| ReplicaError::io(&path, e))?
            .len();
        if len < self.meta.size {
            file.set_len(self.meta.size)
                .map_err(|e| ReplicaError::io(&path, e))?;
        }
        let map =
            allocation(&file, self.meta.size / BLOCK).map_err(|e| ReplicaError::io(&path, e))?;
        // The file it replaced closes apart: its blocks are freed then.
        super::close_apart(std::mem::replace(&mut self.layers[i].file, file));
        self.layers[i].map = map;
        Ok(())
    }

    /// Checks a filled layer against its checksum and completes it, with
    /// the blocks the source's layer records lost (`lost`, see
    /// `Meta::lost`). A mismatch leaves it pending. The same as
    /// `completion`, `Completion::take` and `record_completion` with the
    /// replica held throughout.
    pub fn complete_layer(&mut self, name: &str, lost: &[u64]) -> Result<(), ReplicaError> {
        let mut c = self.completion(name, lost)?;
        let got = c.take()?;
        self.record_completion(c, &got)
    }

    /// What completing the filled layer `name` needs, to be checked
    /// without the replica (`Completion`).
    pub fn completion(&self, name: &str, lost: &[u64]) -> Result<Completion, ReplicaError> {
        let i = self.pending_at(name)?;
        if let Some(b) = lost.iter().find(|b| !self.layers[i].map.get(**b)) {
            return Err(ReplicaError::Invalid(format!(
                "the source records block {b} of layer {name} lost, and the layer does not hold it"
            )));
        }
        Ok(Completion {
            began: self.epoch,
            layer: self.layers[i].second_handle(self.meta.size / BLOCK)?,
            want: self.meta.frozen.get(name).cloned().unwrap_or_default(),
            lost: lost.to_vec(),
        })
    }

    /// Completes the layer `c` was taken of, once its `take` found `got`:
    /// a checksum other than the source's leaves it pending (Corrupt), as
    /// does a change of the replica's layers since `c` was taken (a join,
    /// or another fill's writes: Invalid).
    pub fn record_completion(&mut self, c: Completion, got: &str) -> Result<(), ReplicaError> {
        let name = c.layer.name.as_str();
        let i = self.pending_at(name)?;
        if self.epoch != c.began {
            return Err(ReplicaError::Invalid(format!(
                "layer {name} changed while it was checked; it stays pending"
            )));
        }
        if got != c.want {
            return Err(ReplicaError::Corrupt(format!(
                "layer {name} arrived with checksum {got}, the source's is {}",
                c.want
            )));
        }
        // A lost block's checksum is taken so that it fails, as the
        // source's does: the record is not all that keeps it unserved.
        let l = &mut self.layers[i];
        if let Some(s) = &mut l.sums {
            let mut block = vec![0u8; BLOCK as usize];
            for &b in &c.lost {
                l.file
                    .read_exact_at(&mut block, b * BLOCK)
                    .map_err(|e| ReplicaError::io(&l.path, e))?;
                s.set(b, !super::sums::of(&block))?;
            }
            s.sync()?;
        }
        let mut meta = self.meta.clone();
        meta.pending.remove(name);
        if !c.lost.is_empty() {
            tracing::error!(dir = %self.dir.display(), layer = %name, blocks = ?c.lost,
                "layer filled with blocks its source lost: each fails its reads until it is written again");
            meta.lost
                .insert(name.to_string(), c.lost.iter().copied().collect());
        }
        meta.write(&self.dir)?;
        self.meta = meta;
        self.epoch += 1;
        Ok(())
    }

    /// Layers still to fill, oldest first.
    pub fn pending(&self) -> Vec<String> {
        self.meta
            .chain
            .iter()
            .filter(|n| self.meta.pending.contains(*n))
            .cloned()
            .collect()
    }

    /// The allocation of one layer, in blocks.
    pub fn layer_map(&self, name: &str) -> Result<Bitmap, ReplicaError> {
        Ok(self.layers[self.layer_at(name)?].map.clone())
    }

    /// Bytes held by the layer `name`.
    pub fn layer_allocated(&self, name: &str) -> Result<u64, ReplicaError> {
        Ok(self.layers[self.layer_at(name)?].map.count() * BLOCK)
    }
}
