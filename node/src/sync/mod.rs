//! Filling a rebuilding replica: every layer it lacks comes from a healthy
//! source, by local sparse copy when the source is on this node, else over
//! the replica protocol as data extents only. Each layer is checked against
//! the source's checksum on arrival and only then completed, so a fill cut
//! off resumes from the layers already done.
//!
//! This module copies layers and nothing else: it neither decides which
//! replica to rebuild (the controller does) nor when it turns `rw` (the
//! engine does).

pub mod local;
mod remote;
mod ring;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::replica::{BLOCK, Corruption, Replica, ReplicaError, Replicas, Shared};
use crate::wire::client::{ClientError, ReplicaClient};
use crate::wire::tls::WireTls;

pub use local::CopyPath;

#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("copy check failed: {0}")]
    Check(String),
    #[error(transparent)]
    Replica(#[from] ReplicaError),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("{0}")]
    Source(String),
    /// The source's own data failed its checksums: it must not be copied
    /// (and the source, not the target, is the replica at fault).
    #[error("the source is corrupt: {message}")]
    SourceCorrupt {
        message: String,
        /// Where its data failed.
        corruption: Corruption,
    },
}

impl SyncError {
    /// The source's own error of data failing its checksum.
    fn source_corrupt(e: &ReplicaError) -> SyncError {
        SyncError::SourceCorrupt {
            message: e.to_string(),
            corruption: e.corruption().unwrap_or_default(),
        }
    }

    /// Where the source's data failed, for `SourceCorrupt`.
    pub fn corruption(&self) -> Option<&Corruption> {
        match self {
            SyncError::SourceCorrupt { corruption, .. } => Some(corruption),
            _ => None,
        }
    }
}

/// Bytes done and to do of a running fill.
#[derive(Debug, Default)]
pub struct Progress {
    pub done: AtomicU64,
    pub total: AtomicU64,
}

/// What a fill did.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct FillReport {
    /// How the last layer was copied (local ways, or remote).
    pub path: CopyPath,
    /// Bytes of layer data copied.
    pub bytes: u64,
    /// Bytes of the target's own old data found equal to the source's
    /// and kept (a seeded layer's blocks), not copied.
    pub reused: u64,
    /// Layers filled.
    pub layers: Vec<String>,
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, SyncError> + Send + 'static,
) -> Result<T, SyncError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| SyncError::Source(format!("copy task failed: {e}")))?
}

fn lock_err() -> SyncError {
    SyncError::Source("replica lock poisoned".into())
}

/// Runs `f` on the target replica under its write lock, on a blocking
/// thread.
async fn on_target<T: Send + 'static>(
    target: &Shared,
    f: impl FnOnce(&mut Replica) -> Result<T, ReplicaError> + Send + 'static,
) -> Result<T, SyncError> {
    let t = target.clone();
    blocking(move || Ok(f(&mut *t.write().map_err(|_| lock_err())?)?)).await
}

/// Empties the target's pending layer `name` again, for a copy from
/// scratch.
async fn reset_layer(target: &Shared, name: &str) -> Result<(), SyncError> {
    let name = name.to_string();
    on_target(target, move |r| r.reset_layer(&name)).await
}

/// The byte ranges of `extents`, in order, cut into pieces of at most
/// `most` bytes.
fn pieces(extents: &[(u64, u64)], most: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::with_capacity(extents.len());
    for &(start, len) in extents {
        let mut at = start;
        while at < start + len {
            let n = (start + len - at).min(most);
            out.push((at, n));
            at += n;
        }
    }
    out
}

/// Block runs `[start, end)` as byte ranges (offset, length).
fn byte_ranges(runs: &[(u64, u64)]) -> Vec<(u64, u64)> {
    runs.iter()
        .map(|&(s, e)| (s * BLOCK, (e - s) * BLOCK))
        .collect()
}

/// The fills running on this node, by target replica: one at a time per
/// replica, with its progress.
#[derive(Default)]
pub struct Fills {
    running: std::sync::Mutex<std::collections::HashMap<String, Arc<Progress>>>,
}

impl Fills {
    /// Bytes done and total of the fill of `name`, while one runs.
    pub fn progress(&self, name: &str) -> Option<(u64, u64)> {
        let running = self.running.lock().ok()?;
        let p = running.get(name)?;
        Some((
            p.done.load(Ordering::SeqCst),
            p.total.load(Ordering::SeqCst),
        ))
    }

    /// Fills the pending layers of `target` from `source` (`NAME@ADDR`),
    /// one fill per replica at a time.
    pub async fn run(
        &self,
        replicas: &Arc<Replicas>,
        tls: &WireTls,
        target: &str,
        source: &str,
    ) -> Result<FillReport, SyncError> {
        let (src_name, src_addr) = source
            .split_once('@')
            .filter(|(n, a)| !n.is_empty() && !a.is_empty())
            .ok_or_else(|| {
                SyncError::Source(format!("fill source {source:?}: expected NAME@HOST:PORT"))
            })?;
        let replica = replicas
            .find_async(target)
            .await
            .map_err(SyncError::Source)?;
        let progress = Arc::new(Progress::default());
        {
            let mut running = self
                .running
                .lock()
                .map_err(|_| SyncError::Source("registry poisoned".into()))?;
            if running.contains_key(target) {
                return Err(SyncError::Source(format!(
                    "{target} is already being filled"
                )));
            }
            running.insert(target.to_string(), progress.clone());
        }
        let source = (tls, src_name, src_addr);
        let done = fill(replicas, target, replica, source, progress).await;
        if let Ok(mut running) = self.running.lock() {
            running.remove(target);
        }
        done
    }
}

/// Fills every pending layer of `target` from the replica `source_name`
/// served at `source_addr`.
#[tracing::instrument(skip_all, fields(replica = %target_name, source = %source_name))]
async fn fill(
    replicas: &Arc<Replicas>,
    target_name: &str,
    target: Shared,
    (tls, source_name, source_addr): (&WireTls, &str, &str),
    progress: Arc<Progress>,
) -> Result<FillReport, SyncError> {
    let pending = target.read().map_err(|_| lock_err())?.pending();
    // Another node's replica opens only for a reader of its volume.
    let tls = tls
        .to_read(target_name, source_name)
        .await
        .map_err(SyncError::Source)?;
    let client = ReplicaClient::dial(&tls, source_addr, source_name).await?;
    let layers = client.layers().await?;
    let mut todo = Vec::new();
    for name in &pending {
        let (index, info) = layers
            .iter()
            .enumerate()
            .find(|(_, l)| &l.name == name)
            .ok_or_else(|| SyncError::Source(format!("the source has no layer {name}")))?;
        if info.pending || info.checksum.is_none() {
            return Err(SyncError::Source(format!(
                "the source's layer {name} is not complete"
            )));
        }
        todo.push((index as u64, info.clone()));
    }
    progress.total.store(
        todo.iter().map(|(_, l)| l.allocated).sum(),
        Ordering::SeqCst,
    );
    let mut report = FillReport {
        path: CopyPath::Remote,
        bytes: 0,
        reused: 0,
        layers: pending.clone(),
    };
    // The source is on this node when the table can open it.
    let local_source = if source_name != target_name {
        replicas.find_async(source_name).await.ok()
    } else {
        None
    };
    let mut remaining = todo.as_slice();
    if let Some(src) = local_source {
        while let Some(((_, layer), rest)) = remaining.split_first() {
            let (src, dst, name) = (src.clone(), target.clone(), layer.name.clone());
            let lost = layer.lost.clone();
            let copied = blocking(move || {
                let (src_path, map, size) = {
                    let s = src.read().map_err(|_| lock_err())?;
                    // A layer found corrupt is not copied; the error
                    // names its bad block when it is marked for one.
                    if s.is_corrupt(&name) {
                        s.verify_layer(&name)
                            .map_err(|e| SyncError::source_corrupt(&e))?;
                    }
                    (s.layer_path(&name)?, s.layer_map(&name)?, s.size())
                };
                let dst_path = dst.read().map_err(|_| lock_err())?.layer_path(&name)?;
                let way = local::copy_layer(&src_path, &map, &dst_path, size)?;
                let mut d = dst.write().map_err(|_| lock_err())?;
                d.reopen_layer(&name)?;
                // The check of what was copied is the target's: its layer
                // completes only with the source's recorded checksum (a
                // reflink or copy_file_range never reads what it copies).
                // Where it differs, the source is read and checked too, to
                // say whose fault it is; a sound source is read only once.
                match d.complete_layer(&name, &lost) {
                    Ok(()) => Ok(way),
                    Err(e @ ReplicaError::Corrupt(_)) => {
                        drop(d);
                        let s = src.read().map_err(|_| lock_err())?;
                        match s.verify_layer(&name) {
                            Err(bad) => {
                                s.note_corruption(&bad);
                                Err(SyncError::source_corrupt(&bad))
                            }
                            Ok(()) => Err(e.into()),
                        }
                    }
                    Err(e) => Err(e.into()),
                }
            })
            .await;
            match copied {
                Ok(way) => {
                    report.path = way;
                    report.bytes += layer.allocated;
                    progress.done.fetch_add(layer.allocated, Ordering::SeqCst);
                    remaining = rest;
                }
                Err(e @ SyncError::SourceCorrupt { .. }) => return Err(e),
                Err(e) => {
                    tracing::warn!(layer = %layer.name, error = %e, "local copy failed; cleaning the target and copying over the network");
                    reset_layer(&target, &layer.name).await?;
                    break;
                }
            }
        }
    }
    for (index, layer) in remaining {
        let pulled = remote::pull_layer(&client, (*index, layer), &target, &progress).await?;
        report.path = CopyPath::Remote;
        report.bytes += pulled.copied;
        report.reused += pulled.reused;
    }
    Ok(report)
}
