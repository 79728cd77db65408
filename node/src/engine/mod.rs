//! The engine of one attached volume: it fans every write out to all `rw`
//! replicas and acknowledges it once each has it, reads from one replica
//! (the local one first, `read`), and drops a replica that fails an I/O to
//! `err`, so that the volume degrades instead of stopping.
//!
//! Writes go onto every replica's connection in one order (under `order`),
//! and replica servers apply a connection's writes in arrival order, so all
//! replicas apply overlapping writes alike. A snapshot pauses I/O (`io`),
//! snapshots every replica at the same point, and resumes.
//!
//! It is started with the replicas the store records as holding the
//! latest acknowledged data only (each met by `open`); of those, after an
//! unclean stop, the one with the highest revision counter is the one the
//! others are made equal to.
//! Every change of its `rw` set is recorded in the store before a write
//! that depends on it is acknowledged (`freshness`). A replica joins a
//! running volume through a rebuild (`rebuild`); the node agent asks for it
//! on the control socket (`control`). A block that fails its checksum in a
//! replica is written back to it from the others (`repair`), or from a
//! replica joining again when the last one holds it bad (`spare`). After a
//! power cut, a replica's suspect blocks take the sound copy another holds
//! (`settle`; from a stale replica's copy that matches the checksum it
//! kept, when the record holds one replica, which guards its checksums
//! while it is the only one: `guard`), and replicas left apart by an
//! unclean stop are made equal:
//! from their write logs (`catch_up`), then over the regions each wrote
//! lately (`equalize`); one that neither can make equal is rebuilt. The
//! replica on the engine's own node is lent to it by its server, and its
//! I/O goes straight to its files (`lent`). A remote replica that leaves
//! the volume's I/O unanswered past the replica timeout while another
//! answers is given up (`stall`).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ballast::model::ReplicaMode;
use bytes::Bytes;
use tokio::sync::{Mutex, RwLock};

use crate::replica::BLOCK;
use crate::wire::client::{ClientError, ReplicaClient, Waiter};
use crate::wire::protocol::{FLAG_FUA, FLAG_ZEROES, MAX_DATA, Op};
use crate::wire::tls::WireTls;

mod catch_up;
mod equalize;
mod fan_in;
use fan_in::FanIn;
pub mod freshness;
mod guard;
mod lent;
mod open;
mod read;
mod rebuild;
mod repair;
mod settle;
mod spare;
mod stall;

pub use freshness::{RecordError, Recorder, ReplicaSet};
pub use stall::DEFAULT_TIMEOUT as DEFAULT_REPLICA_TIMEOUT;

/// The exit status of an engine process that could open none of its
/// replicas (the node agent answers FAILED_PRECONDITION for it).
pub const EXIT_NO_REPLICA: u8 = 3;

/// Bad blocks a freeze repairs in one replica before it gives up on it:
/// more, and the disk is failing; the replica is rebuilt instead.
const MAX_REPAIRS_PER_FREEZE: u32 = 64;
/// Blocks one freeze gives up as lost, at most: each costs a pass over the
/// head, and a head with more is better left to its disk's owner.
const MAX_LOST_PER_FREEZE: usize = 64;

/// Errors of the engine, as NBD reports them.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("no replica is usable: {0}")]
    NoReplica(String),
    #[error("range {offset}+{len} is outside the volume of {size} bytes")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("engine start: {0}")]
    Start(String),
    /// The request itself is wrong (a size below the volume's).
    #[error("{0}")]
    Invalid(String),
    #[error("replica {replica}: {message}")]
    Replica { replica: String, message: String },
    #[error("a rebuild of {0} is already running; one at a time")]
    Busy(String),
    /// The replica to add is still being filled by a copy called off (it
    /// writes its last pieces): tried again once that ends.
    #[error("replica {replica}: {message}")]
    Filling { replica: String, message: String },
    /// A replica could not be reached: it may come back.
    #[error("replica {replica}: {message}")]
    Unreachable { replica: String, message: String },
    /// Valid, but refused as things stand.
    #[error("replica {replica}: {message}")]
    Refused { replica: String, message: String },
    /// The write reached the replicas but cannot be acknowledged: the
    /// replica set it depends on is not recorded (or this engine is fenced).
    #[error("{0}")]
    NotRecorded(String),
    /// No rw replica had room for the write; they all keep what they held.
    #[error("no space left for the write: {0}")]
    NoSpace(String),
    /// A block failed its checksum in every replica that could serve it;
    /// the rest of the volume still serves.
    #[error("replica {replica}: {message} (no other replica holds the block)")]
    Corrupt { replica: String, message: String },
    /// The local replica's own data failed its checksums as the engine
    /// merged it: the merge ended with the block marked, and the replica
    /// is to be failed as after a scrub.
    #[error("replica {replica}: {message}")]
    FoundCorrupt { replica: String, message: String },
}

impl EngineError {
    /// What went wrong with replica `replica`, from its connection's error.
    pub fn of_replica(replica: &str, e: ClientError) -> Self {
        let (replica, message) = (replica.to_string(), e.to_string());
        match e {
            ClientError::Closed { .. } => EngineError::Unreachable { replica, message },
            e if e.is_no_space() => EngineError::NoSpace(format!("replica {replica}: {message}")),
            ClientError::Failed { .. } => EngineError::Replica { replica, message },
        }
    }
}

/// Where a replica is: its name on its node, and the node's replica address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaAddr {
    pub name: String,
    pub addr: String,
}

impl std::str::FromStr for ReplicaAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once('@') {
            Some((name, addr)) if !name.is_empty() && !addr.is_empty() => Ok(ReplicaAddr {
                name: name.to_string(),
                addr: addr.to_string(),
            }),
            _ => Err(format!("{s:?}: expected NAME@HOST:PORT")),
        }
    }
}

/// How the engine reaches a replica.
#[derive(Clone)]
enum Link {
    /// Through its server, over TCP.
    Remote(Arc<ReplicaClient>),
    /// Lent by its server: straight to its files.
    Lent(Arc<lent::Lent>),
}

impl Link {
    /// Reads the head ahead of its freeze (see `replica::warm`).
    async fn warm(&self) -> Result<(), ClientError> {
        match self {
            Link::Remote(c) => c.warm().await,
            Link::Lent(l) => l.warm().await,
        }
    }

    /// Freezes the head, giving up as lost the blocks in `lose` that fail
    /// their checksums (see `Replica::snapshot_losing`).
    async fn snapshot(
        &self,
        label: Option<&str>,
        lose: &BTreeSet<u64>,
    ) -> Result<String, ClientError> {
        match self {
            Link::Remote(c) => c.snapshot_losing(label, lose).await,
            Link::Lent(l) => l.snapshot(label, lose).await,
        }
    }

    /// Gives up block `block` of frozen layer `layer` as lost (see
    /// `Replica::lose_frozen_block`); the blocks given up.
    async fn lose(&self, layer: &str, block: u64) -> Result<Vec<u64>, ClientError> {
        match self {
            Link::Remote(c) => c.lose(layer, block).await,
            Link::Lent(l) => l.lose(layer, block).await,
        }
    }

    async fn grow(&self, size: u64) -> Result<(), ClientError> {
        match self {
            Link::Remote(c) => c.grow(size).await,
            Link::Lent(l) => l.grow(size).await,
        }
    }

    /// Syncs the replica's checksums at every flush, or not (`guard`).
    async fn sums_every_flush(&self, on: bool) -> Result<(), ClientError> {
        match self {
            Link::Remote(c) => c.sums_every_flush(on).await,
            Link::Lent(l) => l.sums_every_flush(on).await,
        }
    }

    async fn layers(&self) -> Result<Vec<crate::replica::LayerInfo>, ClientError> {
        match self {
            Link::Remote(c) => c.layers().await,
            Link::Lent(l) => l.layers(),
        }
    }

    async fn writes_since(
        &self,
        since: u64,
    ) -> Result<Option<Vec<crate::replica::LogEntry>>, ClientError> {
        match self {
            Link::Remote(c) => c.writes_since(since).await,
            Link::Lent(l) => l.writes_since(since),
        }
    }
}

struct Member {
    at: ReplicaAddr,
    link: Option<Link>,
    mode: ReplicaMode,
    error: Option<String>,
    rebuild: Option<RebuildStatus>,
    /// A `wo` replica whose rebuild is done: it turns `rw` once the store's
    /// record includes it.
    caught_up: bool,
}

/// The last rebuild of a replica: what it kept, what it copied and how.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RebuildStatus {
    /// Where the layers came from.
    pub source: String,
    /// Bytes the replica already held and kept, not copied: its frozen
    /// layers that matched the source's, and the blocks of its old layers
    /// found equal to the source's (a seeded fill).
    pub kept_bytes: u64,
    /// Bytes copied; 0 until the rebuild is done.
    pub copied_bytes: u64,
    /// `reflink`, `io-uring`, `copy-file-range`, `read-write` or `remote`;
    /// empty until done.
    pub path: String,
    pub done: bool,
}

/// A replica as the engine reports it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MemberStatus {
    pub name: String,
    pub addr: String,
    pub mode: ReplicaMode,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rebuild: Option<RebuildStatus>,
}

pub struct Engine {
    pub volume: String,
    /// What it served (`io`).
    counters: Arc<IoCounters>,
    /// Bytes; grows while the engine runs (`grow`).
    size: AtomicU64,
    members: Mutex<Vec<Member>>,
    /// Prefer this replica for reads.
    local: Option<String>,
    revision: AtomicU64,
    /// Held while putting a write on the wires, so every replica sees the
    /// same order. Never held across an await.
    order: std::sync::Mutex<()>,
    /// I/O holds it shared; a snapshot holds it exclusively.
    io: Arc<RwLock<()>>,
    /// Set while a replica is being rebuilt (one at a time).
    rebuilding: std::sync::atomic::AtomicBool,
    /// Woken whenever a replica's mode changes, so that the status is
    /// reported at once.
    pub changed: tokio::sync::Notify,
    /// Reads served straight from the local replica's files.
    direct_reads: AtomicU64,
    /// The replicas writes go to, while the members stay as they are.
    writers: std::sync::Mutex<Option<Arc<Writers>>>,
    /// The store's record of the replicas holding the latest data.
    freshness: freshness::Freshness,
    /// Wakes the task that keeps the record (a permit is kept if it is busy).
    set_changed: Arc<tokio::sync::Notify>,
    /// How it connects to replicas.
    tls: WireTls,
    /// How long a remote replica may leave a request unanswered while
    /// another answers (`stall`); unset, none is given up for it.
    replica_timeout: std::sync::OnceLock<std::time::Duration>,
    /// Counts the lent replicas given up while their disk held a call
    /// (`stall::watch_lent`): a frontend whose task the disk holds hands
    /// its work to another (`lent_given_up`).
    lent_given_up: tokio::sync::watch::Sender<u64>,
    /// Wakes the task that tells the rw replicas whether to guard their
    /// checksums (`guard`).
    guard_wake: Arc<tokio::sync::Notify>,
    /// Whether the volume has replicas the record leaves out, which a
    /// starting engine was told of (`settle_from_stale`).
    stale_known: std::sync::atomic::AtomicBool,
}

impl Drop for Engine {
    fn drop(&mut self) {
        // The record keeper and the guard hold only weak references: let
        // them see the end.
        self.set_changed.notify_one();
        self.guard_wake.notify_one();
    }
}

/// Name, link, and whether its answer counts (rw, not wo).
type Writers = Vec<(String, Link, bool)>;

/// The block checksums of a write of `data` at `offset`, taken once for
/// every replica in `clients` that keeps them (each would take the same
/// from the same bytes); None for a write that is not whole blocks, or
/// when no replica keeps them.
fn sums_for(clients: &Writers, offset: u64, data: &[u8]) -> Option<Bytes> {
    let wanted = clients.iter().any(|(_, link, _)| match link {
        Link::Remote(c) => c.takes_sums(),
        Link::Lent(l) => l.keeps_sums(),
    });
    (!Engine::unaligned(offset, data.len() as u64) && wanted)
        .then(|| Bytes::from(crate::replica::block_sums(data)))
}

/// What is called with a write's outcome.
pub type WriteDone = Box<dyn FnOnce(Result<(), EngineError>) + Send>;

/// The I/O an engine served, counted since it started: operations, bytes
/// and the time they took (nanoseconds, summed), for reads and writes;
/// and the blocks that failed their checksums, were repaired, or could
/// not be read at all.
#[derive(Debug, Default)]
pub struct IoCounters {
    read_ops: AtomicU64,
    read_bytes: AtomicU64,
    read_ns: AtomicU64,
    write_ops: AtomicU64,
    write_bytes: AtomicU64,
    write_ns: AtomicU64,
    checksum_failures: AtomicU64,
    repairs: AtomicU64,
    unreadable_reads: AtomicU64,
    lost_blocks: AtomicU64,
}

/// What `IoCounters` held at one moment. (An engine of an older build
/// reports no checksum counters: they read 0.)
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct IoStats {
    pub read_ops: u64,
    pub read_bytes: u64,
    pub read_ns: u64,
    pub write_ops: u64,
    pub write_bytes: u64,
    pub write_ns: u64,
    /// Blocks found failing their checksum in a replica (by a read or a
    /// freeze), once per replica and read.
    pub checksum_failures: u64,
    /// Of those, the ones written back to their replica and read back
    /// sound.
    pub repairs: u64,
    /// Reads that failed because no replica held their blocks sound.
    pub unreadable_reads: u64,
    /// Blocks a freeze gave up as lost: no replica held them sound.
    pub lost_blocks: u64,
}

impl IoCounters {
    fn read(&self, bytes: u64, took: std::time::Duration) {
        self.read_ops.fetch_add(1, Ordering::Relaxed);
        self.read_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.read_ns
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    }

    fn write(&self, bytes: u64, took: std::time::Duration) {
        self.write_ops.fetch_add(1, Ordering::Relaxed);
        self.write_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.write_ns
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    }

    fn stats(&self) -> IoStats {
        IoStats {
            read_ops: self.read_ops.load(Ordering::Relaxed),
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
            read_ns: self.read_ns.load(Ordering::Relaxed),
            write_ops: self.write_ops.load(Ordering::Relaxed),
            write_bytes: self.write_bytes.load(Ordering::Relaxed),
            write_ns: self.write_ns.load(Ordering::Relaxed),
            checksum_failures: self.checksum_failures.load(Ordering::Relaxed),
            repairs: self.repairs.load(Ordering::Relaxed),
            unreadable_reads: self.unreadable_reads.load(Ordering::Relaxed),
            lost_blocks: self.lost_blocks.load(Ordering::Relaxed),
        }
    }

    fn count(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

impl Engine {
    /// Connects to every replica, checks their sizes, and makes `rw` the
    /// ones with the highest revision. `recorded` is the replica set as the
    /// store has it; with a `recorder`, the engine records the set it runs
    /// with (and every change of it) before it acknowledges a write that a
    /// recorded replica lacks. Without one (an engine a test drives in
    /// process), nothing is recorded. It connects to replicas with `tls`.
    pub async fn start(
        volume: &str,
        size: u64,
        replicas: &[ReplicaAddr],
        local: Option<String>,
        recorded: ReplicaSet,
        recorder: Option<Arc<dyn Recorder>>,
        tls: WireTls,
    ) -> Result<Arc<Engine>, EngineError> {
        if replicas.is_empty() {
            return Err(EngineError::Start("at least one replica is needed".into()));
        }
        let mut members = Vec::new();
        let mut revisions = Vec::new();
        let mut suspects = Vec::new();
        let mut unreached = Vec::new();
        // All at once: each replica whose node hangs costs the start one
        // handshake's wait (`wire::HANDSHAKE_TIMEOUT`), not one each in
        // turn, which outlasted the node's wait for the engine to serve.
        let opened = futures_util::future::join_all(
            replicas.iter().map(|at| open::open_member(&tls, at, size)),
        )
        .await;
        for (at, (mut m, revision, suspect, reached)) in replicas.iter().zip(opened) {
            suspects.push(suspect);
            // Whatever it claims, a replica the record leaves out holds older
            // data than the volume's (generation 0: nothing recorded yet).
            if recorded.generation > 0 && !recorded.replicas.contains(&at.name) {
                m.mode = ReplicaMode::Err;
                m.link = None;
                m.error = Some(format!(
                    "not in the replica set recorded at generation {}",
                    recorded.generation
                ));
            } else if !reached {
                unreached.push(members.len());
            }
            members.push(m);
            revisions.push(revision);
        }
        // After a power cut, a replica's suspect blocks are settled only
        // from the others: those whose nodes are not back yet are waited
        // for a while (the machines of a cut come back together).
        let deadline = tokio::time::Instant::now() + settle::SUSPECTS_WAIT;
        while !unreached.is_empty()
            && suspects.iter().any(|s| !s.is_empty())
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            let mut still = Vec::new();
            let again = futures_util::future::join_all(
                unreached
                    .iter()
                    .map(|&i| open::open_member(&tls, &replicas[i], size)),
            )
            .await;
            for (i, (m, revision, suspect, reached)) in unreached.into_iter().zip(again) {
                if reached {
                    (members[i], revisions[i], suspects[i]) = (m, revision, suspect);
                } else {
                    still.push(i);
                }
            }
            unreached = still;
        }
        let best = members
            .iter()
            .zip(&revisions)
            .filter(|(m, _)| m.mode == ReplicaMode::Rw)
            .map(|(_, r)| *r)
            .max()
            .ok_or_else(|| {
                EngineError::NoReplica(
                    members
                        .iter()
                        .filter_map(|m| m.error.clone())
                        .collect::<Vec<_>>()
                        .join("; "),
                )
            })?;
        settle::settle_suspects(volume, &members, &suspects, &revisions).await;
        let behind = catch_up::catch_up_members(volume, &mut members, &revisions, best).await;
        let equal = equalize::equalize_recent(volume, &mut members, &revisions, best).await;
        catch_up::fail_behind(volume, &mut members, behind, &equal);
        tracing::info!(
            volume,
            size,
            revision = best,
            generation = recorded.generation,
            "engine started"
        );
        let keeps_record = recorder.is_some();
        let engine = Arc::new(Engine {
            volume: volume.to_string(),
            counters: Arc::default(),
            size: AtomicU64::new(size),
            members: Mutex::new(members),
            local,
            revision: AtomicU64::new(best),
            order: std::sync::Mutex::new(()),
            io: Arc::new(RwLock::new(())),
            rebuilding: std::sync::atomic::AtomicBool::new(false),
            changed: tokio::sync::Notify::new(),
            direct_reads: AtomicU64::new(0),
            writers: std::sync::Mutex::new(None),
            freshness: freshness::Freshness::new(recorded, recorder),
            set_changed: Arc::new(tokio::sync::Notify::new()),
            tls,
            replica_timeout: std::sync::OnceLock::new(),
            lent_given_up: tokio::sync::watch::Sender::new(0),
            guard_wake: Arc::new(tokio::sync::Notify::new()),
            stale_known: std::sync::atomic::AtomicBool::new(false),
        });
        tokio::spawn(guard::keep(
            Arc::downgrade(&engine),
            engine.guard_wake.clone(),
        ));
        if keeps_record {
            // The set it opened may already differ from the record.
            engine.set_changed.notify_one();
            tokio::spawn(Engine::keep_record(
                Arc::downgrade(&engine),
                engine.set_changed.clone(),
            ));
        }
        Ok(engine)
    }

    /// Once, before it serves: `stale` are the volume's other replicas,
    /// which the record leaves out (the controller names them when the
    /// record holds one replica; none otherwise). A suspect block of the
    /// one rw replica whose checksum on the disk it kept takes the copy of
    /// a stale replica that matches that checksum (`settle::from_stale`).
    /// Then the rw replicas are told whether to guard their checksums
    /// (`guard`; the one rw replica does while a stale one is known).
    /// Returns the blocks settled.
    pub async fn settle_from_stale(&self, stale: &[ReplicaAddr]) -> u64 {
        if !stale.is_empty() {
            self.stale_known.store(true, Ordering::Release);
        }
        self.guard_wake.notify_one();
        if stale.is_empty() {
            return 0;
        }
        let m = self.members.lock().await;
        let mut rw = m.iter().filter(|x| x.mode == ReplicaMode::Rw);
        let (Some(one), None) = (rw.next(), rw.next()) else {
            return 0;
        };
        let Some(Link::Remote(dst)) = &one.link else {
            return 0;
        };
        let kept = match dst.info().await {
            Ok(info) => settle::kept_sums(&info),
            Err(e) => {
                tracing::warn!(volume = %self.volume, replica = %one.at.name, error = %e, "cannot ask the replica for its suspect blocks");
                return 0;
            }
        };
        if kept.is_empty() {
            return 0;
        }
        let revision = self.revision.load(Ordering::Acquire);
        settle::from_stale(
            &self.volume,
            (&one.at.name, dst, revision),
            &kept,
            stale,
            &self.tls,
        )
        .await
    }

    /// Records every change of the rw set, one at a time, for as long as
    /// the engine lives; the only caller of the record. A rebuilt replica
    /// turns rw once the record includes it.
    async fn keep_record(engine: std::sync::Weak<Engine>, wake: Arc<tokio::sync::Notify>) {
        loop {
            wake.notified().await;
            let Some(e) = engine.upgrade() else {
                return;
            };
            let (wanted, reason) = e.wanted_set().await;
            if e.freshness.record(&wanted, &reason).await {
                e.promote_caught_up(&wanted).await;
            }
        }
    }

    /// Turns rw the caught-up replicas that the record now includes.
    async fn promote_caught_up(&self, recorded: &std::collections::BTreeSet<String>) {
        let mut m = self.members.lock().await;
        let mut changed = false;
        for x in m.iter_mut() {
            if x.mode == ReplicaMode::Wo && x.caught_up && recorded.contains(&x.at.name) {
                x.mode = ReplicaMode::Rw;
                x.caught_up = false;
                tracing::info!(volume = %self.volume, replica = %x.at.name, "rebuilt replica recorded; it is rw");
                changed = true;
            }
        }
        if changed {
            self.members_changed();
        }
    }

    /// The replicas that hold every acknowledged write now (rw, and rebuilt
    /// ones waiting for the record), and how they differ from the record.
    async fn wanted_set(&self) -> (std::collections::BTreeSet<String>, String) {
        let recorded = self.freshness.recorded().replicas;
        let m = self.members.lock().await;
        let wanted: std::collections::BTreeSet<String> = m
            .iter()
            .filter(|x| x.mode == ReplicaMode::Rw || (x.mode == ReplicaMode::Wo && x.caught_up))
            .map(|x| x.at.name.clone())
            .collect();
        let mut why = Vec::new();
        for gone in recorded.difference(&wanted) {
            let error = m
                .iter()
                .find(|x| &x.at.name == gone)
                .and_then(|x| x.error.clone())
                .unwrap_or_else(|| "taken out of the volume".into());
            why.push(format!("{gone} dropped: {error}"));
        }
        for new in wanted.difference(&recorded) {
            why.push(format!("{new} holds the latest data"));
        }
        (wanted, why.join("; "))
    }

    /// The replica set as recorded, and why the engine is fenced if it is.
    pub fn record(&self) -> (ReplicaSet, Option<String>) {
        (self.freshness.recorded(), self.freshness.fenced())
    }

    fn check(&self, offset: u64, len: u64) -> Result<(), EngineError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size() => Ok(()),
            _ => Err(EngineError::OutOfRange {
                offset,
                len,
                size: self.size(),
            }),
        }
    }

    /// Replicas to read from: the `rw` ones, the local one first.
    async fn rw_links(&self) -> Vec<(String, Link)> {
        let m = self.members.lock().await;
        let mut out: Vec<(String, Link)> = m
            .iter()
            .filter(|m| m.mode == ReplicaMode::Rw)
            .filter_map(|m| m.link.clone().map(|c| (m.at.name.clone(), c)))
            .collect();
        // The local replica first.
        if let Some(local) = &self.local {
            out.sort_by_key(|(n, _)| n != local);
        }
        out
    }

    /// Replicas to write to: `rw` and `wo` (being rebuilt), with whether
    /// each counts for the acknowledgement. Kept until the members change.
    async fn write_clients(&self) -> Arc<Writers> {
        if let Some(w) = self.writers.lock().ok().and_then(|w| w.clone()) {
            return w;
        }
        let m = self.members.lock().await;
        let w: Arc<Writers> = Arc::new(
            m.iter()
                .filter(|m| matches!(m.mode, ReplicaMode::Rw | ReplicaMode::Wo))
                .filter_map(|m| {
                    m.link
                        .clone()
                        .map(|c| (m.at.name.clone(), c, m.mode == ReplicaMode::Rw))
                })
                .collect(),
        );
        // Stored while the members are still locked: every change clears
        // the cache under the same lock, so no stale list can land after it.
        if let Ok(mut cache) = self.writers.lock() {
            *cache = Some(w.clone());
        }
        drop(m);
        w
    }

    /// After any change of a replica's mode or of the set (made with the
    /// members locked): the cached writers go, and the status is reported
    /// at once.
    fn members_changed(&self) {
        if let Ok(mut cache) = self.writers.lock() {
            *cache = None;
        }
        self.changed.notify_waiters();
        self.set_changed.notify_one();
        self.guard_wake.notify_one();
    }

    async fn fail(&self, name: &str, why: &ClientError) {
        let mut m = self.members.lock().await;
        if let Some(x) = m
            .iter_mut()
            .find(|x| x.at.name == name && x.mode != ReplicaMode::Err)
        {
            tracing::warn!(volume = %self.volume, replica = name, error = %why, "replica failed; dropped from the volume");
            x.mode = ReplicaMode::Err;
            x.error = Some(why.to_string());
            x.link = None;
            x.caught_up = false;
            self.members_changed();
        }
    }

    /// The I/O served since the engine started.
    pub fn io(&self) -> IoStats {
        self.counters.stats()
    }

    /// How many reads were served straight from the local replica's files.
    pub fn direct_reads(&self) -> u64 {
        self.direct_reads.load(Ordering::Relaxed)
    }

    /// Borrows the local replica from its server (see `lent`): from then on
    /// its I/O goes straight to its files in `dir`, whose head's writeback
    /// starts every `writeback_every` bytes written (0: left to the
    /// kernel). When the server does not lend it, it stays reached through
    /// the server.
    #[tracing::instrument(skip_all, fields(volume = %self.volume, dir = %dir.display()))]
    pub async fn lend_local(
        self: &Arc<Self>,
        dir: std::path::PathBuf,
        writeback_every: u64,
    ) -> Result<(), EngineError> {
        let Some(local) = self.local.clone() else {
            return Ok(());
        };
        let _pause = self.io.write().await;
        let mut m = self.members.lock().await;
        let Some(x) = m
            .iter_mut()
            .find(|x| x.at.name == local && x.mode == ReplicaMode::Rw)
        else {
            return Ok(());
        };
        let Some(Link::Remote(c)) = x.link.clone() else {
            return Ok(());
        };
        // Its files must hold what its server's copy holds, at no revision
        // past the volume's. Not always at the volume's: after a power
        // cut, a replica the start made equal to the others may keep a
        // lower counter (the cut took its last bumps, or it was written
        // fewer times with the same bytes); the next write raises it.
        let volume = self.revision.load(Ordering::SeqCst);
        let held = c
            .info()
            .await
            .map_err(|e| EngineError::of_replica(&local, e))?["revision"]
            .as_u64()
            .filter(|r| *r <= volume)
            .ok_or_else(|| EngineError::Refused {
                replica: local.clone(),
                message: format!("its server holds no revision at or below the volume's {volume}"),
            })?;
        let lent = lent::Lent::borrow(c, &local, &dir, self.size(), held, writeback_every)
            .await
            .map_err(|e| EngineError::of_replica(&local, e))?;
        if let Some(&timeout) = self.replica_timeout.get() {
            self.watch_lent(&lent, &local, timeout);
        }
        let engine = Arc::downgrade(self);
        lent.keep(move |refused| {
            tokio::spawn(async move {
                if let Some(engine) = engine.upgrade() {
                    engine.fail(&local, &refused).await;
                }
            });
        });
        x.link = Some(Link::Lent(lent));
        self.members_changed();
        Ok(())
    }

    /// Sends one mutation to every rw and wo replica in engine order, waits
    /// for all, and drops those that fail. Succeeds when at least one rw
    /// replica has it. I/O must be held (shared or exclusive).
    async fn mutate_now(
        &self,
        op: Op,
        offset: u64,
        len: u32,
        flags: u8,
        data: Bytes,
    ) -> Result<(), EngineError> {
        let clients = self.write_clients().await;
        if !clients.iter().any(|(_, _, rw)| *rw) {
            return Err(EngineError::NoReplica("no rw replica".into()));
        }
        let mut waits = Vec::new();
        let mut failed = Vec::new();
        // rw replicas that have the mutation, and wo ones.
        let mut acked: Vec<String> = Vec::new();
        let mut held: Vec<String> = Vec::new();
        // Lent replicas to flush once the order lock is let go.
        let mut flushes = Vec::new();
        // Taken before the order lock: the lock is held only to send.
        let sums = if op == Op::Write {
            sums_for(&clients, offset, &data)
        } else {
            None
        };
        {
            // Lent replicas' turns, taken before the order lock and held
            // until their change is made once it is let go (`lent::Turn`;
            // their guards are not held across an await).
            let turns: Vec<_> = clients
                .iter()
                .filter_map(|(name, link, rw)| match link {
                    Link::Lent(l) => {
                        let turn = matches!(op, Op::Write | Op::Trim).then(|| l.turn());
                        Some((name, l, *rw, turn))
                    }
                    Link::Remote(_) => None,
                })
                .collect();
            let revision = {
                let _order = self
                    .order
                    .lock()
                    .map_err(|_| EngineError::NoReplica("engine order lock poisoned".into()))?;
                let revision = if matches!(op, Op::Write | Op::Trim) {
                    self.revision.fetch_add(1, Ordering::SeqCst) + 1
                } else {
                    0
                };
                // Remote replicas first, so they work while the local one does.
                for (name, link, rw) in clients.iter() {
                    if let Link::Remote(c) = link {
                        let sent = c.submit_summed(
                            op,
                            offset,
                            len,
                            (revision, flags),
                            data.clone(),
                            sums.as_ref(),
                        );
                        match sent {
                            Ok(w) => waits.push((name.clone(), w, *rw)),
                            Err(e) => failed.push((name.clone(), e, *rw)),
                        }
                    }
                }
                revision
            };
            for (name, l, rw, turn) in turns {
                let done = match (op, turn) {
                    (_, Some(Err(e))) => Err(e),
                    (Op::Write, Some(Ok(t))) => t.write(offset, &data, sums.as_ref(), revision),
                    (Op::Trim, Some(Ok(t))) => {
                        t.discard(offset, u64::from(len), revision, flags & FLAG_ZEROES != 0)
                    }
                    _ => Ok(()),
                };
                let sync = op == Op::Flush || flags & FLAG_FUA != 0;
                match done {
                    Ok(()) if sync => flushes.push((name.clone(), l.clone(), rw)),
                    Ok(()) if rw => acked.push(name.clone()),
                    Ok(()) => held.push(name.clone()),
                    Err(e) => failed.push((name.clone(), e, rw)),
                }
            }
        }
        for (name, l, rw) in flushes {
            match l.flush().await {
                Ok(()) if rw => acked.push(name),
                Ok(()) => held.push(name),
                Err(e) => failed.push((name, e, rw)),
            }
        }
        for (name, w, rw) in waits {
            match w.await {
                Ok(_) if rw => acked.push(name),
                Ok(_) => held.push(name),
                Err(e) => failed.push((name, e, rw)),
            }
        }
        self.conclude(acked, held, failed).await
    }

    /// The outcome of a mutation that the rw replicas `acked` have and the
    /// replicas `failed` (name, error, whether rw) do not. A replica that
    /// lacks a write that others have is dropped. When no rw replica has
    /// it and every rw failure was a full disk, none is dropped — each
    /// still holds every acknowledged write — and the writer gets ENOSPC.
    async fn conclude(
        &self,
        acked: Vec<String>,
        held: Vec<String>,
        failed: Vec<(String, ClientError, bool)>,
    ) -> Result<(), EngineError> {
        // No rw replica took it, each for want of space or for a bad block
        // it would have had to keep part of: none changed, so all stay,
        // and only this write fails.
        let rw_failed = || failed.iter().filter(|(_, _, rw)| *rw);
        let unchanged = acked.is_empty()
            && rw_failed().next().is_some()
            && rw_failed().all(|(_, e, _)| e.is_no_space() || e.is_corrupt());
        let full_disk = unchanged && rw_failed().all(|(_, e, _)| e.is_no_space());
        let mut last = String::new();
        let mut corrupt = None;
        for (name, e, rw) in &failed {
            last = e.to_string();
            if unchanged && *rw {
                if e.is_corrupt() {
                    tracing::error!(volume = %self.volume, replica = %name, error = %e,
                        "a write that keeps part of a block bad in every rw replica fails; the replicas keep what they hold");
                    corrupt = Some((name.clone(), e.to_string()));
                } else {
                    tracing::warn!(volume = %self.volume, replica = %name, error = %e, "no space for a write; the replica keeps what it holds");
                }
                continue;
            }
            self.fail(name, e).await;
        }
        if unchanged && let Some((_, e, _)) = rw_failed().next() {
            // A replica being rebuilt that took the write holds what the
            // rw ones refused: it no longer matches them.
            for name in &held {
                self.fail(name, e).await;
            }
        }
        if full_disk {
            return Err(EngineError::NoSpace(last));
        }
        if let Some((replica, message)) = corrupt {
            return Err(EngineError::Corrupt { replica, message });
        }
        if acked.is_empty() {
            return Err(EngineError::NoReplica(last));
        }
        // A wo replica that has it may have turned rw, and been recorded,
        // while the write was out: it counts for the record.
        let all: Vec<String> = acked.into_iter().chain(held).collect();
        self.covered(&all).await
    }

    /// Ok once a mutation that the rw replicas `acked` have may be
    /// acknowledged: the store's replica set holds none that lacks it.
    async fn covered(&self, acked: &[String]) -> Result<(), EngineError> {
        let names: Vec<&str> = acked.iter().map(String::as_str).collect();
        if self.freshness.covers(&names) {
            return Ok(());
        }
        self.freshness
            .wait_covered(acked)
            .await
            .map_err(EngineError::NotRecorded)
    }

    async fn mutate(
        &self,
        op: Op,
        offset: u64,
        len: u32,
        flags: u8,
        data: Bytes,
    ) -> Result<(), EngineError> {
        let _io = self.io.read().await;
        self.mutate_now(op, offset, len, flags, data).await
    }

    /// A replica being rebuilt cannot finish a partial block from layers it
    /// does not hold yet, so while a rebuild runs an unaligned write is made
    /// whole here: with I/O paused, the partial blocks are read from an rw
    /// replica and the write goes out block aligned.
    async fn write_aligned(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), EngineError> {
        let _pause = self.io.write().await;
        let start = offset / BLOCK * BLOCK;
        let end = (offset + data.len() as u64).div_ceil(BLOCK) * BLOCK;
        let mut whole = Vec::with_capacity((end - start) as usize);
        whole.extend_from_slice(&self.read_now(start, BLOCK as u32).await?);
        whole.resize((end - start) as usize, 0);
        if end - start > BLOCK {
            let tail = self.read_now(end - BLOCK, BLOCK as u32).await?;
            let at = whole.len() - BLOCK as usize;
            whole[at..].copy_from_slice(&tail);
        }
        let at = (offset - start) as usize;
        whole[at..at + data.len()].copy_from_slice(data);
        self.write_now(start, Bytes::from(whole), fua).await
    }

    /// Writes `data` in frames of at most `MAX_DATA`, with I/O held.
    async fn write_now(&self, offset: u64, data: Bytes, fua: bool) -> Result<(), EngineError> {
        let mut pos = 0usize;
        while pos < data.len() {
            let n = (data.len() - pos).min(MAX_DATA as usize);
            self.mutate_now(
                Op::Write,
                offset + pos as u64,
                n as u32,
                u8::from(fua),
                data.slice(pos..pos + n),
            )
            .await?;
            pos += n;
        }
        Ok(())
    }

    fn unaligned(offset: u64, len: u64) -> bool {
        !offset.is_multiple_of(BLOCK) || !len.is_multiple_of(BLOCK)
    }

    pub async fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), EngineError> {
        self.write_bytes(offset, Bytes::copy_from_slice(data), fua)
            .await
    }

    /// Like `write`, for data the caller hands over: it goes to every
    /// replica's connection without being copied.
    pub async fn write_bytes(
        &self,
        offset: u64,
        data: Bytes,
        fua: bool,
    ) -> Result<(), EngineError> {
        self.check(offset, data.len() as u64)?;
        let (start, len) = (std::time::Instant::now(), data.len() as u64);
        let io = self.io.read().await;
        // The flag is read with I/O held: a rebuild sets it before its join,
        // which waits for I/O to pause; so a write that finds it clear here
        // only reaches replicas that can take it as it is.
        let written = if self.rebuilding.load(Ordering::SeqCst) && Self::unaligned(offset, len) {
            drop(io);
            self.write_aligned(offset, &data, fua).await
        } else {
            self.write_now(offset, data, fua).await
        };
        if written.is_ok() {
            self.counters.write(len, start.elapsed());
        }
        written
    }

    /// Writes `data` at `offset` and calls `done` with the outcome once
    /// every replica has answered, from the task that read the last
    /// answer: no task per request. Writes larger than one frame, and
    /// unaligned writes during a rebuild, take the awaited path.
    pub async fn write_then(
        self: &Arc<Self>,
        offset: u64,
        data: Bytes,
        fua: bool,
        done: WriteDone,
    ) {
        if let Err(e) = self.check(offset, data.len() as u64) {
            return done(Err(e));
        }
        let unaligned = Self::unaligned(offset, data.len() as u64);
        if data.len() > MAX_DATA as usize || (self.rebuilding.load(Ordering::SeqCst) && unaligned) {
            return done(self.write_bytes(offset, data, fua).await);
        }
        let start = std::time::Instant::now();
        let guard = self.io.clone().read_owned().await;
        // Read again with I/O held (see `write_bytes`).
        if unaligned && self.rebuilding.load(Ordering::SeqCst) {
            drop(guard);
            return done(self.write_bytes(offset, data, fua).await);
        }
        let (len, counters) = (data.len() as u64, self.counters.clone());
        let done: WriteDone = Box::new(move |r| {
            if r.is_ok() {
                counters.write(len, start.elapsed());
            }
            done(r)
        });
        let clients = self.write_clients().await;
        if !clients.iter().any(|(_, _, rw)| *rw) {
            return done(Err(EngineError::NoReplica("no rw replica".into())));
        }
        let fan = FanIn::new(self.clone(), clients.len(), done, guard);
        let sums = sums_for(&clients, offset, &data);
        // The local one's turn is taken before the order lock and held
        // until its write is made once the lock is let go (`lent::Turn`).
        let turns: Vec<_> = clients
            .iter()
            .filter_map(|(name, link, rw)| match link {
                Link::Lent(l) => Some((name, l, *rw, l.turn())),
                Link::Remote(_) => None,
            })
            .collect();
        let Ok(order) = self.order.lock() else {
            return fan.answer_all(EngineError::NoReplica("engine order lock poisoned".into()));
        };
        let revision = self.revision.fetch_add(1, Ordering::SeqCst) + 1;
        // Remote replicas first, so they work while the local one does.
        for (name, link, rw) in clients.iter() {
            let Link::Remote(c) = link else {
                continue;
            };
            let answer = fan.answer(name, *rw);
            let waiter = Waiter::Callback(Box::new(move |r| answer.give(r.map(drop))));
            c.send_write(offset, data.clone(), sums.as_ref(), (revision, fua), waiter);
        }
        drop(order);
        for (name, l, rw, turn) in turns {
            // Its answer is given by its write, or by its give-up while the
            // write hangs on the disk.
            let answer = fan.answer(name, rw);
            let answer: lent::Answer = Box::new(move |r| answer.give(r));
            let done = match turn {
                Ok(t) => t.write_answered(offset, &data, sums.as_ref(), revision, answer),
                Err(e) => Some((answer, Err(e))),
            };
            match done {
                Some((answer, Ok(()))) if fua => {
                    let l = l.clone();
                    tokio::spawn(async move { answer(l.flush().await) });
                }
                Some((answer, r)) => answer(r),
                None => {}
            }
        }
    }

    /// Discards a range; it reads as zeros afterwards.
    pub async fn trim(&self, offset: u64, len: u64) -> Result<(), EngineError> {
        self.check(offset, len)?;
        let (mut offset, mut len) = (offset, len);
        loop {
            // As for writes, the flag is read with I/O held.
            let io = self.io.read().await;
            let rebuilding = self.rebuilding.load(Ordering::SeqCst);
            if rebuilding && Self::unaligned(offset, len) {
                drop(io);
                // The partial blocks at the edges become aligned zero writes.
                let first_end = (offset / BLOCK + 1) * BLOCK;
                if !offset.is_multiple_of(BLOCK) {
                    let n = (first_end - offset).min(len);
                    self.write_aligned(offset, &vec![0u8; n as usize], false)
                        .await?;
                    (offset, len) = (offset + n, len - n);
                }
                let tail = len % BLOCK;
                if tail > 0 {
                    self.write_aligned(offset + len - tail, &vec![0u8; tail as usize], false)
                        .await?;
                    len -= tail;
                }
                continue;
            }
            // While a rebuild runs every replica writes zeros, so that
            // their heads keep the same allocation.
            let flags = if rebuilding { FLAG_ZEROES } else { 0 };
            let mut pos = 0u64;
            while pos < len {
                let n = (len - pos).min(u64::from(u32::MAX) & !4095);
                self.mutate_now(Op::Trim, offset + pos, n as u32, flags, Bytes::new())
                    .await?;
                pos += n;
            }
            return Ok(());
        }
    }

    pub async fn flush(&self) -> Result<(), EngineError> {
        self.mutate(Op::Flush, 0, 0, 0, Bytes::new()).await
    }

    /// The local replica and its name, while it is lent to this engine
    /// (`lend_local`).
    async fn lent(&self) -> Option<(String, Arc<lent::Lent>)> {
        let m = self.members.lock().await;
        m.iter().find_map(|m| match &m.link {
            Some(Link::Lent(l)) => Some((m.at.name.clone(), l.clone())),
            _ => None,
        })
    }

    /// Ends the engine's I/O for good, as it is told to stop: every I/O
    /// under way ends first (for at most `wait`), and the local replica,
    /// when lent, is closed clean (`Replica::close_clean`), so that a new
    /// boot trusts its head and its write log as they are. Its server
    /// says first whether the loan still holds, and refuses an engine the
    /// replica's fence has moved past (`Lent::close_clean`). The guard
    /// returned holds back every later I/O; the caller keeps it until the
    /// process ends. Without the I/O ended in time nothing is marked (the
    /// next boot checks the head, as after a cut).
    #[tracing::instrument(skip_all, fields(volume = %self.volume))]
    pub async fn close(
        &self,
        wait: std::time::Duration,
    ) -> Option<tokio::sync::OwnedRwLockWriteGuard<()>> {
        let Ok(pause) = tokio::time::timeout(wait, self.io.clone().write_owned()).await else {
            tracing::warn!("I/O still under way: the local replica is not closed clean");
            return None;
        };
        if let Some((name, l)) = self.lent().await {
            match l.close_clean("its engine stopped").await {
                Ok(true) => tracing::info!(replica = %name, "local replica closed clean"),
                Ok(false) => {
                    tracing::info!(replica = %name, "local replica closed, not marked clean: its loan was not held, a fill or a merge was under way, or it had failed")
                }
                Err(e) => {
                    tracing::warn!(replica = %name, error = %e, "the local replica's clean close failed: a new boot checks its head")
                }
            }
        }
        Some(pause)
    }

    /// Merges the layers of `replica`, the local replica lent to this
    /// engine, that no snapshot in `keep` needs (its server merges the
    /// others).
    #[tracing::instrument(skip_all, fields(volume = %self.volume, replica))]
    pub async fn merge(
        &self,
        replica: &str,
        keep: Vec<String>,
        rate: u64,
    ) -> Result<crate::replica::MergeReport, EngineError> {
        let lent = self.lent().await.filter(|(name, _)| name == replica);
        let (_, lent) = lent.ok_or_else(|| {
            EngineError::Invalid(format!(
                "replica {replica} is not lent to this engine: its server merges it"
            ))
        })?;
        // A rebuild copies the frozen layers (the controller's records may
        // not show it yet): a merge would change what its fill reads, and
        // the fill would fail and start again. The next merge pass asks
        // again. (A rebuild asked for while a merge runs waits for it, see
        // `pick_source`.)
        if self.rebuilding.load(Ordering::SeqCst) {
            return Err(EngineError::Busy(self.volume.clone()));
        }
        lent.merge(keep, rate).await.map_err(|e| match e {
            e if e.is_corrupt() => EngineError::FoundCorrupt {
                replica: replica.to_string(),
                message: e.to_string(),
            },
            e => EngineError::of_replica(replica, e),
        })
    }

    /// Changes each time the local replica is given up while its disk
    /// holds a call: the task that made the call is held until the disk
    /// answers, though the call itself was answered by the give-up.
    pub fn lent_given_up(&self) -> tokio::sync::watch::Receiver<u64> {
        self.lent_given_up.subscribe()
    }

    /// The volume's size in bytes.
    pub fn size(&self) -> u64 {
        self.size.load(Ordering::SeqCst)
    }

    /// Grows the volume to `size` bytes while it serves (never shrinks):
    /// I/O paused, every rw replica grows, then the engine answers the new
    /// size. A replica that cannot grow is failed (the volume degrades);
    /// when none can, nothing changes. Refused while a rebuild runs.
    #[tracing::instrument(skip_all, fields(volume = %self.volume, size))]
    pub async fn grow(&self, size: u64) -> Result<(), EngineError> {
        self.give_up_silent().await;
        let _pause = self.io.write().await;
        let from = self.size();
        if size < from {
            return Err(EngineError::Invalid(format!(
                "{size} bytes is below the volume's {from}; volumes never shrink"
            )));
        }
        if size == from {
            return Ok(());
        }
        if self.rebuilding.load(Ordering::SeqCst) {
            return Err(EngineError::Busy(self.volume.clone()));
        }
        let links = self.rw_links().await;
        let mut grown = 0;
        // Failed only once another grew: when none can, none changed, and
        // all stay.
        let mut failed = Vec::new();
        for (name, link) in &links {
            match link.grow(size).await {
                Ok(()) => grown += 1,
                Err(e) => failed.push((name, e)),
            }
        }
        if grown == 0 {
            let why: Vec<String> = failed.iter().map(|(_, e)| e.to_string()).collect();
            return Err(EngineError::NoReplica(format!(
                "no replica could grow to {size} bytes: {}",
                why.join("; ")
            )));
        }
        for (name, e) in &failed {
            self.fail(name, e).await;
        }
        self.size.store(size, Ordering::SeqCst);
        tracing::info!(from, size, replicas = grown, "volume grown online");
        Ok(())
    }

    /// Snapshots every rw replica at one point of the I/O stream; with
    /// `label`, the frozen layers are that user snapshot. A replica being
    /// rebuilt (`wo`) gets the label when it joins after this.
    #[tracing::instrument(skip_all, fields(volume = %self.volume, snapshot = label))]
    pub async fn snapshot(&self, label: Option<&str>) -> Result<Vec<String>, EngineError> {
        self.give_up_silent().await;
        let ahead = std::time::Instant::now();
        self.warm_heads().await;
        let pausing = std::time::Instant::now();
        let _pause = self.io.write().await;
        if label.is_some() && self.rebuilding.load(Ordering::SeqCst) {
            // A joining replica takes the chain as it was at its join: a
            // snapshot now would be missing from it.
            return Err(EngineError::Busy(self.volume.clone()));
        }
        let frozen = self.snapshot_now(label, None).await;
        tracing::info!(
            read_ahead_ms = pausing.duration_since(ahead).as_millis() as u64,
            paused_ms = pausing.elapsed().as_millis() as u64,
            ok = frozen.is_ok(),
            "snapshot: the heads read ahead with the I/O running, then frozen with it paused"
        );
        frozen
    }

    /// Has every rw replica read its head ahead of a freeze, all at once
    /// and with the volume's I/O running (see `replica::warm`): the
    /// freeze, with the I/O paused, then reads only what was written
    /// since. Only a help: a replica that fails it is frozen as before,
    /// reading its whole head.
    async fn warm_heads(&self) {
        let links = self.rw_links().await;
        let done = futures_util::future::join_all(links.iter().map(|(_, c)| c.warm())).await;
        for ((name, _), warmed) in links.iter().zip(done) {
            if let Err(e) = warmed {
                tracing::info!(volume = %self.volume, replica = %name, error = %e,
                    "head not read ahead of its freeze: the freeze reads all of it");
            }
        }
    }

    /// A snapshot with I/O paused. A bad block of a head is repaired from
    /// the other rw replicas, or, in the last one, from `spare` (a replica
    /// about to join) when it may. One that no replica can give sound is
    /// frozen as lost in the last rw replica: it fails its reads, as it did
    /// already, and the rest of the volume is frozen, served and copied, so
    /// that one bad block does not keep the volume from its other replicas.
    async fn snapshot_now(
        &self,
        label: Option<&str>,
        spare: Option<&spare::Spare<'_>>,
    ) -> Result<Vec<String>, EngineError> {
        let mut names = Vec::new();
        // Replicas that had no room for the new head: unchanged, and
        // failed only once another took the snapshot (as a write that no
        // rw replica had room for fails alone and leaves them all).
        let mut no_room = Vec::new();
        // Every rw replica's first freeze runs at once: the volume's I/O
        // stays paused for the slowest, not for the sum of them (a freeze
        // reads what its head holds that was not read ahead, `warm_heads`:
        // about a second per GiB, performance.md, the freeze bench). What
        // each answers is then taken in turn, as
        // before, with its repairs and retries: a replica's reads return
        // the same data before and after its freeze, so a repair from one
        // frozen already reads what it would have read before it.
        let links = self.rw_links().await;
        let none = BTreeSet::new();
        let firsts =
            futures_util::future::join_all(links.iter().map(|(_, c)| c.snapshot(label, &none)))
                .await;
        for ((name, c), first) in links.into_iter().zip(firsts) {
            let mut repaired = 0;
            let mut lose = BTreeSet::new();
            let mut first = Some(first);
            loop {
                let answer = match first.take() {
                    Some(answer) => answer,
                    None => c.snapshot(label, &lose).await,
                };
                let e = match answer {
                    Ok(n) => {
                        if !lose.is_empty() {
                            IoCounters::count(&self.counters.lost_blocks, lose.len() as u64);
                            tracing::error!(volume = %self.volume, replica = %name, layer = %n,
                                blocks = ?lose, "blocks no replica holds sound are lost: they fail their reads until written again; the rest of the volume was frozen");
                        }
                        names.push(n);
                        break;
                    }
                    Err(e) => e,
                };
                // Freezing a head checks its blocks. A bad one is taken
                // from another replica and the freeze tried again.
                let at = e.corrupt_at();
                if at.is_some() {
                    IoCounters::count(&self.counters.checksum_failures, 1);
                }
                if let Some(at) = at
                    && repaired < MAX_REPAIRS_PER_FREEZE
                    && (spare.is_some() || self.others_rw(&name).await > 0)
                    && self
                        .repair_now(at, BLOCK, &[(name.clone(), e.clone())], spare)
                        .await
                {
                    repaired += 1;
                    continue;
                }
                // Beyond repair, and sound in no other rw replica, the
                // block is lost: here, and in each other as its own freeze
                // finds it.
                if let Some(block) = at.map(|at| at / BLOCK)
                    && lose.len() < MAX_LOST_PER_FREEZE
                    && !lose.contains(&block)
                    && !self.sound_elsewhere(&name, block).await
                {
                    lose.insert(block);
                    continue;
                }
                // Past that bound the last rw replica is kept as it is (it
                // serves the rest), and what needed the snapshot (a
                // rebuild) fails instead.
                if e.is_corrupt() && self.others_rw(&name).await == 0 {
                    return Err(EngineError::Corrupt {
                        replica: name,
                        message: e.to_string(),
                    });
                }
                if e.is_no_space() {
                    no_room.push((name, e));
                    break;
                }
                self.fail(&name, &e).await;
                break;
            }
        }
        if names.is_empty()
            && let Some((replica, e)) = no_room.first()
        {
            tracing::warn!(volume = %self.volume, replicas = ?no_room.iter().map(|(n, _)| n).collect::<Vec<_>>(),
                "no rw replica has room for a snapshot's new head; none changed, all stay, and the snapshot fails");
            return Err(EngineError::NoSpace(format!(
                "snapshot: replica {replica}: {e}"
            )));
        }
        for (name, e) in &no_room {
            self.fail(name, e).await;
        }
        if names.is_empty() {
            Err(EngineError::NoReplica("snapshot failed everywhere".into()))
        } else {
            Ok(names)
        }
    }

    pub async fn status(&self) -> Vec<MemberStatus> {
        self.members
            .lock()
            .await
            .iter()
            .map(|m| MemberStatus {
                name: m.at.name.clone(),
                addr: m.at.addr.clone(),
                mode: m.mode,
                error: m.error.clone(),
                rebuild: m.rebuild.clone(),
            })
            .collect()
    }
}
