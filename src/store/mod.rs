//! The store of record, behind a trait with optimistic concurrency.
//!
//! Every object carries a resource version; a write that names a stale
//! version fails with [`StoreError::Conflict`] and the caller re-reads and
//! retries. Every committed change is announced to subscribers. Backends:
//! [`RedbStore`] (embedded, the default) and [`MemoryStore`] (the
//! simulator's) here, and the Kubernetes one in the controller crate
//! (`kubernetes/store.rs`); all of them pass the same [`contract`] suite.

use std::time::Duration;

use serde_json::Value;
use tokio::sync::broadcast;

use crate::model::{Kind, Object};

#[cfg(any(test, feature = "contract-tests"))]
pub mod contract;
mod memory;
mod redb_store;

pub use memory::MemoryStore;
pub use redb_store::RedbStore;

/// Errors of the store layer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{kind} {name:?} not found")]
    NotFound { kind: Kind, name: String },
    #[error("{kind} {name:?} already exists")]
    AlreadyExists { kind: Kind, name: String },
    #[error(
        "{kind} {name:?} was changed by someone else (resource version {actual}, you had {expected}); read it again and retry"
    )]
    Conflict {
        kind: Kind,
        name: String,
        expected: u64,
        actual: u64,
    },
    #[error(
        "the store {path} is already open in another process (is another controller running on it?)"
    )]
    Locked { path: String },
    #[error("stored {kind} {name:?} is unreadable: {reason}")]
    Corrupt {
        kind: Kind,
        name: String,
        reason: String,
    },
    /// The backend refused the object itself (the Kubernetes API server,
    /// by a CRD's schema): the message names the field and what it accepts.
    #[error("{kind} {name:?} is refused: {reason}")]
    Invalid {
        kind: Kind,
        name: String,
        reason: String,
    },
    #[error("store backend: {0}")]
    Backend(String),
}

/// One stored object: its name, version and JSON body.
#[derive(Clone, Debug, PartialEq)]
pub struct Raw {
    pub name: String,
    pub resource_version: u64,
    pub value: Value,
}

/// What happened to an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeOp {
    Created,
    Updated,
    Deleted,
}

/// A committed change, as subscribers see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub kind: Kind,
    pub name: String,
    pub op: ChangeOp,
    /// The store revision of the change (the new resource version, or the
    /// revision of the deletion).
    pub revision: u64,
}

impl Change {
    pub fn new(kind: Kind, name: &str, op: ChangeOp, revision: u64) -> Change {
        Change {
            kind,
            name: name.to_string(),
            op,
            revision,
        }
    }
}

/// A write that names version `expected` of an object at version `actual`
/// (None: no version named) goes on only when they are the same.
pub(crate) fn check_version(
    kind: Kind,
    name: &str,
    expected: Option<u64>,
    actual: u64,
) -> Result<(), StoreError> {
    match expected {
        Some(expected) if expected != actual => Err(StoreError::Conflict {
            kind,
            name: name.to_string(),
            expected,
            actual,
        }),
        _ => Ok(()),
    }
}

/// A backend of the store. Methods are async: a backend may be a network
/// service (the Kubernetes API server). Resource versions are drawn from
/// one store-wide, strictly increasing revision.
/// What a store's methods return.
pub type StoreResult<T> = Result<T, StoreError>;

#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    async fn get_raw(&self, kind: Kind, name: &str) -> Result<Option<Raw>, StoreError>;
    /// Every object of a kind, ordered by name.
    async fn list_raw(&self, kind: Kind) -> Result<Vec<Raw>, StoreError>;
    /// Creates an object; fails with AlreadyExists. Returns its version.
    async fn create_raw(&self, kind: Kind, name: &str, value: &Value) -> Result<u64, StoreError>;
    /// Replaces an object if its version is still `rv`.
    async fn update_raw(&self, kind: Kind, name: &str, value: &Value, rv: u64) -> StoreResult<u64>;
    /// Deletes an object, checking its version when `expected` is given.
    async fn delete_raw(&self, kind: Kind, name: &str, expected: Option<u64>) -> StoreResult<()>;
    /// Changes committed from now on. A receiver that lags is told so by
    /// the channel and should re-list.
    fn subscribe(&self) -> broadcast::Receiver<Change>;
}

fn decode<T: Object>(raw: Raw) -> Result<T, StoreError> {
    let mut obj: T = serde_json::from_value(raw.value).map_err(|e| StoreError::Corrupt {
        kind: T::KIND,
        name: raw.name.clone(),
        reason: e.to_string(),
    })?;
    obj.set_resource_version(raw.resource_version);
    Ok(obj)
}

fn encode<T: Object>(obj: &T) -> Result<Value, StoreError> {
    let mut v = serde_json::to_value(obj).map_err(|e| StoreError::Backend(e.to_string()))?;
    // The version lives beside the body, never inside it.
    if let Value::Object(map) = &mut v {
        map.remove("resourceVersion");
    }
    Ok(v)
}

/// How many times `modify` re-reads after a conflict.
const MODIFY_ATTEMPTS: usize = 64;

/// Typed access on top of any [`Store`] (inherent methods of `dyn Store`,
/// so that their futures are plainly `Send`).
impl dyn Store {
    pub async fn get<T: Object>(&self, name: &str) -> Result<Option<T>, StoreError> {
        self.get_raw(T::KIND, name).await?.map(decode).transpose()
    }

    /// Like `get`, but a missing object is NotFound.
    pub async fn fetch<T: Object>(&self, name: &str) -> Result<T, StoreError> {
        self.get(name).await?.ok_or_else(|| StoreError::NotFound {
            kind: T::KIND,
            name: name.to_string(),
        })
    }

    pub async fn list<T: Object>(&self) -> Result<Vec<T>, StoreError> {
        self.list_raw(T::KIND)
            .await?
            .into_iter()
            .map(decode)
            .collect()
    }

    /// Creates `obj` and returns it with its version.
    pub async fn create<T: Object>(&self, obj: &T) -> Result<T, StoreError> {
        let v = self.create_raw(T::KIND, obj.name(), &encode(obj)?).await?;
        let mut out = obj.clone();
        out.set_resource_version(v);
        Ok(out)
    }

    /// Writes `obj` if nobody changed it since it was read.
    pub async fn update<T: Object>(&self, obj: &T) -> Result<T, StoreError> {
        let v = self
            .update_raw(T::KIND, obj.name(), &encode(obj)?, obj.resource_version())
            .await?;
        let mut out = obj.clone();
        out.set_resource_version(v);
        Ok(out)
    }

    pub async fn delete<T: Object>(
        &self,
        name: &str,
        expected: Option<u64>,
    ) -> Result<(), StoreError> {
        self.delete_raw(T::KIND, name, expected).await
    }

    /// Read-modify-write with retries on conflict. `f` may be called
    /// several times; it returns Ok(false) to write nothing.
    pub async fn modify<T: Object, E: From<StoreError>>(
        &self,
        name: &str,
        mut f: impl FnMut(&mut T) -> Result<bool, E> + Send,
    ) -> Result<T, E> {
        let mut last = None;
        let mut attempt: u64 = 0;
        for _ in 0..MODIFY_ATTEMPTS {
            let mut obj: T = self.fetch(name).await?;
            if !f(&mut obj)? {
                return Ok(obj);
            }
            match self.update(&obj).await {
                Ok(o) => return Ok(o),
                Err(e @ StoreError::Conflict { .. }) => last = Some(e),
                Err(e) => return Err(e.into()),
            }
            // Let the writer that won finish (and a watch-fed backend see
            // its write) before reading again; longer as conflicts repeat.
            attempt += 1;
            let pause = Duration::from_millis((attempt * attempt).min(50));
            tokio::time::sleep(pause).await;
        }
        Err(last
            .unwrap_or_else(|| StoreError::Backend("modify gave up".into()))
            .into())
    }
}
