//! Readers: a node about to read another node's replica (to fill a replica
//! of its own in a rebuild, or in a restore) asks for a certificate that
//! names it a reader of the source's volume. Replicas open only for their
//! volume's engine, their own node, and such a reader, so a node's own
//! certificate reads nothing of a volume it holds no part in.
//!
//! It owns the one check and the signing; who may call is the
//! controlplane's gate (`forward::for_its_node`), and the replica server
//! enforces the names.

use ballast::model::{Kind, Replica, Snapshot, Volume};
use ballast::proto::agent::v1::{IssueReaderRequest, IssueReaderResponse};

use crate::context::Context;
use crate::error::Error;

/// The reader's certificate node `req.node_id` asks for: given when its
/// replica `req.replica` is on it and `req.source` holds the data that
/// replica is to take (a replica of the same volume, or of the volume it
/// was restored or cloned from). A refusal is also a `ReaderRefused`
/// event on the node: a node that asks for what is not its to read is
/// worth an operator's look.
#[tracing::instrument(skip_all, fields(node = %req.node_id, replica = %req.replica, source = %req.source))]
pub async fn issue(ctx: &Context, req: &IssueReaderRequest) -> Result<IssueReaderResponse, Error> {
    let issued = grant(ctx, req).await;
    if let Err(Error::Forbidden(why)) = &issued {
        tracing::warn!(%why, "refused a reader's certificate");
        ctx.event(Kind::Node, &req.node_id, "ReaderRefused", why.clone())
            .await;
    }
    issued
}

async fn grant(ctx: &Context, req: &IssueReaderRequest) -> Result<IssueReaderResponse, Error> {
    for (field, name) in [
        ("nodeId", &req.node_id),
        ("replica", &req.replica),
        ("source", &req.source),
    ] {
        ballast::model::validate_name(name).map_err(|m| Error::invalid(field, m))?;
    }
    let Some(ca) = &ctx.ca else {
        return Err(Error::Unprocessable(
            "this controller runs without TLS (no --cluster-ca-dir or --cluster-ca-secret)".into(),
        ));
    };
    let target: Replica = ctx.store.fetch(&req.replica).await?;
    if target.spec.node_id != req.node_id {
        return Err(Error::Forbidden(format!(
            "replica {} is on node {}, not on node {}",
            req.replica, target.spec.node_id, req.node_id
        )));
    }
    let source: Replica = ctx.store.fetch(&req.source).await?;
    let volume = &source.spec.volume;
    if !takes_data_of(ctx, &target.spec.volume, volume).await? {
        return Err(Error::Forbidden(format!(
            "replica {} of volume {} takes no data of volume {volume}, which replica {} holds",
            req.replica, target.spec.volume, req.source
        )));
    }
    let cert_pem = ca
        .sign_reader(&req.node_id, volume, &req.csr_pem)
        .map_err(|e| Error::invalid("csrPem", e.to_string()))?;
    tracing::info!(volume = %volume, "issued a reader's certificate");
    Ok(IssueReaderResponse { cert_pem })
}

/// Whether a replica of volume `target` takes data of volume `source`:
/// its own, or the volume it is a clone of, or the one whose snapshot it
/// was restored from.
async fn takes_data_of(ctx: &Context, target: &str, source: &str) -> Result<bool, Error> {
    if target == source {
        return Ok(true);
    }
    let v: Volume = ctx.store.fetch(target).await?;
    let Some(from) = &v.spec.source else {
        return Ok(false);
    };
    if from.volume.as_deref() == Some(source) {
        return Ok(true);
    }
    let Some(snapshot) = &from.snapshot else {
        return Ok(false);
    };
    Ok(ctx
        .store
        .get::<Snapshot>(snapshot)
        .await?
        .is_some_and(|s| s.spec.volume == source))
}
