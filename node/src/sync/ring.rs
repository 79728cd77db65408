//! The local copy's way after a reflink: the source's data extents read
//! with direct I/O through one io_uring, many reads in flight at once (but
//! those the page cache holds, read from it), each written through the
//! page cache to the target as it arrives, and the target's writeback
//! started behind the copy. This file copies byte ranges between two files
//! and nothing else: which way a copy takes, and the checks of what it
//! made, are `local.rs`'s.
//!
//! Why this way (measured in docs/data-plane.md): on a cold, fragmented
//! layer a copy through the page cache spends its time in the kernel, about
//! 55 µs of system time per 16 KiB extent read and written; direct reads
//! leave the source's page cache out, and one thread keeps 64 of them in
//! flight without a thread each.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::mpsc;

use io_uring::{IoUring, opcode, types};

use super::Gate;
use crate::replica::begin_writeback;

/// Reads in flight at once.
pub(super) const DEPTH: usize = 64;
/// The most bytes one read asks for: each read has a buffer of this size.
const SLOT: u64 = 256 << 10;
/// Direct I/O's alignment of buffers, offsets and lengths (a layer's
/// extents are whole blocks of 4 KiB).
const ALIGN: u64 = 4096;
/// The target's writeback is started each time this many more bytes of it,
/// in file order, have been written.
const WRITEBACK_EVERY: u64 = 16 << 20;

/// Copies `extents` (offset, length) of the file at `src` into `dst` at the
/// same offsets, each piece once `gate` lets it through. Fails, with
/// nothing in flight, when the kernel has no io_uring for this process or
/// the source's filesystem refuses direct I/O: the caller then takes
/// another way. Returns where the bytes were read from.
pub(super) fn copy(
    src: &Path,
    dst: &File,
    extents: &[(u64, u64)],
    gate: &Gate,
) -> std::io::Result<ReadFrom> {
    let pieces = super::pieces(extents, SLOT);
    if let Some(&(at, len)) = pieces
        .iter()
        .find(|&&(at, len)| at % ALIGN != 0 || len % ALIGN != 0)
    {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("extent at {at} of {len} bytes is not aligned for direct reads"),
        ));
    }
    let source = Source::open(src)?;
    let mut reads = Reads::new()?;
    let (marks, behind) = mpsc::channel::<u64>();
    std::thread::scope(|s| {
        s.spawn(move || writeback_behind(dst, behind));
        // The channel closes when the copy returns, and the thread ends.
        reads.run(&source, dst, (&pieces, gate), Written::new(&pieces, marks))
    })
}

/// Starts the writeback of `dst` up to each mark received: the target's
/// dirty pages go to the disk while the copy goes on, not all at the sync
/// that completes the layer. Only a start: durability is that sync's.
fn writeback_behind(dst: &File, marks: mpsc::Receiver<u64>) {
    let mut started = 0u64;
    while let Ok(mut mark) = marks.recv() {
        // Take the latest mark of those waiting.
        while let Ok(later) = marks.try_recv() {
            mark = later;
        }
        if mark <= started {
            continue;
        }
        if let Err(e) = begin_writeback(dst, started, mark - started) {
            // The sync that completes the layer reports what matters.
            tracing::debug!(error = %e, "starting the copy's writeback failed");
            return;
        }
        started = mark;
    }
}

/// The ring and the buffers its reads fill. Dropping it waits for every
/// read still in flight, so that no buffer is freed while the kernel may
/// still write into it.
struct Reads {
    ring: IoUring,
    /// `DEPTH` slots of `SLOT` bytes from `base`, an aligned offset into
    /// `buf`. Only reached through `base`, never through `buf` itself.
    buf: Vec<u8>,
    base: *mut u8,
    inflight: usize,
}

impl Reads {
    fn new() -> std::io::Result<Self> {
        let ring = IoUring::new(DEPTH as u32)?;
        let mut buf = vec![0u8; DEPTH * SLOT as usize + ALIGN as usize];
        let skip = buf.as_ptr().align_offset(ALIGN as usize);
        // SAFETY: `skip` < ALIGN, and the buffer has ALIGN bytes to spare.
        let base = unsafe { buf.as_mut_ptr().add(skip) };
        Ok(Reads {
            ring,
            buf,
            base,
            inflight: 0,
        })
    }

    fn slot(&self, k: usize) -> *mut u8 {
        // SAFETY: k < DEPTH, so the slot lies inside the buffer.
        unsafe { self.base.add(k * SLOT as usize) }
    }

    /// Queues a read of `len` bytes at `at` into slot `k`, `skip` bytes in.
    fn push(&mut self, src: &File, k: usize, skip: u64, at: u64, len: u64) -> std::io::Result<()> {
        // SAFETY: skip + len <= SLOT, inside slot k.
        let into = unsafe { self.slot(k).add(skip as usize) };
        let read = opcode::Read::new(types::Fd(src.as_raw_fd()), into, len as u32)
            .offset(at)
            .build()
            .user_data(k as u64);
        // SAFETY: the slot's buffer lives until the read completes (Drop
        // waits for it), and nothing else touches the slot meanwhile. The
        // queue has room: at most DEPTH reads are queued or in flight,
        // and the ring has DEPTH entries.
        unsafe { self.ring.submission().push(&read) }
            .map_err(|_| std::io::Error::other("the ring's submission queue is full"))?;
        self.inflight += 1;
        Ok(())
    }

    /// Waits for at least one read, and returns those done: (slot, result).
    fn wait(&mut self, done: &mut Vec<(usize, i32)>) -> std::io::Result<()> {
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        done.clear();
        done.extend(
            self.ring
                .completion()
                .map(|c| (c.user_data() as usize, c.result())),
        );
        self.inflight -= done.len();
        Ok(())
    }

    /// Copies every piece, once `gate` lets it through: read from the
    /// page cache if all there, else with direct I/O; written as it lands.
    /// A gate that stops the copy leaves the reads in flight to `Drop`.
    fn run(
        &mut self,
        source: &Source,
        dst: &File,
        (pieces, gate): (&[(u64, u64)], &Gate),
        mut written: Written,
    ) -> std::io::Result<ReadFrom> {
        let mut from = ReadFrom::default();
        // Per slot: the piece it reads and the bytes of it read so far.
        let mut slots = vec![(0usize, 0u64); DEPTH];
        let mut free: Vec<usize> = (0..DEPTH).rev().collect();
        let mut next = 0;
        let mut done = Vec::with_capacity(DEPTH);
        loop {
            while next < pieces.len() {
                let Some(&k) = free.last() else { break };
                let p = next;
                next += 1;
                let (at, len) = pieces[p];
                gate.ask(len)?;
                if source.in_cache(at, len) {
                    // SAFETY: slot k is free (no read in flight into it)
                    // and holds len <= SLOT bytes.
                    let data =
                        unsafe { std::slice::from_raw_parts_mut(self.slot(k), len as usize) };
                    source.cached.file.read_exact_at(data, at)?;
                    dst.write_all_at(data, at)?;
                    from.cache += len;
                    written.piece(p);
                    continue;
                }
                free.pop();
                slots[k] = (p, 0);
                self.push(&source.direct, k, 0, at, len)?;
                from.disk += len;
            }
            if self.inflight == 0 {
                return Ok(from);
            }
            self.wait(&mut done)?;
            for &(k, result) in &done {
                let (p, got) = slots[k];
                let (at, len) = pieces[p];
                let n = u64::try_from(result)
                    .map_err(|_| std::io::Error::from_raw_os_error(-result))?;
                if n == 0 {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!("the source ends before {}", at + got),
                    ));
                }
                let got = got + n;
                if got < len {
                    // A short read: ask for the rest (a direct read stops
                    // on a block boundary).
                    if got % ALIGN != 0 {
                        return Err(std::io::Error::other(format!(
                            "a direct read at {at} stopped inside a block"
                        )));
                    }
                    slots[k].1 = got;
                    self.push(&source.direct, k, got, at + got, len - got)?;
                    continue;
                }
                // SAFETY: the read into slot k is done, and the slot is not
                // reused before this write returns.
                let data = unsafe { std::slice::from_raw_parts(self.slot(k), len as usize) };
                dst.write_all_at(data, at)?;
                free.push(k);
                written.piece(p);
            }
        }
    }
}

/// Where a copy's bytes were read from.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct ReadFrom {
    /// Bytes read from the page cache (the source was warm there).
    pub cache: u64,
    /// Bytes read from the disk, with direct I/O.
    pub disk: u64,
}

/// The source, open twice: through the page cache (for what is cached)
/// and for direct I/O.
struct Source {
    cached: Residency,
    direct: File,
}

impl Source {
    fn open(path: &Path) -> std::io::Result<Self> {
        let cached = Residency::open(path)?;
        let direct = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)?;
        Ok(Source { cached, direct })
    }

    /// Whether every page of `len` bytes at `at` is in the page cache.
    /// Asking starts no read (a read that would not wait, RWF_NOWAIT,
    /// starts one when it finds nothing).
    fn in_cache(&self, at: u64, len: u64) -> bool {
        let mut pages = [0u8; (SLOT / 4096) as usize + 1];
        let start = at - at % self.cached.page;
        let count = self.cached.incore(start, at + len, &mut pages);
        count > 0 && pages[..count].iter().all(|p| p & 1 == 1)
    }
}

/// A file open through the page cache, and mapped only to ask which of
/// its pages are cached (`mincore`).
struct Residency {
    file: File,
    map: Option<memmap2::Mmap>,
    page: u64,
}

impl Residency {
    fn open(path: &Path) -> std::io::Result<Self> {
        let file = File::open(path)?;
        // SAFETY: the map is never read, only passed to mincore.
        let map = unsafe { memmap2::Mmap::map(&file) }.ok();
        // SAFETY: sysconf has no preconditions.
        let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        Ok(Residency { file, map, page })
    }

    /// Fills `pages` with a byte per page from `start` (on a page) to
    /// `end`, its lowest bit set when the page is in the page cache.
    /// Returns the pages filled: 0 when unknown (no map, the range past
    /// it, or `pages` too short).
    fn incore(&self, start: u64, end: u64, pages: &mut [u8]) -> usize {
        let Some(map) = &self.map else { return 0 };
        let end = end.min(map.len() as u64);
        let count = (end.saturating_sub(start)).div_ceil(self.page) as usize;
        if count == 0 || count > pages.len() {
            return 0;
        }
        // SAFETY: the range lies inside the mapping, and `pages` has a
        // byte for each of its pages.
        let r = unsafe {
            libc::mincore(
                map.as_ptr().add(start as usize) as *mut libc::c_void,
                (end - start) as usize,
                pages.as_mut_ptr(),
            )
        };
        if r == 0 { count } else { 0 }
    }
}

/// Bytes of `extents` of the file at `src` in the page cache, asked a
/// window of 64 MiB at a time (no read is started). 0 when it cannot be
/// told.
pub(super) fn cached_bytes(src: &Path, extents: &[(u64, u64)]) -> u64 {
    const WINDOW: u64 = 64 << 20;
    let Ok(source) = Residency::open(src) else {
        return 0;
    };
    let mut pages = vec![0u8; (WINDOW / source.page) as usize];
    let (mut window, mut filled) = (u64::MAX, 0);
    let mut cached = 0;
    for &(at, len) in extents {
        let mut pos = at;
        while pos < at + len {
            let w = pos - pos % WINDOW;
            if w != window {
                window = w;
                filled = source.incore(w, w + WINDOW, &mut pages);
            }
            let upto = (at + len).min(w + WINDOW);
            let (first, last) = (
                ((pos - w) / source.page) as usize,
                (upto - w).div_ceil(source.page) as usize,
            );
            if last <= filled {
                let resident = pages[first..last].iter().filter(|&&p| p & 1 == 1).count();
                cached += (resident as u64 * source.page).min(upto - pos);
            }
            pos = upto;
        }
    }
    cached
}

/// The pieces written so far, and the mark up to which the target's
/// writeback may start: the start of the first piece not yet written.
struct Written<'a> {
    pieces: &'a [(u64, u64)],
    done: Vec<bool>,
    first_not_done: usize,
    marked: u64,
    marks: mpsc::Sender<u64>,
}

impl<'a> Written<'a> {
    fn new(pieces: &'a [(u64, u64)], marks: mpsc::Sender<u64>) -> Self {
        Written {
            pieces,
            done: vec![false; pieces.len()],
            first_not_done: 0,
            marked: 0,
            marks,
        }
    }

    fn piece(&mut self, p: usize) {
        self.done[p] = true;
        while self.done.get(self.first_not_done) == Some(&true) {
            self.first_not_done += 1;
        }
        if let Some(&(upto, _)) = self.pieces.get(self.first_not_done)
            && upto >= self.marked + WRITEBACK_EVERY
        {
            self.marked = upto;
            // The thread gone only means no early writeback.
            let _ = self.marks.send(upto);
        }
    }
}

impl Drop for Reads {
    fn drop(&mut self) {
        let mut done = Vec::new();
        while self.inflight > 0 {
            if self.wait(&mut done).is_err() {
                // Reads may still land in the buffer: never free it.
                std::mem::forget(std::mem::take(&mut self.buf));
                return;
            }
        }
    }
}
