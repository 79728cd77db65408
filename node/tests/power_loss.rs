//! Power loss under a replica: its filesystem (a real ext4, on a real loop
//! device) sits on a disk that forgets what it was not told to keep. The
//! disk is a file served over FUSE by the node's own FUSE server
//! (`frontend::fuse::mount_backing`): what is written to it stays in its
//! volatile cache until a flush, as in a disk's write cache, and a power
//! cut drops that cache. The filesystem is then mounted again from what
//! the disk kept (its journal replayed), and the replica opened from it.
//! A power cut comes with a new boot, which is how the replica knows that
//! the page cache it was opened in is gone; this machine does not reboot,
//! so the test gives the replica's record of its boot another boot's id
//! (`as_after_a_reboot`), as the reboot would make it.
//!
//! What must hold: every write made before an acknowledged flush reads
//! back, and every block reads as something it held (old or new bytes),
//! never as an error, whatever reached the disk of what followed.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use ballast_node::frontend::fuse::{Backing, FuseMount, mount_backing};
use ballast_node::replica::Replica;

const BLOCK: u64 = 4096;

/// A disk with a volatile write cache: writes are kept in memory until a
/// flush writes them to `image`; `cut` drops them, and from then on every
/// I/O fails, as a disk without power would.
struct Forgetful {
    image: File,
    size: u64,
    state: Mutex<Volatile>,
}

#[derive(Default)]
struct Volatile {
    /// Blocks written since the last flush, by index.
    cache: BTreeMap<u64, Vec<u8>>,
    cut: bool,
}

impl Forgetful {
    fn over(image: &Path, size: u64) -> Arc<Forgetful> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(image)
            .unwrap();
        f.set_len(size).unwrap();
        Arc::new(Forgetful {
            image: f,
            size,
            state: Mutex::default(),
        })
    }

    /// The power goes: what the cache held is gone.
    fn cut(&self) -> usize {
        let mut s = self.state.lock().unwrap();
        s.cut = true;
        let lost = s.cache.len();
        s.cache.clear();
        lost
    }

    /// Block `b` as the disk would read it now.
    fn block(&self, s: &Volatile, b: u64) -> Vec<u8> {
        match s.cache.get(&b) {
            Some(data) => data.clone(),
            None => {
                let mut data = vec![0u8; BLOCK as usize];
                self.image.read_exact_at(&mut data, b * BLOCK).unwrap();
                data
            }
        }
    }

    /// Puts `data` at `offset` into the cache, block by block.
    fn put(&self, s: &mut Volatile, offset: u64, data: &[u8]) {
        let mut at = 0usize;
        while at < data.len() {
            let pos = offset + at as u64;
            let (b, within) = (pos / BLOCK, (pos % BLOCK) as usize);
            let n = (BLOCK as usize - within).min(data.len() - at);
            let mut block = self.block(s, b);
            block[within..within + n].copy_from_slice(&data[at..at + n]);
            s.cache.insert(b, block);
            at += n;
        }
    }
}

impl Backing for Forgetful {
    fn name(&self) -> String {
        "forgetful-disk".into()
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn read(&self, offset: u64, len: u32) -> Result<bytes::Bytes, i32> {
        let s = self.state.lock().unwrap();
        if s.cut {
            return Err(libc::EIO);
        }
        let mut out = Vec::with_capacity(len as usize);
        let end = offset + u64::from(len);
        let mut pos = offset;
        while pos < end {
            let (b, within) = (pos / BLOCK, (pos % BLOCK) as usize);
            let n = (BLOCK - within as u64).min(end - pos) as usize;
            out.extend_from_slice(&self.block(&s, b)[within..within + n]);
            pos += n as u64;
        }
        Ok(out.into())
    }

    fn write(&self, offset: u64, data: bytes::Bytes) -> Result<(), i32> {
        let mut s = self.state.lock().unwrap();
        if s.cut {
            return Err(libc::EIO);
        }
        self.put(&mut s, offset, &data);
        Ok(())
    }

    fn trim(&self, offset: u64, len: u64) -> Result<(), i32> {
        let mut s = self.state.lock().unwrap();
        if s.cut {
            return Err(libc::EIO);
        }
        self.put(&mut s, offset, &vec![0u8; len as usize]);
        Ok(())
    }

    fn flush(&self) -> Result<(), i32> {
        let mut s = self.state.lock().unwrap();
        if s.cut {
            return Err(libc::EIO);
        }
        for (b, data) in std::mem::take(&mut s.cache) {
            self.image.write_all_at(&data, b * BLOCK).unwrap();
        }
        Ok(())
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An ext4 filesystem on a loop device on the forgetful disk's file,
/// mounted at `at`.
struct Machine {
    disk: Arc<Forgetful>,
    fuse: Option<FuseMount>,
    at: PathBuf,
}

impl Machine {
    /// Powers on over `image`: the disk holds what it kept; with `format`,
    /// a new filesystem is made first.
    fn boot(dir: &Path, name: &str, image: &Path, size: u64, format: bool) -> Machine {
        assert!(
            nix::unistd::geteuid().is_root(),
            "loop devices and FUSE mounts need root (CI runs as root)"
        );
        let disk = Forgetful::over(image, size);
        let fuse = mount_backing(disk.clone(), &dir.join(format!("{name}-dev"))).unwrap();
        let file = fuse.file();
        if format {
            run(Command::new("mkfs.ext4")
                .args(["-q", "-F", "-b", "4096"])
                .arg(&file));
        }
        let at = dir.join(format!("{name}-fs"));
        std::fs::create_dir_all(&at).unwrap();
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&file)
            .arg(&at));
        Machine {
            disk,
            fuse: Some(fuse),
            at,
        }
    }

    /// The power goes: the disk forgets its cache and answers nothing
    /// more; the filesystem is let go (unmounted lazily: what it still
    /// writes fails), and the FUSE connection with it.
    fn cut(mut self) -> usize {
        let lost = self.disk.cut();
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
        if let Some(f) = self.fuse.take() {
            // Its threads end once the loop device lets the file go.
            std::thread::spawn(move || drop(f));
        }
        lost
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        if self.fuse.is_some() {
            let _ = Command::new("umount").arg("-l").arg(&self.at).status();
        }
    }
}

fn pattern(offset: u64, round: u8) -> Vec<u8> {
    (0..64 * 1024u64)
        .map(|i| (((offset + i) / BLOCK) as u8).wrapping_mul(31) ^ round)
        .collect()
}

/// Writes `count` 64 KiB writes from `offset`, the pattern of `round`.
fn write_run(r: &mut Replica, offset: u64, count: u64, round: u8) {
    for i in 0..count {
        let at = offset + i * 64 * 1024;
        r.write(at, &pattern(at, round), None).unwrap();
    }
}

/// The head's data (not its checksums, nor the write log) written back
/// and made durable by the filesystem, as the replica's early writeback
/// and the filesystem's next journal commit do on their own.
fn data_reaches_the_disk(fs: &Path, replica: &Path) {
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(replica.join("meta.json")).unwrap()).unwrap();
    let head = meta["chain"].as_array().unwrap().last().unwrap();
    let head = File::open(replica.join(head.as_str().unwrap())).unwrap();
    // SAFETY: a plain system call on an open descriptor.
    let r = unsafe {
        libc::sync_file_range(
            std::os::fd::AsRawFd::as_raw_fd(&head),
            0,
            0,
            libc::SYNC_FILE_RANGE_WAIT_BEFORE
                | libc::SYNC_FILE_RANGE_WRITE
                | libc::SYNC_FILE_RANGE_WAIT_AFTER,
        )
    };
    assert_eq!(r, 0, "sync_file_range: {}", std::io::Error::last_os_error());
    // Another file's fsync commits the journal (the head's new blocks with
    // it) and flushes the disk: what it holds of the head is kept.
    let other = fs.join("other");
    std::fs::write(&other, b"x").unwrap();
    File::open(&other).unwrap().sync_all().unwrap();
}

/// The boot the replica was last opened in, as a new boot sees it: not
/// its own (bytes 16..32 of the revision file, replica/revision.rs).
fn as_after_a_reboot(replica: &Path) {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(replica.join("revision"))
        .unwrap();
    f.write_all_at(&[0x5a; 16], 16).unwrap();
}

#[test]
fn after_a_power_cut_every_flushed_write_reads_back_and_no_block_fails_its_checksum() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("disk.img");
    let size = 256u64 << 20;
    let before = Machine::boot(dir.path(), "before", &image, size, true);
    let rdir = before.at.join("r");
    let vol = 32u64 << 20;
    let mut r = Replica::create_for(&rdir, "v", vol).unwrap();
    // 4 MiB flushed, then 12 MiB more that no flush covers.
    write_run(&mut r, 0, 64, 1);
    r.flush().unwrap();
    write_run(&mut r, 8 << 20, 192, 2);
    data_reaches_the_disk(&before.at, &rdir);
    drop(r);
    let lost = before.cut();
    eprintln!("the power cut took {lost} blocks from the disk's cache, and the page cache");

    let after = Machine::boot(dir.path(), "after", &image, size, false);
    as_after_a_reboot(&after.at.join("r"));
    let r = Replica::open(&after.at.join("r")).unwrap();
    // Its write log may have lost entries of writes whose data the disk
    // kept: it says nothing of what came after its revision, so that a
    // replica made equal to it is rebuilt, not caught up from the log.
    assert_eq!(r.writes_since(r.revision()), None);
    let mut buf = vec![0u8; 64 * 1024];
    for i in 0..64u64 {
        let at = i * 64 * 1024;
        r.read(at, &mut buf).unwrap();
        assert!(
            buf == pattern(at, 1),
            "the flushed write at {at} reads back other data"
        );
    }
    // What no flush covered holds, block by block, the old bytes (zeros)
    // or the new: never an error, never other bytes.
    let (mut new, mut old) = (0, 0);
    for i in 0..192u64 {
        let at = (8 << 20) + i * 64 * 1024;
        let want = pattern(at, 2);
        for b in 0..16usize {
            let block = &mut buf[..BLOCK as usize];
            let offset = at + b as u64 * BLOCK;
            r.read(offset, block)
                .unwrap_or_else(|e| panic!("block at {offset}, written but not flushed: {e}"));
            let range = b * BLOCK as usize..(b + 1) * BLOCK as usize;
            if *block == want[range] {
                new += 1;
            } else if block.iter().all(|x| *x == 0) {
                old += 1;
            } else {
                panic!("block at {offset} holds bytes it never held");
            }
        }
    }
    eprintln!("unflushed blocks: {new} new, {old} old");
    assert!(new > 0, "the test meant the head's data to reach the disk");
    // And the replica goes on: a write, a flush, a reopen.
    drop(r);
    let mut r = Replica::open(&after.at.join("r")).unwrap();
    write_run(&mut r, 0, 1, 3);
    r.flush().unwrap();
    drop(r);
    let r = Replica::open(&after.at.join("r")).unwrap();
    r.read(0, &mut buf).unwrap();
    assert!(buf == pattern(0, 3));
}
