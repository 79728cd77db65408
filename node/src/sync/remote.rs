//! Remote sync of one layer: its data extents, read from the source's
//! replica server in pipelined chunks (many requests in flight, the source
//! reading them on several threads) and written into the target's pending
//! layer by a writer thread; then the layer's checksum is checked.
//!
//! A pending layer that holds data already (the target's old layer of the
//! same name, kept by the join as a seed, or a fill cut off) is compared
//! first: the source sends the CRC32C of each block of its layer from its
//! table (LAYER_SUMS, no data read), the target takes those of its seed,
//! and only the blocks that differ or that the seed lacks travel; what the
//! source's layer does not hold is punched out. The layer's checksum is
//! then checked as for any fill; should it not match (a CRC32C that agreed
//! on different data), the layer is emptied and copied whole. A source
//! that does not know LAYER_SUMS fails the attempt, with the layer
//! emptied: the next one copies it whole.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::replica::{
    BLOCK, Bitmap, Corruption, LayerInfo, Prefetch, ReplicaError, Shared, each_block_sum,
};
use crate::wire::client::{ClientError, ReplicaClient};
use crate::wire::protocol::{MAX_DATA, Op, status};

use super::{Progress, SyncError, blocking, byte_ranges, lock_err, on_target, pieces, reset_layer};

/// The most bytes one read request asks for.
const CHUNK: u64 = 4 << 20;
/// Reads in flight at once, at most: a fragmented layer is many small
/// extents, and each is a request; the source reads them on several
/// threads while earlier replies travel and are written.
const DEPTH: usize = 64;
/// Bytes in flight at once, at most (half of what the source's server lets
/// one connection hold).
const IN_FLIGHT: u64 = 32 << 20;
/// Bytes the writer writes under one lock of the target, at most.
const LOCK_BATCH: u64 = 4 << 20;

/// What one layer's pull did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pulled {
    /// Bytes that came over the network.
    pub copied: u64,
    /// Bytes of the target's seed found equal to the source's, kept.
    pub reused: u64,
}

/// Copies the layer `layer` at chain index `index` of the source into the
/// target's pending layer of that name, and completes it (with the blocks
/// the source's records lost).
pub async fn pull_layer(
    source: &ReplicaClient,
    (index, layer): (u64, &LayerInfo),
    target: &Shared,
    progress: &Arc<Progress>,
) -> Result<Pulled, SyncError> {
    let (name, lost) = (layer.name.as_str(), layer.lost.as_slice());
    let body = progress
        .source_answer(source.call(Op::LayerExtents, 0, 0, index, 0, &[]))
        .await??;
    let extents: Vec<(u64, u64)> = serde_json::from_slice(&body)
        .map_err(|e| SyncError::Source(format!("layer {name}: bad extent list: {e}")))?;
    let (held, path) = {
        let (t, layer) = (target.clone(), name.to_string());
        blocking(move || {
            let t = t.read().map_err(|_| lock_err())?;
            Ok((t.layer_map(&layer)?, t.layer_path(&layer)?))
        })
        .await?
    };
    if held.count() > 0 {
        let before = progress.done.load(Ordering::SeqCst);
        let seed = (path.as_path(), &held);
        let unknown = match pull_seeded(source, (index, layer), target, &extents, seed, progress)
            .await
        {
            Ok(pulled) => return Ok(pulled),
            // The seed misled the compare (the layer's checksum did not
            // match): copy it whole.
            Err(e @ SyncError::Replica(ReplicaError::Corrupt(_))) => {
                tracing::warn!(layer = name, error = %e, "the seeded layer did not match the source's; copying it whole");
                None
            }
            // A source that predates LAYER_SUMS refuses it and closes the
            // connection: the seed goes, and the next attempt copies the
            // layer whole.
            Err(SyncError::Client(ClientError::Failed {
                status: status::INVALID,
                message,
                ..
            })) => Some(message),
            Err(e) => return Err(e),
        };
        progress.done.store(before, Ordering::SeqCst);
        reset_layer(target, name).await?;
        if let Some(why) = unknown {
            return Err(SyncError::Source(format!(
                "layer {name}: the source cannot compare blocks ({why}); the layer was emptied, and the next attempt copies it whole"
            )));
        }
    }
    let copied = fetch(
        source,
        index,
        name,
        target,
        progress,
        pieces(&extents, CHUNK).into(),
    )
    .await?;
    complete(target, name, lost).await?;
    Ok(Pulled { copied, reused: 0 })
}

/// Ranges that cover `extents` in order, each spanning at most `most`
/// bytes (an extent longer than that is cut): one LAYER_SUMS request each,
/// however many extents it spans.
fn windows(extents: &[(u64, u64)], most: u64) -> VecDeque<(u64, u64)> {
    let mut out: VecDeque<(u64, u64)> = VecDeque::new();
    for (at, n) in pieces(extents, most) {
        match out.back_mut() {
            Some((start, len)) if at + n - *start <= most => *len = at + n - *start,
            _ => out.push_back((at, n)),
        }
    }
    out
}

/// Pulls a layer into a pending layer that holds `held` already: compares
/// block checksums, punches what the source's layer lacks, fetches what
/// differs, and completes the layer.
async fn pull_seeded(
    source: &ReplicaClient,
    (index, layer): (u64, &LayerInfo),
    target: &Shared,
    extents: &[(u64, u64)],
    (path, held): (&std::path::Path, &Bitmap),
    progress: &Arc<Progress>,
) -> Result<Pulled, SyncError> {
    let (name, lost) = (layer.name.as_str(), layer.lost.as_slice());
    let mut wanted = Bitmap::new(held.len());
    for &(start, len) in extents {
        wanted.set_range(start / BLOCK, (start + len).div_ceil(BLOCK), true);
    }
    let path = path.to_path_buf();
    // The source's sums of each window, in order, to a comparer thread that
    // reads the seed's blocks and answers which are equal.
    let (tx, rx) = tokio::sync::mpsc::channel::<(u64, bytes::Bytes)>(DEPTH);
    let comparer = {
        let mut both = held.clone();
        both.intersect(&wanted);
        let progress = progress.clone();
        tokio::task::spawn_blocking(move || compare(rx, &path, &both, &progress))
    };
    let ask = async {
        let mut pieces = windows(extents, u64::from(MAX_DATA));
        let mut in_flight = VecDeque::new();
        loop {
            while in_flight.len() < DEPTH {
                let Some((at, n)) = pieces.pop_front() else {
                    break;
                };
                let wait =
                    source.submit(Op::LayerSums, at, n as u32, index, 0, bytes::Bytes::new())?;
                in_flight.push_back((at, wait));
            }
            let Some((at, wait)) = in_flight.pop_front() else {
                return Ok(());
            };
            let sums = progress
                .source_answer(wait)
                .await?
                .map_err(|e| of_source(name, e))?;
            if tx.send((at, sums)).await.is_err() {
                // The comparer stopped: its error says why.
                return Ok(());
            }
        }
    };
    let asked: Result<(), SyncError> = ask.await;
    drop(tx);
    let compared = comparer
        .await
        .map_err(|e| SyncError::Source(format!("compare task failed: {e}")))?;
    asked?;
    let (mut same, mut reused) = compared?;
    // A block the source lost comes as the source holds it, whatever the
    // seed's: the layer's checksum covers it so.
    for &b in lost {
        if same.get(b) {
            same.set(b, false);
            reused -= BLOCK;
            progress.done.fetch_sub(BLOCK, Ordering::SeqCst);
        }
    }
    // What the seed holds and the source's layer does not, goes.
    let mut extra = held.clone();
    extra.subtract(&wanted);
    let (layer, punch) = (name.to_string(), byte_ranges(&extra.runs()));
    on_target(target, move |t| {
        punch
            .into_iter()
            .try_for_each(|(at, n)| t.punch_layer(&layer, at, n))
    })
    .await?;
    wanted.subtract(&same);
    let todo = pieces(&byte_ranges(&wanted.runs()), CHUNK).into();
    let copied = fetch(source, index, name, target, progress, todo).await?;
    complete(target, name, lost).await?;
    Ok(Pulled { copied, reused })
}

/// Compares the source's sums of each window, as they arrive (in order),
/// with the CRC32C of the seed's blocks in `both` (held by the seed and by
/// the source's layer), read from the pending layer's file at `path` in
/// order, the kernel reading ahead. Nothing else touches that layer until
/// the compare ends. Returns the blocks found equal, and their bytes.
fn compare(
    mut rx: tokio::sync::mpsc::Receiver<(u64, bytes::Bytes)>,
    path: &std::path::Path,
    both: &Bitmap,
    progress: &Progress,
) -> Result<(Bitmap, u64), SyncError> {
    use std::os::unix::fs::FileExt;
    let io = |e| SyncError::Io {
        path: path.to_path_buf(),
        source: e,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let runs = both.runs();
    let mut ahead = Prefetch::new(&file, &runs);
    let mut same = Bitmap::new(both.len());
    let mut reused = 0u64;
    let mut buf = vec![0u8; CHUNK as usize];
    let mut i = 0;
    while let Some((at, theirs)) = rx.blocking_recv() {
        let (ws, we) = (at / BLOCK, at / BLOCK + theirs.len() as u64 / 4);
        while i < runs.len() && runs[i].1 <= ws {
            i += 1;
        }
        while i < runs.len() && runs[i].0 < we {
            ahead.reading(i);
            let (s, e) = (runs[i].0.max(ws), runs[i].1.min(we));
            let mut b = s;
            while b < e {
                let n = (e - b).min(CHUNK / BLOCK);
                let chunk = &mut buf[..(n * BLOCK) as usize];
                file.read_exact_at(chunk, b * BLOCK).map_err(io)?;
                each_block_sum(chunk, |k, sum| {
                    let x = b + k as u64;
                    let at = ((x - ws) * 4) as usize;
                    let mut w = [0u8; 4];
                    w.copy_from_slice(&theirs[at..at + 4]);
                    if sum == u32::from_le_bytes(w) {
                        same.set(x, true);
                        reused += BLOCK;
                        progress.done.fetch_add(BLOCK, Ordering::SeqCst);
                    }
                });
                b += n;
            }
            if runs[i].1 > we {
                // The run goes on in the next window.
                break;
            }
            i += 1;
        }
    }
    Ok((same, reused))
}

/// Reads `todo` (byte ranges of the layer at chain index `index`) from the
/// source, pipelined, into the target's pending layer `name`. Returns the
/// bytes copied.
///
/// What arrives goes to one writer thread, which writes every reply it has
/// in one go, under one lock of the target.
async fn fetch(
    source: &ReplicaClient,
    index: u64,
    name: &str,
    target: &Shared,
    progress: &Arc<Progress>,
    mut chunks: VecDeque<(u64, u64)>,
) -> Result<u64, SyncError> {
    let (tx, rx) = tokio::sync::mpsc::channel::<(u64, bytes::Bytes)>(DEPTH);
    let writer = {
        let (t, layer, progress) = (target.clone(), name.to_string(), progress.clone());
        tokio::task::spawn_blocking(move || write_arrivals(rx, &t, &layer, &progress))
    };
    let read = async {
        let mut in_flight = VecDeque::new();
        let mut bytes = 0u64;
        loop {
            while in_flight.len() < DEPTH && bytes < IN_FLIGHT {
                let Some(&(at, n)) = chunks.front() else {
                    break;
                };
                // Paced: while the next piece is not due, what is in flight
                // is written first.
                if !in_flight.is_empty() && !progress.pace.ready(n) {
                    break;
                }
                chunks.pop_front();
                progress.pace(n).await?;
                let wait =
                    source.submit(Op::LayerRead, at, n as u32, index, 0, bytes::Bytes::new())?;
                in_flight.push_back((at, n, wait));
                bytes += n;
            }
            let Some((at, n, wait)) = in_flight.pop_front() else {
                return Ok(());
            };
            let data = progress
                .source_answer(wait)
                .await?
                .map_err(|e| of_source(name, e))?;
            bytes -= n;
            if tx.send((at, data)).await.is_err() {
                // The writer stopped: its error says why.
                return Ok(());
            }
        }
    };
    let read: Result<(), SyncError> = read.await;
    drop(tx);
    let written = writer
        .await
        .map_err(|e| SyncError::Source(format!("copy task failed: {e}")))?;
    read?;
    written
}

/// An error of the source's answer about layer `name`: its data failing
/// its checksums makes the source the replica at fault.
fn of_source(name: &str, e: ClientError) -> SyncError {
    if e.is_corrupt() {
        let corruption = e.corruption().cloned().unwrap_or_else(|| Corruption {
            layer: Some(name.to_string()),
            ..Corruption::default()
        });
        SyncError::SourceCorrupt {
            message: format!("layer {name}: {e}"),
            corruption,
        }
    } else {
        SyncError::from(e)
    }
}

/// Checks the filled layer against its checksum and completes it, with
/// the blocks its source lost.
async fn complete(target: &Shared, name: &str, lost: &[u64]) -> Result<(), SyncError> {
    let (t, layer, lost) = (target.clone(), name.to_string(), lost.to_vec());
    blocking(move || Ok(crate::replica::complete_apart(&t, &layer, &lost)?)).await
}

/// Writes what arrives into the pending layer `layer` until the sender is
/// done; everything waiting is written under one lock. Returns the bytes
/// written.
fn write_arrivals(
    mut rx: tokio::sync::mpsc::Receiver<(u64, bytes::Bytes)>,
    target: &Shared,
    layer: &str,
    progress: &Progress,
) -> Result<u64, SyncError> {
    let mut written = 0u64;
    while let Some(first) = rx.blocking_recv() {
        // The engine's writes to the replica wait for this lock: it is
        // held for a few MiB at most.
        let mut t = target.write().map_err(|_| lock_err())?;
        let mut batch = 0u64;
        let mut next = Some(first);
        while let Some((at, data)) = next {
            t.write_layer(layer, at, &data)?;
            let n = data.len() as u64;
            written += n;
            batch += n;
            progress.done.fetch_add(n, Ordering::SeqCst);
            next = if batch < LOCK_BATCH {
                rx.try_recv().ok()
            } else {
                None
            };
        }
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_take_in_many_extents_and_cut_a_long_one() {
        let mib = |n: u64| n << 20;
        let extents = [
            (0, 4096),
            (mib(1), 8192),
            (mib(31), mib(2)),
            (mib(40), mib(70)),
        ];
        let got: Vec<_> = windows(&extents, mib(32)).into_iter().collect();
        assert_eq!(
            got,
            [
                // The first two extents in one window (the third does not
                // end within 32 MiB of its start).
                (0, mib(1) + 8192),
                (mib(31), mib(2)),
                // The long one, cut.
                (mib(40), mib(32)),
                (mib(72), mib(32)),
                (mib(104), mib(6)),
            ]
        );
        // Every byte of every extent is in a window.
        let covered = |at: u64| got.iter().any(|&(s, n)| s <= at && at < s + n);
        for (s, n) in extents {
            assert!(covered(s) && covered(s + n - 1));
        }
    }
}
