//! The watch cache of one kind: a list, then a watch from the list's
//! resource version, applied to an in-memory copy that the store reads.
//!
//! A watch that ends is resumed from the last resource version seen
//! (a bookmark counts); one the API server refuses as too old (410 Gone)
//! is replaced by a fresh list, and what changed meanwhile is announced as
//! changes, so a subscriber misses nothing. Every applied change moves the
//! cache's `seen` revision, which writers wait on to read their own writes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use ballast::model::Kind;
use ballast::store::{Change, ChangeOp, Raw, StoreError};
use kube::api::{Api, DynamicObject, ListParams, WatchEvent, WatchParams};
use tokio::sync::{broadcast, watch};
use tokio_stream::StreamExt;

use super::objects::{backend, from_object, object_rv, revision};

/// How long one watch request lasts before it is renewed.
const WATCH_SECONDS: u32 = 290;

/// The cached objects of one kind.
pub struct Cache {
    kind: Kind,
    objects: RwLock<BTreeMap<String, Entry>>,
    seen: watch::Sender<u64>,
    relists: AtomicU64,
}

/// One cached object: its record and its uid (for events about it).
#[derive(Clone)]
pub struct Entry {
    pub raw: Raw,
    pub uid: String,
}

impl Cache {
    pub fn new(kind: Kind) -> Arc<Cache> {
        Arc::new(Cache {
            kind,
            objects: RwLock::default(),
            seen: watch::Sender::new(0),
            relists: AtomicU64::new(0),
        })
    }

    pub fn get(&self, name: &str) -> Option<Entry> {
        self.read().get(name).cloned()
    }

    /// Every object, ordered by name.
    pub fn list(&self) -> Vec<Raw> {
        self.read().values().map(|e| e.raw.clone()).collect()
    }

    /// How many times the watch was replaced by a list since the first.
    pub fn relists(&self) -> u64 {
        self.relists.load(Ordering::Relaxed)
    }

    /// Waits until the cache has seen revision `rv` (at most `limit`).
    /// Returns whether it did.
    pub async fn wait_seen(&self, rv: u64, limit: Duration) -> bool {
        let mut rx = self.seen.subscribe();
        tokio::time::timeout(limit, rx.wait_for(|s| *s >= rv))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Waits until `name` at version `rv` has left the cache (deleted, or
    /// replaced by a newer version), at most `limit`.
    pub async fn wait_gone(&self, name: &str, rv: u64, limit: Duration) -> bool {
        let mut rx = self.seen.subscribe();
        let gone = |_: &u64| self.get(name).is_none_or(|e| e.raw.resource_version > rv);
        tokio::time::timeout(limit, rx.wait_for(gone))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Entry>> {
        self.objects.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, Entry>> {
        self.objects.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies one watch event and announces it. The announcement is sent
    /// before the cache's lock is let go: a read that sees the change
    /// finds it in the stream already (the store's contract,
    /// `announced_before_seen`), so the controller's copy of the records
    /// is never behind what a plan read.
    fn apply(&self, obj: DynamicObject, deleted: bool, changes: &broadcast::Sender<Change>) {
        let Some(entry) = entry_of(self.kind, obj) else {
            return;
        };
        let name = entry.raw.name.clone();
        let rv = entry.raw.resource_version;
        {
            let mut objects = self.write();
            let op = if deleted {
                objects.remove(&name);
                ChangeOp::Deleted
            } else if objects.insert(name.clone(), entry).is_some() {
                ChangeOp::Updated
            } else {
                ChangeOp::Created
            };
            let _ = changes.send(Change::new(self.kind, &name, op, rv));
        }
        self.saw(rv);
    }

    fn saw(&self, rv: u64) {
        self.seen.send_if_modified(|s| {
            let newer = rv > *s;
            if newer {
                *s = rv;
            }
            newer
        });
    }

    /// Replaces the cache by a list, announcing the difference (under the
    /// cache's lock, as `apply`). Returns the list's resource version.
    pub async fn relist(
        &self,
        api: &Api<DynamicObject>,
        changes: &broadcast::Sender<Change>,
    ) -> Result<u64, StoreError> {
        let list = api.list(&ListParams::default()).await.map_err(backend)?;
        let list_rv = list
            .metadata
            .resource_version
            .as_deref()
            .map(revision)
            .unwrap_or(0);
        let fresh: BTreeMap<String, Entry> = list
            .items
            .into_iter()
            .filter_map(|o| entry_of(self.kind, o))
            .map(|e| (e.raw.name.clone(), e))
            .collect();
        let mut announce = Vec::new();
        {
            let mut objects = self.write();
            for (name, e) in &fresh {
                match objects.get(name) {
                    None => announce.push(Change::new(
                        self.kind,
                        name,
                        ChangeOp::Created,
                        e.raw.resource_version,
                    )),
                    Some(old) if old.raw.resource_version != e.raw.resource_version => announce
                        .push(Change::new(
                            self.kind,
                            name,
                            ChangeOp::Updated,
                            e.raw.resource_version,
                        )),
                    Some(_) => {}
                }
            }
            for name in objects.keys().filter(|n| !fresh.contains_key(*n)) {
                announce.push(Change::new(self.kind, name, ChangeOp::Deleted, list_rv));
            }
            *objects = fresh;
            for c in announce {
                let _ = changes.send(c);
            }
        }
        self.saw(list_rv);
        Ok(list_rv)
    }

    /// Follows the kind from resource version `from` for ever: resumes a
    /// watch that ends, relists on 410 Gone, waits a second on errors.
    pub async fn follow(
        self: Arc<Self>,
        api: Api<DynamicObject>,
        mut from: u64,
        changes: broadcast::Sender<Change>,
    ) {
        let params = WatchParams::default().timeout(WATCH_SECONDS);
        loop {
            let gone = match api.watch(&params, &from.to_string()).await {
                Ok(stream) => {
                    let mut stream = std::pin::pin!(stream);
                    let mut gone = false;
                    while let Some(event) = stream.next().await {
                        match event {
                            Ok(WatchEvent::Added(o) | WatchEvent::Modified(o)) => {
                                from = from.max(object_rv(&o));
                                self.apply(o, false, &changes);
                            }
                            Ok(WatchEvent::Deleted(o)) => {
                                from = from.max(object_rv(&o));
                                self.apply(o, true, &changes);
                            }
                            Ok(WatchEvent::Bookmark(b)) => {
                                from = from.max(revision(&b.metadata.resource_version));
                                self.saw(from);
                            }
                            Ok(WatchEvent::Error(status)) => {
                                gone = status.code == 410;
                                if !gone {
                                    tracing::warn!(kind = %self.kind, error = %status.message, "watch error");
                                }
                                break;
                            }
                            Err(e) => {
                                tracing::debug!(kind = %self.kind, error = %e, "watch ended");
                                break;
                            }
                        }
                    }
                    gone
                }
                Err(kube::Error::Api(status)) if status.code == 410 => true,
                Err(e) => {
                    tracing::warn!(kind = %self.kind, error = %e, "cannot watch; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    false
                }
            };
            if gone {
                tracing::info!(kind = %self.kind, from, "watch too old (410 Gone): listing again");
                match self.relist(&api, &changes).await {
                    Ok(rv) => {
                        from = rv;
                        self.relists.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        tracing::warn!(kind = %self.kind, error = %e, "cannot list; retrying");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        }
    }
}

fn entry_of(kind: Kind, obj: DynamicObject) -> Option<Entry> {
    let uid = obj.metadata.uid.clone().unwrap_or_default();
    match from_object(kind, obj) {
        Ok(raw) => Some(Entry { raw, uid }),
        Err(e) => {
            tracing::warn!(%kind, error = %e, "an object the store cannot read is left out");
            None
        }
    }
}
