//! Reads of the local replica straight from its files, without the hop
//! through the replica server. The engine is the volume's only writer and
//! every write lands in the head layer through the replica server, so:
//! the frozen layers never change (their allocation is read once), and
//! which blocks the head holds is asked of the filesystem at read time
//! (SEEK_DATA/SEEK_HOLE, which counts written but unflushed pages). A
//! snapshot or a rebuild changes the chain; the engine then drops this
//! reader and opens a new one with I/O paused.

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use nix::unistd::{Whence, lseek};

use crate::replica::{BLOCK, Bitmap, Meta, allocation};

pub struct LocalReader {
    size: u64,
    /// Oldest first.
    frozen: Vec<(File, Bitmap)>,
    head: File,
    dir: PathBuf,
}

fn io(e: impl Into<std::io::Error>) -> std::io::Error {
    e.into()
}

impl LocalReader {
    pub fn open(dir: &Path) -> std::io::Result<LocalReader> {
        let meta = Meta::read(dir).map_err(std::io::Error::other)?;
        if !meta.pending.is_empty() {
            return Err(std::io::Error::other("the replica is still being rebuilt"));
        }
        let (head, frozen) = meta
            .chain
            .split_last()
            .ok_or_else(|| std::io::Error::other("empty chain"))?;
        let mut layers = Vec::new();
        for name in frozen {
            let f = File::open(dir.join(name))?;
            let map = allocation(&f, meta.size / BLOCK)?;
            layers.push((f, map));
        }
        Ok(LocalReader {
            size: meta.size,
            frozen: layers,
            head: File::open(dir.join(head))?,
            dir: dir.to_path_buf(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the head's data runs start and end within [start, end).
    fn head_runs(&self, start: u64, end: u64) -> std::io::Result<Vec<(u64, u64)>> {
        let fd = self.head.as_fd();
        let mut runs = Vec::new();
        let mut pos = start;
        while pos < end {
            let data = match lseek(fd, pos as i64, Whence::SeekData) {
                Ok(d) => d as u64,
                Err(nix::errno::Errno::ENXIO) => break,
                Err(e) => return Err(io(e)),
            };
            if data >= end {
                break;
            }
            let hole = lseek(fd, data as i64, Whence::SeekHole).map_err(io)? as u64;
            runs.push((data, hole.min(end)));
            pos = hole;
        }
        Ok(runs)
    }

    /// Fills `out` (for [offset, offset+len)) from the frozen layers, for
    /// the part the head does not hold.
    fn read_below(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        let end = offset + out.len() as u64;
        let mut pos = offset;
        while pos < end {
            let b = pos / BLOCK;
            let holder = |b: u64| {
                (0..self.frozen.len())
                    .rev()
                    .find(|&i| self.frozen[i].1.get(b))
            };
            let h = holder(b);
            let mut run_end = ((b + 1) * BLOCK).min(end);
            while run_end < end && holder(run_end / BLOCK) == h {
                run_end = ((run_end / BLOCK + 1) * BLOCK).min(end);
            }
            let slice = &mut out[(pos - offset) as usize..(run_end - offset) as usize];
            match h {
                Some(i) => self.frozen[i].0.read_exact_at(slice, pos)?,
                None => slice.fill(0),
            }
            pos = run_end;
        }
        Ok(())
    }

    /// Reads `len` bytes at `offset`.
    pub fn read(&self, offset: u64, len: u32) -> std::io::Result<Vec<u8>> {
        let end = offset + u64::from(len);
        if end > self.size {
            return Err(std::io::Error::other("read beyond the volume"));
        }
        let mut out = vec![0u8; len as usize];
        // Whole blocks: a block is in the head entirely or not at all.
        let (bs, be) = (offset / BLOCK * BLOCK, end.div_ceil(BLOCK) * BLOCK);
        let mut pos = offset;
        for (s, e) in self.head_runs(bs, be)? {
            let (s, e) = (s.max(offset), e.min(end));
            if s >= e {
                continue;
            }
            if s > pos {
                self.read_below(
                    pos,
                    &mut out[(pos - offset) as usize..(s - offset) as usize],
                )?;
            }
            self.head
                .read_exact_at(&mut out[(s - offset) as usize..(e - offset) as usize], s)?;
            pos = e;
        }
        if pos < end {
            self.read_below(pos, &mut out[(pos - offset) as usize..])?;
        }
        Ok(out)
    }
}
