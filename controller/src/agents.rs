//! How the controller reaches the node agents: a gRPC client per node,
//! one timeout and one mapping of their answers to controller errors, and
//! the calls the planner's actions make, behind a trait (`Agents`) so that
//! the simulator answers them from its model of the nodes while the
//! executor's code stays the same.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use ballast::cluster_token::Authed;
use ballast::grpc::Calls;
use ballast::model::{Node, Volume};
use ballast::proto::agent::v1::node_agent_client::NodeAgentClient;
use ballast::proto::agent::v1::{
    AddEngineReplicaRequest, CreateReplicaRequest, DeleteReplicaRequest, RebuildReplicaRequest,
    RemoveEngineReplicaRequest,
};
use ballast::tls::{Member, Role};

use crate::error::Error;

/// A client of a node's agent, which is checked to be that node; the
/// calls are made as `member`.
pub fn client(node: &Node, member: &Member) -> Result<NodeAgentClient<Authed>, Error> {
    client_calls(node, member, Calls::Bounded)
}

/// A client of `node`'s agent for calls that last as long as their work
/// (a merge): the channel does not cut them at its call timeout;
/// `long_call` bounds them.
fn long_client(node: &Node, member: &Member) -> Result<NodeAgentClient<Authed>, Error> {
    client_calls(node, member, Calls::Long)
}

fn client_calls(
    node: &Node,
    member: &Member,
    calls: Calls,
) -> Result<NodeAgentClient<Authed>, Error> {
    if node.status.agent_endpoint.is_empty() {
        return Err(Error::Unprocessable(format!(
            "node {} has not registered an agent endpoint",
            node.id
        )));
    }
    let ch = member
        .channel_calls(
            &node.status.agent_endpoint,
            &Role::Node(node.id.clone()),
            calls,
        )
        .map_err(|e| Error::Internal(e.to_string()))?;
    Ok(NodeAgentClient::new(ch))
}

// How long each call of a node may take. Most go over the bounded
// channel, which cuts each at its call timeout (`ballast::grpc::
// CALL_TIMEOUT`, 10 s). A call whose node work lasts longer goes over the
// long channel (`long_call`), whose peer is pinged all along, bounded by
// one of the limits below, each named after the work it waits for.

/// A backstop for a call over the bounded channel, which cuts it first;
/// it bounds whatever the channel's cut does not (a connection waited
/// for).
pub const AGENT_TIMEOUT: Duration = Duration::from_secs(30);

/// A call that copies a replica's data (an offline rebuild, a restore).
pub const COPY_TIMEOUT: Duration = Duration::from_secs(6 * 3600);

/// A call that merges a replica's layers.
pub const MERGE_TIMEOUT: Duration = Duration::from_secs(3600);

/// A call that starts an engine: its node waits up to 20 s for the engine
/// to serve, after stopping one left of the volume.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A call that pauses a volume's I/O for a quick change (a growth): the
/// engine first gives up a replica that leaves a request unanswered for
/// the replica timeout (`engine-replica-timeout`, at most 30 s), and the
/// pause waits for the I/O under way.
pub const PAUSE_TIMEOUT: Duration = Duration::from_secs(120);

/// The slowest read of a replica's data a call is waited for at: 32
/// MiB/s, a thirtieth of what was measured (`cargo bench -p ballast-node
/// --bench freeze`: about a second per GiB of head, cold).
const READ_FLOOR_RATE: u64 = 32 << 20;

/// A call that reads up to `size` bytes of a replica on its node without
/// a pace (a freeze reads the whole head for its checksum, with the
/// volume's I/O paused; giving up bad blocks reads each layer given up
/// in): reading them at `READ_FLOOR_RATE`, and a minute. A node that
/// stops answering ends it sooner (the long channel pings it).
pub fn reading(size: u64) -> Duration {
    Duration::from_secs(60 + size / READ_FLOOR_RATE)
}

/// A call that reads `size` bytes at `rate` bytes per second (a scrub):
/// twice that, and a minute.
pub fn paced(size: u64, rate: u64) -> Duration {
    Duration::from_secs(60 + 2 * size / rate.max(1))
}

/// Runs one call of `node` that freezes the heads of a volume of `size`
/// bytes (bounded by `reading` them).
pub async fn freezing<T, F, Fut>(
    node: &Node,
    member: &Member,
    size: u64,
    call: F,
) -> Result<T, Error>
where
    F: FnOnce(NodeAgentClient<Authed>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    long_call(node, member, reading(size), call).await
}

/// Runs one call of `node` over a channel that does not cut it at an
/// agent call's timeout, bounded by `limit` instead (one of the above);
/// its answer's body. Past the limit it is Unavailable: the node did not
/// answer in time, and may still be at the work.
pub async fn long_call<T, F, Fut>(
    node: &Node,
    member: &Member,
    limit: Duration,
    call: F,
) -> Result<T, Error>
where
    F: FnOnce(NodeAgentClient<Authed>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let c = long_client(node, member)?;
    with_limit(&node.id, limit, call(c))
        .await
        .map(tonic::Response::into_inner)
}

/// Maps a failed agent call to a controller error naming the node.
pub fn agent_error(node: &str, s: tonic::Status) -> Error {
    let msg = format!("node {node}: {}", s.message());
    match s.code() {
        tonic::Code::InvalidArgument => Error::invalid("node", msg),
        tonic::Code::AlreadyExists | tonic::Code::Aborted => Error::Conflict(msg),
        tonic::Code::FailedPrecondition => Error::Unprocessable(msg),
        tonic::Code::NotFound => Error::NotOnNode(msg),
        tonic::Code::Unavailable => Error::Unavailable(msg),
        tonic::Code::DataLoss => Error::DataLoss(msg),
        _ => Error::Internal(msg),
    }
}

/// Runs one agent call with the agent timeout.
pub async fn with_timeout<T>(
    node: &str,
    f: impl std::future::Future<Output = Result<T, tonic::Status>>,
) -> Result<T, Error> {
    with_limit(node, AGENT_TIMEOUT, f).await
}

/// Runs one agent call, bounded by `limit`.
async fn with_limit<T>(
    node: &str,
    limit: Duration,
    f: impl std::future::Future<Output = Result<T, tonic::Status>>,
) -> Result<T, Error> {
    match tokio::time::timeout(limit, f).await {
        Ok(r) => r.map_err(|s| agent_error(node, s)),
        Err(_) => Err(Error::Unavailable(format!(
            "node {node}: no answer in {}s",
            limit.as_secs()
        ))),
    }
}

/// Raises the engine fence of replica `name` on `node` to `epoch` (never
/// lowers it); the fence as it is then.
pub async fn fence_replica(
    node: &Node,
    member: &Member,
    name: &str,
    epoch: u64,
) -> Result<u64, Error> {
    let mut c = client(node, member)?;
    let request = ballast::proto::agent::v1::FenceReplicaRequest {
        name: name.to_string(),
        epoch,
    };
    let fenced = with_timeout(&node.id, c.fence_replica(request)).await?;
    Ok(fenced.into_inner().fence)
}

/// An agent call under way.
pub type Call<'a, T> = Pin<Box<dyn Future<Output = Result<T, Error>> + Send + 'a>>;

/// What an offline rebuild did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rebuilt {
    pub kept_bytes: u64,
    pub copied_bytes: u64,
    pub copy_path: String,
}

/// An empty replica to make: replica `name` of `volume`, `size` bytes, on
/// disk `disk`.
#[derive(Clone, Copy, Debug)]
pub struct NewReplica<'a> {
    pub name: &'a str,
    pub volume: &'a str,
    pub disk: &'a str,
    pub size: u64,
}

/// The node calls the planner's actions make. Each names the node whose
/// agent is asked.
pub trait Agents: Send + Sync {
    /// Makes an empty replica on `node`.
    fn create_replica<'a>(&'a self, node: &'a Node, new: NewReplica<'a>) -> Call<'a, ()>;
    /// Deletes replica `name`'s data.
    fn delete_replica<'a>(&'a self, node: &'a Node, name: &'a str) -> Call<'a, ()>;
    /// Has the engine of `volume` on `node` add `replica` (`NAME@ADDR`) in
    /// `wo` mode and rebuild it (from `source` when given), copying at
    /// most `bytes_per_second` (0: no limit). It freezes the volume's
    /// heads first: the call lasts as long (see `freeze_limit`).
    fn add_engine_replica<'a>(
        &'a self,
        node: &'a Node,
        volume: &'a Volume,
        replica: &'a str,
        source: (&'a str, u64),
    ) -> Call<'a, ()>;
    /// Has the engine of `volume` on `node` drop `replica`.
    fn remove_engine_replica<'a>(
        &'a self,
        node: &'a Node,
        volume: &'a str,
        replica: &'a str,
    ) -> Call<'a, ()>;
    /// Fills replica `name` on `node` from `source` (`NAME@ADDR`), with no
    /// engine, copying at most `bytes_per_second` (0: no limit); answers
    /// when it is done.
    fn rebuild_replica<'a>(
        &'a self,
        node: &'a Node,
        name: &'a str,
        source: &'a str,
        bytes_per_second: u64,
    ) -> Call<'a, Rebuilt>;
}

/// The real agents, over gRPC, with the cluster token.
pub struct GrpcAgents {
    member: Member,
}

impl GrpcAgents {
    pub fn new(member: Member) -> Self {
        GrpcAgents { member }
    }
}

/// One call to `node`'s agent, with the timeout; its answer's body.
async fn ask<T, F, Fut>(member: &Member, node: &Node, call: F) -> Result<T, Error>
where
    F: FnOnce(NodeAgentClient<Authed>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let c = client(node, member)?;
    with_timeout(&node.id, call(c))
        .await
        .map(tonic::Response::into_inner)
}

impl GrpcAgents {
    /// One call to `node`'s agent whose answer carries nothing of use.
    fn done<'a, T, F, Fut>(&'a self, node: &'a Node, call: F) -> Call<'a, ()>
    where
        F: FnOnce(NodeAgentClient<Authed>) -> Fut + Send + 'a,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>> + Send + 'a,
        T: Send + 'a,
    {
        Box::pin(async move { ask(&self.member, node, call).await.map(drop) })
    }
}

impl Agents for GrpcAgents {
    fn create_replica<'a>(&'a self, node: &'a Node, new: NewReplica<'a>) -> Call<'a, ()> {
        let req = CreateReplicaRequest {
            name: new.name.to_string(),
            volume: new.volume.to_string(),
            disk_id: new.disk.to_string(),
            size: new.size,
        };
        self.done(node, |mut c| async move { c.create_replica(req).await })
    }

    fn delete_replica<'a>(&'a self, node: &'a Node, name: &'a str) -> Call<'a, ()> {
        let req = DeleteReplicaRequest {
            name: name.to_string(),
        };
        self.done(node, |mut c| async move { c.delete_replica(req).await })
    }

    fn add_engine_replica<'a>(
        &'a self,
        node: &'a Node,
        volume: &'a Volume,
        replica: &'a str,
        (source, bytes_per_second): (&'a str, u64),
    ) -> Call<'a, ()> {
        let req = AddEngineReplicaRequest {
            volume: volume.name.clone(),
            replica: replica.to_string(),
            source: source.to_string(),
            bytes_per_second,
        };
        // Cut at an agent call's timeout, a freeze longer than it (a head
        // of more than about 10 GiB) marked the replica failed while the
        // engine went on adding it.
        Box::pin(async move {
            freezing(node, &self.member, volume.spec.size, |mut c| async move {
                c.add_engine_replica(req).await
            })
            .await
            .map(drop)
        })
    }

    fn remove_engine_replica<'a>(
        &'a self,
        node: &'a Node,
        volume: &'a str,
        replica: &'a str,
    ) -> Call<'a, ()> {
        let req = RemoveEngineReplicaRequest {
            volume: volume.to_string(),
            replica: replica.to_string(),
        };
        self.done(
            node,
            |mut c| async move { c.remove_engine_replica(req).await },
        )
    }

    fn rebuild_replica<'a>(
        &'a self,
        node: &'a Node,
        name: &'a str,
        source: &'a str,
        bytes_per_second: u64,
    ) -> Call<'a, Rebuilt> {
        let req = RebuildReplicaRequest {
            name: name.to_string(),
            source: source.to_string(),
            bytes_per_second,
        };
        Box::pin(async move {
            // The node copies the data in the call: it lasts as long as the
            // copy. Cut at an agent call's timeout instead, it was marked
            // failed while the node went on filling, and each attempt made
            // one more copy on the node's disk.
            let done = long_call(node, &self.member, COPY_TIMEOUT, |mut c| async move {
                c.rebuild_replica(req).await
            })
            .await?;
            Ok(Rebuilt {
                kept_bytes: done.kept_bytes,
                copied_bytes: done.copied_bytes,
                copy_path: done.copy_path,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_that_lacks_what_was_asked_says_what_and_where() {
        let e = agent_error(
            "node-1",
            tonic::Status::not_found("no engine of v runs on this node"),
        );
        assert!(matches!(e, Error::NotOnNode(_)), "{e:?}");
        assert_eq!(
            e.to_string(),
            "node node-1: no engine of v runs on this node"
        );
        assert_eq!(tonic::Status::from(e).code(), tonic::Code::NotFound);
    }
}
