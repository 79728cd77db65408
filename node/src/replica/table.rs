//! The table of this node's replicas: which replica lives on which disk,
//! each opened once and shared by whoever uses it, lent to the engine on
//! its node, failed with a lost disk. It owns names and files, and knows
//! nothing of sockets: the server and sync use it, never the other way.
//!
//! A loan takes the table's copy out (the engine opens the files itself),
//! and its end leaves the next use to open them afresh. Whoever holds a
//! copy across a loan's start or end (a server's connection) asks again
//! when the table's `loan_epoch` has moved since it got it, or when the
//! loan of the view it holds has ended (`find_kept`): a node serves one
//! copy of a replica, never two whose states in memory part (2026-12-06:
//! a freeze through one was not seen through the other, and a rebuild's
//! fill found the frozen layer "not complete" at every attempt).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use super::{META_FILE, Replica, ReplicaError};

/// An open replica, shared by the connections that use it.
pub type Shared = Arc<RwLock<Replica>>;

/// Every replica found under `<disk>/replicas/` of the node's disks.
pub struct Replicas {
    disks: Vec<PathBuf>,
    open: Mutex<HashMap<String, Shared>>,
    /// Disks found not ready: their replicas fail.
    failed_disks: Mutex<std::collections::HashSet<PathBuf>>,
    /// Replicas lent to their engine, by name. Locked after `open` when
    /// both are needed.
    lent: Mutex<HashMap<String, Loan>>,
    next_loan: std::sync::atomic::AtomicU64,
    /// Moves as a loan starts, and before one ends (see `find_kept`).
    loan_epoch: AtomicU64,
    /// The replicas' writeback mark (see `Replica::set_writeback_every`).
    writeback_every: u64,
    /// Each replica's engine fence (see `fence`), read from its file at
    /// first use. Locked alone.
    fences: Mutex<HashMap<String, Arc<AtomicU64>>>,
    /// Replicas whose files are being deleted: none is opened meanwhile.
    /// Locked after `open` when both are needed.
    deleting: Mutex<std::collections::HashSet<String>>,
    /// One lock per replica for the work on its files that must not run
    /// twice at once (its opening, its fence's raise, its deletion), held
    /// instead of the table's: a replica whose disk hangs holds up no
    /// other replica. Taken before any of the table's locks.
    gates: NameLocks,
    /// How many copies read each replica's frozen layers now (a fill's
    /// connection to its source, or a fill within the node): its merge
    /// waits for them, as it would change the layers they read.
    copying: Mutex<HashMap<String, usize>>,
}

/// A copy reading a replica's frozen layers, as its reader holds it;
/// dropping it ends it.
pub struct CopyGuard {
    table: Arc<Replicas>,
    name: String,
}

impl CopyGuard {
    /// The replica read.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for CopyGuard {
    fn drop(&mut self) {
        if let Ok(mut copying) = self.table.copying.lock()
            && let Some(n) = copying.get_mut(&self.name)
        {
            *n -= 1;
            if *n == 0 {
                copying.remove(&self.name);
            }
        }
    }
}

/// A lock per name, made at first use.
#[derive(Default)]
struct NameLocks(Mutex<HashMap<String, Arc<Mutex<()>>>>);

impl NameLocks {
    /// The lock of `name`.
    fn of(&self, name: &str) -> Result<Arc<Mutex<()>>, String> {
        let mut locks = self.0.lock().map_err(|_| "registry poisoned".to_string())?;
        Ok(locks.entry(name.to_string()).or_default().clone())
    }

    /// Forgets the lock of `name` (its replica is gone), held by the
    /// caller, unless another call waits on it.
    fn forget(&self, name: &str) {
        if let Ok(mut locks) = self.0.lock()
            && locks.get(name).is_some_and(|l| Arc::strong_count(l) <= 2)
        {
            locks.remove(name);
        }
    }
}

/// Holds `lock`, whoever poisoned it: it guards no data, only turns.
fn hold(lock: &Mutex<()>) -> std::sync::MutexGuard<'_, ()> {
    lock.lock().unwrap_or_else(|p| p.into_inner())
}

/// A loan as the borrower holds it; dropping it ends it.
pub struct LoanGuard {
    table: Arc<Replicas>,
    name: String,
    id: u64,
    /// Woken when the table ends the loan (the disk was lost).
    pub revoke: Arc<tokio::sync::Notify>,
}

impl Drop for LoanGuard {
    fn drop(&mut self) {
        self.table.give_back(&self.name, self.id);
    }
}

/// A replica lent to an engine.
struct Loan {
    id: u64,
    dir: PathBuf,
    /// Woken when the server ends the loan (the disk was lost): the
    /// engine's connection is closed.
    revoke: Arc<tokio::sync::Notify>,
}

/// Where a replica named `name` lives on `disk`.
pub fn replica_dir(disk: &std::path::Path, name: &str) -> PathBuf {
    disk.join("replicas").join(name)
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && !name.starts_with('.')
}

impl Replicas {
    pub fn new(disks: Vec<PathBuf>) -> Arc<Self> {
        Self::with_writeback(disks, super::WRITEBACK_EVERY)
    }

    /// Like `new`, starting each head's writeback after `writeback_every`
    /// bytes written (0: left to the kernel).
    pub fn with_writeback(disks: Vec<PathBuf>, writeback_every: u64) -> Arc<Self> {
        for d in &disks {
            empty_bin(d);
        }
        Arc::new(Replicas {
            writeback_every,
            disks,
            open: Mutex::new(HashMap::new()),
            failed_disks: Mutex::new(Default::default()),
            lent: Mutex::new(HashMap::new()),
            next_loan: std::sync::atomic::AtomicU64::new(1),
            loan_epoch: AtomicU64::new(0),
            fences: Mutex::new(HashMap::new()),
            deleting: Mutex::new(Default::default()),
            gates: NameLocks::default(),
            copying: Mutex::new(HashMap::new()),
        })
    }

    /// Whether `name` is lent to its engine.
    pub fn is_lent(&self, name: &str) -> bool {
        self.lent
            .lock()
            .map(|l| l.contains_key(name))
            .unwrap_or(true)
    }

    /// Counts a copy of `name`'s frozen layers under way until the guard
    /// returned is dropped (see `copied_from`).
    pub fn copy_from(self: &Arc<Self>, name: &str) -> CopyGuard {
        if let Ok(mut copying) = self.copying.lock() {
            *copying.entry(name.to_string()).or_default() += 1;
        }
        CopyGuard {
            table: self.clone(),
            name: name.to_string(),
        }
    }

    /// Why `name` may not be merged now: a copy reads its frozen layers
    /// (a rebuild's fill, on this node or another). None when it may.
    pub fn copied_from(&self, name: &str) -> Option<String> {
        let copies = self
            .copying
            .lock()
            .map(|c| c.get(name).copied().unwrap_or(0))
            .unwrap_or(1);
        (copies > 0).then(|| {
            format!(
                "replica {name} is being copied from ({copies} fill(s) read its layers): \
                 it is merged once they end"
            )
        })
    }

    /// Lends `name` to an engine; the loan lasts as long as the guard
    /// returned, whose `revoke` is woken when the table ends it early.
    /// The table's own copy of the replica is dropped: it is opened
    /// afresh from the files once the loan ends.
    pub fn lend(self: &Arc<Self>, name: &str) -> Result<LoanGuard, String> {
        let replica = self.find(name)?;
        let dir = replica
            .read()
            .map_err(|_| "replica lock poisoned".to_string())?
            .dir()
            .to_path_buf();
        let mut open = self
            .open
            .lock()
            .map_err(|_| "registry poisoned".to_string())?;
        let mut lent = self
            .lent
            .lock()
            .map_err(|_| "registry poisoned".to_string())?;
        if lent.contains_key(name) {
            return Err(format!("replica {name} is already lent to an engine"));
        }
        let id = self
            .next_loan
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let revoke = Arc::new(tokio::sync::Notify::new());
        lent.insert(
            name.to_string(),
            Loan {
                id,
                dir,
                revoke: revoke.clone(),
            },
        );
        let old = open.remove(name);
        self.loan_epoch.fetch_add(1, Ordering::SeqCst);
        drop(lent);
        drop(open);
        // A merge step under way on the server's copy ends before the
        // engine opens the files; the next one sees the loan and stops.
        if let Some(old) = old {
            drop(old.write());
        }
        tracing::info!(replica = name, loan = id, "replica lent to its engine");
        Ok(LoanGuard {
            table: self.clone(),
            name: name.to_string(),
            id,
            revoke,
        })
    }

    /// Ends loan `id` of `name` (if it is still the current one).
    fn give_back(&self, name: &str, id: u64) {
        if let Ok(mut lent) = self.lent.lock()
            && lent.get(name).is_some_and(|l| l.id == id)
        {
            // Before the loan is gone: a copy asked for in between is a
            // view (see `find_kept`), and is asked for again.
            self.loan_epoch.fetch_add(1, Ordering::SeqCst);
            lent.remove(name);
            tracing::info!(replica = name, loan = id, "replica given back");
        }
    }

    /// The open replica called `name`, opening it on first use. The
    /// opening reads (and may write) its files, and holds only the
    /// replica's own gate meanwhile, not the table.
    pub fn find(&self, name: &str) -> Result<Shared, String> {
        self.find_kept(name).map(|(r, ..)| r)
    }

    /// Where the table's loans stand: it moves as a loan starts, and
    /// before one ends.
    pub fn loan_epoch(&self) -> u64 {
        self.loan_epoch.load(Ordering::SeqCst)
    }

    /// `find`, with the `loan_epoch` it was found at and whether it is a
    /// view of a lent replica (made for its caller, never the table's). A
    /// holder asks again once the epoch has moved, or, holding a view, once
    /// the loan has ended.
    pub fn find_kept(&self, name: &str) -> Result<(Shared, u64, bool), String> {
        let epoch = self.loan_epoch();
        if !valid_name(name) {
            return Err(format!("{name:?} is not a replica name"));
        }
        if let Some(r) = self.cached(name)? {
            return Ok((r, epoch, false));
        }
        let gate = self.gates.of(name)?;
        let _opening = hold(&gate);
        // Opened by another call while this one waited.
        if let Some(r) = self.cached(name)? {
            return Ok((r, epoch, false));
        }
        // A lent replica changes under the server: it is opened afresh for
        // each use and never kept.
        let lent = self.is_lent(name);
        let failed = self
            .failed_disks
            .lock()
            .map_err(|_| "registry poisoned".to_string())?
            .clone();
        let dir = self
            .disks
            .iter()
            .filter(|d| !failed.contains(*d))
            .map(|d| replica_dir(d, name))
            .find(|d| d.join(META_FILE).exists())
            .ok_or_else(|| format!("no replica {name} on this node"))?;
        // Lent, the engine owns its files: a view writes nothing to them.
        let opened = if lent {
            Replica::open_view(&dir)
        } else {
            Replica::open(&dir)
        };
        let mut opened = opened.map_err(|e| e.to_string())?;
        opened.set_writeback_every(self.writeback_every);
        let r = Arc::new(RwLock::new(opened));
        if !lent {
            let mut open = self
                .open
                .lock()
                .map_err(|_| "registry poisoned".to_string())?;
            // Its disk failed while it opened (`fail_disk` marks the disk,
            // then breaks what the table holds): not kept, not served.
            let failed = self
                .failed_disks
                .lock()
                .map_err(|_| "registry poisoned".to_string())?;
            if let Some(disk) = failed.iter().find(|d| dir.starts_with(d)) {
                return Err(format!("disk {} is not ready", disk.display()));
            }
            drop(failed);
            open.insert(name.to_string(), r.clone());
        }
        Ok((r, epoch, lent))
    }

    /// `find`, run on the blocking pool: an async task never waits on a
    /// replica's disk.
    pub async fn find_async(self: &Arc<Self>, name: &str) -> Result<Shared, String> {
        self.find_kept_async(name).await.map(|(r, ..)| r)
    }

    /// `find_kept`, run on the blocking pool.
    pub async fn find_kept_async(
        self: &Arc<Self>,
        name: &str,
    ) -> Result<(Shared, u64, bool), String> {
        let (table, name) = (self.clone(), name.to_string());
        tokio::task::spawn_blocking(move || table.find_kept(&name))
            .await
            .map_err(|e| format!("the replica's opening failed: {e}"))?
    }

    /// The replica `name` as the table holds it open, if it does; an error
    /// when it is being deleted, or broken.
    fn cached(&self, name: &str) -> Result<Option<Shared>, String> {
        let open = self
            .open
            .lock()
            .map_err(|_| "registry poisoned".to_string())?;
        if self.deleting.lock().is_ok_and(|d| d.contains(name)) {
            return Err(format!("replica {name} is being deleted"));
        }
        let Some(r) = open.get(name) else {
            return Ok(None);
        };
        if let Some(why) = r.read().ok().and_then(|r| r.broken().map(str::to_string)) {
            return Err(why);
        }
        Ok(Some(r.clone()))
    }

    /// Closes every replica the table holds open clean
    /// (`Replica::close_clean`), as the node plugin stops: a new boot then
    /// trusts their heads and write logs as they are. Each stays in the
    /// table, failing every I/O, so that nothing opens it again before the
    /// process ends. A lent replica is its engine's to close.
    pub fn close_all(&self, why: &str) {
        let open: Vec<(String, Shared)> = match self.open.lock() {
            Ok(o) => o.iter().map(|(n, r)| (n.clone(), r.clone())).collect(),
            Err(_) => return,
        };
        let (mut marked, mut unmarked) = (0, 0);
        for (name, r) in open {
            let Ok(mut r) = r.write() else {
                continue;
            };
            match r.close_clean(why) {
                Ok(true) => marked += 1,
                Ok(false) => {
                    unmarked += 1;
                    tracing::info!(replica = %name, "closed, not marked clean: a fill or a merge was under way, or its disk is gone");
                }
                Err(e) => {
                    unmarked += 1;
                    tracing::warn!(replica = %name, error = %e, "the clean close failed: a new boot checks its head");
                }
            }
        }
        tracing::info!(marked, unmarked, "replicas closed");
    }

    /// The engine fence of replica `name`: the latest attachment that may
    /// change it (see `fence`). It only ever grows; whoever holds it sees
    /// it raised. Read from its file at first use, under the replica's
    /// gate, not the table's lock.
    pub fn fence(&self, name: &str) -> Result<Arc<AtomicU64>, String> {
        if let Some(f) = self.known_fence(name)? {
            return Ok(f);
        }
        let gate = self.gates.of(name)?;
        let _reading = hold(&gate);
        self.fence_gated(name)
    }

    /// The fence of `name` if the table has read it.
    fn known_fence(&self, name: &str) -> Result<Option<Arc<AtomicU64>>, String> {
        let fences = self
            .fences
            .lock()
            .map_err(|_| "registry poisoned".to_string())?;
        Ok(fences.get(name).cloned())
    }

    /// The fence of `name`, read from its file if the table has not yet;
    /// the caller holds the replica's gate, so that a deletion (which
    /// forgets the fence under it) comes wholly before or after.
    fn fence_gated(&self, name: &str) -> Result<Arc<AtomicU64>, String> {
        if let Some(f) = self.known_fence(name)? {
            return Ok(f);
        }
        let dir = self.dir_of(name)?;
        let epoch = super::fence::read(&dir).map_err(|e| e.to_string())?;
        super::fence::keep_fixed_width(&dir, epoch);
        let f = Arc::new(AtomicU64::new(epoch));
        self.fences
            .lock()
            .map_err(|_| "registry poisoned".to_string())?
            .insert(name.to_string(), f.clone());
        Ok(f)
    }

    /// Raises the engine fence of replica `name` to `epoch` when it is
    /// lower, on disk first; returns the fence as it is then. One raise at
    /// a time per replica (under its gate), so that the file never goes
    /// back; a raise on a disk that hangs holds up no other replica's.
    pub fn raise_fence(&self, name: &str, epoch: u64) -> Result<u64, String> {
        let gate = self.gates.of(name)?;
        let _raising = hold(&gate);
        let fence = self.fence_gated(name)?;
        let now = fence.load(Ordering::SeqCst);
        if epoch <= now {
            return Ok(now);
        }
        let dir = self.dir_of(name)?;
        super::fence::write(&dir, epoch).map_err(|e| e.to_string())?;
        fence.store(epoch, Ordering::SeqCst);
        tracing::info!(
            replica = name,
            from = now,
            to = epoch,
            "engine fence raised"
        );
        Ok(epoch)
    }

    /// The directory of replica `name` on this node's disks.
    pub fn dir_of(&self, name: &str) -> Result<PathBuf, String> {
        if !valid_name(name) {
            return Err(format!("{name:?} is not a replica name"));
        }
        self.disks
            .iter()
            .map(|d| replica_dir(d, name))
            .find(|d| d.join(META_FILE).exists())
            .ok_or_else(|| format!("no replica {name} on this node"))
    }

    /// Scrubs replica `name` (see `Replica::scrub`) at most
    /// `bytes_per_second`; a corrupt layer is marked, for the server's open
    /// replica too. Returns the bytes checked, or what is corrupt.
    pub async fn scrub(&self, name: &str, bytes_per_second: u64) -> Result<u64, ReplicaError> {
        let dir = self.dir_of(name).map_err(ReplicaError::Invalid)?;
        let rate = bytes_per_second.max(1 << 20);
        let at = dir.clone();
        let scrubbed = tokio::task::spawn_blocking(move || {
            let start = std::time::Instant::now();
            let mut read = 0u64;
            Replica::scrub(&at, |n| {
                read += n;
                let due = std::time::Duration::from_secs_f64(read as f64 / rate as f64);
                if let Some(ahead) = due.checked_sub(start.elapsed()) {
                    std::thread::sleep(ahead);
                }
            })
        })
        .await
        .map_err(|e| ReplicaError::Invalid(e.to_string()))?;
        if let Err(e) = &scrubbed
            && let Some(mark) = super::Mark::of(e)
        {
            match self.open.lock().ok().and_then(|o| o.get(name).cloned()) {
                Some(r) => {
                    if let Ok(r) = r.read() {
                        r.note_corruption(e);
                    }
                }
                None => super::mark_corrupt_in(&dir, &mark)?,
            }
        }
        scrubbed
    }

    /// Merges the layers of `name` that no snapshot in `keep` needs (see
    /// `merge`), copying at most `bytes_per_second`. Each chunk holds the
    /// replica only while it copies, so its server goes on serving.
    /// Refused (`Busy`) while a fill copies its layers: the merge would
    /// change the layers the fill reads, which would then fail its check
    /// and copy them all again.
    pub async fn merge(
        self: &Arc<Self>,
        name: &str,
        keep: Vec<String>,
        bytes_per_second: u64,
    ) -> Result<MergeReport, ReplicaError> {
        if let Some(why) = self.copied_from(name) {
            return Err(ReplicaError::Busy(why));
        }
        let replica = self.find_async(name).await.map_err(ReplicaError::Invalid)?;
        let (table, name) = (self.clone(), name.to_string());
        // Lent meanwhile: the engine owns the files now, and merges them.
        let lent = move || table.is_lent(&name);
        tokio::task::spawn_blocking(move || merge_paced(&replica, &keep, bytes_per_second, &lent))
            .await
            .map_err(|e| ReplicaError::Invalid(e.to_string()))?
    }

    /// Fails every open replica under `disk`, and refuses to open more
    /// there: the disk is gone or is not the one it was.
    pub fn fail_disk(&self, disk: &std::path::Path, why: &str) {
        if let Ok(mut failed) = self.failed_disks.lock()
            && !failed.insert(disk.to_path_buf())
        {
            return;
        }
        let Ok(open) = self.open.lock() else {
            return;
        };
        if let Ok(mut lent) = self.lent.lock() {
            self.loan_epoch.fetch_add(1, Ordering::SeqCst);
            lent.retain(|name, loan| {
                let keep = !loan.dir.starts_with(disk);
                if !keep {
                    tracing::warn!(replica = %name, disk = %disk.display(), why, "disk lost; ending the replica's loan to its engine");
                    loan.revoke.notify_one();
                }
                keep
            });
        }
        for (name, r) in open.iter() {
            if let Ok(mut r) = r.write()
                && r.dir().starts_with(disk)
            {
                tracing::warn!(replica = %name, disk = %disk.display(), why, "disk lost; failing the replica");
                r.break_off(format!("disk {} is not ready: {why}", disk.display()));
            }
        }
    }

    /// A disk found ready again: replicas there open afresh from their
    /// files on next use (the failed ones stay closed, and an engine that
    /// dropped them rebuilds them as reused replicas).
    pub fn restore_disk(&self, disk: &std::path::Path) {
        let was_failed = self
            .failed_disks
            .lock()
            .map(|mut f| f.remove(disk))
            .unwrap_or(false);
        if !was_failed {
            return;
        }
        tracing::info!(disk = %disk.display(), "disk ready again");
        if let Ok(mut open) = self.open.lock() {
            open.retain(|_, r| {
                r.read()
                    .map(|r| !r.dir().starts_with(disk))
                    .unwrap_or(false)
            });
        }
    }

    /// Deletes replica `name` in `dir`: closed, whoever still holds it (a
    /// merge, a fill) fails its next step rather than write into it (a
    /// step under way ends first), and nobody opens it again while its
    /// files go. The registry is held only to take the replica out: the
    /// files' removal waits on their disk, which may hang, and holds up no
    /// other replica's lookup.
    pub fn delete(&self, name: &str, dir: &Path) -> std::io::Result<()> {
        // An opening or a fence's raise under way ends first.
        let gate = self.gates.of(name).map_err(std::io::Error::other)?;
        let _deleting = hold(&gate);
        let held = {
            let mut open = self
                .open
                .lock()
                .map_err(|_| std::io::Error::other("registry poisoned"))?;
            self.deleting
                .lock()
                .map_err(|_| std::io::Error::other("registry poisoned"))?
                .insert(name.to_string());
            open.remove(name)
        };
        if let Some(r) = held
            && let Ok(mut r) = r.write()
        {
            r.break_off(format!("replica {name} is being deleted"));
        }
        if let Ok(mut fences) = self.fences.lock() {
            fences.remove(name);
        }
        let removed = remove_replica_dir(dir);
        if let Ok(mut deleting) = self.deleting.lock() {
            deleting.remove(name);
        }
        self.gates.forget(name);
        removed
    }
}

/// Where `<disk>/replicas/<name>` goes to be removed: `<disk>/deleting/`,
/// beside `replicas/`, so that no scan of the replicas lists it.
const DELETING: &str = "deleting";

/// Removes the replica directory `dir` (`<disk>/replicas/<name>`): first
/// moved whole out of `replicas/`, in one rename, then its files removed.
/// A task of this node still writing into the replica by its path (a
/// scrub noting a corrupt layer, a fence raised) finds no directory once
/// the rename is done, rather than putting a file back into one being
/// emptied. Once moved the replica is deleted: what a write under way at
/// the rename put into the moved directory, or a removal cut short by a
/// crash, goes at the next deletion on the disk or the node's next start.
/// On a disk too full to make the bin, the directory is emptied where it
/// is. Idempotent: a directory that is not there is deleted.
pub fn remove_replica_dir(dir: &Path) -> std::io::Result<()> {
    let (Some(name), Some(disk)) = (dir.file_name(), dir.parent().and_then(Path::parent)) else {
        return Err(std::io::Error::other(format!(
            "{} is not a replica directory",
            dir.display()
        )));
    };
    let bin = disk.join(DELETING);
    let mut moved = name.to_os_string();
    moved.push(format!(
        ".{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default()
    ));
    match std::fs::create_dir_all(&bin).and_then(|()| std::fs::rename(dir, bin.join(moved))) {
        Ok(()) => {}
        Err(_) if !dir.exists() => {}
        Err(e) => {
            tracing::info!(dir = %dir.display(), error = %e, "a deleted replica's directory cannot move to the bin; emptied where it is");
            return remove_tree(dir);
        }
    }
    empty_bin(disk);
    Ok(())
}

/// Removes what deleted replicas left in `<disk>/deleting/` (made here
/// when missing on a disk that holds replicas, for the next deletion;
/// never in a directory without them, which may be the empty mount point
/// of a disk that did not mount). Each removal is tried a few times, then
/// left for the next.
pub fn empty_bin(disk: &Path) {
    let bin = disk.join(DELETING);
    if disk.join("replicas").is_dir() {
        let _ = std::fs::create_dir_all(&bin);
    }
    let Ok(entries) = std::fs::read_dir(&bin) else {
        return;
    };
    for path in entries.flatten().map(|e| e.path()) {
        if let Err(e) = remove_tree(&path) {
            tracing::warn!(dir = %path.display(), error = %e, "files of a deleted replica not removed yet; tried again at the next deletion");
        }
    }
}

/// `remove_dir_all`, tried again when a write landed after the files were
/// listed ("Directory not empty").
fn remove_tree(path: &Path) -> std::io::Result<()> {
    let mut tries = 0;
    loop {
        match std::fs::remove_dir_all(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if tries < 3 && e.raw_os_error() == Some(nix::libc::ENOTEMPTY) => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(e) => return Err(e),
        }
    }
}

/// What merging a replica did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MergeReport {
    pub merged: u32,
    pub copied: u64,
    pub allocated_before: u64,
    pub allocated_after: u64,
    pub layers: u32,
}

/// Completes the filled layer `name` of `replica` (see
/// `Replica::complete_layer`), its check, a read of the whole layer, made
/// without the replica's lock (`Completion`): the replica takes the
/// volume's writes from its join on, and one left waiting past the replica
/// timeout would have its engine give the replica up.
pub fn complete_apart(
    replica: &RwLock<Replica>,
    name: &str,
    lost: &[u64],
) -> Result<(), ReplicaError> {
    let poisoned = || ReplicaError::Invalid("replica lock poisoned".into());
    let mut c = replica
        .read()
        .map_err(|_| poisoned())?
        .completion(name, lost)?;
    let got = c.take()?;
    replica
        .write()
        .map_err(|_| poisoned())?
        .record_completion(c, &got)
}

/// Merges every layer of `replica` that no snapshot in `keep` needs, one
/// 4 MiB step at a time under its lock, copying at most `rate` bytes per
/// second (by its server, or by the engine it is lent to); each merge's
/// end, a read of the whole upper layer, without the lock (`MergeEnd`).
/// A merge that found a block failing its checksum ends, and the error
/// names it (see `merge`'s module). Stops, leaving
/// the merge to whoever opens the replica next, once `stop` says so
/// (asked under the lock before each step). Folds only into layers
/// frozen when it began: a head frozen meanwhile (a rebuild's freeze,
/// whose layers the rebuild then copies) is left for the next merge, so
/// that the layer a rebuild copies does not change under it.
pub fn merge_paced(
    replica: &RwLock<Replica>,
    keep: &[String],
    rate: u64,
    stop: &dyn Fn() -> bool,
) -> Result<MergeReport, ReplicaError> {
    let rate = rate.max(1 << 20);
    let poisoned = || ReplicaError::Invalid("replica lock poisoned".into());
    let allocated = |r: &Replica| r.layers().iter().map(|l| l.allocated).sum::<u64>();
    let mut report = MergeReport::default();
    let frozen_then: Vec<String> = {
        let mut r = replica.write().map_err(|_| poisoned())?;
        if stop() {
            return Ok(report);
        }
        r.keep_snapshots(keep)?;
        report.allocated_before = allocated(&r);
        let mut chain = r.chain();
        chain.pop();
        chain
    };
    let start = std::time::Instant::now();
    loop {
        let next = {
            let mut r = replica.write().map_err(|_| poisoned())?;
            if stop() {
                return Ok(report);
            }
            let Some(j) = r.next_merge().filter(|j| frozen_then.contains(&j.into)) else {
                break;
            };
            r.begin_merge(&j)?;
            j
        };
        tracing::info!(from = %next.from, into = %next.into, "merging a layer no snapshot needs");
        let mut bad = Vec::new();
        let mut at = Some(0);
        while let Some(b) = at {
            let step = {
                let mut r = replica.write().map_err(|_| poisoned())?;
                if stop() || r.next_merge().as_ref() != Some(&next) {
                    // A join replaced the chain: nothing left to merge.
                    return Ok(report);
                }
                r.merge_some(b, super::MERGE_CHUNK, false)?
            };
            report.copied += step.copied;
            bad.extend(step.bad);
            let due = std::time::Duration::from_secs_f64(report.copied as f64 / rate as f64);
            if let Some(ahead) = due.checked_sub(start.elapsed()) {
                std::thread::sleep(ahead);
            }
            at = step.next;
        }
        // The end reads the whole upper layer: without the replica, so
        // that the volume's writes go on (`MergeEnd`).
        let end = {
            let r = replica.read().map_err(|_| poisoned())?;
            if stop() || r.next_merge().as_ref() != Some(&next) {
                return Ok(report);
            }
            r.merge_end()?
        };
        let got = match end.take() {
            Ok(got) => got,
            Err(e) => {
                // A join that replaced the chain meanwhile may have emptied
                // the layer read: the merge is not there to end any more.
                let r = replica.read().map_err(|_| poisoned())?;
                if !r.merge_end_stands(&end) {
                    return Ok(report);
                }
                return Err(e);
            }
        };
        {
            let mut r = replica.write().map_err(|_| poisoned())?;
            if stop() {
                return Ok(report);
            }
            let Some(more) = r.record_merge_end(end, got)? else {
                // A join replaced the chain meanwhile.
                return Ok(report);
            };
            bad.extend(more);
            // The merge ended, its bad blocks marked: its caller is told,
            // as by a scrub, and no other merge runs on this replica.
            if let Some(&b) = bad.first() {
                return Err(r.found_bad(&next.into, b));
            }
        }
        report.merged += 1;
    }
    let r = replica.read().map_err(|_| poisoned())?;
    report.allocated_after = allocated(&r);
    report.layers = r.chain().len() as u32;
    Ok(report)
}
