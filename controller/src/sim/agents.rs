//! The model's node agents: what the executor's calls to nodes do in the
//! simulator. They answer behind the controller's own `Agents` trait, so
//! the executor runs unchanged; what they keep is the model's side of the
//! data plane: the fills under way and how many ticks each still takes.
//!
//! A fill is one of three kinds:
//! - **open**: a new replica of a volume that holds no data yet; after
//!   `rebuildTicks` its engine reports it rw, as an engine that attached
//!   and wrote would (the model's volumes all hold data);
//! - **engine**: an attached volume's engine rebuilding a replica; at its
//!   end the engine reports it rw (or err on a node whose rebuilds fail);
//! - **offline**: a detached volume's replica filled by its node; the
//!   executor's call waits for it, as it waits for a real node's answer.
//!
//! A fill on a node that goes down ends at once: a rebuild fails, an
//! offline copy answers that the node could not be reached.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use ballast::model::{Node, Volume};
use tokio::sync::oneshot;

use crate::agents::{Agents, Call, NewReplica, Rebuilt};
use crate::error::Error;

/// How a fill ends.
pub enum Outcome {
    /// An open or engine fill: its replica's record is to be marked rw.
    Rw,
    /// An engine fill that failed: its replica's record is to be marked err.
    Err,
    /// Nothing left to record (an offline fill answered its caller).
    Answered,
}

enum Kind {
    Open,
    Engine,
    Offline(oneshot::Sender<Result<Rebuilt, Error>>),
}

struct Fill {
    node: String,
    ticks_left: u32,
    kind: Kind,
}

#[derive(Default)]
struct State {
    fills: BTreeMap<String, Fill>,
    down: BTreeSet<String>,
    failing: BTreeSet<String>,
}

/// The model's agents, shared by the simulator and the executor's tasks.
pub struct ModelAgents {
    rebuild_ticks: u32,
    state: Mutex<State>,
}

fn replica_name(at: &str) -> &str {
    at.split('@').next().unwrap_or(at)
}

/// The node of a replica named `NAME@ADDR`: the model's nodes serve
/// replicas at `model:<node>`.
fn replica_node(at: &str) -> &str {
    at.split_once("@model:").map_or("", |(_, node)| node)
}

impl ModelAgents {
    pub fn new(rebuild_ticks: u32) -> Self {
        ModelAgents {
            rebuild_ticks: rebuild_ticks.max(1),
            state: Mutex::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A fill of replica `name`, which lives on `node`.
    fn start(&self, node: &str, name: &str, kind: Kind) -> Result<(), Error> {
        let mut s = self.state();
        if s.down.contains(node) {
            return Err(Error::Unavailable(format!("node {node} is down")));
        }
        s.fills.insert(
            name.to_string(),
            Fill {
                node: node.to_string(),
                ticks_left: self.rebuild_ticks,
                kind,
            },
        );
        Ok(())
    }

    /// The node goes down or comes back; down, its fills end at once.
    /// Returns the replicas whose fills ended (to be marked err).
    pub fn set_down(&self, node: &str, down: bool) -> Vec<String> {
        let mut s = self.state();
        if !down {
            s.down.remove(node);
            return Vec::new();
        }
        s.down.insert(node.to_string());
        let ended: Vec<String> = s
            .fills
            .iter()
            .filter(|(_, f)| f.node == node)
            .map(|(n, _)| n.clone())
            .collect();
        for name in &ended {
            if let Some(Fill {
                kind: Kind::Offline(tx),
                ..
            }) = s.fills.remove(name)
            {
                let _ = tx.send(Err(Error::Unavailable(format!("node {node} went down"))));
            }
        }
        ended
    }

    /// Rebuilds onto `node` fail when they end (or stop failing).
    pub fn set_failing(&self, node: &str, failing: bool) {
        let mut s = self.state();
        if failing {
            s.failing.insert(node.to_string());
        } else {
            s.failing.remove(node);
        }
    }

    /// A replica gone (deleted by the model): its fill, if any, with it.
    pub fn forget(&self, name: &str) {
        self.state().fills.remove(name);
    }

    /// Fills under way.
    pub fn busy(&self) -> bool {
        !self.state().fills.is_empty()
    }

    /// Executor calls waiting for an offline fill's answer.
    pub fn waiting(&self) -> usize {
        self.state()
            .fills
            .values()
            .filter(|f| matches!(f.kind, Kind::Offline(_)))
            .count()
    }

    /// One tick of every fill; those that end, with what to record.
    pub fn advance(&self) -> Vec<(String, Outcome)> {
        let mut s = self.state();
        let done: Vec<String> = s
            .fills
            .iter_mut()
            .filter_map(|(name, f)| {
                f.ticks_left = f.ticks_left.saturating_sub(1);
                (f.ticks_left == 0).then(|| name.clone())
            })
            .collect();
        let mut out = Vec::new();
        for name in done {
            let Some(f) = s.fills.remove(&name) else {
                continue;
            };
            let fails = s.failing.contains(&f.node);
            let outcome = match f.kind {
                Kind::Open => Outcome::Rw,
                Kind::Engine if fails => Outcome::Err,
                Kind::Engine => Outcome::Rw,
                Kind::Offline(tx) => {
                    let answer = if fails {
                        Err(Error::Internal(format!(
                            "node {}: the model's rebuilds fail here",
                            f.node
                        )))
                    } else {
                        Ok(Rebuilt {
                            copy_path: "model".into(),
                            ..Default::default()
                        })
                    };
                    let _ = tx.send(answer);
                    Outcome::Answered
                }
            };
            out.push((name, outcome));
        }
        out
    }
}

impl Agents for ModelAgents {
    fn create_replica<'a>(&'a self, node: &'a Node, new: NewReplica<'a>) -> Call<'a, ()> {
        let name = new.name;
        Box::pin(async move {
            // A replica taken up again keeps whatever fill is under way.
            if self.state().fills.contains_key(name) {
                return Ok(());
            }
            self.start(&node.id, name, Kind::Open)
        })
    }

    fn delete_replica<'a>(&'a self, node: &'a Node, name: &'a str) -> Call<'a, ()> {
        Box::pin(async move {
            if self.state().down.contains(&node.id) {
                return Err(Error::Unavailable(format!("node {} is down", node.id)));
            }
            self.forget(name);
            Ok(())
        })
    }

    fn add_engine_replica<'a>(
        &'a self,
        _node: &'a Node,
        _volume: &'a Volume,
        replica: &'a str,
        _source: (&'a str, u64),
    ) -> Call<'a, ()> {
        let (name, on) = (replica_name(replica), replica_node(replica));
        Box::pin(async move { self.start(on, name, Kind::Engine) })
    }

    fn remove_engine_replica<'a>(
        &'a self,
        _node: &'a Node,
        _volume: &'a str,
        replica: &'a str,
    ) -> Call<'a, ()> {
        Box::pin(async move {
            self.forget(replica_name(replica));
            Ok(())
        })
    }

    fn rebuild_replica<'a>(
        &'a self,
        node: &'a Node,
        name: &'a str,
        _source: &'a str,
        _bytes_per_second: u64,
    ) -> Call<'a, Rebuilt> {
        Box::pin(async move {
            let (tx, rx) = oneshot::channel();
            self.start(&node.id, name, Kind::Offline(tx))?;
            rx.await.unwrap_or_else(|_| {
                Err(Error::Unavailable(format!(
                    "the fill of {name} was called off"
                )))
            })
        })
    }
}
