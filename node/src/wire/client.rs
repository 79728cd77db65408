//! A client of the replica data protocol, used by the engine: pipelined
//! requests over one TCP connection, matched to replies by id.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use crate::replica::Corruption;

use super::protocol::{FLAG_LOSE, Op, RESPONSE_HEADER, Request, Response, status};
use super::tls::WireTls;

#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    #[error("replica {addr}: connection lost: {reason}")]
    Closed { addr: String, reason: String },
    #[error("replica {addr}: {message} (status {status})")]
    Failed {
        addr: String,
        status: u32,
        message: String,
        /// Where the data failed, for a CORRUPT reply that says.
        corruption: Option<Corruption>,
    },
}

impl ClientError {
    /// A refusal that names no corrupt data.
    pub fn failed(addr: &str, status: u32, message: impl Into<String>) -> Self {
        ClientError::Failed {
            addr: addr.to_string(),
            status,
            message: message.into(),
            corruption: None,
        }
    }

    /// A replica's error reply, as its status and body carry it.
    pub fn of_reply(addr: &str, status: u32, body: &[u8]) -> Self {
        let (message, corruption) = super::protocol::read_error_body(status, body);
        ClientError::Failed {
            addr: addr.to_string(),
            status,
            message,
            corruption,
        }
    }

    /// The error of a replica's files, as its server would reply it.
    pub fn of_replica(addr: &str, e: &crate::replica::ReplicaError) -> Self {
        ClientError::Failed {
            addr: addr.to_string(),
            status: super::protocol::status_of(e),
            message: e.to_string(),
            corruption: e.corruption(),
        }
    }

    /// Data failed its checksum at the replica (for a FILL: at the source).
    pub fn is_corrupt(&self) -> bool {
        matches!(
            self,
            ClientError::Failed {
                status: super::protocol::status::CORRUPT,
                ..
            }
        )
    }

    /// Where the data failed, when the replica said.
    pub fn corruption(&self) -> Option<&Corruption> {
        match self {
            ClientError::Failed {
                status: super::protocol::status::CORRUPT,
                corruption,
                ..
            } => corruption.as_ref(),
            _ => None,
        }
    }

    /// The block was lost (no replica held it sound): it fails in every
    /// replica, and there is nothing to repair it from.
    pub fn is_lost(&self) -> bool {
        self.corruption().is_some_and(|c| c.lost)
    }

    /// Where in the volume the block lies whose checksum failed, when the
    /// replica named one.
    pub fn corrupt_at(&self) -> Option<u64> {
        self.corruption().and_then(|c| c.at)
    }

    /// The replica refused for now (a join while a fill of it ends).
    pub fn is_busy(&self) -> bool {
        matches!(
            self,
            ClientError::Failed {
                status: super::protocol::status::BUSY,
                ..
            }
        )
    }

    /// The replica's disk is full: it holds what it held, the write did
    /// not fit.
    pub fn is_no_space(&self) -> bool {
        matches!(
            self,
            ClientError::Failed {
                status: super::protocol::status::NO_SPACE,
                ..
            }
        )
    }
}

/// What to do with a reply: wake a waiting task, or run a callback right
/// where the reply was read (no task hand-off).
pub enum Waiter {
    Task(oneshot::Sender<Result<bytes::Bytes, ClientError>>),
    Callback(Box<dyn FnOnce(Result<bytes::Bytes, ClientError>) + Send>),
}

impl Waiter {
    fn finish(self, r: Result<bytes::Bytes, ClientError>) {
        match self {
            Waiter::Task(tx) => {
                let _ = tx.send(r);
            }
            Waiter::Callback(f) => f(r),
        }
    }
}

/// A request that waits for its reply: who gets the reply, and, for the
/// volume's own I/O (READ, WRITE, TRIM, FLUSH), when it was sent (see
/// `ReplicaClient::stalled_for`).
struct Outstanding {
    waiter: Waiter,
    io_since: Option<std::time::Instant>,
}

type Pending = Arc<std::sync::Mutex<HashMap<u64, Outstanding>>>;

/// Whether the connection is gone, and who waits for it to go.
#[derive(Default)]
struct Ended {
    flag: AtomicBool,
    notify: tokio::sync::Notify,
}

impl Ended {
    /// Returns once the flag is set (at once if it is already).
    async fn wait(&self) {
        let ended = self.notify.notified();
        tokio::pin!(ended);
        ended.as_mut().enable();
        if self.flag.load(Ordering::SeqCst) {
            return;
        }
        ended.await;
    }
}

/// Marks the connection closed, then fails every request still waiting.
/// (A request registered after this sees the flag and fails at once.)
fn close_all(closed: &Ended, pending: &Pending, addr: &str, reason: &str) {
    closed.flag.store(true, Ordering::SeqCst);
    closed.notify.notify_waiters();
    let waiting: Vec<Waiter> = match pending.lock() {
        Ok(mut m) => m.drain().map(|(_, o)| o.waiter).collect(),
        Err(_) => Vec::new(),
    };
    // Run outside the lock: a callback may submit again.
    for w in waiting {
        w.finish(Err(ClientError::Closed {
            addr: addr.to_string(),
            reason: reason.to_string(),
        }));
    }
}

/// A request on its way out: its header and its payload, shared with the
/// other replicas' frames of the same write.
struct Frame {
    head: [u8; super::protocol::REQUEST_HEADER],
    payload: bytes::Bytes,
    /// A write's block checksums (FLAG_SUMS), or empty.
    sums: bytes::Bytes,
}

/// Every frame of `batch`, headers and payloads, as slices of where they
/// are (uncopied), in order.
fn frame_slices(batch: &[Frame]) -> Vec<std::io::IoSlice<'_>> {
    let mut slices = Vec::with_capacity(batch.len() * 3);
    for f in batch {
        slices.push(std::io::IoSlice::new(&f.head));
        for part in [&f.payload, &f.sums] {
            if !part.is_empty() {
                slices.push(std::io::IoSlice::new(part));
            }
        }
    }
    slices
}

/// `first` and what queued behind it (up to 64 frames), into `batch`:
/// frames queued together leave in one vectored write.
fn take_batch(first: Frame, frames: &mut mpsc::UnboundedReceiver<Frame>, batch: &mut Vec<Frame>) {
    batch.push(first);
    while batch.len() < 64 {
        match frames.try_recv() {
            Ok(f) => batch.push(f),
            Err(_) => break,
        }
    }
}

/// Writes every frame of `batch`, headers and payloads, with vectored
/// writes, then flushes. The flush matters over TLS: a write that finds
/// the socket full leaves the tail of its records inside the TLS session,
/// and only a flush (or a later write) sends them. Without it the last
/// frame of a burst could wait there for ever, and its request with it.
async fn write_frames<W: tokio::io::AsyncWrite + Unpin + ?Sized>(
    wr: &mut W,
    batch: &[Frame],
) -> std::io::Result<()> {
    let mut slices = frame_slices(batch);
    let mut rest: &mut [std::io::IoSlice] = &mut slices;
    while !rest.is_empty() {
        let n = wr.write_vectored(rest).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        std::io::IoSlice::advance_slices(&mut rest, n);
    }
    wr.flush().await
}

/// How long a sending thread that has sent all it had looks for the next
/// frame before it sleeps (`next_frame`).
const LOOK_FOR: std::time::Duration = std::time::Duration::from_micros(50);

/// The next frame for a sending thread, or `None` once the client is gone.
/// With none queued, the thread looks again for up to `LOOK_FOR`, giving
/// its core to any other task that can run meanwhile (a yield), and only
/// then sleeps until one comes. Under a stream of writes the next frame
/// most often comes within that time, and the engine's task that queues
/// it then has no sleeping thread to wake (a wake-up across the cores,
/// while one of them sits idle, is the pipeline's hand-off). Measured
/// with three replicas (`-- ab=`, data-plane.md): 4k 1.06x and 1.12x the
/// rate, 64k 1.00x to 1.05x, with about the same CPU per write. An idle
/// volume's threads sleep: they look only after a batch. Plain TCP only:
/// over TLS the looking took a core from the sealing (0.91x).
fn next_frame(frames: &mut mpsc::UnboundedReceiver<Frame>) -> Option<Frame> {
    let since = std::time::Instant::now();
    loop {
        match frames.try_recv() {
            Ok(f) => return Some(f),
            Err(mpsc::error::TryRecvError::Disconnected) => return None,
            Err(mpsc::error::TryRecvError::Empty) if since.elapsed() < LOOK_FOR => {
                std::thread::yield_now();
            }
            Err(mpsc::error::TryRecvError::Empty) => return frames.blocking_recv(),
        }
    }
}

/// The sending side of a plain TCP connection, on a thread of its own:
/// takes the frames from `frames` and writes them to `fd` (a descriptor of
/// the connection's socket, non-blocking as tokio set it), batching what
/// queues, until the client ends (its outbox closes) or the connection
/// does. The engine's task that reads a request from NBD hands the
/// replicas' frames to these threads, and the copies into the sockets
/// (with, over loopback, the receiving side's TCP work) run beside its
/// next request instead of after it on the same worker: measured with
/// three replicas, 64k writes, 1.06x – 1.22x the rate (`-- ab=`,
/// data-plane.md). `_wr` is the connection's write half, held so that
/// the socket is not shut down for writing while the thread sends.
/// Returns why it ended; its caller fails what still waits for a reply.
fn send_thread(
    fd: std::os::fd::OwnedFd,
    _wr: super::tls::Writer,
    mut frames: mpsc::UnboundedReceiver<Frame>,
    closed: &Ended,
) -> String {
    use nix::errno::Errno;
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use nix::sys::socket::{MsgFlags, sendmsg};
    use std::os::fd::{AsFd, AsRawFd};
    let mut batch = Vec::new();
    while let Some(first) = next_frame(&mut frames) {
        take_batch(first, &mut frames, &mut batch);
        let mut slices = frame_slices(&batch);
        let mut rest: &mut [std::io::IoSlice] = &mut slices;
        while !rest.is_empty() {
            // A client dropped (or a connection lost) sends not a byte
            // more, even mid-batch: the frames still queued are the
            // dropped client's, and must not reach a replica that may be
            // opened again on a new connection (a frame cut short fails
            // at the server, unapplied).
            if closed.flag.load(Ordering::SeqCst) {
                return CLOSED.into();
            }
            let sent = sendmsg::<()>(fd.as_raw_fd(), rest, &[], MsgFlags::MSG_NOSIGNAL, None);
            match sent {
                Ok(0) => return "the socket took nothing".into(),
                Ok(n) => std::io::IoSlice::advance_slices(&mut rest, n),
                Err(Errno::EAGAIN) => {
                    // The socket is full: wait until it takes more, looking
                    // now and then whether the client or the connection
                    // ended meanwhile (a peer that stopped reading).
                    if frames.is_closed() {
                        return CLOSED.into();
                    }
                    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLOUT)];
                    let _ = poll(&mut fds, PollTimeout::from(100u8));
                }
                Err(Errno::EINTR) => {}
                Err(e) => return std::io::Error::from(e).to_string(),
            }
        }
        drop(slices);
        batch.clear();
    }
    CLOSED.into()
}

/// Why a connection's requests still waiting when its client closed it
/// (or dropped it) fail.
const CLOSED: &str = "the connection was closed by its client";

/// The sending side of a TLS connection (or of a plain one whose
/// descriptor could not be copied), on a thread of its own as over plain
/// TCP (see `send_thread`): takes the frames from `frames` and
/// writes them through the session's write half, batching what queues,
/// until the client ends or the connection does. The records are sealed
/// here, beside the engine's next request rather than after it on the
/// same worker. The write half is a tokio resource: `runtime` (the one it
/// was made on, whose workers drive its socket) runs each batch's writes
/// to the end on this thread. A client dropped sends nothing more: the
/// batch's writes stop at its drop (`Ended::notify`). With nothing
/// queued it sleeps at once (see `next_frame`). Returns why it ended, as
/// `send_thread` does.
fn session_send_thread(
    runtime: tokio::runtime::Handle,
    mut wr: super::tls::Writer,
    mut frames: mpsc::UnboundedReceiver<Frame>,
    closed: &Ended,
) -> String {
    let mut batch = Vec::new();
    while let Some(first) = frames.blocking_recv() {
        take_batch(first, &mut frames, &mut batch);
        let sent = runtime.block_on(async {
            tokio::select! {
                // First: nothing is written once the client is gone.
                biased;
                () = closed.wait() => None,
                r = write_frames(&mut wr, &batch) => Some(r),
            }
        });
        match sent {
            None => return CLOSED.into(),
            Some(Err(e)) => return e.to_string(),
            Some(Ok(())) => batch.clear(),
        }
    }
    CLOSED.into()
}

/// What follows a request's header: its payload, and a write's block
/// checksums (or nothing).
struct Parts {
    payload: bytes::Bytes,
    sums: bytes::Bytes,
}

pub struct ReplicaClient {
    addr: String,
    /// How it connected (to connect again the same way).
    tls: WireTls,
    /// Frames to send, in order; a thread of the connection writes them
    /// (`send_thread`, `session_send_thread`), batching what queues, and ends
    /// with the outbox. Unbounded: what waits in it is bounded by the
    /// requests in flight, and sending never waits, so callers may send
    /// under a plain lock.
    outbox: mpsc::UnboundedSender<Frame>,
    /// Set once the connection is gone.
    closed: Arc<Ended>,
    pending: Pending,
    next: AtomicU64,
    reader: tokio::task::JoinHandle<()>,
    /// The replica takes writes with their block checksums (its OPEN
    /// reply said so; a server from before FLAG_SUMS says nothing).
    takes_sums: bool,
    /// The server answers PING (its OPEN reply said so; one from before
    /// would close the connection on it).
    takes_ping: bool,
    /// The server reads a head ahead of its freeze (its OPEN reply said
    /// so; one from before would close the connection on WARM).
    takes_warm: bool,
}

impl Drop for ReplicaClient {
    fn drop(&mut self) {
        // Seen by the sending thread before its next send (over TLS, it
        // also stops the write under way).
        self.closed.flag.store(true, Ordering::SeqCst);
        self.closed.notify.notify_waiters();
        self.reader.abort();
    }
}

impl ReplicaClient {
    /// Connects to `addr` over plain TCP and opens the replica `name`.
    pub async fn connect(addr: &str, name: &str) -> Result<ReplicaClient, ClientError> {
        Self::dial(&WireTls::default(), addr, name).await
    }

    /// Connects to `addr` with `tls` and opens the replica `name`.
    pub async fn dial(tls: &WireTls, addr: &str, name: &str) -> Result<ReplicaClient, ClientError> {
        let lost = |reason: String| ClientError::Closed {
            addr: addr.to_string(),
            reason,
        };
        let stream =
            tokio::time::timeout(std::time::Duration::from_secs(5), TcpStream::connect(addr))
                .await
                .map_err(|_| lost("connect timed out".into()))?
                .map_err(|e| lost(e.to_string()))?;
        // Plain TCP: the frames leave from a thread of their own (see
        // `send_thread`), on a descriptor of the same socket; over TLS (or
        // without that descriptor) the thread writes through the
        // connection's write half (`session_send_thread`).
        let raw = if tls.is_on() {
            None
        } else {
            nix::unistd::dup(&stream).ok()
        };
        let (rd, wr) = tokio::time::timeout(super::HANDSHAKE_TIMEOUT, tls.connect(stream))
            .await
            .map_err(|_| lost("the TLS handshake timed out".into()))?
            .map_err(|e| lost(format!("TLS: {e}")))?;
        let mut rd = crate::bufio::FrameReader::new(rd, super::IO_BUFFER);
        let (outbox, frames) = mpsc::unbounded_channel::<Frame>();
        let pending: Pending = Arc::default();
        let closed = Arc::new(Ended::default());
        let (wp, wa, wc) = (pending.clone(), addr.to_string(), closed.clone());
        let runtime = tokio::runtime::Handle::current();
        std::thread::Builder::new()
            .name("replica-send".into())
            .spawn(move || {
                let reason = match raw {
                    Some(fd) => send_thread(fd, wr, frames, &wc),
                    None => session_send_thread(runtime.clone(), wr, frames, &wc),
                };
                // The connection or its client is gone: every request still
                // waiting gets its answer now. A client dropped aborts its
                // reader, so no one else would give it, and a write whose
                // fan-in waits on it would never be answered (nor let go of
                // the engine's I/O). Inside the runtime: an answer may start
                // a task (the engine's conclusion of a failed write).
                let _in_runtime = runtime.enter();
                close_all(&wc, &wp, &wa, &reason);
            })
            .map_err(|e| lost(format!("no thread to send: {e}")))?;
        let (p, a, c) = (pending.clone(), addr.to_string(), closed.clone());
        let reader = tokio::spawn(async move {
            let reason = loop {
                let mut head = [0u8; RESPONSE_HEADER];
                if let Err(e) = rd.read_exact(&mut head).await {
                    break e.to_string();
                }
                let resp = match Response::decode(&head) {
                    Ok(r) => r,
                    Err(e) => break e.to_string(),
                };
                let body = match rd.payload(resp.len as usize).await {
                    Ok(b) => b,
                    Err(e) => break e.to_string(),
                };
                let waiter = p.lock().ok().and_then(|mut m| m.remove(&resp.id));
                if let Some(Outstanding { waiter: w, .. }) = waiter {
                    let result = if resp.status == status::OK {
                        Ok(body)
                    } else {
                        Err(ClientError::of_reply(&a, resp.status, &body))
                    };
                    w.finish(result);
                }
            };
            close_all(&c, &p, &a, &reason);
        });
        let mut client = ReplicaClient {
            addr: addr.to_string(),
            tls: tls.clone(),
            outbox,
            closed,
            pending,
            next: AtomicU64::new(1),
            reader,
            takes_sums: false,
            takes_ping: false,
            takes_warm: false,
        };
        // A server that takes the connection but never answers the OPEN
        // does not hold the caller (an engine starting, a rebuild).
        // An engine claims the attachment it was started for.
        let open = client.call(
            Op::Open,
            tls.attachment(),
            name.len() as u32,
            0,
            0,
            name.as_bytes(),
        );
        let opened = tokio::time::timeout(super::HANDSHAKE_TIMEOUT, open)
            .await
            .map_err(|_| ClientError::Closed {
                addr: addr.to_string(),
                reason: format!("no answer to OPEN within {:?}", super::HANDSHAKE_TIMEOUT),
            })??;
        let said = serde_json::from_slice::<serde_json::Value>(&opened).unwrap_or_default();
        client.takes_sums = said["sums"] == serde_json::Value::Bool(true);
        client.takes_ping = said["ping"] == serde_json::Value::Bool(true);
        client.takes_warm = said["warm"] == serde_json::Value::Bool(true);
        Ok(client)
    }

    /// How long the oldest of the volume's I/O requests still waiting for
    /// its reply has waited at `now` (None when none waits). A replica
    /// that answers slowly still answers; one whose process or network
    /// hangs leaves this growing.
    pub fn stalled_for(&self, now: std::time::Instant) -> Option<std::time::Duration> {
        let m = self.pending.lock().ok()?;
        m.values()
            .filter_map(|o| o.io_since)
            .min()
            .map(|since| now.saturating_duration_since(since))
    }

    /// Gives up on the connection: every request still waiting fails now
    /// with `reason` (as if the connection had been lost), and nothing more
    /// is sent or read. A reply that comes later finds no one waiting.
    pub fn abandon(&self, reason: &str) {
        close_all(&self.closed, &self.pending, &self.addr, reason);
        self.reader.abort();
    }

    /// Whether writes to it may bring their block checksums (`send_write`).
    pub fn takes_sums(&self) -> bool {
        self.takes_sums
    }

    /// Sends a PING, timed like the volume's I/O (`stalled_for`), unless
    /// the server would not know it: a replica with nothing asked of it
    /// shows its silence that way. Its answer is not waited for.
    pub fn ping(&self) {
        if self.takes_ping {
            let answered = Waiter::Callback(Box::new(drop));
            let (flags, parts) = self.parts(Op::Ping, 0, bytes::Bytes::new(), None);
            // An error was given to the waiter.
            let _ = self.send(Op::Ping, 0, 0, 0, flags, parts, answered);
        }
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// How it connected.
    pub fn tls(&self) -> &WireTls {
        &self.tls
    }

    /// Returns once the connection is gone.
    pub async fn closed(&self) {
        self.closed.wait().await;
    }

    /// Borrows the opened replica (see `Op::Lend`): from now on the
    /// caller does its I/O on the files, until `give_back` or this
    /// connection's end.
    pub async fn lend(&self) -> Result<(), ClientError> {
        self.call(Op::Lend, 0, 0, 0, 0, &[]).await.map(drop)
    }

    /// Ends the loan taken with `lend`.
    pub async fn give_back(&self) -> Result<(), ClientError> {
        self.call(Op::Lend, 0, 0, 0, super::protocol::FLAG_RETURN, &[])
            .await
            .map(drop)
    }

    /// Sends one request and waits for its reply.
    pub async fn call(
        &self,
        op: Op,
        offset: u64,
        len: u32,
        revision: u64,
        flags: u8,
        payload: &[u8],
    ) -> Result<bytes::Bytes, ClientError> {
        self.submit(
            op,
            offset,
            len,
            revision,
            flags,
            bytes::Bytes::copy_from_slice(payload),
        )?
        .await
    }

    /// Sends a request now and returns what waits for its reply: callers
    /// that must order requests across replicas send under their own lock
    /// and wait outside it.
    pub fn submit(
        &self,
        op: Op,
        offset: u64,
        len: u32,
        revision: u64,
        flags: u8,
        payload: bytes::Bytes,
    ) -> Result<
        impl std::future::Future<Output = Result<bytes::Bytes, ClientError>> + use<>,
        ClientError,
    > {
        self.submit_summed(op, offset, len, (revision, flags), payload, None)
    }

    /// `submit`, with a WRITE's block checksums (`replica::block_sums`)
    /// when given and the replica takes them.
    pub fn submit_summed(
        &self,
        op: Op,
        offset: u64,
        len: u32,
        (revision, flags): (u64, u8),
        payload: bytes::Bytes,
        sums: Option<&bytes::Bytes>,
    ) -> Result<
        impl std::future::Future<Output = Result<bytes::Bytes, ClientError>> + use<>,
        ClientError,
    > {
        let (tx, rx) = oneshot::channel();
        let (flags, parts) = self.parts(op, flags, payload, sums);
        self.send(op, offset, len, revision, flags, parts, Waiter::Task(tx))?;
        let addr = self.addr.clone();
        Ok(async move {
            rx.await.map_err(|_| ClientError::Closed {
                addr,
                reason: "reader stopped".into(),
            })?
        })
    }

    /// The flags and the parts of a request: a WRITE's checksums go with
    /// it (flag SUMS) when given and the replica takes them.
    fn parts(
        &self,
        op: Op,
        flags: u8,
        payload: bytes::Bytes,
        sums: Option<&bytes::Bytes>,
    ) -> (u8, Parts) {
        match sums {
            Some(s) if op == Op::Write && self.takes_sums => (
                flags | super::protocol::FLAG_SUMS,
                Parts {
                    payload,
                    sums: s.clone(),
                },
            ),
            _ => (
                flags,
                Parts {
                    payload,
                    sums: bytes::Bytes::new(),
                },
            ),
        }
    }

    /// Sends a WRITE of `data` at `offset` now, with `sums` (its blocks'
    /// checksums, `replica::block_sums`) when given and the replica takes
    /// them; `waiter` gets its reply, or the error that kept it from being
    /// sent, once, always.
    pub fn send_write(
        &self,
        offset: u64,
        data: bytes::Bytes,
        sums: Option<&bytes::Bytes>,
        (revision, fua): (u64, bool),
        waiter: Waiter,
    ) {
        let len = data.len() as u32;
        let (flags, parts) = self.parts(Op::Write, u8::from(fua), data, sums);
        // An error was given to the waiter.
        let _ = self.send(Op::Write, offset, len, revision, flags, parts, waiter);
    }

    /// Sends a request now; `waiter` gets its reply (or the connection's
    /// end), once. On an error here the waiter is answered with it too,
    /// unless the connection's end took it first and answered it then.
    #[allow(clippy::too_many_arguments)]
    fn send(
        &self,
        op: Op,
        offset: u64,
        len: u32,
        revision: u64,
        flags: u8,
        parts: Parts,
        waiter: Waiter,
    ) -> Result<(), ClientError> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let closed = |reason: String| ClientError::Closed {
            addr: self.addr.clone(),
            reason,
        };
        // The volume's I/O is timed (`stalled_for`), and a PING, answered
        // at once; a FILL, a JOIN or a SNAPSHOT may take long by their
        // nature.
        let io_since = matches!(op, Op::Read | Op::Write | Op::Trim | Op::Flush | Op::Ping)
            .then(std::time::Instant::now);
        // Taken back unanswered (by no one else), the waiter is answered
        // with the error.
        let unsent = |e: ClientError| {
            let back = self.pending.lock().ok().and_then(|mut m| m.remove(&id));
            if let Some(o) = back {
                o.waiter.finish(Err(e.clone()));
            }
            Err(e)
        };
        match self.pending.lock() {
            Ok(mut m) => m.insert(id, Outstanding { waiter, io_since }),
            Err(_) => {
                let e = closed("poisoned".into());
                waiter.finish(Err(e.clone()));
                return Err(e);
            }
        };
        if self.closed.flag.load(Ordering::SeqCst) {
            return unsent(closed("connection closed".into()));
        }
        let head = Request {
            op,
            flags,
            id,
            offset,
            len,
            revision,
        }
        .encode();
        let Parts { payload, sums } = parts;
        if self
            .outbox
            .send(Frame {
                head,
                payload,
                sums,
            })
            .is_err()
        {
            return unsent(closed("writer stopped".into()));
        }
        Ok(())
    }

    /// `len` bytes at `offset`, as they came off the socket (uncopied).
    pub async fn read(&self, offset: u64, len: u32) -> Result<bytes::Bytes, ClientError> {
        self.call(Op::Read, offset, len, 0, 0, &[]).await
    }

    pub async fn write(
        &self,
        offset: u64,
        data: &[u8],
        revision: u64,
        fua: bool,
    ) -> Result<(), ClientError> {
        self.call(
            Op::Write,
            offset,
            data.len() as u32,
            revision,
            u8::from(fua),
            data,
        )
        .await
        .map(drop)
    }

    pub async fn trim(&self, offset: u64, len: u32, revision: u64) -> Result<(), ClientError> {
        self.call(Op::Trim, offset, len, revision, 0, &[])
            .await
            .map(drop)
    }

    pub async fn flush(&self) -> Result<(), ClientError> {
        self.call(Op::Flush, 0, 0, 0, 0, &[]).await.map(drop)
    }

    /// Grows the replica to `size` bytes (online expansion).
    pub async fn grow(&self, size: u64) -> Result<(), ClientError> {
        self.call(Op::Grow, size, 0, 0, 0, &[]).await.map(drop)
    }

    /// Syncs the head's checksums at every flush, or not (see
    /// `Replica::set_sums_every_flush`).
    pub async fn sums_every_flush(&self, on: bool) -> Result<(), ClientError> {
        self.call(Op::SumsEveryFlush, u64::from(on), 0, 0, 0, &[])
            .await
            .map(drop)
    }

    /// Reads the head ahead of its freeze (see `replica::warm`);
    /// nothing for a server from before WARM.
    pub async fn warm(&self) -> Result<(), ClientError> {
        if !self.takes_warm {
            return Ok(());
        }
        self.call(Op::Warm, 0, 0, 0, 0, &[]).await.map(drop)
    }

    /// Freezes the head; with `label`, as that user snapshot.
    pub async fn snapshot(&self, label: Option<&str>) -> Result<String, ClientError> {
        let label = label.unwrap_or_default();
        self.call(Op::Snapshot, 0, label.len() as u32, 0, 0, label.as_bytes())
            .await
            .map(|b| String::from_utf8_lossy(&b).into_owned())
    }

    /// `snapshot`, freezing as lost the blocks of the head in `lose` that
    /// fail their checksums (see `Replica::snapshot_losing`).
    pub async fn snapshot_losing(
        &self,
        label: Option<&str>,
        lose: &std::collections::BTreeSet<u64>,
    ) -> Result<String, ClientError> {
        if lose.is_empty() {
            return self.snapshot(label).await;
        }
        let spec = crate::wire::LoseSpec {
            label: label.map(str::to_string),
            lose: lose.clone(),
        };
        let body = serde_json::to_vec(&spec)
            .map_err(|e| ClientError::failed(&self.addr, status::INVALID, e.to_string()))?;
        self.call(Op::Snapshot, 0, body.len() as u32, 0, FLAG_LOSE, &body)
            .await
            .map(|b| String::from_utf8_lossy(&b).into_owned())
    }

    /// Gives up block `block` of frozen layer `layer` as lost (see
    /// `Replica::lose_frozen_block`); the blocks given up.
    pub async fn lose(&self, layer: &str, block: u64) -> Result<Vec<u64>, ClientError> {
        let layers = self.layers().await?;
        let index = layers.iter().position(|l| l.name == layer).ok_or_else(|| {
            ClientError::failed(&self.addr, status::NOT_FOUND, format!("no layer {layer}"))
        })?;
        let body = self
            .call(
                Op::Lose,
                block * crate::replica::BLOCK,
                0,
                index as u64,
                0,
                &[],
            )
            .await?;
        self.json(&body)
    }

    /// `{size, chain, revision}`.
    pub async fn info(&self) -> Result<serde_json::Value, ClientError> {
        let body = self.call(Op::Info, 0, 0, 0, 0, &[]).await?;
        serde_json::from_slice(&body)
            .map_err(|e| ClientError::failed(&self.addr, status::IO, e.to_string()))
    }

    /// Every layer, oldest first.
    pub async fn layers(&self) -> Result<Vec<crate::replica::LayerInfo>, ClientError> {
        let body = self.call(Op::Layers, 0, 0, 0, 0, &[]).await?;
        self.json(&body)
    }

    /// Every layer, oldest first, for a copy of the frozen ones: the
    /// replica is not merged from now until this connection ends
    /// (`FLAG_COPY`).
    pub async fn layers_to_copy(&self) -> Result<Vec<crate::replica::LayerInfo>, ClientError> {
        let body = self
            .call(Op::Layers, 0, 0, 0, super::protocol::FLAG_COPY, &[])
            .await?;
        self.json(&body)
    }

    /// The runs of blocks (`[first, last)`) of the replica's regions
    /// written lately (`Replica::recent_runs`).
    pub async fn recent_runs(&self) -> Result<Vec<(u64, u64)>, ClientError> {
        let body = self.call(Op::RecentRuns, 0, 0, 0, 0, &[]).await?;
        self.json(&body)
    }

    /// The CRC32C of each block a read returns over `offset..offset +
    /// len` (block aligned), in order (`Replica::view_sums`).
    pub async fn view_sums(&self, offset: u64, len: u32) -> Result<Vec<u32>, ClientError> {
        let body = self.call(Op::ViewSums, offset, len, 0, 0, &[]).await?;
        Ok(body
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// The writes after revision `since` in the replica's write log, or
    /// None when the log does not reach back that far.
    pub async fn writes_since(
        &self,
        since: u64,
    ) -> Result<Option<Vec<crate::replica::LogEntry>>, ClientError> {
        let body = self.call(Op::WriteLog, since, 0, 0, 0, &[]).await?;
        self.json(&body)
    }
}

/// How a caller waiting on a long request tells a server that works
/// slowly from one that stopped answering (`ReplicaClient::answering`).
#[derive(Clone, Copy, Debug)]
pub struct Liveness {
    /// How long a request may go unanswered before the caller pings.
    pub every: std::time::Duration,
    /// How long a ping may go unanswered before the connection is given up.
    pub silence: std::time::Duration,
}

/// The longest a working server leaves a ping, or a bounded request,
/// unanswered: a minute. One silent for longer is not working (its
/// process or node frozen, its network dropping packets, its disk hung).
/// A fill gives its source as long for each piece (`sync::SOURCE_SILENCE`).
pub const SILENCE: std::time::Duration = std::time::Duration::from_secs(60);

impl Default for Liveness {
    /// A ping every 10 s; `SILENCE` of silence.
    fn default() -> Self {
        Liveness {
            every: std::time::Duration::from_secs(10),
            silence: SILENCE,
        }
    }
}

impl ReplicaClient {
    /// Waits for `work` (requests on this connection) as long as the server
    /// answers: every `liveness.every` a PING goes out, which the server
    /// answers from the connection's own task, whatever its replica is
    /// doing. A slow answer (a freeze that reads a large head, a slow disk)
    /// is waited for; a ping unanswered for `liveness.silence` (the
    /// server's process frozen, its network dropping packets) gives the
    /// connection up, and every request on it fails. A server from before
    /// PING is waited for, however long.
    pub async fn answering<T>(
        &self,
        work: impl std::future::Future<Output = Result<T, ClientError>>,
        liveness: Liveness,
    ) -> Result<T, ClientError> {
        if !self.takes_ping {
            return work.await;
        }
        let silent = async {
            loop {
                tokio::time::sleep(liveness.every).await;
                let ping = self.call(Op::Ping, 0, 0, 0, 0, &[]);
                // Any answer is one, an error too.
                if tokio::time::timeout(liveness.silence, ping).await.is_err() {
                    return format!("no answer to a ping for {:?}: given up", liveness.silence);
                }
            }
        };
        tokio::select! {
            done = work => done,
            reason = silent => {
                self.abandon(&reason);
                Err(ClientError::Closed {
                    addr: self.addr.clone(),
                    reason,
                })
            }
        }
    }

    fn json<T: serde::de::DeserializeOwned>(&self, body: &[u8]) -> Result<T, ClientError> {
        serde_json::from_slice(body)
            .map_err(|e| ClientError::failed(&self.addr, status::IO, e.to_string()))
    }

    /// Joins a rebuild (see `Replica::join`).
    pub async fn join(
        &self,
        spec: &super::JoinSpec,
    ) -> Result<crate::replica::JoinReport, ClientError> {
        let payload = serde_json::to_vec(spec)
            .map_err(|e| ClientError::failed(&self.addr, status::INVALID, e.to_string()))?;
        let body = self
            .call(Op::Join, 0, payload.len() as u32, 0, 0, &payload)
            .await?;
        self.json(&body)
    }

    /// Fills the replica's pending layers from `source` (`NAME@ADDR`),
    /// copying at most `bytes_per_second` (0: no limit;
    /// the header's offset carries it); returns `{path, bytes, layers}`
    /// when every layer is complete.
    pub async fn fill(
        &self,
        source: &str,
        bytes_per_second: u64,
    ) -> Result<serde_json::Value, ClientError> {
        let len = source.len() as u32;
        let body = self
            .call(Op::Fill, bytes_per_second, len, 0, 0, source.as_bytes())
            .await?;
        self.json(&body)
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use super::*;

    /// A writer like a TLS session on a full socket: it takes every byte
    /// it is given, but only a flush sends them on.
    #[derive(Default)]
    struct Session {
        held: Vec<u8>,
        sent: Vec<u8>,
    }

    impl tokio::io::AsyncWrite for Session {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            self.held.extend_from_slice(buf);
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            let held = std::mem::take(&mut self.held);
            self.sent.extend_from_slice(&held);
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            self.poll_flush(cx)
        }
    }

    /// A write's frame with this id and payload, without checksums.
    fn frame(id: u64, payload: &'static [u8]) -> Frame {
        Frame {
            head: Request {
                op: Op::Write,
                flags: 0,
                id,
                offset: 0,
                len: payload.len() as u32,
                revision: id,
            }
            .encode(),
            payload: bytes::Bytes::from_static(payload),
            sums: bytes::Bytes::new(),
        }
    }

    #[tokio::test]
    async fn a_batch_of_frames_leaves_nothing_held_in_the_session() {
        let batch = [frame(1, b"first"), frame(2, b""), frame(3, b"last")];
        let mut session = Session::default();
        write_frames(&mut session, &batch).await.unwrap();
        assert!(session.held.is_empty(), "bytes left unsent in the session");
        let want: Vec<u8> = batch
            .iter()
            .flat_map(|f| f.head.iter().chain(f.payload.iter()).copied())
            .collect();
        assert_eq!(session.sent, want);
    }

    #[test]
    fn a_sending_thread_gets_frames_that_come_while_it_looks_or_after_it_sleeps() {
        let (tx, mut rx) = mpsc::unbounded_channel::<Frame>();
        let feeder = std::thread::spawn(move || {
            // One at once, one long after the look has ended (the thread
            // is asleep by then), then the client goes.
            tx.send(frame(1, b"")).unwrap();
            std::thread::sleep(LOOK_FOR * 40);
            tx.send(frame(2, b"")).unwrap();
            std::thread::sleep(LOOK_FOR * 40);
        });
        let mut got = Vec::new();
        while let Some(f) = next_frame(&mut rx) {
            got.push(Request::decode(&f.head).unwrap().id);
        }
        feeder.join().unwrap();
        assert_eq!(got, [1, 2], "frames lost or out of order");
    }
}
