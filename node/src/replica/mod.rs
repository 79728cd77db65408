//! The on-disk replica format.
//!
//! A replica is a directory `<disk>/replicas/<volume>-<replicaId>/` with a
//! chain of sparse layer files — immutable snapshots and one writable head
//! — plus `meta.json` (size, chain, revision, checksums of frozen layers)
//! and `revision` (the live revision counter and the write log), and
//! `engine-epoch` once an engine opened it (`fence`). A block is
//! read from the newest layer that holds it; a write goes to the head.
//! Which blocks a layer holds is its allocation, read at open from its
//! extents (SEEK_DATA/SEEK_HOLE): a hole means "not in this layer". Each
//! layer keeps the checksum of every block it holds (`sums`), and every
//! read is verified against it: a corrupt block is an error, never data.
//!
//! This module owns the files of one replica and nothing else: no network,
//! no engine, no placement.

mod bitmap;
mod checksum;
mod fence;
mod instance;
mod integrity;
mod layers;
mod merge;
mod meta;
mod prefetch;
mod regions;
mod revision;
mod room;
mod sums;
mod table;
mod warm;

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

pub use bitmap::Bitmap;
pub use fence::{FENCE_FILE, read as read_fence};
pub use integrity::{Mark, corrupt_layer, mark_corrupt_in};
use integrity::{marks_in, read_suspects};
pub use layers::{Completion, JoinReport, LayerSpec};
pub use merge::{MERGE_CHUNK, MergeEnd, MergeJournal, MergeStep, MergeSum};
pub use meta::{META_FILE, Meta, valid_snapshot_id, write_durably};
pub use prefetch::Prefetch;
pub use regions::{IDLE_FLUSHES, INTERVAL as DIRTY_INTERVAL, REGION as DIRTY_REGION};
pub use revision::{LOG_ENTRIES, LogEntry, LogOp, MAX_REVISION};
pub use room::{ROOM, ROOM_FILE};
pub use sums::{
    Way as SumWay, each as each_block_sum, of as block_sum, of_blocks as block_sums,
    path_of as sums_path_of,
};
pub use table::{
    CopyGuard, LoanGuard, MergeReport, Replicas, Shared, complete_apart, merge_paced,
    remove_replica_dir, replica_dir,
};
pub use warm::{Ahead, Holder, warm};

/// The unit of allocation and of the allocation maps.
pub const BLOCK: u64 = 4096;
/// The largest volume the format holds (16 TiB: each layer is a file of
/// the volume's size, and ext4 makes none larger with 4 KiB blocks).
pub const MAX_SIZE: u64 = ballast::model::MAX_VOLUME_SIZE;
/// By default, after this many bytes written to a head its writeback is
/// started (see `Replica::start_writeback`; a node's `--writeback-every`).
pub const WRITEBACK_EVERY: u64 = 8 << 20;
/// How long a replica's writeback thread waits for its next start before
/// it ends; the next start makes another (`Replica::start_writeback`).
pub const WRITEBACK_IDLE: std::time::Duration = std::time::Duration::from_secs(30);
const REVISION_FILE: &str = "revision";
/// The blocks whose checksums were taken again from their data after a
/// power cut (`repair_head_sums`): a JSON array of block numbers.
const SUSPECT_FILE: &str = "suspect-blocks";
const CORRUPT_FILE: &str = "corrupt-layers";
/// The files a replica keeps of its state beside `META_FILE`, its layers
/// and their checksums (`sums_path_of`): the revision and write log, the
/// regions written lately, the blocks whose checksums were taken again,
/// the layers found corrupt, and the fence. None holds volume data.
pub const BOOKKEEPING_FILES: [&str; 5] = [
    REVISION_FILE,
    regions::REGIONS_FILE,
    SUSPECT_FILE,
    CORRUPT_FILE,
    FENCE_FILE,
];

/// What the text of a `LostBlock` error says of its block.
const LOST: &str = "was lost when the layer was frozen";

/// Where data failed its checksum, as a corruption error names it: what a
/// CORRUPT reply over the wire carries beside its message (see
/// `wire::protocol::error_body`), so that an engine learns which block to
/// repair, or to give up as lost, without reading an error's text.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Corruption {
    /// The layer whose data failed, when the error names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer: Option<String>,
    /// The byte offset in the volume of the block that failed, when one
    /// block did (not the whole layer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<u64>,
    /// The block was lost when its layer was frozen (no replica held it
    /// sound): it fails in every replica, and nothing can repair it.
    #[serde(default)]
    pub lost: bool,
    /// The checksum the replica recorded for that block (`block_sum` of
    /// what was last written there), when it keeps one: another
    /// replica's copy with this checksum is the block's content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorded: Option<u32>,
}

/// Errors of the replica format.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("replica is corrupt: {0}")]
    Corrupt(String),
    /// A frozen layer does not match its recorded checksum.
    #[error("replica is corrupt: layer {layer}: {message}")]
    CorruptLayer { layer: String, message: String },
    /// A block of a layer does not match its checksum.
    #[error("replica is corrupt: block {block} (byte {}) of layer {layer} in {} does not match its checksum", block * BLOCK, dir.display())]
    CorruptBlock {
        dir: PathBuf,
        layer: String,
        block: u64,
        /// Its recorded checksum.
        recorded: Option<u32>,
    },
    /// A block lost when its layer was frozen (`Meta::lost`): no replica
    /// held it sound. Not a new corruption: it marks nothing.
    #[error("replica is corrupt: block {block} (byte {}) of layer {layer} {}: no replica held it sound", block * BLOCK, LOST)]
    LostBlock { layer: String, block: u64 },
    #[error("range {offset}+{len} is outside the volume of {size} bytes")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("{0}")]
    Invalid(String),
    /// A layer changed under a view of the replica (`open_view`) as the
    /// view read it: its owner merged it (see `Replica::as_seen`). No
    /// verdict on its data; read again.
    #[error("{0}")]
    Changed(String),
    /// Work on the replica that must wait for other work under way (a
    /// merge while a fill copies its layers); asked again later.
    #[error("{0}")]
    Busy(String),
}

impl ReplicaError {
    fn io(path: &Path, source: std::io::Error) -> Self {
        ReplicaError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// Whether the disk had no room for what was asked (ENOSPC).
    pub fn is_no_space(&self) -> bool {
        matches!(self, ReplicaError::Io { source, .. } if source.raw_os_error() == Some(nix::libc::ENOSPC))
    }

    /// Where the data failed, for an error of data failing its checksum.
    pub fn corruption(&self) -> Option<Corruption> {
        match self {
            ReplicaError::Corrupt(_) => Some(Corruption::default()),
            ReplicaError::CorruptLayer { layer, .. } => Some(Corruption {
                layer: Some(layer.clone()),
                ..Corruption::default()
            }),
            ReplicaError::CorruptBlock {
                layer,
                block,
                recorded,
                ..
            } => Some(Corruption {
                layer: Some(layer.clone()),
                at: Some(block * BLOCK),
                lost: false,
                recorded: *recorded,
            }),
            ReplicaError::LostBlock { layer, block } => Some(Corruption {
                layer: Some(layer.clone()),
                at: Some(block * BLOCK),
                lost: true,
                recorded: None,
            }),
            _ => None,
        }
    }
}

/// Opens a file of the replica for reading and writing, creating it empty
/// when it is not there.
fn open_or_create(path: &Path) -> Result<File, ReplicaError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| ReplicaError::io(path, e))
}

/// One layer: its file, the blocks it holds, and their checksums.
struct Layer {
    name: String,
    path: PathBuf,
    file: File,
    map: Bitmap,
    /// None for a replica made before per-block checksums.
    sums: Option<sums::BlockSums>,
}

impl Layer {
    /// Opens layer `name` of a replica in `dir`, of `blocks` blocks.
    fn open(dir: &Path, name: &str, blocks: u64, with_sums: bool) -> Result<Layer, ReplicaError> {
        let path = dir.join(name);
        let file = open_rw(&path)?;
        let map = allocation(&file, blocks).map_err(|e| ReplicaError::io(&path, e))?;
        let sums = if with_sums {
            Some(sums::BlockSums::open(&sums::path_of(&path), blocks)?)
        } else {
            None
        };
        Ok(Layer {
            name: name.to_string(),
            path,
            file,
            map,
            sums,
        })
    }

    /// Reads whole blocks at block `first` and checks them against the
    /// layer's checksums.
    fn read_checked(&self, first: u64, buf: &mut [u8]) -> Result<(), ReplicaError> {
        self.file
            .read_exact_at(buf, first * BLOCK)
            .map_err(|e| ReplicaError::io(&self.path, e))?;
        if let Some(s) = &self.sums
            && let Err(b) = s.check(first, buf)
        {
            return Err(self.corrupt(b));
        }
        Ok(())
    }

    /// The checksum of block `b`, which the layer holds: its table's, or
    /// taken from its data (read into `buf`) where it keeps none.
    fn sum_of(&self, b: u64, buf: &mut [u8]) -> Result<u32, ReplicaError> {
        match &self.sums {
            Some(s) => Ok(s.get(b)),
            None => {
                self.read_checked(b, buf)?;
                Ok(sums::of(buf))
            }
        }
    }

    /// Punches blocks `first..last` out of the file: holes, no longer held.
    fn punch(&mut self, first: u64, last: u64) -> Result<(), ReplicaError> {
        nix::fcntl::fallocate(
            self.file.as_fd(),
            nix::fcntl::FallocateFlags::FALLOC_FL_PUNCH_HOLE
                | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE,
            (first * BLOCK) as i64,
            ((last - first) * BLOCK) as i64,
        )
        .map_err(|e| ReplicaError::io(&self.path, e.into()))?;
        self.map.set_range(first, last, false);
        // A block the layer no longer holds has no checksum (0): after a
        // power cut, the checksum on the disk of one that data appears in
        // is then none, not that of a write the punch removed.
        if let Some(s) = &mut self.sums {
            for b in first..last {
                if s.get(b) != 0 {
                    s.set(b, 0)?;
                }
            }
        }
        Ok(())
    }

    fn corrupt(&self, block: u64) -> ReplicaError {
        ReplicaError::CorruptBlock {
            dir: self
                .path
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default(),
            layer: self.name.clone(),
            block,
            recorded: self.sums.as_ref().map(|s| s.get(block)),
        }
    }

    /// The layer's checksum in the form of record `like`, recording each
    /// block's checksum in its table as it is read (a layer just filled
    /// by a rebuild, whose table is empty).
    fn checksum_taking_sums(&mut self, like: &str) -> Result<String, ReplicaError> {
        let mut sums = self.sums.take();
        let got = checksum::take(self, checksum::Form::of(like), |b, chunk| {
            if let Some(s) = &mut sums {
                s.set_all(b, chunk)?;
            }
            Ok(())
        });
        self.sums = sums;
        got
    }

    /// A second handle on the layer, for work done without the replica
    /// (a merge's end, a fill's completion): its file, a copy of its map,
    /// its table mapped again. The caller sees to it that the layer does
    /// not change meanwhile (`Replica::epoch`).
    fn second_handle(&self, blocks: u64) -> Result<Layer, ReplicaError> {
        let file = self
            .file
            .try_clone()
            .map_err(|e| ReplicaError::io(&self.path, e))?;
        let sums = match &self.sums {
            Some(_) => Some(sums::BlockSums::open(&sums::path_of(&self.path), blocks)?),
            None => None,
        };
        Ok(Layer {
            name: self.name.clone(),
            path: self.path.clone(),
            file,
            map: self.map.clone(),
            sums,
        })
    }

    /// Records the checksums of blocks `first..last` as the file holds them.
    fn sum_from_file(&mut self, first: u64, last: u64) -> Result<(), ReplicaError> {
        let Some(s) = &mut self.sums else {
            return Ok(());
        };
        let mut block = vec![0u8; BLOCK as usize];
        for b in first..last {
            self.file
                .read_exact_at(&mut block, b * BLOCK)
                .map_err(|e| ReplicaError::io(&self.path, e))?;
            s.set(b, sums::of(&block))?;
        }
        Ok(())
    }
}

/// Closes what the replica held open of files whose names are gone (a
/// layer dropped from the chain, a pending layer's file replaced, a layer
/// file no chain names found at an open), on a
/// thread of its own: the last close of such a file frees its blocks, and
/// on a filesystem mounted with `discard` it discards each of them before
/// it returns (300 ms for 512 MiB on the test machines, the merge bench,
/// 2026-12-07), which neither the replica's lock nor a volume whose I/O a
/// join pauses should wait for. Closed here when no thread can be made.
fn close_apart<T: Send + 'static>(held: T) {
    let _ = std::thread::Builder::new()
        .name("layer-close".into())
        .spawn(move || drop(held));
}

/// A layer as `layers` (and the LAYERS reply) reports it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LayerInfo {
    pub name: String,
    /// Bytes of data the layer holds.
    pub allocated: u64,
    /// Checksum when frozen; None for the head.
    pub checksum: Option<String>,
    /// Still being filled by a rebuild.
    pub pending: bool,
    /// The user snapshot this frozen layer is, if it is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// Blocks lost when the layer was frozen (`Meta::lost`): a fill copies
    /// them as they are and records them lost.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lost: Vec<u64>,
}

/// An open replica.
pub struct Replica {
    dir: PathBuf,
    meta: Meta,
    /// Oldest first; the last is the head.
    layers: Vec<Layer>,
    revision: u64,
    revision_file: revision::RevisionCounter,
    /// Set when the replica's disk went away: every I/O fails from then on.
    broken: Option<String>,
    /// Bytes written to the head since its writeback was last started.
    unstarted: u64,
    /// Start writeback after this many bytes; 0 leaves it to the kernel.
    writeback_every: u64,
    /// The thread that starts writeback, made when one is to start and
    /// none runs; it ends once idle for `writeback_idle`, or with the
    /// replica.
    writeback: Option<std::sync::mpsc::SyncSender<File>>,
    /// `WRITEBACK_IDLE` unless set.
    writeback_idle: std::time::Duration,
    /// Frozen layers found corrupt (the file `corrupt-layers`, one mark per
    /// line, only ever added to; see `Mark`): never kept by a rebuild; true
    /// for a layer marked whole, which is never served nor copied.
    corrupt: std::sync::Mutex<std::collections::BTreeMap<String, bool>>,
    /// Whether `corrupt` holds any layer: reads look at it without a lock.
    any_corrupt: std::sync::atomic::AtomicBool,
    /// Blocks found not to match their checksums after a power cut, whose
    /// checksums were then taken from their data (the file
    /// `suspect-blocks`): each holds either a write no flush covered, or
    /// bytes gone bad, and only another replica can tell. A write of the
    /// whole block settles it.
    suspect: BTreeSet<u64>,
    /// Of the suspect blocks, those whose checksum on the disk was their
    /// state at the last flush or later when they were found (the head's
    /// checksums were synced at every flush, `sums_every_flush`): that
    /// checksum, which a copy from another replica must match to settle
    /// the block (`engine::settle`). Kept in `suspect-blocks` with them.
    suspect_sums: std::collections::BTreeMap<u64, u32>,
    /// Whether `suspect-blocks` still names blocks a write has settled
    /// since: it is written again at the next flush, once what settled
    /// them is durable, not at each such write.
    suspect_stale: std::sync::atomic::AtomicBool,
    /// The regions of the volume that may hold data no flush covered: what
    /// a new boot checks of the head (`regions`).
    regions: std::sync::Mutex<regions::DirtyRegions>,
    /// Opened as a view (`open_view`): another owns the files.
    is_view: bool,
    /// The digests of the head's chunks read ahead of its freeze (`warm`).
    warm: std::sync::Mutex<warm::Warm>,
    /// What the last freeze took of its head: chunks read ahead, chunks
    /// it read itself (`last_freeze`).
    last_freeze: (u64, u64),
    /// Threads a freeze reads its head's chunks with
    /// (`checksum::freeze_readers`, `set_freeze_readers`).
    freeze_readers: usize,
    /// Counts the changes of the chain and of the blocks of frozen and
    /// pending layers, other than a merge's copies (`merge_some`): a merge
    /// begun or ended, a join, a pending layer written, punched, emptied
    /// or replaced. Work on a layer done without the replica (a merge's
    /// end, `MergeEnd`; a fill's completion, `Completion`) is recorded only
    /// when the count is still the one it began at.
    epoch: u64,
}

fn layer_name(n: usize) -> String {
    format!("layer-{n:06}.img")
}

/// The name of a new layer after `chain`: one past the highest number in
/// it (a chain need not number its layers without gaps: a restore starts
/// its head after the snapshot's layer).
pub fn next_layer_name<'a>(chain: impl IntoIterator<Item = &'a str>) -> String {
    let n = chain
        .into_iter()
        .filter_map(|l| {
            l.strip_prefix("layer-")?
                .strip_suffix(".img")?
                .parse::<usize>()
                .ok()
        })
        .max()
        .unwrap_or(0);
    layer_name(n + 1)
}

/// Starts writing `len` bytes of `file`'s dirty pages from `offset` back
/// to the disk (`len` 0: to the end), without waiting for them. Only a
/// start: durability is a later sync's.
pub fn begin_writeback(file: &File, offset: u64, len: u64) -> std::io::Result<()> {
    // SAFETY: a plain system call on an open descriptor; no memory is
    // passed.
    let r = unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            offset as i64,
            len as i64,
            libc::SYNC_FILE_RANGE_WRITE,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Blocks of `file` that hold data, from its extents.
pub fn allocation(file: &File, blocks: u64) -> Result<Bitmap, std::io::Error> {
    use nix::unistd::{Whence, lseek};
    let mut map = Bitmap::new(blocks);
    let len = file.metadata()?.len() as i64;
    let mut pos: i64 = 0;
    while pos < len {
        let data = match lseek(file.as_fd(), pos, Whence::SeekData) {
            Ok(d) => d,
            Err(nix::errno::Errno::ENXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let hole = lseek(file.as_fd(), data, Whence::SeekHole)?;
        map.set_range(data as u64 / BLOCK, (hole as u64).div_ceil(BLOCK), true);
        pos = hole;
    }
    Ok(map)
}

/// Checks whole blocks `data` (from block `first`) against `sums`, passing
/// over those in `lost` that fail (each given to `found`): a block lost when
/// its layer was frozen fails by its nature. The first other block that
/// fails.
fn check_but(
    sums: &sums::BlockSums,
    first: u64,
    data: &[u8],
    lost: &BTreeSet<u64>,
    found: &mut impl FnMut(u64),
) -> Result<(), u64> {
    let mut at = first;
    loop {
        let from = ((at - first) * BLOCK) as usize;
        match sums.check(at, &data[from..]) {
            Ok(()) => return Ok(()),
            Err(b) if lost.contains(&b) => {
                found(b);
                at = b + 1;
            }
            Err(b) => return Err(b),
        }
    }
}

fn open_rw(path: &Path) -> Result<File, ReplicaError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| ReplicaError::io(path, e))
}

impl Replica {
    /// Creates an empty replica of `size` bytes in `dir` (which must not
    /// hold one already).
    pub fn create(dir: &Path, size: u64) -> Result<Replica, ReplicaError> {
        Replica::create_for(dir, "", size)
    }

    /// Like `create`, recording the volume the replica belongs to.
    pub fn create_for(dir: &Path, volume: &str, size: u64) -> Result<Replica, ReplicaError> {
        Replica::create_with(dir, volume, size, true)
    }

    /// Like `create`, in the format from before per-block checksums: no
    /// block is checked. Only for measuring what the checksums cost.
    pub fn create_without_block_sums(dir: &Path, size: u64) -> Result<Replica, ReplicaError> {
        Replica::create_with(dir, "", size, false)
    }

    fn create_with(
        dir: &Path,
        volume: &str,
        size: u64,
        block_sums: bool,
    ) -> Result<Replica, ReplicaError> {
        if size == 0 || !size.is_multiple_of(BLOCK) || size > MAX_SIZE {
            return Err(ReplicaError::Invalid(format!(
                "size {size} is not a positive multiple of {BLOCK} of at most {MAX_SIZE}"
            )));
        }
        if dir.join(META_FILE).exists() {
            return Err(ReplicaError::Invalid(format!(
                "{} already holds a replica",
                dir.display()
            )));
        }
        std::fs::create_dir_all(dir).map_err(|e| ReplicaError::io(dir, e))?;
        let head = layer_name(1);
        let path = dir.join(&head);
        let f = File::create(&path).map_err(|e| ReplicaError::io(&path, e))?;
        f.set_len(size).map_err(|e| ReplicaError::io(&path, e))?;
        f.sync_all().map_err(|e| ReplicaError::io(&path, e))?;
        let meta = Meta {
            version: meta::FORMAT_VERSION,
            volume: volume.to_string(),
            size,
            block_size: BLOCK,
            chain: vec![head],
            frozen: Default::default(),
            revision: 0,
            pending: Default::default(),
            block_sums,
            snapshots: Default::default(),
            merging: None,
            lost: Default::default(),
        };
        let rev = dir.join(REVISION_FILE);
        std::fs::write(&rev, 0u64.to_le_bytes()).map_err(|e| ReplicaError::io(&rev, e))?;
        // Nothing written yet: no region dirty. Its bytes are allocated
        // now, so that a mark needs no room on a full disk.
        regions::DirtyRegions::create(dir, size)?;
        // Its fence too, raised in place later (`fence`).
        fence::create(dir)?;
        meta.write(dir)?;
        Replica::open(dir)
    }

    /// Opens a replica as its owner (its server, or the engine it is lent
    /// to), building each layer's allocation from its extents; after an
    /// unclean stop the head's checksums of unflushed writes are taken
    /// again (`repair_head_sums`).
    pub fn open(dir: &Path) -> Result<Replica, ReplicaError> {
        let mut r = Replica::open_view(dir)?;
        r.is_view = false;
        r.regions
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .own();
        r.repair_head_sums()?;
        r.finish_cut_off_merge()?;
        r.remove_stray_layers();
        room::keep(&r.dir);
        Ok(r)
    }

    /// Removes layer files the chain does not name (a merge or a join
    /// stopped after it wrote the new chain, before the old files went).
    /// Each is held open while its name goes and closed apart
    /// (`close_apart`): an open, inside an engine's handshake, does not
    /// wait for its blocks to be freed.
    fn remove_stray_layers(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            // A layer's table is `<layer>.sums` beside `<layer>.img`
            // (`sums::path_of`): until 2026-12-07 it was taken for a
            // layer named `<layer>`, no layer's name, and stayed.
            let layer = match name.strip_suffix(".sums") {
                Some(stem) => format!("{stem}.img"),
                None => name.clone(),
            };
            if layers::valid_layer_name(&layer) && !self.meta.chain.contains(&layer) {
                tracing::info!(dir = %self.dir.display(), file = %name, "removing a layer file no chain names");
                let held = File::open(e.path()).ok();
                let _ = std::fs::remove_file(e.path());
                close_apart(held);
            }
        }
    }

    /// Opens a replica to look at it while another holds it (a lent
    /// replica's INFO and LAYERS): it writes nothing.
    pub fn open_view(dir: &Path) -> Result<Replica, ReplicaError> {
        let meta = Meta::read(dir)?;
        // Allocation is read from extents: the filesystem's blocks must not
        // be larger than ours, or unwritten blocks would look written.
        let fs = nix::sys::statvfs::statvfs(dir).map_err(|e| ReplicaError::io(dir, e.into()))?;
        if fs.fragment_size() > BLOCK {
            return Err(ReplicaError::Invalid(format!(
                "{}: filesystem block size {} is larger than {BLOCK}",
                dir.display(),
                fs.fragment_size()
            )));
        }
        let blocks = meta.size / BLOCK;
        let mut layers = Vec::new();
        for (i, name) in meta.chain.iter().enumerate() {
            let path = dir.join(name);
            // A join writes its new chain first and makes the files after:
            // a pending layer or a head cut off by a crash starts empty.
            let may_be_missing = meta.pending.contains(name) || i + 1 == meta.chain.len();
            if may_be_missing && !path.exists() {
                layers::empty_layer(&path, meta.size)?;
            }
            layers.push(Layer::open(dir, name, blocks, meta.block_sums)?);
        }
        let (revision_file, stored) = revision::RevisionCounter::open(&dir.join(REVISION_FILE))?;
        let corrupt = marks_in(dir)?;
        let (suspect, suspect_sums) = read_suspects(dir, blocks)?;
        Ok(Replica {
            any_corrupt: std::sync::atomic::AtomicBool::new(!corrupt.is_empty()),
            corrupt: std::sync::Mutex::new(corrupt),
            broken: None,
            unstarted: 0,
            writeback_every: WRITEBACK_EVERY,
            writeback: None,
            writeback_idle: WRITEBACK_IDLE,
            dir: dir.to_path_buf(),
            revision: stored.max(meta.revision),
            meta,
            layers,
            revision_file,
            suspect,
            suspect_sums,
            suspect_stale: std::sync::atomic::AtomicBool::new(false),
            regions: std::sync::Mutex::new(regions::DirtyRegions::read(dir)),
            is_view: true,
            warm: std::sync::Mutex::default(),
            last_freeze: (0, 0),
            freeze_readers: checksum::freeze_readers(),
            epoch: 0,
        })
    }

    /// After an unclean stop (writes since the last flush), the head's
    /// checksums of the blocks those writes touched may not match their
    /// data (one reached the disk, the other not): they are taken again
    /// from the data, for the ranges the write log names, or for the
    /// regions written lately (`regions`; the whole head when they are not
    /// recorded) when the log does not reach back to the last flush.
    ///
    /// After a power cut (a new boot), the page cache the replica was last
    /// opened in is gone (`instance`), and with it whatever of the write
    /// log and the checksums no flush had made durable, while data of
    /// later writes may have reached the disk without them. Neither the
    /// counter nor the log can then say which blocks changed: every block
    /// of the head in the regions written lately is checked (`regions`;
    /// the whole head when they are not recorded), and one that fails is
    /// recorded as suspect
    /// (`suspect`) and its checksum taken from its data (the one on the
    /// disk kept with it, when the mark says the checksums were synced at
    /// every flush: `suspect_sums`); the log answers
    /// nothing about revisions up to this one (a replica that must be made
    /// equal to another is then rebuilt, not caught up). The boot it is
    /// opened in now is recorded, durably, before any write.
    fn repair_head_sums(&mut self) -> Result<(), ReplicaError> {
        let here = instance::here();
        let before = self.revision_file.opened_in();
        let unknown = [0u8; 16];
        // Closed clean (`close_clean`), nothing of it was left in the page
        // cache: a new boot lost nothing of it. The mark is cleared, on the
        // disk, before anything is written.
        let clean = self.revision_file.closed_clean_at(self.revision);
        let marked = self.revision_file.has_clean_mark();
        if marked {
            self.revision_file.clear_closed_clean();
        }
        let cache_lost = before != unknown && here != unknown && before != here && !clean;
        if clean && before != here {
            tracing::info!(dir = %self.dir.display(), revision = self.revision,
                "opened in a new boot after a clean close: its head and its write log are trusted as they are");
        }
        if cache_lost {
            tracing::warn!(dir = %self.dir.display(), revision = self.revision,
                "opened in a new boot (a power cut, or a crash of the kernel): the head's blocks in the regions written lately are checked, and its write log is not trusted");
            self.revision_file.forget_log_before(self.revision + 1);
        }
        let flushed = self.revision_file.flushed();
        let mut changed = before != here || cache_lost || marked;
        if self.meta.block_sums && self.meta.pending.is_empty() {
            let writes = self.revision_file.since(flushed).unwrap_or_default();
            let covered = !cache_lost
                && (writes.first().map(|e| e.revision) == flushed.checked_add(1)
                    || self.revision <= flushed);
            let head = self.layers.len() - 1;
            let dirty = self
                .regions
                .get_mut()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .dirty_runs(self.meta.size / BLOCK);
            let whole_head = !covered && dirty.is_none();
            let runs: Vec<(u64, u64)> = if covered {
                writes
                    .iter()
                    .map(|e| {
                        (
                            e.offset / BLOCK,
                            e.offset.saturating_add(e.len).div_ceil(BLOCK),
                        )
                    })
                    .collect()
            } else {
                // The regions no flush covered, or the whole head when
                // that is not known.
                dirty.unwrap_or_else(|| self.layers[head].map.runs())
            };
            if !runs.is_empty() {
                tracing::info!(dir = %self.dir.display(), ranges = runs.len(), whole_head, "taking the head's block checksums again after an unclean stop");
                let blocks = self.meta.size / BLOCK;
                let mut held = Vec::new();
                for (first, last) in runs {
                    let last = last.min(blocks);
                    held.extend((first..last).filter(|b| self.layers[head].map.get(*b)));
                }
                if cache_lost {
                    // Only the blocks that fail: recorded as suspect, on
                    // the disk, before their checksums change.
                    let mut block = vec![0u8; BLOCK as usize];
                    held.retain(|b| self.layers[head].read_checked(*b, &mut block).is_err());
                    // Synced at every flush, each one's checksum on the
                    // disk is its state at the last flush or later: a copy
                    // elsewhere that matches it may settle it, and one with
                    // none held no flushed write of the head.
                    let trusted = self.revision_file.sums_every_flush();
                    if trusted {
                        let dir = self.dir.clone();
                        room::or_given_up(&dir, "punch blocks out of the head", || {
                            self.drop_unflushed(&mut held)
                        })?;
                    }
                    if !held.is_empty() {
                        tracing::warn!(dir = %self.dir.display(), blocks = held.len(), checksums_kept = trusted,
                            "blocks of the head that no longer match their checksums after a new boot: written with no flush after them, or gone bad; taken as they are, and suspect until another replica's copy or a write settles them");
                        if let Some(s) = self.layers[head].sums.as_ref().filter(|_| trusted) {
                            self.suspect_sums
                                .extend(held.iter().map(|&b| (b, s.get(b))));
                        }
                        self.suspect.extend(held.iter().copied());
                        room::or_given_up(&self.dir, "record the suspect blocks", || {
                            self.write_suspects()
                        })?;
                    }
                }
                for b in held {
                    self.layers[head].sum_from_file(b, b + 1)?;
                }
                if let Some(s) = &self.layers[head].sums {
                    s.sync()?;
                }
                self.revision_file.mark_flushed(self.revision);
                changed = true;
            }
        }
        if changed {
            self.revision_file.set_opened_in(&here);
            self.revision_file.sync()?;
        }
        Ok(())
    }

    /// Of the head's blocks in `failing` (found not to match their
    /// checksums in a new boot, while the checksums were synced at every
    /// flush), those whose checksum on the disk is none held no write of
    /// the head at the last flush (the head did not hold them, or a punch
    /// removed them): what they hold now came after it, or from the disk
    /// gone bad. They go from the head, which then reads what the layers
    /// below hold, their state at the last flush, and are taken out of
    /// `failing`.
    fn drop_unflushed(&mut self, failing: &mut Vec<u64>) -> Result<(), ReplicaError> {
        let head = self.layers.len() - 1;
        let Some(s) = &self.layers[head].sums else {
            return Ok(());
        };
        let (none, rest): (Vec<u64>, Vec<u64>) = failing.iter().partition(|&&b| s.get(b) == 0);
        for &b in &none {
            self.layers[head].punch(b, b + 1)?;
        }
        if !none.is_empty() {
            tracing::warn!(dir = %self.dir.display(), blocks = none.len(),
                "blocks of the head that held no flushed write, yet hold data after a new boot: taken out of the head, which reads what the layers below hold, as at the last flush");
        }
        *failing = rest;
        Ok(())
    }

    /// Closes the replica clean, as its owner lets it go for good (a node
    /// plugin or an engine told to stop): every write made durable
    /// (`flush`), then a mark in the revision file that nothing was left
    /// unsynced at this revision, and every I/O of this instance failed
    /// from then on (`broken`), since a write after the mark would make it
    /// a lie. A new boot's open then trusts the head's checksums and the
    /// write log as the same boot's would, instead of checking the head and
    /// forgetting the log (`repair_head_sums`): a planned reboot costs
    /// neither. Nothing is marked while a rebuild's fill or a merge is
    /// under way, or when the replica is broken already. Returns whether
    /// it marked.
    pub fn close_clean(&mut self, why: &str) -> Result<bool, ReplicaError> {
        if self.broken.is_some() {
            return Ok(false);
        }
        let quiet = self.meta.pending.is_empty() && self.meta.merging.is_none();
        let marked = if quiet {
            self.flush_sums(true).and_then(|()| {
                self.revision_file.mark_closed_clean(self.revision);
                self.revision_file.sync()
            })
        } else {
            Ok(())
        };
        self.break_off(format!("closed: {why}"));
        marked.map(|()| quiet)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn size(&self) -> u64 {
        self.meta.size
    }

    pub fn volume(&self) -> &str {
        &self.meta.volume
    }

    pub fn revision(&self) -> u64 {
        self.revision
    }

    pub fn chain(&self) -> Vec<String> {
        self.meta.chain.clone()
    }

    /// Why every I/O fails, when its disk went away.
    pub fn broken(&self) -> Option<&str> {
        self.broken.as_deref()
    }

    /// Fails every I/O from now on (its disk is gone or not its own).
    pub fn break_off(&mut self, why: String) {
        self.broken = Some(why);
    }

    fn check(&self, offset: u64, len: u64) -> Result<(), ReplicaError> {
        if let Some(why) = &self.broken {
            return Err(ReplicaError::io(
                &self.dir,
                std::io::Error::other(why.clone()),
            ));
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.meta.size => Ok(()),
            _ => Err(ReplicaError::OutOfRange {
                offset,
                len,
                size: self.meta.size,
            }),
        }
    }

    /// The newest layer holding block `b`.
    /// The first block of `first..last` that layer `name` lost when it
    /// was frozen (`Meta::lost`).
    fn lost_in(&self, name: &str, first: u64, last: u64) -> Option<u64> {
        self.lost_of(name).range(first..last).next().copied()
    }

    /// The blocks layer `name` lost when it was frozen.
    pub(super) fn lost_of(&self, name: &str) -> &BTreeSet<u64> {
        static NONE: BTreeSet<u64> = BTreeSet::new();
        self.meta.lost.get(name).unwrap_or(&NONE)
    }

    fn holder(&self, b: u64) -> Option<usize> {
        (0..self.layers.len())
            .rev()
            .find(|&i| self.layers[i].map.get(b))
    }

    /// Reads `buf.len()` bytes at `offset`; every block taken from a layer
    /// is checked against that layer's checksums.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ReplicaError> {
        self.check(offset, buf.len() as u64)?;
        let end = offset + buf.len() as u64;
        let mut pos = offset;
        while pos < end {
            let b = pos / BLOCK;
            let holder = self.holder(b);
            // Extend the run while the same layer holds the next blocks.
            let mut run_end = ((b + 1) * BLOCK).min(end);
            while run_end < end && self.holder(run_end / BLOCK) == holder {
                run_end = ((run_end / BLOCK + 1) * BLOCK).min(end);
            }
            let out = &mut buf[(pos - offset) as usize..(run_end - offset) as usize];
            match holder {
                Some(i) => self.read_layer_run(i, pos, out)?,
                None => out.fill(0),
            }
            pos = run_end;
        }
        Ok(())
    }

    /// Reads `out.len()` bytes at `pos` from layer `i`, checked: whole
    /// blocks go straight into `out`, a partial one through a block buffer.
    fn read_layer_run(&self, i: usize, pos: u64, out: &mut [u8]) -> Result<(), ReplicaError> {
        let l = &self.layers[i];
        let end = pos + out.len() as u64;
        if let Some(block) = self.lost_in(&l.name, pos / BLOCK, end.div_ceil(BLOCK)) {
            return Err(ReplicaError::LostBlock {
                layer: l.name.clone(),
                block,
            });
        }
        let checked = l.sums.is_some() && !self.meta.pending.contains(&l.name);
        if !checked {
            return l
                .file
                .read_exact_at(out, pos)
                .map_err(|e| ReplicaError::io(&l.path, e));
        }
        // A layer marked for a block is served: that block fails its own
        // checksum below, at every read.
        if self.is_unserved(&l.name) {
            return Err(ReplicaError::Corrupt(format!(
                "layer {} was found corrupt",
                l.name
            )));
        }
        if pos.is_multiple_of(BLOCK) && end.is_multiple_of(BLOCK) {
            return l
                .read_checked(pos / BLOCK, out)
                .map_err(|e| self.as_seen(e));
        }
        let (first, last) = (pos / BLOCK, end.div_ceil(BLOCK));
        let mut whole = vec![0u8; ((last - first) * BLOCK) as usize];
        l.read_checked(first, &mut whole)
            .map_err(|e| self.as_seen(e))?;
        let at = (pos - first * BLOCK) as usize;
        out.copy_from_slice(&whole[at..at + out.len()]);
        Ok(())
    }

    fn head(&self) -> &Layer {
        &self.layers[self.layers.len() - 1]
    }

    /// Starts the head's writeback after every `bytes` written (0: never,
    /// the kernel decides).
    pub fn set_writeback_every(&mut self, bytes: u64) {
        self.writeback_every = bytes;
    }

    /// Sets how long the writeback thread waits for its next start before
    /// it ends (`WRITEBACK_IDLE` unless set).
    pub fn set_writeback_idle(&mut self, idle: std::time::Duration) {
        self.writeback_idle = idle;
    }

    /// Sets the shortest flush interval of the dirty regions
    /// (`DIRTY_INTERVAL` unless set): how often at most a flush syncs the
    /// head's checksums and clears regions.
    pub fn set_flush_interval(&mut self, interval: std::time::Duration) {
        self.regions
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .set_interval(interval);
    }

    /// Starts (without waiting for it) the writeback of the head's dirty
    /// pages, so that they go to the disk while writes go on rather than
    /// all at the next flush. A thread of the replica's own starts it (the
    /// call may wait for the disk's queue); it ends once no start came for
    /// `writeback_idle`, and the next start makes another: a node holds
    /// open every replica it has served, and a thread kept for each was a
    /// thread for every replica ever written through the node. A start
    /// handed to a thread just ending is lost: only the early start of
    /// those pages, which the next start or a flush covers.
    fn start_writeback(&mut self) {
        let head = self.head();
        let Ok(f) = head.file.try_clone() else {
            return;
        };
        let f = match &self.writeback {
            // Busy with the last one: that one covers these pages too.
            Some(tx) => match tx.try_send(f) {
                Ok(()) | Err(std::sync::mpsc::TrySendError::Full(_)) => return,
                Err(std::sync::mpsc::TrySendError::Disconnected(f)) => f,
            },
            None => f,
        };
        self.writeback = None;
        let (tx, rx) = std::sync::mpsc::sync_channel::<File>(1);
        let idle = self.writeback_idle;
        let spawned = std::thread::Builder::new()
            .name("writeback".into())
            .spawn(move || {
                while let Ok(f) = rx.recv_timeout(idle) {
                    if let Err(e) = begin_writeback(&f, 0, 0) {
                        tracing::debug!(error = %e, "starting writeback failed");
                    }
                }
            });
        if spawned.is_ok() {
            let _ = tx.try_send(f);
            self.writeback = Some(tx);
        }
    }

    /// Every write after revision `since` that the write log holds, in
    /// order, intents whose write may not have ended included; None when
    /// the log does not reach back that far (see `revision::since`).
    pub fn writes_since(&self, since: u64) -> Option<Vec<LogEntry>> {
        self.revision_file.since(since)
    }

    /// The runs of blocks (`[first, last)`, in order) of the regions
    /// written lately (`regions`): where this replica may differ from
    /// another of its volume after an unclean stop. The head's allocated
    /// runs where the regions are not recorded.
    pub fn recent_runs(&self) -> Vec<(u64, u64)> {
        let blocks = self.meta.size / BLOCK;
        let dirty = self
            .regions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .dirty_runs(blocks);
        dirty.unwrap_or_else(|| self.head().map.runs())
    }

    /// Records the revision of the latest write (not synced until flush).
    fn bump(&mut self, revision: Option<u64>) -> Result<(), ReplicaError> {
        self.revision = revision.unwrap_or(self.revision + 1).max(self.revision);
        self.revision_file.store(self.revision);
        Ok(())
    }

    /// Records the head's checksums of the blocks a write of `data` at
    /// `offset` touched: from the data for whole blocks, from the file for
    /// the partial ones at its ends.
    fn sum_written(
        &mut self,
        offset: u64,
        data: &[u8],
        given: Option<&[u8]>,
    ) -> Result<(), ReplicaError> {
        let head_idx = self.layers.len() - 1;
        let head = &mut self.layers[head_idx];
        if head.sums.is_none() {
            return Ok(());
        }
        if let (Some(given), Some(s)) = (given, &mut head.sums) {
            // Whole blocks (`write_summed` checked): as the engine took them.
            s.set_given(offset / BLOCK, given)?;
            return Ok(());
        }
        let end = offset + data.len() as u64;
        let (first, last) = (offset / BLOCK, end.div_ceil(BLOCK));
        let (whole_first, whole_last) = (offset.div_ceil(BLOCK), end / BLOCK);
        if whole_first < whole_last {
            let at = (whole_first * BLOCK - offset) as usize;
            let whole = &data[at..at + ((whole_last - whole_first) * BLOCK) as usize];
            if let Some(s) = &mut head.sums {
                s.set_all(whole_first, whole)?;
            }
        }
        // The partial blocks at either end: their whole content is in the
        // file now.
        let partial_first = !offset.is_multiple_of(BLOCK) || end < (first + 1) * BLOCK;
        let partial_last = !end.is_multiple_of(BLOCK) && last - 1 != first;
        if partial_first {
            head.sum_from_file(first, first + 1)?;
        }
        if partial_last {
            head.sum_from_file(last - 1, last)?;
        }
        Ok(())
    }

    /// The revision a mutation gets: the engine's, or the next one.
    fn next_revision(&self, revision: Option<u64>) -> u64 {
        revision.unwrap_or(self.revision + 1)
    }

    /// Records a mutation's intent in the write log before its data is
    /// written (see `revision`): only one that moves the revision on.
    fn log_intent(&mut self, revision: u64, op: LogOp, offset: u64, len: u64) {
        if revision > self.revision {
            self.revision_file.log(revision, op, offset, len);
        }
    }

    /// Writes `data` at `offset` into the head. A partial block not yet in
    /// the head is first filled from the layers below (copy on write).
    pub fn write(
        &mut self,
        offset: u64,
        data: &[u8],
        revision: Option<u64>,
    ) -> Result<(), ReplicaError> {
        self.write_logged(offset, data, None, revision)
    }

    /// Whether its layers keep per-block checksums (a replica made before
    /// them does not; fixed for a replica's life).
    pub fn keeps_sums(&self) -> bool {
        self.meta.block_sums
    }

    /// `write` of whole blocks with their checksums as the engine computed
    /// them (`sums::of_blocks`), recorded as given rather than taken
    /// again. A block that reached this replica other than the engine sent
    /// it then fails its checksum when read, and is never served.
    pub fn write_summed(
        &mut self,
        offset: u64,
        data: &[u8],
        sums: &[u8],
        revision: Option<u64>,
    ) -> Result<(), ReplicaError> {
        let whole = offset.is_multiple_of(BLOCK) && (data.len() as u64).is_multiple_of(BLOCK);
        if !whole || sums.len() as u64 != data.len() as u64 / BLOCK * 4 {
            return Err(ReplicaError::Invalid(format!(
                "a write with checksums must be whole blocks with 4 bytes of checksum each: {offset}+{} with {} bytes",
                data.len(),
                sums.len()
            )));
        }
        self.write_logged(offset, data, Some(sums), revision)
    }

    /// A write's intent logged, its data (with `given` checksums, if any)
    /// written, and the revision moved on: `write` and `write_summed`.
    fn write_logged(
        &mut self,
        offset: u64,
        data: &[u8],
        given: Option<&[u8]>,
        revision: Option<u64>,
    ) -> Result<(), ReplicaError> {
        self.check(offset, data.len() as u64)?;
        let rev = self.next_revision(revision);
        self.log_intent(rev, LogOp::Write, offset, data.len() as u64);
        self.write_data(offset, data, given)?;
        self.bump(Some(rev))
    }

    /// A write or trim of `offset..end` that covers part of a block the
    /// head holds keeps the rest of that block's bytes, and the block's
    /// checksum is taken again from the file: so its old content is checked
    /// first, or a block gone bad on the disk would come out of the write
    /// with a checksum to match, and be served. Checked before anything
    /// changes, so that a refusal leaves the replica as it was.
    fn check_partial_edges(&self, offset: u64, end: u64) -> Result<(), ReplicaError> {
        let head = self.head();
        if head.sums.is_none() || end <= offset {
            return Ok(());
        }
        let (first, last) = (offset / BLOCK, end.div_ceil(BLOCK));
        for b in [first, last - 1] {
            let partial = offset > b * BLOCK || end < (b + 1) * BLOCK;
            if partial && head.map.get(b) {
                let mut block = vec![0u8; BLOCK as usize];
                head.read_checked(b, &mut block)?;
            }
        }
        Ok(())
    }

    /// The write itself, with no revision of its own.
    /// `given`: the whole blocks' checksums, as sent with the write.
    fn write_data(
        &mut self,
        offset: u64,
        data: &[u8],
        given: Option<&[u8]>,
    ) -> Result<(), ReplicaError> {
        self.check(offset, data.len() as u64)?;
        let end = offset + data.len() as u64;
        let first = offset / BLOCK;
        let last = end.div_ceil(BLOCK);
        self.mark_dirty(first, last)?;
        let head_idx = self.layers.len() - 1;
        // Room for the blocks' checksums first: on a full disk the write
        // fails before any of it lands.
        if let Some(s) = &mut self.layers[head_idx].sums {
            s.reserve(first, last)?;
        }
        self.check_partial_edges(offset, end)?;
        for b in [first, last.saturating_sub(1)] {
            let (bs, be) = (b * BLOCK, (b + 1) * BLOCK);
            let partial = offset > bs || end < be;
            if partial && b < last && !self.layers[head_idx].map.get(b) {
                if !self.meta.pending.is_empty() {
                    // The layers below are still being filled: a partial
                    // block cannot be completed from them yet.
                    return Err(ReplicaError::Invalid(format!(
                        "write {offset}+{} is not block aligned while the replica rebuilds",
                        data.len()
                    )));
                }
                let mut block = vec![0u8; BLOCK as usize];
                self.read(bs, &mut block)?;
                let head = self.head();
                head.file
                    .write_all_at(&block, bs)
                    .map_err(|e| ReplicaError::io(&head.path, e))?;
                self.layers[head_idx].map.set(b, true);
            }
        }
        let head = self.head();
        head.file
            .write_all_at(data, offset)
            .map_err(|e| ReplicaError::io(&head.path, e))?;
        self.layers[head_idx].map.set_range(first, last, true);
        self.sum_written(offset, data, given)?;
        self.settle_suspects(offset.div_ceil(BLOCK), end / BLOCK);
        self.unstarted += data.len() as u64;
        if self.writeback_every > 0 && self.unstarted >= self.writeback_every {
            self.unstarted = 0;
            self.start_writeback();
        }
        Ok(())
    }

    /// Discards a range: whole blocks that no lower layer holds become
    /// holes; the rest reads as zeros.
    pub fn trim(
        &mut self,
        offset: u64,
        len: u64,
        revision: Option<u64>,
    ) -> Result<(), ReplicaError> {
        self.discard(offset, len, revision, false)
    }

    /// Like `trim`; with `zeroes`, every block is written as zeros and none
    /// becomes a hole (while a rebuild runs, so that every replica's head
    /// ends up with the same allocation).
    pub fn discard(
        &mut self,
        offset: u64,
        len: u64,
        revision: Option<u64>,
        zeroes: bool,
    ) -> Result<(), ReplicaError> {
        self.check(offset, len)?;
        self.check_partial_edges(offset, offset + len)?;
        self.mark_dirty(offset / BLOCK, (offset + len).div_ceil(BLOCK))?;
        let rev = self.next_revision(revision);
        self.log_intent(rev, LogOp::Trim, offset, len);
        let end = offset + len;
        let head_idx = self.layers.len() - 1;
        let mut pos = offset;
        while pos < end {
            let b = pos / BLOCK;
            let (bs, be) = (b * BLOCK, (b + 1) * BLOCK);
            let chunk_end = be.min(end);
            let whole = pos == bs && chunk_end == be;
            // Layers still being filled may hold the block: keep zeros.
            let below = zeroes
                || !self.meta.pending.is_empty()
                || (0..head_idx).any(|i| self.layers[i].map.get(b));
            if whole && !below {
                if self.layers[head_idx].map.get(b) {
                    self.layers[head_idx].punch(b, b + 1)?;
                }
            } else {
                let zeros = vec![0u8; (chunk_end - pos) as usize];
                self.write_data(pos, &zeros, None)?;
            }
            pos = chunk_end;
        }
        self.settle_suspects(offset.div_ceil(BLOCK), end / BLOCK);
        self.bump(Some(rev))
    }

    /// Makes every write so far durable. Their blocks' checksums, and the
    /// revision file (the counter, the flush mark and the write log), are
    /// made durable with them at a flush that ends an interval of the
    /// dirty regions (`regions::INTERVAL`, 500 ms at least since the
    /// last), and so always before a region is cleared: a writer that
    /// flushes after each write pays one sync instead of three on most. A
    /// cut before that leaves the checksums of the writes since on the
    /// disk as they were, in regions a new boot checks, where each such
    /// block is suspect: taken as it is (a flushed write is on the disk),
    /// or the copy of another replica holding it sound, which has the same
    /// write. It leaves the counter behind the data too, which after a cut
    /// only picks the replica the others are made equal to: a new boot
    /// trusts neither the flush mark nor the log, and a starting engine
    /// compares the replicas over their regions written lately whatever
    /// their counters (`engine::equalize`). Without a cut the page cache
    /// holds the revision file as it was.
    pub fn flush(&self) -> Result<(), ReplicaError> {
        self.flush_sums(false)
    }

    /// `flush`, with the checksums synced whatever the interval (`always`):
    /// before a clean close or a freeze, after which no new boot checks
    /// those blocks.
    fn flush_sums(&self, always: bool) -> Result<(), ReplicaError> {
        self.check(0, 0)?;
        let revision = self.revision;
        let head = self.head();
        head.file
            .sync_data()
            .map_err(|e| ReplicaError::io(&head.path, e))?;
        let now = std::time::Instant::now();
        let interval = self
            .regions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .ends_interval(now);
        if let Some(s) = &head.sums
            && (always || interval || self.revision_file.sums_every_flush())
        {
            s.sync()?;
        }
        self.revision_file.mark_flushed(revision);
        if always || interval {
            self.revision_file.sync()?;
        }
        // The writes that settled suspect blocks are durable now: the list
        // on the disk follows. With no room for it (a full disk) it stays
        // as it was until a flush finds room, and this flush succeeds: a
        // block it still names is only taken as suspect again after a cut,
        // and settled again from the volume's current replicas, which hold
        // what the flush made durable (the safe side).
        if self
            .suspect_stale
            .swap(false, std::sync::atomic::Ordering::AcqRel)
            && let Err(e) = self.write_suspects()
        {
            self.suspect_stale
                .store(true, std::sync::atomic::Ordering::Release);
            if !e.is_no_space() {
                return Err(e);
            }
            tracing::warn!(dir = %self.dir.display(), error = %e,
                "no room to rewrite the list of suspect blocks: it keeps naming blocks settled since, until a flush finds room");
        }
        self.regions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .flushed(now)
    }

    /// Syncs the head's checksums at every flush (`on`), or at a flush that
    /// ends an interval as before (see `flush`). The engine asks it of a
    /// volume's only rw replica while another replica could give a copy
    /// (`engine::guard`): after a power cut, a block of it that fails its
    /// checksum may then take a copy that matches the checksum on the
    /// disk, its state at the last flush or later (`suspect_sums`). Turned
    /// on, the checksums are synced first and then the mark in the revision
    /// file; turned off, the mark is cleared durably before any flush
    /// leaves them. The mark itself is what a flush reads, so that every
    /// instance of the replica (its server's, and the one lent to its
    /// engine, which share the file's pages) follows it. Returns whether
    /// it changed anything.
    pub fn set_sums_every_flush(&mut self, on: bool) -> Result<bool, ReplicaError> {
        self.check(0, 0)?;
        if on == self.sums_every_flush() {
            return Ok(false);
        }
        if on && let Some(s) = &self.head().sums {
            s.sync()?;
        }
        self.revision_file.set_sums_every_flush(on);
        self.revision_file.sync()?;
        tracing::info!(dir = %self.dir.display(), on, "the head's checksums synced at every flush (on), or at a flush that ends an interval (off)");
        Ok(true)
    }

    /// Whether the head's checksums are synced at every flush.
    pub fn sums_every_flush(&self) -> bool {
        self.revision_file.sums_every_flush()
    }

    /// Before blocks `first..last` of the head are written or discarded:
    /// their regions recorded dirty, durably (`regions`).
    fn mark_dirty(&mut self, first: u64, last: u64) -> Result<(), ReplicaError> {
        let blocks = self.meta.size / BLOCK;
        self.warm
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .forget(first, last);
        self.regions
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .mark(first, last, blocks)
    }

    /// The checksum of a layer's contents (`checksum`), in the form of
    /// record `like`. Each block is checked against the layer's block
    /// checksums on the way.
    fn checksum(&self, i: usize, like: &str) -> Result<String, ReplicaError> {
        let l = &self.layers[i];
        let lost = self.lost_of(&l.name);
        checksum::take(l, checksum::Form::of(like), |b, chunk| match &l.sums {
            Some(sums) => {
                check_but(sums, b, chunk, lost, &mut |_| {}).map_err(|bad| l.corrupt(bad))
            }
            None => Ok(()),
        })
    }

    /// `checksum`, taken anew (chunked), adding to `lost` every block that
    /// fails its checksum instead of failing on it: the layer's checksum
    /// with each such block as it is (see `lose_frozen_block`).
    fn checksum_losing(&self, i: usize, lost: &mut BTreeSet<u64>) -> Result<String, ReplicaError> {
        let l = &self.layers[i];
        checksum::take(l, checksum::Form::Chunked, |b, chunk| {
            if let Some(sums) = &l.sums {
                lost.extend(sums.failing(b, chunk));
            }
            Ok(())
        })
    }

    /// Freezes the head (with its checksum) and starts a new, empty head;
    /// with `label`, the frozen layer is that user snapshot. Returns the
    /// name of the frozen layer. Taking a snapshot the replica holds
    /// already answers its layer and changes nothing.
    pub fn snapshot(&mut self, label: Option<&str>) -> Result<String, ReplicaError> {
        self.snapshot_losing(label, &BTreeSet::new())
    }

    /// `snapshot`, giving up the blocks of the head in `lose` that fail
    /// their checksums: the engine names each only once no replica can give
    /// it sound. They are frozen as they are and recorded lost with the
    /// layer (`Meta::lost`), so they fail every read while the rest of the
    /// volume is served, and copied, as before. Any other bad block fails
    /// the freeze, as in `snapshot`.
    pub fn snapshot_losing(
        &mut self,
        label: Option<&str>,
        lose: &BTreeSet<u64>,
    ) -> Result<String, ReplicaError> {
        if let Some(id) = label {
            if !valid_snapshot_id(id) {
                return Err(ReplicaError::Invalid(format!(
                    "{id:?} is not a snapshot id"
                )));
            }
            if let Some((layer, _)) = self.meta.snapshots.iter().find(|(_, s)| *s == id) {
                return Ok(layer.clone());
            }
        }
        if !self.meta.pending.is_empty() {
            return Err(ReplicaError::Invalid(
                "a replica still being rebuilt cannot take a snapshot".into(),
            ));
        }
        self.flush_sums(true)?;
        let frozen = self.head().name.clone();
        let lost = std::sync::Mutex::new(BTreeSet::new());
        // The chunks read ahead (`warm`) and unchanged since are taken
        // as they are: the I/O is paused only for the rest, which
        // `freeze_readers` threads read at once.
        let head = &self.layers[self.layers.len() - 1];
        let known = self
            .warm
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .standing(head);
        let readers = self.freeze_readers;
        let (sum, read) =
            checksum::chunked_by(head, &known, readers, |b, chunk| match &head.sums {
                Some(sums) => check_but(sums, b, chunk, lose, &mut |b| {
                    lost.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .insert(b);
                })
                .map_err(|bad| head.corrupt(bad)),
                None => Ok(()),
            })?;
        let lost = lost
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let ahead = known.len() as u64;
        let name = next_layer_name(self.meta.chain.iter().map(String::as_str));
        let path = self.dir.join(&name);
        let f = File::create(&path).map_err(|e| ReplicaError::io(&path, e))?;
        f.set_len(self.meta.size)
            .map_err(|e| ReplicaError::io(&path, e))?;
        f.sync_all().map_err(|e| ReplicaError::io(&path, e))?;
        let mut meta = self.meta.clone();
        meta.chain.push(name.clone());
        meta.frozen.insert(frozen.clone(), sum);
        if let Some(id) = label {
            meta.snapshots.insert(frozen.clone(), id.to_string());
        }
        if !lost.is_empty() {
            tracing::error!(dir = %self.dir.display(), layer = %frozen, blocks = ?lost,
                "blocks that no replica holds sound frozen as lost: each fails its reads until it is written again");
            meta.lost.insert(frozen.clone(), lost);
        }
        meta.revision = self.revision;
        if let Err(e) = meta.write(&self.dir) {
            // Unchanged (no room for the new chain, say): the new head's
            // file goes too.
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        self.meta = meta;
        self.warm
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
        self.last_freeze = (ahead, read);
        tracing::info!(dir = %self.dir.display(), layer = %frozen, chunks_read_ahead = ahead, chunks_read = read,
            "head frozen: its chunks read ahead taken as they were, the others read");
        let _ = std::fs::remove_file(sums::path_of(&path));
        self.layers.push(Layer::open(
            &self.dir,
            &name,
            self.meta.size / BLOCK,
            self.meta.block_sums,
        )?);
        Ok(frozen)
    }

    /// Sets how many threads a freeze reads its head's chunks with, at
    /// least one (by default the machine's cores, at most
    /// `checksum::FREEZE_READERS`); one reads them in order, as every
    /// freeze did until 2026-12-07 (the freeze bench's peer).
    pub fn set_freeze_readers(&mut self, n: usize) {
        self.freeze_readers = n.max(1);
    }

    /// How many threads a freeze reads its head's chunks with.
    pub fn freeze_readers(&self) -> usize {
        self.freeze_readers
    }

    /// Grows the volume to `size` bytes (never shrinks).
    pub fn grow(&mut self, size: u64) -> Result<(), ReplicaError> {
        if size < self.meta.size {
            return Err(ReplicaError::Invalid(format!(
                "new size {size} is below the replica's {}; it never shrinks",
                self.meta.size
            )));
        }
        self.resize(size)
    }

    /// Undoes a growth that was never used: back to `size` bytes, refused
    /// when any layer holds a block at or past `size` (data written there
    /// is never thrown away).
    pub fn shrink_unused(&mut self, size: u64) -> Result<(), ReplicaError> {
        if size > self.meta.size {
            return Err(ReplicaError::Invalid(format!(
                "{size} is above the replica's {}: nothing to undo",
                self.meta.size
            )));
        }
        let from = size / BLOCK;
        if let Some(l) = self.layers.iter().find(|l| l.map.any_from(from)) {
            return Err(ReplicaError::Invalid(format!(
                "layer {} holds data past {size} bytes: the growth was used",
                l.name
            )));
        }
        self.resize(size)
    }

    /// Sets every layer file and the recorded size to `size` bytes.
    fn resize(&mut self, size: u64) -> Result<(), ReplicaError> {
        if !size.is_multiple_of(BLOCK) || size == 0 || size > MAX_SIZE {
            return Err(ReplicaError::Invalid(format!(
                "size {size} must be a positive multiple of {BLOCK}, at most {MAX_SIZE}"
            )));
        }
        if size == self.meta.size {
            return Ok(());
        }
        // Every layer file is as large as the volume: frozen ones grow (or
        // go back) by a hole, which leaves their data and checksums as
        // they are.
        for l in &self.layers {
            l.file
                .set_len(size)
                .map_err(|e| ReplicaError::io(&l.path, e))?;
        }
        self.regions
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .room_for(size)?;
        let mut meta = self.meta.clone();
        meta.size = size;
        meta.revision = self.revision;
        meta.write(&self.dir)?;
        self.meta = meta;
        for l in &mut self.layers {
            l.map.resize(size / BLOCK);
            if let Some(s) = &mut l.sums {
                s.resize(size / BLOCK)?;
            }
        }
        Ok(())
    }

    /// Every layer, oldest first.
    pub fn layers(&self) -> Vec<LayerInfo> {
        self.layers
            .iter()
            .map(|l| LayerInfo {
                name: l.name.clone(),
                allocated: l.map.count() * BLOCK,
                // Being merged into: its checksum is not known until the
                // merge ends (and no rebuild copies it meanwhile).
                checksum: self
                    .meta
                    .frozen
                    .get(&l.name)
                    .filter(|_| !self.merging_into(&l.name))
                    .cloned(),
                pending: self.meta.pending.contains(&l.name),
                snapshot: self.meta.snapshots.get(&l.name).cloned(),
                lost: self.lost_of(&l.name).iter().copied().collect(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
