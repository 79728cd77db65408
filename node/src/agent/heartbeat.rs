//! The node's heartbeat: every interval it reports its readiness, disks
//! (usage, pressure), replicas and engines to the controller, at once when
//! an engine changes; what the controller answers about disks is applied
//! to the replica table (a lost disk fails its replicas).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ballast::cluster_token::Authed;
use ballast::proto::agent::v1::controlplane_client::ControlplaneClient;
use ballast::proto::agent::v1::{HeartbeatRequest, RegisterRequest};
use ballast::tls::{Member, Role};

use crate::context::NodeContext;

const RETRY_MIN: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(5);

fn register_request(ctx: &NodeContext) -> RegisterRequest {
    RegisterRequest {
        node_id: ctx.node_id.clone(),
        zone: ctx.zone.clone(),
        tags: ctx.tags.clone(),
        disks: ctx.disks.iter().map(|d| d.identity()).collect(),
        agent_endpoint: ctx.agent_endpoint.clone(),
        replica_endpoint: ctx.replica_endpoint.clone(),
        csi_endpoint: ctx.csi_endpoint.clone(),
        version: ballast::VERSION.to_string(),
        max_volumes: ctx.max_volumes,
    }
}

/// Registers (retrying with backoff until the controller answers) and
/// returns the heartbeat interval the controller asked for.
#[tracing::instrument(skip_all, fields(node = %ctx.node_id))]
async fn register(ctx: &NodeContext, client: &mut ControlplaneClient<Authed>) -> Duration {
    let mut delay = RETRY_MIN;
    loop {
        match client.register(register_request(ctx)).await {
            Ok(resp) => {
                ctx.registered.store(true, Ordering::SeqCst);
                let ms = resp.into_inner().heartbeat_interval_ms.max(100);
                tracing::info!(heartbeat_ms = ms, "registered with the controller");
                return Duration::from_millis(ms);
            }
            Err(status) => {
                tracing::warn!(code = ?status.code(), message = status.message(), retry_in = ?delay, "registration failed");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(RETRY_MAX);
            }
        }
    }
}

/// After each renewal of the node's certificate, the heartbeats go on a
/// new channel, so that the controller sees the new certificate at the
/// next one (and says so: `CertificateRenewed`) instead of within the hour
/// its server keeps a connection.
#[derive(Debug)]
pub struct Reconnect {
    pub member: Member,
    /// The controller's agent endpoint(s).
    pub url: String,
    /// Counts the renewals (`renewal::Renewal`).
    pub renewed: tokio::sync::watch::Receiver<u64>,
}

/// Registers, then heartbeats for ever. A controller that no longer knows
/// the node gets a new registration; an unreachable one is retried at the
/// same pace (the controller marks the node down, not us).
pub async fn run_heartbeats(ctx: Arc<NodeContext>, channel: Authed, mut again: Reconnect) {
    let mut client = ControlplaneClient::new(channel);
    let report_now = ctx.engines.report_now();
    let mut interval = register(&ctx, &mut client).await;
    loop {
        if again.renewed.has_changed().unwrap_or(false) {
            again.renewed.borrow_and_update();
            match again.member.channel(&again.url, &Role::Controller) {
                Ok(channel) => client = ControlplaneClient::new(channel),
                Err(e) => tracing::warn!(error = %e, "no new channel to the controller"),
            }
        }
        // The first heartbeat goes right after registering, so the
        // controller learns the disks' sizes at once.
        let disks = ctx.disk_status();
        // A disk that went away fails its replicas, so that their volumes
        // degrade and rebuild elsewhere instead of writing into the void.
        if let Some(server) = &ctx.replicas {
            for (d, st) in ctx.disks.iter().zip(&disks) {
                if st.ready {
                    server.replicas().restore_disk(&d.path);
                } else {
                    server.replicas().fail_disk(&d.path, &st.message);
                }
            }
        }
        let req = HeartbeatRequest {
            node_id: ctx.node_id.clone(),
            disks,
            replicas: super::server::scan(&ctx),
            engines: ctx.engines.list().await,
        };
        match client.heartbeat(req).await {
            Ok(resp) if resp.get_ref().known => {}
            Ok(_) => {
                tracing::warn!("the controller does not know this node; registering again");
                interval = register(&ctx, &mut client).await;
            }
            Err(status) => {
                tracing::warn!(code = ?status.code(), message = status.message(), "heartbeat failed");
            }
        }
        // The next beat at the interval, or at once when an engine exits
        // or was handed over.
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = report_now.notified() => {}
        }
    }
}
