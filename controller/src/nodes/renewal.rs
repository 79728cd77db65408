//! Engines' certificates renewed while they run. A node's heartbeats say
//! when each of its running engines' certificates expires; from
//! `--renew-engine-certificates-days` before that, the controller issues
//! the engine new credentials for the same volume, node and attachment and
//! gives them to it through its node (`RenewEngine`), at most once an hour
//! per volume. The engine shows them from its next connection on, so an
//! engine that serves a volume for more than a year keeps reaching its
//! replicas. It owns the decision and the call; the certificate is the
//! CA's, the files and the engine's swap the node's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ballast::model::{Kind, Node, Volume};
use ballast::proto::agent::v1::{EngineStatus, RenewEngineRequest};
use chrono::{DateTime, Utc};

use crate::agents::{client as agent, with_timeout};
use crate::context::Context;
use crate::error::Error;

/// The default of `--renew-engine-certificates-days`.
pub const RENEW_DAYS: i64 = 30;

/// How long after one try the same volume's engine is tried again.
const AGAIN_AFTER: chrono::Duration = chrono::Duration::hours(1);

/// When each volume's engine was last renewed or tried.
#[derive(Debug)]
pub struct Renewals {
    days: i64,
    last: Mutex<HashMap<String, DateTime<Utc>>>,
}

impl Default for Renewals {
    fn default() -> Self {
        Renewals::within(RENEW_DAYS)
    }
}

impl Renewals {
    /// Renewing certificates that expire within `days`.
    pub fn within(days: i64) -> Renewals {
        Renewals {
            days,
            last: Mutex::default(),
        }
    }

    /// Renews, in the background, the certificates of node `node_id`'s
    /// running `engines` that are due.
    pub fn check(&self, ctx: &Arc<Context>, node_id: &str, engines: &[EngineStatus]) {
        let Some(ca) = ctx.ca.clone() else {
            return;
        };
        let now = ctx.now();
        let mut due_now = Vec::new();
        {
            let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
            for e in engines {
                if !e.running
                    || !ballast::tls::due_for_renewal(e.certificate_not_after, now, self.days)
                {
                    continue;
                }
                if last.get(&e.volume).is_some_and(|t| now - *t < AGAIN_AFTER) {
                    continue;
                }
                last.insert(e.volume.clone(), now);
                due_now.push(e.volume.clone());
            }
        }
        for volume in due_now {
            let (ctx, node_id) = (ctx.clone(), node_id.to_string());
            let ca = ca.clone();
            tokio::spawn(async move {
                match renew(&ctx, &ca, &node_id, &volume).await {
                    Ok(epoch) => {
                        let m = format!(
                            "renewed the certificate of the engine of {volume} on {node_id} (attachment {epoch})"
                        );
                        tracing::info!(volume = %volume, node = %node_id, "{m}");
                        ctx.event(Kind::Volume, &volume, "EngineCertificateRenewed", m)
                            .await;
                    }
                    Err(e) => {
                        tracing::warn!(volume = %volume, node = %node_id, error = %e, "the engine's certificate was not renewed; tried again in an hour");
                    }
                }
            });
        }
    }
}

/// Issues the engine of `volume` on `node_id` new credentials and gives
/// them to it; the attachment they name.
#[tracing::instrument(skip_all, fields(volume = %volume, node = %node_id))]
async fn renew(
    ctx: &Context,
    ca: &ballast::tls::Ca,
    node_id: &str,
    volume: &str,
) -> Result<u64, Error> {
    let v: Volume = ctx.store.fetch(volume).await?;
    // Only the engine of the volume's attachment here: an engine of an
    // earlier one is fenced out and gets nothing.
    if v.status.attached_node.as_deref() != Some(node_id) {
        return Err(Error::Unprocessable(format!(
            "{volume} is not attached to {node_id}"
        )));
    }
    let epoch = v.status.engine_epoch;
    let node: Node = ctx.store.fetch(node_id).await?;
    let credentials = ca
        .issue_engine(volume, node_id, epoch)
        .map_err(|e| Error::Internal(format!("the engine's certificate: {e}")))?;
    let mut c = agent(&node, &ctx.member)?;
    with_timeout(
        node_id,
        c.renew_engine(RenewEngineRequest {
            volume: volume.to_string(),
            tls_cert_pem: credentials.cert_pem.clone(),
            tls_key_pem: credentials.key_pem().to_string(),
        }),
    )
    .await?;
    Ok(epoch)
}
