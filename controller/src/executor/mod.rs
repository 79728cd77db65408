//! The executor: carries out decisions through the node agents. It writes
//! its intent to the store before calling a node (a volume `creating`, a
//! replica record before the replica), and rolls back what it started when
//! a step fails. It decides nothing: placement comes from the planner.
//!
//! `volume` carries out the volume lifecycle (create, attach, detach,
//! delete); `actions` carries out each planner action; `replica` is the
//! one way a replica is made (and unmade when that fails); `reconcile` is the
//! loop that observes, plans and acts on every change and resync tick;
//! `scrub` has every replica's frozen layers checked on its node.

mod actions;
mod reconcile;
mod replica;
mod scrub;
mod volume;

use std::time::Duration;

use ballast::model::Node;
use ballast::proto::agent::v1::node_agent_client::NodeAgentClient;
use tonic::transport::Channel;

use crate::error::Error;

pub use actions::{carry_out, delete_replica};
pub use reconcile::run_reconcile;
pub use scrub::{run_scrub, scrub_now};
pub use volume::{attach, create, delete, detach, expand, restart_engine};

/// A client of a node's agent.
pub fn agent(node: &Node) -> Result<NodeAgentClient<Channel>, Error> {
    if node.status.agent_endpoint.is_empty() {
        return Err(Error::Unprocessable(format!(
            "node {} has not registered an agent endpoint",
            node.id
        )));
    }
    let ch = ballast::grpc::tcp_channel(&node.status.agent_endpoint)
        .map_err(|e| Error::Internal(e.to_string()))?;
    Ok(NodeAgentClient::new(ch))
}

/// How long one agent call may take.
pub const AGENT_TIMEOUT: Duration = Duration::from_secs(30);

/// Maps a failed agent call to a controller error naming the node.
pub fn agent_error(node: &str, s: tonic::Status) -> Error {
    let msg = format!("node {node}: {}", s.message());
    match s.code() {
        tonic::Code::InvalidArgument => Error::invalid("node", msg),
        tonic::Code::AlreadyExists | tonic::Code::Aborted => Error::Conflict(msg),
        tonic::Code::FailedPrecondition => Error::Unprocessable(msg),
        tonic::Code::NotFound => Error::NotFound {
            kind: "object".into(),
            name: msg,
        },
        tonic::Code::Unavailable => Error::Unavailable(msg),
        tonic::Code::DataLoss => Error::DataLoss(msg),
        _ => Error::Internal(msg),
    }
}

/// Runs one agent call with the agent timeout.
pub(crate) async fn with_timeout<T>(
    node: &str,
    f: impl std::future::Future<Output = Result<T, tonic::Status>>,
) -> Result<T, Error> {
    match tokio::time::timeout(AGENT_TIMEOUT, f).await {
        Ok(r) => r.map_err(|s| agent_error(node, s)),
        Err(_) => Err(Error::Internal(format!(
            "node {node}: no answer in {}s",
            AGENT_TIMEOUT.as_secs()
        ))),
    }
}

/// A new replica's name: `<volume>-r<8 hex>`.
pub(crate) fn replica_name(volume: &str) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("{volume}-r{}", &id[..8])
}
