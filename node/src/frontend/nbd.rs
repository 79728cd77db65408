//! An NBD server for one engine: the fixed newstyle handshake, then the
//! transmission phase with READ, WRITE, FLUSH, TRIM, WRITE_ZEROES and DISC
//! (FUA honoured), requests served concurrently and answered with simple
//! replies as they finish. Every request is validated; a bad one gets an
//! error, a request that breaks the framing closes the connection.
//!
//! One task reads a connection's requests, and makes each write itself
//! (the engine writes its local replica inline). A disk that hangs under
//! that replica holds the task; the engine gives the replica up after
//! its timeout and answers the write, and another task takes the
//! connection's reading over (`Conn::parked`, `take_over`).

use std::path::Path;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixListener;
use tokio::sync::mpsc;

use crate::budget::{Budget, Share};
use crate::engine::{Engine, EngineError};

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

const FLAG_FIXED_NEWSTYLE: u16 = 1;
const FLAG_NO_ZEROES: u16 = 2;
const CLIENT_NO_ZEROES: u32 = 2;

const OPT_EXPORT_NAME: u32 = 1;
const OPT_ABORT: u32 = 2;
const OPT_LIST: u32 = 3;
const OPT_INFO: u32 = 6;
const OPT_GO: u32 = 7;

const REP_ACK: u32 = 1;
const REP_SERVER: u32 = 2;
const REP_INFO: u32 = 3;
const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
const REP_ERR_INVALID: u32 = (1 << 31) + 3;
const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;

const INFO_EXPORT: u16 = 0;
const INFO_BLOCK_SIZE: u16 = 3;

const TFLAG_HAS_FLAGS: u16 = 1;
const TFLAG_SEND_FLUSH: u16 = 1 << 2;
const TFLAG_SEND_FUA: u16 = 1 << 3;
const TFLAG_SEND_TRIM: u16 = 1 << 5;
const TFLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
const TRANSMISSION_FLAGS: u16 =
    TFLAG_HAS_FLAGS | TFLAG_SEND_FLUSH | TFLAG_SEND_FUA | TFLAG_SEND_TRIM | TFLAG_SEND_WRITE_ZEROES;

const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;
const CMD_FLUSH: u16 = 3;
const CMD_TRIM: u16 = 4;
const CMD_WRITE_ZEROES: u16 = 6;
const CMD_FLAG_FUA: u16 = 1;

const EIO: u32 = 5;
const EINVAL: u32 = 22;
const ENOSPC: u32 = 28;

/// Largest READ or WRITE we serve.
pub const MAX_REQUEST: u32 = 32 << 20;
/// Socket buffers: a 64 KiB request or reply and its header fit.
const IO_BUFFER: usize = 256 * 1024;
/// Largest option payload we read during the handshake.
const MAX_OPTION: u32 = 4096;

fn errno(e: &EngineError) -> u32 {
    tracing::warn!(error = %e, "an NBD request failed");
    match e {
        EngineError::OutOfRange { .. } => EINVAL,
        EngineError::NoSpace(_) => ENOSPC,
        _ => EIO,
    }
}

/// Serves the engine on a unix socket until the task is dropped.
pub async fn serve_unix(engine: Arc<Engine>, socket: &Path) -> std::io::Result<()> {
    let _ = std::fs::remove_file(socket);
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let listener = UnixListener::bind(socket)?;
    loop {
        let (stream, _) = listener.accept().await?;
        let engine = engine.clone();
        tokio::spawn(async move {
            if let Err(e) = connection(engine, stream).await {
                tracing::debug!(error = %e, "nbd connection ended");
            }
        });
    }
}

async fn reply_option<W: AsyncWrite + Unpin>(
    w: &mut W,
    option: u32,
    kind: u32,
    data: &[u8],
) -> std::io::Result<()> {
    let mut b = Vec::with_capacity(20 + data.len());
    b.extend_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
    b.extend_from_slice(&option.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    w.write_all(&b).await
}

fn invalid(msg: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg.to_string())
}

/// The handshake for the export `volume` of `size` bytes; true when the
/// client entered transmission. (Public for the fuzz targets.)
pub async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    volume: &str,
    size: u64,
) -> std::io::Result<bool> {
    let mut hello = Vec::new();
    hello.extend_from_slice(&NBDMAGIC.to_be_bytes());
    hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    s.write_all(&hello).await?;
    let client_flags = s.read_u32().await?;
    let no_zeroes = client_flags & CLIENT_NO_ZEROES != 0;
    let known = |name: &str| name.is_empty() || name == volume;
    loop {
        if s.read_u64().await? != IHAVEOPT {
            return Err(invalid("bad option magic"));
        }
        let option = s.read_u32().await?;
        let len = s.read_u32().await?;
        if len > MAX_OPTION {
            return Err(invalid("option too long"));
        }
        let mut data = vec![0u8; len as usize];
        s.read_exact(&mut data).await?;
        match option {
            OPT_EXPORT_NAME => {
                if !known(&String::from_utf8_lossy(&data)) {
                    return Err(invalid("unknown export"));
                }
                let mut b = Vec::new();
                b.extend_from_slice(&size.to_be_bytes());
                b.extend_from_slice(&TRANSMISSION_FLAGS.to_be_bytes());
                if !no_zeroes {
                    b.extend_from_slice(&[0u8; 124]);
                }
                s.write_all(&b).await?;
                return Ok(true);
            }
            OPT_ABORT => {
                let _ = reply_option(s, option, REP_ACK, &[]).await;
                return Ok(false);
            }
            OPT_LIST => {
                let name = volume.as_bytes();
                let mut d = (name.len() as u32).to_be_bytes().to_vec();
                d.extend_from_slice(name);
                reply_option(s, option, REP_SERVER, &d).await?;
                reply_option(s, option, REP_ACK, &[]).await?;
            }
            OPT_INFO | OPT_GO => {
                if data.len() < 6 {
                    reply_option(s, option, REP_ERR_INVALID, b"short request").await?;
                    continue;
                }
                let name_len = u32::from_be_bytes([data[0], data[1], data[2], data[3]]) as usize;
                if data.len() < 4 + name_len + 2 {
                    reply_option(s, option, REP_ERR_INVALID, b"bad name length").await?;
                    continue;
                }
                let name = String::from_utf8_lossy(&data[4..4 + name_len]).into_owned();
                if !known(&name) {
                    reply_option(
                        s,
                        option,
                        REP_ERR_UNKNOWN,
                        format!("no export {name:?}").as_bytes(),
                    )
                    .await?;
                    continue;
                }
                let mut export = INFO_EXPORT.to_be_bytes().to_vec();
                export.extend_from_slice(&size.to_be_bytes());
                export.extend_from_slice(&TRANSMISSION_FLAGS.to_be_bytes());
                reply_option(s, option, REP_INFO, &export).await?;
                let mut sizes = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
                sizes.extend_from_slice(&1u32.to_be_bytes());
                sizes.extend_from_slice(&4096u32.to_be_bytes());
                sizes.extend_from_slice(&MAX_REQUEST.to_be_bytes());
                reply_option(s, option, REP_INFO, &sizes).await?;
                reply_option(s, option, REP_ACK, &[]).await?;
                if option == OPT_GO {
                    return Ok(true);
                }
            }
            _ => reply_option(s, option, REP_ERR_UNSUP, b"not supported").await?,
        }
    }
}

/// A simple reply: its header, and the data that follows it (kept apart so
/// that the data is not copied to sit behind the header).
type Reply = ([u8; 16], bytes::Bytes);

/// A reply on its way to the client, with the share of the connection's
/// reply budget it holds until it is written.
struct Queued {
    reply: Reply,
    _budget: Option<Share>,
}

impl From<Reply> for Queued {
    fn from(reply: Reply) -> Self {
        Queued {
            reply,
            _budget: None,
        }
    }
}

/// The reply to a command that returns no data.
fn done_reply(r: Result<(), EngineError>, handle: u64) -> Reply {
    simple_reply(
        r.err().map(|e| errno(&e)).unwrap_or(0),
        handle,
        bytes::Bytes::new(),
    )
}

fn simple_reply(error: u32, handle: u64, data: bytes::Bytes) -> Reply {
    let mut h = [0u8; 16];
    h[..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    h[4..8].copy_from_slice(&error.to_be_bytes());
    h[8..].copy_from_slice(&handle.to_be_bytes());
    (h, data)
}

async fn connection<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    engine: Arc<Engine>,
    mut stream: S,
) -> std::io::Result<()> {
    if !handshake(&mut stream, &engine.volume, engine.size()).await? {
        return Ok(());
    }
    let (rd, wr) = tokio::io::split(stream);
    // Unbounded, but what waits is bounded: a read takes its share of the
    // reply budget before it is started, and gives it back once its reply
    // is written; a write's answer (16 bytes) is sent from the task that
    // read the replicas' answers, which must not wait.
    let (tx, rx) = mpsc::unbounded_channel::<Queued>();
    let writer = tokio::spawn(write_replies(rx, wr));
    let conn = Arc::new(Conn {
        engine: engine.clone(),
        parked: parking_lot::Mutex::new(None),
    });
    let watch = tokio::spawn(take_over(Arc::downgrade(&conn), engine.lent_given_up()));
    let reading = Box::new(Reading {
        rd: crate::bufio::FrameReader::new(rd, IO_BUFFER),
        tx,
        budget: Budget::default(),
        inflight: tokio::task::JoinSet::new(),
        writer,
        watch: watch.abort_handle(),
    });
    serve(conn, reading).await
}

/// What every task that serves a connection shares.
struct Conn<R> {
    engine: Arc<Engine>,
    /// The reading side, left here by its task while it makes a write:
    /// the local replica's disk may hold that task (the engine writes the
    /// replica lent to it inline), and another then takes the reading
    /// over (`take_over`).
    parked: parking_lot::Mutex<Option<Box<Reading<R>>>>,
}

/// A connection's reading side and what it needs to serve the requests
/// it reads; one task holds it at a time.
struct Reading<R> {
    rd: crate::bufio::FrameReader<R>,
    tx: mpsc::UnboundedSender<Queued>,
    budget: Budget,
    inflight: tokio::task::JoinSet<()>,
    writer: tokio::task::JoinHandle<()>,
    /// `take_over`'s task, stopped with the connection.
    watch: tokio::task::AbortHandle,
}

/// Reads and serves requests until the client disconnects (or breaks the
/// framing), then answers what is in flight; or, taken over while it made
/// a write (see `Conn::parked`), ends when that write returns.
async fn serve<R: AsyncRead + Unpin>(
    conn: Arc<Conn<R>>,
    mut r: Box<Reading<R>>,
) -> std::io::Result<()> {
    let engine = &conn.engine;
    let result = loop {
        let mut h = [0u8; 28];
        if let Err(e) = r.rd.read_exact(&mut h).await {
            break if e.kind() == std::io::ErrorKind::UnexpectedEof {
                Ok(())
            } else {
                Err(e)
            };
        }
        let req = match Command::decode(&h, engine.size()) {
            Ok(r) => r,
            Err(e) => break Err(e),
        };
        let served = match req.cmd {
            CMD_DISC => break Ok(()),
            // A write's payload is read here, in order.
            CMD_WRITE => match payload(&mut r.rd, &r.tx, &req).await {
                Ok(Some(data)) => {
                    let tx = r.tx.clone();
                    *conn.parked.lock() = Some(r);
                    write(engine, tx, &req, data).await;
                    match conn.parked.lock().take() {
                        Some(back) => r = back,
                        // Another task reads now; the write is answered.
                        None => return Ok(()),
                    }
                    Ok(())
                }
                refused => refused.map(drop),
            },
            _ => {
                // Backpressure: no more requests are read while the replies
                // already read wait for the client.
                let share = match req.cmd {
                    CMD_READ => r.budget.take(u64::from(req.len)).await,
                    _ => None,
                };
                spawn(engine, &r.tx, &mut r.inflight, req, share);
                Ok(())
            }
        };
        if let Err(e) = served {
            break Err(e);
        }
        while r.inflight.try_join_next().is_some() {}
    };
    // Answer what is in flight before closing.
    let Reading {
        mut inflight,
        tx,
        writer,
        watch,
        ..
    } = *r;
    watch.abort();
    while inflight.join_next().await.is_some() {}
    drop(tx);
    let _ = writer.await;
    result
}

/// Each time the engine gives its local replica up while the disk holds
/// a call, takes the connection's reading side if its task left it for a
/// write (the disk may hold that task), and serves it from a new task.
/// Taking it from a task the disk does not hold costs nothing: that task
/// ends once its write returns, and this one goes on.
async fn take_over<R: AsyncRead + Unpin + Send + 'static>(
    conn: std::sync::Weak<Conn<R>>,
    mut given_up: tokio::sync::watch::Receiver<u64>,
) {
    while given_up.changed().await.is_ok() {
        let Some(conn) = conn.upgrade() else {
            return;
        };
        let Some(reading) = conn.parked.lock().take() else {
            continue;
        };
        tracing::info!(volume = %conn.engine.volume,
            "the local replica was given up while its disk held this connection's write: another task reads the connection's requests");
        tokio::spawn(async move {
            if let Err(e) = serve(conn, reading).await {
                tracing::debug!(error = %e, "nbd connection ended");
            }
        });
    }
}
/// One transmission request's header.
pub struct Command {
    pub cmd: u16,
    pub handle: u64,
    pub offset: u64,
    pub len: u32,
    pub fua: bool,
    /// Whether offset+len lies inside the volume.
    pub in_range: bool,
}

impl Command {
    /// Decodes a request header for a volume of `size` bytes.
    pub fn decode(h: &[u8; 28], size: u64) -> std::io::Result<Command> {
        let magic = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
        if magic != REQUEST_MAGIC {
            return Err(invalid("bad request magic"));
        }
        let flags = u16::from_be_bytes([h[4], h[5]]);
        let offset = u64::from_be_bytes(h[16..24].try_into().unwrap_or_default());
        let len = u32::from_be_bytes([h[24], h[25], h[26], h[27]]);
        Ok(Command {
            cmd: u16::from_be_bytes([h[6], h[7]]),
            handle: u64::from_be_bytes(h[8..16].try_into().unwrap_or_default()),
            offset,
            len,
            fua: flags & CMD_FLAG_FUA != 0,
            in_range: offset
                .checked_add(u64::from(len))
                .is_some_and(|end| end <= size),
        })
    }
}

/// The writer task: replies queued together leave in one write.
async fn write_replies<W: AsyncWrite + Unpin>(mut rx: mpsc::UnboundedReceiver<Queued>, wr: W) {
    let mut wr = tokio::io::BufWriter::with_capacity(IO_BUFFER, wr);
    'out: while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        while let Some(q) = next {
            let (head, data) = &q.reply;
            if wr.write_all(head).await.is_err() || wr.write_all(data).await.is_err() {
                break 'out;
            }
            // Written: its share of the budget goes back with it.
            drop(q);
            next = rx.try_recv().ok();
        }
        if wr.flush().await.is_err() {
            break;
        }
    }
    let _ = wr.shutdown().await;
}

/// A WRITE's payload, read in order; None when the write is refused (out
/// of range: answered here). A payload too large to skip ends the
/// connection.
async fn payload<R: AsyncRead + Unpin>(
    rd: &mut crate::bufio::FrameReader<R>,
    tx: &mpsc::UnboundedSender<Queued>,
    req: &Command,
) -> std::io::Result<Option<bytes::Bytes>> {
    if req.len > MAX_REQUEST {
        let _ = tx.send(simple_reply(EINVAL, req.handle, bytes::Bytes::new()).into());
        return Err(invalid("write too large"));
    }
    let data = rd.payload(req.len as usize).await?;
    if !req.in_range {
        let _ = tx.send(simple_reply(ENOSPC, req.handle, bytes::Bytes::new()).into());
        return Ok(None);
    }
    Ok(Some(data))
}

/// WRITE: the engine's write, answered when the replicas have it (with
/// FUA each replica syncs it first).
async fn write(
    engine: &Arc<Engine>,
    tx: mpsc::UnboundedSender<Queued>,
    req: &Command,
    data: bytes::Bytes,
) {
    let handle = req.handle;
    engine
        .write_then(
            req.offset,
            data,
            req.fua,
            Box::new(move |r| {
                let _ = tx.send(done_reply(r, handle).into());
            }),
        )
        .await;
}

/// Every other request runs in a task of its own and answers when done.
fn spawn(
    engine: &Arc<Engine>,
    tx: &mpsc::UnboundedSender<Queued>,
    inflight: &mut tokio::task::JoinSet<()>,
    req: Command,
    share: Option<Share>,
) {
    let refuse = |errno| {
        let _ = tx.send(simple_reply(errno, req.handle, bytes::Bytes::new()).into());
    };
    let (e, tx) = (engine.clone(), tx.clone());
    let Command {
        cmd,
        handle,
        offset,
        len,
        fua,
        in_range,
    } = req;
    match cmd {
        CMD_READ if len <= MAX_REQUEST && in_range => {
            inflight.spawn(async move {
                let reply = match e.read(offset, len).await {
                    Ok(data) => simple_reply(0, handle, data),
                    Err(x) => simple_reply(errno(&x), handle, bytes::Bytes::new()),
                };
                let _ = tx.send(Queued {
                    reply,
                    _budget: share,
                });
            });
        }
        CMD_FLUSH => {
            inflight.spawn(async move {
                let _ = tx.send(done_reply(e.flush().await, handle).into());
            });
        }
        CMD_TRIM | CMD_WRITE_ZEROES if in_range => {
            inflight.spawn(async move {
                // Trimmed ranges read as zeros, which is what WRITE_ZEROES asks.
                let r = e.trim(offset, u64::from(len)).await.and(if fua {
                    e.flush().await
                } else {
                    Ok(())
                });
                let _ = tx.send(done_reply(r, handle).into());
            });
        }
        _ => refuse(EINVAL),
    }
}
