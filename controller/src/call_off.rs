//! Offline copies a user's call calls off. A detached volume's rebuild
//! copies a replica under the volume's guard, and may last hours; an
//! attach, a deletion, an expansion or a snapshot of the volume must not
//! wait for it. This owns the table of copies under way and of the calls
//! waiting, by volume: a call calls off the copy under way, and a copy
//! that would begin while a call waits is called off before it begins.
//! It owns no guard and no I/O: the context takes the guard, the executor
//! runs the copy.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::error::Error;

/// The offline copies under way and the calls waiting, by volume.
#[derive(Default)]
pub struct OfflineCopies(Arc<Mutex<Table>>);

#[derive(Default)]
struct Table {
    running: HashMap<String, Arc<CallOff>>,
    /// For each volume a user's call waits on: how many wait, and the
    /// reason of the latest.
    waiting: HashMap<String, (usize, String)>,
}

/// Calls one copy off, saying why.
#[derive(Default)]
struct CallOff {
    now: tokio::sync::Notify,
    why: Mutex<String>,
}

impl CallOff {
    fn call_off(&self, why: &str) {
        if let Ok(mut w) = self.why.lock() {
            *w = why.to_string();
        }
        // A permit kept if the copy does not wait yet.
        self.now.notify_one();
    }
}

fn called_off(why: &str) -> Error {
    Error::Unavailable(format!("the copy was called off: {why}"))
}

impl OfflineCopies {
    /// Runs `copy`, an offline copy of a replica of `volume`, unless a
    /// user's call on the volume calls it off: then Unavailable, and the
    /// copy's future is dropped (its node stops the copy). A call waiting
    /// already calls it off before it begins.
    pub async fn run<T>(
        &self,
        volume: &str,
        copy: impl std::future::Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        let off = Arc::new(CallOff::default());
        {
            let mut t = self.table()?;
            if let Some((_, why)) = t.waiting.get(volume) {
                return Err(called_off(why));
            }
            t.running.insert(volume.to_string(), off.clone());
        }
        let _running = Running {
            table: self.0.clone(),
            volume: volume.to_string(),
        };
        tokio::select! {
            done = copy => done,
            () = off.now.notified() => {
                let why = off.why.lock().map(|w| w.clone()).unwrap_or_default();
                Err(called_off(&why))
            }
        }
    }

    /// Calls off the copy of `volume` under way, if one is, for `why`,
    /// and every copy that would begin until the guard returned is
    /// dropped; whether one was under way.
    pub fn call_off(&self, volume: &str, why: &str) -> Result<(Waiting, bool), Error> {
        let mut t = self.table()?;
        let w = t.waiting.entry(volume.to_string()).or_default();
        *w = (w.0 + 1, why.to_string());
        let running = t.running.get(volume).cloned();
        if let Some(off) = &running {
            off.call_off(why);
        }
        let waiting = Waiting {
            table: self.0.clone(),
            volume: volume.to_string(),
        };
        Ok((waiting, running.is_some()))
    }

    /// Whether a copy of `volume` is under way.
    #[cfg(test)]
    fn is_running(&self, volume: &str) -> bool {
        self.table().is_ok_and(|t| t.running.contains_key(volume))
    }

    fn table(&self) -> Result<std::sync::MutexGuard<'_, Table>, Error> {
        self.0
            .lock()
            .map_err(|_| Error::Internal("the table of offline copies is poisoned".into()))
    }
}

/// A copy under way; it leaves the table when dropped.
struct Running {
    table: Arc<Mutex<Table>>,
    volume: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(mut t) = self.table.lock() {
            t.running.remove(&self.volume);
        }
    }
}

/// A user's call waiting on a volume: while it is held, no offline copy
/// of the volume begins.
pub struct Waiting {
    table: Arc<Mutex<Table>>,
    volume: String,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Ok(mut t) = self.table.lock()
            && let Some(w) = t.waiting.get_mut(&self.volume)
        {
            w.0 -= 1;
            if w.0 == 0 {
                t.waiting.remove(&self.volume);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_call_calls_off_the_copy_under_way_and_one_that_would_begin_while_it_waits() {
        let copies = Arc::new(OfflineCopies::default());
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let running = {
            let copies = copies.clone();
            tokio::spawn(async move {
                copies
                    .run("v", async {
                        let _ = started_tx.send(());
                        std::future::pending::<Result<(), Error>>().await
                    })
                    .await
            })
        };
        started.await.unwrap();
        assert!(copies.is_running("v"));
        let (waiting, was) = copies.call_off("v", "an attach").unwrap();
        assert!(was, "the copy under way is found");
        let done = tokio::time::timeout(Duration::from_secs(5), running)
            .await
            .expect("the copy ends once called off")
            .unwrap();
        let Err(Error::Unavailable(m)) = done else {
            panic!("called off: {done:?}")
        };
        assert!(m.contains("an attach"), "{m}");
        assert!(!copies.is_running("v"));

        // A copy that would begin while the call waits does not begin.
        let began = std::sync::atomic::AtomicBool::new(false);
        let second = copies
            .run("v", async {
                began.store(true, std::sync::atomic::Ordering::SeqCst);
                Ok(())
            })
            .await;
        assert!(matches!(second, Err(Error::Unavailable(_))), "{second:?}");
        assert!(!began.load(std::sync::atomic::Ordering::SeqCst));
        // Another volume's copy runs.
        copies.run("w", async { Ok(()) }).await.unwrap();

        // Once the call has its guard, copies run again.
        drop(waiting);
        copies.run("v", async { Ok(()) }).await.unwrap();
        let (_w, was) = copies.call_off("v", "a deletion").unwrap();
        assert!(!was, "no copy under way");
    }
}
