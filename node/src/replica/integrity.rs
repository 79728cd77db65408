//! What a replica knows to be bad, or doubtful, about its own data, and
//! how it finds out: the corrupt marks on frozen layers (`corrupt-layers`),
//! the head's suspect blocks after a power cut (`suspect-blocks`), blocks
//! of a frozen layer given up as lost, and the scrub and verification that
//! check layers against their checksums.
//!
//! It owns those two files. The layers' data, their checksum tables and
//! `meta.json` belong to the rest of `replica`; this file reads them and,
//! for a lost block, records it through `Meta`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::path::Path;

use super::{
    BLOCK, CORRUPT_FILE, Layer, Meta, Replica, ReplicaError, SUSPECT_FILE, check_but, checksum,
    meta,
};

/// A line of `corrupt-layers`. A layer's name alone marks it whole: its
/// checksum did not match although its blocks may each match theirs, so
/// which data is bad is not known, and none of it is served. `NAME block
/// N` marks it for block N: that block fails its own checksum at every
/// read, and the others are served. Either way a rebuild never keeps the
/// layer. A fill copies from a layer marked for a block only what passes
/// the checks (each block its own, the layer whole on arrival), and from
/// one marked whole nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mark {
    pub layer: String,
    /// The block found bad; None for the whole layer.
    pub block: Option<u64>,
}

impl Mark {
    /// The mark a corruption error calls for, when it names a layer.
    pub fn of(e: &ReplicaError) -> Option<Mark> {
        match e {
            ReplicaError::CorruptBlock { layer, block, .. } => Some(Mark {
                layer: layer.clone(),
                block: Some(*block),
            }),
            ReplicaError::CorruptLayer { layer, .. } => Some(Mark {
                layer: layer.clone(),
                block: None,
            }),
            _ => None,
        }
    }

    /// A whole-layer mark.
    pub fn whole(layer: &str) -> Mark {
        Mark {
            layer: layer.to_string(),
            block: None,
        }
    }

    fn line(&self) -> String {
        match self.block {
            Some(b) => format!("{} block {b}", self.layer),
            None => self.layer.clone(),
        }
    }

    fn parse(line: &str) -> Mark {
        let block = line
            .split_once(" block ")
            .and_then(|(layer, b)| Some((layer, b.parse::<u64>().ok()?)));
        match block {
            Some((layer, b)) => Mark {
                layer: layer.to_string(),
                block: Some(b),
            },
            None => Mark::whole(line),
        }
    }
}

/// The bytes of the replica's file `name` in `dir`, or None when it has
/// none.
fn read_if_there(dir: &Path, name: &str) -> Result<Option<Vec<u8>>, ReplicaError> {
    let path = dir.join(name);
    match std::fs::read(&path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ReplicaError::io(&path, e)),
    }
}

/// `suspect-blocks` when some of its blocks keep the disk's checksum
/// (`Replica::suspect_sums`); without any, the file is the bare list of
/// blocks, as before there were such checksums.
#[derive(serde::Serialize, serde::Deserialize)]
struct SuspectsWithSums {
    blocks: BTreeSet<u64>,
    /// `[block, crc32c]` pairs.
    sums: Vec<(u64, u32)>,
}

/// The forms `suspect-blocks` takes.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum SuspectFile {
    Bare(BTreeSet<u64>),
    WithSums(SuspectsWithSums),
}

/// The suspect blocks recorded in `dir` (none when the file is absent),
/// and the checksums kept for some of them.
/// The file is only ever replaced whole (`write_durably`), so one that
/// does not parse has gone bad on the disk: the open fails, naming it,
/// rather than serve as sound the blocks it listed.
pub(super) fn read_suspects(
    dir: &Path,
    blocks: u64,
) -> Result<(BTreeSet<u64>, BTreeMap<u64, u32>), ReplicaError> {
    let Some(bytes) = read_if_there(dir, SUSPECT_FILE)? else {
        return Ok(Default::default());
    };
    let corrupt = |why: String| {
        ReplicaError::Corrupt(format!(
            "{}: {why}: which blocks are suspect is lost (a copy from another replica, or a rebuild, makes the head sound again)",
            dir.join(SUSPECT_FILE).display()
        ))
    };
    let (suspect, sums) =
        match serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))? {
            SuspectFile::Bare(blocks) => (blocks, BTreeMap::new()),
            SuspectFile::WithSums(f) => (f.blocks, f.sums.into_iter().collect()),
        };
    if let Some(b) = sums.keys().find(|b| !suspect.contains(b)) {
        return Err(corrupt(format!(
            "a checksum is kept for block {b}, which is not suspect"
        )));
    }
    match suspect.last() {
        Some(&b) if b >= blocks => Err(corrupt(format!("block {b} is past the volume's {blocks}"))),
        _ => Ok((suspect, sums)),
    }
}

/// The marks the file `corrupt-layers` of the replica in `dir` holds, by
/// layer: true for one marked whole. Its lines are appended, so a bad
/// byte spoils its own line and no other: every line is read, and one
/// that names no layer marks nothing.
pub(super) fn marks_in(
    dir: &Path,
) -> Result<std::collections::BTreeMap<String, bool>, ReplicaError> {
    let mut marks = std::collections::BTreeMap::new();
    for m in mark_lines(dir)?.lines().map(Mark::parse) {
        *marks.entry(m.layer).or_insert(false) |= m.block.is_none();
    }
    Ok(marks)
}

/// The text of `corrupt-layers` (empty when absent), a bad byte read as
/// U+FFFD so that it spoils its own line only.
fn mark_lines(dir: &Path) -> Result<String, ReplicaError> {
    let bytes = read_if_there(dir, CORRUPT_FILE)?.unwrap_or_default();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Records in the replica at `dir` that its frozen layer is corrupt (see
/// `Mark`), for whoever opens it next.
pub fn mark_corrupt_in(dir: &Path, mark: &Mark) -> Result<(), ReplicaError> {
    use std::io::Write;
    let path = dir.join(CORRUPT_FILE);
    let line = mark.line();
    if mark_lines(dir)?.lines().any(|l| l == line) {
        return Ok(());
    }
    match mark.block {
        Some(block) => tracing::error!(dir = %dir.display(), layer = %mark.layer, block,
            "a block of the layer found corrupt; the layer is never kept or copied by a rebuild again, and the block fails its reads"),
        None => tracing::error!(dir = %dir.display(), layer = %mark.layer,
            "layer found corrupt; it is never served or kept again"),
    }
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| ReplicaError::io(&path, e))?;
    writeln!(f, "{line}")
        .and_then(|()| f.sync_all())
        .map_err(|e| ReplicaError::io(&path, e))
}

/// Whether frozen layer `name` of the replica in `dir` is no longer what a
/// reader that found it recorded with checksum `want` read: a merge is
/// under way into or out of it, or has replaced or removed it.
fn changed_under(dir: &Path, name: &str, want: &str) -> bool {
    match Meta::read(dir) {
        Ok(now) => {
            now.merging
                .as_ref()
                .is_some_and(|j| j.into == name || j.from == name)
                || now.frozen.get(name).map(String::as_str) != Some(want)
        }
        Err(_) => false,
    }
}

/// The frozen layer a corruption error names, if it names one.
pub fn corrupt_layer(e: &ReplicaError) -> Option<&str> {
    match e {
        ReplicaError::CorruptBlock { layer, .. } | ReplicaError::CorruptLayer { layer, .. } => {
            Some(layer)
        }
        _ => None,
    }
}

impl Replica {
    /// The suspect blocks (see `Replica::suspect`), in order.
    pub fn suspects(&self) -> Vec<u64> {
        self.suspect.iter().copied().collect()
    }

    /// The checksums on the disk kept for some suspect blocks (see
    /// `Replica::suspect_sums`), by block.
    pub fn suspect_sums(&self) -> &BTreeMap<u64, u32> {
        &self.suspect_sums
    }

    pub(super) fn write_suspects(&self) -> Result<(), ReplicaError> {
        let body = if self.suspect_sums.is_empty() {
            serde_json::to_vec(&self.suspect)
        } else {
            serde_json::to_vec(&SuspectsWithSums {
                blocks: self.suspect.clone(),
                sums: self.suspect_sums.iter().map(|(b, s)| (*b, *s)).collect(),
            })
        }
        .map_err(|e| ReplicaError::Invalid(format!("suspect blocks: {e}")))?;
        meta::write_durably(&self.dir, SUSPECT_FILE, &body)
    }

    /// A write or discard of every byte of blocks `first..last` settles
    /// the suspect ones among them. On the disk they stay suspect until
    /// the next flush has made what settled them durable (`flush`): a
    /// crash before it leaves them suspect, as the write may not be there.
    pub(super) fn settle_suspects(&mut self, first: u64, last: u64) {
        let settled: Vec<u64> = self.suspect.range(first..last).copied().collect();
        for b in &settled {
            self.suspect.remove(b);
            self.suspect_sums.remove(b);
        }
        if !settled.is_empty() {
            *self.suspect_stale.get_mut() = true;
        }
    }

    /// Whether layer `name` was found corrupt (marked whole or for a
    /// block): a rebuild never keeps it.
    pub fn is_corrupt(&self, name: &str) -> bool {
        self.any_corrupt.load(std::sync::atomic::Ordering::Acquire)
            && self.corrupt.lock().is_ok_and(|c| c.contains_key(name))
    }

    /// Whether layer `name` is marked whole: none of it is served.
    pub(super) fn is_unserved(&self, name: &str) -> bool {
        self.any_corrupt.load(std::sync::atomic::Ordering::Acquire)
            && self
                .corrupt
                .lock()
                .is_ok_and(|c| c.get(name).copied().unwrap_or(false))
    }

    /// Scrubs the replica in `dir` from its files, whoever holds it: every
    /// complete frozen layer, each block against its checksum and the whole
    /// against the recorded checksum. `pace` is told the bytes of each
    /// chunk read (and may sleep). Reads only: the head (which a running
    /// engine may be writing) is left out; its blocks are checked as they
    /// are read. Returns the bytes checked.
    pub fn scrub(dir: &Path, mut pace: impl FnMut(u64)) -> Result<u64, ReplicaError> {
        let meta = Meta::read(dir)?;
        let blocks = meta.size / BLOCK;
        let corrupt = marks_in(dir)?;
        let mut checked = 0;
        for name in &meta.chain {
            let Some(want) = meta.frozen.get(name) else {
                continue;
            };
            let merging = meta.merging.as_ref().is_some_and(|j| &j.into == name);
            if meta.pending.contains(name) || corrupt.contains_key(name) || merging {
                continue;
            }
            let l = match Layer::open(dir, name, blocks, meta.block_sums) {
                Ok(l) => l,
                // Folded away by a merge since the meta was read.
                Err(e) if changed_under(dir, name, want) => {
                    tracing::info!(dir = %dir.display(), layer = %name, error = %e, "layer merged away before it was scrubbed");
                    continue;
                }
                Err(e) => return Err(e),
            };
            let lost = meta.lost.get(name).cloned().unwrap_or_default();
            let got = checksum::take(&l, checksum::Form::of(want), |b, chunk| {
                pace(chunk.len() as u64);
                if let Some(sums) = &l.sums {
                    check_but(sums, b, chunk, &lost, &mut |_| {}).map_err(|bad| l.corrupt(bad))?;
                }
                checked += chunk.len() as u64;
                Ok(())
            })
            .and_then(|got| {
                if &got == want {
                    Ok(())
                } else {
                    Err(ReplicaError::CorruptLayer {
                        layer: name.clone(),
                        message: format!("checksum {got}, recorded {want}"),
                    })
                }
            });
            match got {
                Ok(()) => {}
                // A merge that began meanwhile writes into the layer (or
                // folds it away): what was read is no verdict on it.
                Err(e) if corrupt_layer(&e).is_some() && changed_under(dir, name, want) => {
                    tracing::info!(dir = %dir.display(), layer = %name, "layer changed by a merge while it was scrubbed; checked next time");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(checked)
    }

    /// Records that a frozen layer is corrupt (see `Mark`): from now on a
    /// rebuild never keeps it, and, marked whole, it is never served nor
    /// copied. (The head needs no mark: a rebuild never keeps a head.)
    /// Kept in its own file, so that whoever holds the replica — its
    /// server, or the engine it is lent to — may record it without
    /// touching `meta.json`.
    pub fn mark_corrupt(&self, mark: &Mark) -> Result<(), ReplicaError> {
        let name = mark.layer.as_str();
        let whole = mark.block.is_none();
        // A block mark adds nothing to a layer marked already.
        let marked = if whole {
            self.is_unserved(name)
        } else {
            self.is_corrupt(name)
        };
        if !self.meta.frozen.contains_key(name) || marked {
            return Ok(());
        }
        mark_corrupt_in(&self.dir, mark)?;
        if let Ok(mut c) = self.corrupt.lock() {
            *c.entry(name.to_string()).or_insert(false) |= whole;
        }
        self.any_corrupt
            .store(true, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// Gives up the block at byte `at` of frozen layer `name` as lost,
    /// after its freeze: it fails its checksum, and whoever asks (the
    /// volume's engine, or the controller through this node's agent for a
    /// detached volume) found that no other replica holding the volume's
    /// latest data is left, so none holds the layer sound. Every other
    /// block of the layer that fails its checksum goes with it, found in
    /// the one pass that takes the layer's checksum again with each such
    /// block as it is: one at a time, a second bad block failed each loss
    /// of the first, and the layer could never be copied. The checksum is
    /// recorded with the blocks lost (`Meta::lost`); the layer's marks go,
    /// since it checks whole again. So a fill copies the layer as it is
    /// now, where before every fill of it failed on a bad block. What any
    /// read returns does not change: each block failed its reads before,
    /// and fails them now. Returns the blocks newly given up.
    pub fn lose_frozen_block(&mut self, name: &str, at: u64) -> Result<Vec<u64>, ReplicaError> {
        self.check(at, BLOCK)?;
        let i = self.losable(name)?;
        if !at.is_multiple_of(BLOCK) {
            return Err(ReplicaError::Invalid(format!(
                "{at} is not the start of a block"
            )));
        }
        let block = at / BLOCK;
        if self.lost_of(name).contains(&block) {
            return Ok(Vec::new());
        }
        if !self.layers[i].map.get(block) {
            return Err(ReplicaError::Invalid(format!(
                "layer {name} does not hold block {block}"
            )));
        }
        let mut buf = vec![0u8; BLOCK as usize];
        match self.layers[i].read_checked(block, &mut buf) {
            Ok(()) => {
                return Err(ReplicaError::Invalid(format!(
                    "block {block} of layer {name} is sound; it is not given up"
                )));
            }
            Err(ReplicaError::CorruptBlock { .. }) => {}
            Err(e) => return Err(e),
        }
        self.lose_failing(i)
    }

    /// Gives up as lost, in each frozen layer marked for a bad block
    /// (`Mark`), every block that fails its checksum, as
    /// `lose_frozen_block` does: asked by the controller of the last
    /// replica recorded as holding a detached volume's data, once a copy
    /// from it failed on such a block (the copy marked the layer). A layer
    /// marked whole (which of its data is bad is not known), one merging,
    /// and one none of whose blocks fails give up nothing. Returns each
    /// layer with the blocks newly given up in it.
    pub fn lose_marked_blocks(&mut self) -> Result<Vec<(String, Vec<u64>)>, ReplicaError> {
        let marked: BTreeSet<String> = mark_lines(&self.dir)?
            .lines()
            .map(Mark::parse)
            .filter(|m| m.block.is_some())
            .map(|m| m.layer)
            .collect();
        let mut given_up = Vec::new();
        for layer in marked {
            let i = match self.losable(&layer) {
                Ok(i) => i,
                Err(ReplicaError::Invalid(why)) => {
                    tracing::warn!(dir = %self.dir.display(), layer = %layer, %why,
                        "a layer marked for a bad block gives up nothing");
                    continue;
                }
                Err(e) => return Err(e),
            };
            let lost = self.lose_failing(i)?;
            if !lost.is_empty() {
                given_up.push((layer, lost));
            }
        }
        Ok(given_up)
    }

    /// The index of layer `name` when blocks of it may be given up as
    /// lost: a complete frozen layer, not merging, not marked whole.
    fn losable(&self, name: &str) -> Result<usize, ReplicaError> {
        let i = self.layer_at(name)?;
        let merging = self
            .meta
            .merging
            .as_ref()
            .is_some_and(|j| j.into == name || j.from == name);
        if !self.meta.frozen.contains_key(name) || self.meta.pending.contains(name) || merging {
            return Err(ReplicaError::Invalid(format!(
                "layer {name} is not a complete frozen layer"
            )));
        }
        if self.is_unserved(name) {
            return Err(ReplicaError::Invalid(format!(
                "layer {name} is marked whole: which of its data is bad is not known"
            )));
        }
        Ok(i)
    }

    /// Gives up every block of frozen layer `i` that fails its checksum,
    /// found in the one pass that takes the layer's checksum again with
    /// each such block as it is; records the checksum with the blocks lost
    /// (`Meta::lost`) and drops the layer's marks, since it checks whole
    /// again. Changes nothing when no block fails. The blocks newly given
    /// up.
    fn lose_failing(&mut self, i: usize) -> Result<Vec<u64>, ReplicaError> {
        let name = self.layers[i].name.clone();
        let before = self.lost_of(&name).clone();
        let mut lost = before.clone();
        let sum = self.checksum_losing(i, &mut lost)?;
        let given_up: Vec<u64> = lost.difference(&before).copied().collect();
        if given_up.is_empty() {
            return Ok(given_up);
        }
        let mut meta = self.meta.clone();
        meta.frozen.insert(name.clone(), sum);
        meta.lost.insert(name.clone(), lost);
        meta.write(&self.dir)?;
        self.meta = meta;
        tracing::error!(dir = %self.dir.display(), layer = %name, blocks = ?given_up,
            "blocks of a frozen layer that no replica holds sound given up as lost: each fails its reads until it is written again, and the layer is copied as it is");
        self.clear_corrupt_marks(Some(&name))?;
        Ok(given_up)
    }

    /// Forgets every corrupt mark (a join, which keeps no marked layer).
    /// With `only`, forgets that layer's marks alone (it checks whole
    /// again, see `lose_frozen_block`).
    pub(super) fn clear_corrupt_marks(&mut self, only: Option<&str>) -> Result<(), ReplicaError> {
        let path = self.dir.join(CORRUPT_FILE);
        let kept: String = match only {
            None => String::new(),
            Some(name) => mark_lines(&self.dir)?
                .lines()
                .filter(|l| Mark::parse(l).layer != name)
                .map(|l| format!("{l}\n"))
                .collect(),
        };
        if kept.is_empty() {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(ReplicaError::io(&path, e)),
            }
        } else {
            meta::write_durably(&self.dir, CORRUPT_FILE, kept.as_bytes())?;
        }
        if let Ok(mut c) = self.corrupt.lock() {
            c.retain(|layer, _| only.is_some_and(|name| name != layer));
            self.any_corrupt
                .store(!c.is_empty(), std::sync::atomic::Ordering::Release);
        }
        Ok(())
    }

    /// What a block found failing its checksum through a view means
    /// (`open_view`: the replica's owner, the engine it is lent to, goes on
    /// with it meanwhile; a rebuild from it reads it so). A merge writes
    /// each block it copies up, then its checksum, under the owner's lock,
    /// which a view does not take: a block of a layer the owner is merging,
    /// or has merged since the view was opened, read between the two, fails
    /// its checksum though it is sound. That is no verdict (as for a scrub,
    /// `changed_under`): the read fails as `Changed`, which marks nothing
    /// and blames no replica. The owner's own reads hold its lock, and
    /// judge.
    pub(super) fn as_seen(&self, e: ReplicaError) -> ReplicaError {
        if !self.is_view {
            return e;
        }
        let Some(layer) = corrupt_layer(&e) else {
            return e;
        };
        match self.meta.frozen.get(layer) {
            Some(want) if changed_under(&self.dir, layer, want) => ReplicaError::Changed(format!(
                "layer {layer} of {} changed as it was read (its owner merges it): {e}",
                self.dir.display()
            )),
            _ => e,
        }
    }

    /// Marks the layer a corruption error names, when it is a frozen one.
    pub fn note_corruption(&self, e: &ReplicaError) {
        if let Some(mark) = Mark::of(e)
            && let Err(err) = self.mark_corrupt(&mark)
        {
            tracing::warn!(error = %err, "cannot record a corrupt layer");
        }
    }

    /// Verifies one complete frozen layer: every block against its
    /// checksum, and the whole against the layer's recorded checksum.
    pub fn verify_layer(&self, name: &str) -> Result<(), ReplicaError> {
        let i = self
            .layers
            .iter()
            .position(|l| l.name == name)
            .ok_or_else(|| ReplicaError::Invalid(format!("no layer {name:?}")))?;
        // One marked for a block is read: its error names the block.
        if self.is_unserved(name) {
            return Err(ReplicaError::Corrupt(format!(
                "layer {name} was found corrupt"
            )));
        }
        let Some(want) = self.meta.frozen.get(name) else {
            return Ok(()); // the head: its blocks are checked as they are read
        };
        // Seen through a view, a layer its owner merges is no verdict.
        let seen = |e| self.as_seen(e);
        if self.merging_into(name) {
            // Its checksum is being replaced: each block is checked.
            return self.checksum(i, want).map(drop).map_err(seen);
        }
        let got = self.checksum(i, want).map_err(seen)?;
        if &got != want {
            return Err(seen(ReplicaError::CorruptLayer {
                layer: name.to_string(),
                message: format!("checksum {got}, recorded {want}"),
            }));
        }
        Ok(())
    }

    /// Verifies every complete frozen layer (see `verify_layer`).
    pub fn verify(&self) -> Result<(), ReplicaError> {
        for l in &self.layers {
            if self.meta.pending.contains(&l.name) || !self.meta.frozen.contains_key(&l.name) {
                continue;
            }
            self.verify_layer(&l.name)?;
        }
        Ok(())
    }
}
