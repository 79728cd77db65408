//! The store over the Kubernetes API server.
//!
//! Volumes, replicas, nodes and settings are custom resources in one
//! namespace; events are `events.k8s.io/v1` Events there (`events`). Reads
//! come from the watch cache of their kind (`watch`), never from a list per
//! call; a write goes to the API server, conditioned on the resource
//! version the caller read (a stale one is a Conflict), and returns once
//! the cache has seen it, so that a process reads its own writes.
//!
//! The API server keeps `status` apart (a status subresource): a write that
//! changes a spec and a status is two requests, the spec first. If the
//! status request then meets a newer version, the caller gets a Conflict
//! and, as for any conflict, reads again and retries; a reader in between
//! sees the new spec with the old status.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ballast::model::Kind;
use ballast::store::{Change, Raw, Store, StoreError, StoreResult};
use kube::api::{Api, DeleteParams, DynamicObject, PostParams, Preconditions};
use serde_json::Value;
use tokio::sync::broadcast;
use tokio::task::AbortHandle;

use super::KubeError;
use super::events::EventLog;
use super::objects::{backend, is_empty, object_rv, resource, split, to_object, with_status};
use super::watch::Cache;

/// How long a writer waits for the watch to show its own write.
const SEE_OWN_WRITE: Duration = Duration::from_secs(10);

/// The kinds kept as custom resources (events are not).
const RESOURCES: [Kind; 5] = [
    Kind::Volume,
    Kind::Replica,
    Kind::Node,
    Kind::Setting,
    Kind::Snapshot,
];

/// The store of record in a Kubernetes cluster.
pub struct KubeStore {
    namespace: String,
    apis: BTreeMap<Kind, Api<DynamicObject>>,
    caches: BTreeMap<Kind, Arc<Cache>>,
    events: EventLog,
    changes: broadcast::Sender<Change>,
    watches: Vec<AbortHandle>,
}

impl std::fmt::Debug for KubeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeStore")
            .field("namespace", &self.namespace)
            .finish()
    }
}

impl Drop for KubeStore {
    fn drop(&mut self) {
        for w in &self.watches {
            w.abort();
        }
    }
}

impl KubeStore {
    /// Lists every kind, starts their watches, and returns once the caches
    /// hold what the API server held at the lists.
    pub async fn connect(
        client: kube::Client,
        namespace: &str,
        instance: &str,
    ) -> Result<KubeStore, KubeError> {
        let (changes, _) = broadcast::channel(4096);
        let mut apis = BTreeMap::new();
        let mut caches = BTreeMap::new();
        let mut watches = Vec::new();
        for kind in RESOURCES {
            let api: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), namespace, &resource(kind));
            let cache = Cache::new(kind);
            let from = cache.relist(&api, &changes).await.map_err(|e| match e {
                StoreError::Backend(m) if m.contains("404") || m.contains("could not find") => {
                    KubeError::NoCrds(m)
                }
                other => KubeError::NoCrds(other.to_string()),
            })?;
            let task = tokio::spawn(cache.clone().follow(api.clone(), from, changes.clone()));
            watches.push(task.abort_handle());
            apis.insert(kind, api);
            caches.insert(kind, cache);
        }
        Ok(KubeStore {
            namespace: namespace.to_string(),
            events: EventLog::new(client, namespace, instance),
            apis,
            caches,
            changes,
            watches,
        })
    }

    /// The namespace the objects live in.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// How many times the watch of `kind` was replaced by a list (410 Gone).
    pub fn relists(&self, kind: Kind) -> u64 {
        self.caches.get(&kind).map(|c| c.relists()).unwrap_or(0)
    }

    /// Follows `kind` from resource version `from`, as after a restart: the
    /// watch resumes there, or lists again if the API server has forgotten
    /// it. (The store's own watches start from their first list.)
    pub fn follow_from(&self, kind: Kind, from: u64) {
        if let (Some(api), Some(cache)) = (self.apis.get(&kind), self.caches.get(&kind)) {
            tokio::spawn(
                cache
                    .clone()
                    .follow(api.clone(), from, self.changes.clone()),
            );
        }
    }

    fn api(&self, kind: Kind) -> Result<&Api<DynamicObject>, StoreError> {
        self.apis
            .get(&kind)
            .ok_or_else(|| StoreError::Backend(format!("no resource for {kind}")))
    }

    fn cache(&self, kind: Kind) -> Result<&Arc<Cache>, StoreError> {
        self.caches
            .get(&kind)
            .ok_or_else(|| StoreError::Backend(format!("no cache for {kind}")))
    }

    /// Waits for the watch to show revision `rv`; a watch that lags is
    /// logged, not an error (the write itself is committed).
    async fn see(&self, kind: Kind, rv: u64) {
        if let Ok(cache) = self.cache(kind)
            && !cache.wait_seen(rv, SEE_OWN_WRITE).await
        {
            tracing::warn!(%kind, rv, "the watch has not shown a write yet");
        }
    }

    /// The version of `name` the API server holds now, for a Conflict.
    async fn conflict(&self, kind: Kind, name: &str, expected: u64) -> StoreError {
        let actual = match self.api(kind) {
            Ok(api) => match api.get_opt(name).await {
                Ok(Some(o)) => object_rv(&o),
                Ok(None) => {
                    return StoreError::NotFound {
                        kind,
                        name: name.to_string(),
                    };
                }
                Err(e) => return backend(e),
            },
            Err(e) => return e,
        };
        StoreError::Conflict {
            kind,
            name: name.to_string(),
            expected,
            actual,
        }
    }

    /// Writes `status` through the status subresource, at version `rv`.
    async fn write_status(
        &self,
        kind: Kind,
        name: &str,
        body: &Value,
        status: Value,
        rv: u64,
    ) -> Result<u64, StoreError> {
        let obj = with_status(to_object(kind, name, body, Some(rv)), status);
        match self
            .api(kind)?
            .replace_status(name, &PostParams::default(), &obj)
            .await
        {
            Ok(o) => Ok(object_rv(&o)),
            Err(e) => Err(self.write_error(kind, name, rv, e).await),
        }
    }

    /// Maps an API error of a write on `name`.
    async fn write_error(
        &self,
        kind: Kind,
        name: &str,
        expected: u64,
        e: kube::Error,
    ) -> StoreError {
        match &e {
            kube::Error::Api(s) if s.code == 404 => StoreError::NotFound {
                kind,
                name: name.to_string(),
            },
            kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists" => {
                StoreError::AlreadyExists {
                    kind,
                    name: name.to_string(),
                }
            }
            kube::Error::Api(s) if s.code == 409 => self.conflict(kind, name, expected).await,
            kube::Error::Api(s) if s.code == 422 => StoreError::Invalid {
                kind,
                name: name.to_string(),
                reason: s.message.clone(),
            },
            _ => backend(e),
        }
    }
}

#[async_trait::async_trait]
impl Store for KubeStore {
    async fn get_raw(&self, kind: Kind, name: &str) -> Result<Option<Raw>, StoreError> {
        if kind == Kind::Event {
            return self.events.get(name).await;
        }
        Ok(self.cache(kind)?.get(name).map(|e| e.raw))
    }

    async fn list_raw(&self, kind: Kind) -> Result<Vec<Raw>, StoreError> {
        if kind == Kind::Event {
            return self.events.list().await;
        }
        Ok(self.cache(kind)?.list())
    }

    async fn create_raw(&self, kind: Kind, name: &str, value: &Value) -> Result<u64, StoreError> {
        if kind == Kind::Event {
            let uid = |kind: Kind, name: &str| {
                self.caches
                    .get(&kind)
                    .and_then(|c| c.get(name))
                    .map(|e| e.uid)
            };
            return self.events.create(name, value, uid).await;
        }
        let api = self.api(kind)?;
        let (body, status) = split(kind, value)?;
        let created = api
            .create(&PostParams::default(), &to_object(kind, name, &body, None))
            .await;
        let mut rv = match created {
            Ok(o) => object_rv(&o),
            Err(e) => return Err(self.write_error(kind, name, 0, e).await),
        };
        // The API server drops a status on create: it is written next.
        if let Some(status) = status.filter(|s| !is_empty(s)) {
            rv = self.write_status(kind, name, &body, status, rv).await?;
        }
        self.see(kind, rv).await;
        Ok(rv)
    }

    async fn update_raw(&self, kind: Kind, name: &str, value: &Value, rv: u64) -> StoreResult<u64> {
        if kind == Kind::Event {
            return Err(StoreError::Backend("events are never changed".into()));
        }
        let api = self.api(kind)?;
        let (body, status) = split(kind, value)?;
        // What the cache holds at the version the caller read tells which
        // parts changed; without it, both are written.
        let known = self
            .cache(kind)?
            .get(name)
            .filter(|e| e.raw.resource_version == rv)
            .map(|e| split(kind, &e.raw.value))
            .transpose()?;
        // An empty status and none are the same: the API server drops `{}`.
        let status_changed = match (&known, &status) {
            (_, None) => false,
            (Some((_, old)), Some(new)) => {
                old.as_ref().filter(|o| !is_empty(o)) != Some(new).filter(|n| !is_empty(n))
            }
            (None, Some(_)) => true,
        };
        let body_changed = match &known {
            Some((old, _)) => *old != body,
            None => true,
        };
        let mut written = rv;
        // The main object is written when its body changed, and also when
        // nothing did, so that a stale version is still a Conflict.
        if body_changed || !status_changed {
            let obj = to_object(kind, name, &body, Some(rv));
            written = match api.replace(name, &PostParams::default(), &obj).await {
                Ok(o) => object_rv(&o),
                Err(e) => return Err(self.write_error(kind, name, rv, e).await),
            };
        }
        if let (true, Some(status)) = (status_changed, status) {
            written = self
                .write_status(kind, name, &body, status, written)
                .await?;
        }
        self.see(kind, written).await;
        Ok(written)
    }

    async fn delete_raw(&self, kind: Kind, name: &str, expected: Option<u64>) -> StoreResult<()> {
        if kind == Kind::Event {
            return self.events.delete(name).await;
        }
        let api = self.api(kind)?;
        let params = DeleteParams {
            preconditions: expected.map(|rv| Preconditions {
                resource_version: Some(rv.to_string()),
                uid: None,
            }),
            ..Default::default()
        };
        let last = match api.delete(name, &params).await {
            Ok(either) => either.left().map(|o| object_rv(&o)),
            Err(e) => {
                return Err(self.write_error(kind, name, expected.unwrap_or(0), e).await);
            }
        };
        let last = last
            .or_else(|| {
                self.caches
                    .get(&kind)
                    .and_then(|c| c.get(name))
                    .map(|e| e.raw.resource_version)
            })
            .unwrap_or(0);
        if !self.cache(kind)?.wait_gone(name, last, SEE_OWN_WRITE).await {
            tracing::warn!(%kind, name, "the watch has not shown a deletion yet");
        }
        Ok(())
    }

    fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }
}
