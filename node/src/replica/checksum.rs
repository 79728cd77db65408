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
//! paused, reads only the chunks written since. A record is checked in
//! its own form: a layer frozen before keeps its checksum.
//!
//! It reads the layer it is handed and owns nothing else.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

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
        Form::Chunked => chunked(l, &BTreeMap::new(), each).map(|(sum, _)| sum),
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

/// The chunked form, taking the digests in `known` as they are and
/// reading only the other chunks that hold data; with how many it read.
pub(super) fn chunked(
    l: &Layer,
    known: &BTreeMap<u64, Digest>,
    mut each: impl FnMut(u64, &[u8]) -> Result<(), ReplicaError>,
) -> Result<(String, u64), ReplicaError> {
    // The layer's runs cut at the chunks' ends; those to read ahead.
    let mut pieces = Vec::new();
    for (s, e) in l.map.runs() {
        let mut b = s;
        while b < e {
            let end = e.min((b / CHUNK + 1) * CHUNK);
            pieces.push((b, end));
            b = end;
        }
    }
    let unknown: Vec<(u64, u64)> = pieces
        .iter()
        .filter(|(s, _)| !known.contains_key(&(s / CHUNK)))
        .copied()
        .collect();
    let mut ahead = Prefetch::new(&l.file, &unknown);
    let mut read_so_far = 0;
    let mut buf = vec![0u8; (BLOCK * CHUNK) as usize];
    let mut top = blake3::Hasher::new();
    let (mut at, mut read) = (0, 0);
    while at < pieces.len() {
        let c = pieces[at].0 / CHUNK;
        let end = pieces[at..]
            .iter()
            .position(|(s, _)| s / CHUNK != c)
            .map_or(pieces.len(), |n| at + n);
        let digest = match known.get(&c) {
            Some(d) => *d,
            None => {
                let mut starting = |_| {
                    ahead.reading(read_so_far);
                    read_so_far += 1;
                };
                let file = (&l.file, l.path.as_path());
                read += 1;
                digest(file, &pieces[at..end], &mut buf, &mut starting, &mut each)?
            }
        };
        top.update(&c.to_le_bytes());
        top.update(&digest);
        at = end;
    }
    Ok((format!("{CHUNKED}{}", top.finalize().to_hex()), read))
}

/// The digest of a chunk of `file` whose allocated runs are `pieces` (cut
/// to the chunk), as the file holds it now, handing `each` what was read.
pub(super) fn chunk(
    file: (&File, &Path),
    pieces: &[(u64, u64)],
    each: &mut impl FnMut(u64, &[u8]) -> Result<(), ReplicaError>,
) -> Result<Digest, ReplicaError> {
    let mut buf = vec![0u8; (BLOCK * CHUNK) as usize];
    digest(file, pieces, &mut buf, &mut |_| {}, each)
}

/// One chunk's digest: each piece's index and length with its bytes.
fn digest(
    (file, path): (&File, &Path),
    pieces: &[(u64, u64)],
    buf: &mut [u8],
    starting: &mut impl FnMut(u64),
    each: &mut impl FnMut(u64, &[u8]) -> Result<(), ReplicaError>,
) -> Result<Digest, ReplicaError> {
    let mut h = blake3::Hasher::new();
    for &(s, e) in pieces {
        starting(s);
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
