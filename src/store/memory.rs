//! A store held in memory: the same contract as the embedded one (the
//! contract suite runs on both), nothing written anywhere. The simulator
//! keeps its model cluster in one, so that the controller's own code reads
//! and writes it.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde_json::Value;
use tokio::sync::broadcast;

use super::{Change, ChangeOp, Raw, Store, StoreError, StoreResult, check_version};
use crate::model::Kind;

/// Objects by kind and name, with their versions.
pub struct MemoryStore {
    state: Mutex<State>,
    changes: broadcast::Sender<Change>,
}

#[derive(Default)]
struct State {
    revision: u64,
    objects: BTreeMap<(Kind, String), (u64, Value)>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        let (changes, _) = broadcast::channel(1024);
        MemoryStore {
            state: Mutex::default(),
            changes,
        }
    }
}

fn poisoned() -> StoreError {
    StoreError::Backend("memory store lock poisoned".into())
}

impl MemoryStore {
    /// Runs one change under the lock and announces it before letting go
    /// of the lock: whoever reads the change has it in the stream already.
    fn write<T>(
        &self,
        f: impl FnOnce(&mut State, u64) -> Result<(T, Change), StoreError>,
    ) -> Result<T, StoreError> {
        let mut s = self.state.lock().map_err(|_| poisoned())?;
        let next = s.revision + 1;
        let (out, change) = f(&mut s, next)?;
        s.revision = next;
        let _ = self.changes.send(change);
        Ok(out)
    }

    fn version(s: &State, kind: Kind, name: &str) -> Result<u64, StoreError> {
        s.objects
            .get(&(kind, name.to_string()))
            .map(|(v, _)| *v)
            .ok_or_else(|| StoreError::NotFound {
                kind,
                name: name.to_string(),
            })
    }
}

#[async_trait::async_trait]
impl Store for MemoryStore {
    async fn get_raw(&self, kind: Kind, name: &str) -> Result<Option<Raw>, StoreError> {
        let s = self.state.lock().map_err(|_| poisoned())?;
        Ok(s.objects
            .get(&(kind, name.to_string()))
            .map(|(version, value)| Raw {
                name: name.to_string(),
                resource_version: *version,
                value: value.clone(),
            }))
    }

    async fn list_raw(&self, kind: Kind) -> Result<Vec<Raw>, StoreError> {
        let s = self.state.lock().map_err(|_| poisoned())?;
        Ok(s.objects
            .range((kind, String::new())..)
            .take_while(|((k, _), _)| *k == kind)
            .map(|((_, name), (version, value))| Raw {
                name: name.clone(),
                resource_version: *version,
                value: value.clone(),
            })
            .collect())
    }

    async fn create_raw(&self, kind: Kind, name: &str, value: &Value) -> Result<u64, StoreError> {
        self.write(|s, next| {
            let key = (kind, name.to_string());
            if s.objects.contains_key(&key) {
                return Err(StoreError::AlreadyExists {
                    kind,
                    name: name.to_string(),
                });
            }
            s.objects.insert(key, (next, value.clone()));
            Ok((next, Change::new(kind, name, ChangeOp::Created, next)))
        })
    }

    async fn update_raw(&self, kind: Kind, name: &str, value: &Value, rv: u64) -> StoreResult<u64> {
        self.write(|s, next| {
            let actual = Self::version(s, kind, name)?;
            check_version(kind, name, Some(rv), actual)?;
            s.objects
                .insert((kind, name.to_string()), (next, value.clone()));
            Ok((next, Change::new(kind, name, ChangeOp::Updated, next)))
        })
    }

    async fn delete_raw(&self, kind: Kind, name: &str, expected: Option<u64>) -> StoreResult<()> {
        self.write(|s, next| {
            let actual = Self::version(s, kind, name)?;
            check_version(kind, name, expected, actual)?;
            s.objects.remove(&(kind, name.to_string()));
            Ok(((), Change::new(kind, name, ChangeOp::Deleted, next)))
        })
    }

    fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }
}

#[cfg(test)]
mod tests {
    //! The contract suite on the memory backend.
    use std::sync::Arc;

    use super::MemoryStore;
    use crate::store::contract;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn contract_crud() {
        contract::crud(&MemoryStore::default()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn contract_conflicts() {
        contract::conflicts(&MemoryStore::default()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn contract_concurrent_writers() {
        contract::concurrent_writers(Arc::new(MemoryStore::default())).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn contract_subscriptions() {
        contract::subscriptions(&MemoryStore::default()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn contract_announced_before_seen() {
        contract::announced_before_seen(Arc::new(MemoryStore::default())).await;
    }
}
