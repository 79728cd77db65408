//! The node plugin's `/metrics` (prometheus-client, OpenMetrics text, on
//! `--metrics-listen`): the I/O each engine started here served — read and
//! write operations, bytes and the time they took, summed since the
//! engine started, and the blocks that failed their checksums, were
//! repaired, or could not be read — whether it runs (and waits for a
//! handover to a new engine host), the changes of its replicas that the
//! replica server refused (a stale engine still trying, say), and when
//! the node's and the engines' certificates expire. The
//! controller's `/metrics` has the model (volumes, replicas, nodes,
//! disks, the planner). Read only.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::context::NodeContext;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VolumeLabels {
    volume: String,
    node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CertificateLabels {
    node: String,
    /// `node`, or `engine` (with its volume).
    holder: String,
    volume: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    volume: String,
    node: String,
    reason: String,
}

/// The content type of what `render` writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

fn counters(reg: &mut Registry, name: &str, help: &str) -> Family<VolumeLabels, Counter> {
    let f = Family::<VolumeLabels, Counter>::default();
    reg.register(name, help, f.clone());
    f
}

/// Every metric of this node, as its engines report themselves now.
pub async fn render(ctx: &NodeContext) -> Result<String, std::fmt::Error> {
    let mut reg = Registry::default();
    let up = Family::<VolumeLabels, Gauge>::default();
    reg.register(
        "ballast_engine_up",
        "1 when the volume's engine on this node runs and answers",
        up.clone(),
    );
    let awaiting = Family::<VolumeLabels, Gauge>::default();
    reg.register(
        "ballast_engine_awaiting_handover",
        "1 while the volume's engine on this node runs under an engine host that a new one replaced (a rollout of the engine host): it is handed over to the new host, one engine at a time",
        awaiting.clone(),
    );
    let families = [
        (
            "ballast_volume_read_ops",
            "Reads the volume's engine served",
        ),
        (
            "ballast_volume_read_bytes",
            "Bytes the volume's engine read",
        ),
        (
            "ballast_volume_read_latency_nanoseconds",
            "Time the volume's reads took, summed",
        ),
        (
            "ballast_volume_write_ops",
            "Writes the volume's engine acknowledged",
        ),
        (
            "ballast_volume_write_bytes",
            "Bytes the volume's engine wrote",
        ),
        (
            "ballast_volume_write_latency_nanoseconds",
            "Time the volume's writes took, summed",
        ),
        (
            "ballast_volume_checksum_failures",
            "Blocks found failing their checksum in one of the volume's replicas, by a read or a snapshot's freeze (once per replica and read): a disk, or the way to it, changed them",
        ),
        (
            "ballast_volume_repairs",
            "Blocks that failed their checksum in a replica and were written back to it from another replica, then read back sound",
        ),
        (
            "ballast_volume_unreadable_reads",
            "Reads that failed (EIO) because no replica held their blocks sound: that data is lost until it is written again",
        ),
        (
            "ballast_volume_lost_blocks",
            "Blocks a snapshot's freeze gave up as lost, so that the rest of the volume could be frozen and copied: each failed its checksum in the last replica that held it, no other replica held it sound, and it fails its reads until it is written again",
        ),
    ]
    .map(|(name, help)| counters(&mut reg, name, help));
    let expiry = Family::<CertificateLabels, Gauge>::default();
    reg.register(
        "ballast_certificate_expiry_timestamp_seconds",
        "When a certificate this node's members hold stops being valid (the node's own, renewed at each start of the node plugin and while it runs; each engine's, renewed in place by the controller; both before they expire), in seconds since the Unix epoch",
        expiry.clone(),
    );
    let certificate = |holder: &str, volume: Option<&str>| {
        if let Some(at) = ctx.engines.certificate_expiry(volume) {
            let l = CertificateLabels {
                node: ctx.node_id.clone(),
                holder: holder.to_string(),
                volume: volume.unwrap_or_default().to_string(),
            };
            expiry.get_or_create(&l).set(at);
        }
    };
    certificate("node", None);
    let waiting = ctx.engines.awaiting_handover().await;
    for e in ctx.engines.list().await {
        certificate("engine", Some(&e.volume));
        let l = VolumeLabels {
            volume: e.volume.clone(),
            node: ctx.node_id.clone(),
        };
        up.get_or_create(&l).set(i64::from(e.running));
        awaiting
            .get_or_create(&l)
            .set(i64::from(waiting.contains(&e.volume)));
        let io = e.io.unwrap_or_default();
        let values = [
            io.read_ops,
            io.read_bytes,
            io.read_ns,
            io.write_ops,
            io.write_bytes,
            io.write_ns,
            io.checksum_failures,
            io.repairs,
            io.unreadable_reads,
            io.lost_blocks,
        ];
        for (family, v) in families.iter().zip(values) {
            family.get_or_create(&l).inc_by(v);
        }
    }
    let refusals = Family::<RefusalLabels, Counter>::default();
    reg.register(
        "ballast_replica_refusals",
        "Opens and changes of a replica on this node that its server refused: reason denied (a change not from the volume's engine, or an open by a peer that is not its engine, its node or a reader of its volume) or fenced (an engine of an earlier attachment)",
        refusals.clone(),
    );
    if let Some(server) = &ctx.replicas {
        for (volume, why, n) in server.refusals() {
            let l = RefusalLabels {
                volume,
                node: ctx.node_id.clone(),
                reason: why.label().to_string(),
            };
            refusals.get_or_create(&l).inc_by(n);
        }
    }
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &reg)?;
    Ok(out)
}

/// Serves `/metrics` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    ctx: Arc<NodeContext>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let ctx = ctx.clone();
            async move {
                match render(&ctx).await {
                    Ok(text) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response(),
                    Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
                }
            }
        }),
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}
