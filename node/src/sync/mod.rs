//! Filling a rebuilding replica: every layer it lacks comes from a healthy
//! source, by local sparse copy when the source is on this node, else over
//! the replica protocol as data extents only. Each layer is checked against
//! the source's checksum on arrival and only then completed, so a fill cut
//! off resumes from the layers already done. A fill ends when its caller
//! goes away, or when its source leaves a request unanswered for
//! `SOURCE_SILENCE`, even while it waits for that answer.
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
    /// An error of the source's own check of its data: the source's
    /// fault when its data failed its checksums; any other (a layer that
    /// changed under a view of it, see `Replica::as_seen`) blames no one.
    fn of_source(e: ReplicaError) -> SyncError {
        match e.corruption() {
            Some(corruption) => SyncError::SourceCorrupt {
                message: e.to_string(),
                corruption,
            },
            None => SyncError::Replica(e),
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

/// Bytes done and to do of a running fill, the pace it keeps, and whether
/// its caller went away (it stops then, at its next piece).
#[derive(Debug, Default)]
pub struct Progress {
    pub done: AtomicU64,
    pub total: AtomicU64,
    pace: Pace,
    called_off: std::sync::atomic::AtomicBool,
    /// Wakes the fill waiting for its pace when it is called off.
    off: tokio::sync::Notify,
    /// Wakes the callers waiting for the fill to end, once it has left
    /// the node's list of fills.
    ended: tokio::sync::Notify,
}

impl Progress {
    /// A fill's progress, copying at most `bytes_per_second` (0: no
    /// limit), over the network or within the node.
    pub fn paced(bytes_per_second: u64) -> Progress {
        Progress {
            pace: Pace::new(bytes_per_second),
            ..Progress::default()
        }
    }

    /// Waits until `n` more bytes may be pulled, or the fill is called off.
    pub async fn pace(&self, n: u64) -> Result<(), SyncError> {
        tokio::select! {
            () = self.pace.take(n) => {}
            () = self.off.notified() => self.off.notify_one(),
        }
        called_off(self)
    }

    /// `pace` for a copy on threads of its own (within a node): waits
    /// until `n` more bytes are due, looking every `CALL_OFF_LOOK` whether
    /// the fill was called off, and counts them done.
    fn pace_blocking(&self, n: u64) -> Result<(), SyncError> {
        called_off(self)?;
        if let Some(due) = self.pace.claim(n) {
            let due = due.into_std();
            loop {
                let now = std::time::Instant::now();
                if now >= due {
                    break;
                }
                std::thread::sleep((due - now).min(CALL_OFF_LOOK));
                called_off(self)?;
            }
        }
        self.done.fetch_add(n, Ordering::SeqCst);
        Ok(())
    }

    /// The source's answer `answer`, unless the fill is called off first or
    /// the source leaves it unanswered for `SOURCE_SILENCE`. A source that
    /// stopped answering (its node frozen) would otherwise hold the fill,
    /// and its target (no join while it fills), for as long: a fill called
    /// off, or one whose caller waits for it (an offline rebuild, hours).
    pub async fn source_answer<T>(
        &self,
        answer: impl std::future::Future<Output = T>,
    ) -> Result<T, SyncError> {
        called_off(self)?;
        tokio::select! {
            got = answer => Ok(got),
            () = self.off.notified() => {
                // The permit stays for any other wait of the fill.
                self.off.notify_one();
                called_off(self)?;
                Err(SyncError::Source("the fill was called off".into()))
            }
            () = tokio::time::sleep(SOURCE_SILENCE) => Err(SyncError::Source(format!(
                "the source left a request of the fill unanswered for {}s; given up",
                SOURCE_SILENCE.as_secs()
            ))),
        }
    }
}

/// The longest a fill waits for one answer of its source: each request
/// asks for at most 4 MiB, and at most 32 MiB are in flight, so a source
/// that answers none for this long is not working (the wire's `SILENCE`:
/// its node frozen, its network dropping packets, its disk hung).
pub const SOURCE_SILENCE: std::time::Duration = crate::wire::client::SILENCE;

/// How often a copy within a node, waiting for its pace, looks whether
/// its fill was called off.
const CALL_OFF_LOOK: std::time::Duration = std::time::Duration::from_millis(100);

/// What a copy within a node asks before each piece of data (at most
/// 4 MiB): it returns once the piece is due at the fill's pace, or fails
/// when the fill is called off.
pub struct Gate<'a>(pub &'a (dyn Fn(u64) -> Result<(), SyncError> + Sync));

impl Gate<'static> {
    /// No pace, and never called off.
    pub const OPEN: Gate<'static> = Gate(&|_| Ok(()));
}

impl Gate<'_> {
    /// Waits until `n` more bytes may be copied; the error of a copy
    /// stopped (`Stopped`) when the fill was called off.
    fn ask(&self, n: u64) -> std::io::Result<()> {
        (self.0)(n).map_err(|e| std::io::Error::other(Stopped(e.to_string())))
    }
}

/// The error of a piece whose gate stopped the copy (the fill called off):
/// no other way is tried then.
#[derive(Debug)]
struct Stopped(String);

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Stopped {}

/// Keeps a copy at or under a rate, counted from its start: each `take`
/// waits until the bytes taken so far fit in the time since then.
#[derive(Debug)]
pub struct Pace {
    bytes_per_second: u64,
    started: tokio::time::Instant,
    taken: AtomicU64,
}

impl Default for Pace {
    /// No limit.
    fn default() -> Self {
        Pace::new(0)
    }
}

impl Pace {
    pub fn new(bytes_per_second: u64) -> Pace {
        Pace {
            bytes_per_second,
            started: tokio::time::Instant::now(),
            taken: AtomicU64::new(0),
        }
    }

    /// Takes `n` bytes, once they are due (at once with no limit).
    pub async fn take(&self, n: u64) {
        if let Some(due) = self.claim(n) {
            tokio::time::sleep_until(due).await;
        }
    }

    /// Counts `n` more bytes taken: when they are due (None with no
    /// limit).
    fn claim(&self, n: u64) -> Option<tokio::time::Instant> {
        if self.bytes_per_second == 0 {
            return None;
        }
        let taken = self.taken.fetch_add(n, Ordering::SeqCst) + n;
        Some(self.due(taken))
    }

    /// Whether `n` more bytes are due now.
    pub fn ready(&self, n: u64) -> bool {
        self.bytes_per_second == 0
            || self.due(self.taken.load(Ordering::SeqCst) + n) <= tokio::time::Instant::now()
    }

    /// When `taken` bytes in all are due.
    fn due(&self, taken: u64) -> tokio::time::Instant {
        let after = taken as f64 / self.bytes_per_second as f64;
        self.started + std::time::Duration::from_secs_f64(after)
    }
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
    running: Arc<std::sync::Mutex<std::collections::HashMap<String, Arc<Progress>>>>,
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

    /// Calls off the fill of `name`, if one runs, and waits at most
    /// `patience` for it to end (its last pieces written); whether it
    /// has ended (or none ran).
    pub async fn call_off(&self, name: &str, patience: std::time::Duration) -> bool {
        let Some(p) = self.running.lock().ok().and_then(|r| r.get(name).cloned()) else {
            return true;
        };
        p.called_off.store(true, Ordering::SeqCst);
        p.off.notify_one();
        // Made before the look, so that an end after it wakes this.
        let ended = p.ended.notified();
        let still = |r: &std::collections::HashMap<String, Arc<Progress>>| {
            r.get(name).is_some_and(|q| Arc::ptr_eq(q, &p))
        };
        if !self.running.lock().is_ok_and(|r| still(&r)) {
            return true;
        }
        tokio::time::timeout(patience, ended).await.is_ok()
    }

    /// Fills the pending layers of `target` from `source` (`NAME@ADDR`),
    /// one fill per replica at a time, copying at most `bytes_per_second`
    /// (0: no limit), over the network or within the node.
    pub async fn run(
        &self,
        replicas: &Arc<Replicas>,
        tls: &WireTls,
        target: &str,
        (source, bytes_per_second): (&str, u64),
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
        let progress = Arc::new(Progress::paced(bytes_per_second));
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
        // The fill runs as a task of its own, which leaves the registry
        // only once every piece it began is written: a caller that goes
        // away (its call cut) calls it off, and until it has stopped, the
        // replica is still being filled (no join changes its layers).
        let task = {
            let (replicas, tls, fills) = (replicas.clone(), tls.clone(), self.running.clone());
            let (target, src_name, src_addr) = (
                target.to_string(),
                src_name.to_string(),
                src_addr.to_string(),
            );
            let progress = progress.clone();
            tokio::spawn(tracing::Instrument::in_current_span(async move {
                let source = (&tls, src_name.as_str(), src_addr.as_str());
                let done = fill(&replicas, &target, replica, source, progress.clone()).await;
                if done.is_err() && progress.called_off.load(Ordering::SeqCst) {
                    tracing::info!(replica = %target, "the fill was called off: its caller went away");
                }
                if let Ok(mut running) = fills.lock() {
                    running.remove(&target);
                }
                progress.ended.notify_waiters();
                done
            }))
        };
        let _call_off = CallOff(progress);
        task.await
            .map_err(|e| SyncError::Source(format!("the fill ended: {e}")))?
    }
}

/// Calls a fill off when its caller goes away before it ends.
struct CallOff(Arc<Progress>);

impl Drop for CallOff {
    fn drop(&mut self) {
        self.0.called_off.store(true, Ordering::SeqCst);
        // A permit kept for the next wait, if none waits now.
        self.0.off.notify_one();
    }
}

/// A fill's error once its caller went away.
fn called_off(progress: &Progress) -> Result<(), SyncError> {
    if progress.called_off.load(Ordering::SeqCst) {
        return Err(SyncError::Source("the fill was called off".into()));
    }
    Ok(())
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
    let client = progress
        .source_answer(ReplicaClient::dial(&tls, source_addr, source_name))
        .await??;
    // From here until the fill ends (`client` lives as long), the source
    // is not merged, whether it is copied over the wire or, on this node,
    // from its files: the layers listed are the layers copied.
    let layers = progress.source_answer(client.layers_to_copy()).await??;
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
            called_off(&progress)?;
            let (src, dst, name) = (src.clone(), target.clone(), layer.name.clone());
            let lost = layer.lost.clone();
            let done_before = progress.done.load(Ordering::SeqCst);
            let paced = progress.clone();
            let copied = blocking(move || {
                let (src_path, map, size) = {
                    let s = src.read().map_err(|_| lock_err())?;
                    // A layer found corrupt is not copied; the error
                    // names its bad block when it is marked for one.
                    if s.is_corrupt(&name) {
                        s.verify_layer(&name).map_err(SyncError::of_source)?;
                    }
                    (s.layer_path(&name)?, s.layer_map(&name)?, s.size())
                };
                let dst_path = dst.read().map_err(|_| lock_err())?.layer_path(&name)?;
                let gate = Gate(&|n| paced.pace_blocking(n));
                let way = local::copy_layer_gated(&src_path, &map, &dst_path, size, &gate)?;
                dst.write().map_err(|_| lock_err())?.reopen_layer(&name)?;
                // The check of what was copied is the target's: its layer
                // completes only with the source's recorded checksum (a
                // reflink or copy_file_range never reads what it copies),
                // read without the target's lock (`complete_apart`).
                // Where it differs, the source is read and checked too, to
                // say whose fault it is; a sound source is read only once.
                match crate::replica::complete_apart(&dst, &name, &lost) {
                    Ok(()) => Ok(way),
                    Err(e @ ReplicaError::Corrupt(_)) => {
                        let s = src.read().map_err(|_| lock_err())?;
                        match s.verify_layer(&name) {
                            Err(bad) => {
                                s.note_corruption(&bad);
                                Err(SyncError::of_source(bad))
                            }
                            Ok(()) => Err(e.into()),
                        }
                    }
                    Err(e) => Err(e.into()),
                }
            })
            .await;
            // The pieces counted themselves done as they went; the layer
            // counts once, whatever ways were tried.
            progress.done.store(done_before, Ordering::SeqCst);
            match copied {
                Ok(way) => {
                    report.path = way;
                    report.bytes += layer.allocated;
                    progress.done.fetch_add(layer.allocated, Ordering::SeqCst);
                    remaining = rest;
                }
                Err(e @ SyncError::SourceCorrupt { .. }) => return Err(e),
                Err(e) if progress.called_off.load(Ordering::SeqCst) => return Err(e),
                Err(e) => {
                    tracing::warn!(layer = %layer.name, error = %e, "local copy failed; cleaning the target and copying over the network");
                    reset_layer(&target, &layer.name).await?;
                    break;
                }
            }
        }
    }
    for (index, layer) in remaining {
        called_off(&progress)?;
        let pulled = remote::pull_layer(&client, (*index, layer), &target, &progress).await?;
        report.path = CopyPath::Remote;
        report.bytes += pulled.copied;
        report.reused += pulled.reused;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A copy within the node whose layer arrived wrong checks its source:
    /// a block failing its checksum there is the source's fault; a layer
    /// that changed under the view the source was read through (a merge
    /// of the engine it is lent to) is no one's, and the attempt fails
    /// plainly (before 2026-12-06 every error of the check blamed the
    /// source).
    #[test]
    fn a_sources_check_blames_it_only_for_data_failing_its_checksums() {
        let bad = ReplicaError::CorruptBlock {
            dir: "/d".into(),
            layer: "layer-000002.img".into(),
            block: 7,
            recorded: Some(1),
        };
        let e = SyncError::of_source(bad);
        assert!(matches!(e, SyncError::SourceCorrupt { .. }), "{e}");
        assert_eq!(e.corruption().and_then(|c| c.at), Some(7 * BLOCK));
        let changed = ReplicaError::Changed("layer layer-000002.img changed".into());
        let e = SyncError::of_source(changed);
        assert!(
            matches!(e, SyncError::Replica(ReplicaError::Changed(_))),
            "{e}"
        );
    }

    /// A fill waits for its source's answer until the answer comes, the
    /// fill is called off, or `SOURCE_SILENCE` passes (on tokio's paused
    /// clock).
    #[tokio::test(start_paused = true)]
    async fn a_fill_waits_for_its_source_until_called_off_or_its_silence_is_too_long() {
        let p = Progress::paced(0);
        assert_eq!(p.source_answer(async { 7 }).await.unwrap(), 7);
        let started = tokio::time::Instant::now();
        let e = p
            .source_answer(std::future::pending::<()>())
            .await
            .unwrap_err();
        assert!(e.to_string().contains("unanswered for 60s"), "{e}");
        assert_eq!(started.elapsed(), SOURCE_SILENCE);
        let p = Arc::new(Progress::paced(0));
        let waiting = {
            let p = p.clone();
            tokio::spawn(async move { p.source_answer(std::future::pending::<()>()).await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(CallOff(p.clone()));
        let e = waiting.await.unwrap().unwrap_err();
        assert!(e.to_string().contains("called off"), "{e}");
        assert_eq!(started.elapsed(), SOURCE_SILENCE + Duration::from_secs(1));
        // Every later wait of the fill is called off at once.
        let e = p.source_answer(async { 7 }).await.unwrap_err();
        assert!(e.to_string().contains("called off"), "{e}");
    }

    /// A pace lets bytes through at its rate, counted from its start
    /// however they are cut; with no limit it waits for nothing (on
    /// tokio's paused clock).
    #[tokio::test(start_paused = true)]
    async fn a_pace_lets_bytes_through_at_its_rate_from_its_start() {
        let started = tokio::time::Instant::now();
        let pace = Pace::new(1 << 20);
        assert!(!pace.ready(256 << 10));
        pace.take(256 << 10).await;
        assert_eq!(started.elapsed(), Duration::from_millis(250));
        tokio::time::advance(Duration::from_millis(250)).await;
        assert!(pace.ready(256 << 10) && !pace.ready(257 << 10));
        pace.take(256 << 10).await;
        assert_eq!(started.elapsed(), Duration::from_millis(500));
        for _ in 0..10 {
            pace.take(256 << 10).await;
        }
        assert_eq!(started.elapsed(), Duration::from_secs(3));
        let free = Pace::default();
        assert!(free.ready(1 << 30));
        free.take(1 << 30).await;
        assert_eq!(started.elapsed(), Duration::from_secs(3));
    }
}
