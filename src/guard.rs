//! One guard per key (a volume's name): whoever holds it works on that
//! volume alone. A caller either takes it now or is told it is busy, or
//! waits a bounded time, woken when a holder lets go (no polling). The
//! controller and the node's CSI service both use it; each maps "busy" to
//! its own answer (409, ABORTED).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

#[derive(Default)]
struct Inner {
    held: Mutex<HashSet<String>>,
    released: Notify,
}

/// The set of keys held now.
#[derive(Clone, Default)]
pub struct KeyedGuards {
    inner: Arc<Inner>,
}

/// Held while a call works on its key; dropping it lets go and wakes the
/// waiters.
pub struct KeyGuard {
    inner: Arc<Inner>,
    key: String,
}

impl Drop for KeyGuard {
    fn drop(&mut self) {
        // A poisoned set still lets go: the key is removed either way.
        let mut held = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
        held.remove(&self.key);
        drop(held);
        self.inner.released.notify_waiters();
    }
}

impl KeyedGuards {
    /// Takes `key` now, or None when another holds it.
    pub fn try_take(&self, key: &str) -> Option<KeyGuard> {
        let mut held = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
        if !held.insert(key.to_string()) {
            return None;
        }
        Some(KeyGuard {
            inner: self.inner.clone(),
            key: key.to_string(),
        })
    }

    /// Takes `key`, waiting at most `patience` for its holder to let go.
    pub async fn take_within(&self, key: &str, patience: Duration) -> Option<KeyGuard> {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            // Registered before the attempt, so a release between the two
            // is not missed.
            let released = self.inner.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if let Some(g) = self.try_take(key) {
                return Some(g);
            }
            if tokio::time::timeout_at(deadline, released).await.is_err() {
                return None;
            }
        }
    }

    /// Whether someone holds `key` now.
    pub fn is_held(&self, key: &str) -> bool {
        self.inner
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_key_is_refused_and_free_again_once_dropped() {
        let g = KeyedGuards::default();
        let a = g.try_take("v").unwrap();
        assert!(g.try_take("v").is_none());
        assert!(g.try_take("w").is_some(), "keys are independent");
        assert!(g.is_held("v"));
        drop(a);
        assert!(!g.is_held("v"));
        assert!(g.try_take("v").is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_is_woken_by_the_release_and_gives_up_at_its_deadline() {
        let g = KeyedGuards::default();
        let held = g.try_take("v").unwrap();
        let waiter = {
            let g = g.clone();
            tokio::spawn(async move { g.take_within("v", Duration::from_secs(30)).await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(held);
        let got = waiter.await.unwrap();
        assert!(got.is_some(), "woken by the release, before its deadline");
        // Nobody lets go: the wait ends at the deadline, empty-handed.
        let started = tokio::time::Instant::now();
        assert!(g.take_within("v", Duration::from_secs(5)).await.is_none());
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }
}
