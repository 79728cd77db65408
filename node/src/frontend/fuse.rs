//! The FUSE connection behind the block device: a filesystem with one
//! file, `volume`, whose reads and writes go to the engine (or to any other
//! `Backing`: the power-loss tests serve a disk that forgets). It speaks the
//! kernel's FUSE protocol itself (only what one fixed file needs), because
//! the connection must outlive the engine: the node agent keeps a copy of
//! the `/dev/fuse` descriptor, and an engine started after a crash takes it
//! over (`resume`), asks the kernel to send again what the dead one had
//! read but not answered (FUSE_NOTIFY_RESEND), and goes on serving. The
//! loop device on the file, and the filesystem on it, never notice.
//!
//! It owns the connection and its serving threads; it knows nothing of
//! loop devices (blockdev.rs) or of the control socket.

use std::fs::File;
use std::io::{IoSlice, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::engine::{Engine, EngineError};

/// What the one file of the filesystem holds: its reads, writes, discards
/// and flushes go here, each answered before the kernel hears back. An
/// error is the errno the kernel gets.
pub trait Backing: Send + Sync + 'static {
    /// Names the filesystem in the mount table (`ballast:NAME`).
    fn name(&self) -> String;
    fn size(&self) -> u64;
    fn read(&self, offset: u64, len: u32) -> Result<bytes::Bytes, i32>;
    /// Writes `data` at `offset` and gives the outcome to `answer`, which
    /// may be called later and from another thread: the serving thread
    /// goes on meanwhile.
    fn write(&self, offset: u64, data: bytes::Bytes, answer: Answer);
    /// Discards `offset..+len`, which then reads as zeros.
    fn trim(&self, offset: u64, len: u64) -> Result<(), i32>;
    /// Makes every write answered so far durable.
    fn flush(&self) -> Result<(), i32>;
}

/// How a write is answered (`Backing::write`).
pub type Answer = Box<dyn FnOnce(Result<(), i32>) + Send>;

/// The block device's backing: the engine, whose I/O runs on `rt`.
struct EngineFile {
    engine: Arc<Engine>,
    rt: tokio::runtime::Handle,
}

impl EngineFile {
    /// The errno for a failed engine call, which is logged with what
    /// failed.
    fn failed(what: &str, offset: u64, e: &EngineError) -> i32 {
        tracing::warn!(error = %e, offset, "{what} failed");
        match e {
            EngineError::NoSpace(_) => libc::ENOSPC,
            _ => libc::EIO,
        }
    }
}

impl Backing for EngineFile {
    fn name(&self) -> String {
        self.engine.volume.clone()
    }

    fn size(&self) -> u64 {
        self.engine.size()
    }

    fn read(&self, offset: u64, len: u32) -> Result<bytes::Bytes, i32> {
        self.rt
            .block_on(self.engine.read(offset, len))
            .map_err(|e| Self::failed("read", offset, &e))
    }

    /// Answered by the engine once every replica has (`Engine::write_then`):
    /// a write the local replica's disk holds is answered when the engine
    /// gives that replica up, while the serving thread that made it waits
    /// on the disk.
    fn write(&self, offset: u64, data: bytes::Bytes, answer: Answer) {
        let done: crate::engine::WriteDone =
            Box::new(move |r| answer(r.map_err(|e| Self::failed("write", offset, &e))));
        self.rt
            .block_on(self.engine.write_then(offset, data, false, done));
    }

    fn trim(&self, offset: u64, len: u64) -> Result<(), i32> {
        self.rt
            .block_on(self.engine.trim(offset, len))
            .map_err(|e| Self::failed("discard", offset, &e))
    }

    fn flush(&self) -> Result<(), i32> {
        self.rt
            .block_on(self.engine.flush())
            .map_err(|e| Self::failed("flush", 0, &e))
    }
}

/// The one file of the filesystem.
pub const FILE_NAME: &str = "volume";
const ROOT_INO: u64 = 1;
const FILE_INO: u64 = 2;
/// Serving threads: the loop device's queue depth is capped by them.
const THREADS: usize = 8;
/// Largest write the kernel sends (256 pages); reads are as large.
const MAX_WRITE: u32 = 1 << 20;
const MAX_PAGES: u16 = (MAX_WRITE / 4096) as u16;
/// Requests the kernel keeps in flight in the background (async direct
/// I/O from the loop device), and where it starts to hold back.
const MAX_BACKGROUND: u16 = 16;
const CONGESTION: u16 = 12;
/// Attributes and entries are valid this long (seconds): for good, as
/// nothing but the engine changes them, and it tells the kernel when the
/// size changes (`size_changed`). So a look at the file (stat, a loop
/// device's LOOP_GET_STATUS64, a path walk) is answered by the kernel, and
/// never waits on an engine that hangs.
const TTL: u64 = 10 * 365 * 24 * 3600;

// Opcodes (linux/fuse.h).
const LOOKUP: u32 = 1;
const FORGET: u32 = 2;
const GETATTR: u32 = 3;
const OPEN: u32 = 14;
const READ: u32 = 15;
const WRITE: u32 = 16;
const STATFS: u32 = 17;
const RELEASE: u32 = 18;
const FSYNC: u32 = 20;
const FLUSH: u32 = 25;
const INIT: u32 = 26;
const OPENDIR: u32 = 27;
const READDIR: u32 = 28;
const RELEASEDIR: u32 = 29;
const FSYNCDIR: u32 = 30;
const ACCESS: u32 = 34;
const INTERRUPT: u32 = 36;
const DESTROY: u32 = 38;
const BATCH_FORGET: u32 = 42;
const FALLOCATE: u32 = 43;

// INIT flags.
const ASYNC_READ: u64 = 1 << 0;
const BIG_WRITES: u64 = 1 << 5;
const ASYNC_DIO: u64 = 1 << 15;
const FLAG_MAX_PAGES: u64 = 1 << 22;
const INIT_EXT: u64 = 1 << 30;
const HAS_RESEND: u64 = 1 << 39;
const FOPEN_DIRECT_IO: u32 = 1 << 0;
/// No FLUSH at each close of the file (ours would do nothing): a close
/// then never waits for the filesystem. (A process the node forks closes
/// the node's open files at its exec; with the engine dead and the node
/// keeping the connection for the next one, a FLUSH there waited for that
/// next engine, whose own start waited for the exec.)
const FOPEN_NOFLUSH: u32 = 1 << 5;
/// `fuse_notify_code`: move every request read but not answered back to
/// the queue.
const NOTIFY_RESEND: i32 = 7;
/// `fuse_notify_code`: the kernel forgets an inode's attributes (and, for
/// a range from an offset >= 0, its cached pages).
const NOTIFY_INVAL_INODE: i32 = 2;

const IN_HEADER: usize = 40;
const OUT_HEADER: usize = 16;

/// A mounted filesystem and its serving threads. Dropping it unmounts
/// (which ends the connection, even where the node agent holds a copy).
pub struct FuseMount {
    pub dir: PathBuf,
    dev: Arc<File>,
    threads: Vec<JoinHandle<()>>,
}

impl FuseMount {
    /// The file to attach a loop device to.
    pub fn file(&self) -> PathBuf {
        self.dir.join(FILE_NAME)
    }

    /// Tells the kernel the file's size changed (the volume grew online):
    /// its next stat asks again, and a loop device's LOOP_SET_CAPACITY then
    /// sees the new size. Cached pages stay: the data did not change.
    pub fn size_changed(&self) -> std::io::Result<()> {
        let mut msg = out_header(OUT_HEADER + 24, NOTIFY_INVAL_INODE, 0);
        msg.extend_from_slice(&FILE_INO.to_ne_bytes());
        msg.extend_from_slice(&(-1i64).to_ne_bytes());
        msg.extend_from_slice(&0i64.to_ne_bytes());
        (&*self.dev).write_all(&msg)
    }

    /// The connection, for the node agent to keep across an engine crash.
    pub fn device(&self) -> BorrowedFd<'_> {
        self.dev.as_fd()
    }

    /// Unmounts now, saying why it could not (EBUSY while a loop device is
    /// still attached to the file); the mount stays served then.
    pub fn unmount(&mut self) -> std::io::Result<()> {
        nix::mount::umount(&self.dir).map_err(std::io::Error::from)?;
        self.join();
        Ok(())
    }

    fn join(&mut self) {
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            let _ = nix::mount::umount2(&self.dir, nix::mount::MntFlags::MNT_DETACH);
            self.join();
        }
    }
}

/// Mounts a new filesystem for `engine` at `dir` and serves it. `rt` runs
/// the engine's I/O.
pub fn mount(
    engine: Arc<Engine>,
    rt: tokio::runtime::Handle,
    dir: &Path,
) -> std::io::Result<FuseMount> {
    mount_backing(Arc::new(EngineFile { engine, rt }), dir)
}

/// Mounts a new filesystem whose file is `backing` at `dir` and serves it.
pub fn mount_backing(backing: Arc<dyn Backing>, dir: &Path) -> std::io::Result<FuseMount> {
    let dev = mount_connection(&backing.name(), dir)?;
    let server = Server::new(backing, dev);
    let dev = server.dev.clone();
    // The kernel's first request is INIT; nothing else comes before it.
    let mut buf = vec![0u8; buffer_size()];
    loop {
        let n = match (&*dev).read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                let _ = nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH);
                return Err(e);
            }
        };
        let Some(h) = Header::parse(&buf[..n]) else {
            continue;
        };
        if h.opcode == INIT {
            server.init(&h, &buf[IN_HEADER..n]);
            break;
        }
        server.reply_error(h.unique, libc::EIO);
    }
    Ok(start(server, dir))
}

/// Mounts a new filesystem named `ballast:NAME` at `dir`: its
/// connection, on which the kernel's INIT waits to be read.
fn mount_connection(name: &str, dir: &Path) -> std::io::Result<File> {
    drop_dead_mount(dir);
    std::fs::create_dir_all(dir)?;
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?;
    // SAFETY: getuid and getgid cannot fail and touch no memory.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let data = format!(
        "fd={},rootmode=40000,user_id={uid},group_id={gid},allow_other,default_permissions",
        dev.as_raw_fd()
    );
    nix::mount::mount(
        Some(format!("ballast:{name}").as_str()),
        dir,
        Some("fuse.ballast"),
        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
        Some(data.as_str()),
    )
    .map_err(|e| std::io::Error::other(format!("mount: {e}")))?;
    Ok(dev)
}

/// Unmounts (lazily) a filesystem at `dir` whose connection is gone
/// (ENOTCONN): an engine that died before the node agent took its
/// connection (it ended in the middle of its export) left it, and no one
/// can serve it again. A filesystem someone may still serve is kept.
fn drop_dead_mount(dir: &Path) {
    if let Err(e) = std::fs::metadata(dir)
        && e.raw_os_error() == Some(libc::ENOTCONN)
    {
        tracing::warn!(dir = %dir.display(), "unmounting an export whose engine died");
        let _ = nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Takes over the connection of an engine that died (`dev`, kept by the
/// node agent) for the filesystem mounted at `dir`, and serves it: the
/// requests the dead engine had read are sent again.
pub fn resume(
    engine: Arc<Engine>,
    rt: tokio::runtime::Handle,
    dir: &Path,
    dev: OwnedFd,
) -> std::io::Result<FuseMount> {
    let server = Server::new(Arc::new(EngineFile { engine, rt }), File::from(dev));
    let dev = server.dev.clone();
    let mount = start(server, dir);
    // The volume may have grown since the kernel last asked its size
    // (ENOENT: the kernel keeps nothing of the file).
    if let Err(e) = mount.size_changed()
        && e.raw_os_error() != Some(libc::ENOENT)
    {
        tracing::warn!(error = %e, "the kernel may keep the size it had of the file");
    }
    let notify = out_header(OUT_HEADER, NOTIFY_RESEND, 0);
    match (&*dev).write(&notify) {
        Ok(_) => {
            tracing::info!(dir = %dir.display(), "took over the block device; requests in flight sent again")
        }
        Err(e) => {
            tracing::warn!(error = %e, "the kernel cannot send again the requests in flight (FUSE_NOTIFY_RESEND); they wait until the volume is unstaged");
        }
    }
    Ok(mount)
}

fn buffer_size() -> usize {
    MAX_WRITE as usize + 4096
}

/// Answers request `unique` on the FUSE device `dev` with `body`. The
/// request may have been interrupted meanwhile (ENOENT): fine.
fn reply_on(dev: &File, unique: u64, body: &[u8]) {
    let h = out_header(OUT_HEADER + body.len(), 0, unique);
    let _ = (&*dev).write_vectored(&[IoSlice::new(&h), IoSlice::new(body)]);
}

/// Answers request `unique` on `dev` with the error `errno`.
fn reply_error_on(dev: &File, unique: u64, errno: i32) {
    let _ = (&*dev).write(&out_header(OUT_HEADER, -errno, unique));
}

/// One read(2) of the FUSE device into the spare capacity of `buf`, which
/// then holds what was read.
fn read_into(dev: &File, buf: &mut bytes::BytesMut) -> std::io::Result<usize> {
    let spare = buf.spare_capacity_mut();
    // SAFETY: read(2) writes at most `spare.len()` bytes into memory that
    // `buf` owns and nothing else uses.
    let n = unsafe { libc::read(dev.as_raw_fd(), spare.as_mut_ptr().cast(), spare.len()) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let n = n as usize;
    // SAFETY: the kernel initialised the first `n` bytes of the spare
    // capacity, and `n` is at most its length.
    unsafe { buf.set_len(buf.len() + n) };
    Ok(n)
}

fn start(server: Server, dir: &Path) -> FuseMount {
    let server = Arc::new(server);
    let threads = (0..THREADS)
        .filter_map(|i| {
            let s = server.clone();
            std::thread::Builder::new()
                .name(format!("fuse-{i}"))
                .spawn(move || s.serve())
                .ok()
        })
        .collect();
    FuseMount {
        dir: dir.to_path_buf(),
        dev: server.dev.clone(),
        threads,
    }
}

/// `fuse_in_header`.
struct Header {
    opcode: u32,
    unique: u64,
    nodeid: u64,
}

impl Header {
    fn parse(b: &[u8]) -> Option<Header> {
        Some(Header {
            opcode: u32_at(b, 4)?,
            unique: u64_at(b, 8)?,
            nodeid: u64_at(b, 16)?,
        })
    }
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

fn out_header(len: usize, error: i32, unique: u64) -> Vec<u8> {
    let mut h = Vec::with_capacity(OUT_HEADER);
    h.extend_from_slice(&(len as u32).to_ne_bytes());
    h.extend_from_slice(&error.to_ne_bytes());
    h.extend_from_slice(&unique.to_ne_bytes());
    h
}

/// Appends native-endian integers to a reply body.
#[derive(Default)]
struct Body(Vec<u8>);

impl Body {
    fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_ne_bytes());
        self
    }
    fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_ne_bytes());
        self
    }
    fn u16(mut self, v: u16) -> Self {
        self.0.extend_from_slice(&v.to_ne_bytes());
        self
    }
    fn zeros(mut self, n: usize) -> Self {
        self.0.resize(self.0.len() + n, 0);
        self
    }
}

struct Server {
    backing: Arc<dyn Backing>,
    dev: Arc<File>,
    uid: u32,
    gid: u32,
}

impl Server {
    /// Serves `dev` (a FUSE connection) as this process's user.
    fn new(backing: Arc<dyn Backing>, dev: File) -> Server {
        // SAFETY: getuid and getgid cannot fail and touch no memory.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        Server {
            backing,
            dev: Arc::new(dev),
            uid,
            gid,
        }
    }

    /// One thread's loop: read a request, answer it, until the filesystem
    /// is unmounted.
    ///
    /// Each request is read into a buffer of its own, so that a write's
    /// data goes to the backing as it is, never copied. The buffer is used
    /// again once the backing is done with the last request's bytes.
    fn serve(&self) {
        let size = buffer_size();
        let mut buf = bytes::BytesMut::with_capacity(size);
        loop {
            buf.clear();
            buf.reserve(size);
            let n = match read_into(&self.dev, &mut buf) {
                Ok(n) => n,
                Err(e) => match e.raw_os_error() {
                    // Interrupted, or the request was taken back.
                    Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::ENOENT) => continue,
                    // Unmounted.
                    Some(libc::ENODEV) => return,
                    _ => {
                        tracing::error!(error = %e, "reading the FUSE device failed");
                        return;
                    }
                },
            };
            let request = buf.split_to(n).freeze();
            let Some(h) = Header::parse(&request) else {
                continue;
            };
            if h.opcode == DESTROY {
                self.reply(h.unique, &[]);
                return;
            }
            self.dispatch(&h, request.slice(IN_HEADER.min(n)..n));
        }
    }

    fn reply(&self, unique: u64, body: &[u8]) {
        reply_on(&self.dev, unique, body);
    }

    fn reply_error(&self, unique: u64, errno: i32) {
        reply_error_on(&self.dev, unique, errno);
    }

    fn init(&self, h: &Header, b: &[u8]) {
        let (Some(major), Some(minor), Some(flags)) = (u32_at(b, 0), u32_at(b, 4), u32_at(b, 12))
        else {
            return self.reply_error(h.unique, libc::EINVAL);
        };
        if major != 7 {
            return self.reply_error(h.unique, libc::EPROTO);
        }
        let mut kernel = u64::from(flags);
        if kernel & INIT_EXT != 0 {
            kernel |= u64::from(u32_at(b, 16).unwrap_or(0)) << 32;
        }
        if kernel & HAS_RESEND == 0 {
            tracing::warn!(
                "this kernel cannot send requests again (no FUSE_NOTIFY_RESEND): if the engine \
                 dies, I/O in flight through the block device fails"
            );
        }
        let max_readahead = u32_at(b, 8).unwrap_or(0);
        let flags = (ASYNC_READ | BIG_WRITES | ASYNC_DIO | FLAG_MAX_PAGES | INIT_EXT) & kernel;
        let body = Body::default()
            .u32(7)
            .u32(minor.min(41))
            .u32(max_readahead)
            .u32(flags as u32)
            .u16(MAX_BACKGROUND)
            .u16(CONGESTION)
            .u32(MAX_WRITE)
            .u32(1) // time granularity, ns
            .u16(MAX_PAGES)
            .u16(0)
            .u32((flags >> 32) as u32)
            .u32(0) // max_stack_depth
            .zeros(6 * 4);
        self.reply(h.unique, &body.0);
    }

    /// `fuse_attr`.
    fn attr(&self, ino: u64) -> Body {
        let (mode, size, nlink) = if ino == FILE_INO {
            (libc::S_IFREG | 0o600, self.backing.size(), 1)
        } else {
            (libc::S_IFDIR | 0o755, 0, 2)
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Body::default()
            .u64(ino)
            .u64(size)
            .u64(size / 512)
            .u64(now)
            .u64(now)
            .u64(now)
            .zeros(12)
            .u32(mode)
            .u32(nlink)
            .u32(self.uid)
            .u32(self.gid)
            .u32(0) // rdev
            .u32(4096) // blksize
            .u32(0) // flags
    }

    fn dispatch(&self, h: &Header, b: bytes::Bytes) {
        let known = h.nodeid == ROOT_INO || h.nodeid == FILE_INO;
        match h.opcode {
            FORGET | BATCH_FORGET | INTERRUPT => {}
            LOOKUP => {
                let name = b.split(|c| *c == 0).next().unwrap_or_default();
                if h.nodeid != ROOT_INO || name != FILE_NAME.as_bytes() {
                    return self.reply_error(h.unique, libc::ENOENT);
                }
                let mut entry = Body::default()
                    .u64(FILE_INO)
                    .u64(0) // generation
                    .u64(TTL)
                    .u64(TTL)
                    .u32(0)
                    .u32(0);
                entry.0.extend_from_slice(&self.attr(FILE_INO).0);
                self.reply(h.unique, &entry.0);
            }
            GETATTR if known => {
                let mut out = Body::default().u64(TTL).u32(0).u32(0);
                out.0.extend_from_slice(&self.attr(h.nodeid).0);
                self.reply(h.unique, &out.0);
            }
            OPEN if h.nodeid == FILE_INO => {
                // No page cache: every I/O reaches the backing.
                let flags = FOPEN_DIRECT_IO | FOPEN_NOFLUSH;
                let out = Body::default().u64(0).u32(flags).u32(0);
                self.reply(h.unique, &out.0);
            }
            OPEN => self.reply_error(h.unique, libc::EISDIR),
            OPENDIR if h.nodeid == ROOT_INO => {
                self.reply(h.unique, &Body::default().u64(0).u32(0).u32(0).0);
            }
            OPENDIR => self.reply_error(h.unique, libc::ENOTDIR),
            READDIR => self.readdir(h, &b),
            RELEASE | RELEASEDIR | FLUSH | FSYNCDIR | ACCESS => self.reply(h.unique, &[]),
            STATFS => {
                let out = Body::default()
                    .zeros(5 * 8)
                    .u32(4096) // bsize
                    .u32(255) // namelen
                    .u32(4096) // frsize
                    .zeros(4 + 6 * 4);
                self.reply(h.unique, &out.0);
            }
            READ => self.read(h, &b),
            WRITE => self.write(h, b),
            FSYNC => match self.backing.flush() {
                Ok(()) => self.reply(h.unique, &[]),
                Err(errno) => self.reply_error(h.unique, errno),
            },
            FALLOCATE => self.fallocate(h, &b),
            GETATTR => self.reply_error(h.unique, libc::ENOENT),
            _ => self.reply_error(h.unique, libc::ENOSYS),
        }
    }

    fn readdir(&self, h: &Header, b: &[u8]) {
        if h.nodeid != ROOT_INO {
            return self.reply_error(h.unique, libc::ENOTDIR);
        }
        let (Some(offset), Some(size)) = (u64_at(b, 8), u32_at(b, 16)) else {
            return self.reply_error(h.unique, libc::EINVAL);
        };
        let entries: [(u64, u32, &str); 3] = [
            (ROOT_INO, libc::DT_DIR.into(), "."),
            (ROOT_INO, libc::DT_DIR.into(), ".."),
            (FILE_INO, libc::DT_REG.into(), FILE_NAME),
        ];
        let mut out = Vec::new();
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            // `fuse_dirent`, padded to 8 bytes.
            let len = (24 + name.len()).next_multiple_of(8);
            if out.len() + len > size as usize {
                break;
            }
            let mut d = Body::default()
                .u64(*ino)
                .u64(i as u64 + 1)
                .u32(name.len() as u32)
                .u32(*kind);
            d.0.extend_from_slice(name.as_bytes());
            d.0.resize(len, 0);
            out.extend_from_slice(&d.0);
        }
        self.reply(h.unique, &out);
    }

    fn read(&self, h: &Header, b: &[u8]) {
        let (Some(offset), Some(size)) = (u64_at(b, 8), u32_at(b, 16)) else {
            return self.reply_error(h.unique, libc::EINVAL);
        };
        let len = u64::from(size).min(self.backing.size().saturating_sub(offset)) as u32;
        if len == 0 {
            return self.reply(h.unique, &[]);
        }
        match self.backing.read(offset, len) {
            Ok(data) => self.reply(h.unique, &data),
            Err(errno) => self.reply_error(h.unique, errno),
        }
    }

    fn write(&self, h: &Header, b: bytes::Bytes) {
        const WRITE_IN: usize = 40;
        let (Some(offset), Some(size)) = (u64_at(&b, 8), u32_at(&b, 16)) else {
            return self.reply_error(h.unique, libc::EINVAL);
        };
        let end = WRITE_IN + size as usize;
        if b.len() < end {
            return self.reply_error(h.unique, libc::EINVAL);
        }
        let data = b.slice(WRITE_IN..end);
        if offset
            .checked_add(data.len() as u64)
            .is_none_or(|end| end > self.backing.size())
        {
            return self.reply_error(h.unique, libc::ENOSPC);
        }
        let (dev, unique) = (self.dev.clone(), h.unique);
        let answer: Answer = Box::new(move |r| match r {
            Ok(()) => reply_on(&dev, unique, &Body::default().u32(size).u32(0).0),
            Err(errno) => reply_error_on(&dev, unique, errno),
        });
        self.backing.write(offset, data, answer);
    }

    /// Discards and zeroes (what the loop device sends for a block
    /// device's discard and write-zeroes): both trim the range, which then
    /// reads as zeros and gives its space back. Plain allocation inside the
    /// volume has nothing to do (it is thin and its size is fixed).
    fn fallocate(&self, h: &Header, b: &[u8]) {
        let (Some(offset), Some(length), Some(mode)) = (u64_at(b, 8), u64_at(b, 16), u32_at(b, 24))
        else {
            return self.reply_error(h.unique, libc::EINVAL);
        };
        if offset
            .checked_add(length)
            .is_none_or(|end| end > self.backing.size())
        {
            return self.reply_error(h.unique, libc::EINVAL);
        }
        let mode = mode as i32;
        let (punch, zero) = (libc::FALLOC_FL_PUNCH_HOLE, libc::FALLOC_FL_ZERO_RANGE);
        if mode & !(libc::FALLOC_FL_KEEP_SIZE | punch | zero) != 0 {
            return self.reply_error(h.unique, libc::EOPNOTSUPP);
        }
        if mode & (punch | zero) == 0 {
            return self.reply(h.unique, &[]);
        }
        match self.backing.trim(offset, length) {
            Ok(()) => self.reply(h.unique, &[]),
            Err(errno) => self.reply_error(h.unique, errno),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of nothing.
    struct Nothing;

    impl Backing for Nothing {
        fn name(&self) -> String {
            "nothing".into()
        }
        fn size(&self) -> u64 {
            0
        }
        fn read(&self, _: u64, _: u32) -> Result<bytes::Bytes, i32> {
            Err(libc::EIO)
        }
        fn write(&self, _: u64, _: bytes::Bytes, answer: Answer) {
            answer(Err(libc::EIO))
        }
        fn trim(&self, _: u64, _: u64) -> Result<(), i32> {
            Err(libc::EIO)
        }
        fn flush(&self) -> Result<(), i32> {
            Err(libc::EIO)
        }
    }

    /// A close of the volume's file asks the filesystem nothing (no
    /// FLUSH). A process the node forks closes the node's open files at
    /// its exec; with the engine dead and its connection kept for the
    /// next engine, a FLUSH there waited for that engine, whose start
    /// waited for the exec: the node's start of the next engine hung
    /// (2026-12-04, an engine replaced while NodeStage wrote through
    /// it). Here the test serves the requests itself and records them.
    #[test]
    fn closing_the_volume_file_asks_the_filesystem_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path().join("v.fuse");
        let dev = mount_connection("closing", &at).unwrap();
        let mut buf = vec![0u8; buffer_size()];
        let n = (&dev).read(&mut buf).unwrap();
        let h = Header::parse(&buf[..n]).unwrap();
        assert_eq!(h.opcode, INIT);
        let server = Server::new(Arc::new(Nothing), dev);
        server.init(&h, &buf[IN_HEADER..n]);
        nix::fcntl::fcntl(
            &*server.dev,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )
        .unwrap();
        let file = at.join(FILE_NAME);
        let closed = std::thread::spawn(move || drop(File::open(file).unwrap()));
        let mut asked = Vec::new();
        while !closed.is_finished() {
            match (&*server.dev).read(&mut buf) {
                Ok(n) => {
                    let h = Header::parse(&buf[..n]).unwrap();
                    asked.push(h.opcode);
                    let body = bytes::Bytes::copy_from_slice(&buf[IN_HEADER.min(n)..n]);
                    server.dispatch(&h, body);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err(e) => panic!("{e}"),
            }
        }
        closed.join().unwrap();
        nix::mount::umount2(&at, nix::mount::MntFlags::MNT_DETACH).unwrap();
        assert!(asked.contains(&OPEN), "the file was opened: {asked:?}");
        assert!(
            !asked.contains(&FLUSH),
            "a close asked for FLUSH: {asked:?}"
        );
    }

    /// An engine that died in the middle of its export, before the node
    /// agent took its connection, leaves a mount no one serves (ENOTCONN).
    /// The next export at the same place replaces it; a mount someone
    /// serves is never replaced. (The next export failed with EEXIST, and
    /// the volume could not be staged again.)
    #[test]
    fn an_export_replaces_the_mount_a_dead_engine_left_and_no_other() {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path().join("v.fuse");
        drop(mount_connection("dead", &at).unwrap());
        let e = std::fs::metadata(&at).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOTCONN), "{e}");
        assert!(crate::frontend::blockdev::is_mountpoint(&at));
        let live = mount_backing(Arc::new(Nothing), &at).unwrap();
        let mounts = || {
            std::fs::read_to_string("/proc/self/mountinfo")
                .unwrap()
                .lines()
                .filter(|l| l.split(' ').nth(4) == Some(at.to_str().unwrap()))
                .count()
        };
        assert_eq!(mounts(), 1, "the dead mount is gone, the new one there");
        // Served (its connection held): kept as it is.
        drop_dead_mount(&at);
        assert_eq!(mounts(), 1);
        drop(live);
        assert_eq!(mounts(), 0);
    }
}
