//! Offline rebuild, for a replica of a detached volume (no engine runs to
//! coordinate): the source freezes its head, the target joins the source's
//! chain and fills the layers it lacks. And restore, the same join and fill
//! for a new volume's replica, up to a user snapshot of another volume.

use ballast::proto::agent::v1::RebuildReplicaResponse;

use crate::error::Error;
use crate::server::ReplicaServer;
use crate::wire::JoinSpec;
use crate::wire::client::{Liveness, ReplicaClient};

/// `NAME@HOST:PORT` of a source replica.
fn split_source(source: &str) -> Result<(&str, &str), Error> {
    source
        .split_once('@')
        .filter(|(n, a)| !n.is_empty() && !a.is_empty())
        .ok_or_else(|| Error::Invalid {
            field: "source".into(),
            message: format!("{source:?}: expected NAME@HOST:PORT"),
        })
}

/// A source that cannot be reached may come back, and a full disk may be
/// freed: Unavailable, which the controller does not count as a failed
/// reuse.
fn remote(e: crate::wire::client::ClientError) -> Error {
    match e {
        crate::wire::client::ClientError::Closed { .. } => Error::Unavailable(e.to_string()),
        e if e.is_no_space() => Error::Unavailable(e.to_string()),
        e => Error::Internal(e.to_string()),
    }
}

/// The source `NAME@HOST:PORT` of the fill of `target` (a replica of this
/// node), opened as a reader of its volume (see `wire::readers`).
async fn dial_source(
    server: &ReplicaServer,
    target: &str,
    source: &str,
) -> Result<ReplicaClient, Error> {
    let (name, addr) = split_source(source)?;
    let tls = server
        .tls()
        .to_read(target, name)
        .await
        .map_err(Error::Unavailable)?;
    ReplicaClient::dial(&tls, addr, name).await.map_err(remote)
}

/// Busy while `name` may join no chain (`ReplicaServer::join_refused`).
fn not_filling(server: &ReplicaServer, name: &str) -> Result<(), Error> {
    server
        .join_refused(name)
        .map_or(Ok(()), |why| Err(Error::Busy(why)))
}

/// The target `name` joins the chain `spec` names (on a blocking thread),
/// unless a fill of it runs still.
async fn join(
    server: &ReplicaServer,
    (name, target): (&str, crate::replica::Shared),
    spec: JoinSpec,
) -> Result<crate::replica::JoinReport, Error> {
    not_filling(server, name)?;
    tokio::task::spawn_blocking(move || {
        target
            .write()
            .map_err(|_| "replica lock poisoned".to_string())?
            .join(&spec.frozen, &spec.head, spec.revision)
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| Error::Internal(e.to_string()))?
    .map_err(Error::Internal)
}

fn fill_error(e: crate::sync::SyncError) -> Error {
    match e {
        // The source's data is corrupt: the controller fails the source.
        crate::sync::SyncError::SourceCorrupt { message, .. } => Error::SourceCorrupt(message),
        e => Error::Internal(e.to_string()),
    }
}

/// Fills `name` from `source`, copying at most `bytes_per_second` (0: no
/// limit), over the network or within the node. What it asks the source before the fill (its
/// layers, the freeze of its head, its revision) is waited for while the
/// source answers `live`'s pings: a freeze of a large head takes
/// minutes, and a source whose node froze would hold the rebuild, and the
/// controller's call, for as long (the fill bounds its own waits).
pub async fn offline(
    server: &ReplicaServer,
    name: &str,
    (source, bytes_per_second): (&str, u64),
    live: Liveness,
) -> Result<RebuildReplicaResponse, Error> {
    split_source(source)?;
    let target = server
        .replicas()
        .find_async(name)
        .await
        .map_err(Error::NotFound)?;
    // Asked before the source's head is frozen, as below: an attempt that
    // cannot join freezes nothing.
    not_filling(server, name)?;
    let src = dial_source(server, name, source).await?;
    // A source merging has a layer without its checksum until the merge
    // ends: try again then (not counted as a failed attempt). Asked before
    // its head is frozen too, so that such an attempt freezes nothing: each
    // freeze is one more layer for the merge to fold.
    let before = src.answering(src.layers(), live).await.map_err(remote)?;
    JoinSpec::following(&before, 0).map_err(Error::Unavailable)?;
    src.answering(src.snapshot(None), live)
        .await
        .map_err(remote)?;
    let info = src.answering(src.info(), live).await.map_err(remote)?;
    let layers = src.answering(src.layers(), live).await.map_err(remote)?;
    let spec = JoinSpec::following(&layers, info["revision"].as_u64().unwrap_or(0))
        .map_err(Error::Unavailable)?;
    let report = join(server, (name, target), spec).await?;
    let filled = server
        .fill(name, source, bytes_per_second)
        .await
        .map_err(fill_error)?;
    Ok(RebuildReplicaResponse {
        kept_bytes: report.kept_bytes + filled.reused,
        copied_bytes: filled.bytes,
        copy_path: filled.path.as_str().to_string(),
    })
}

/// Restore: fills the new, empty replica `name` with the data of another
/// volume as it was at user snapshot `snapshot`. It joins the source's
/// chain up to the snapshot's layer (labels and checksums as the source
/// has them) under a new head, and fills those layers from the source:
/// by local copy when the source is on this node, else over the wire.
pub async fn restore(
    server: &ReplicaServer,
    name: &str,
    (source, bytes_per_second): (&str, u64),
    snapshot: &str,
    live: Liveness,
) -> Result<ballast::proto::agent::v1::RestoreReplicaResponse, Error> {
    if !crate::replica::valid_snapshot_id(snapshot) {
        return Err(Error::Invalid {
            field: "snapshot".into(),
            message: format!("{snapshot:?} is not a snapshot id"),
        });
    }
    let (src_name, _) = split_source(source)?;
    let target = server
        .replicas()
        .find_async(name)
        .await
        .map_err(Error::NotFound)?;
    let src = dial_source(server, name, source).await?;
    let layers = src.answering(src.layers(), live).await.map_err(remote)?;
    let upto = layers
        .iter()
        .position(|l| l.snapshot.as_deref() == Some(snapshot))
        .ok_or_else(|| {
            Error::NotFound(format!(
                "replica {src_name} holds no layer of snapshot {snapshot}"
            ))
        })?;
    let frozen = layers[..=upto]
        .iter()
        .map(|l| {
            Ok(crate::replica::LayerSpec {
                name: l.name.clone(),
                checksum: l
                    .checksum
                    .clone()
                    .ok_or_else(|| Error::Internal(format!("layer {} has no checksum", l.name)))?,
                snapshot: l.snapshot.clone(),
            })
        })
        .collect::<Result<Vec<_>, Error>>()?;
    let spec = JoinSpec {
        head: crate::replica::next_layer_name(frozen.iter().map(|l| l.name.as_str())),
        frozen,
        revision: 0,
    };
    // A new replica joins; one that joined already (a restore cut off)
    // goes on filling; any other holds data of its own and is refused.
    let (fresh, already) = {
        let r = target
            .read()
            .map_err(|_| Error::Internal("replica lock poisoned".into()))?;
        let layers = r.layers();
        (
            r.revision() == 0 && layers.len() == 1 && layers[0].allocated == 0,
            layers
                .iter()
                .any(|l| l.snapshot.as_deref() == Some(snapshot)),
        )
    };
    if !fresh && !already {
        return Err(Error::Refused(format!(
            "replica {name} holds data: a restore fills only a new, empty replica"
        )));
    }
    if fresh {
        join(server, (name, target), spec).await?;
    }
    // A restore cut off resumes here: the layers already filled are kept.
    let filled = server
        .fill(name, source, bytes_per_second)
        .await
        .map_err(fill_error)?;
    Ok(ballast::proto::agent::v1::RestoreReplicaResponse {
        copied_bytes: filled.bytes,
        copy_path: filled.path.as_str().to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica::{Replica, replica_dir};

    /// An offline rebuild asked for while its source is being merged fails
    /// as Unavailable (tried again, not counted) before it freezes the
    /// source's head: each frozen head was one more layer for the merge.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_offline_rebuild_from_a_merging_source_freezes_nothing() {
        let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let source = ReplicaServer::new(vec![d1.path().to_path_buf()]);
        let table = source.replicas().clone();
        tokio::spawn(source.serve(listener));
        let target = ReplicaServer::new(vec![d2.path().to_path_buf()]);
        Replica::create(&replica_dir(d1.path(), "v-r0"), 16 << 20).unwrap();
        Replica::create(&replica_dir(d2.path(), "v-r1"), 16 << 20).unwrap();
        let src = ReplicaClient::connect(&addr, "v-r0").await.unwrap();
        // 5 MiB only the lowest layer holds: merged at 1 MiB/s, about 5 s.
        src.write(0, &vec![0x51; 5 << 20], 1, false).await.unwrap();
        src.snapshot(None).await.unwrap();
        src.write(8 << 20, &vec![0x52; 1 << 20], 2, false)
            .await
            .unwrap();
        src.snapshot(None).await.unwrap();
        let merging = tokio::spawn(async move { table.merge("v-r0", vec![], 1 << 20).await });
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let names = |layers: Vec<crate::replica::LayerInfo>| {
            layers.into_iter().map(|l| l.name).collect::<Vec<_>>()
        };
        let before = names(src.layers().await.unwrap());
        let from = format!("v-r0@{addr}");
        let err = offline(&target, "v-r1", (&from, 0), Liveness::default())
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
        assert_eq!(
            names(src.layers().await.unwrap()),
            before,
            "a layer was frozen"
        );
        merging.await.unwrap().unwrap();
        offline(&target, "v-r1", (&from, 0), Liveness::default())
            .await
            .unwrap();
    }
}
