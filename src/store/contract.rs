//! The store contract: one suite every backend must pass.
//!
//! Each check takes a fresh store from a factory. The crash check needs a
//! separate process: a backend's test calls [`crash_writer_loop`] in a child
//! process (by re-running its own test binary), kills it with SIGKILL, and
//! calls [`verify_no_torn_objects`] on the reopened store.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::{ChangeOp, Store, StoreError, StoreExt};
use crate::model::{Kind, Setting};

fn setting(name: &str, value: &str) -> Setting {
    Setting {
        name: name.to_string(),
        resource_version: 0,
        value: value.to_string(),
    }
}

/// Create, read, list, update and delete, with the errors for missing and
/// duplicate objects.
pub fn crud<S: Store>(store: &S) {
    assert!(store.get::<Setting>("a").unwrap().is_none());
    let a = store.create(&setting("a", "1")).unwrap();
    assert!(a.resource_version > 0);
    let b = store.create(&setting("b", "2")).unwrap();
    assert!(b.resource_version > a.resource_version, "versions increase");

    let got: Setting = store.fetch("a").unwrap();
    assert_eq!(got, a);
    let names: Vec<String> = store
        .list::<Setting>()
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["a", "b"], "list is ordered by name");
    assert!(
        store.list_raw(Kind::Volume).unwrap().is_empty(),
        "kinds are separate"
    );

    let mut a2 = got.clone();
    a2.value = "10".into();
    let a2 = store.update(&a2).unwrap();
    assert!(a2.resource_version > b.resource_version);
    assert_eq!(store.fetch::<Setting>("a").unwrap().value, "10");

    assert!(matches!(
        store.create(&setting("a", "x")),
        Err(StoreError::AlreadyExists { .. })
    ));
    store
        .delete::<Setting>("a", Some(a2.resource_version))
        .unwrap();
    assert!(store.get::<Setting>("a").unwrap().is_none());
    assert!(matches!(
        store.delete::<Setting>("a", None),
        Err(StoreError::NotFound { .. })
    ));
    assert!(matches!(
        store.update(&a2),
        Err(StoreError::NotFound { .. })
    ));
    assert!(matches!(
        store.fetch::<Setting>("zz"),
        Err(StoreError::NotFound { .. })
    ));
}

/// A write or delete with a stale version fails with Conflict and changes
/// nothing.
pub fn conflicts<S: Store>(store: &S) {
    let first = store.create(&setting("c", "1")).unwrap();
    let mut winner = first.clone();
    winner.value = "winner".into();
    store.update(&winner).unwrap();

    let mut loser = first.clone();
    loser.value = "loser".into();
    match store.update(&loser) {
        Err(StoreError::Conflict {
            expected, actual, ..
        }) => {
            assert_eq!(expected, first.resource_version);
            assert!(actual > expected);
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert!(matches!(
        store.delete::<Setting>("c", Some(first.resource_version)),
        Err(StoreError::Conflict { .. })
    ));
    assert_eq!(store.fetch::<Setting>("c").unwrap().value, "winner");
}

/// Many threads increment one counter through `modify`; no increment is
/// lost and every write got its own version.
pub fn concurrent_writers<S: Store>(store: Arc<S>) {
    const THREADS: usize = 8;
    const EACH: usize = 25;
    store.create(&setting("counter", "0")).unwrap();
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut versions = Vec::new();
                for _ in 0..EACH {
                    let s = store
                        .modify::<Setting, StoreError>("counter", |s| {
                            let n: usize = s.value.parse().unwrap();
                            s.value = (n + 1).to_string();
                            Ok(true)
                        })
                        .unwrap();
                    versions.push(s.resource_version);
                }
                versions
            })
        })
        .collect();
    let mut all: Vec<u64> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let final_value = store.fetch::<Setting>("counter").unwrap().value;
    assert_eq!(final_value, (THREADS * EACH).to_string(), "no lost update");
    let n = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), n, "every write has its own version");
}

/// Subscribers see every committed change, in order, and nothing for a
/// write that failed.
pub fn subscriptions<S: Store>(store: &S) {
    let mut rx = store.subscribe();
    let s = store.create(&setting("w", "1")).unwrap();
    let mut s2 = s.clone();
    s2.value = "2".into();
    let s2 = store.update(&s2).unwrap();
    // A failed write announces nothing.
    assert!(store.update(&s).is_err());
    store.delete::<Setting>("w", None).unwrap();

    let mut seen = Vec::new();
    while let Ok(c) = rx.try_recv() {
        seen.push(c);
    }
    let ops: Vec<ChangeOp> = seen.iter().map(|c| c.op).collect();
    assert_eq!(
        ops,
        [ChangeOp::Created, ChangeOp::Updated, ChangeOp::Deleted]
    );
    assert!(
        seen.iter()
            .all(|c| c.kind == Kind::Setting && c.name == "w")
    );
    assert_eq!(seen[0].revision, s.resource_version);
    assert_eq!(seen[1].revision, s2.resource_version);
    assert!(seen[2].revision > seen[1].revision);
}

/// What survives a reopen of the same location.
pub fn persists<S: Store>(open: impl Fn() -> S) {
    let v = {
        let store = open();
        store.create(&setting("kept", "yes")).unwrap()
    };
    let store = open();
    let got: Setting = store.fetch("kept").unwrap();
    assert_eq!(got, v);
    let next = store.create(&setting("after", "1")).unwrap();
    assert!(
        next.resource_version > v.resource_version,
        "revision survives reopen"
    );
}

/// The records the crash writer writes: each is self-checking, so a torn
/// write shows as a record whose `sum` does not match.
fn crash_record(seq: u64) -> serde_json::Value {
    let pad = "x".repeat(((seq * 37) % 4000) as usize + 1);
    json!({ "seq": seq, "pad": pad, "sum": seq.wrapping_mul(31).wrapping_add(pad.len() as u64) })
}

/// Writes self-checking records in a loop until killed. Signals readiness
/// by creating `ready_file` after the first commits.
pub fn crash_writer_loop<S: Store>(store: &S, ready_file: &std::path::Path) -> ! {
    let mut seq = 0u64;
    loop {
        seq += 1;
        let name = format!("obj-{}", seq % 16);
        let value = crash_record(seq);
        match store.get_raw(Kind::Event, &name) {
            Ok(Some(raw)) => {
                let _ = store.update_raw(Kind::Event, &name, &value, raw.resource_version);
            }
            _ => {
                let _ = store.create_raw(Kind::Event, &name, &value);
            }
        }
        if seq == 32 {
            let _ = std::fs::write(ready_file, b"ready");
        }
        if seq.is_multiple_of(64) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Every record the crash writer left is whole and self-consistent.
/// Returns how many records were checked.
pub fn verify_no_torn_objects<S: Store>(store: &S) -> usize {
    let all = store
        .list_raw(Kind::Event)
        .expect("store lists after a crash");
    for raw in &all {
        let seq = raw.value["seq"].as_u64().expect("seq");
        assert_eq!(raw.value, crash_record(seq), "record {} is torn", raw.name);
    }
    all.len()
}
