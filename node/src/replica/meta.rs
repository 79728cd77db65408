//! `meta.json` of a replica: size, layer chain, revision, checksums of the
//! frozen layers. Written crash-safely: temp file, fsync, rename, fsync dir
//! (`write_durably`, which the replica's other small files use too).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::ReplicaError;

pub const META_FILE: &str = "meta.json";
pub const FORMAT_VERSION: u32 = 1;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Meta {
    pub version: u32,
    /// The volume this replica belongs to.
    #[serde(default)]
    pub volume: String,
    /// Bytes.
    pub size: u64,
    pub block_size: u64,
    /// Layer file names, oldest first; the last is the writable head.
    pub chain: Vec<String>,
    /// Checksum (blake3, hex) of each frozen layer's contents.
    pub frozen: BTreeMap<String, String>,
    /// The revision when this file was last written.
    pub revision: u64,
    /// Frozen layers still being filled by a rebuild (their checksums in
    /// `frozen` are what they must reach).
    #[serde(default, skip_serializing_if = "std::collections::BTreeSet::is_empty")]
    pub pending: std::collections::BTreeSet<String>,
    /// Each layer keeps the checksum of every block it holds (`sums`) and
    /// every read is verified against it. False for a replica made before
    /// they existed: nothing to verify against, until it is rebuilt.
    #[serde(default)]
    pub block_sums: bool,
    /// The user snapshot each frozen layer is, by layer name: the layer
    /// holds the volume as it was when that snapshot was taken (with the
    /// layers below it). A join carries the labels with the layers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub snapshots: BTreeMap<String, String>,
    /// A merge under way (see `merge`): an open finishes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merging: Option<super::merge::MergeJournal>,
    /// Blocks of frozen layers that were lost when the layer was frozen,
    /// by layer name: each failed its checksum in the last replica that
    /// held the volume, and no other held it sound. The layer's checksum
    /// covers them as they are; each fails every read, and a fill copies
    /// them as they are, with this record (see `Replica::snapshot_losing`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub lost: BTreeMap<String, std::collections::BTreeSet<u64>>,
}

/// A snapshot id as a layer's label: a DNS label (the store's object
/// names), never a path.
pub fn valid_snapshot_id(id: &str) -> bool {
    ballast::model::validate_name(id).is_ok()
}

impl Meta {
    pub fn head(&self) -> &str {
        self.chain.last().map(String::as_str).unwrap_or_default()
    }

    pub fn read(dir: &Path) -> Result<Meta, ReplicaError> {
        let path = dir.join(META_FILE);
        let bytes = std::fs::read(&path).map_err(|e| ReplicaError::io(&path, e))?;
        Meta::parse(&bytes, &path)
    }

    /// Parses and checks the bytes of a `meta.json` read from `path`.
    pub fn parse(bytes: &[u8], path: &Path) -> Result<Meta, ReplicaError> {
        let meta: Meta = serde_json::from_slice(bytes)
            .map_err(|e| ReplicaError::Corrupt(format!("{}: {e}", path.display())))?;
        if meta.version != FORMAT_VERSION {
            return Err(ReplicaError::Corrupt(format!(
                "{}: format version {} (this build reads {FORMAT_VERSION})",
                path.display(),
                meta.version
            )));
        }
        let merging = meta.merging.iter().flat_map(|j| [&j.from, &j.into]);
        let names = meta
            .chain
            .iter()
            .chain(meta.frozen.keys())
            .chain(&meta.pending)
            .chain(merging);
        if let Some(bad) = names
            .into_iter()
            .find(|n| !super::layers::valid_layer_name(n))
        {
            return Err(ReplicaError::Corrupt(format!(
                "{}: {bad:?} is not a layer name",
                path.display()
            )));
        }
        if let Some((layer, id)) = meta
            .snapshots
            .iter()
            .find(|(l, id)| !meta.frozen.contains_key(*l) || !valid_snapshot_id(id))
        {
            return Err(ReplicaError::Corrupt(format!(
                "{}: snapshot {id:?} labels {layer:?}, which is not a frozen layer, or is not a snapshot id",
                path.display()
            )));
        }
        if let Some(j) = &meta.merging
            && !(meta.frozen.contains_key(&j.from) && meta.frozen.contains_key(&j.into))
        {
            return Err(ReplicaError::Corrupt(format!(
                "{}: a merge of {} into {} names a layer that is not frozen",
                path.display(),
                j.from,
                j.into
            )));
        }
        if let Some(layer) = meta.lost.keys().find(|l| !meta.frozen.contains_key(*l)) {
            return Err(ReplicaError::Corrupt(format!(
                "{}: blocks lost in {layer:?}, which is not a frozen layer",
                path.display()
            )));
        }
        if meta.chain.is_empty() {
            return Err(ReplicaError::Corrupt(format!(
                "{}: no layer in the chain",
                path.display()
            )));
        }
        // What `Replica::create` and `resize` allow, and no more: a size
        // past it would have the open allocate for blocks no volume has.
        if meta.block_size != super::BLOCK
            || meta.size == 0
            || !meta.size.is_multiple_of(super::BLOCK)
            || meta.size > super::MAX_SIZE
        {
            return Err(ReplicaError::Corrupt(format!(
                "{}: size {} in blocks of {} is not a positive multiple of {}, at most {}",
                path.display(),
                meta.size,
                meta.block_size,
                super::BLOCK,
                super::MAX_SIZE
            )));
        }
        if meta.revision > super::revision::MAX_REVISION {
            return Err(ReplicaError::Corrupt(format!(
                "{}: revision {} is past any a replica reaches ({})",
                path.display(),
                meta.revision,
                super::revision::MAX_REVISION
            )));
        }
        Ok(meta)
    }

    pub fn write(&self, dir: &Path) -> Result<(), ReplicaError> {
        let body =
            serde_json::to_vec_pretty(self).map_err(|e| ReplicaError::Corrupt(e.to_string()))?;
        write_durably(dir, META_FILE, &body)
    }
}

/// Replaces `dir/file` with `body` crash-safely: a crash leaves the old
/// file or the new one, whole.
pub fn write_durably(dir: &Path, file: &str, body: &[u8]) -> Result<(), ReplicaError> {
    let tmp = dir.join(format!(".{file}.tmp"));
    let io = |e| ReplicaError::io(&tmp, e);
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(body).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, dir.join(file)).map_err(io)?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io)?;
    Ok(())
}
