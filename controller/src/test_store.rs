//! A store for tests that counts its reads: the whole reads (`list`) and
//! the single ones (`get`), and can fail the next of either; and the node
//! record those tests put in it. Tests of the copy of the records and of
//! who may serve use it to show what a call reads.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use ballast::model::{Kind, Node, NodeSpec, NodeStatus};
use ballast::store::{Change, MemoryStore, Raw, Store, StoreError, StoreResult};
use serde_json::Value;
use tokio::sync::broadcast;

/// A store that counts its whole reads and its single reads, and can
/// fail its next one of either.
#[derive(Default)]
pub struct Counting {
    inner: MemoryStore,
    pub lists: AtomicUsize,
    pub gets: AtomicUsize,
    pub fail_next_get: AtomicBool,
    pub fail_next_list: AtomicBool,
}

#[async_trait::async_trait]
impl Store for Counting {
    async fn get_raw(&self, kind: Kind, name: &str) -> StoreResult<Option<Raw>> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        if self.fail_next_get.swap(false, Ordering::SeqCst) {
            return Err(StoreError::Backend("a read failed".into()));
        }
        self.inner.get_raw(kind, name).await
    }
    async fn list_raw(&self, kind: Kind) -> StoreResult<Vec<Raw>> {
        self.lists.fetch_add(1, Ordering::SeqCst);
        if self.fail_next_list.swap(false, Ordering::SeqCst) {
            return Err(StoreError::Backend("a read failed".into()));
        }
        self.inner.list_raw(kind).await
    }
    async fn create_raw(&self, kind: Kind, name: &str, value: &Value) -> StoreResult<u64> {
        self.inner.create_raw(kind, name, value).await
    }
    async fn update_raw(&self, kind: Kind, name: &str, value: &Value, rv: u64) -> StoreResult<u64> {
        self.inner.update_raw(kind, name, value, rv).await
    }
    async fn delete_raw(&self, kind: Kind, name: &str, expected: Option<u64>) -> StoreResult<()> {
        self.inner.delete_raw(kind, name, expected).await
    }
    fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.inner.subscribe()
    }
}

/// Node `id` in zone `z`, `ready` or not, serving replicas at `ID:9500`.
pub fn node(id: &str, ready: bool) -> Node {
    Node {
        id: id.into(),
        resource_version: 0,
        spec: NodeSpec {
            zone: "z".into(),
            tags: vec![],
            allow_scheduling: true,
            eviction_requested: false,
            disks: Default::default(),
        },
        status: NodeStatus {
            ready,
            replica_endpoint: format!("{id}:9500"),
            ..Default::default()
        },
    }
}
