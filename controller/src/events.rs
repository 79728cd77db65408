//! Recording events: what happened to an object, and why.

use std::sync::atomic::{AtomicU64, Ordering};

use ballast::model::{Event, Kind};
use ballast::store::Store;

/// Events kept; older ones are pruned as new ones come.
const KEEP: usize = 2000;

/// Writes events to the store with names that sort by time.
#[derive(Debug, Default)]
pub struct Recorder {
    seq: AtomicU64,
}

impl Recorder {
    /// Records an event on `kind/name`. Failing to record is logged, never
    /// fatal: an event is a report, not state.
    pub async fn record(
        &self,
        store: &dyn Store,
        now: chrono::DateTime<chrono::Utc>,
        kind: Kind,
        name: &str,
        reason: &str,
        message: impl Into<String>,
    ) {
        self.record_on(
            store,
            now,
            &format!("{}/{name}", kind.singular()),
            reason,
            message,
        )
        .await;
    }

    /// Records an event on `object` (`KIND/NAME`).
    pub async fn record_on(
        &self,
        store: &dyn Store,
        now: chrono::DateTime<chrono::Utc>,
        object: &str,
        reason: &str,
        message: impl Into<String>,
    ) {
        let message = message.into();
        let object = object.to_string();
        tracing::info!(%object, reason, %message, "event");
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let event = Event {
            name: format!(
                "{:020}-{:06}",
                now.timestamp_nanos_opt().unwrap_or_default(),
                seq % 1_000_000
            ),
            resource_version: 0,
            object,
            reason: reason.to_string(),
            message,
            time: now,
        };
        if let Err(e) = store.create(&event).await {
            tracing::warn!(error = %e, "cannot record event");
            return;
        }
        if seq % 100 == 99 {
            prune(store).await;
        }
    }
}

async fn prune(store: &dyn Store) {
    let Ok(all) = store.list_raw(Kind::Event).await else {
        return;
    };
    let excess = all.len().saturating_sub(KEEP);
    for old in all.into_iter().take(excess) {
        let _ = store.delete_raw(Kind::Event, &old.name, None).await;
    }
}
