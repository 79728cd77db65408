//! The head read ahead of its freeze. A freeze takes the head's checksum,
//! and read the whole head for it with the volume's I/O paused: about a
//! second per GiB (performance.md, the freeze bench). Now the engine
//! first has each replica read its head with the I/O running (`warm`):
//! chunk by chunk, each chunk's blocks checked against their checksums
//! and its digest kept (`checksum::chunked_by`) until a write into the chunk
//! drops it (`Warm::forget`, from `mark_dirty`, which every change of the
//! head's data goes through first). The freeze then reads only the
//! chunks written since, and takes a kept digest only while its chunk's
//! allocation and block checksums are those it was read with
//! (`checksum::seal`). A chunk with a block that fails its checksum is
//! not kept: the freeze finds the block, as before, and the engine
//! repairs it.
//!
//! The head is read in passes, each after the first reading only what
//! writes dropped during the one before, while that shrinks (`passes`).
//! A chunk is read with no lock of the replica held: the lock is taken
//! for reading to choose the chunk (`Replica::warm_next`) and again to
//! keep its digest (`Replica::warm_keep`), and a write into the chunk
//! between the two spoils the read. (A read under the lock starved the
//! writers: each chunk's read took the lock again before a writer woken
//! by the last one could, and an engine's writes waited up to 246 ms
//! while three replicas on two cores read their heads.)
//!
//! It owns the digests kept in memory, nothing on the disk.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::{PoisonError, RwLock};

use super::checksum::{self, CHUNK, Digest, seal};
use super::{Layer, Replica, ReplicaError, sums};

/// Passes over the head at most, ahead of a freeze.
const PASSES: usize = 4;

/// A pass that reads no more chunks than this is the last: what it read
/// the freeze reads in about as long again, at most.
const FEW: usize = 16;

/// What holds a replica: the read ahead takes its lock for reading, for a
/// moment at a time (`reading`).
pub trait Holder {
    type Error: Send;
    /// Runs `f` on the replica with its lock taken for reading.
    fn reading<T>(
        &self,
        f: impl FnOnce(&Replica) -> Result<T, ReplicaError>,
    ) -> Result<T, Self::Error>;
    /// A replica's error, as the holder answers it.
    fn error(&self, e: ReplicaError) -> Self::Error;
}

/// A replica no one else holds (a test's, a bench's).
impl Holder for Replica {
    type Error = ReplicaError;
    fn reading<T>(
        &self,
        f: impl FnOnce(&Replica) -> Result<T, ReplicaError>,
    ) -> Result<T, ReplicaError> {
        f(self)
    }
    fn error(&self, e: ReplicaError) -> ReplicaError {
        e
    }
}

/// A replica as its server holds it; the error None when the lock was
/// poisoned.
impl Holder for RwLock<Replica> {
    type Error = Option<ReplicaError>;
    fn reading<T>(
        &self,
        f: impl FnOnce(&Replica) -> Result<T, ReplicaError>,
    ) -> Result<T, Option<ReplicaError>> {
        let r = self.read().map_err(|_| None)?;
        f(&r).map_err(Some)
    }
    fn error(&self, e: ReplicaError) -> Option<ReplicaError> {
        Some(e)
    }
}

/// Reads the head of the replica `h` holds ahead of its freeze, in passes
/// (see the module's head).
pub fn warm<H: Holder>(h: &H) -> Result<(), H::Error> {
    passes(|from| {
        let Some(ahead) = h.reading(|r| r.warm_next(from))? else {
            return Ok(None);
        };
        let chunk = ahead.chunk;
        let digest = ahead.read().map_err(|e| h.error(e))?;
        h.reading(|r| {
            r.warm_keep(ahead, digest);
            Ok(())
        })?;
        Ok(Some(chunk))
    })
}

/// The passes: `one(from)` reads the first chunk at or past `from` that
/// is not kept yet, and says which (None past the head's last block). A
/// pass after the first reads only the chunks the writes during the one
/// before touched; the last is one that read few (`FEW`), or more than
/// half of what the one before read, or the `PASSES`th: a head written
/// all over while it is read is read twice, not four times.
fn passes<E>(mut one: impl FnMut(u64) -> Result<Option<u64>, E>) -> Result<(), E> {
    let mut before = usize::MAX;
    for _ in 0..PASSES {
        let (mut from, mut read) = (0, 0);
        while let Some(chunk) = one(from)? {
            read += 1;
            from = chunk + 1;
        }
        if read <= FEW || read > before / 2 {
            break;
        }
        before = read;
    }
    Ok(())
}

/// The digests of the head's chunks read ahead of its freeze, each with
/// its chunk's seal as it was read, and the chunk being read.
#[derive(Default)]
pub(super) struct Warm {
    chunks: BTreeMap<u64, (Digest, Digest)>,
    /// The chunk being read, and whether a write touched it since it was
    /// chosen (what is read of it is then not kept).
    reading: Option<(u64, bool)>,
}

impl Warm {
    /// Drops the digests of the chunks blocks `first..last` fall in: they
    /// are about to change; and spoils the read of one of them under way.
    pub(super) fn forget(&mut self, first: u64, last: u64) {
        if last <= first {
            return;
        }
        let (a, b) = (first / CHUNK, (last - 1) / CHUNK);
        if let Some((c, spoiled)) = &mut self.reading
            && (a..=b).contains(c)
        {
            *spoiled = true;
        }
        if self.chunks.is_empty() {
            return;
        }
        let gone: Vec<u64> = self.chunks.range(a..=b).map(|(c, _)| *c).collect();
        for c in gone {
            self.chunks.remove(&c);
        }
    }

    /// Drops every digest, and spoils the read under way: the head they
    /// were read from is frozen, or replaced.
    pub(super) fn clear(&mut self) {
        self.chunks.clear();
        if let Some((_, spoiled)) = &mut self.reading {
            *spoiled = true;
        }
    }

    /// The digests a freeze of head `l` may take as they are: those whose
    /// chunk's seal is unchanged.
    pub(super) fn standing(&self, l: &Layer) -> BTreeMap<u64, Digest> {
        self.chunks
            .iter()
            .filter(|(c, (_, sealed))| seal(l, **c) == *sealed)
            .map(|(c, (d, _))| (*c, *d))
            .collect()
    }
}

/// A chunk of the head to read ahead: what the replica's tables say of it
/// when it was chosen, and the head's file, to read with no lock held.
pub struct Ahead {
    head: String,
    pub(super) chunk: u64,
    file: File,
    path: PathBuf,
    /// Its allocated runs, cut to it.
    pieces: Vec<(u64, u64)>,
    /// Its blocks' recorded checksums, 4 bytes a block from its first.
    sums: Option<Vec<u8>>,
    seal: Digest,
}

impl Ahead {
    /// Reads the chunk and checks its blocks: its digest, or None when a
    /// block fails its checksum (or changed as it was read: a write into
    /// the chunk spoils the read anyway).
    pub(super) fn read(&self) -> Result<Option<Digest>, ReplicaError> {
        let first = self.chunk * CHUNK;
        let mut sound = true;
        let digest = checksum::chunk((&self.file, &self.path), &self.pieces, &mut |b, piece| {
            if let Some(recorded) = &self.sums {
                sums::each(piece, |i, sum| {
                    let at = ((b - first) as usize + i) * 4;
                    if recorded.get(at..at + 4) != Some(&sum.to_le_bytes()[..]) {
                        sound = false;
                    }
                });
            }
            Ok(())
        })?;
        Ok(sound.then_some(digest))
    }
}

impl Replica {
    /// The first chunk (1 MiB of the volume) at or past chunk `from` that
    /// the head holds data of and whose digest is not kept, to read ahead
    /// of its freeze (`warm`); marked as the one being read. None past the
    /// head's last block, and for a replica still being rebuilt, whose
    /// head no freeze takes. With the replica's lock taken for reading.
    pub fn warm_next(&self, from: u64) -> Result<Option<Ahead>, ReplicaError> {
        if self.broken.is_some() || !self.meta.pending.is_empty() {
            return Ok(None);
        }
        let head = self.head();
        let mut warm = self.warm.lock().unwrap_or_else(PoisonError::into_inner);
        let mut c = from;
        loop {
            let Some(b) = head.map.next_from(c.saturating_mul(CHUNK)) else {
                return Ok(None);
            };
            c = b / CHUNK;
            if !warm.chunks.contains_key(&c) {
                break;
            }
            c += 1;
        }
        let (first, last) = (c * CHUNK, (c + 1) * CHUNK);
        let file = head
            .file
            .try_clone()
            .map_err(|e| ReplicaError::io(&head.path, e))?;
        warm.reading = Some((c, false));
        Ok(Some(Ahead {
            head: head.name.clone(),
            chunk: c,
            file,
            path: head.path.clone(),
            pieces: head.map.runs_in(first, last),
            sums: head.sums.as_ref().map(|s| s.bytes(first, last).to_vec()),
            seal: seal(head, c),
        }))
    }

    /// Keeps the digest read of a chunk (`warm_next`), unless a write
    /// touched the chunk since it was chosen, the head is another, or the
    /// chunk's tables changed. With the replica's lock taken for reading.
    pub fn warm_keep(&self, ahead: Ahead, digest: Option<Digest>) {
        let head = self.head();
        let mut warm = self.warm.lock().unwrap_or_else(PoisonError::into_inner);
        let unspoiled = warm.reading.take() == Some((ahead.chunk, false));
        if let Some(d) = digest
            && unspoiled
            && head.name == ahead.head
            && seal(head, ahead.chunk) == ahead.seal
        {
            warm.chunks.insert(ahead.chunk, (d, ahead.seal));
        }
    }

    /// What the last freeze took of its head: (chunks read ahead, chunks
    /// it read itself), in chunks of 1 MiB; (0, 0) before any.
    pub fn last_freeze(&self) -> (u64, u64) {
        self.last_freeze
    }

    /// How many chunks of the head have their digests kept.
    pub fn warm_chunks(&self) -> usize {
        self.warm
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .chunks
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A head whose first pass reads `chunks` chunks, each pass after
    /// finding `dropped[pass]` of them to read again: the passes run.
    fn count_passes(chunks: u64, dropped: &[u64]) -> usize {
        let mut pass = 0;
        let mut unread = chunks;
        passes(|from| -> Result<Option<u64>, ()> {
            if from < unread {
                return Ok(Some(from));
            }
            pass += 1;
            unread = dropped.get(pass - 1).copied().unwrap_or(0);
            Ok(None)
        })
        .unwrap();
        pass
    }

    #[test]
    fn passes_go_on_while_writes_drop_many_chunks_and_stop_at_the_bound() {
        // Nothing dropped during the first pass: the second reads none.
        assert_eq!(count_passes(1000, &[0]), 2);
        // Few read in the first pass: it is the last.
        assert_eq!(count_passes(FEW as u64, &[]), 1);
        // Many dropped, then few.
        assert_eq!(count_passes(1000, &[300, 10]), 3);
        // The writes outrun the reads: no pass more.
        assert_eq!(count_passes(1000, &[900, 900, 900]), 2);
        // Shrinking, never to few: the bound.
        assert_eq!(count_passes(1000, &[400, 150, 60, 30, 20]), PASSES);
    }
}
