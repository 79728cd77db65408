//! The Kubernetes store passes the store contract against a real API
//! server (the test bench's etcd and kube-apiserver), and what is its own:
//! a watch resumed from a forgotten resource version lists again, events
//! are Kubernetes Events, the CRD schema refuses a bad setting, and a
//! create cut off before its status write is never taken for a whole one.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ballast::model::{Event, Kind, Setting};
use ballast::store::{Store, StoreError, contract};
use ballast_controller::kubernetes::{self, KubeStore};
use ballast_k8s_harness::ControlPlane;

const NAMESPACE: &str = "ballast-test";

/// A control plane with the CRDs and the namespace, and a store on it.
/// The typed view of the store.
fn db(store: &Arc<KubeStore>) -> &dyn Store {
    store.as_ref()
}

async fn store() -> (ControlPlane, Arc<KubeStore>) {
    let cp = ControlPlane::start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let client = cp.client().await.unwrap();
    kubernetes::install_crds(&client).await.unwrap();
    kubernetes::ensure_namespace(&client, NAMESPACE)
        .await
        .unwrap();
    let store = KubeStore::connect(client, NAMESPACE, "test").await.unwrap();
    (cp, Arc::new(store))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contract_crud() {
    let (_cp, store) = store().await;
    contract::crud(store.as_ref()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contract_conflicts() {
    let (_cp, store) = store().await;
    contract::conflicts(store.as_ref()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contract_concurrent_writers() {
    let (_cp, store) = store().await;
    contract::concurrent_writers(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contract_subscriptions() {
    let (_cp, store) = store().await;
    contract::subscriptions(store.as_ref()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contract_announced_before_seen() {
    let (_cp, store) = store().await;
    contract::announced_before_seen(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contract_persists_across_reconnect() {
    let (cp, first) = store().await;
    drop(first);
    let client = cp.client().await.unwrap();
    // Each open connects a new store to the same namespace, as a restarted
    // controller does.
    contract::persists(async || {
        let store = KubeStore::connect(client.clone(), NAMESPACE, "test")
            .await
            .unwrap();
        Box::new(store) as Box<dyn Store>
    })
    .await;
}

/// Entry point of the child process of the crash test: only does work
/// when the parent set the environment variable.
#[test]
fn crash_child_entry() {
    let Ok(kubeconfig) = std::env::var("BALLAST_CRASH_CHILD_KUBECONFIG") else {
        return;
    };
    let ready = std::env::var("BALLAST_CRASH_CHILD_READY").unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let client = kubernetes::client(Some(std::path::Path::new(&kubeconfig)))
            .await
            .unwrap();
        let store = KubeStore::connect(client, NAMESPACE, "crash")
            .await
            .unwrap();
        contract::crash_writer_loop(&store, std::path::Path::new(&ready)).await
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contract_sigkill_mid_write_leaves_no_torn_object() {
    let (cp, _store) = store().await;
    let kubeconfig = cp.kubeconfig.clone();
    for round in 0..3u64 {
        let ready = cp.dir().join(format!("ready-{round}"));
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "crash_child_entry", "--nocapture"])
            .env("BALLAST_CRASH_CHILD_KUBECONFIG", &kubeconfig)
            .env("BALLAST_CRASH_CHILD_READY", &ready)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !ready.exists() {
            assert!(Instant::now() < deadline, "child never became ready");
            assert!(child.try_wait().unwrap().is_none(), "child exited early");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(50 + 70 * round)).await;
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();

        let client = cp.client().await.unwrap();
        let store = KubeStore::connect(client, NAMESPACE, "check")
            .await
            .unwrap();
        let n = contract::verify_no_torn_objects(&store).await;
        assert!(n > 0, "the child wrote records before it died");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_watch_resumed_from_a_forgotten_version_lists_again_and_misses_nothing() {
    let (_cp, store) = store().await;
    let mut changes = store.subscribe();
    // A watch from revision 1: long before the CRDs existed, a version the
    // API server no longer serves (410 Gone).
    store.follow_from(Kind::Setting, 1);
    let deadline = Instant::now() + Duration::from_secs(30);
    while store.relists(Kind::Setting) == 0 {
        assert!(
            Instant::now() < deadline,
            "the API server's 410 did not make the store list again"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Writes after the relist are seen and announced.
    let s = Setting {
        name: "replica-auto-balance".into(),
        resource_version: 0,
        value: "best-effort".into(),
        status: Default::default(),
    };
    let created = db(&store).create(&s).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let c = tokio::time::timeout_at(deadline, changes.recv())
            .await
            .expect("the created setting was announced")
            .unwrap();
        if c.kind == Kind::Setting && c.name == s.name {
            assert_eq!(c.revision, created.resource_version);
            break;
        }
    }
    let listed: Vec<Setting> = db(&store).list().await.unwrap();
    assert_eq!(listed, vec![created]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events_are_kubernetes_events_about_their_object() {
    let (cp, store) = store().await;
    let volume = ballast::model::Volume {
        name: "vol-1".into(),
        resource_version: 0,
        spec: ballast::model::VolumeSpec::new(1 << 30, 2),
        status: Default::default(),
    };
    let volume = db(&store).create(&volume).await.unwrap();
    let event = Event {
        name: "00000000000000000001-000001".into(),
        resource_version: 0,
        object: "volume/vol-1".into(),
        reason: "ReplicaFailed".into(),
        message: "vol-1-r1 on node-2 failed".into(),
        time: chrono::Utc::now(),
    };
    db(&store).create(&event).await.unwrap();
    let listed: Vec<Event> = db(&store).list().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (&listed[0].object, &listed[0].reason, &listed[0].message),
        (&event.object, &event.reason, &event.message)
    );

    // As the cluster sees it: an events.k8s.io Event about the volume.
    let api: kube::Api<k8s_openapi::api::events::v1::Event> =
        kube::Api::namespaced(cp.client().await.unwrap(), NAMESPACE);
    let k = api.get(&event.name).await.unwrap();
    let regarding = k.regarding.unwrap();
    assert_eq!(regarding.kind.as_deref(), Some("Volume"));
    assert_eq!(regarding.name.as_deref(), Some("vol-1"));
    assert_eq!(
        regarding.api_version.as_deref(),
        Some("ballast.csi.dev/v1alpha1")
    );
    assert!(regarding.uid.is_some(), "the event names the volume's uid");
    assert_eq!(k.type_.as_deref(), Some("Warning"));
    assert_eq!(
        k.reporting_controller.as_deref(),
        Some("ballast.csi.dev/controller")
    );
    assert!(volume.resource_version > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_crd_schema_refuses_a_bad_setting_naming_the_accepted_values() {
    let (_cp, store) = store().await;
    let bad = Setting {
        name: "replica-auto-balance".into(),
        resource_version: 0,
        value: "sometimes".into(),
        status: Default::default(),
    };
    let err = db(&store).create(&bad).await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, StoreError::Invalid { .. }), "{err:?}");
    assert!(
        text.contains("disabled, least-effort, best-effort"),
        "the refusal names the accepted values: {text}"
    );
    let unknown = Setting {
        name: "no-such-setting".into(),
        resource_version: 0,
        value: "1".into(),
        status: Default::default(),
    };
    let text = db(&store).create(&unknown).await.unwrap_err().to_string();
    assert!(text.contains("unknown setting"), "{text}");
    let range = Setting {
        name: "default-replica-count".into(),
        resource_version: 0,
        value: "0".into(),
        status: Default::default(),
    };
    let text = db(&store).create(&range).await.unwrap_err().to_string();
    assert!(text.contains("an integer from 1 to 20"), "{text}");
    let good = Setting {
        value: "3".into(),
        ..range
    };
    db(&store).create(&good).await.unwrap();
    assert_eq!(db(&store).list::<Setting>().await.unwrap().len(), 1);
}

/// A record and its status are two requests to the API server. A
/// controller killed between them leaves an object with a spec only: a
/// volume reads back as still being created (so CreateVolume's retry makes
/// it again), never as a whole, empty, detached one; a replica reads back
/// with no mode (the controller's interrupted-rebuild rule takes it up).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_create_cut_off_before_its_status_reads_back_as_unfinished() {
    use ballast::model::{
        Replica, ReplicaResource, ReplicaSpec, Volume, VolumeResource, VolumeSpec, VolumeState,
    };
    let (cp, store) = store().await;
    let client = cp.client().await.unwrap();
    let volumes: kube::Api<VolumeResource> = kube::Api::namespaced(client.clone(), NAMESPACE);
    let spec = VolumeSpec::new(1 << 30, 2);
    volumes
        .create(
            &Default::default(),
            &VolumeResource::new("cut-off", spec.clone()),
        )
        .await
        .unwrap();
    let v: Volume = seen(&store, "cut-off").await;
    assert_eq!(v.spec, spec);
    assert_eq!(v.status.state, VolumeState::Creating);
    assert!(v.status.current_replicas.is_empty());

    let replicas: kube::Api<ReplicaResource> = kube::Api::namespaced(client, NAMESPACE);
    let spec = ReplicaSpec {
        volume: "cut-off".into(),
        node_id: "node-1".into(),
        disk_id: "disk-1".into(),
        data_directory: "replicas/cut-off-r1".into(),
        desired_state: ballast::model::DesiredState::Running,
        eviction_requested: false,
        rebuild_retry_count: 0,
        failed_at: None,
        healthy_at: None,
    };
    replicas
        .create(
            &Default::default(),
            &ReplicaResource::new("cut-off-r1", spec),
        )
        .await
        .unwrap();
    let r: Replica = seen(&store, "cut-off-r1").await;
    assert_eq!(r.status.mode, None);

    // What the store itself creates keeps its status, as always.
    let whole = Volume {
        name: "whole".into(),
        resource_version: 0,
        spec: VolumeSpec::new(1 << 30, 2),
        status: Default::default(),
    };
    db(&store).create(&whole).await.unwrap();
    let v: Volume = db(&store).fetch("whole").await.unwrap();
    assert_eq!(v.status.state, VolumeState::Detached);
}

/// Record `name` once the store's watch has seen it (written by someone
/// else, it is there a moment later).
async fn seen<T: ballast::model::Object>(store: &Arc<KubeStore>, name: &str) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match db(store).fetch::<T>(name).await {
            Ok(r) => return r,
            Err(StoreError::NotFound { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("{name}: {e}"),
        }
    }
}
