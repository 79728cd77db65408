//! Remote sync of one layer: its data extents, read from the source's
//! replica server in pipelined chunks and written into the target's pending
//! layer; then the layer's checksum is checked.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::replica::Shared;
use crate::wire::client::ReplicaClient;
use crate::wire::protocol::Op;

use super::{Progress, SyncError, blocking, lock_err};

/// Bytes per read request.
const CHUNK: u64 = 4 << 20;
/// Reads in flight at once.
const DEPTH: usize = 4;

/// Copies the layer at chain index `index` of the source into the target's
/// pending layer `name`, and completes it. Returns the bytes copied.
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
    let mut in_flight = VecDeque::new();
    let mut copied = 0u64;
    loop {
        while in_flight.len() < DEPTH {
            let Some((at, n)) = chunks.pop_front() else {
                break;
            };
            let wait = source.submit(Op::LayerRead, at, n as u32, index, 0, bytes::Bytes::new())?;
            in_flight.push_back((at, wait));
        }
        let Some((at, wait)) = in_flight.pop_front() else {
            break;
        };
        let data = wait.await.map_err(|e| {
            if e.is_corrupt() {
                SyncError::SourceCorrupt(format!("layer {name}: {e}"))
            } else {
                SyncError::from(e)
            }
        })?;
        let n = data.len() as u64;
        let (t, layer) = (target.clone(), name.to_string());
        blocking(move || {
            t.write()
                .map_err(|_| lock_err())?
                .write_layer(&layer, at, &data)
                .map_err(SyncError::from)
        })
        .await?;
        copied += n;
        progress.done.fetch_add(n, Ordering::SeqCst);
    }
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
