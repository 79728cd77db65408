//! A disk that forgets, for power-cut tests: a file served over FUSE by
//! the node's own FUSE server (`frontend::fuse::mount_backing`), whose
//! writes stay in a volatile cache, as in a disk's write cache, until a
//! flush writes them to `image`. A real ext4 lives on it through a real
//! loop device (`ForgetfulFs`). A power cut drops the cache, fails every
//! I/O after it, lets the filesystem go, and mounts it again from what the
//! disk kept (its journal replayed), as the next boot would.
//!
//! A power cut comes with a new boot, which is how a replica knows that
//! the page cache it was opened in is gone. The machine here does not
//! reboot, so every replica on the disk has its record of the boot it was
//! opened in set to another boot's id (`as_after_a_reboot`), as the reboot
//! makes it.
//!
//! Shared by the node's power-loss test and the fault suite.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use ballast_node::frontend::fuse::{Answer, Backing, FuseMount, mount_backing};

const BLOCK: u64 = 4096;

/// The disk: writes are kept in memory until a flush writes them to
/// `image`; `cut` drops them, and from then on every I/O fails, as a disk
/// without power would.
pub struct Forgetful {
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

    /// The power goes: what the cache held is gone. Returns how many
    /// blocks it held.
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

    fn write(&self, offset: u64, data: bytes::Bytes, answer: Answer) {
        let mut s = self.state.lock().unwrap();
        if s.cut {
            return answer(Err(libc::EIO));
        }
        self.put(&mut s, offset, &data);
        answer(Ok(()))
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

/// An ext4 filesystem on a loop device on a forgetful disk (its file kept
/// in `image`), mounted at `at` (as root).
pub struct ForgetfulFs {
    pub at: PathBuf,
    image: PathBuf,
    size: u64,
    disk: Arc<Forgetful>,
    fuse: Option<FuseMount>,
    boots: u32,
}

impl ForgetfulFs {
    /// A new disk of `size` bytes in `image`, formatted and mounted at `at`.
    pub fn mount(image: &Path, at: &Path, size: u64) -> ForgetfulFs {
        assert!(
            nix::unistd::geteuid().is_root(),
            "loop devices and FUSE mounts need root (CI runs as root)"
        );
        let (disk, fuse) = Self::power_on(image, size, 0);
        run(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-b", "4096"])
            .arg(fuse.file()));
        let mut fs = ForgetfulFs {
            at: at.to_path_buf(),
            image: image.to_path_buf(),
            size,
            disk,
            fuse: Some(fuse),
            boots: 0,
        };
        fs.mount_fs();
        fs
    }

    /// The disk's FUSE file, served anew over what `image` holds.
    fn power_on(image: &Path, size: u64, boot: u32) -> (Arc<Forgetful>, FuseMount) {
        let disk = Forgetful::over(image, size);
        let mut dev = image.as_os_str().to_owned();
        dev.push(format!(".dev-{boot}"));
        let fuse = mount_backing(disk.clone(), Path::new(&dev)).unwrap();
        (disk, fuse)
    }

    fn mount_fs(&mut self) {
        let Some(fuse) = &self.fuse else {
            return;
        };
        std::fs::create_dir_all(&self.at).unwrap();
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(fuse.file())
            .arg(&self.at));
    }

    /// Lets the filesystem go (lazily: what it still writes fails) and
    /// the FUSE connection with it, without waiting for either.
    fn let_go(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
        if let Some(f) = self.fuse.take() {
            // Unmounted now (lazily), so that no mount outlives the test
            // when its process ends before the thread below has run.
            if let Some(dir) = f.file().parent() {
                let _ = nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH);
            }
            // Its threads end once the loop device lets the file go.
            std::thread::spawn(move || drop(f));
        }
    }

    /// The power goes and comes back: the disk forgets its cache (and the
    /// machine its page cache), then the filesystem is mounted again from
    /// what the disk kept, and every replica on it is as a new boot finds
    /// it. Whoever had files open on it must be gone (killed) first.
    /// Returns how many blocks the disk's cache lost.
    pub fn power_cut(&mut self) -> usize {
        let lost = self.disk.cut();
        self.let_go();
        self.boots += 1;
        let (disk, fuse) = Self::power_on(&self.image, self.size, self.boots);
        self.disk = disk;
        self.fuse = Some(fuse);
        self.mount_fs();
        as_after_a_reboot(&self.at);
        lost
    }
}

impl Drop for ForgetfulFs {
    fn drop(&mut self) {
        self.let_go();
    }
}

/// The data of every replica's head under `dir` (a directory with a
/// `meta.json`, at any depth), and not its checksums nor its write log,
/// written back and made durable by the filesystem at `dir`: as a
/// replica's early writeback and the filesystem's next journal commit do
/// on their own, before any flush of the replica's.
pub fn heads_reach_the_disk(dir: &Path) {
    fn heads(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        if let Ok(meta) = std::fs::read(dir.join("meta.json")) {
            let meta: serde_json::Value = serde_json::from_slice(&meta).unwrap();
            if let Some(head) = meta["chain"].as_array().and_then(|c| c.last()) {
                out.push(dir.join(head.as_str().unwrap_or_default()));
            }
            return;
        }
        for e in entries.flatten() {
            if e.path().is_dir() {
                heads(&e.path(), out);
            }
        }
    }
    let mut found = Vec::new();
    heads(dir, &mut found);
    for head in found {
        let Ok(f) = File::open(&head) else {
            continue;
        };
        // SAFETY: a plain system call on an open descriptor.
        let r = unsafe {
            libc::sync_file_range(
                std::os::fd::AsRawFd::as_raw_fd(&f),
                0,
                0,
                libc::SYNC_FILE_RANGE_WAIT_BEFORE
                    | libc::SYNC_FILE_RANGE_WRITE
                    | libc::SYNC_FILE_RANGE_WAIT_AFTER,
            )
        };
        assert_eq!(r, 0, "sync_file_range: {}", std::io::Error::last_os_error());
    }
    // Another file's fsync commits the journal (the heads' new blocks with
    // it) and flushes the disk: what it holds of the heads is kept. On a
    // full disk, the directory's.
    let other = dir.join("forgetful-commit");
    let synced = std::fs::write(&other, b"x")
        .and_then(|()| File::open(&other))
        .and_then(|f| f.sync_all());
    if synced.is_err() {
        File::open(dir).unwrap().sync_all().unwrap();
    }
}

/// Every replica under `dir` (a `revision` file at any depth) as a new
/// boot sees it: the boot it was last opened in is not this one (bytes
/// 16..32 of the revision file, node/src/replica/revision.rs).
pub fn as_after_a_reboot(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() {
            as_after_a_reboot(&path);
        } else if e.file_name() == "revision" {
            let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            f.write_all_at(&[0x5a; 16], 16).unwrap();
        }
    }
}
