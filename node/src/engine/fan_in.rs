//! The answers to one write from every replica, gathered as they come:
//! the last one finishes the write (`FanIn`). Each replica's part is an
//! `Answer`, given once; one dropped ungiven (a path that lost it) counts
//! as that replica failing the write, so a write never waits for ever on
//! an answer no one holds, with the engine's I/O held. It owns the count
//! and the hand-off to `Engine::conclude`; what a failed replica means for
//! the volume is the engine's.

use std::sync::Arc;

use super::{Engine, EngineError, WriteDone};
use crate::wire::client::ClientError;

pub(super) struct FanIn {
    engine: Arc<Engine>,
    /// The write's runtime: an answer may come from any thread (a replica
    /// connection's own, or a drop outside the runtime) and may start the
    /// write's conclusion, a task.
    runtime: tokio::runtime::Handle,
    state: std::sync::Mutex<FanInState>,
}

struct FanInState {
    remaining: usize,
    /// rw replicas that have the write.
    acked: Vec<String>,
    /// Replicas being rebuilt (wo) that have it: one may turn rw, and be
    /// recorded, before the write is answered.
    held: Vec<String>,
    /// Replicas that failed it, and whether each is rw.
    failed: Vec<(String, ClientError, bool)>,
    done: Option<WriteDone>,
    /// I/O stays held until every replica answered (a snapshot waits).
    guard: Option<tokio::sync::OwnedRwLockReadGuard<()>>,
}

/// One replica's answer to one write.
pub(super) struct Answer {
    fan: Arc<FanIn>,
    name: String,
    rw: bool,
    given: bool,
}

impl Answer {
    pub(super) fn give(mut self, r: Result<(), ClientError>) {
        self.given = true;
        self.fan.one(std::mem::take(&mut self.name), self.rw, r);
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        if !self.given {
            let e = ClientError::Closed {
                addr: self.name.clone(),
                reason: "the write's answer was dropped ungiven".into(),
            };
            self.fan
                .one(std::mem::take(&mut self.name), self.rw, Err(e));
        }
    }
}

impl FanIn {
    /// A write to `replicas` replicas, answered through `done`; it holds
    /// the engine's I/O (`guard`) until the last answer. Called within the
    /// runtime.
    pub(super) fn new(
        engine: Arc<Engine>,
        replicas: usize,
        done: WriteDone,
        guard: tokio::sync::OwnedRwLockReadGuard<()>,
    ) -> Arc<FanIn> {
        Arc::new(FanIn {
            engine,
            runtime: tokio::runtime::Handle::current(),
            state: std::sync::Mutex::new(FanInState {
                remaining: replicas,
                acked: Vec::new(),
                held: Vec::new(),
                failed: Vec::new(),
                done: Some(done),
                guard: Some(guard),
            }),
        })
    }

    /// The part of replica `name` (`rw`, or being rebuilt), to be given
    /// once: one per replica the write was counted for.
    pub(super) fn answer(self: &Arc<Self>, name: &str, rw: bool) -> Answer {
        Answer {
            fan: self.clone(),
            name: name.to_string(),
            rw,
            given: false,
        }
    }

    /// One replica's answer; the last one finishes the write.
    fn one(&self, name: String, rw: bool, r: Result<(), ClientError>) {
        let finished = {
            let Ok(mut s) = self.state.lock() else {
                return;
            };
            match r {
                Ok(()) if rw => s.acked.push(name),
                Ok(()) => s.held.push(name),
                Err(e) => s.failed.push((name, e, rw)),
            }
            s.remaining = s.remaining.saturating_sub(1);
            if s.remaining > 0 {
                return;
            }
            (
                std::mem::take(&mut s.acked),
                std::mem::take(&mut s.held),
                std::mem::take(&mut s.failed),
                s.done.take(),
                s.guard.take(),
            )
        };
        let (acked, held, failed, done, guard) = finished;
        let Some(done) = done else {
            return;
        };
        if failed.is_empty() {
            let names: Vec<&str> = acked.iter().chain(&held).map(String::as_str).collect();
            if self.engine.freshness.covers(&names) {
                drop(guard);
                return done(Ok(()));
            }
        }
        // A replica failed (it is dropped from the volume, which takes the
        // members' lock), or the record lags: the write is acknowledged once
        // the store's replica set holds only replicas that have it.
        let engine = self.engine.clone();
        self.runtime.spawn(async move {
            let outcome = engine.conclude(acked, held, failed).await;
            drop(guard);
            done(outcome);
        });
    }

    /// Fails the write before anything was sent.
    pub(super) fn answer_all(&self, e: EngineError) {
        let done = self.state.lock().ok().and_then(|mut s| {
            s.guard.take();
            s.done.take()
        });
        if let Some(done) = done {
            done(Err(e));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::FanIn;
    use crate::engine::{Engine, ReplicaAddr, ReplicaSet};
    use crate::replica::{BLOCK, Replica, replica_dir};
    use crate::server::ReplicaServer;
    use ballast::model::ReplicaMode;

    async fn replica(disk: &std::path::Path, name: &str) -> ReplicaAddr {
        Replica::create(&replica_dir(disk, name), 64 * BLOCK).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(ReplicaServer::new(vec![disk.to_path_buf()]).serve(listener));
        ReplicaAddr {
            name: name.into(),
            addr,
        }
    }

    /// A replica's answer that no one gives (its callback dropped uncalled
    /// by a path that lost it) counts as that replica failing the write:
    /// the write is answered from the others, and that replica leaves the
    /// volume. Before 2026-12-05 such a write waited for ever, holding the
    /// engine's I/O (a dropped replica client did it, the fault soak's
    /// seed 20261258).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_replicas_answer_dropped_ungiven_fails_that_replica_and_the_write_is_answered() {
        let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let replicas = [
            replica(d1.path(), "v-r1").await,
            replica(d2.path(), "v-r2").await,
        ];
        let engine = Engine::start(
            "v",
            64 * BLOCK,
            &replicas,
            None,
            ReplicaSet::default(),
            None,
            Default::default(),
        )
        .await
        .unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let guard = engine.io.clone().read_owned().await;
        let fan = FanIn::new(
            engine.clone(),
            2,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
            guard,
        );
        fan.answer("v-r1", true).give(Ok(()));
        drop(fan.answer("v-r2", true));
        drop(fan);
        let answered = rx.await.expect("the write is answered");
        assert!(answered.is_ok(), "{answered:?}");
        let status = engine.status().await;
        let mode = |name: &str| status.iter().find(|m| m.name == name).map(|m| m.mode);
        assert_eq!(mode("v-r1"), Some(ReplicaMode::Rw));
        assert_ne!(mode("v-r2"), Some(ReplicaMode::Rw), "{status:?}");
        // The engine's I/O was let go: a pause for a snapshot gets it.
        drop(engine.io.write().await);
    }
}
