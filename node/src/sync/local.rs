//! Local sparse copy of one frozen layer, for a rebuild whose source and
//! target replicas are on the same node. Three ways, each the fallback of
//! the one before: a reflink (FICLONE) of the whole file, `copy_file_range`
//! per data extent, and pread/pwrite per data extent; the last two on
//! several threads at once. Holes are never copied. The copy goes to a hidden temp file beside the target, is
//! checked (apparent size, and the same data extents as the source), and
//! then renamed over the target; on any error the temp file is removed.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

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

/// Threads that copy a layer's extents at once. On a fragmented layer
/// (tens of thousands of small extents) a copy's time goes to cold reads,
/// and one thread reads at queue depth 1: several keep the disk's queue
/// full. Each takes the next piece in file order, so reads stay close.
pub const STREAMS: usize = 8;
/// The most bytes one piece of work copies: a large extent is cut, so
/// that it too is read by several threads.
const PIECE: u64 = 4 << 20;

/// Runs `copy` on every piece of `extents`, on up to `STREAMS` threads,
/// each with state of its own from `init`. The first error stops them all
/// and is returned.
fn in_parallel<S>(
    extents: &[(u64, u64)],
    init: impl Fn() -> S + Sync,
    copy: impl Fn(&mut S, u64, u64) -> std::io::Result<()> + Sync,
) -> std::io::Result<()> {
    let pieces = super::pieces(extents, PIECE);
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let work = || -> std::io::Result<()> {
        let mut state = init();
        while !failed.load(Ordering::Relaxed) {
            let Some(&(at, len)) = pieces.get(next.fetch_add(1, Ordering::Relaxed)) else {
                return Ok(());
            };
            if let Err(e) = copy(&mut state, at, len) {
                failed.store(true, Ordering::Relaxed);
                return Err(e);
            }
        }
        Ok(())
    };
    let streams = STREAMS.min(pieces.len());
    std::thread::scope(|s| {
        let others: Vec<_> = (1..streams).map(|_| s.spawn(work)).collect();
        let mut result = if streams > 0 { work() } else { Ok(()) };
        for t in others {
            let joined = t
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("a copy thread panicked")));
            result = result.and(joined);
        }
        result
    })
}

fn copy_ranges(src: &File, dst: &File, extents: &[(u64, u64)]) -> std::io::Result<()> {
    in_parallel(
        extents,
        || (),
        |(), start, len| {
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
            Ok(())
        },
    )
}

fn read_write(src: &File, dst: &File, extents: &[(u64, u64)]) -> std::io::Result<()> {
    in_parallel(
        extents,
        || vec![0u8; PIECE as usize],
        |buf, start, len| {
            let n = len as usize;
            src.read_exact_at(&mut buf[..n], start)?;
            dst.write_all_at(&buf[..n], start)
        },
    )
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
    let extents = super::byte_ranges(&map.runs());
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A sparse file of `size` with data at `extents` (offset, length),
    /// each byte depending on its offset; and its allocation.
    fn sparse(dir: &Path, size: u64, extents: &[(u64, u64)]) -> (PathBuf, Bitmap) {
        let path = dir.join("src.img");
        let f = File::create(&path).unwrap();
        f.set_len(size).unwrap();
        for &(at, len) in extents {
            let data: Vec<u8> = (at..at + len).map(|i| (i * 7 + i / 4096) as u8).collect();
            f.write_all_at(&data, at).unwrap();
        }
        f.sync_all().unwrap();
        let map = crate::replica::allocation(&f, size / BLOCK).unwrap();
        (path, map)
    }

    fn same_bytes(a: &Path, b: &Path) {
        let (a, b) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
        assert_eq!(a.len(), b.len());
        assert!(a == b, "the copy's bytes differ from the source's");
    }

    /// Many small extents and one larger than a piece: every way copies
    /// them all, on several threads, and only them.
    #[test]
    fn each_parallel_way_copies_every_extent_and_no_hole() {
        let dir = tempfile::tempdir().unwrap();
        let size = 64 << 20;
        let mut extents: Vec<(u64, u64)> = (0..200).map(|k| (k * 128 * 1024, 8192)).collect();
        extents.push((40 << 20, PIECE * 2 + 3 * BLOCK));
        let (src, map) = sparse(dir.path(), size, &extents);
        let runs = crate::sync::byte_ranges(&map.runs());
        assert!(runs.len() > STREAMS, "{} extents", runs.len());
        let s = File::open(&src).unwrap();
        for (way, copy) in [
            (
                "copy_file_range",
                copy_ranges as fn(&File, &File, &[(u64, u64)]) -> _,
            ),
            ("read/write", read_write),
        ] {
            let dst = dir.path().join(format!("{way}.img").replace('/', "-"));
            let d = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&dst)
                .unwrap();
            d.set_len(size).unwrap();
            copy(&s, &d, &runs).unwrap();
            d.sync_all().unwrap();
            same_bytes(&src, &dst);
            let got = crate::replica::allocation(&d, size / BLOCK).unwrap();
            assert!(
                got == map,
                "{way}: {} data blocks, the source has {}",
                got.count(),
                map.count()
            );
        }
    }

    /// A piece that fails stops the copy with its error.
    #[test]
    fn a_failing_piece_fails_the_copy() {
        let extents: Vec<(u64, u64)> = (0..100).map(|k| (k * BLOCK * 2, BLOCK)).collect();
        let copied = AtomicUsize::new(0);
        let r = in_parallel(
            &extents,
            || (),
            |(), at, _| {
                if at == 50 * BLOCK * 2 {
                    return Err(std::io::Error::other("bad sector"));
                }
                copied.fetch_add(1, Ordering::Relaxed);
                Ok(())
            },
        );
        assert_eq!(r.unwrap_err().to_string(), "bad sector");
        assert!(copied.load(Ordering::Relaxed) < 100);
    }

    #[test]
    fn pieces_cut_large_extents_and_keep_file_order() {
        let p = crate::sync::pieces(&[(0, BLOCK), (PIECE, PIECE * 2 + BLOCK)], PIECE);
        assert_eq!(
            p,
            vec![
                (0, BLOCK),
                (PIECE, PIECE),
                (PIECE * 2, PIECE),
                (PIECE * 3, BLOCK)
            ]
        );
    }
}
