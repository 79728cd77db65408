//! Local sparse copy of one frozen layer, for a rebuild whose source and
//! target replicas are on the same node. Three ways, each the fallback of
//! the one before: a reflink (FICLONE) of the whole file, `copy_file_range`
//! per data extent, and pread/pwrite per data extent. Holes are never
//! copied. The copy goes to a hidden temp file beside the target, is
//! checked (apparent size, and the same data extents as the source), and
//! then renamed over the target; on any error the temp file is removed.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::replica::{BLOCK, Bitmap};

use super::SyncError;

/// How a layer was copied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CopyPath {
    Reflink,
    CopyFileRange,
    ReadWrite,
    /// Over the network (the source is on another node, or the local copy
    /// failed).
    Remote,
}

impl CopyPath {
    pub fn as_str(self) -> &'static str {
        match self {
            CopyPath::Reflink => "reflink",
            CopyPath::CopyFileRange => "copy-file-range",
            CopyPath::ReadWrite => "read-write",
            CopyPath::Remote => "remote",
        }
    }
}

/// `_IOW(0x94, 9, int)`: clone every extent of the source file.
const FICLONE: libc::c_ulong = 0x4004_9409;

fn io(path: &Path) -> impl Fn(std::io::Error) -> SyncError + '_ {
    move |e| SyncError::Io {
        path: path.to_path_buf(),
        source: e,
    }
}

fn reflink(src: &File, dst: &File) -> std::io::Result<()> {
    // SAFETY: both descriptors are open for the duration of the call, and
    // FICLONE takes the source descriptor by value.
    let r = unsafe { libc::ioctl(dst.as_raw_fd(), FICLONE as _, src.as_raw_fd()) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn copy_ranges(src: &File, dst: &File, extents: &[(u64, u64)]) -> std::io::Result<()> {
    for &(start, len) in extents {
        let mut done = 0u64;
        while done < len {
            let mut off_in = (start + done) as i64;
            let mut off_out = off_in;
            let n = nix::fcntl::copy_file_range(
                src,
                Some(&mut off_in),
                dst,
                Some(&mut off_out),
                (len - done) as usize,
            )
            .map_err(std::io::Error::from)?;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "copy_file_range copied nothing",
                ));
            }
            done += n as u64;
        }
    }
    Ok(())
}

fn read_write(src: &File, dst: &File, extents: &[(u64, u64)]) -> std::io::Result<()> {
    const CHUNK: u64 = 1 << 20;
    let mut buf = vec![0u8; CHUNK as usize];
    for &(start, len) in extents {
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(CHUNK) as usize;
            src.read_exact_at(&mut buf[..n], start + done)?;
            dst.write_all_at(&buf[..n], start + done)?;
            done += n as u64;
        }
    }
    Ok(())
}

fn temp_path(dst: &Path) -> PathBuf {
    let name = dst
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    dst.with_file_name(format!(".{name}.partial"))
}

/// Copies the layer file `src` (whose data blocks are `map`) to `dst`,
/// keeping its holes. `size` is the apparent size both must have.
pub fn copy_layer(src: &Path, map: &Bitmap, dst: &Path, size: u64) -> Result<CopyPath, SyncError> {
    let tmp = temp_path(dst);
    // The rename (like the data) becomes durable when the layer is
    // completed: the file is synced and the metadata rewritten, which
    // syncs this directory.
    let result = copy_checked(src, map, &tmp, size)
        .and_then(|path| std::fs::rename(&tmp, dst).map_err(io(dst)).map(|()| path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

fn copy_checked(src: &Path, map: &Bitmap, tmp: &Path, size: u64) -> Result<CopyPath, SyncError> {
    let s = File::open(src).map_err(io(src))?;
    let extents: Vec<(u64, u64)> = map
        .runs()
        .into_iter()
        .map(|(a, b)| (a * BLOCK, (b - a) * BLOCK))
        .collect();
    let mut failures = Vec::new();
    for way in [
        CopyPath::Reflink,
        CopyPath::CopyFileRange,
        CopyPath::ReadWrite,
    ] {
        // Each way starts from a new, empty file (truncating one that has
        // data would make ext4 flush it on close). A clone brings its size;
        // a copy gives the target its size first, then the data.
        let _ = std::fs::remove_file(tmp);
        let d = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(tmp)
            .map_err(io(tmp))?;
        let copied = match way {
            CopyPath::Reflink => reflink(&s, &d),
            CopyPath::CopyFileRange => d.set_len(size).and_then(|()| copy_ranges(&s, &d, &extents)),
            _ => d.set_len(size).and_then(|()| read_write(&s, &d, &extents)),
        };
        if let Err(e) = copied {
            tracing::debug!(way = way.as_str(), error = %e, "local copy way failed; trying the next");
            failures.push(format!("{}: {e}", way.as_str()));
            continue;
        }
        // Durability comes with completing the layer, which syncs it
        // before it is recorded complete.
        let len = d.metadata().map_err(io(tmp))?.len();
        if len != size {
            return Err(SyncError::Check(format!(
                "{}: apparent size {len}, want {size}",
                tmp.display()
            )));
        }
        let got = crate::replica::allocation(&d, size / BLOCK).map_err(io(tmp))?;
        if &got != map {
            return Err(SyncError::Check(format!(
                "{}: {} data blocks where the source has {}",
                tmp.display(),
                got.count(),
                map.count()
            )));
        }
        return Ok(way);
    }
    Err(SyncError::Check(format!(
        "no way to copy {} worked: {}",
        src.display(),
        failures.join("; ")
    )))
}
