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

use crate::replica::{LoanGuard, Replica, ReplicaError, Replicas, Shared};
use crate::sync::{Fills, SyncError};
use crate::wire::protocol::{
    FLAG_FUA, FLAG_RETURN, FLAG_ZEROES, FrameError, Op, REQUEST_HEADER, Request, Response, status,
    status_of,
};
use crate::wire::{IO_BUFFER, JoinSpec};

/// Serves the replicas of its table over the replica data protocol.
pub struct ReplicaServer {
    replicas: Arc<Replicas>,
    fills: Fills,
}

impl ReplicaServer {
    pub fn new(disks: Vec<std::path::PathBuf>) -> Arc<Self> {
        Self::serving(Replicas::new(disks))
    }

    /// Serves the replicas of `replicas`.
    pub fn serving(replicas: Arc<Replicas>) -> Arc<Self> {
        Arc::new(ReplicaServer {
            replicas,
            fills: Fills::default(),
        })
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
    ) -> Result<crate::sync::FillReport, SyncError> {
        self.fills.run(&self.replicas, target, source).await
    }

    /// Bytes done and total of the fill of `name`, while one runs.
    pub fn fill_progress(&self, name: &str) -> Option<(u64, u64)> {
        self.fills.progress(name)
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
        let mut loan: Option<LoanGuard> = None;
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
                let reply = match self.replicas.find(&name) {
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
                    match self.replicas.lend(&name) {
                        Ok(guard) => {
                            loan = Some(guard);
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
            if !from_files && self.replicas.is_lent(&name) {
                let why = format!("replica {name} is lent to its engine");
                if tx.send(error(req.id, status::BUSY, &why)).await.is_err() {
                    break Ok(());
                }
                continue;
            }
            // What is lent is read from its files as they are now.
            let replica = if fresh && self.replicas.is_lent(&name) {
                match self.replicas.find(&name) {
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
    let fail = |e: ReplicaError| error(req.id, status_of(&e), &e.to_string());
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
