//! The kernel block device on top of an engine: a FUSE filesystem with one
//! file, `volume`, whose reads and writes go to the engine (fuse.rs), and a
//! loop device on that file. This is what NodeStage formats and mounts. (There
//! is no nbd or ublk kernel module here; FUSE + loop is the way a user
//! space process backs a real block device.)
//!
//! Rules from MEASURED.md: ask for FUSE_ASYNC_DIO and serve with several
//! threads (else the loop device is served one request at a time); use the
//! loop device with direct I/O and no writeback cache; mount allow_other so
//! the loop device's kernel threads may open the file; never open the file
//! from a thread that serves FUSE; tear down in order (unmount the
//! filesystem, detach the loop device, unmount FUSE).

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

pub use super::fuse::{FILE_NAME, FuseMount, mount, resume};

// Loop device ioctls (linux/loop.h).
const LOOP_SET_FD: libc::c_ulong = 0x4C00;
const LOOP_CLR_FD: libc::c_ulong = 0x4C01;
const LOOP_SET_STATUS64: libc::c_ulong = 0x4C04;
const LOOP_GET_STATUS64: libc::c_ulong = 0x4C05;
const LOOP_SET_CAPACITY: libc::c_ulong = 0x4C07;
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

impl LoopInfo64 {
    fn zeroed() -> Self {
        LoopInfo64 {
            lo_device: 0,
            lo_inode: 0,
            lo_rdevice: 0,
            lo_offset: 0,
            lo_sizelimit: 0,
            lo_number: 0,
            lo_encrypt_type: 0,
            lo_encrypt_key_size: 0,
            lo_flags: 0,
            lo_file_name: [0; 64],
            lo_crypt_name: [0; 64],
            lo_encrypt_key: [0; 32],
            lo_init: [0; 2],
        }
    }
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

    /// Makes the loop device at `path` take the size its file has now (a
    /// volume grown online): the file is looked at first (FUSE asks the
    /// engine its size again), then LOOP_SET_CAPACITY. Returns the size.
    pub fn refresh_capacity(path: &Path, backing: &Path) -> std::io::Result<u64> {
        let size = std::fs::metadata(backing)?.len();
        let dev = OpenOptions::new().read(true).write(true).open(path)?;
        // SAFETY: LOOP_SET_CAPACITY takes no argument.
        check(
            unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_SET_CAPACITY) },
            "LOOP_SET_CAPACITY",
        )?;
        Ok(size)
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
                lo_flags: if autoclear { LO_FLAGS_AUTOCLEAR } else { 0 },
                ..LoopInfo64::zeroed()
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

/// One mount of this mount namespace, as /proc/self/mountinfo says it.
struct Mount {
    /// The filesystem's device number, `major:minor`.
    number: String,
    /// The directory of the filesystem the mount shows (`/` for the
    /// whole of it; a bind mount of one file shows that file).
    root: String,
    point: PathBuf,
    fstype: String,
}

/// Every mount of this mount namespace (none when mountinfo cannot be
/// read).
fn mounts() -> Vec<Mount> {
    // Spaces and tabs in paths are escaped there.
    let unescaped = |p: &str| p.replace("\\040", " ").replace("\\011", "\t");
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|l| {
            let fields: Vec<&str> = l.split(' ').collect();
            Some(Mount {
                number: fields.get(2)?.to_string(),
                root: unescaped(fields.get(3)?),
                point: PathBuf::from(unescaped(fields.get(4)?)),
                fstype: l.split(" - ").nth(1)?.split(' ').next()?.to_string(),
            })
        })
        .collect()
}

/// Whether something is mounted at `path` (from /proc/self/mountinfo).
/// Only its parent is resolved: what is mounted there is not looked at
/// (a FUSE mount whose engine hangs would hold the look up; one whose
/// connection is gone fails with ENOTCONN). A parent that cannot be
/// resolved is looked for as it is written.
pub fn is_mountpoint(path: &Path) -> bool {
    let path = match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => (if parent.as_os_str().is_empty() {
            Path::new(".")
        } else {
            parent
        })
        .canonicalize()
        .map_or_else(|_| path.to_path_buf(), |p| p.join(name)),
        _ => path.canonicalize().unwrap_or_else(|_| path.to_path_buf()),
    };
    mounts().iter().any(|m| m.point == path)
}

/// The file the loop device at `device` is attached to, as the kernel
/// names it now (`/sys/block/loopN/loop/backing_file`); None when the
/// device is not attached, or is not a loop device.
pub fn backing_file(device: &Path) -> Option<PathBuf> {
    let name = device.file_name()?;
    let at = Path::new("/sys/block").join(name).join("loop/backing_file");
    let text = std::fs::read_to_string(at).ok()?;
    Some(PathBuf::from(text.trim_end_matches('\n')))
}

/// What identifies a file whatever path leads to it: its device number
/// and inode, as stat gives them and as a loop device keeps them of its
/// file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
}

/// The identity of `file` now (None: it cannot be looked at, as the file
/// of an export whose engine is gone). Taken from what the kernel holds
/// (statx, AT_STATX_DONT_SYNC): a FUSE file's engine is not asked, so a
/// hung one holds up no look at it.
pub fn file_id(file: &Path) -> Option<FileId> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(file.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: `path` is a NUL-terminated string that outlives the call,
    // and `st` points to a statx the kernel fills.
    let r = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::AT_STATX_DONT_SYNC,
            libc::STATX_INO,
            st.as_mut_ptr(),
        )
    };
    if r != 0 {
        return None;
    }
    // SAFETY: statx succeeded: the kernel filled `st`.
    let st = unsafe { st.assume_init() };
    Some(FileId {
        dev: libc::makedev(st.stx_dev_major, st.stx_dev_minor),
        ino: st.stx_ino,
    })
}

/// The identity of the file the loop device at `device` is attached to
/// (LOOP_GET_STATUS64); None when it is not attached.
pub fn backing_id(device: &Path) -> Option<FileId> {
    let dev = File::open(device).ok()?;
    let mut info = LoopInfo64::zeroed();
    // SAFETY: the pointer is to a live, correctly laid out loop_info64,
    // which the kernel fills.
    let r = unsafe {
        libc::ioctl(
            dev.as_raw_fd(),
            LOOP_GET_STATUS64,
            &mut info as *mut LoopInfo64,
        )
    };
    (r == 0).then_some(FileId {
        dev: info.lo_device,
        ino: info.lo_inode,
    })
}

/// The loop devices attached to `file` now, whatever any record says
/// (`/dev/loopN`, sorted): by the file's identity, and by its path. The
/// path alone misses a device whose file was opened through a mount of
/// another mount namespace that is gone (a node plugin's container that
/// ended: the kernel then names the file from its filesystem's root);
/// the identity alone misses one whose file cannot be looked at now (an
/// export whose engine died).
pub fn loops_of(file: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    let id = file_id(file);
    let mut found: Vec<PathBuf> = entries
        .flatten()
        .map(|e| Path::new("/dev").join(e.file_name()))
        .filter(|dev| {
            backing_file(dev).is_some_and(|b| b == file || (id.is_some() && backing_id(dev) == id))
        })
        .collect();
    found.sort();
    found
}

/// Where `device` is mounted in this mount namespace (from
/// /proc/self/mountinfo): each mount of the filesystem on it (found by
/// the device's number), and each bind mount of the device file itself
/// (a block volume's publication: its devtmpfs, rooted at the file).
pub fn mounts_of(device: &Path) -> Vec<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let (Ok(meta), Some(name)) = (std::fs::metadata(device), device.file_name()) else {
        return Vec::new();
    };
    let number = format!(
        "{}:{}",
        nix::sys::stat::major(meta.rdev()),
        nix::sys::stat::minor(meta.rdev())
    );
    let root = format!("/{}", name.to_string_lossy());
    mounts()
        .into_iter()
        .filter(|m| m.number == number || (m.fstype == "devtmpfs" && m.root == root))
        .map(|m| m.point)
        .collect()
}

/// Whether the filesystem mounted at `point` is the one on `device` (the
/// mount's device number is the device's).
pub fn mounted_from(point: &Path, device: &Path) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let (Ok(at), Ok(dev)) = (std::fs::metadata(point), std::fs::metadata(device)) else {
        return false;
    };
    dev.file_type().is_block_device() && at.dev() == dev.rdev() && is_mountpoint(point)
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
