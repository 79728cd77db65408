//! The kernel block device on top of an engine: a FUSE filesystem with one
//! file, `volume`, whose reads and writes go to the engine, and a loop
//! device on that file. This is what NodeStage formats and mounts. (There
//! is no nbd or ublk kernel module here; FUSE + loop is the way a user
//! space process backs a real block device.)
//!
//! Rules from MEASURED.md: ask for FUSE_ASYNC_DIO and serve with several
//! threads (else the loop device is served one request at a time); use the
//! loop device with direct I/O and no writeback cache; mount allow_other so
//! the loop device's kernel threads may open the file; never open the file
//! from a thread that serves FUSE; tear down in order (unmount the
//! filesystem, detach the loop device, unmount FUSE).

use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    BackgroundSession, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    INodeNo, InitFlags, KernelConfig, LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, Request, SessionACL, WriteFlags,
};

use crate::engine::Engine;

/// The one file of the FUSE filesystem.
pub const FILE_NAME: &str = "volume";
const FILE_INO: INodeNo = INodeNo(2);
const TTL: Duration = Duration::from_secs(1);
/// FUSE worker threads: the loop device's queue depth is capped by them.
const THREADS: usize = 8;

struct Export {
    engine: Arc<Engine>,
    rt: tokio::runtime::Handle,
    uid: u32,
    gid: u32,
}

impl Export {
    fn attr(&self, ino: INodeNo) -> FileAttr {
        let now = SystemTime::now();
        let (kind, perm, size, nlink) = if ino == FILE_INO {
            (FileType::RegularFile, 0o600, self.engine.size, 1)
        } else {
            (FileType::Directory, 0o755, 0, 2)
        };
        FileAttr {
            ino,
            size,
            blocks: size / 512,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }
}

impl Filesystem for Export {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Without it the loop device's direct I/O is served one at a time.
        let _ = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent == INodeNo::ROOT && name == FILE_NAME {
            reply.entry(&TTL, &self.attr(FILE_INO), fuser::Generation(0));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if ino == INodeNo::ROOT || ino == FILE_INO {
            reply.attr(&TTL, &self.attr(ino));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != INodeNo::ROOT {
            reply.error(Errno::ENOTDIR);
            return;
        }
        let entries = [
            (INodeNo::ROOT, FileType::Directory, "."),
            (INodeNo::ROOT, FileType::Directory, ".."),
            (FILE_INO, FileType::RegularFile, FILE_NAME),
        ];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(*ino, (i + 1) as u64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if ino == FILE_INO {
            // No page cache: every I/O reaches the engine.
            reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO);
        } else {
            reply.error(Errno::EISDIR);
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let len = u64::from(size).min(self.engine.size.saturating_sub(offset)) as u32;
        if len == 0 {
            reply.data(&[]);
            return;
        }
        match self.rt.block_on(self.engine.read(offset, len)) {
            Ok(data) => reply.data(&data),
            Err(e) => {
                tracing::warn!(error = %e, offset, len, "read failed");
                reply.error(Errno::EIO);
            }
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if offset
            .checked_add(data.len() as u64)
            .is_none_or(|end| end > self.engine.size)
        {
            reply.error(Errno::ENOSPC);
            return;
        }
        match self.rt.block_on(self.engine.write(offset, data, false)) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => {
                tracing::warn!(error = %e, offset, "write failed");
                reply.error(errno(&e));
            }
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.rt.block_on(self.engine.flush()) {
            Ok(()) => reply.ok(),
            Err(_) => reply.error(Errno::EIO),
        }
    }

    /// Discards and zeroes (what the loop device sends for a block
    /// device's discard and write-zeroes): both trim the range, which then
    /// reads as zeros and gives its space back. Plain allocation inside the
    /// volume has nothing to do (it is thin and its size is fixed).
    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if offset
            .checked_add(length)
            .is_none_or(|end| end > self.engine.size)
        {
            reply.error(Errno::EINVAL);
            return;
        }
        let (punch, zero) = (libc::FALLOC_FL_PUNCH_HOLE, libc::FALLOC_FL_ZERO_RANGE);
        let known = libc::FALLOC_FL_KEEP_SIZE | punch | zero;
        if mode & !known != 0 {
            reply.error(Errno::EOPNOTSUPP);
            return;
        }
        if mode & (punch | zero) == 0 {
            reply.ok();
            return;
        }
        match self.rt.block_on(self.engine.trim(offset, length)) {
            Ok(()) => reply.ok(),
            Err(e) => {
                tracing::warn!(error = %e, offset, length, "discard failed");
                reply.error(Errno::EIO);
            }
        }
    }
}

/// The error the kernel gets for a failed engine call.
fn errno(e: &crate::engine::EngineError) -> Errno {
    match e {
        crate::engine::EngineError::NoSpace(_) => Errno::ENOSPC,
        _ => Errno::EIO,
    }
}

/// A mounted FUSE export; unmounted on drop.
pub struct FuseMount {
    pub dir: PathBuf,
    session: Option<BackgroundSession>,
}

impl FuseMount {
    /// The file to attach a loop device to.
    pub fn file(&self) -> PathBuf {
        self.dir.join(FILE_NAME)
    }

    /// Unmounts now, saying why it could not (EBUSY while a loop device is
    /// still attached to the file).
    pub fn unmount(mut self) -> std::io::Result<()> {
        match self.session.take() {
            Some(s) => s.umount_and_join(),
            None => Ok(()),
        }
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            let _ = s.umount_and_join();
        }
    }
}

/// Mounts the engine as `<dir>/volume`. `rt` runs the engine's I/O.
pub fn mount(
    engine: Arc<Engine>,
    rt: tokio::runtime::Handle,
    dir: &Path,
) -> std::io::Result<FuseMount> {
    std::fs::create_dir_all(dir)?;
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(format!("ballast:{}", engine.volume)),
        MountOption::Subtype("ballast".into()),
        MountOption::DefaultPermissions,
    ];
    config.acl = SessionACL::All;
    config.n_threads = Some(THREADS);
    let export = Export {
        engine,
        rt,
        // SAFETY: getuid and getgid cannot fail and touch no memory.
        uid: unsafe { libc::getuid() },
        gid: unsafe { libc::getgid() },
    };
    let session = fuser::spawn_mount(export, dir, &config)?;
    Ok(FuseMount {
        dir: dir.to_path_buf(),
        session: Some(session),
    })
}

// Loop device ioctls (linux/loop.h).
const LOOP_SET_FD: libc::c_ulong = 0x4C00;
const LOOP_CLR_FD: libc::c_ulong = 0x4C01;
const LOOP_SET_STATUS64: libc::c_ulong = 0x4C04;
const LOOP_SET_DIRECT_IO: libc::c_ulong = 0x4C08;
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// `struct loop_info64`.
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

fn check(r: libc::c_int, what: &str) -> std::io::Result<libc::c_int> {
    if r < 0 {
        let e = std::io::Error::last_os_error();
        Err(std::io::Error::new(e.kind(), format!("{what}: {e}")))
    } else {
        Ok(r)
    }
}

/// A loop device attached to a file; detached on drop, unless it was
/// attached to stay (`attach_to_stay`).
pub struct LoopDevice {
    pub path: PathBuf,
    dev: File,
    stays: bool,
}

impl LoopDevice {
    /// Attaches the first free loop device to `backing`, with direct I/O.
    /// The device goes away by itself once detached and closed.
    pub fn attach(backing: &Path) -> std::io::Result<LoopDevice> {
        Self::attach_with(backing, true)
    }

    /// Like `attach`, but the device stays attached when this process
    /// closes it or exits (what a staged volume needs: the node plugin may
    /// restart while a pod uses the device); `detach_path` ends it.
    pub fn attach_to_stay(backing: &Path) -> std::io::Result<LoopDevice> {
        Self::attach_with(backing, false)
    }

    /// Detaches the loop device at `path` from its file.
    pub fn detach_path(path: &Path) -> std::io::Result<()> {
        let dev = OpenOptions::new().read(true).write(true).open(path)?;
        LoopDevice {
            path: path.to_path_buf(),
            dev,
            stays: true,
        }
        .detach()
    }

    fn attach_with(backing: &Path, autoclear: bool) -> std::io::Result<LoopDevice> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(backing)?;
        let ctl = OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/loop-control")?;
        // Another process may take the free device first: try again.
        for _ in 0..16 {
            // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a number.
            let n = check(
                unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE) },
                "LOOP_CTL_GET_FREE",
            )?;
            let path = PathBuf::from(format!("/dev/loop{n}"));
            let dev = OpenOptions::new().read(true).write(true).open(&path)?;
            // SAFETY: LOOP_SET_FD takes a file descriptor that outlives the call.
            let r = unsafe {
                libc::ioctl(
                    dev.as_raw_fd(),
                    LOOP_SET_FD,
                    file.as_raw_fd() as libc::c_ulong,
                )
            };
            if r < 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EBUSY) {
                    continue;
                }
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("LOOP_SET_FD {}: {e}", path.display()),
                ));
            }
            let loop_dev = LoopDevice {
                path,
                dev,
                stays: !autoclear,
            };
            let mut info = LoopInfo64 {
                lo_device: 0,
                lo_inode: 0,
                lo_rdevice: 0,
                lo_offset: 0,
                lo_sizelimit: 0,
                lo_number: 0,
                lo_encrypt_type: 0,
                lo_encrypt_key_size: 0,
                lo_flags: if autoclear { LO_FLAGS_AUTOCLEAR } else { 0 },
                lo_file_name: [0; 64],
                lo_crypt_name: [0; 64],
                lo_encrypt_key: [0; 32],
                lo_init: [0; 2],
            };
            let name = backing.as_os_str().as_encoded_bytes();
            let n = name.len().min(63);
            info.lo_file_name[..n].copy_from_slice(&name[..n]);
            // SAFETY: the pointer is to a live, correctly laid out loop_info64.
            check(
                unsafe {
                    libc::ioctl(
                        loop_dev.dev.as_raw_fd(),
                        LOOP_SET_STATUS64,
                        &info as *const LoopInfo64,
                    )
                },
                "LOOP_SET_STATUS64",
            )?;
            // SAFETY: LOOP_SET_DIRECT_IO takes an integer flag.
            check(
                unsafe {
                    libc::ioctl(
                        loop_dev.dev.as_raw_fd(),
                        LOOP_SET_DIRECT_IO,
                        1 as libc::c_ulong,
                    )
                },
                "LOOP_SET_DIRECT_IO",
            )?;
            return Ok(loop_dev);
        }
        Err(std::io::Error::other("no free loop device"))
    }

    /// Detaches the device from its file.
    pub fn detach(&self) -> std::io::Result<()> {
        // SAFETY: LOOP_CLR_FD takes no argument.
        check(
            unsafe { libc::ioctl(self.dev.as_raw_fd(), LOOP_CLR_FD) },
            "LOOP_CLR_FD",
        )
        .map(drop)
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        if !self.stays {
            let _ = self.detach();
        }
    }
}

/// Whether something is mounted at `path` (from /proc/self/mountinfo).
pub fn is_mountpoint(path: &Path) -> bool {
    let Ok(path) = path.canonicalize() else {
        return false;
    };
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    info.lines().any(|l| {
        l.split(' ')
            .nth(4)
            .map(|p| p.replace("\\040", " ").replace("\\011", "\t"))
            .is_some_and(|p| Path::new(&p) == path)
    })
}

/// Marks this process as an I/O flusher, so that memory reclaim does not
/// wait on writeback of the very device it serves (a deadlock otherwise).
pub fn set_io_flusher() -> std::io::Result<()> {
    const PR_SET_IO_FLUSHER: libc::c_int = 57;
    // SAFETY: prctl with integer arguments touches no memory of ours.
    check(
        unsafe { libc::prctl(PR_SET_IO_FLUSHER, 1, 0, 0, 0) },
        "PR_SET_IO_FLUSHER",
    )
    .map(drop)
}
