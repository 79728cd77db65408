//! The local replica, lent to the engine by its server (`Op::Lend`): the
//! engine reads and writes its files itself, with the replica format's own
//! code, instead of sending every request through a replica server on the
//! same node. That saves the TCP hop, two copies of every write and a
//! thread hand-off on each side.
//!
//! The loan is held by the engine's connection to that server; while it
//! lasts the server refuses every other read and mutation of the replica.
//! If the connection drops (the node plugin restarts), the engine keeps
//! going and asks again until the server answers; if the server refuses
//! (the disk was lost), the replica fails like any other.
//!
//! A disk that hangs holds the write under way for as long as it hangs,
//! and the engine's thread with it; nothing else may wait behind it for
//! ever. Every call takes the gate before the replica (shared by reads,
//! alone by the rest), and the volume's I/O waits for it in turns,
//! stopping once the replica is given up (`give_up`, by the engine's
//! watch, `stall::watch_lent`): from then on every call fails at once,
//! and the write that hung is answered with an error in its stead. The
//! replica's files stay the engine's, and the loan held, until that
//! write returns (the thread holds the replica): its server cannot open
//! them meanwhile, so the late write lands in no rebuild. A merge takes
//! the replica step by step without the gate; a call waiting for a step
//! the disk holds counts as held by the disk, and the merge stops at its
//! next step once the replica is given up.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::replica::{LayerInfo, Replica, ReplicaError};
use crate::wire::client::ClientError;
use crate::wire::client::ReplicaClient;
use crate::wire::protocol::status;

/// How long one wait for the gate lasts before the waiter looks whether
/// the replica was given up.
const GATE_TURN: Duration = Duration::from_millis(100);

/// A write's answer, given once: by the write, or by the give-up when the
/// write hangs.
pub type Answer = Box<dyn FnOnce(Result<(), ClientError>) + Send>;

pub struct Lent {
    name: String,
    addr: String,
    /// How the lease connected (a new lease connects the same way).
    tls: crate::wire::tls::WireTls,
    dir: PathBuf,
    replica: RwLock<Replica>,
    /// Whether the replica keeps block checksums (its format's, fixed).
    keeps_sums: bool,
    /// The connection that holds the loan.
    lease: Mutex<Arc<ReplicaClient>>,
    /// The task that keeps the loan; stopped with the replica.
    keeper: Mutex<Option<tokio::task::AbortHandle>>,
    /// Taken before `replica` (see the module's head).
    gate: parking_lot::RwLock<()>,
    /// Why the engine gave the replica up; every call fails from then on.
    given_up: OnceLock<String>,
    /// Told when it is given up (a flush waiting on the disk ends).
    gone: tokio::sync::Notify,
    /// When the write that holds the replica began (ns after `born`, 0:
    /// none).
    writing: AtomicU64,
    /// The reads and flushes under way, and when the last of them began
    /// or ended (ns after `born`).
    readers: AtomicUsize,
    reading: AtomicU64,
    born: Instant,
    /// The answer of the volume's write under way (`write_answered`).
    answer: Mutex<Option<Answer>>,
}

impl Drop for Lent {
    fn drop(&mut self) {
        // The keeper holds the lease's connection while it waits: stopping
        // it closes the connection, which ends the loan.
        if let Ok(mut k) = self.keeper.lock()
            && let Some(k) = k.take()
        {
            k.abort();
        }
    }
}

impl Lent {
    /// Borrows the replica opened on `lease` and opens its files in `dir`.
    /// They must hold a replica of `size` bytes at `revision`, the one its
    /// server's copy held as the engine asked for the loan.
    pub async fn borrow(
        lease: Arc<ReplicaClient>,
        name: &str,
        dir: &Path,
        size: u64,
        revision: u64,
        writeback_every: u64,
    ) -> Result<Arc<Lent>, ClientError> {
        lease.lend().await?;
        let failed = |message: String| {
            ClientError::failed(&dir.display().to_string(), status::INVALID, message)
        };
        let at = dir.to_path_buf();
        let opened = tokio::task::spawn_blocking(move || Replica::open(&at))
            .await
            .map_err(|e| failed(e.to_string()))
            .and_then(|r| r.map_err(|e| failed(e.to_string())));
        let checked = opened.and_then(|r| {
            if r.size() != size || r.revision() != revision {
                Err(failed(format!(
                    "its files hold size {} at revision {}, not its server's {size} at {revision}",
                    r.size(),
                    r.revision()
                )))
            } else {
                Ok(r)
            }
        });
        let replica = match checked {
            Ok(mut r) => {
                r.set_writeback_every(writeback_every);
                r
            }
            Err(e) => {
                let _ = lease.give_back().await;
                return Err(e);
            }
        };
        tracing::info!(replica = name, dir = %dir.display(), "local replica lent to the engine");
        Ok(Arc::new(Lent {
            name: name.to_string(),
            addr: lease.addr().to_string(),
            tls: lease.tls().clone(),
            dir: dir.to_path_buf(),
            keeps_sums: replica.keeps_sums(),
            replica: RwLock::new(replica),
            lease: Mutex::new(lease),
            keeper: Mutex::new(None),
            gate: parking_lot::RwLock::new(()),
            given_up: OnceLock::new(),
            gone: tokio::sync::Notify::new(),
            writing: AtomicU64::new(0),
            readers: AtomicUsize::new(0),
            reading: AtomicU64::new(0),
            born: Instant::now(),
            answer: Mutex::new(None),
        }))
    }

    /// The error of every call once the replica is given up.
    fn gone_error(&self, why: &str) -> ClientError {
        ClientError::Closed {
            addr: self.dir.display().to_string(),
            reason: format!("the local replica was given up: {why}"),
        }
    }

    fn not_given_up(&self) -> Result<(), ClientError> {
        match self.given_up.get() {
            Some(why) => Err(self.gone_error(why)),
            None => Ok(()),
        }
    }

    /// The gate alone, waited for in turns until the replica is given up.
    fn alone(&self) -> Result<parking_lot::RwLockWriteGuard<'_, ()>, ClientError> {
        loop {
            self.not_given_up()?;
            if let Some(g) = self.gate.try_write_for(GATE_TURN) {
                return Ok(g);
            }
        }
    }

    /// The gate shared, waited for as `alone`.
    fn shared(&self) -> Result<parking_lot::RwLockReadGuard<'_, ()>, ClientError> {
        loop {
            self.not_given_up()?;
            if let Some(g) = self.gate.try_read_for(GATE_TURN) {
                return Ok(g);
            }
        }
    }

    /// Now, in ns after `born` (never 0).
    fn now(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_nanos())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1)
    }

    /// Runs `f` on the replica, alone (`gate` held), as a write of it: its
    /// time counts as the replica's stall while it lasts (`stalled_for`),
    /// the wait for the replica's lock included: a merge holds it step by
    /// step without the gate, and a step the disk holds holds this write.
    fn writing_in<T>(
        &self,
        _gate: &parking_lot::RwLockWriteGuard<'_, ()>,
        f: impl FnOnce(&mut Replica) -> Result<T, ReplicaError>,
    ) -> Result<T, ClientError> {
        self.writing.store(self.now(), Ordering::Release);
        let done = match self.replica.write() {
            // Given up while it waited, it writes nothing.
            Ok(mut r) => self
                .not_given_up()
                .and_then(|()| f(&mut r).map_err(|e| self.error(e))),
            Err(_) => Err(self.poisoned()),
        };
        self.writing.store(0, Ordering::Release);
        done
    }

    /// Runs `f` on the replica, shared, as a read or a flush: its time
    /// counts as the replica's stall while no other ends
    /// (`stalled_for`), the wait for the replica's lock included (see
    /// `writing_in`).
    fn reading<T>(
        &self,
        f: impl FnOnce(&Replica) -> Result<T, ReplicaError>,
    ) -> Result<T, ClientError> {
        let _gate = self.shared()?;
        if self.readers.fetch_add(1, Ordering::AcqRel) == 0 {
            self.reading.store(self.now(), Ordering::Release);
        }
        let done = match self.replica.read() {
            Ok(r) => self.not_given_up().and_then(|()| {
                f(&r).map_err(|e| {
                    r.note_corruption(&e);
                    self.error(e)
                })
            }),
            Err(_) => Err(self.poisoned()),
        };
        // Another under way counts from this one's end.
        self.reading.store(self.now(), Ordering::Release);
        self.readers.fetch_sub(1, Ordering::AcqRel);
        done
    }

    /// How long, at `now`, the replica has held a write, or its reads and
    /// flushes, without one ending (None when none is under way): a disk
    /// that hangs leaves this growing.
    pub fn stalled_for(&self, now: Instant) -> Option<Duration> {
        let reading = (self.readers.load(Ordering::Acquire) > 0)
            .then(|| self.reading.load(Ordering::Acquire));
        let since = [Some(self.writing.load(Ordering::Acquire)), reading]
            .into_iter()
            .flatten()
            .filter(|t| *t != 0)
            .min()?;
        let at = self.born + Duration::from_nanos(since - 1);
        Some(now.saturating_duration_since(at))
    }

    /// Gives the replica up, as its disk hangs: every call fails from now
    /// on, and every wait for the gate ends. Returns the answer of the
    /// volume's write under way, for the caller to give (an error), or
    /// None when there is none or it was given up already.
    pub fn give_up(&self, why: String) -> Option<Answer> {
        self.given_up.set(why).ok()?;
        self.gone.notify_waiters();
        self.answer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    fn error(&self, e: ReplicaError) -> ClientError {
        ClientError::of_replica(&self.dir.display().to_string(), &e)
    }

    fn poisoned(&self) -> ClientError {
        self.error(ReplicaError::Invalid("replica lock poisoned".into()))
    }

    pub fn read(&self, offset: u64, len: u32) -> Result<Vec<u8>, ClientError> {
        let mut buf = vec![0u8; len as usize];
        self.reading(|r| r.read(offset, &mut buf))?;
        Ok(buf)
    }

    /// The replica's turn for one write, taken before the engine's order
    /// lock and used once that is let go (see `Turn`).
    /// Fails once the replica is given up.
    pub fn turn(&self) -> Result<Turn<'_>, ClientError> {
        Ok(Turn {
            lent: self,
            gate: self.alone()?,
        })
    }

    /// Whether the replica keeps block checksums.
    pub fn keeps_sums(&self) -> bool {
        self.keeps_sums
    }

    /// Makes every write so far durable, on a blocking thread; ends with
    /// an error once the replica is given up, the flush hung or not.
    pub async fn flush(self: &Arc<Self>) -> Result<(), ClientError> {
        let gone = self.gone.notified();
        tokio::pin!(gone);
        gone.as_mut().enable();
        self.not_given_up()?;
        let me = self.clone();
        let flushed = tokio::task::spawn_blocking(move || me.reading(Replica::flush));
        tokio::select! {
            r = flushed => r.map_err(|e| self.error(ReplicaError::Invalid(e.to_string())))?,
            () = gone => self.not_given_up(),
        }
    }

    /// Closes the replica clean (`Replica::close_clean`), on a blocking
    /// thread, as the engine stops: every write durable, the mark made,
    /// and every I/O after it failed. Only while the loan is held, as its
    /// server answers on the loan's connection: without it, someone else
    /// may have written the files since, and the instance is let go
    /// unmarked. Says whether it marked.
    pub async fn close_clean(self: &Arc<Self>, why: &'static str) -> Result<bool, ClientError> {
        let held = match self.lease() {
            Some(lease) => tokio::time::timeout(Duration::from_secs(2), lease.lend())
                .await
                .is_ok_and(|r| r.is_ok()),
            None => false,
        };
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            let _gate = me.alone()?;
            let mut r = me.replica.write().map_err(|_| me.poisoned())?;
            if !held {
                r.break_off(format!("closed: {why}"));
                return Ok(false);
            }
            r.close_clean(why).map_err(|e| me.error(e))
        })
        .await
        .map_err(|e| self.error(ReplicaError::Invalid(e.to_string())))?
    }

    /// Merges the layers no snapshot in `keep` needs (see
    /// `replica::merge_paced`), on a blocking thread, while the engine
    /// goes on serving between steps.
    pub async fn merge(
        self: &Arc<Self>,
        keep: Vec<String>,
        rate: u64,
    ) -> Result<crate::replica::MergeReport, ClientError> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            // Given up, it stops at its next step: the replica is no longer
            // the volume's, and whoever opens it next finishes the merge.
            let given_up = || me.given_up.get().is_some();
            crate::replica::merge_paced(&me.replica, &keep, rate, &given_up)
                .map_err(|e| me.error(e))
        })
        .await
        .map_err(|e| self.error(ReplicaError::Invalid(e.to_string())))?
    }

    /// Grows the replica (see `Replica::grow`), on a blocking thread.
    pub async fn grow(self: &Arc<Self>, size: u64) -> Result<(), ClientError> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            let _gate = me.alone()?;
            let mut r = me.replica.write().map_err(|_| me.poisoned())?;
            r.grow(size).map_err(|e| me.error(e))
        })
        .await
        .map_err(|e| self.error(ReplicaError::Invalid(e.to_string())))?
    }

    /// Syncs the head's checksums at every flush, or not (see
    /// `Replica::set_sums_every_flush`), on a blocking thread.
    pub async fn sums_every_flush(self: &Arc<Self>, on: bool) -> Result<(), ClientError> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            let _gate = me.alone()?;
            let mut r = me.replica.write().map_err(|_| me.poisoned())?;
            r.set_sums_every_flush(on)
                .map(drop)
                .map_err(|e| me.error(e))
        })
        .await
        .map_err(|e| self.error(ReplicaError::Invalid(e.to_string())))?
    }

    /// Reads the head ahead of its freeze (see `replica::warm`), on a
    /// blocking thread: the gate shared and the replica's lock taken for
    /// reading only for a moment at a time, so that the volume's I/O
    /// passes. Not the volume's I/O: its time counts as no stall.
    pub async fn warm(self: &Arc<Self>) -> Result<(), ClientError> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || crate::replica::warm(me.as_ref()))
            .await
            .map_err(|e| self.error(ReplicaError::Invalid(e.to_string())))?
    }

    /// Freezes the head (see `Replica::snapshot_losing`), on a blocking
    /// thread.
    pub async fn snapshot(
        self: &Arc<Self>,
        label: Option<&str>,
        lose: &std::collections::BTreeSet<u64>,
    ) -> Result<String, ClientError> {
        let me = self.clone();
        let label = label.map(str::to_string);
        let lose = lose.clone();
        tokio::task::spawn_blocking(move || {
            let _gate = me.alone()?;
            let mut r = me.replica.write().map_err(|_| me.poisoned())?;
            r.snapshot_losing(label.as_deref(), &lose)
                .map_err(|e| me.error(e))
        })
        .await
        .map_err(|e| self.error(ReplicaError::Invalid(e.to_string())))?
    }

    /// Gives up block `block` of frozen layer `layer` as lost (see
    /// `Replica::lose_frozen_block`), on a blocking thread; the blocks
    /// given up.
    pub async fn lose(self: &Arc<Self>, layer: &str, block: u64) -> Result<Vec<u64>, ClientError> {
        let me = self.clone();
        let layer = layer.to_string();
        tokio::task::spawn_blocking(move || {
            let _gate = me.alone()?;
            let mut r = me.replica.write().map_err(|_| me.poisoned())?;
            r.lose_frozen_block(&layer, block * crate::replica::BLOCK)
                .map_err(|e| me.error(e))
        })
        .await
        .map_err(|e| self.error(ReplicaError::Invalid(e.to_string())))?
    }

    /// The writes after revision `since` in its write log (see
    /// `Replica::writes_since`).
    pub fn writes_since(
        &self,
        since: u64,
    ) -> Result<Option<Vec<crate::replica::LogEntry>>, ClientError> {
        self.reading(|r| Ok(r.writes_since(since)))
    }

    pub fn layers(&self) -> Result<Vec<LayerInfo>, ClientError> {
        self.reading(|r| Ok(r.layers()))
    }

    fn lease(&self) -> Option<Arc<ReplicaClient>> {
        self.lease.lock().ok().map(|l| l.clone())
    }

    /// Ends the loan (before the replica's data is deleted).
    pub async fn give_back(&self) {
        if let Some(k) = self.keeper.lock().ok().and_then(|mut k| k.take()) {
            k.abort();
        }
        if let Some(lease) = self.lease()
            && let Err(e) = lease.give_back().await
        {
            tracing::debug!(replica = %self.name, error = %e, "giving the replica back failed; its connection's end ends the loan");
        }
    }

    /// Keeps the loan while the replica lives: when its connection drops,
    /// asks again (every second, until the server answers); calls
    /// `refused` with the server's answer when it refuses.
    pub fn keep(self: &Arc<Self>, refused: impl FnOnce(ClientError) + Send + 'static) {
        let me: Weak<Lent> = Arc::downgrade(self);
        let task = tokio::spawn(async move {
            let why = loop {
                let Some(lease) = me.upgrade().and_then(|l| l.lease()) else {
                    return;
                };
                lease.closed().await;
                drop(lease);
                let Some((name, addr, tls)) = me
                    .upgrade()
                    .map(|l| (l.name.clone(), l.addr.clone(), l.tls.clone()))
                else {
                    return;
                };
                tracing::warn!(replica = %name, "the loan's connection dropped; asking again");
                let answer = loop {
                    let again = match ReplicaClient::dial(&tls, &addr, &name).await {
                        Ok(c) => c.lend().await.map(|()| c),
                        Err(e) => Err(e),
                    };
                    match again {
                        Ok(c) => break Ok(c),
                        Err(e @ ClientError::Failed { .. }) => break Err(e),
                        Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
                    }
                };
                match answer {
                    Ok(c) => {
                        let Some(l) = me.upgrade() else {
                            return;
                        };
                        if let Ok(mut lease) = l.lease.lock() {
                            *lease = Arc::new(c);
                        }
                        tracing::info!(replica = %name, "the replica is lent again");
                    }
                    Err(e) => break e,
                }
            };
            refused(why);
        });
        if let Ok(mut k) = self.keeper.lock() {
            *k = Some(task.abort_handle());
        }
    }
}

/// The lent replica's turn for one write. A writer takes it before the
/// engine's order lock and holds it until its write is made, once that
/// lock is let go: writes reach the replica in the engine's order, the
/// remote replicas' sends never wait on the local disk, and while the
/// disk holds one write the next waits for its turn without the order
/// lock, in turns that end when the replica is given up; none waits for
/// ever. (Taken inside the order lock instead, each write paid two
/// hand-offs between writers, the lock's and the turn's: the block
/// device's 64k writes fell from 0.89x - 1.03x of a loop device to
/// 0.73x - 0.81x.)
pub struct Turn<'a> {
    lent: &'a Lent,
    gate: parking_lot::RwLockWriteGuard<'a, ()>,
}

impl Turn<'_> {
    /// Writes into the head (into the page cache: short enough to run
    /// inline), with the checksums of its whole blocks when the engine
    /// took them once for every replica and this one keeps them (see
    /// `Replica::write_summed`); `revision` 0 keeps the replica's own
    /// count going.
    pub fn write(
        self,
        offset: u64,
        data: &[u8],
        sums: Option<&Bytes>,
        revision: u64,
    ) -> Result<(), ClientError> {
        self.write_held(offset, data, sums, revision)
    }

    /// `write`, the turn kept.
    fn write_held(
        &self,
        offset: u64,
        data: &[u8],
        sums: Option<&Bytes>,
        revision: u64,
    ) -> Result<(), ClientError> {
        let revision = (revision != 0).then_some(revision);
        match (sums, self.lent.keeps_sums) {
            (Some(sums), true) => self
                .lent
                .writing_in(&self.gate, |r| r.write_summed(offset, data, sums, revision)),
            _ => self
                .lent
                .writing_in(&self.gate, |r| r.write(offset, data, revision)),
        }
    }

    /// `write`, for the volume's writes, whose `answer` the give-up gives
    /// instead while the write hangs: the write's outcome with its answer,
    /// for the caller to give, or None when the give-up gave it.
    pub fn write_answered(
        self,
        offset: u64,
        data: &[u8],
        sums: Option<&Bytes>,
        revision: u64,
        answer: Answer,
    ) -> Option<(Answer, Result<(), ClientError>)> {
        let lent = self.lent;
        // The slot is the turn's, one answer at a time: it is filled and
        // emptied while the turn is held, and the next turn's answer never
        // takes its place.
        let slot = || lent.answer.lock().unwrap_or_else(PoisonError::into_inner);
        *slot() = Some(answer);
        // Given up before the answer was in its slot, the give-up did not
        // see it: it is taken back and answered here.
        if let Err(e) = lent.not_given_up() {
            return slot().take().map(|a| (a, Err(e)));
        }
        let done = self.write_held(offset, data, sums, revision);
        let answer = slot().take();
        drop(self);
        answer.map(|a| (a, done))
    }

    /// Trims, or with `zeroes` writes zeros (see `Replica::discard`).
    pub fn discard(
        self,
        offset: u64,
        len: u64,
        revision: u64,
        zeroes: bool,
    ) -> Result<(), ClientError> {
        let revision = (revision != 0).then_some(revision);
        self.lent
            .writing_in(&self.gate, |r| r.discard(offset, len, revision, zeroes))
    }
}

/// The read ahead of a freeze takes the gate shared, then the replica's
/// lock for reading, a moment at a time (`replica::warm`).
impl crate::replica::Holder for Lent {
    type Error = ClientError;
    fn reading<T>(
        &self,
        f: impl FnOnce(&Replica) -> Result<T, ReplicaError>,
    ) -> Result<T, ClientError> {
        let _gate = self.shared()?;
        let r = self.replica.read().map_err(|_| self.poisoned())?;
        f(&r).map_err(|e| Lent::error(self, e))
    }
    fn error(&self, e: ReplicaError) -> ClientError {
        Lent::error(self, e)
    }
}
