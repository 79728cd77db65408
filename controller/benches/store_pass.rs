//! A planning pass as the controller runs it — read the cluster from the
//! store, build the view, plan — over 1,000 volumes of 3 replicas on 100
//! nodes, on the Kubernetes store (watch caches over the test bench's real
//! API server) against the embedded redb store, both filled alike in the
//! same run. Prints the median pass on each and their ratio; then the
//! pass as the control loop runs it, on its copy of the records
//! (`mirror`), after one record changed: the copy re-reads that record,
//! builds the view and plans.
//!
//! Run: `KUBEBUILDER_ASSETS=$PWD/target/k8s-tools cargo bench -p
//! ballast-controller --bench store_pass` (the bench is built by
//! `tools/k8s/build`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ballast::model::{Node, ReplicaMode, Volume, VolumeSpec, VolumeState};
use ballast::store::{RedbStore, Store, StoreError};
use ballast_controller::executor::effects;
use ballast_controller::kubernetes::{self, KubeStore};
use ballast_controller::mirror::Mirror;
use ballast_controller::{observe, planner};
use ballast_k8s_harness::ControlPlane;
use chrono::Utc;
use tokio::task::JoinSet;

mod common;

use common::GIB;

const VOLUMES: usize = 1_000;
const NODES: usize = 100;
const ZONES: usize = 3;
const PASSES: usize = 15;

fn nodes() -> Vec<Node> {
    (0..NODES)
        .map(|n| {
            common::node(
                format!("node-{n:03}"),
                format!("zone-{}", n % ZONES),
                Some(Utc::now()),
            )
        })
        .collect()
}

fn volumes() -> Vec<Volume> {
    (0..VOLUMES)
        .map(|v| {
            let mut vol = Volume {
                name: format!("vol-{v:04}"),
                resource_version: 0,
                spec: VolumeSpec::new(10 * GIB, 3),
                status: Default::default(),
            };
            vol.status.state = VolumeState::Detached;
            vol.status.current_replicas = (0..3).map(|k| format!("vol-{v:04}-r{k}")).collect();
            vol
        })
        .collect()
}

/// Three replicas per volume on three consecutive nodes: one per zone.
fn replicas() -> Vec<ballast::model::Replica> {
    let now = Utc::now();
    (0..VOLUMES)
        .flat_map(|v| {
            let group = v % (NODES / ZONES);
            (0..3).map(move |k| {
                let mut r = effects::new_replica(
                    &format!("vol-{v:04}-r{k}"),
                    &format!("vol-{v:04}"),
                    &format!("node-{:03}", group * ZONES + k),
                    &format!("d{}", v % 2),
                    Some(ReplicaMode::Rw),
                );
                r.spec.healthy_at = Some(now);
                r
            })
        })
        .collect()
}

/// Creates every record, 16 at a time.
async fn fill(store: Arc<dyn Store>) {
    type Create = std::pin::Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send>>;
    let create: Vec<Create> = {
        let s = &store;
        let nodes = nodes().into_iter().map(|n| {
            let s = s.clone();
            Box::pin(async move { s.create(&n).await.map(|_| ()) }) as Create
        });
        let volumes = volumes().into_iter().map(|v| {
            let s = s.clone();
            Box::pin(async move { s.create(&v).await.map(|_| ()) }) as Create
        });
        let replicas = replicas().into_iter().map(|r| {
            let s = s.clone();
            Box::pin(async move { s.create(&r).await.map(|_| ()) }) as Create
        });
        nodes.chain(volumes).chain(replicas).collect()
    };
    let mut tasks = JoinSet::new();
    for c in create {
        tasks.spawn(c);
        while tasks.len() >= 16 {
            done(tasks.join_next().await);
        }
    }
    while let Some(r) = tasks.join_next().await {
        done(Some(r));
    }
}

fn done(r: Option<Result<Result<(), StoreError>, tokio::task::JoinError>>) {
    match r {
        Some(Ok(Ok(()))) | None => {}
        Some(other) => panic!("filling the store failed: {other:?}"),
    }
}

/// The median of `PASSES` passes: read, view, plan.
async fn pass(store: &dyn Store) -> Duration {
    let settings = common::settings();
    let mut times = Vec::new();
    for _ in 0..PASSES {
        let start = Instant::now();
        let view = observe::cluster_view(store).await.expect("read the store");
        let plan = planner::plan(&view, &settings, Utc::now());
        times.push(start.elapsed());
        assert_eq!(view.volumes.len(), VOLUMES);
        assert_eq!(view.replicas.len(), 3 * VOLUMES);
        if let Some(a) = plan.changes().next() {
            panic!("a healthy cluster needs nothing, but: {a:?}");
        }
    }
    times.sort();
    times[times.len() / 2]
}

/// The median of `PASSES` passes on the control loop's copy, each after
/// one replica changed: refresh (one record read again), view, plan.
async fn mirror_pass(store: &dyn Store) -> Duration {
    let settings = common::settings();
    let mut mirror = Mirror::new(store);
    mirror.refresh(store).await.expect("read the store");
    let mut times = Vec::new();
    for i in 0..PASSES {
        let name = format!("vol-{:04}-r0", i % VOLUMES);
        store
            .modify::<ballast::model::Replica, StoreError>(&name, |r| {
                r.status.running = !r.status.running;
                Ok(true)
            })
            .await
            .expect("change a replica");
        let start = Instant::now();
        mirror.refresh(store).await.expect("refresh the copy");
        let view = observe::mirrored_view(&mirror);
        let plan = planner::plan(&view, &settings, Utc::now());
        times.push(start.elapsed());
        assert_eq!(view.replicas.len(), 3 * VOLUMES);
        let seen = view.replicas.iter().find(|r| r.name == name);
        let stored: ballast::model::Replica = store.fetch(&name).await.expect("read it back");
        assert_eq!(
            seen.map(|r| r.running),
            Some(stored.status.running),
            "the copy missed the change"
        );
        if let Some(a) = plan.changes().next() {
            panic!("a healthy cluster needs nothing, but: {a:?}");
        }
    }
    times.sort();
    times[times.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let cp = ControlPlane::start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let client = cp.client().await.unwrap_or_else(|e| panic!("{e}"));
    kubernetes::install_crds(&client)
        .await
        .expect("install the CRDs");
    kubernetes::ensure_namespace(&client, "ballast")
        .await
        .expect("the namespace");
    let kube: Arc<dyn Store> = Arc::new(
        KubeStore::connect(client, "ballast", "bench")
            .await
            .expect("connect to the API server"),
    );
    let redb: Arc<dyn Store> =
        Arc::new(RedbStore::open(dir.path().join("store.redb")).expect("open redb"));

    let start = Instant::now();
    fill(redb.clone()).await;
    println!("filled redb: {:.1} s", start.elapsed().as_secs_f64());
    let start = Instant::now();
    fill(kube.clone()).await;
    println!(
        "filled the Kubernetes store: {:.1} s",
        start.elapsed().as_secs_f64()
    );

    let on_redb = pass(redb.as_ref()).await;
    let on_kube = pass(kube.as_ref()).await;
    println!(
        "planning pass (read, view, plan), {VOLUMES} volumes x 3 replicas on {NODES} nodes, median of {PASSES}:"
    );
    println!("  embedded redb:     {:>8.2} ms", ms(on_redb));
    println!("  Kubernetes store:  {:>8.2} ms", ms(on_kube));
    println!(
        "Kubernetes store vs redb, planning pass: {:.2}x",
        on_kube.as_secs_f64() / on_redb.as_secs_f64()
    );
    let copy_redb = mirror_pass(redb.as_ref()).await;
    let copy_kube = mirror_pass(kube.as_ref()).await;
    println!(
        "the control loop's pass on its copy after one change (refresh, view, plan), median of {PASSES}:"
    );
    println!(
        "  embedded redb:     {:>8.2} ms ({:.3}x of reading the store)",
        ms(copy_redb),
        copy_redb.as_secs_f64() / on_redb.as_secs_f64()
    );
    println!(
        "  Kubernetes store:  {:>8.2} ms ({:.3}x of reading the store)",
        ms(copy_kube),
        copy_kube.as_secs_f64() / on_kube.as_secs_f64()
    );
}
