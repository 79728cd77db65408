//! A frozen layer's checksum: recorded in `meta.json` with the layer when
//! it is frozen (or merged into, or a block of it given up), and checked
//! by every copy, scrub and verify of the layer.
//!
//! Two forms, told apart by how the record reads. The first, a bare
//! blake3 hex, hashes the layer's allocated runs in order. The chunked
//! form, `c1:` and a blake3 hex, which every checksum taken since
//! 2026-12-07 has, hashes each chunk of 1 MiB of the volume on its own,
//! then the chunks' digests in order: so a chunk of the head read ahead
//! of its freeze, while the volume's I/O still runs, keeps its digest
//! until a write touches it (`warm`), and the freeze, with the I/O
//! paused, reads only the chunks written since, on several threads at
//! once (its chunks' digests are taken apart from each other, and the
//! volume's I/O waits for it). A record is checked in its own form: a
//! layer frozen before keeps its checksum.
//!
//! It reads the layer it is handed and owns nothing else.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Mutex, PoisonError};

use super::{BLOCK, Layer, Prefetch, ReplicaError};

/// Blocks in a chunk (1 MiB).
pub(super) const CHUNK: u64 = 256;

/// How a chunked checksum's record begins.
const CHUNKED: &str = "c1:";

/// A chunk's digest.
pub(super) type Digest = [u8; 32];

/// The form a checksum is taken in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Form {
    /// The layer's runs in order (the records from before 2026-12-07).
    Runs,
    /// Chunk by chunk.
    Chunked,
}

impl Form {
    /// The form of a recorded checksum.
    pub(super) fn of(recorded: &str) -> Form {
        if recorded.starts_with(CHUNKED) {
            Form::Chunked
        } else {
            Form::Runs
        }
    }
}

/// The checksum of layer `l` in `form`, handing `each` every piece of
/// whole blocks read, in order (at most a chunk's worth; in the chunked
/// form, never across a chunk's end).
pub(super) fn take(
    l: &Layer,
    form: Form,
    each: impl FnMut(u64, &[u8]) -> Result<(), ReplicaError>,
) -> Result<String, ReplicaError> {
    match form {
        Form::Runs => by_runs(l, each),
        Form::Chunked => {
            let none = BTreeMap::new();
            let plan = Plan::of(l, &none);
            let read = reader(l, &plan, &plan.queue(l), each);
            plan.sum(l, &none, read).map(|(sum, _)| sum)
        }
    }
}

/// The layer's runs in order, each index and length with its bytes.
fn by_runs(
    l: &Layer,
    mut each: impl FnMut(u64, &[u8]) -> Result<(), ReplicaError>,
) -> Result<String, ReplicaError> {
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; (BLOCK * CHUNK) as usize];
    let runs = l.map.runs();
    let mut ahead = Prefetch::new(&l.file, &runs);
    for (i, &(s, e)) in runs.iter().enumerate() {
        ahead.reading(i);
        let mut b = s;
        while b < e {
            let n = (e - b).min(CHUNK);
            let piece = &mut buf[..(n * BLOCK) as usize];
            read(&l.file, &l.path, b, piece)?;
            each(b, piece)?;
            h.update(&b.to_le_bytes());
            h.update(&n.to_le_bytes());
            h.update(piece);
            b += n;
        }
    }
    Ok(h.finalize().to_hex().to_string())
}

/// Readers of a freeze's chunks at once, at most: the volume's I/O waits
/// for the freeze, so the cores it would use are free, and a cold head's
/// disk answers several reads at once sooner than one after the other.
pub(super) const FREEZE_READERS: usize = 4;

/// How many readers a freeze reads its chunks with on this machine: its
/// cores, at most `FREEZE_READERS`.
pub(super) fn freeze_readers() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, FREEZE_READERS)
}

/// The chunked form, taking the digests in `known` as they are and
/// reading only the other chunks that hold data, with up to `readers`
/// threads at once (a freeze's, `freeze_readers`); with how many chunks
/// it read. Each chunk is read whole by one reader, which hands `each`
/// its pieces in order. A failure is that of the first
/// chunk, in the volume's order, that failed, as when they are read one
/// after the other: no chunk past it is started, and every chunk before
/// it is read.
pub(super) fn chunked_by(
    l: &Layer,
    known: &BTreeMap<u64, Digest>,
    readers: usize,
    each: impl Fn(u64, &[u8]) -> Result<(), ReplicaError> + Sync,
) -> Result<(String, u64), ReplicaError> {
    let plan = Plan::of(l, known);
    let queue = plan.queue(l);
    let readers = readers.clamp(1, plan.unread.len().max(1));
    let read = if readers == 1 {
        reader(l, &plan, &queue, &each)
    } else {
        std::thread::scope(|s| {
            let (plan, queue, each) = (&plan, &queue, &each);
            let others: Vec<_> = (1..readers)
                .map(|_| s.spawn(move || reader(l, plan, queue, each)))
                .collect();
            let mut all = reader(l, plan, queue, each);
            for o in others {
                match o.join() {
                    Ok(read) => all.extend(read),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
            all
        })
    };
    plan.sum(l, known, read)
}

/// What a chunked checksum reads: the layer's runs cut at the chunks'
/// ends, by chunk, and which chunks are not known.
struct Plan {
    chunks: Vec<(u64, Vec<(u64, u64)>)>,
    /// Indexes in `chunks` of those to read, in order.
    unread: Vec<usize>,
    /// Their pieces one after the other, for the read ahead, and where
    /// each one's first is.
    pieces: Vec<(u64, u64)>,
    starts: Vec<usize>,
}

/// What the readers of a chunked checksum take turns at.
struct Queue<'a> {
    /// The next to read, of `Plan::unread`.
    next: usize,
    /// The first that failed: none past it is started.
    failed: usize,
    /// Asks the disk for the pieces ahead of the readers.
    ahead: Prefetch<'a>,
}

impl Plan {
    fn of(l: &Layer, known: &BTreeMap<u64, Digest>) -> Plan {
        let mut chunks: Vec<(u64, Vec<(u64, u64)>)> = Vec::new();
        for (s, e) in l.map.runs() {
            let mut b = s;
            while b < e {
                let end = e.min((b / CHUNK + 1) * CHUNK);
                match chunks.last_mut() {
                    Some((c, pieces)) if *c == b / CHUNK => pieces.push((b, end)),
                    _ => chunks.push((b / CHUNK, vec![(b, end)])),
                }
                b = end;
            }
        }
        let unread: Vec<usize> = (0..chunks.len())
            .filter(|i| !known.contains_key(&chunks[*i].0))
            .collect();
        let (mut pieces, mut starts) = (Vec::new(), Vec::with_capacity(unread.len()));
        for &i in &unread {
            starts.push(pieces.len());
            pieces.extend_from_slice(&chunks[i].1);
        }
        Plan {
            chunks,
            unread,
            pieces,
            starts,
        }
    }

    fn queue<'a>(&'a self, l: &'a Layer) -> Mutex<Queue<'a>> {
        Mutex::new(Queue {
            next: 0,
            failed: usize::MAX,
            ahead: Prefetch::new(&l.file, &self.pieces),
        })
    }

    /// The checksum from the digests `known` and those `read` (by index
    /// in `unread`, in any order), or the failure of the first chunk
    /// read that failed; with how many chunks were read.
    fn sum(
        &self,
        l: &Layer,
        known: &BTreeMap<u64, Digest>,
        mut read: Vec<(usize, Result<Digest, ReplicaError>)>,
    ) -> Result<(String, u64), ReplicaError> {
        read.sort_by_key(|(k, _)| *k);
        let mut digests = BTreeMap::new();
        for (k, one) in read {
            digests.insert(self.chunks[self.unread[k]].0, one?);
        }
        let mut top = blake3::Hasher::new();
        for (c, _) in &self.chunks {
            let d = known.get(c).or_else(|| digests.get(c)).ok_or_else(|| {
                ReplicaError::Corrupt(format!("chunk {c} of {} was not read", l.path.display()))
            })?;
            top.update(&c.to_le_bytes());
            top.update(d);
        }
        Ok((
            format!("{CHUNKED}{}", top.finalize().to_hex()),
            self.unread.len() as u64,
        ))
    }
}

/// One reader of a chunked checksum: takes the next chunk to read until
/// none is left or one before it failed; each chunk's digest (or
/// failure) by its index in `unread`.
fn reader(
    l: &Layer,
    plan: &Plan,
    queue: &Mutex<Queue<'_>>,
    mut each: impl FnMut(u64, &[u8]) -> Result<(), ReplicaError>,
) -> Vec<(usize, Result<Digest, ReplicaError>)> {
    let mut buf = vec![0u8; (BLOCK * CHUNK) as usize];
    let mut read = Vec::new();
    loop {
        let k = {
            let mut q = queue.lock().unwrap_or_else(PoisonError::into_inner);
            if q.next >= plan.unread.len() || q.next > q.failed {
                return read;
            }
            let k = q.next;
            q.next += 1;
            q.ahead.reading(plan.starts[k]);
            k
        };
        let pieces = &plan.chunks[plan.unread[k]].1;
        let one = digest((&l.file, l.path.as_path()), pieces, &mut buf, &mut each);
        if one.is_err() {
            let mut q = queue.lock().unwrap_or_else(PoisonError::into_inner);
            q.failed = q.failed.min(k);
        }
        read.push((k, one));
    }
}

/// The digest of a chunk of `file` whose allocated runs are `pieces` (cut
/// to the chunk), as the file holds it now, handing `each` what was read.
pub(super) fn chunk(
    file: (&File, &Path),
    pieces: &[(u64, u64)],
    each: &mut impl FnMut(u64, &[u8]) -> Result<(), ReplicaError>,
) -> Result<Digest, ReplicaError> {
    let mut buf = vec![0u8; (BLOCK * CHUNK) as usize];
    digest(file, pieces, &mut buf, each)
}

/// One chunk's digest: each piece's index and length with its bytes.
fn digest(
    (file, path): (&File, &Path),
    pieces: &[(u64, u64)],
    buf: &mut [u8],
    each: &mut impl FnMut(u64, &[u8]) -> Result<(), ReplicaError>,
) -> Result<Digest, ReplicaError> {
    let mut h = blake3::Hasher::new();
    for &(s, e) in pieces {
        let piece = &mut buf[..((e - s) * BLOCK) as usize];
        read(file, path, s, piece)?;
        each(s, piece)?;
        h.update(&s.to_le_bytes());
        h.update(&(e - s).to_le_bytes());
        h.update(piece);
    }
    Ok(*h.finalize().as_bytes())
}

/// What a chunk of layer `l` holds as its tables say: which blocks, and
/// their recorded checksums. A digest read ahead stands only while this
/// is unchanged.
pub(super) fn seal(l: &Layer, c: u64) -> Digest {
    let (first, last) = (c * CHUNK, (c + 1) * CHUNK);
    let mut h = blake3::Hasher::new();
    for (s, e) in l.map.runs_in(first, last) {
        h.update(&s.to_le_bytes());
        h.update(&e.to_le_bytes());
    }
    if let Some(sums) = &l.sums {
        h.update(sums.bytes(first, last));
    }
    *h.finalize().as_bytes()
}

fn read(file: &File, path: &Path, first: u64, buf: &mut [u8]) -> Result<(), ReplicaError> {
    file.read_exact_at(buf, first * BLOCK)
        .map_err(|e| ReplicaError::io(path, e))
}
