//! The controller's copy of the records it plans on: every node, volume
//! and replica, decoded once and then kept current from the store's change
//! stream, so that a pass of the control loop (or a heartbeat's check of
//! its node's engines, a scrape of the metrics, a look at the web view,
//! a merge or scrub pass) re-reads only what changed since the last
//! reader instead of decoding the whole store (at 100k volumes, 1.5 s each
//! time). It also keeps the volumes attached at each node. One lives in
//! the context; whoever reads it refreshes it first.
//!
//! It only reads the store. A change it may have missed (the stream lagged
//! behind, or it is the first refresh) is answered by reading everything
//! again, and so is every `FULL_READ`, so that nothing it could have
//! missed outlives that.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use ballast::model::{Kind, Node, Object, Replica, Volume};
use ballast::store::{Change, Store};
use tokio::sync::broadcast::{self, error::TryRecvError};

use crate::error::Error;

/// How often the copy is read again whole, changes or not.
const FULL_READ: Duration = Duration::from_secs(300);

/// Records of one kind, by name (the store's order).
struct Table<T>(BTreeMap<String, T>);

impl<T: Object> Table<T> {
    async fn read(store: &dyn Store) -> Result<Self, Error> {
        let all: Vec<T> = store.list().await?;
        Ok(Table(
            all.into_iter().map(|o| (o.name().to_string(), o)).collect(),
        ))
    }

    /// Takes `name` as the store has it now (gone: gone here too).
    async fn reread(&mut self, store: &dyn Store, name: &str) -> Result<(), Error> {
        match store.get::<T>(name).await? {
            Some(o) => {
                self.0.insert(name.to_string(), o);
            }
            None => {
                self.0.remove(name);
            }
        }
        Ok(())
    }
}

/// What the controller plans on; see the module's header.
pub struct Mirror {
    changes: broadcast::Receiver<Change>,
    tables: Option<Tables>,
}

struct Tables {
    nodes: Table<Node>,
    volumes: Table<Volume>,
    replicas: Table<Replica>,
    /// The names of the volumes attached at each node: a node's heartbeat
    /// checks its own volumes' engines without walking every volume.
    attached: BTreeMap<String, BTreeSet<String>>,
    read_at: Instant,
}

impl Tables {
    fn new(nodes: Table<Node>, volumes: Table<Volume>, replicas: Table<Replica>) -> Tables {
        let mut t = Tables {
            nodes,
            volumes,
            replicas,
            attached: BTreeMap::new(),
            read_at: Instant::now(),
        };
        let names: Vec<String> = t.volumes.0.keys().cloned().collect();
        for name in names {
            t.index(&name, true);
        }
        t
    }

    /// Enters (`on`) or takes out volume `name` where its record says it
    /// is attached.
    fn index(&mut self, name: &str, on: bool) {
        let Some(node) = self
            .volumes
            .0
            .get(name)
            .and_then(|v| v.status.attached_node.clone())
        else {
            return;
        };
        if on {
            self.attached
                .entry(node)
                .or_default()
                .insert(name.to_string());
        } else if let Some(set) = self.attached.get_mut(&node) {
            set.remove(name);
            if set.is_empty() {
                self.attached.remove(&node);
            }
        }
    }
}

impl Mirror {
    /// Follows `store` from now on; the first `refresh` reads it whole.
    pub fn new(store: &dyn Store) -> Mirror {
        Mirror {
            changes: store.subscribe(),
            tables: None,
        }
    }

    /// Brings the copy up to date with the store: the records named by the
    /// changes since the last refresh are read again, or all of them when a
    /// change may have been missed or the last whole read is `FULL_READ`
    /// old.
    pub async fn refresh(&mut self, store: &dyn Store) -> Result<(), Error> {
        let mut dirty: BTreeSet<(Kind, String)> = BTreeSet::new();
        let mut missed = false;
        loop {
            match self.changes.try_recv() {
                Ok(c) if matches!(c.kind, Kind::Node | Kind::Volume | Kind::Replica) => {
                    dirty.insert((c.kind, c.name));
                }
                Ok(_) => {}
                Err(TryRecvError::Empty) => break,
                // Changes were dropped before they were read: which ones is
                // unknown. (Closed: no more will come; read whole to be sure.)
                Err(TryRecvError::Lagged(_) | TryRecvError::Closed) => {
                    missed = true;
                    break;
                }
            }
        }
        let whole = missed
            || self
                .tables
                .as_ref()
                .is_none_or(|t| t.read_at.elapsed() >= FULL_READ);
        if whole {
            // Changes from here on are in the stream: the whole read below
            // sees everything before them. Until it succeeds there is no
            // copy, so that a read that fails is made again next time.
            while self.changes.try_recv().is_ok() {}
            self.tables = None;
            self.tables = Some(Tables::new(
                Table::read(store).await?,
                Table::read(store).await?,
                Table::read(store).await?,
            ));
            return Ok(());
        }
        let Some(tables) = self.tables.as_mut() else {
            return Ok(());
        };
        for (kind, name) in dirty {
            let read = match kind {
                Kind::Node => tables.nodes.reread(store, &name).await,
                Kind::Volume => {
                    tables.index(&name, false);
                    let read = tables.volumes.reread(store, &name).await;
                    tables.index(&name, true);
                    read
                }
                _ => tables.replicas.reread(store, &name).await,
            };
            if let Err(e) = read {
                // The changes read from the stream are gone with this
                // refresh: the next one reads everything.
                self.tables = None;
                return Err(e);
            }
        }
        Ok(())
    }

    /// The nodes as of the last refresh, by id.
    pub fn nodes(&self) -> impl Iterator<Item = &Node> + Clone {
        self.tables.iter().flat_map(|t| t.nodes.0.values())
    }

    /// The volumes as of the last refresh, by name.
    pub fn volumes(&self) -> impl Iterator<Item = &Volume> + Clone {
        self.tables.iter().flat_map(|t| t.volumes.0.values())
    }

    /// Volume `name` as of the last refresh.
    pub fn volume(&self, name: &str) -> Option<&Volume> {
        self.tables.as_ref()?.volumes.0.get(name)
    }

    /// The volumes whose records say they are attached at `node`, by name.
    pub fn attached_at(&self, node: &str) -> impl Iterator<Item = &Volume> + '_ {
        let t = self.tables.as_ref();
        let names = t.and_then(|t| t.attached.get(node)).into_iter().flatten();
        names.filter_map(move |name| t.and_then(|t| t.volumes.0.get(name)))
    }

    /// The replicas as of the last refresh, by name.
    pub fn replicas(&self) -> impl Iterator<Item = &Replica> + Clone {
        self.tables.iter().flat_map(|t| t.replicas.0.values())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    use ballast::model::{Node, ReplicaMode, Volume, VolumeSpec};
    use ballast::store::{MemoryStore, Store};
    use proptest::prelude::*;

    use super::*;
    use crate::executor::effects;
    use crate::test_store::{Counting, node};

    fn volume(name: &str) -> Volume {
        Volume {
            name: name.into(),
            resource_version: 0,
            spec: VolumeSpec::new(1 << 30, 2),
            status: Default::default(),
        }
    }

    fn replica(name: &str, volume: &str) -> Replica {
        effects::new_replica(name, volume, "n1", "d1", Some(ReplicaMode::Rw))
    }

    /// The copy holds exactly what the store does, record for record.
    async fn assert_same(m: &Mirror, store: &dyn Store) {
        let t = m.tables.as_ref().expect("refreshed");
        let nodes: Vec<Node> = store.list().await.unwrap();
        let volumes: Vec<Volume> = store.list().await.unwrap();
        let replicas: Vec<Replica> = store.list().await.unwrap();
        assert_eq!(t.nodes.0.values().cloned().collect::<Vec<_>>(), nodes);
        assert_eq!(t.volumes.0.values().cloned().collect::<Vec<_>>(), volumes);
        assert_eq!(m.replicas().cloned().collect::<Vec<_>>(), replicas);
        for n in ["n0", "n1", "n2", "n3"] {
            let at: Vec<&Volume> = volumes
                .iter()
                .filter(|v| v.status.attached_node.as_deref() == Some(n))
                .collect();
            assert_eq!(m.attached_at(n).collect::<Vec<_>>(), at, "attached at {n}");
        }
        let indexed: usize = t.attached.values().map(BTreeSet::len).sum();
        let attached = volumes.iter().filter(|v| v.status.attached_node.is_some());
        assert_eq!(
            indexed,
            attached.count(),
            "a volume indexed twice or left behind"
        );
        assert_eq!(
            crate::observe::mirrored_view(m),
            crate::observe::cluster_view(store).await.unwrap()
        );
    }

    /// Whole reads and single reads `refresh` made.
    async fn refresh_counted(m: &mut Mirror, counting: &Counting) -> (usize, usize) {
        let (lists, gets) = (
            counting.lists.load(Ordering::SeqCst),
            counting.gets.load(Ordering::SeqCst),
        );
        m.refresh(counting).await.unwrap();
        (
            counting.lists.load(Ordering::SeqCst) - lists,
            counting.gets.load(Ordering::SeqCst) - gets,
        )
    }

    #[tokio::test]
    async fn a_refresh_reads_only_the_records_that_changed() {
        let counting = Arc::new(Counting::default());
        let store: Arc<dyn Store> = counting.clone();
        store.create(&node("n1", true)).await.unwrap();
        for v in ["a", "b", "c"] {
            store.create(&volume(v)).await.unwrap();
            store.create(&replica(&format!("{v}-r1"), v)).await.unwrap();
        }
        let mut m = Mirror::new(store.as_ref());
        assert_eq!(
            refresh_counted(&mut m, &counting).await,
            (3, 0),
            "the first reads all"
        );
        assert_same(&m, store.as_ref()).await;

        // One replica changes, one volume goes, one comes: three reads.
        store
            .modify::<Replica, Error>("a-r1", |r| {
                r.status.mode = Some(ReplicaMode::Err);
                Ok(true)
            })
            .await
            .unwrap();
        store.delete::<Volume>("b", None).await.unwrap();
        store.create(&volume("d")).await.unwrap();
        // Settings (and events) are not planned on from here: no read.
        store
            .create(&ballast::model::Setting {
                name: "replica-auto-balance".into(),
                resource_version: 0,
                value: "best-effort".into(),
                status: Default::default(),
            })
            .await
            .unwrap();
        assert_eq!(refresh_counted(&mut m, &counting).await, (0, 3));
        assert_same(&m, store.as_ref()).await;

        // Nothing changed: nothing read.
        assert_eq!(refresh_counted(&mut m, &counting).await, (0, 0));
    }

    #[tokio::test]
    async fn a_refresh_that_failed_is_followed_by_a_whole_read() {
        let counting = Arc::new(Counting::default());
        let store: Arc<dyn Store> = counting.clone();
        store.create(&volume("v")).await.unwrap();
        let mut m = Mirror::new(store.as_ref());
        m.refresh(store.as_ref()).await.unwrap();
        store.create(&replica("v-r1", "v")).await.unwrap();
        store.create(&replica("v-r2", "v")).await.unwrap();
        counting.fail_next_get.store(true, Ordering::SeqCst);
        assert!(m.refresh(store.as_ref()).await.is_err());
        // The changes it had taken from the stream are not lost.
        assert_eq!(refresh_counted(&mut m, &counting).await, (3, 0));
        assert_same(&m, store.as_ref()).await;

        // A whole read (the stream dropped changes) that fails is made
        // again by the next refresh.
        for i in 0..1_500 {
            store
                .create(&replica(&format!("v-x{i:04}"), "v"))
                .await
                .unwrap();
        }
        counting.fail_next_list.store(true, Ordering::SeqCst);
        assert!(m.refresh(store.as_ref()).await.is_err());
        assert_eq!(refresh_counted(&mut m, &counting).await, (3, 0));
        assert_same(&m, store.as_ref()).await;
    }

    #[tokio::test]
    async fn a_copy_that_fell_behind_the_change_stream_reads_the_store_whole() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
        store.create(&volume("v")).await.unwrap();
        let mut m = Mirror::new(store.as_ref());
        m.refresh(store.as_ref()).await.unwrap();
        // More changes than the stream holds (1,024): some are dropped.
        for i in 0..1_500 {
            store
                .create(&replica(&format!("v-r{i:04}"), "v"))
                .await
                .unwrap();
        }
        store.delete::<Volume>("v", None).await.unwrap();
        m.refresh(store.as_ref()).await.unwrap();
        assert_same(&m, store.as_ref()).await;
        assert_eq!(m.replicas().count(), 1_500);
    }

    /// One change to the store, on a small set of names so that they meet.
    #[derive(Clone, Debug)]
    enum Op {
        Volume(u8, bool),
        Replica(u8, u8, bool),
        Mode(u8, bool),
        Ready(u8, bool),
        /// Volume `v` attached at node `n`, or detached (None).
        Attach(u8, Option<u8>),
        Refresh,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..4u8, any::<bool>()).prop_map(|(v, keep)| Op::Volume(v, keep)),
            (0..4u8, 0..3u8, any::<bool>()).prop_map(|(v, r, keep)| Op::Replica(v, r, keep)),
            (0..4u8, any::<bool>()).prop_map(|(v, rw)| Op::Mode(v, rw)),
            (0..3u8, any::<bool>()).prop_map(|(n, ready)| Op::Ready(n, ready)),
            (0..4u8, proptest::option::of(0..3u8)).prop_map(|(v, n)| Op::Attach(v, n)),
            Just(Op::Refresh),
        ]
    }

    /// Makes `obj` exist (or not) in the store, whatever it was.
    async fn put<T: ballast::model::Object>(store: &dyn Store, obj: T, keep: bool) {
        let name = obj.name().to_string();
        match (store.get::<T>(&name).await.unwrap(), keep) {
            (None, true) => {
                store.create(&obj).await.unwrap();
            }
            (Some(_), false) => store.delete::<T>(&name, None).await.unwrap(),
            _ => {}
        }
    }

    async fn apply(store: &dyn Store, m: &mut Mirror, op: &Op) {
        match op {
            Op::Volume(v, keep) => put(store, volume(&format!("v{v}")), *keep).await,
            Op::Replica(v, r, keep) => {
                put(
                    store,
                    replica(&format!("v{v}-r{r}"), &format!("v{v}")),
                    *keep,
                )
                .await
            }
            Op::Mode(v, rw) => {
                let name = format!("v{v}-r0");
                if store.get::<Replica>(&name).await.unwrap().is_some() {
                    let mode = if *rw {
                        ReplicaMode::Rw
                    } else {
                        ReplicaMode::Err
                    };
                    store
                        .modify::<Replica, Error>(&name, |r| {
                            r.status.mode = Some(mode);
                            Ok(true)
                        })
                        .await
                        .unwrap();
                }
            }
            Op::Ready(n, ready) => {
                let id = format!("n{n}");
                put(store, node(&id, true), true).await;
                store
                    .modify::<Node, Error>(&id, |n| {
                        n.status.ready = *ready;
                        Ok(true)
                    })
                    .await
                    .unwrap();
            }
            Op::Attach(v, n) => {
                let name = format!("v{v}");
                if store.get::<Volume>(&name).await.unwrap().is_some() {
                    store
                        .modify::<Volume, Error>(&name, |v| {
                            v.status.attached_node = n.map(|n| format!("n{n}"));
                            Ok(true)
                        })
                        .await
                        .unwrap();
                }
            }
            Op::Refresh => {
                m.refresh(store).await.unwrap();
                assert_same(m, store).await;
            }
        }
    }

    proptest! {
        // 64 cases in CI; PROPTEST_CASES=5000 explores further.
        #![proptest_config(ProptestConfig::with_cases(
            std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64)
        ))]

        /// Whatever changes come between them, a refreshed copy is the store.
        #[test]
        fn a_refreshed_copy_equals_the_store_after_any_changes(ops in proptest::collection::vec(op(), 1..40)) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            rt.block_on(async {
                let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
                let mut m = Mirror::new(store.as_ref());
                for op in &ops {
                    apply(store.as_ref(), &mut m, op).await;
                }
                apply(store.as_ref(), &mut m, &Op::Refresh).await;
            });
        }
    }
}
