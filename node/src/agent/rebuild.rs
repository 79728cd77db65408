//! Offline rebuild, for a replica of a detached volume (no engine runs to
//! coordinate): the source freezes its head, the target joins the source's
//! chain and fills the layers it lacks.

use ballast::proto::agent::v1::RebuildReplicaResponse;

use crate::error::Error;
use crate::server::ReplicaServer;
use crate::wire::JoinSpec;
use crate::wire::client::ReplicaClient;

pub async fn offline(
    server: &ReplicaServer,
    name: &str,
    source: &str,
) -> Result<RebuildReplicaResponse, Error> {
    let (src_name, src_addr) = source
        .split_once('@')
        .filter(|(n, a)| !n.is_empty() && !a.is_empty())
        .ok_or_else(|| Error::Invalid {
            field: "source".into(),
            message: format!("{source:?}: expected NAME@HOST:PORT"),
        })?;
    let target = server.replicas().find(name).map_err(Error::NotFound)?;
    // A source that cannot be reached may come back, and a full disk may
    // be freed: Unavailable, which the controller does not count as a
    // failed reuse.
    let remote = |e: crate::wire::client::ClientError| match e {
        crate::wire::client::ClientError::Closed { .. } => Error::Unavailable(e.to_string()),
        e if e.is_no_space() => Error::Unavailable(e.to_string()),
        e => Error::Internal(e.to_string()),
    };
    let src = ReplicaClient::dial(server.tls(), src_addr, src_name)
        .await
        .map_err(remote)?;
    src.snapshot().await.map_err(remote)?;
    let info = src.info().await.map_err(remote)?;
    let layers = src.layers().await.map_err(remote)?;
    let spec = JoinSpec::following(&layers, info["revision"].as_u64().unwrap_or(0))
        .map_err(Error::Internal)?;
    let report = tokio::task::spawn_blocking(move || {
        target
            .write()
            .map_err(|_| "replica lock poisoned".to_string())?
            .join(&spec.frozen, &spec.head, spec.revision)
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| Error::Internal(e.to_string()))?
    .map_err(Error::Internal)?;
    let filled = server.fill(name, source).await.map_err(|e| match e {
        // The source's data is corrupt: the controller fails the source.
        crate::sync::SyncError::SourceCorrupt(m) => Error::SourceCorrupt(m),
        e => Error::Internal(e.to_string()),
    })?;
    Ok(RebuildReplicaResponse {
        kept_bytes: report.kept_bytes,
        copied_bytes: filled.bytes,
        copy_path: filled.path.as_str().to_string(),
    })
}
