//! Remote sync of one layer: its data extents, read from the source's
//! replica server in pipelined chunks (many requests in flight, the source
//! reading them on several threads) and written into the target's pending
//! layer by a writer thread; then the layer's checksum is checked.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::replica::Shared;
use crate::wire::client::ReplicaClient;
use crate::wire::protocol::Op;

use super::{Progress, SyncError, blocking, lock_err};

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

/// Copies the layer at chain index `index` of the source into the target's
/// pending layer `name`, and completes it. Returns the bytes copied.
///
/// Reads are pipelined; what arrives goes to one writer thread, which
/// writes every reply it has in one go, under one lock of the target.
pub async fn pull_layer(
    source: &ReplicaClient,
    index: u64,
    name: &str,
    target: &Shared,
    progress: &Arc<Progress>,
) -> Result<u64, SyncError> {
    let body = source.call(Op::LayerExtents, 0, 0, index, 0, &[]).await?;
    let extents: Vec<(u64, u64)> = serde_json::from_slice(&body)
        .map_err(|e| SyncError::Source(format!("layer {name}: bad extent list: {e}")))?;
    let mut chunks = VecDeque::new();
    for (start, len) in extents {
        let mut at = start;
        while at < start + len {
            let n = (start + len - at).min(CHUNK);
            chunks.push_back((at, n));
            at += n;
        }
    }
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
                let Some((at, n)) = chunks.pop_front() else {
                    break;
                };
                let wait =
                    source.submit(Op::LayerRead, at, n as u32, index, 0, bytes::Bytes::new())?;
                in_flight.push_back((at, n, wait));
                bytes += n;
            }
            let Some((at, n, wait)) = in_flight.pop_front() else {
                return Ok(());
            };
            let data = wait.await.map_err(|e| {
                if e.is_corrupt() {
                    SyncError::SourceCorrupt(format!("layer {name}: {e}"))
                } else {
                    SyncError::from(e)
                }
            })?;
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
    let copied = written?;
    let (t, layer) = (target.clone(), name.to_string());
    blocking(move || {
        t.write()
            .map_err(|_| lock_err())?
            .complete_layer(&layer)
            .map_err(SyncError::from)
    })
    .await?;
    Ok(copied)
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
