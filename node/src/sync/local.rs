//! Local sparse copy of one frozen layer, for a rebuild whose source and
//! target replicas are on the same node. Four ways, each the fallback of
//! the one before: a reflink (FICLONE) of the whole file; the data extents
//! read with direct I/O through an io_uring, many at once, and written
//! through the page cache (`ring.rs`); `copy_file_range` per data extent;
//! and pread/pwrite per data extent, the last two on several threads at
//! once. Holes are never copied. The copy goes to a hidden temp file beside
//! the target, is checked (apparent size, and the same data extents as the
//! source), and then renamed over the target; on any error the temp file is
//! removed.
//!
//! Every way that copies data asks its `Gate` before each piece: the
//! fill's pace (a rebuild's rate holds for a copy within a node too) and
//! whether the fill was called off. A reflink copies no data, so it asks
//! nothing.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::replica::{BLOCK, Bitmap};

use super::{Gate, Stopped, SyncError};

/// How a layer was copied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CopyPath {
    Reflink,
    /// Direct reads through an io_uring (`io-uring`).
    IoUring,
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
            CopyPath::IoUring => "io-uring",
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
const STREAMS: usize = 8;
/// Reads the io_uring way keeps in flight at once.
pub const RING_DEPTH: usize = super::ring::DEPTH;
/// The most bytes one piece of work copies: a large extent is cut, so
/// that it too is read by several threads.
const PIECE: u64 = 4 << 20;

/// Runs `copy` on every piece of `extents`, on up to `STREAMS` threads,
/// each with state of its own from `init`, each piece once `gate` lets it
/// through. The first error stops them all and is returned.
fn in_parallel<S>(
    extents: &[(u64, u64)],
    gate: &Gate,
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
            let done = gate.ask(len).and_then(|()| copy(&mut state, at, len));
            if let Err(e) = done {
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

fn copy_ranges(src: &File, dst: &File, extents: &[(u64, u64)], gate: &Gate) -> std::io::Result<()> {
    in_parallel(
        extents,
        gate,
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

fn read_write(src: &File, dst: &File, extents: &[(u64, u64)], gate: &Gate) -> std::io::Result<()> {
    in_parallel(
        extents,
        gate,
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
    copy_layer_gated(src, map, dst, size, &Gate::OPEN)
}

/// `copy_layer`, each piece let through by `gate` (see `Gate`).
pub fn copy_layer_gated(
    src: &Path,
    map: &Bitmap,
    dst: &Path,
    size: u64,
    gate: &Gate,
) -> Result<CopyPath, SyncError> {
    let tmp = temp_path(dst);
    // The rename (like the data) becomes durable when the layer is
    // completed: the file is synced and the metadata rewritten, which
    // syncs this directory.
    let result = copy_checked(src, map, &tmp, size, gate)
        .and_then(|path| std::fs::rename(&tmp, dst).map_err(io(dst)).map(|()| path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

fn copy_checked(
    src: &Path,
    map: &Bitmap,
    tmp: &Path,
    size: u64,
    gate: &Gate,
) -> Result<CopyPath, SyncError> {
    let s = File::open(src).map_err(io(src))?;
    let extents = super::byte_ranges(&map.runs());
    let mut failures = Vec::new();
    for way in [
        CopyPath::Reflink,
        CopyPath::IoUring,
        CopyPath::CopyFileRange,
        CopyPath::ReadWrite,
    ] {
        // A layer mostly in the page cache copies fastest from page to
        // page on several threads (copy_file_range); one mostly on the
        // disk through the ring's direct reads. Asked only once a reflink
        // has failed.
        if way == CopyPath::IoUring {
            let total: u64 = extents.iter().map(|e| e.1).sum();
            let cached = super::ring::cached_bytes(src, &extents);
            tracing::debug!(cached, total, "layer to copy");
            if cached * 2 > total {
                continue;
            }
        }
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
            CopyPath::IoUring => d.set_len(size).and_then(|()| {
                let from = super::ring::copy(src, &d, &extents, gate)?;
                tracing::debug!(cache = from.cache, disk = from.disk, "layer read");
                Ok(())
            }),
            CopyPath::CopyFileRange => d
                .set_len(size)
                .and_then(|()| copy_ranges(&s, &d, &extents, gate)),
            _ => d
                .set_len(size)
                .and_then(|()| read_write(&s, &d, &extents, gate)),
        };
        if let Err(e) = copied {
            if let Some(stopped) = e.get_ref().and_then(|i| i.downcast_ref::<Stopped>()) {
                return Err(SyncError::Source(stopped.0.clone()));
            }
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
    use crate::sync::ring;

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

    /// The ring tests' source: 16 MiB with `n` extents of 16 KiB, one
    /// every `stride` bytes; its allocation, and its runs in bytes.
    fn strided(dir: &Path, n: u64, stride: u64) -> (PathBuf, Bitmap, Vec<(u64, u64)>) {
        let extents: Vec<(u64, u64)> = (0..n).map(|k| (k * stride, 16384)).collect();
        let (src, map) = sparse(dir, SMALL, &extents);
        let runs = crate::sync::byte_ranges(&map.runs());
        (src, map, runs)
    }

    const SMALL: u64 = 16 << 20;

    fn same_bytes(a: &Path, b: &Path) {
        let (a, b) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
        assert_eq!(a.len(), b.len());
        assert!(a == b, "the copy's bytes differ from the source's");
    }

    /// Many small extents and one larger than a piece: every way but the
    /// reflink copies them all, on several threads or many reads at once,
    /// and only them.
    #[test]
    fn each_parallel_way_copies_every_extent_and_no_hole() {
        let dir = tempfile::tempdir().unwrap();
        let size = 64 << 20;
        let mut extents: Vec<(u64, u64)> = (0..200).map(|k| (k * 128 * 1024, 8192)).collect();
        extents.push((40 << 20, PIECE * 2 + 3 * BLOCK));
        let (src, map) = sparse(dir.path(), size, &extents);
        let runs = crate::sync::byte_ranges(&map.runs());
        assert!(runs.len() > STREAMS, "{} extents", runs.len());
        // The ring way first, from a cold source: the other ways' readahead
        // would leave reads in flight into the page cache.
        let dst = dir.path().join("io-uring.img");
        let d = File::create(&dst).unwrap();
        d.set_len(size).unwrap();
        uncache(&src);
        let from = crate::sync::ring::copy(&src, &d, &runs, &Gate::OPEN).unwrap();
        let total: u64 = runs.iter().map(|r| r.1).sum();
        assert_eq!(
            from,
            ring::ReadFrom {
                cache: 0,
                disk: total
            }
        );
        check_copy("io_uring", &src, &dst, &d, &map, size);
        let s = File::open(&src).unwrap();
        for (way, copy) in [
            (
                "copy_file_range",
                copy_ranges as fn(&File, &File, &[(u64, u64)], &Gate) -> _,
            ),
            ("read/write", read_write),
        ] {
            let dst = dir.path().join(format!("{way}.img").replace('/', "-"));
            let d = File::create(&dst).unwrap();
            d.set_len(size).unwrap();
            copy(&s, &d, &runs, &Gate::OPEN).unwrap();
            check_copy(way, &src, &dst, &d, &map, size);
        }
    }

    /// Bytes of `path` in the page cache.
    fn resident(path: &Path) -> u64 {
        let f = File::open(path).unwrap();
        // SAFETY: the map is only passed to mincore, never read.
        let map = unsafe { memmap2::Mmap::map(&f) }.unwrap();
        let mut pages = vec![0u8; map.len().div_ceil(4096)];
        // SAFETY: the vector has a byte per page of the mapping.
        let r = unsafe { libc::mincore(map.as_ptr() as *mut _, map.len(), pages.as_mut_ptr()) };
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        pages.iter().filter(|&&p| p & 1 == 1).count() as u64 * 4096
    }

    /// Drops `path`'s pages from the page cache (they are clean), waiting
    /// for reads still in flight into it (readahead) to land first.
    fn uncache(path: &Path) {
        let f = File::open(path).unwrap();
        for _ in 0..500 {
            nix::fcntl::posix_fadvise(
                &f,
                0,
                0,
                nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
            )
            .unwrap();
            if resident(path) == 0 {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("{} stays in the page cache", path.display());
    }

    /// The ring way reads what the page cache holds from it, and only
    /// the rest from the disk: a source half warm is read half from each.
    #[test]
    fn the_ring_copy_reads_cached_extents_from_the_cache_and_the_rest_direct() {
        let dir = tempfile::tempdir().unwrap();
        let (src, map, runs) = strided(dir.path(), 100, 64 * 1024);
        uncache(&src);
        // Every other extent read back, without readahead.
        let warm = File::open(&src).unwrap();
        nix::fcntl::posix_fadvise(
            &warm,
            0,
            0,
            nix::fcntl::PosixFadviseAdvice::POSIX_FADV_RANDOM,
        )
        .unwrap();
        let mut buf = vec![0u8; 16384];
        for &(at, _) in runs.iter().step_by(2) {
            warm.read_exact_at(&mut buf, at).unwrap();
        }
        assert_eq!(resident(&src), 50 * 16384, "the warm half alone is cached");
        let dst = dir.path().join("dst.img");
        let d = File::create(&dst).unwrap();
        d.set_len(SMALL).unwrap();
        let from = crate::sync::ring::copy(&src, &d, &runs, &Gate::OPEN).unwrap();
        assert_eq!(
            from,
            ring::ReadFrom {
                cache: 50 * 16384,
                disk: 50 * 16384
            }
        );
        check_copy("io_uring", &src, &dst, &d, &map, SMALL);
    }

    /// `dst` (open as `d`) holds `src`'s bytes, and data exactly where
    /// `map` says.
    fn check_copy(way: &str, src: &Path, dst: &Path, d: &File, map: &Bitmap, size: u64) {
        d.sync_all().unwrap();
        same_bytes(src, dst);
        let got = crate::replica::allocation(d, size / BLOCK).unwrap();
        assert!(
            got == *map,
            "{way}: {} data blocks, the source has {}",
            got.count(),
            map.count()
        );
    }

    /// The ring way with more reads than its depth, the first past the
    /// source's end: the copy fails with that read's error (after waiting
    /// for the reads still in flight), and a later copy works.
    #[test]
    fn the_ring_copy_fails_on_a_read_past_the_end_and_can_copy_again() {
        let dir = tempfile::tempdir().unwrap();
        let (src, map, mut runs) = strided(dir.path(), 300, 32 * 1024);
        let d = File::create(dir.path().join("dst.img")).unwrap();
        runs.insert(0, (SMALL + (1 << 20), BLOCK));
        let e = crate::sync::ring::copy(&src, &d, &runs, &Gate::OPEN).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{e}");
        runs.remove(0);
        crate::sync::ring::copy(&src, &d, &runs, &Gate::OPEN).unwrap();
        d.set_len(SMALL).unwrap();
        check_copy(
            "io_uring",
            &src,
            &dir.path().join("dst.img"),
            &d,
            &map,
            SMALL,
        );
    }

    /// Extents that direct reads cannot take are refused before any read.
    #[test]
    fn the_ring_copy_refuses_extents_not_on_block_boundaries() {
        let dir = tempfile::tempdir().unwrap();
        let (src, _) = sparse(dir.path(), 1 << 20, &[(0, BLOCK)]);
        let d = File::create(dir.path().join("dst.img")).unwrap();
        let e = crate::sync::ring::copy(&src, &d, &[(512, BLOCK)], &Gate::OPEN).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
        assert!(e.to_string().contains("not aligned"), "{e}");
    }

    /// On ext4 (no reflink): a cold layer is copied through the ring, a
    /// warm one from page to page; both exactly.
    #[test]
    fn a_cold_layer_is_copied_through_the_ring_and_a_warm_one_page_to_page() {
        let dir = tempfile::tempdir().unwrap();
        let (src, map, runs) = strided(dir.path(), 100, 96 * 1024);
        let total = 100 * 16384;
        uncache(&src);
        assert_eq!(ring::cached_bytes(&src, &runs), 0);
        let dst = dir.path().join("cold.img");
        assert_eq!(
            copy_layer(&src, &map, &dst, SMALL).unwrap(),
            CopyPath::IoUring
        );
        check_copy("cold", &src, &dst, &File::open(&dst).unwrap(), &map, SMALL);
        // Reading it to check the copy brought the source into the cache.
        assert_eq!(ring::cached_bytes(&src, &runs), total);
        let dst = dir.path().join("warm.img");
        assert_eq!(
            copy_layer(&src, &map, &dst, SMALL).unwrap(),
            CopyPath::CopyFileRange
        );
        check_copy("warm", &src, &dst, &File::open(&dst).unwrap(), &map, SMALL);
    }

    /// Every way that copies data asks the gate before each piece, and a
    /// gate that stops (the fill called off) ends the copy with its error:
    /// no other way is tried, and no partial file stays. Through the ring
    /// (a cold source) and page to page (a warm one); the gate of a whole
    /// copy is asked for every byte once.
    #[test]
    fn every_way_asks_the_gate_and_a_gate_that_stops_ends_the_copy() {
        let dir = tempfile::tempdir().unwrap();
        let (src, map, _) = strided(dir.path(), 100, 96 * 1024);
        let total = 100 * 16384;
        for (cold, way) in [(true, CopyPath::IoUring), (false, CopyPath::CopyFileRange)] {
            if cold {
                uncache(&src);
            }
            let counted = std::sync::atomic::AtomicU64::new(0);
            let asked = &counted;
            let stop_after = |limit: u64| {
                move |n: u64| {
                    if asked.fetch_add(n, Ordering::SeqCst) >= limit {
                        return Err(SyncError::Source("the fill was called off".into()));
                    }
                    Ok(())
                }
            };
            let dst = dir.path().join(format!("stopped-{cold}.img"));
            let e =
                copy_layer_gated(&src, &map, &dst, SMALL, &Gate(&stop_after(16384))).unwrap_err();
            assert!(e.to_string().contains("called off"), "{way:?}: {e}");
            assert!(!dst.exists() && !temp_path(&dst).exists(), "{way:?}");
            let after_stop = asked.swap(0, Ordering::SeqCst);
            assert!(after_stop < total, "{way:?}: {after_stop} bytes asked for");
            if cold {
                uncache(&src);
            }
            let dst = dir.path().join(format!("whole-{cold}.img"));
            assert_eq!(
                copy_layer_gated(&src, &map, &dst, SMALL, &Gate(&stop_after(u64::MAX))).unwrap(),
                way
            );
            assert_eq!(asked.load(Ordering::SeqCst), total, "{way:?}");
            check_copy("gated", &src, &dst, &File::open(&dst).unwrap(), &map, SMALL);
        }
    }

    /// A piece that fails stops the copy with its error.
    #[test]
    fn a_failing_piece_fails_the_copy() {
        let extents: Vec<(u64, u64)> = (0..100).map(|k| (k * BLOCK * 2, BLOCK)).collect();
        let copied = AtomicUsize::new(0);
        let r = in_parallel(
            &extents,
            &Gate::OPEN,
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
