//! The bare pipeline of three replicas, for the nbd bench: the shape of
//! Ballast's write path with nothing of Ballast in it, to tell what the
//! shape costs on this machine from what the implementation adds.
//!
//! One process serves NBD on a unix socket (with the engine's own
//! handshake). Its thread reads the client's requests 256 KiB at a time,
//! sends each write, header and payload as they came, to two sink
//! processes over loopback TCP (a batch's frames in one `writev` per
//! sink), then writes it into a file of its own. Each sink writes what it
//! gets into its file and answers each request with its handle, a batch's
//! answers in one write. A second thread of the first process reads both
//! sinks' answers, in order, and answers the client once its own write is
//! done too. WRITE and FLUSH (all three files synced) only.
//!
//! Blocking threads and plain system calls: no checksums, no write log,
//! no revisions, no async runtime, no checks beyond the framing, no
//! answer to a lost sink. It keeps none of the promises a storage system
//! must: a measure, not a product. The processes are this bench binary
//! run again with the first argument `bare-pipeline-engine` or
//! `bare-pipeline-sink` (`run_if_asked`).

use std::io::{IoSlice, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ballast_node::frontend::nbd;

use super::{Kill, SIZE, wait_for};

const HEADER: usize = 28;
const CHUNK: usize = 256 * 1024;
const REPLY_MAGIC: u32 = 0x6744_6698;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;
const CMD_FLUSH: u16 = 3;

/// Starts the bare pipeline in `dir`: two sinks and the NBD endpoint.
/// Returns what keeps the processes up and the endpoint's URI.
pub fn start(dir: &Path) -> (Vec<Kill>, String) {
    let me = std::env::current_exe().unwrap();
    let mut keep = Vec::new();
    let mut ports = Vec::new();
    for i in 1..=2 {
        let file = dir.join(format!("bare-sink-{i}.img"));
        let mut child = Command::new(&me)
            .arg("bare-pipeline-sink")
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut port = String::new();
        let mut out = child.stdout.take().unwrap();
        let mut byte = [0u8; 1];
        while out.read(&mut byte).unwrap() == 1 && byte[0] != b'\n' {
            port.push(byte[0] as char);
        }
        ports.push(port);
        keep.push(Kill(child));
    }
    let sock = dir.join("bare.sock");
    let child = Command::new(&me)
        .arg("bare-pipeline-engine")
        .arg(&sock)
        .arg(dir.join("bare-local.img"))
        .args(&ports)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    keep.push(Kill(child));
    wait_for(&sock);
    (keep, format!("nbd+unix:///bare?socket={}", sock.display()))
}

/// Runs a process of the bare pipeline and exits, when this binary was
/// started as one.
pub fn run_if_asked() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("bare-pipeline-sink") => sink(Path::new(&args[2])),
        Some("bare-pipeline-engine") => {
            engine(Path::new(&args[2]), Path::new(&args[3]), &args[4..6])
        }
        _ => return,
    }
    std::process::exit(0);
}

fn sparse_file(path: &Path) -> std::fs::File {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap();
    f.set_len(SIZE).unwrap();
    f
}

/// Bytes read from a stream and not yet taken: `buf[at..end]`.
struct Inbox {
    buf: Vec<u8>,
    at: usize,
    end: usize,
}

impl Inbox {
    fn new() -> Inbox {
        Inbox {
            buf: vec![0u8; 2 * CHUNK],
            at: 0,
            end: 0,
        }
    }

    /// Reads what the stream has (at least one byte); false at its end.
    fn read_more(&mut self, from: &mut impl Read) -> bool {
        if self.buf.len() - self.end < CHUNK {
            self.buf.copy_within(self.at..self.end, 0);
            (self.end, self.at) = (self.end - self.at, 0);
        }
        let n = from.read(&mut self.buf[self.end..]).unwrap_or(0);
        self.end += n;
        n > 0
    }

    /// The whole requests buffered, from `at` on: each with where its
    /// frame (header and payload) lies in `buf`.
    fn whole(&self) -> Vec<(nbd::Command, std::ops::Range<usize>)> {
        let mut out = Vec::new();
        let mut at = self.at;
        while self.end - at >= HEADER {
            let head = self.buf[at..at + HEADER].try_into().unwrap();
            let r = nbd::Command::decode(head, SIZE).expect("the bare pipeline lost the framing");
            // Only a write's length is a payload.
            let len = if r.cmd == CMD_WRITE {
                r.len as usize
            } else {
                0
            };
            assert!(
                len <= CHUNK,
                "the bare pipeline takes writes of up to {CHUNK} bytes"
            );
            let frame = at..at + HEADER + len;
            if frame.end > self.end {
                break;
            }
            at = frame.end;
            out.push((r, frame));
        }
        out
    }
}

fn write_all_vectored(to: &mut impl Write, slices: &mut [IoSlice<'_>]) {
    let mut rest = slices;
    while !rest.is_empty() {
        let n = to.write_vectored(rest).unwrap();
        assert!(n > 0, "a sink of the bare pipeline stopped taking frames");
        IoSlice::advance_slices(&mut rest, n);
    }
}

/// A sink: listens on loopback TCP (its port on the first line of its
/// output) and serves one connection after another.
fn sink(file: &Path) {
    let f = sparse_file(file);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    println!("{}", l.local_addr().unwrap().port());
    std::io::stdout().flush().unwrap();
    for conn in l.incoming() {
        let mut conn = conn.unwrap();
        conn.set_nodelay(true).unwrap();
        let mut inbox = Inbox::new();
        let mut answers = Vec::new();
        while inbox.read_more(&mut conn) {
            for (r, frame) in inbox.whole() {
                match r.cmd {
                    CMD_WRITE => f
                        .write_all_at(&inbox.buf[frame.start + HEADER..frame.end], r.offset)
                        .unwrap(),
                    _ => f.sync_data().unwrap(),
                }
                answers.extend_from_slice(&r.handle.to_be_bytes());
                inbox.at = frame.end;
            }
            if !answers.is_empty() {
                conn.write_all(&answers).unwrap();
                answers.clear();
            }
        }
    }
}

/// The NBD endpoint: one connection after another, each with new
/// connections to the sinks at `ports`.
fn engine(sock: &Path, file: &Path, ports: &[String]) {
    let f = sparse_file(file);
    let _ = std::fs::remove_file(sock);
    let l = UnixListener::bind(sock).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    for conn in l.incoming() {
        let conn = conn.unwrap();
        conn.set_nonblocking(true).unwrap();
        let (entered, conn) = rt.block_on(async {
            let mut s = tokio::net::UnixStream::from_std(conn).unwrap();
            let entered = ballast_node::frontend::nbd::handshake(&mut s, "bare", SIZE)
                .await
                .unwrap_or(false);
            (entered, s.into_std().unwrap())
        });
        if entered {
            conn.set_nonblocking(false).unwrap();
            serve(conn, &f, ports);
        }
    }
}

/// One NBD connection, until DISC or its end.
fn serve(mut client: UnixStream, f: &std::fs::File, ports: &[String]) {
    let mut sinks: Vec<TcpStream> = ports
        .iter()
        .map(|p| {
            let s = TcpStream::connect(format!("127.0.0.1:{p}")).unwrap();
            s.set_nodelay(true).unwrap();
            s
        })
        .collect();
    // Requests the local file is done with, in order.
    let local = Arc::new(AtomicU64::new(0));
    let answering = {
        let (mut a, mut b) = (sinks[0].try_clone().unwrap(), sinks[1].try_clone().unwrap());
        let (mut to, local) = (client.try_clone().unwrap(), local.clone());
        std::thread::spawn(move || {
            let (mut inbox, mut other) = (Inbox::new(), vec![0u8; 2 * CHUNK]);
            let mut answered = 0u64;
            let mut replies = Vec::new();
            while inbox.read_more(&mut a) {
                let whole = (inbox.end - inbox.at) / 8 * 8;
                b.read_exact(&mut other[..whole]).unwrap();
                for handle in inbox.buf[inbox.at..inbox.at + whole].chunks(8) {
                    answered += 1;
                    while local.load(Ordering::Acquire) < answered {
                        std::thread::yield_now();
                    }
                    replies.extend_from_slice(&REPLY_MAGIC.to_be_bytes());
                    replies.extend_from_slice(&0u32.to_be_bytes());
                    replies.extend_from_slice(handle);
                }
                inbox.at += whole;
                to.write_all(&replies).unwrap();
                replies.clear();
            }
        })
    };
    let mut inbox = Inbox::new();
    'conn: while inbox.read_more(&mut client) {
        let whole = inbox.whole();
        let Some(last) = whole.last().map(|(_, frame)| frame.end) else {
            continue;
        };
        let to_sinks = whole.iter().take_while(|(r, _)| r.cmd != CMD_DISC);
        let slices: Vec<IoSlice> = to_sinks
            .map(|(_, frame)| IoSlice::new(&inbox.buf[frame.clone()]))
            .collect();
        for s in sinks.iter_mut() {
            write_all_vectored(s, &mut slices.clone());
        }
        for (r, frame) in &whole {
            match r.cmd {
                CMD_WRITE => f
                    .write_all_at(&inbox.buf[frame.start + HEADER..frame.end], r.offset)
                    .unwrap(),
                CMD_FLUSH => f.sync_data().unwrap(),
                CMD_DISC => break 'conn,
                other => {
                    panic!("the bare pipeline serves writes and flushes only, not command {other}")
                }
            }
            local.fetch_add(1, Ordering::Release);
        }
        inbox.at = last;
    }
    for s in &sinks {
        let _ = s.shutdown(std::net::Shutdown::Write);
    }
    let _ = answering.join();
}
