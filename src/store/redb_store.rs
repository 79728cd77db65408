//! The embedded backend: one redb file.
//!
//! One table per kind maps a name to `version (u64 LE) ++ JSON body`; the
//! table `meta` holds the store-wide revision. Each write is one durable
//! transaction, so a crash leaves every object either old or new, never
//! torn. The file is locked: a second process that opens it fails at once.

use std::path::{Path, PathBuf};

use redb::{Database, DatabaseError, ReadableDatabase, ReadableTable, TableDefinition};
use serde_json::Value;
use tokio::sync::broadcast;

use super::{Change, ChangeOp, Raw, Store, StoreError, StoreResult, check_version};
use crate::model::Kind;

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const REVISION: &str = "revision";

fn table(kind: Kind) -> TableDefinition<'static, &'static str, &'static [u8]> {
    TableDefinition::new(kind.plural())
}

fn backend(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(e.to_string())
}

/// A store in a single redb file.
pub struct RedbStore {
    db: Database,
    path: PathBuf,
    changes: broadcast::Sender<Change>,
    /// Held for writing from a commit until its change is announced, and
    /// for reading while a read transaction begins: a read that sees a
    /// change finds it in the stream already (a reader of the stream, such
    /// as the controller's copy of the records, is never behind what was
    /// read from the store before it).
    announced: std::sync::RwLock<()>,
}

impl std::fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbStore")
            .field("path", &self.path)
            .finish()
    }
}

impl RedbStore {
    /// Opens (or creates) the store at `path`, creating parent directories.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| {
                StoreError::Backend(format!("cannot create {}: {e}", parent.display()))
            })?;
        }
        let db = Database::create(&path).map_err(|e| match e {
            DatabaseError::DatabaseAlreadyOpen => StoreError::Locked {
                path: path.display().to_string(),
            },
            other => StoreError::Backend(format!("cannot open {}: {other}", path.display())),
        })?;
        // Create every table so that reads never meet a missing one.
        let txn = db.begin_write().map_err(backend)?;
        {
            let mut meta = txn.open_table(META).map_err(backend)?;
            if meta.get(REVISION).map_err(backend)?.is_none() {
                meta.insert(REVISION, 0).map_err(backend)?;
            }
            for kind in Kind::ALL {
                txn.open_table(table(kind)).map_err(backend)?;
            }
        }
        txn.commit().map_err(backend)?;
        let (changes, _) = broadcast::channel(1024);
        Ok(RedbStore {
            db,
            path,
            changes,
            announced: std::sync::RwLock::default(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A read transaction, begun while no commit waits to be announced
    /// (see `announced`).
    fn begin_read(&self) -> Result<redb::ReadTransaction, StoreError> {
        let _announced = self.announced.read().unwrap_or_else(|e| e.into_inner());
        self.db.begin_read().map_err(backend)
    }

    /// Runs one write transaction: `f` gets the kind's table and the next
    /// revision, and returns what to announce.
    fn write<T>(
        &self,
        kind: Kind,
        f: impl FnOnce(&mut redb::Table<&str, &[u8]>, u64) -> Result<(T, Option<Change>), StoreError>,
    ) -> Result<T, StoreError> {
        let txn = self.db.begin_write().map_err(backend)?;
        let (out, change) = {
            let mut meta = txn.open_table(META).map_err(backend)?;
            let current = meta
                .get(REVISION)
                .map_err(backend)?
                .map(|g| g.value())
                .unwrap_or(0);
            let next = current + 1;
            let mut t = txn.open_table(table(kind)).map_err(backend)?;
            let (out, change) = f(&mut t, next)?;
            if change.is_some() {
                meta.insert(REVISION, next).map_err(backend)?;
            }
            (out, change)
        };
        // The guard holds only (): a poisoned lock is as good as any.
        let _announcing = self.announced.write().unwrap_or_else(|e| e.into_inner());
        txn.commit().map_err(backend)?;
        if let Some(c) = change {
            // Nobody listening is fine.
            let _ = self.changes.send(c);
        }
        Ok(out)
    }
}

fn pack(version: u64, value: &Value) -> Result<Vec<u8>, StoreError> {
    let mut buf = version.to_le_bytes().to_vec();
    serde_json::to_writer(&mut buf, value).map_err(backend)?;
    Ok(buf)
}

fn unpack(kind: Kind, name: &str, bytes: &[u8]) -> Result<Raw, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt {
        kind,
        name: name.to_string(),
        reason,
    };
    if bytes.len() < 8 {
        return Err(corrupt(format!("record of {} bytes", bytes.len())));
    }
    let (head, body) = bytes.split_at(8);
    let mut v = [0u8; 8];
    v.copy_from_slice(head);
    let value = serde_json::from_slice(body).map_err(|e| corrupt(e.to_string()))?;
    Ok(Raw {
        name: name.to_string(),
        resource_version: u64::from_le_bytes(v),
        value,
    })
}

/// The version `name` is stored at; NotFound when it is not there.
fn stored_version(t: &redb::Table<&str, &[u8]>, kind: Kind, name: &str) -> Result<u64, StoreError> {
    match t.get(name).map_err(backend)? {
        Some(g) => version_of(kind, name, g.value()),
        None => Err(StoreError::NotFound {
            kind,
            name: name.to_string(),
        }),
    }
}

fn version_of(kind: Kind, name: &str, bytes: &[u8]) -> Result<u64, StoreError> {
    Ok(unpack(kind, name, bytes)?.resource_version)
}

#[async_trait::async_trait]
impl Store for RedbStore {
    async fn get_raw(&self, kind: Kind, name: &str) -> Result<Option<Raw>, StoreError> {
        let txn = self.begin_read()?;
        let t = txn.open_table(table(kind)).map_err(backend)?;
        let found = t.get(name).map_err(backend)?;
        found.map(|g| unpack(kind, name, g.value())).transpose()
    }

    async fn list_raw(&self, kind: Kind) -> Result<Vec<Raw>, StoreError> {
        let txn = self.begin_read()?;
        let t = txn.open_table(table(kind)).map_err(backend)?;
        let mut out = Vec::new();
        for item in t.iter().map_err(backend)? {
            let (k, v) = item.map_err(backend)?;
            out.push(unpack(kind, k.value(), v.value())?);
        }
        Ok(out)
    }

    async fn create_raw(&self, kind: Kind, name: &str, value: &Value) -> Result<u64, StoreError> {
        self.write(kind, |t, next| {
            if t.get(name).map_err(backend)?.is_some() {
                return Err(StoreError::AlreadyExists {
                    kind,
                    name: name.to_string(),
                });
            }
            t.insert(name, pack(next, value)?.as_slice())
                .map_err(backend)?;
            let change = Change::new(kind, name, ChangeOp::Created, next);
            Ok((next, Some(change)))
        })
    }

    async fn update_raw(&self, kind: Kind, name: &str, value: &Value, rv: u64) -> StoreResult<u64> {
        self.write(kind, |t, next| {
            let actual = stored_version(t, kind, name)?;
            check_version(kind, name, Some(rv), actual)?;
            t.insert(name, pack(next, value)?.as_slice())
                .map_err(backend)?;
            let change = Change::new(kind, name, ChangeOp::Updated, next);
            Ok((next, Some(change)))
        })
    }

    async fn delete_raw(&self, kind: Kind, name: &str, expected: Option<u64>) -> StoreResult<()> {
        self.write(kind, |t, next| {
            let actual = stored_version(t, kind, name)?;
            check_version(kind, name, expected, actual)?;
            t.remove(name).map_err(backend)?;
            let change = Change::new(kind, name, ChangeOp::Deleted, next);
            Ok(((), Some(change)))
        })
    }

    fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }
}

#[cfg(test)]
mod tests {
    //! The contract suite on the redb backend, plus what is redb's own:
    //! the file lock.
    use std::process::{Command, Stdio};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::store::contract;

    fn fresh() -> (tempfile::TempDir, RedbStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = RedbStore::open(dir.path().join("store.redb")).unwrap();
        (dir, store)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn contract_crud() {
        contract::crud(&fresh().1).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn contract_conflicts() {
        contract::conflicts(&fresh().1).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn contract_concurrent_writers() {
        let (_dir, store) = fresh();
        contract::concurrent_writers(Arc::new(store)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn contract_subscriptions() {
        contract::subscriptions(&fresh().1).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn contract_announced_before_seen() {
        let (_dir, store) = fresh();
        contract::announced_before_seen(Arc::new(store)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn contract_persists_across_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.redb");
        contract::persists(async || Box::new(RedbStore::open(&path).unwrap()) as Box<dyn Store>)
            .await;
    }

    #[test]
    fn a_second_open_of_the_same_file_fails_at_once_with_a_clear_message() {
        let (dir, _first) = fresh();
        // The first store stays open until the test ends: an open that
        // waited for its lock would never return. The budget is only how
        // long to wait before saying so.
        let path = dir.path().join("store.redb");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(RedbStore::open(path).map(drop)));
        let err = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the second open waits for the first to close")
            .unwrap_err();
        assert!(matches!(err, StoreError::Locked { .. }), "{err:?}");
        assert!(
            err.to_string().contains("already open in another process"),
            "{err}"
        );
    }

    /// Entry point of the child process of the crash test: only does work
    /// when the parent set the environment variable.
    #[test]
    fn crash_child_entry() {
        let Ok(path) = std::env::var("BALLAST_CRASH_CHILD_STORE") else {
            return;
        };
        let ready = std::env::var("BALLAST_CRASH_CHILD_READY").unwrap();
        let store = RedbStore::open(&path).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(contract::crash_writer_loop(
            &store,
            std::path::Path::new(&ready),
        ));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn contract_sigkill_mid_write_leaves_no_torn_object() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.redb");
        for round in 0..3 {
            let ready = dir.path().join(format!("ready-{round}"));
            let mut child = Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "store::redb_store::tests::crash_child_entry",
                    "--nocapture",
                ])
                .env("BALLAST_CRASH_CHILD_STORE", &path)
                .env("BALLAST_CRASH_CHILD_READY", &ready)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let deadline = Instant::now() + Duration::from_secs(30);
            while !ready.exists() {
                assert!(Instant::now() < deadline, "child never became ready");
                assert!(child.try_wait().unwrap().is_none(), "child exited early");
                std::thread::sleep(Duration::from_millis(5));
            }
            // Let it write a while, at a different moment each round.
            std::thread::sleep(Duration::from_millis(50 + 70 * round));
            child.kill().unwrap(); // SIGKILL
            child.wait().unwrap();

            let store = RedbStore::open(&path).expect("reopens after SIGKILL");
            let n = contract::verify_no_torn_objects(&store).await;
            assert!(n > 0, "the child wrote records before it died");
        }
    }
}
