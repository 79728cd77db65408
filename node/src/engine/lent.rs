//! The local replica, lent to the engine by its server (`Op::Lend`): the
//! engine reads and writes its files itself, with the replica format's own
//! code, instead of sending every request through a replica server on the
//! same node. That saves the TCP hop, two copies of every write and a
//! thread hand-off on each side.
//!
//! The loan is held by the engine's connection to that server; while it
//! lasts the server refuses every other read and mutation of the replica.
//! If the connection drops (the node plugin restarts), the engine keeps
//! going and asks again until the server answers; if the server refuses
//! (the disk was lost), the replica fails like any other.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use bytes::Bytes;

use crate::replica::{LayerInfo, Replica, ReplicaError};
use crate::wire::client::ClientError;
use crate::wire::client::ReplicaClient;
use crate::wire::protocol::status;

pub struct Lent {
    name: String,
    addr: String,
    /// How the lease connected (a new lease connects the same way).
    tls: crate::wire::tls::WireTls,
    dir: PathBuf,
    replica: RwLock<Replica>,
    /// Whether the replica keeps block checksums (its format's, fixed).
    keeps_sums: bool,
    /// The connection that holds the loan.
    lease: Mutex<Arc<ReplicaClient>>,
    /// The task that keeps the loan; stopped with the replica.
    keeper: Mutex<Option<tokio::task::AbortHandle>>,
}

impl Drop for Lent {
    fn drop(&mut self) {
        // The keeper holds the lease's connection while it waits: stopping
        // it closes the connection, which ends the loan.
        if let Ok(mut k) = self.keeper.lock()
            && let Some(k) = k.take()
        {
            k.abort();
        }
    }
}

impl Lent {
    /// Borrows the replica opened on `lease` and opens its files in `dir`.
    /// They must hold a replica of `size` bytes at `revision`, the one the
    /// engine started from.
    pub async fn borrow(
        lease: Arc<ReplicaClient>,
        name: &str,
        dir: &Path,
        size: u64,
        revision: u64,
        writeback_every: u64,
    ) -> Result<Arc<Lent>, ClientError> {
        lease.lend().await?;
        let failed = |message: String| {
            ClientError::failed(&dir.display().to_string(), status::INVALID, message)
        };
        let at = dir.to_path_buf();
        let opened = tokio::task::spawn_blocking(move || Replica::open(&at))
            .await
            .map_err(|e| failed(e.to_string()))
            .and_then(|r| r.map_err(|e| failed(e.to_string())));
        let checked = opened.and_then(|r| {
            if r.size() != size || r.revision() != revision {
                Err(failed(format!(
                    "its files hold size {} at revision {}, not the volume's {size} at {revision}",
                    r.size(),
                    r.revision()
                )))
            } else {
                Ok(r)
            }
        });
        let replica = match checked {
            Ok(mut r) => {
                r.set_writeback_every(writeback_every);
                r
            }
            Err(e) => {
                let _ = lease.give_back().await;
                return Err(e);
            }
        };
        tracing::info!(replica = name, dir = %dir.display(), "local replica lent to the engine");
        Ok(Arc::new(Lent {
            name: name.to_string(),
            addr: lease.addr().to_string(),
            tls: lease.tls().clone(),
            dir: dir.to_path_buf(),
            keeps_sums: replica.keeps_sums(),
            replica: RwLock::new(replica),
            lease: Mutex::new(lease),
            keeper: Mutex::new(None),
        }))
    }

    fn error(&self, e: ReplicaError) -> ClientError {
        ClientError::of_replica(&self.dir.display().to_string(), &e)
    }

    fn poisoned(&self) -> ClientError {
        self.error(ReplicaError::Invalid("replica lock poisoned".into()))
    }

    pub fn read(&self, offset: u64, len: u32) -> Result<Vec<u8>, ClientError> {
        let r = self.replica.read().map_err(|_| self.poisoned())?;
        let mut buf = vec![0u8; len as usize];
        r.read(offset, &mut buf).map_err(|e| {
            r.note_corruption(&e);
            self.error(e)
        })?;
        Ok(buf)
    }

    /// Writes into the head (into the page cache: short enough to run
    /// inline); `revision` 0 keeps the replica's own count going.
    pub fn write(&self, offset: u64, data: &[u8], revision: u64) -> Result<(), ClientError> {
        let mut r = self.replica.write().map_err(|_| self.poisoned())?;
        r.write(offset, data, (revision != 0).then_some(revision))
            .map_err(|e| self.error(e))
    }

    /// `write`, with the checksums of its whole blocks when the engine
    /// took them once for every replica and this one keeps them (see
    /// `Replica::write_summed`).
    pub fn write_maybe_summed(
        &self,
        offset: u64,
        data: &[u8],
        sums: Option<&Bytes>,
        revision: u64,
    ) -> Result<(), ClientError> {
        let (Some(sums), true) = (sums, self.keeps_sums) else {
            return self.write(offset, data, revision);
        };
        let mut r = self.replica.write().map_err(|_| self.poisoned())?;
        r.write_summed(offset, data, sums, (revision != 0).then_some(revision))
            .map_err(|e| self.error(e))
    }

    /// Whether the replica keeps block checksums.
    pub fn keeps_sums(&self) -> bool {
        self.keeps_sums
    }

    /// Trims, or with `zeroes` writes zeros (see `Replica::discard`).
    pub fn discard(
        &self,
        offset: u64,
        len: u64,
        revision: u64,
        zeroes: bool,
    ) -> Result<(), ClientError> {
        let mut r = self.replica.write().map_err(|_| self.poisoned())?;
        r.discard(offset, len, (revision != 0).then_some(revision), zeroes)
            .map_err(|e| self.error(e))
    }

    /// Makes every write so far durable, on a blocking thread.
    pub async fn flush(self: &Arc<Self>) -> Result<(), ClientError> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            let r = me.replica.read().map_err(|_| me.poisoned())?;
            r.flush().map_err(|e| me.error(e))
        })
        .await
        .map_err(|e| self.error(ReplicaError::Invalid(e.to_string())))?
    }

    /// Closes the replica clean (`Replica::close_clean`), on a blocking
    /// thread, as the engine stops: every write durable, the mark made,
    /// and every I/O after it failed. Only while the loan is held, as its
    /// server answers on the loan's connection: without it, someone else
    /// may have written the files since, and the instance is let go
    /// unmarked. Says whether it marked.
    pub async fn close_clean(self: &Arc<Self>, why: &'static str) -> Result<bool, ClientError> {
        let held = match self.lease() {
            Some(lease) => tokio::time::timeout(Duration::from_secs(2), lease.lend())
                .await
                .is_ok_and(|r| r.is_ok()),
            None => false,
        };
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut r = me.replica.write().map_err(|_| me.poisoned())?;
            if !held {
                r.break_off(format!("closed: {why}"));
                return Ok(false);
            }
            r.close_clean(why).map_err(|e| me.error(e))
        })
        .await
        .map_err(|e| self.error(ReplicaError::Invalid(e.to_string())))?
    }

    /// Merges the layers no snapshot in `keep` needs (see
    /// `replica::merge_paced`), on a blocking thread, while the engine
    /// goes on serving between steps.
    pub async fn merge(
        self: &Arc<Self>,
        keep: Vec<String>,
        rate: u64,
    ) -> Result<crate::replica::MergeReport, ClientError> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            crate::replica::merge_paced(&me.replica, &keep, rate, &|| false)
                .map_err(|e| me.error(e))
        })
        .await
        .map_err(|e| self.error(ReplicaError::Invalid(e.to_string())))?
    }

    /// Grows the replica (see `Replica::grow`), on a blocking thread.
    pub async fn grow(self: &Arc<Self>, size: u64) -> Result<(), ClientError> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut r = me.replica.write().map_err(|_| me.poisoned())?;
            r.grow(size).map_err(|e| me.error(e))
        })
        .await
        .map_err(|e| self.error(ReplicaError::Invalid(e.to_string())))?
    }

    /// Freezes the head (see `Replica::snapshot_losing`), on a blocking
    /// thread.
    pub async fn snapshot(
        self: &Arc<Self>,
        label: Option<&str>,
        lose: &std::collections::BTreeSet<u64>,
    ) -> Result<String, ClientError> {
        let me = self.clone();
        let label = label.map(str::to_string);
        let lose = lose.clone();
        tokio::task::spawn_blocking(move || {
            let mut r = me.replica.write().map_err(|_| me.poisoned())?;
            r.snapshot_losing(label.as_deref(), &lose)
                .map_err(|e| me.error(e))
        })
        .await
        .map_err(|e| self.error(ReplicaError::Invalid(e.to_string())))?
    }

    /// Gives up block `block` of frozen layer `layer` as lost (see
    /// `Replica::lose_frozen_block`), on a blocking thread.
    pub async fn lose(self: &Arc<Self>, layer: &str, block: u64) -> Result<(), ClientError> {
        let me = self.clone();
        let layer = layer.to_string();
        tokio::task::spawn_blocking(move || {
            let mut r = me.replica.write().map_err(|_| me.poisoned())?;
            r.lose_frozen_block(&layer, block * crate::replica::BLOCK)
                .map_err(|e| me.error(e))
        })
        .await
        .map_err(|e| self.error(ReplicaError::Invalid(e.to_string())))?
    }

    /// The writes after revision `since` in its write log (see
    /// `Replica::writes_since`).
    pub fn writes_since(
        &self,
        since: u64,
    ) -> Result<Option<Vec<crate::replica::LogEntry>>, ClientError> {
        Ok(self
            .replica
            .read()
            .map_err(|_| self.poisoned())?
            .writes_since(since))
    }

    pub fn layers(&self) -> Result<Vec<LayerInfo>, ClientError> {
        Ok(self.replica.read().map_err(|_| self.poisoned())?.layers())
    }

    fn lease(&self) -> Option<Arc<ReplicaClient>> {
        self.lease.lock().ok().map(|l| l.clone())
    }

    /// Ends the loan (before the replica's data is deleted).
    pub async fn give_back(&self) {
        if let Some(k) = self.keeper.lock().ok().and_then(|mut k| k.take()) {
            k.abort();
        }
        if let Some(lease) = self.lease()
            && let Err(e) = lease.give_back().await
        {
            tracing::debug!(replica = %self.name, error = %e, "giving the replica back failed; its connection's end ends the loan");
        }
    }

    /// Keeps the loan while the replica lives: when its connection drops,
    /// asks again (every second, until the server answers); calls
    /// `refused` with the server's answer when it refuses.
    pub fn keep(self: &Arc<Self>, refused: impl FnOnce(ClientError) + Send + 'static) {
        let me: Weak<Lent> = Arc::downgrade(self);
        let task = tokio::spawn(async move {
            let why = loop {
                let Some(lease) = me.upgrade().and_then(|l| l.lease()) else {
                    return;
                };
                lease.closed().await;
                drop(lease);
                let Some((name, addr, tls)) = me
                    .upgrade()
                    .map(|l| (l.name.clone(), l.addr.clone(), l.tls.clone()))
                else {
                    return;
                };
                tracing::warn!(replica = %name, "the loan's connection dropped; asking again");
                let answer = loop {
                    let again = match ReplicaClient::dial(&tls, &addr, &name).await {
                        Ok(c) => c.lend().await.map(|()| c),
                        Err(e) => Err(e),
                    };
                    match again {
                        Ok(c) => break Ok(c),
                        Err(e @ ClientError::Failed { .. }) => break Err(e),
                        Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
                    }
                };
                match answer {
                    Ok(c) => {
                        let Some(l) = me.upgrade() else {
                            return;
                        };
                        if let Ok(mut lease) = l.lease.lock() {
                            *lease = Arc::new(c);
                        }
                        tracing::info!(replica = %name, "the replica is lent again");
                    }
                    Err(e) => break e,
                }
            };
            refused(why);
        });
        if let Ok(mut k) = self.keeper.lock() {
            *k = Some(task.abort_handle());
        }
    }
}
