//! The store contract: one suite every backend must pass.
//!
//! Each check takes a fresh store (the Kubernetes backend: a fresh
//! namespace). The crash check needs a separate process: a backend's test
//! calls [`crash_writer_loop`] in a child process (by re-running its own
//! test binary), kills it with SIGKILL, and calls [`verify_no_torn_objects`]
//! on the reopened store.

use std::sync::Arc;
use std::time::Duration;

use super::{ChangeOp, Store, StoreError};
use crate::model::{Kind, Setting, Volume, VolumeSpec};
use crate::settings::{
    DEFAULT_DATA_LOCALITY, DEFAULT_REPLICA_COUNT, OVER_PROVISIONING_PERCENTAGE, REBUILD_MAX_RETRY,
    REPLENISHMENT_WAIT_INTERVAL, SCRUB_INTERVAL, SCRUB_RATE,
};

// The checks write real settings with values they accept, since a backend
// may check them (the Kubernetes API server does, by the CRD's schema).
const A: &str = DEFAULT_REPLICA_COUNT;
const B: &str = REBUILD_MAX_RETRY;

fn setting(name: &str, value: &str) -> Setting {
    Setting {
        name: name.to_string(),
        resource_version: 0,
        value: value.to_string(),
        status: Default::default(),
    }
}

/// Create, read, list, update and delete, with the errors for missing and
/// duplicate objects.
pub async fn crud(store: &dyn Store) {
    assert!(store.get::<Setting>(A).await.unwrap().is_none());
    let a = store.create(&setting(A, "1")).await.unwrap();
    assert!(a.resource_version > 0);
    let b = store.create(&setting(B, "2")).await.unwrap();
    assert!(b.resource_version > a.resource_version, "versions increase");

    let got: Setting = store.fetch(A).await.unwrap();
    assert_eq!(got, a);
    let names: Vec<String> = store
        .list::<Setting>()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, [A, B], "list is ordered by name");
    assert!(
        store.list_raw(Kind::Volume).await.unwrap().is_empty(),
        "kinds are separate"
    );

    let mut a2 = got.clone();
    a2.value = "10".into();
    let a2 = store.update(&a2).await.unwrap();
    assert!(a2.resource_version > b.resource_version);
    assert_eq!(store.fetch::<Setting>(A).await.unwrap().value, "10");

    assert!(matches!(
        store.create(&setting(A, "2")).await,
        Err(StoreError::AlreadyExists { .. })
    ));
    store
        .delete::<Setting>(A, Some(a2.resource_version))
        .await
        .unwrap();
    assert!(store.get::<Setting>(A).await.unwrap().is_none());
    assert!(matches!(
        store.delete::<Setting>(A, None).await,
        Err(StoreError::NotFound { .. })
    ));
    assert!(matches!(
        store.update(&a2).await,
        Err(StoreError::NotFound { .. })
    ));
    assert!(matches!(
        store.fetch::<Setting>(SCRUB_RATE).await,
        Err(StoreError::NotFound { .. })
    ));
}

/// A write or delete with a stale version fails with Conflict and changes
/// nothing.
pub async fn conflicts(store: &dyn Store) {
    let first = store
        .create(&setting(DEFAULT_DATA_LOCALITY, "disabled"))
        .await
        .unwrap();
    let mut winner = first.clone();
    winner.value = "best-effort".into();
    store.update(&winner).await.unwrap();

    let mut loser = first.clone();
    loser.value = "strict-local".into();
    match store.update(&loser).await {
        Err(StoreError::Conflict {
            expected, actual, ..
        }) => {
            assert_eq!(expected, first.resource_version);
            assert!(actual > expected);
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert!(matches!(
        store
            .delete::<Setting>(DEFAULT_DATA_LOCALITY, Some(first.resource_version))
            .await,
        Err(StoreError::Conflict { .. })
    ));
    assert_eq!(
        store
            .fetch::<Setting>(DEFAULT_DATA_LOCALITY)
            .await
            .unwrap()
            .value,
        "best-effort"
    );
}

/// Many tasks, on as many threads as the runtime has, increment one
/// counter through `modify`; no increment is lost and every write got its
/// own version.
pub async fn concurrent_writers(store: Arc<dyn Store>) {
    const WRITERS: usize = 8;
    const EACH: usize = 25;
    store
        .create(&setting(REPLENISHMENT_WAIT_INTERVAL, "0"))
        .await
        .unwrap();
    let handles: Vec<_> = (0..WRITERS)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut versions = Vec::new();
                for _ in 0..EACH {
                    let s = store
                        .modify::<Setting, StoreError>(REPLENISHMENT_WAIT_INTERVAL, |s| {
                            let n: usize = s.value.parse().unwrap();
                            s.value = (n + 1).to_string();
                            Ok(true)
                        })
                        .await
                        .unwrap();
                    versions.push(s.resource_version);
                }
                versions
            })
        })
        .collect();
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.unwrap());
    }
    let final_value = store
        .fetch::<Setting>(REPLENISHMENT_WAIT_INTERVAL)
        .await
        .unwrap()
        .value;
    assert_eq!(final_value, (WRITERS * EACH).to_string(), "no lost update");
    let n = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), n, "every write has its own version");
}

/// Subscribers see every committed change, in order, and nothing for a
/// write that failed. A network backend announces changes as its watch
/// sees them, so they are awaited (at most 30 s).
pub async fn subscriptions(store: &dyn Store) {
    let mut rx = store.subscribe();
    let s = store.create(&setting(SCRUB_INTERVAL, "1")).await.unwrap();
    let mut s2 = s.clone();
    s2.value = "2".into();
    let s2 = store.update(&s2).await.unwrap();
    // A failed write announces nothing.
    assert!(store.update(&s).await.is_err());
    store.delete::<Setting>(SCRUB_INTERVAL, None).await.unwrap();

    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while seen.len() < 3 {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Ok(c)) => seen.push(c),
            Ok(Err(e)) => panic!("the subscription broke: {e}"),
            Err(_) => panic!("only these changes were announced in 30 s: {seen:?}"),
        }
    }
    // Nothing more: the failed write announced nothing.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(rx.try_recv().is_err(), "a change too many was announced");
    let ops: Vec<ChangeOp> = seen.iter().map(|c| c.op).collect();
    assert_eq!(
        ops,
        [ChangeOp::Created, ChangeOp::Updated, ChangeOp::Deleted]
    );
    assert!(
        seen.iter()
            .all(|c| c.kind == Kind::Setting && c.name == SCRUB_INTERVAL)
    );
    assert_eq!(seen[0].revision, s.resource_version);
    assert_eq!(seen[1].revision, s2.resource_version);
    assert!(seen[2].revision > seen[1].revision);
}

/// A change a read sees is in the stream already, so that a reader of
/// the stream (the controller's copy of the records) is never behind what
/// was read from the store before. One task writes a setting over and
/// over; another reads it and, each time, finds that version announced.
pub async fn announced_before_seen(store: Arc<dyn Store>) {
    let mut rx = store.subscribe();
    let first = store.create(&setting(A, "1")).await.unwrap();
    let writer = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut s = first;
            for i in 1..=300 {
                // Each a change, and each a valid replica count (the
                // Kubernetes store's schema checks it).
                s.value = (i % 20 + 1).to_string();
                s = store.update(&s).await.unwrap();
            }
        })
    };
    let mut announced = 0;
    while !writer.is_finished() {
        let seen = store.fetch::<Setting>(A).await.unwrap().resource_version;
        while let Ok(c) = rx.try_recv() {
            announced = announced.max(c.revision);
        }
        assert!(
            announced >= seen,
            "version {seen} was read before it was announced (announced up to {announced})"
        );
        tokio::task::yield_now().await;
    }
    writer.await.unwrap();
}

/// What survives a reopen of the same location.
pub async fn persists(open: impl AsyncFn() -> Box<dyn Store>) {
    let v = {
        let store = open().await;
        store
            .create(&setting(OVER_PROVISIONING_PERCENTAGE, "150"))
            .await
            .unwrap()
    };
    let store = open().await;
    let got: Setting = store.fetch(OVER_PROVISIONING_PERCENTAGE).await.unwrap();
    assert_eq!(got, v);
    let next = store.create(&setting(B, "1")).await.unwrap();
    assert!(
        next.resource_version > v.resource_version,
        "revision survives reopen"
    );
}

/// The records the crash writer writes, as volumes: each carries a
/// self-checking text, so a torn write shows as a text whose sum does not
/// match.
fn crash_record(seq: u64) -> String {
    let pad = "x".repeat(((seq * 37) % 4000) as usize + 1);
    let sum = seq.wrapping_mul(31).wrapping_add(pad.len() as u64);
    format!("{seq}:{pad}:{sum}")
}

fn crash_volume(name: &str, seq: u64) -> Volume {
    let mut spec = VolumeSpec::new(1 << 30, 1);
    spec.mkfs_params = crash_record(seq);
    Volume {
        name: name.to_string(),
        resource_version: 0,
        spec,
        status: Default::default(),
    }
}

/// Writes self-checking records in a loop until killed. Signals readiness
/// by creating `ready_file` after the first commits.
pub async fn crash_writer_loop(store: &dyn Store, ready_file: &std::path::Path) -> ! {
    let mut seq = 0u64;
    loop {
        seq += 1;
        let name = format!("obj-{}", seq % 16);
        match store.get::<Volume>(&name).await {
            Ok(Some(mut v)) => {
                v.spec.mkfs_params = crash_record(seq);
                let _ = store.update(&v).await;
            }
            _ => {
                let _ = store.create(&crash_volume(&name, seq)).await;
            }
        }
        if seq == 32 {
            let _ = std::fs::write(ready_file, b"ready");
        }
        if seq.is_multiple_of(64) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// Every record the crash writer left is whole and self-consistent.
/// Returns how many records were checked.
pub async fn verify_no_torn_objects(store: &dyn Store) -> usize {
    let all = store
        .list::<Volume>()
        .await
        .expect("store lists after a crash");
    for v in &all {
        let text = &v.spec.mkfs_params;
        let seq: u64 = text
            .split(':')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("record {} is torn: {text:?}", v.name));
        assert_eq!(*text, crash_record(seq), "record {} is torn", v.name);
    }
    all.len()
}
