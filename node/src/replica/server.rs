//! The replica server: serves the replicas on this node's disks over the
//! replica data protocol. A connection first OPENs a replica by name. Its
//! reads run in parallel on blocking threads; its mutations apply one at a
//! time in arrival order (plain writes on the connection's own task, those
//! that sync on a thread of their own); replies go back as they finish. A
//! FILL (a rebuild's copy, see `crate::sync`) runs beside the rest. It also
//! keeps the registry of open replicas, fails those of a lost disk, and
//! reports the progress of fills.
//!
//! A replica on the engine's own node is lent to it (LEND): the engine then
//! reads and writes the files itself, and the server refuses every other
//! read and mutation of that replica until the loan ends. What it still
//! serves of it (INFO, LAYERS, and the frozen layers a rebuild copies) it
//! reads from the files afresh. The loan ends when the engine gives the
//! replica back or its connection closes, and the server ends it when the
//! replica's disk is lost.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::protocol::{
    FLAG_FUA, FLAG_RETURN, FLAG_ZEROES, FrameError, Op, REQUEST_HEADER, Request, Response, status,
};
use super::{LayerInfo, LayerSpec, META_FILE, Replica, ReplicaError};
use crate::sync::{FillReport, Progress, SyncError};

/// What a JOIN carries.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct JoinSpec {
    pub frozen: Vec<LayerSpec>,
    pub head: String,
    pub revision: u64,
}

impl JoinSpec {
    /// The join that follows the source's chain: its frozen layers, and a new
    /// head named as the source's.
    pub fn following(layers: &[LayerInfo], revision: u64) -> Result<JoinSpec, String> {
        let (head, frozen) = layers.split_last().ok_or("the source has no layers")?;
        let frozen = frozen
            .iter()
            .map(|l| {
                Ok(LayerSpec {
                    name: l.name.clone(),
                    checksum: l
                        .checksum
                        .clone()
                        .ok_or_else(|| format!("layer {} has no checksum", l.name))?,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(JoinSpec {
            frozen,
            head: head.name.clone(),
            revision,
        })
    }
}

/// An open replica, shared by the connections that use it.
pub type Shared = Arc<RwLock<Replica>>;

/// Socket buffers: large enough for a 64 KiB request or reply and its header.
pub const IO_BUFFER: usize = 256 * 1024;

/// Serves every replica found under `<disk>/replicas/` of its disks.
pub struct ReplicaServer {
    disks: Vec<PathBuf>,
    open: Mutex<HashMap<String, Shared>>,
    /// Fills under way, by target replica.
    fills: Mutex<HashMap<String, Arc<Progress>>>,
    /// Disks found not ready: their replicas fail.
    failed_disks: Mutex<std::collections::HashSet<PathBuf>>,
    /// Replicas lent to their engine, by name. Locked after `open` when
    /// both are needed.
    lent: Mutex<HashMap<String, Loan>>,
    next_loan: std::sync::atomic::AtomicU64,
    /// The replicas' writeback mark (see `Replica::set_writeback_every`).
    writeback_every: u64,
}

/// A loan as the borrowing connection holds it; dropping it ends it.
struct Held {
    server: Arc<ReplicaServer>,
    name: String,
    id: u64,
    revoke: Arc<tokio::sync::Notify>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.server.give_back(&self.name, self.id);
    }
}

/// A replica lent to an engine.
struct Loan {
    id: u64,
    dir: PathBuf,
    /// Woken when the server ends the loan (the disk was lost): the
    /// engine's connection is closed.
    revoke: Arc<tokio::sync::Notify>,
}

/// Where a replica named `name` lives on `disk`.
pub fn replica_dir(disk: &std::path::Path, name: &str) -> PathBuf {
    disk.join("replicas").join(name)
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && !name.starts_with('.')
}

impl ReplicaServer {
    pub fn new(disks: Vec<PathBuf>) -> Arc<Self> {
        Self::with_writeback(disks, super::WRITEBACK_EVERY)
    }

    /// Like `new`, starting each head's writeback after `writeback_every`
    /// bytes written (0: left to the kernel).
    pub fn with_writeback(disks: Vec<PathBuf>, writeback_every: u64) -> Arc<Self> {
        Arc::new(ReplicaServer {
            writeback_every,
            disks,
            open: Mutex::new(HashMap::new()),
            fills: Mutex::new(HashMap::new()),
            failed_disks: Mutex::new(Default::default()),
            lent: Mutex::new(HashMap::new()),
            next_loan: std::sync::atomic::AtomicU64::new(1),
        })
    }

    /// Whether `name` is lent to its engine.
    pub fn is_lent(&self, name: &str) -> bool {
        self.lent
            .lock()
            .map(|l| l.contains_key(name))
            .unwrap_or(true)
    }

    /// Lends `name` to an engine; returns the loan's number and what ends
    /// it early. The server's own copy of the replica is dropped: it is
    /// opened afresh from the files once the loan ends.
    fn lend(&self, name: &str) -> Result<(u64, Arc<tokio::sync::Notify>), String> {
        let replica = self.find(name)?;
        let dir = replica
            .read()
            .map_err(|_| "replica lock poisoned".to_string())?
            .dir()
            .to_path_buf();
        let mut open = self
            .open
            .lock()
            .map_err(|_| "registry poisoned".to_string())?;
        let mut lent = self
            .lent
            .lock()
            .map_err(|_| "registry poisoned".to_string())?;
        if lent.contains_key(name) {
            return Err(format!("replica {name} is already lent to an engine"));
        }
        let id = self
            .next_loan
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let revoke = Arc::new(tokio::sync::Notify::new());
        lent.insert(
            name.to_string(),
            Loan {
                id,
                dir,
                revoke: revoke.clone(),
            },
        );
        open.remove(name);
        tracing::info!(replica = name, loan = id, "replica lent to its engine");
        Ok((id, revoke))
    }

    /// Ends loan `id` of `name` (if it is still the current one).
    fn give_back(&self, name: &str, id: u64) {
        if let Ok(mut lent) = self.lent.lock()
            && lent.get(name).is_some_and(|l| l.id == id)
        {
            lent.remove(name);
            tracing::info!(replica = name, loan = id, "replica given back");
        }
    }

    /// The open replica called `name`, opening it on first use.
    pub fn find(&self, name: &str) -> Result<Shared, String> {
        if !valid_name(name) {
            return Err(format!("{name:?} is not a replica name"));
        }
        let mut open = self
            .open
            .lock()
            .map_err(|_| "registry poisoned".to_string())?;
        if let Some(r) = open.get(name) {
            if let Some(why) = r.read().ok().and_then(|r| r.broken().map(str::to_string)) {
                return Err(why);
            }
            return Ok(r.clone());
        }
        // A lent replica changes under the server: it is opened afresh for
        // each use and never kept.
        let lent = self.is_lent(name);
        let failed = self
            .failed_disks
            .lock()
            .map_err(|_| "registry poisoned".to_string())?
            .clone();
        let dir = self
            .disks
            .iter()
            .filter(|d| !failed.contains(*d))
            .map(|d| replica_dir(d, name))
            .find(|d| d.join(META_FILE).exists())
            .ok_or_else(|| format!("no replica {name} on this node"))?;
        // Lent, the engine owns its files: a view writes nothing to them.
        let opened = if lent {
            Replica::open_view(&dir)
        } else {
            Replica::open(&dir)
        };
        let mut opened = opened.map_err(|e| e.to_string())?;
        opened.set_writeback_every(self.writeback_every);
        let r = Arc::new(RwLock::new(opened));
        if !lent {
            open.insert(name.to_string(), r.clone());
        }
        Ok(r)
    }

    /// The directory of replica `name` on this node's disks.
    pub fn dir_of(&self, name: &str) -> Result<PathBuf, String> {
        if !valid_name(name) {
            return Err(format!("{name:?} is not a replica name"));
        }
        self.disks
            .iter()
            .map(|d| replica_dir(d, name))
            .find(|d| d.join(META_FILE).exists())
            .ok_or_else(|| format!("no replica {name} on this node"))
    }

    /// Scrubs replica `name` (see `Replica::scrub`) at most
    /// `bytes_per_second`; a corrupt layer is marked, for the server's open
    /// replica too. Returns the bytes checked, or what is corrupt.
    pub async fn scrub(&self, name: &str, bytes_per_second: u64) -> Result<u64, ReplicaError> {
        let dir = self.dir_of(name).map_err(ReplicaError::Invalid)?;
        let rate = bytes_per_second.max(1 << 20);
        let at = dir.clone();
        let scrubbed = tokio::task::spawn_blocking(move || {
            let start = std::time::Instant::now();
            let mut read = 0u64;
            Replica::scrub(&at, |n| {
                read += n;
                let due = std::time::Duration::from_secs_f64(read as f64 / rate as f64);
                if let Some(ahead) = due.checked_sub(start.elapsed()) {
                    std::thread::sleep(ahead);
                }
            })
        })
        .await
        .map_err(|e| ReplicaError::Invalid(e.to_string()))?;
        if let Err(e) = &scrubbed
            && let Some(layer) = super::corrupt_layer(e)
        {
            match self.open.lock().ok().and_then(|o| o.get(name).cloned()) {
                Some(r) => {
                    if let Ok(r) = r.read() {
                        r.note_corruption(e);
                    }
                }
                None => super::mark_corrupt_in(&dir, layer)?,
            }
        }
        scrubbed
    }

    /// Bytes done and total of the fill of `name`, while one runs.
    pub fn fill_progress(&self, name: &str) -> Option<(u64, u64)> {
        let fills = self.fills.lock().ok()?;
        let p = fills.get(name)?;
        Some((
            p.done.load(std::sync::atomic::Ordering::SeqCst),
            p.total.load(std::sync::atomic::Ordering::SeqCst),
        ))
    }

    /// Fills the pending layers of `target` from `source` (`NAME@ADDR`),
    /// one fill per replica at a time.
    pub async fn fill(&self, target: &str, source: &str) -> Result<FillReport, SyncError> {
        let (src_name, src_addr) = source
            .split_once('@')
            .filter(|(n, a)| !n.is_empty() && !a.is_empty())
            .ok_or_else(|| {
                SyncError::Source(format!("fill source {source:?}: expected NAME@HOST:PORT"))
            })?;
        let replica = self.find(target).map_err(SyncError::Source)?;
        let progress = Arc::new(Progress::default());
        {
            let mut fills = self
                .fills
                .lock()
                .map_err(|_| SyncError::Source("registry poisoned".into()))?;
            if fills.contains_key(target) {
                return Err(SyncError::Source(format!(
                    "{target} is already being filled"
                )));
            }
            fills.insert(target.to_string(), progress.clone());
        }
        let done = crate::sync::fill(self, target, replica, src_name, src_addr, progress).await;
        if let Ok(mut fills) = self.fills.lock() {
            fills.remove(target);
        }
        done
    }

    /// Fails every open replica under `disk`, and refuses to open more
    /// there: the disk is gone or is not the one it was.
    pub fn fail_disk(&self, disk: &std::path::Path, why: &str) {
        if let Ok(mut failed) = self.failed_disks.lock()
            && !failed.insert(disk.to_path_buf())
        {
            return;
        }
        let Ok(open) = self.open.lock() else {
            return;
        };
        if let Ok(mut lent) = self.lent.lock() {
            lent.retain(|name, loan| {
                let keep = !loan.dir.starts_with(disk);
                if !keep {
                    tracing::warn!(replica = %name, disk = %disk.display(), why, "disk lost; ending the replica's loan to its engine");
                    loan.revoke.notify_one();
                }
                keep
            });
        }
        for (name, r) in open.iter() {
            if let Ok(mut r) = r.write()
                && r.dir().starts_with(disk)
            {
                tracing::warn!(replica = %name, disk = %disk.display(), why, "disk lost; failing the replica");
                r.break_off(format!("disk {} is not ready: {why}", disk.display()));
            }
        }
    }

    /// A disk found ready again: replicas there open afresh from their
    /// files on next use (the failed ones stay closed, and an engine that
    /// dropped them rebuilds them as reused replicas).
    pub fn restore_disk(&self, disk: &std::path::Path) {
        let was_failed = self
            .failed_disks
            .lock()
            .map(|mut f| f.remove(disk))
            .unwrap_or(false);
        if !was_failed {
            return;
        }
        tracing::info!(disk = %disk.display(), "disk ready again");
        if let Ok(mut open) = self.open.lock() {
            open.retain(|_, r| {
                r.read()
                    .map(|r| !r.dir().starts_with(disk))
                    .unwrap_or(false)
            });
        }
    }

    /// Forgets an open replica (after it was deleted).
    pub fn close(&self, name: &str) {
        if let Ok(mut open) = self.open.lock() {
            open.remove(name);
        }
    }

    /// Accepts connections until the listener fails or the task is dropped.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    let server = self.clone();
                    tokio::spawn(async move {
                        if let Err(e) = server.connection(stream).await {
                            tracing::debug!(%peer, error = %e, "replica connection ended");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "replica listener failed");
                    return;
                }
            }
        }
    }

    async fn connection(self: Arc<Self>, stream: TcpStream) -> std::io::Result<()> {
        let (rd, wr) = stream.into_split();
        let mut rd = crate::bufio::FrameReader::new(rd, IO_BUFFER);
        let (tx, mut rx) = mpsc::channel::<(Response, Vec<u8>)>(256);
        // The socket's write half is shared: the writer task sends the
        // replies of reads and queued mutations; this task sends the replies
        // of the writes it applies itself, gathered until it would wait for
        // the next request (no hand-off to another task).
        let wr = Arc::new(tokio::sync::Mutex::new(
            tokio::io::BufWriter::with_capacity(IO_BUFFER, wr),
        ));
        let writer_half = wr.clone();
        let writer = tokio::spawn(async move {
            // Replies queued together leave in one write.
            while let Some(first) = rx.recv().await {
                let mut wr = writer_half.lock().await;
                let mut next = Some(first);
                while let Some((resp, body)) = next {
                    if wr.write_all(&resp.encode()).await.is_err()
                        || wr.write_all(&body).await.is_err()
                    {
                        return;
                    }
                    next = rx.try_recv().ok();
                }
                if wr.flush().await.is_err() {
                    return;
                }
            }
        });
        let mut answered: Vec<(Response, Vec<u8>)> = Vec::new();
        let mut bound: Option<(String, Shared)> = None;
        // The loan this connection's engine holds (ended when dropped,
        // however the connection ends).
        let mut loan: Option<Held> = None;
        // Mutations run one at a time, in the order they arrived, so that
        // every replica applies an engine's writes in the engine's order.
        // Reads run in parallel. A plain write or trim (no FUA) that finds
        // no mutation queued is applied right here, without a thread hop (a
        // write into the page cache is short); one that must sync, or that
        // would overtake a queued one, goes to the mutator thread.
        let (mtx, mut mrx) = mpsc::channel::<(Shared, Request, bytes::Bytes)>(256);
        let mtx_reply = tx.clone();
        let queued = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let done = queued.clone();
        let mutator = tokio::task::spawn_blocking(move || {
            while let Some((replica, req, payload)) = mrx.blocking_recv() {
                let reply = execute(&replica, &req, payload);
                done.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                if mtx_reply.blocking_send(reply).is_err() {
                    break;
                }
            }
        });
        let result = loop {
            // Before waiting for more bytes, send what was answered.
            if rd.buffered() < REQUEST_HEADER {
                send_answered(&wr, &mut answered).await?;
            }
            let mut head = [0u8; REQUEST_HEADER];
            let got = match &loan {
                // A revoked loan closes the connection: the engine sees it
                // and asks again, and is refused.
                Some(held) => tokio::select! {
                    got = rd.read_exact(&mut head) => got,
                    () = held.revoke.notified() => break Ok(()),
                },
                None => rd.read_exact(&mut head).await,
            };
            if let Err(e) = got {
                break if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    Ok(())
                } else {
                    Err(e)
                };
            }
            let req = match Request::decode(&head) {
                Ok(r) => r,
                Err(FrameError::Magic(m)) => {
                    break Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("bad magic {m:#x}"),
                    ));
                }
                Err(FrameError::Refused { id, reason }) => {
                    // The payload's length is not to be trusted: answer, then close.
                    let _ = tx.send(error(id, status::INVALID, &reason)).await;
                    break Ok(());
                }
            };
            if rd.buffered() < req.payload_len() {
                send_answered(&wr, &mut answered).await?;
            }
            let payload = rd.payload(req.payload_len()).await?;
            if req.op == Op::Open {
                let name = String::from_utf8_lossy(&payload).into_owned();
                let reply = match self.find(&name) {
                    Ok(r) => {
                        bound = Some((name, r));
                        (
                            Response {
                                status: status::OK,
                                id: req.id,
                                len: 0,
                            },
                            Vec::new(),
                        )
                    }
                    Err(e) => error(req.id, status::NOT_FOUND, &e),
                };
                if tx.send(reply).await.is_err() {
                    break Ok(());
                }
                continue;
            }
            let Some((name, replica)) = bound.clone() else {
                if tx
                    .send(error(
                        req.id,
                        status::NOT_FOUND,
                        "no replica opened on this connection",
                    ))
                    .await
                    .is_err()
                {
                    break Ok(());
                }
                continue;
            };
            if req.op == Op::Lend {
                let reply = if req.flags & FLAG_RETURN != 0 {
                    loan = None;
                    (ok_empty(req.id), Vec::new())
                } else if loan.is_some() {
                    (ok_empty(req.id), Vec::new())
                } else if queued.load(std::sync::atomic::Ordering::SeqCst) > 0 {
                    error(req.id, status::BUSY, "mutations are still in flight")
                } else {
                    match self.lend(&name) {
                        Ok((id, revoke)) => {
                            loan = Some(Held {
                                server: self.clone(),
                                name: name.clone(),
                                id,
                                revoke,
                            });
                            (ok_empty(req.id), Vec::new())
                        }
                        Err(e) => error(req.id, status::BUSY, &e),
                    }
                };
                // Replies of writes applied before it go first.
                send_answered(&wr, &mut answered).await?;
                if tx.send(reply).await.is_err() {
                    break Ok(());
                }
                continue;
            }
            let fresh = matches!(req.op, Op::Info | Op::Layers | Op::WriteLog);
            let from_files = fresh || matches!(req.op, Op::LayerExtents | Op::LayerRead);
            if !from_files && self.is_lent(&name) {
                let why = format!("replica {name} is lent to its engine");
                if tx.send(error(req.id, status::BUSY, &why)).await.is_err() {
                    break Ok(());
                }
                continue;
            }
            // What is lent is read from its files as they are now.
            let replica = if fresh && self.is_lent(&name) {
                match self.find(&name) {
                    Ok(r) => r,
                    Err(e) => {
                        if tx.send(error(req.id, status::NOT_FOUND, &e)).await.is_err() {
                            break Ok(());
                        }
                        continue;
                    }
                }
            } else {
                replica
            };
            if req.op == Op::Fill {
                // Long: it runs beside the connection's other requests.
                let (tx, server) = (tx.clone(), self.clone());
                tokio::spawn(async move {
                    let source = String::from_utf8_lossy(&payload).into_owned();
                    let reply = match server.fill(&name, &source).await {
                        Ok(report) => ok_json(req.id, &report),
                        Err(e @ SyncError::SourceCorrupt(_)) => {
                            error(req.id, status::CORRUPT, &e.to_string())
                        }
                        Err(e) => error(req.id, status::IO, &e.to_string()),
                    };
                    let _ = tx.send(reply).await;
                });
            } else if matches!(
                req.op,
                Op::Read | Op::Info | Op::Layers | Op::LayerExtents | Op::LayerRead | Op::WriteLog
            ) {
                let tx = tx.clone();
                tokio::task::spawn_blocking(move || {
                    let reply = execute(&replica, &req, payload);
                    let _ = tx.blocking_send(reply);
                });
            } else if matches!(req.op, Op::Write | Op::Trim)
                && req.flags & FLAG_FUA == 0
                && queued.load(std::sync::atomic::Ordering::SeqCst) == 0
            {
                answered.push(execute(&replica, &req, payload));
            } else {
                queued.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if mtx.send((replica, req, payload)).await.is_err() {
                    break Ok(());
                }
            }
        };
        drop(loan);
        let _ = send_answered(&wr, &mut answered).await;
        drop(mtx);
        let _ = mutator.await;
        drop(tx);
        let _ = writer.await;
        result
    }
}

/// Sends the replies gathered by the connection's task, in one flush.
async fn send_answered(
    wr: &tokio::sync::Mutex<tokio::io::BufWriter<tokio::net::tcp::OwnedWriteHalf>>,
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
    let body = message.as_bytes().to_vec();
    (
        Response {
            status: code,
            id,
            len: body.len() as u32,
        },
        body,
    )
}

/// Runs one request against the replica.
fn execute(replica: &RwLock<Replica>, req: &Request, payload: bytes::Bytes) -> (Response, Vec<u8>) {
    let ok = |body: Vec<u8>| {
        (
            Response {
                status: status::OK,
                id: req.id,
                len: body.len() as u32,
            },
            body,
        )
    };
    let fail = |e: ReplicaError| error(req.id, e.status(), &e.to_string());
    let poisoned = || error(req.id, status::IO, "replica lock poisoned");
    match req.op {
        Op::Read => {
            let Ok(r) = replica.read() else {
                return poisoned();
            };
            let mut buf = vec![0u8; req.len as usize];
            match r.read(req.offset, &mut buf) {
                Ok(()) => ok(buf),
                Err(e) => {
                    r.note_corruption(&e);
                    fail(e)
                }
            }
        }
        Op::Write | Op::Trim => {
            let Ok(mut r) = replica.write() else {
                return poisoned();
            };
            let rev = (req.revision != 0).then_some(req.revision);
            let done = if req.op == Op::Write {
                r.write(req.offset, &payload, rev)
            } else {
                r.discard(
                    req.offset,
                    u64::from(req.len),
                    rev,
                    req.flags & FLAG_ZEROES != 0,
                )
            };
            // FUA: make this write durable before answering.
            let done = done.and_then(|()| {
                if req.flags & FLAG_FUA != 0 {
                    r.flush()
                } else {
                    Ok(())
                }
            });
            match done {
                Ok(()) => ok(Vec::new()),
                Err(e) => fail(e),
            }
        }
        Op::Flush => {
            let Ok(r) = replica.read() else {
                return poisoned();
            };
            match r.flush() {
                Ok(()) => ok(Vec::new()),
                Err(e) => fail(e),
            }
        }
        Op::Info => {
            let Ok(r) = replica.read() else {
                return poisoned();
            };
            let info = serde_json::json!({"size": r.size(), "chain": r.chain(), "revision": r.revision(), "pending": r.pending().len()});
            ok(info.to_string().into_bytes())
        }
        Op::Snapshot => {
            let Ok(mut r) = replica.write() else {
                return poisoned();
            };
            match r.snapshot() {
                Ok(name) => ok(name.into_bytes()),
                Err(e) => fail(e),
            }
        }
        Op::Layers => {
            let Ok(r) = replica.read() else {
                return poisoned();
            };
            ok_json(req.id, &r.layers())
        }
        Op::WriteLog => {
            let Ok(r) = replica.read() else {
                return poisoned();
            };
            ok_json(req.id, &r.writes_since(req.offset))
        }
        Op::Join => {
            let Ok(mut r) = replica.write() else {
                return poisoned();
            };
            let spec: Result<JoinSpec, _> = serde_json::from_slice(&payload);
            match spec {
                Ok(j) => match r.join(&j.frozen, &j.head, j.revision) {
                    Ok(report) => ok_json(req.id, &report),
                    Err(e) => fail(e),
                },
                Err(e) => error(req.id, status::INVALID, &format!("join: {e}")),
            }
        }
        Op::LayerExtents | Op::LayerRead => {
            let Ok(r) = replica.read() else {
                return poisoned();
            };
            let layer = match r.layer_name_at(req.revision) {
                Ok(l) => l,
                Err(e) => return fail(e),
            };
            if req.op == Op::LayerExtents {
                return match r.layer_extents(&layer) {
                    Ok(x) => ok_json(req.id, &x),
                    Err(e) => fail(e),
                };
            }
            let mut buf = vec![0u8; req.len as usize];
            match r.read_layer(&layer, req.offset, &mut buf) {
                Ok(()) => ok(buf),
                Err(e) => {
                    r.note_corruption(&e);
                    fail(e)
                }
            }
        }
        Op::Open | Op::Fill | Op::Lend => {
            error(req.id, status::INVALID, "handled by the connection")
        }
    }
}
