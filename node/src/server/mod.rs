//! The replica server: serves the replicas of this node's table
//! (`crate::replica::Replicas`) over the replica data protocol
//! (`crate::wire`). A connection first OPENs a replica by name. Its reads
//! run in parallel on blocking threads; its mutations apply one at a time
//! in arrival order (plain writes on the connection's own task, those that
//! sync on a thread of their own); replies go back as they finish. A FILL
//! (a rebuild's copy, `crate::sync`) runs beside the rest.
//!
//! A replica on the engine's own node is lent to it (LEND): the engine then
//! reads and writes the files itself, and the server refuses every other
//! read and mutation of that replica until the loan ends. What it still
//! serves of it (INFO, LAYERS, and the frozen layers a rebuild copies) it
//! reads from the files afresh. The loan ends when the engine gives the
//! replica back or its connection closes, and the table ends it when the
//! replica's disk is lost.
//!
//! It is the top of the data plane's layers (replica, wire, sync, server):
//! nothing below imports it.

use std::sync::{Arc, RwLock};

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::budget::{Budget, Share};
use crate::replica::{LoanGuard, Replica, ReplicaError, Replicas, Shared};
use crate::sync::{Fills, SyncError};
use crate::wire::protocol::{
    FLAG_COPY, FLAG_FUA, FLAG_LOSE, FLAG_RETURN, FLAG_SUMS, FLAG_ZEROES, FrameError, Op,
    REQUEST_HEADER, Request, Response, status, status_of,
};
use crate::wire::tls::{Peer, WireTls, Writer};
use crate::wire::{HANDSHAKE_TIMEOUT, IO_BUFFER, JoinSpec, LoseSpec};

/// Serves the replicas of its table over the replica data protocol.
pub struct ReplicaServer {
    replicas: Arc<Replicas>,
    fills: Fills,
    /// How connections are taken, and how its fills reach their sources.
    tls: WireTls,
    /// Changes refused since the server started, by the replica's volume
    /// and why (`/metrics`).
    refusals: std::sync::Mutex<std::collections::BTreeMap<(String, Refusal), u64>>,
    /// The writes applied on their connections' own tasks just now.
    inline: InlineWrites,
}

/// How many writes the connections apply on their own tasks at once (a
/// plain write into the page cache, without the hop to the mutator
/// thread): one fewer than the runtime's async workers. A write waits
/// there on a disk that hangs, and the node's heartbeats, agent and CSI
/// calls run on the same workers: one is always left to them. The other
/// writes go to their connection's mutator thread meanwhile, as a write
/// that must sync does.
///
/// One free worker is not enough by itself: the node plugin also nudges
/// its runtime (`nudge::Nudger`), or the free one may sleep on while the
/// blocked one no longer turns the I/O driver.
struct InlineWrites {
    now: std::sync::atomic::AtomicUsize,
    most: usize,
}

impl InlineWrites {
    /// For the runtime the server is made in (none: no write inline).
    fn for_this_runtime() -> InlineWrites {
        let workers = tokio::runtime::Handle::try_current()
            .map(|h| h.metrics().num_workers())
            .unwrap_or(1);
        InlineWrites {
            now: Default::default(),
            most: workers.saturating_sub(1),
        }
    }

    /// A turn to apply a write inline, if one is free.
    fn take(&self) -> Option<InlineTurn<'_>> {
        use std::sync::atomic::Ordering::SeqCst;
        self.now
            .fetch_update(SeqCst, SeqCst, |n| (n < self.most).then_some(n + 1))
            .ok()?;
        Some(InlineTurn(&self.now))
    }
}

/// A write applied inline; dropped once it is.
struct InlineTurn<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for InlineTurn<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Why a change of a replica was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Refusal {
    /// The peer may not (DENIED): it is not the volume's engine, its
    /// certificate does not name the attachment it claims, it asks a loan
    /// from another node, or it opens a replica it may not read.
    Denied,
    /// The peer is an engine of an earlier attachment (FENCED).
    Fenced,
}

impl Refusal {
    /// Its label on `/metrics`.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Denied => "denied",
            Refusal::Fenced => "fenced",
        }
    }
}

impl ReplicaServer {
    pub fn new(disks: Vec<std::path::PathBuf>) -> Arc<Self> {
        Self::serving(Replicas::new(disks))
    }

    /// Serves the replicas of `replicas` over plain TCP.
    pub fn serving(replicas: Arc<Replicas>) -> Arc<Self> {
        Self::serving_with(replicas, WireTls::default())
    }

    /// Serves the replicas of `replicas`, taking connections with `tls`.
    pub fn serving_with(replicas: Arc<Replicas>, tls: WireTls) -> Arc<Self> {
        Arc::new(ReplicaServer {
            replicas,
            fills: Fills::default(),
            tls,
            refusals: Default::default(),
            inline: InlineWrites::for_this_runtime(),
        })
    }

    /// Changes refused since the server started: (volume, why, how many).
    pub fn refusals(&self) -> Vec<(String, Refusal, u64)> {
        self.refusals
            .lock()
            .map(|m| m.iter().map(|((v, r), n)| (v.clone(), *r, *n)).collect())
            .unwrap_or_default()
    }

    /// Counts a refused change of a replica of `volume`.
    fn refused(&self, volume: &str, why: Refusal) {
        if let Ok(mut m) = self.refusals.lock() {
            *m.entry((volume.to_string(), why)).or_default() += 1;
        }
    }

    /// How it takes connections (and its fills make theirs).
    pub fn tls(&self) -> &WireTls {
        &self.tls
    }

    /// The table of the replicas it serves.
    pub fn replicas(&self) -> &Arc<Replicas> {
        &self.replicas
    }

    /// The fills running here (a FILL request's, or the agent's for an
    /// offline rebuild).
    pub async fn fill(
        &self,
        target: &str,
        source: &str,
        bytes_per_second: u64,
    ) -> Result<crate::sync::FillReport, SyncError> {
        self.fills
            .run(
                &self.replicas,
                &self.tls,
                target,
                (source, bytes_per_second),
            )
            .await
    }

    /// Calls off the fill of `name`, if one runs, and waits at most
    /// `patience` for it to end; whether none runs then.
    pub async fn call_off_fill(&self, name: &str, patience: std::time::Duration) -> bool {
        self.fills.call_off(name, patience).await
    }

    /// Why replica `name` may join no chain now: a fill of it runs still
    /// (one called off writes its last pieces), and no join changes the
    /// layers under it.
    pub fn join_refused(&self, name: &str) -> Option<String> {
        self.fill_progress(name)
            .map(|_| format!("replica {name} is being filled; join when it ends"))
    }

    /// Bytes done and total of the fill of `name`, while one runs.
    pub fn fill_progress(&self, name: &str) -> Option<(u64, u64)> {
        self.fills.progress(name)
    }

    /// Accepts connections until the task is dropped. A peer past
    /// [`MAX_CONNECTIONS_PER_PEER`] is closed at once; a failed accept (out
    /// of file descriptors) is retried after a pause, so no peer can stop
    /// the server by exhausting them.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        let peers = Peers::default();
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    let Some(slot) = peers.enter(peer.ip()) else {
                        tracing::warn!(%peer, limit = MAX_CONNECTIONS_PER_PEER, "replica connection refused: too many from this peer");
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    let server = self.clone();
                    tokio::spawn(async move {
                        let _slot = slot;
                        if let Err(e) = server.connection(stream).await {
                            tracing::debug!(%peer, error = %e, "replica connection ended");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "replica listener cannot accept; retrying");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
    }

    async fn connection(self: Arc<Self>, stream: TcpStream) -> std::io::Result<()> {
        // A peer on this node reaches it from the address it reaches
        // (the kernel picks the destination as the source).
        let same_address = match (stream.peer_addr(), stream.local_addr()) {
            (Ok(peer), Ok(local)) => peer.ip() == local.ip(),
            _ => false,
        };
        let (rd, wr, peer) = tokio::time::timeout(HANDSHAKE_TIMEOUT, self.tls.accept(stream))
            .await
            .map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no TLS handshake within {HANDSHAKE_TIMEOUT:?}"),
                )
            })??;
        // With TLS, the peer's certificate must also be this node's.
        let same_node = same_address
            && match &peer {
                Peer::Plain => true,
                Peer::Member { this_node, .. } => *this_node,
            };
        let mut rd = crate::bufio::FrameReader::new(rd, IO_BUFFER);
        let (tx, rx) = mpsc::channel::<Queued>(256);
        // The socket's write half is shared: the writer task sends the
        // replies of reads and queued mutations; this task sends the replies
        // of the writes it applies itself, gathered until it would wait for
        // the next request (no hand-off to another task).
        let wr: SharedWriter = Arc::new(tokio::sync::Mutex::new(
            tokio::io::BufWriter::with_capacity(IO_BUFFER, wr),
        ));
        let writer = tokio::spawn(write_replies(rx, wr.clone()));
        // Mutations run one at a time, in the order they arrived, so that
        // every replica applies an engine's writes in the engine's order.
        // Reads run in parallel. A plain write or trim (no FUA) that finds
        // no mutation queued is applied right here, without a thread hop (a
        // write into the page cache is short); one that must sync, or that
        // would overtake a queued one, goes to the mutator thread.
        let (mtx, mrx) = mpsc::channel::<Mutation>(256);
        let queued = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mutator = {
            let (tx, done) = (tx.clone(), queued.clone());
            tokio::task::spawn_blocking(move || apply_mutations(mrx, tx, done))
        };
        let mut conn = Connection {
            server: self,
            tx,
            wr,
            answered: Vec::new(),
            bound: None,
            bound_at: (0, false),
            loan: None,
            mtx,
            queued,
            budget: Budget::default(),
            same_node,
            peer,
            claimed: 0,
            fence: None,
            engine: false,
            volume: String::new(),
            fills: Vec::new(),
            copying: None,
        };
        let result = loop {
            // A connection that has not opened a replica yet has
            // HANDSHAKE_TIMEOUT to do so.
            let next = if conn.bound.is_none() {
                tokio::time::timeout(HANDSHAKE_TIMEOUT, conn.next_request(&mut rd))
                    .await
                    .unwrap_or_else(|_| {
                        Err(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            format!("no replica opened within {HANDSHAKE_TIMEOUT:?}"),
                        ))
                    })
            } else {
                conn.next_request(&mut rd).await
            };
            let (req, payload) = match next {
                Ok(Some(r)) => r,
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            };
            match conn.handle(req, payload).await {
                Ok(Flow::Go) => {}
                Ok(Flow::Stop) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        let Connection {
            tx,
            wr,
            mut answered,
            loan,
            mtx,
            fills,
            ..
        } = conn;
        // Its fills are called off first: each holds a sender of its reply.
        drop(fills);
        drop(loan);
        let _ = send_answered(&wr, &mut answered).await;
        drop(mtx);
        let _ = mutator.await;
        drop(tx);
        let _ = writer.await;
        result
    }
}

/// Why a mutation from a peer that is not the volume's engine is refused.
const ONLY_ENGINE: &str = "WRITE, TRIM, FLUSH, JOIN, FILL, GROW, LEND, LOSE and a SNAPSHOT giving up blocks as lost are only for the engine the controller started for this replica's volume";

/// Connections one peer address may have open at once.
pub const MAX_CONNECTIONS_PER_PEER: usize = 512;

/// Open connections per peer address.
#[derive(Clone, Default)]
struct Peers(Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>);

/// A connection's place in its peer's count, given back when dropped.
struct PeerSlot {
    peers: Peers,
    ip: std::net::IpAddr,
}

impl Peers {
    fn enter(&self, ip: std::net::IpAddr) -> Option<PeerSlot> {
        let mut m = self.0.lock().ok()?;
        let n = m.entry(ip).or_default();
        if *n >= MAX_CONNECTIONS_PER_PEER {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            peers: self.clone(),
            ip,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        if let Ok(mut m) = self.peers.0.lock()
            && let Some(n) = m.get_mut(&self.ip)
        {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

/// A reply: its header and body.
type Reply = (Response, Vec<u8>);

/// A reply on its way to the client, with the share of the connection's
/// budget it holds until it is written (a read's data).
struct Queued {
    reply: Reply,
    _share: Option<Share>,
}

impl From<Reply> for Queued {
    fn from(reply: Reply) -> Self {
        Queued {
            reply,
            _share: None,
        }
    }
}

/// A mutation queued for the mutator thread, with the share of the budget
/// its payload holds until it is applied.
type Mutation = (Shared, Request, bytes::Bytes, Option<Share>);
type SharedWriter = Arc<tokio::sync::Mutex<tokio::io::BufWriter<Writer>>>;

/// Whether a connection goes on.
enum Flow {
    Go,
    Stop,
}

/// The writer task: replies queued together leave in one write.
async fn write_replies(mut rx: mpsc::Receiver<Queued>, wr: SharedWriter) {
    while let Some(first) = rx.recv().await {
        let mut wr = wr.lock().await;
        let mut next = Some(first);
        while let Some(q) = next {
            let (resp, body) = &q.reply;
            if wr.write_all(&resp.encode()).await.is_err() || wr.write_all(body).await.is_err() {
                return;
            }
            // Written (into the buffer, flushed below): its share goes back.
            drop(q);
            next = rx.try_recv().ok();
        }
        if wr.flush().await.is_err() {
            return;
        }
    }
}

/// The mutator thread: queued mutations, one at a time, in order.
fn apply_mutations(
    mut mrx: mpsc::Receiver<Mutation>,
    tx: mpsc::Sender<Queued>,
    queued: Arc<std::sync::atomic::AtomicUsize>,
) {
    while let Some((replica, req, payload, share)) = mrx.blocking_recv() {
        let reply = execute(&replica, &req, payload, false);
        drop(share);
        queued.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        if tx.blocking_send(reply.into()).is_err() {
            break;
        }
    }
}

/// One client's connection: the replica it opened, its loan, and where
/// its replies go.
struct Connection {
    server: Arc<ReplicaServer>,
    tx: mpsc::Sender<Queued>,
    wr: SharedWriter,
    /// Replies of writes applied on this task, not sent yet.
    answered: Vec<Reply>,
    bound: Option<(String, Shared)>,
    /// The table's `loan_epoch` when `bound` was found, and whether it is
    /// a view of a lent replica. Found again when the epoch has moved, or
    /// the loan of a view has ended (`Replicas::find_kept`): a node serves
    /// one copy of a replica.
    bound_at: (u64, bool),
    /// The loan this connection's engine holds (ended when dropped,
    /// however the connection ends).
    loan: Option<LoanGuard>,
    mtx: mpsc::Sender<Mutation>,
    /// Mutations queued for the mutator thread.
    queued: Arc<std::sync::atomic::AtomicUsize>,
    /// What the connection may hold for its client: past it, no more
    /// requests are read until replies are written or mutations applied.
    budget: Budget,
    /// Whether the peer is on this node: only the engine beside a replica
    /// borrows it (LEND).
    same_node: bool,
    /// Who the peer is (its certificates, with TLS on).
    peer: Peer,
    /// The attachment its engine claimed at OPEN (0: none), and the bound
    /// replica's fence: no mutation while the claim is below it.
    claimed: u64,
    fence: Option<Arc<std::sync::atomic::AtomicU64>>,
    /// Whether the peer is the engine of the bound replica's volume, the
    /// only peer that may change it (known at OPEN), and that volume.
    engine: bool,
    volume: String,
    /// The FILLs this connection asked for: called off when it ends.
    fills: Vec<AbortOnDrop>,
    /// Held from this connection's first look at its replica's layers for
    /// a copy (LAYERS with `FLAG_COPY`, or a read of a frozen layer: a
    /// fill on another node copying it) until it ends: the replica is not
    /// merged meanwhile (`Replicas::copied_from`).
    copying: Option<crate::replica::CopyGuard>,
}

/// Ends a task when dropped: a FILL's, whose dropped call calls the fill
/// off at its next piece (see `sync::Fills::run`).
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Connection {
    /// Reads the next request and its payload; None when the connection
    /// ends (the client left, or its loan was revoked, or it sent what
    /// cannot be trusted).
    async fn next_request<R: tokio::io::AsyncRead + Unpin>(
        &mut self,
        rd: &mut crate::bufio::FrameReader<R>,
    ) -> std::io::Result<Option<(Request, bytes::Bytes)>> {
        // Before waiting for more bytes, send what was answered.
        if rd.buffered() < REQUEST_HEADER {
            send_answered(&self.wr, &mut self.answered).await?;
        }
        let mut head = [0u8; REQUEST_HEADER];
        let got = match &self.loan {
            // A revoked loan closes the connection: the engine sees it and
            // asks again, and is refused.
            Some(held) => tokio::select! {
                got = rd.read_exact(&mut head) => got,
                () = held.revoke.notified() => return Ok(None),
            },
            None => rd.read_exact(&mut head).await,
        };
        if let Err(e) = got {
            return if e.kind() == std::io::ErrorKind::UnexpectedEof {
                Ok(None)
            } else {
                Err(e)
            };
        }
        let req = match Request::decode(&head) {
            Ok(r) => r,
            Err(FrameError::Magic(m)) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("bad magic {m:#x}"),
                ));
            }
            Err(FrameError::Refused { id, reason }) => {
                // The payload's length is not to be trusted: answer, then close.
                let _ = self
                    .tx
                    .send(error(id, status::INVALID, &reason).into())
                    .await;
                return Ok(None);
            }
        };
        if rd.buffered() < req.payload_len() {
            send_answered(&self.wr, &mut self.answered).await?;
        }
        let payload = rd.payload(req.payload_len()).await?;
        Ok(Some((req, payload)))
    }

    async fn reply(&self, r: Reply) -> Flow {
        if self.tx.send(r.into()).await.is_err() {
            Flow::Stop
        } else {
            Flow::Go
        }
    }

    async fn handle(&mut self, req: Request, payload: bytes::Bytes) -> std::io::Result<Flow> {
        // Answered here, whatever the replica is doing (its lock held by a
        // freeze, its disk slow): it says the server still answers.
        if req.op == Op::Ping {
            self.answered.push((ok_empty(req.id), Vec::new()));
            return Ok(Flow::Go);
        }
        if req.op == Op::Open {
            return Ok(self.open(&req, &payload).await);
        }
        let Some((name, mut replica)) = self.bound.clone() else {
            let e = error(
                req.id,
                status::NOT_FOUND,
                "no replica opened on this connection",
            );
            return Ok(self.reply(e).await);
        };
        // A loan started or ended since the copy was taken: the table's
        // copy now is another (or a view, while lent).
        let replicas = &self.server.replicas;
        let (epoch, view) = self.bound_at;
        if epoch != replicas.loan_epoch() || (view && !replicas.is_lent(&name)) {
            match replicas.find_kept_async(&name).await {
                Ok((r, epoch, view)) => {
                    replica = r.clone();
                    self.bound = Some((name.clone(), r));
                    self.bound_at = (epoch, view);
                }
                Err(e) => return Ok(self.reply(error(req.id, status::NOT_FOUND, &e)).await),
            }
        }
        if req.op == Op::Lend {
            return self.lend(&req, &name).await;
        }
        if req.mutates() {
            // Only the volume's engine changes a replica: a node's
            // certificate reads and snapshots (a rebuild's source), and
            // gives up no block as lost.
            if !self.engine {
                self.server.refused(&self.volume, Refusal::Denied);
                return Ok(self.reply(error(req.id, status::DENIED, ONLY_ENGINE)).await);
            }
            if let Some(why) = self.fenced_out(&name) {
                self.server.refused(&self.volume, Refusal::Fenced);
                return Ok(self.reply(error(req.id, status::FENCED, &why)).await);
            }
        }
        // A view is bound only while the replica is lent.
        let lent = self.bound_at.1 || replicas.is_lent(&name);
        let fresh = matches!(
            req.op,
            Op::Info | Op::Layers | Op::WriteLog | Op::RecentRuns | Op::ViewSums
        );
        let from_files =
            fresh || matches!(req.op, Op::LayerExtents | Op::LayerRead | Op::LayerSums);
        if !from_files && lent {
            let why = format!("replica {name} is lent to its engine");
            return Ok(self.reply(error(req.id, status::BUSY, &why)).await);
        }
        let copies = matches!(req.op, Op::LayerExtents | Op::LayerRead | Op::LayerSums)
            || (req.op == Op::Layers && req.flags & FLAG_COPY != 0);
        if copies && self.copying.as_ref().is_none_or(|c| c.name() != name) {
            self.copying = Some(replicas.copy_from(&name));
        }
        // What is lent is read from its files as they are now.
        let replica = if fresh && lent {
            match replicas.find_async(&name).await {
                Ok(r) => r,
                Err(e) => return Ok(self.reply(error(req.id, status::NOT_FOUND, &e)).await),
            }
        } else {
            replica
        };
        Ok(self.dispatch(req, payload, name, replica).await)
    }

    /// OPEN: binds the connection to a replica, for the attachment its
    /// engine claims (`offset`; see `replica::fence`).
    /// The reply says what the replica takes: `{"sums": true}` when it
    /// keeps block checksums, so that writes may bring them (FLAG_SUMS).
    async fn open(&mut self, req: &Request, payload: &[u8]) -> Flow {
        let (id, claimed) = (req.id, req.offset);
        let name = String::from_utf8_lossy(payload).into_owned();
        let reply = match self.bind(&name, claimed).await {
            Ok(((r, epoch, view), sums, volume, fence)) => {
                self.engine = self.drives(&volume);
                self.volume = volume;
                // A copy of the replica bound before ends with its binding.
                self.copying = None;
                self.bound = Some((name, r));
                self.bound_at = (epoch, view);
                self.claimed = claimed;
                self.fence = Some(fence);
                ok_json(
                    id,
                    &serde_json::json!({ "sums": sums, "ping": true, "warm": true }),
                )
            }
            Err((code, why)) => error(id, code, &why),
        };
        self.reply(reply).await
    }

    /// Opens replica `name` for the peer, claiming attachment `claimed`:
    /// the replica, whether it keeps sums, its volume and its fence. Its
    /// files are read on the blocking pool: their disk may hang.
    async fn bind(&self, name: &str, claimed: u64) -> Result<Bound, (u32, String)> {
        let (replicas, at) = (self.server.replicas.clone(), name.to_string());
        let (r, sums, volume) = tokio::task::spawn_blocking(move || {
            let (r, epoch, view) = replicas.find_kept(&at)?;
            let read = r
                .read()
                .map_err(|_| format!("replica {at}: lock poisoned"))?;
            let (sums, volume) = (read.keeps_sums(), read.volume().to_string());
            drop(read);
            Ok(((r, epoch, view), sums, volume))
        })
        .await
        .unwrap_or_else(|e| Err(e.to_string()))
        .map_err(|e| (status::NOT_FOUND, e))?;
        self.may_open(name, &volume)?;
        let fence = self.claim(name, &volume, claimed).await?;
        Ok((r, sums, volume, fence))
    }

    /// Refuses (DENIED) to open replica `name` of `volume` for a peer that
    /// is neither that volume's engine, nor a reader of it, nor on this
    /// node: a node's certificate reads no other node's replica without
    /// the controller's word.
    fn may_open(&self, name: &str, volume: &str) -> Result<(), (u32, String)> {
        if self.peer.may_open(volume) {
            return Ok(());
        }
        self.server.refused(volume, Refusal::Denied);
        Err((
            status::DENIED,
            format!(
                "replica {name} opens only for the engine of volume {volume}, a reader of it \
                 the controller named, or its own node's plugin"
            ),
        ))
    }

    /// Why this connection may not change its replica: its engine's
    /// attachment is below the replica's fence. None when it may.
    fn fenced_out(&self, name: &str) -> Option<String> {
        let latest = self
            .fence
            .as_ref()?
            .load(std::sync::atomic::Ordering::SeqCst);
        (self.claimed < latest).then(|| fenced(name, self.claimed, latest))
    }

    /// Takes the claim of attachment `claimed` on replica `name` of
    /// `volume`: with TLS, the peer's certificate must name it; the fence
    /// rises to it; a claim below the fence is refused. No claim (0) binds
    /// for reading (and, for the volume's engine, for mutations while no
    /// engine has claimed one).
    /// The fence is read and raised on the blocking pool: its file's disk
    /// may hang.
    async fn claim(
        &self,
        name: &str,
        volume: &str,
        claimed: u64,
    ) -> Result<Arc<std::sync::atomic::AtomicU64>, (u32, String)> {
        if claimed != 0
            && !self
                .peer
                .is(&ballast::tls::Role::Attachment(volume.to_string(), claimed))
        {
            let why = format!(
                "the peer's certificate does not name attachment {claimed} of volume {volume}"
            );
            self.server.refused(volume, Refusal::Denied);
            return Err((status::DENIED, why));
        }
        let (replicas, at) = (self.server.replicas.clone(), name.to_string());
        let (fence, latest) = tokio::task::spawn_blocking(move || {
            let fence = replicas.fence(&at).map_err(|e| (status::NOT_FOUND, e))?;
            let latest = match claimed {
                0 => 0,
                _ => replicas
                    .raise_fence(&at, claimed)
                    .map_err(|e| (status::IO, e))?,
            };
            Ok((fence, latest))
        })
        .await
        .map_err(|e| (status::IO, e.to_string()))??;
        if claimed < latest {
            self.server.refused(volume, Refusal::Fenced);
            return Err((status::FENCED, fenced(name, claimed, latest)));
        }
        Ok(fence)
    }

    /// Whether the peer is the engine of `volume` (its certificate says
    /// so; a plain connection, TLS off, is taken for it).
    fn drives(&self, volume: &str) -> bool {
        self.peer
            .is(&ballast::tls::Role::Engine(volume.to_string()))
    }

    /// LEND: lends the bound replica to this connection's engine, or takes
    /// it back.
    async fn lend(&mut self, req: &Request, name: &str) -> std::io::Result<Flow> {
        let refused = |why| self.server.refused(&self.volume, why);
        let reply = if !self.same_node {
            refused(Refusal::Denied);
            error(
                req.id,
                status::DENIED,
                "LEND is only for the engine on this replica's node",
            )
        } else if !self.engine {
            refused(Refusal::Denied);
            error(req.id, status::DENIED, ONLY_ENGINE)
        } else if req.flags & FLAG_RETURN != 0 {
            self.loan = None;
            (ok_empty(req.id), Vec::new())
        } else if let Some(why) = self.fenced_out(name) {
            refused(Refusal::Fenced);
            error(req.id, status::FENCED, &why)
        } else if self.loan.is_some() {
            (ok_empty(req.id), Vec::new())
        } else if self.queued.load(std::sync::atomic::Ordering::SeqCst) > 0 {
            error(req.id, status::BUSY, "mutations are still in flight")
        } else {
            // On the blocking pool: it opens the replica, and waits for a
            // step under way on it.
            let (replicas, at) = (self.server.replicas.clone(), name.to_string());
            let lent = tokio::task::spawn_blocking(move || replicas.lend(&at))
                .await
                .unwrap_or_else(|e| Err(e.to_string()));
            match lent {
                Ok(guard) => {
                    self.loan = Some(guard);
                    (ok_empty(req.id), Vec::new())
                }
                Err(e) => error(req.id, status::BUSY, &e),
            }
        };
        // Replies of writes applied before it go first.
        send_answered(&self.wr, &mut self.answered).await?;
        Ok(self.reply(reply).await)
    }

    /// A share of the connection's budget for `bytes`. While it waits for
    /// one, the writes it answered itself go out first (their client may
    /// be waiting for them before it reads more). None: the connection
    /// ends.
    async fn share(&mut self, bytes: u64) -> Option<Share> {
        if let Some(s) = self.budget.try_take(bytes) {
            return Some(s);
        }
        send_answered(&self.wr, &mut self.answered).await.ok()?;
        self.budget.take(bytes).await
    }

    /// Runs a request where it belongs: a fill beside the rest, reads on
    /// blocking threads, a plain write here (when a turn is free, see
    /// `InlineWrites`), other mutations in order on the mutator thread.
    async fn dispatch(
        &mut self,
        req: Request,
        payload: bytes::Bytes,
        name: String,
        replica: Shared,
    ) -> Flow {
        if req.op == Op::Join
            && let Some(busy) = self.server.join_refused(&name)
        {
            self.answered.push(error(req.id, status::BUSY, &busy));
            return Flow::Go;
        }
        if req.op == Op::Fill {
            // Long: it runs beside the connection's other requests, at the
            // pace the engine asked for (the header's offset), and is
            // called off when the connection ends: an engine that went
            // away (stopped, or gave the replica up) waits for it no more.
            let (tx, server) = (self.tx.clone(), self.server.clone());
            let task = tokio::spawn(async move {
                let source = String::from_utf8_lossy(&payload).into_owned();
                let reply = match server.fill(&name, &source, req.offset).await {
                    Ok(report) => ok_json(req.id, &report),
                    Err(e @ SyncError::SourceCorrupt { .. }) => {
                        reply_error(req.id, status::CORRUPT, &e.to_string(), e.corruption())
                    }
                    Err(e) => error(req.id, status::IO, &e.to_string()),
                };
                let _ = tx.send(reply.into()).await;
            });
            self.fills.retain(|f| !f.0.is_finished());
            self.fills.push(AbortOnDrop(task.abort_handle()));
        } else if matches!(
            req.op,
            Op::Read
                | Op::Info
                | Op::Layers
                | Op::LayerExtents
                | Op::LayerRead
                | Op::LayerSums
                | Op::WriteLog
                | Op::RecentRuns
                | Op::ViewSums
                | Op::Warm
        ) {
            // What the reply holds: LAYER_SUMS and VIEW_SUMS answer 4 bytes
            // a block.
            let reply = if matches!(req.op, Op::LayerSums | Op::ViewSums) {
                u64::from(req.len) / crate::replica::BLOCK * 4
            } else {
                u64::from(req.len)
            };
            let Some(share) = self.share(reply).await else {
                return Flow::Stop;
            };
            // INFO says whether a fill of the replica runs: an engine
            // asks before it freezes anything for a rebuild the replica
            // would refuse (see `join_refused`).
            let filling = req.op == Op::Info && self.server.fill_progress(&name).is_some();
            let tx = self.tx.clone();
            tokio::task::spawn_blocking(move || {
                let reply = execute(&replica, &req, payload, filling);
                let _ = tx.blocking_send(Queued {
                    reply,
                    _share: Some(share),
                });
            });
        } else if matches!(req.op, Op::Write | Op::Trim)
            && req.flags & FLAG_FUA == 0
            && self.queued.load(std::sync::atomic::Ordering::SeqCst) == 0
            && let Some(_turn) = self.server.inline.take()
        {
            self.answered.push(execute(&replica, &req, payload, false));
        } else {
            let Some(share) = self.share(payload.len() as u64).await else {
                return Flow::Stop;
            };
            self.queued
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if self
                .mtx
                .send((replica, req, payload, Some(share)))
                .await
                .is_err()
            {
                return Flow::Stop;
            }
        }
        Flow::Go
    }
}

/// Sends the replies gathered by the connection's task, in one flush.
async fn send_answered(
    wr: &tokio::sync::Mutex<tokio::io::BufWriter<Writer>>,
    answered: &mut Vec<(Response, Vec<u8>)>,
) -> std::io::Result<()> {
    if answered.is_empty() {
        return Ok(());
    }
    let mut w = wr.lock().await;
    for (resp, body) in answered.drain(..) {
        w.write_all(&resp.encode()).await?;
        w.write_all(&body).await?;
    }
    w.flush().await
}

/// What OPEN binds: the replica's copy as `Replicas::find_kept` found it
/// (`Connection::bound_at`), whether it keeps sums, its volume and its
/// fence.
type Bound = (
    (Shared, u64, bool),
    bool,
    String,
    Arc<std::sync::atomic::AtomicU64>,
);

/// Why an engine of attachment `claimed` may not change replica `name`.
fn fenced(name: &str, claimed: u64, latest: u64) -> String {
    format!(
        "replica {name} was opened for attachment {latest} of its volume: the engine of attachment {claimed} may not change it"
    )
}

fn ok_empty(id: u64) -> Response {
    Response {
        status: status::OK,
        id,
        len: 0,
    }
}

fn ok_json(id: u64, value: &impl serde::Serialize) -> (Response, Vec<u8>) {
    match serde_json::to_vec(value) {
        Ok(body) => (
            Response {
                status: status::OK,
                id,
                len: body.len() as u32,
            },
            body,
        ),
        Err(e) => error(id, status::IO, &e.to_string()),
    }
}

fn error(id: u64, code: u32, message: &str) -> (Response, Vec<u8>) {
    reply_error(id, code, message, None)
}

/// The reply to a replica's error: for data that failed its checksum, it
/// says where.
fn replica_error(id: u64, e: &crate::replica::ReplicaError) -> (Response, Vec<u8>) {
    reply_error(id, status_of(e), &e.to_string(), e.corruption().as_ref())
}

fn reply_error(
    id: u64,
    code: u32,
    message: &str,
    corruption: Option<&crate::replica::Corruption>,
) -> (Response, Vec<u8>) {
    let body = crate::wire::protocol::error_body(code, message, corruption);
    (
        Response {
            status: code,
            id,
            len: body.len() as u32,
        },
        body,
    )
}

/// Runs one request against the replica; `filling`: a fill of it runs
/// (for INFO).
fn execute(
    replica: &RwLock<Replica>,
    req: &Request,
    payload: bytes::Bytes,
    filling: bool,
) -> Reply {
    let poisoned = || error(req.id, status::IO, "replica lock poisoned");
    let done = match req.op {
        Op::Read
        | Op::Flush
        | Op::Info
        | Op::Layers
        | Op::WriteLog
        | Op::LayerExtents
        | Op::LayerRead
        | Op::LayerSums
        | Op::RecentRuns
        | Op::ViewSums => match replica.read() {
            Ok(r) => read_op(&r, req, filling),
            Err(_) => return poisoned(),
        },
        Op::Write
        | Op::Trim
        | Op::Snapshot
        | Op::Join
        | Op::Grow
        | Op::Lose
        | Op::SumsEveryFlush => match replica.write() {
            Ok(mut r) => write_op(&mut r, req, &payload),
            Err(_) => return poisoned(),
        },
        // Chunk by chunk, the lock taken only to choose each chunk and to
        // keep its digest (writes pass while it is read).
        Op::Warm => match crate::replica::warm(replica) {
            Ok(()) => Ok(Vec::new()),
            Err(Some(e)) => Err(e),
            Err(None) => return poisoned(),
        },
        Op::Open | Op::Fill | Op::Lend | Op::Ping => {
            return error(req.id, status::INVALID, "handled by the connection");
        }
    };
    match done {
        Ok(body) => (
            Response {
                status: status::OK,
                id: req.id,
                len: body.len() as u32,
            },
            body,
        ),
        Err(e) => replica_error(req.id, &e),
    }
}

fn json(value: &impl serde::Serialize) -> Result<Vec<u8>, ReplicaError> {
    serde_json::to_vec(value).map_err(|e| ReplicaError::Invalid(e.to_string()))
}

/// What needs the replica shared: reads, flush, and what describes it. A
/// block found corrupt is marked where the replica is kept.
fn read_op(r: &Replica, req: &Request, filling: bool) -> Result<Vec<u8>, ReplicaError> {
    let read = |layer: Option<&str>| {
        let mut buf = vec![0u8; req.len as usize];
        match layer {
            None => r.read(req.offset, &mut buf),
            Some(l) => r.read_layer(l, req.offset, &mut buf),
        }
        .map(|()| buf)
    };
    let out = match req.op {
        Op::Read => read(None),
        Op::Flush => r.flush().map(|()| Vec::new()),
        Op::Info => json(&serde_json::json!({
            "size": r.size(), "chain": r.chain(), "revision": r.revision(),
            "pending": r.pending().len(), "suspect": r.suspects(), "filling": filling,
            "suspect_sums": r.suspect_sums().iter().collect::<Vec<_>>(),
            "sums_every_flush": r.sums_every_flush(),
            "last_freeze": { "read_ahead": r.last_freeze().0, "read": r.last_freeze().1 }
        })),
        Op::Layers => json(&r.layers()),
        Op::WriteLog => json(&r.writes_since(req.offset)),
        Op::LayerExtents => {
            let layer = r.layer_name_at(req.revision)?;
            r.layer_extents(&layer).and_then(|x| json(&x))
        }
        Op::LayerRead => {
            let layer = r.layer_name_at(req.revision)?;
            read(Some(&layer))
        }
        Op::LayerSums => {
            let layer = r.layer_name_at(req.revision)?;
            r.layer_sums(&layer, req.offset, u64::from(req.len))
        }
        Op::RecentRuns => json(&r.recent_runs()),
        Op::ViewSums => r.view_sums(req.offset, u64::from(req.len)),
        _ => Err(ReplicaError::Invalid(format!("{:?} is not a read", req.op))),
    };
    if let Err(e) = &out {
        r.note_corruption(e);
    }
    out
}

/// What changes the replica: writes, trims (made durable first under
/// FUA), snapshots and a rebuild's join.
fn write_op(r: &mut Replica, req: &Request, payload: &[u8]) -> Result<Vec<u8>, ReplicaError> {
    match req.op {
        Op::Write | Op::Trim => {
            let rev = (req.revision != 0).then_some(req.revision);
            if req.op == Op::Write && req.flags & FLAG_SUMS != 0 {
                let (data, sums) = payload.split_at(req.len as usize);
                r.write_summed(req.offset, data, sums, rev)?;
            } else if req.op == Op::Write {
                r.write(req.offset, payload, rev)?;
            } else {
                let zeroes = req.flags & FLAG_ZEROES != 0;
                r.discard(req.offset, u64::from(req.len), rev, zeroes)?;
            }
            if req.flags & FLAG_FUA != 0 {
                r.flush()?;
            }
            Ok(Vec::new())
        }
        Op::Snapshot if req.flags & FLAG_LOSE != 0 => {
            let spec: LoseSpec = serde_json::from_slice(payload)
                .map_err(|e| ReplicaError::Invalid(format!("snapshot: {e}")))?;
            r.snapshot_losing(spec.label.as_deref(), &spec.lose)
                .map(String::into_bytes)
        }
        Op::Snapshot => {
            let label = std::str::from_utf8(payload)
                .map_err(|_| ReplicaError::Invalid("a snapshot label is not UTF-8".into()))?;
            r.snapshot((!label.is_empty()).then_some(label))
                .map(String::into_bytes)
        }
        Op::Grow => r.grow(req.offset).map(|()| Vec::new()),
        Op::SumsEveryFlush => r.set_sums_every_flush(req.offset != 0).map(|_| Vec::new()),
        Op::Lose => {
            let layer = r.layer_name_at(req.revision)?;
            r.lose_frozen_block(&layer, req.offset)
                .and_then(|lost| json(&lost))
        }
        Op::Join => {
            let j: JoinSpec = serde_json::from_slice(payload)
                .map_err(|e| ReplicaError::Invalid(format!("join: {e}")))?;
            json(&r.join(&j.frozen, &j.head, j.revision)?)
        }
        _ => Err(ReplicaError::Invalid(format!(
            "{:?} is not a write",
            req.op
        ))),
    }
}
