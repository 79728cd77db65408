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
            alone(l, &Plan::of(l, &none), &none, each).map(|(sum, _)| sum)
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
/// for the freeze, so the cores it would use are free, and what it reads
/// after a read ahead (what was written since) is in the page cache,
/// where the digests, not the disk, set the pace (a cold head read whole
/// gains nothing: the disk does; performance.md, the freeze bench).
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
    let readers = readers.clamp(1, plan.unread.len().max(1));
    if readers == 1 {
        return alone(l, &plan, known, each);
    }
    let queue = plan.queue(l, known);
    std::thread::scope(|s| {
        let (plan, queue, each) = (&plan, &queue, &each);
        let others: Vec<_> = (1..readers)
            .map(|_| s.spawn(move || reader(l, plan, queue, each)))
            .collect();
        reader(l, plan, queue, each);
        for o in others {
            if let Err(panic) = o.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
    plan.sum(queue)
}

/// The chunked form of `plan` read by one reader on this thread
/// (`chunked_by`'s way with one reader; `each` may then change what it
/// holds).
fn alone(
    l: &Layer,
    plan: &Plan,
    known: &BTreeMap<u64, Digest>,
    each: impl FnMut(u64, &[u8]) -> Result<(), ReplicaError>,
) -> Result<(String, u64), ReplicaError> {
    let queue = plan.queue(l, known);
    reader(l, plan, &queue, each);
    plan.sum(queue)
}

/// What a chunked checksum reads: the layer's runs cut at the chunks'
/// ends, and which chunks are not known.
struct Plan {
    /// The runs cut at the chunks' ends, in order.
    pieces: Vec<(u64, u64)>,
    /// Each chunk that holds data, with its pieces (in `pieces`).
    chunks: Vec<(u64, std::ops::Range<usize>)>,
    /// Indexes in `chunks` of those to read, in order.
    unread: Vec<usize>,
    /// The pieces of those, one after the other, for the read ahead, and
    /// where each one's first is.
    ahead: Vec<(u64, u64)>,
    starts: Vec<usize>,
}

/// What the readers of a chunked checksum take turns at: the chunks to
/// read, and the checksum taken as their digests come, in order.
struct Queue<'a> {
    /// The next to read, of `Plan::unread`.
    next: usize,
    /// The first that failed, and how: none past it is started.
    failed: Option<(usize, ReplicaError)>,
    /// Asks the disk for the pieces ahead of the readers.
    ahead: Prefetch<'a>,
    known: &'a BTreeMap<u64, Digest>,
    /// The digests of the whole layer so far, and the next chunk (of
    /// `Plan::chunks`) and chunk to read (of `Plan::unread`) they need.
    top: blake3::Hasher,
    hashed: usize,
    unread_hashed: usize,
    /// Digests read ahead of the next the hash needs (a reader a chunk
    /// or two ahead of another): a few at most.
    early: BTreeMap<usize, Digest>,
}

impl Queue<'_> {
    /// Hashes the chunks' digests in order as far as they are known or
    /// read.
    fn advance(&mut self, plan: &Plan) {
        while let Some((c, _)) = plan.chunks.get(self.hashed) {
            let d = match self.known.get(c) {
                Some(d) => *d,
                None => match self.early.remove(&self.unread_hashed) {
                    Some(d) => {
                        self.unread_hashed += 1;
                        d
                    }
                    None => return,
                },
            };
            self.top.update(&c.to_le_bytes());
            self.top.update(&d);
            self.hashed += 1;
        }
    }
}

impl Plan {
    fn of(l: &Layer, known: &BTreeMap<u64, Digest>) -> Plan {
        let (mut pieces, mut chunks) = (Vec::new(), Vec::<(u64, std::ops::Range<usize>)>::new());
        for (s, e) in l.map.runs() {
            let mut b = s;
            while b < e {
                let end = e.min((b / CHUNK + 1) * CHUNK);
                match chunks.last_mut() {
                    Some((c, at)) if *c == b / CHUNK => at.end += 1,
                    _ => chunks.push((b / CHUNK, pieces.len()..pieces.len() + 1)),
                }
                pieces.push((b, end));
                b = end;
            }
        }
        let unread: Vec<usize> = (0..chunks.len())
            .filter(|i| !known.contains_key(&chunks[*i].0))
            .collect();
        let (mut ahead, mut starts) = (Vec::new(), Vec::with_capacity(unread.len()));
        for &i in &unread {
            starts.push(ahead.len());
            ahead.extend_from_slice(&pieces[chunks[i].1.clone()]);
        }
        Plan {
            pieces,
            chunks,
            unread,
            ahead,
            starts,
        }
    }

    fn queue<'a>(&'a self, l: &'a Layer, known: &'a BTreeMap<u64, Digest>) -> Mutex<Queue<'a>> {
        Mutex::new(Queue {
            next: 0,
            failed: None,
            ahead: Prefetch::new(&l.file, &self.ahead),
            known,
            top: blake3::Hasher::new(),
            hashed: 0,
            unread_hashed: 0,
            early: BTreeMap::new(),
        })
    }

    /// The checksum, once the readers are done, or the failure of the
    /// first chunk that failed; with how many chunks were read.
    fn sum(&self, queue: Mutex<Queue<'_>>) -> Result<(String, u64), ReplicaError> {
        let mut q = queue.into_inner().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, e)) = q.failed.take() {
            return Err(e);
        }
        q.advance(self);
        if q.hashed < self.chunks.len() {
            return Err(ReplicaError::Corrupt(format!(
                "a chunked checksum ended at chunk {} of {}",
                q.hashed,
                self.chunks.len()
            )));
        }
        Ok((
            format!("{CHUNKED}{}", q.top.finalize().to_hex()),
            self.unread.len() as u64,
        ))
    }
}

/// One reader of a chunked checksum: takes the next chunk to read until
/// none is left or one before it failed, and hands its digest to the
/// checksum (or its failure, kept if it is the first in order).
fn reader(
    l: &Layer,
    plan: &Plan,
    queue: &Mutex<Queue<'_>>,
    mut each: impl FnMut(u64, &[u8]) -> Result<(), ReplicaError>,
) {
    let mut buf = vec![0u8; (BLOCK * CHUNK) as usize];
    loop {
        let k = {
            let mut q = queue.lock().unwrap_or_else(PoisonError::into_inner);
            let past_failed = q.failed.as_ref().is_some_and(|(f, _)| q.next > *f);
            if q.next >= plan.unread.len() || past_failed {
                return;
            }
            let k = q.next;
            q.next += 1;
            q.ahead.reading(plan.starts[k]);
            k
        };
        let pieces = &plan.pieces[plan.chunks[plan.unread[k]].1.clone()];
        let one = digest((&l.file, l.path.as_path()), pieces, &mut buf, &mut each);
        let mut q = queue.lock().unwrap_or_else(PoisonError::into_inner);
        match one {
            Ok(d) => {
                q.early.insert(k, d);
                q.advance(plan);
            }
            Err(e) => {
                if q.failed.as_ref().is_none_or(|(f, _)| k < *f) {
                    q.failed = Some((k, e));
                }
            }
        }
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
