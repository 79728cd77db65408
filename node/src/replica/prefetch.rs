//! Read-ahead for a reader that walks a layer's allocated runs in order:
//! the copies of a rebuild and the checksum of a whole layer. Advice to
//! the kernel only; it owns no file and changes no data.

use std::fs::File;

use super::BLOCK;

/// Asks the kernel to read the runs ahead of a sequential reader, up to
/// `WINDOW` blocks past the run it is on: the reads of many small runs go
/// to the disk at once instead of one by one (on a fragmented layer, cold,
/// that is most of the time). It is told of the runs in order: by the
/// one reader, or by a freeze's readers as each takes its next chunk.
pub struct Prefetch<'a> {
    file: &'a File,
    runs: &'a [(u64, u64)],
    /// The run the reader is on.
    at: usize,
    /// The next run to ask for.
    next: usize,
    /// Blocks in runs `at..next`.
    ahead: u64,
}

impl<'a> Prefetch<'a> {
    /// Blocks asked for ahead of the reader, at most.
    const WINDOW: u64 = (32 << 20) / BLOCK;

    /// For a reader of `runs` (blocks, half-open) of `file`, in order.
    pub fn new(file: &'a File, runs: &'a [(u64, u64)]) -> Self {
        Prefetch {
            file,
            runs,
            at: 0,
            next: 0,
            ahead: 0,
        }
    }

    /// The reader starts run `i` (runs are started in order): the runs
    /// after it are asked for until the window is full.
    pub fn reading(&mut self, i: usize) {
        while self.at < i {
            if self.at < self.next {
                let (s, e) = self.runs[self.at];
                self.ahead -= e - s;
            }
            self.at += 1;
        }
        self.next = self.next.max(self.at);
        while self.ahead < Self::WINDOW {
            let Some(&(s, e)) = self.runs.get(self.next) else {
                return;
            };
            self.next += 1;
            self.ahead += e - s;
            // Advice only: a failure costs speed, never data.
            let _ = nix::fcntl::posix_fadvise(
                self.file,
                (s * BLOCK) as i64,
                ((e - s) * BLOCK) as i64,
                nix::fcntl::PosixFadviseAdvice::POSIX_FADV_WILLNEED,
            );
        }
    }
}
