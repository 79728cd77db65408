//! What the controller's `/metrics` shows (prometheus-client, text
//! format): the model as an operator of Longhorn would look for it —
//! volumes (robustness, state, capacity, actual size), replicas (mode,
//! rebuild progress), nodes and disks (status, capacity, usage,
//! reservation, scheduled), and the planner (what it would do next, by
//! rule, and what waits blocked) — read from the controller's copy of the
//! records and planned at scrape time — and when the controller's
//! certificate and the cluster's CA expire. It writes nothing. The node
//! plugin's `/metrics` has the engines' I/O.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use ballast::model::{Node, Replica, ReplicaMode, Robustness, Volume, VolumeState};

use crate::context::Context;
use crate::error::Error;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VolumeLabels {
    volume: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReplicaLabels {
    volume: String,
    replica: String,
    node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModeLabels {
    volume: String,
    replica: String,
    node: String,
    mode: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    node: String,
    condition: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DiskLabels {
    node: String,
    disk: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabels {
    /// The rule as BEHAVIOR.md and the plan name it (`zone-balance`).
    rule: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HolderLabels {
    /// `controller` or `ca`.
    holder: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

/// A family of gauges registered under `name`.
fn family<L>(reg: &mut Registry, name: &str, help: &str) -> Family<L, Gauge>
where
    L: Clone + std::fmt::Debug + std::hash::Hash + Eq + EncodeLabelSet + Send + Sync + 'static,
{
    let f = Family::<L, Gauge>::default();
    reg.register(name, help, f.clone());
    f
}

fn gauge(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Longhorn's numbering: 0 unknown, 1 healthy, 2 degraded, 3 faulted.
fn robustness(r: Robustness) -> i64 {
    match r {
        Robustness::Unknown => 0,
        Robustness::Healthy => 1,
        Robustness::Degraded => 2,
        Robustness::Faulted => 3,
    }
}

/// Longhorn's numbering: 1 creating, 2 attached, 3 detached, 4
/// attaching, 5 detaching, 6 deleting.
fn state(s: VolumeState) -> i64 {
    match s {
        VolumeState::Creating => 1,
        VolumeState::Attached => 2,
        VolumeState::Detached => 3,
        VolumeState::Attaching => 4,
        VolumeState::Detaching => 5,
        VolumeState::Deleting => 6,
    }
}

/// A replica's rebuild progress, 0 to 100: 100 once it is rw.
fn progress(r: &Replica) -> i64 {
    match (r.status.mode, &r.status.rebuild_progress) {
        (Some(ReplicaMode::Rw), _) => 100,
        (_, Some(p)) => gauge(p.percent()),
        _ => 0,
    }
}

fn volumes<'a>(reg: &mut Registry, volumes: impl Iterator<Item = &'a Volume>) {
    let rob = family(
        reg,
        "ballast_volume_robustness",
        "Volume robustness: 0 unknown, 1 healthy, 2 degraded, 3 faulted",
    );
    let st = family(
        reg,
        "ballast_volume_state",
        "Volume state: 1 creating, 2 attached, 3 detached, 4 attaching, 5 detaching, 6 deleting",
    );
    let cap = family(reg, "ballast_volume_capacity_bytes", "Volume size");
    let actual = family(
        reg,
        "ballast_volume_actual_size_bytes",
        "Bytes the volume's data takes in each replica",
    );
    for v in volumes {
        let l = VolumeLabels {
            volume: v.name.clone(),
        };
        rob.get_or_create(&l).set(robustness(v.status.robustness));
        st.get_or_create(&l).set(state(v.status.state));
        cap.get_or_create(&l).set(gauge(v.spec.size));
        actual
            .get_or_create(&l)
            .set(gauge(v.status.actual_size.unwrap_or(0)));
    }
}

fn replicas<'a>(reg: &mut Registry, replicas: impl Iterator<Item = &'a Replica>) {
    let mode = family(
        reg,
        "ballast_replica_mode",
        "1 for the replica's mode (rw, wo: being rebuilt, err: failed, none: not opened by an engine)",
    );
    let prog = family(
        reg,
        "ballast_replica_rebuild_progress",
        "Rebuild progress, 0 to 100 (100 once rw)",
    );
    for r in replicas {
        let l = ReplicaLabels {
            volume: r.spec.volume.clone(),
            replica: r.name.clone(),
            node: r.spec.node_id.clone(),
        };
        prog.get_or_create(&l).set(progress(r));
        let m = ModeLabels {
            volume: l.volume,
            replica: l.replica,
            node: l.node,
            mode: r
                .status
                .mode
                .map_or_else(|| "none".to_string(), |m| m.to_string()),
        };
        mode.get_or_create(&m).set(1);
    }
}

fn nodes<'a>(reg: &mut Registry, nodes: impl Iterator<Item = &'a Node>) {
    let status = family(
        reg,
        "ballast_node_status",
        "1 when the node meets the condition (ready, schedulable, cordoned)",
    );
    let cap = family(
        reg,
        "ballast_disk_capacity_bytes",
        "Size of the disk's filesystem",
    );
    let usage = family(
        reg,
        "ballast_disk_usage_bytes",
        "Bytes used on the disk's filesystem",
    );
    let reserved = family(
        reg,
        "ballast_disk_reservation_bytes",
        "Bytes of the disk kept from replicas (storageReserved)",
    );
    let scheduled = family(
        reg,
        "ballast_disk_scheduled_bytes",
        "Bytes the disk's replicas may grow to",
    );
    for n in nodes {
        for (condition, yes) in [
            ("ready", n.status.ready),
            ("schedulable", n.spec.allow_scheduling),
            ("cordoned", n.status.cordoned),
        ] {
            let l = NodeLabels {
                node: n.id.clone(),
                condition: condition.into(),
            };
            status.get_or_create(&l).set(i64::from(yes));
        }
        for (id, d) in &n.status.disks {
            let l = DiskLabels {
                node: n.id.clone(),
                disk: id.clone(),
            };
            cap.get_or_create(&l).set(gauge(d.storage_maximum));
            usage
                .get_or_create(&l)
                .set(gauge(d.storage_maximum.saturating_sub(d.storage_available)));
            scheduled.get_or_create(&l).set(gauge(d.storage_scheduled));
            let spec = n.spec.disks.get(id).map_or(0, |s| s.storage_reserved);
            reserved.get_or_create(&l).set(gauge(spec));
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReadyLabels {
    ready: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RobustnessLabels {
    robustness: String,
}

/// The first release's counts, under their names (kept: scrapers use them).
fn counts<'a>(
    reg: &mut Registry,
    nodes: impl Iterator<Item = &'a Node> + Clone,
    volumes: impl Iterator<Item = &'a Volume> + Clone,
    replicas: impl Iterator<Item = &'a Replica>,
) {
    let by_ready = family(
        reg,
        "ballast_nodes",
        "Nodes known to the controller, by readiness",
    );
    for ready in [true, false] {
        by_ready
            .get_or_create(&ReadyLabels {
                ready: ready.to_string(),
            })
            .set(gauge(
                nodes.clone().filter(|n| n.status.ready == ready).count() as u64,
            ));
    }
    let by_rob = family(reg, "ballast_volumes", "Volumes, by robustness");
    for r in Robustness::ALL {
        by_rob
            .get_or_create(&RobustnessLabels {
                robustness: r.to_string(),
            })
            .set(gauge(
                volumes
                    .clone()
                    .filter(|v| v.status.robustness == *r)
                    .count() as u64,
            ));
    }
    let count = Gauge::<i64>::default();
    count.set(gauge(replicas.count() as u64));
    reg.register("ballast_replicas", "Replica records", count);
    let max = family(
        reg,
        "ballast_disk_storage_maximum_bytes",
        "Size of each disk's filesystem",
    );
    let avail = family(
        reg,
        "ballast_disk_storage_available_bytes",
        "Free bytes of each disk's filesystem",
    );
    for n in nodes {
        for (id, d) in &n.status.disks {
            let l = DiskLabels {
                node: n.id.clone(),
                disk: id.clone(),
            };
            max.get_or_create(&l).set(gauge(d.storage_maximum));
            avail.get_or_create(&l).set(gauge(d.storage_available));
        }
    }
}

/// The content type of what `render` writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The registry of every metric, filled from the store and a dry-run plan.
pub async fn render(ctx: &Context) -> Result<String, Error> {
    let settings = ctx.settings().await?;
    let mut reg = Registry::default();
    // From the controller's copy of the records, brought up to date first
    // (on Kubernetes it can be a watch event behind): a scrape does not
    // decode the whole store.
    let view = {
        let mirror = ctx.records().await?;
        let (n, v, r) = (mirror.nodes(), mirror.volumes(), mirror.replicas());
        counts(&mut reg, n.clone(), v.clone(), r.clone());
        volumes(&mut reg, v);
        replicas(&mut reg, r);
        nodes(&mut reg, n);
        crate::observe::mirrored_view(&mirror)
    };
    let plan = crate::planner::plan(&view, &settings, ctx.now());
    let next = family(
        &mut reg,
        "ballast_planner_actions",
        "What the planner would do now, by rule",
    );
    let blocked = family(
        &mut reg,
        "ballast_planner_blocked",
        "What waits blocked now, by rule",
    );
    for a in &plan.actions {
        next.get_or_create(&RuleLabels {
            rule: a.rule.name().to_string(),
        })
        .inc();
    }
    for b in &plan.blocked {
        blocked
            .get_or_create(&RuleLabels {
                rule: b.rule.name().to_string(),
            })
            .inc();
    }
    let waits = family(
        &mut reg,
        "ballast_planner_waits",
        "What the planner waits for on purpose now (a failed replica whose node may come back), by rule",
    );
    for w in &plan.waits {
        waits
            .get_or_create(&RuleLabels {
                rule: w.rule.name().to_string(),
            })
            .inc();
    }
    let failures = family::<ReasonLabels>(
        &mut reg,
        "ballast_executor_failures",
        "Failed actions and rebuilds the store's events record, by reason",
    );
    let events: Vec<ballast::model::Event> = ctx.store.list().await?;
    for e in events
        .iter()
        .filter(|e| e.reason == "ActionFailed" || e.reason == "RebuildFailed")
    {
        failures
            .get_or_create(&ReasonLabels {
                reason: e.reason.clone(),
            })
            .inc();
    }
    certificates(&mut reg, ctx);
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &reg)
        .map_err(|e| Error::Internal(format!("encoding the metrics: {e}")))?;
    Ok(out)
}

/// When this controller's certificate (renewed at each start and while it runs) and the
/// cluster's CA stop being valid; nothing with TLS off.
fn certificates(reg: &mut Registry, ctx: &Context) {
    let expiry = family::<HolderLabels>(
        reg,
        "ballast_certificate_expiry_timestamp_seconds",
        "When a certificate stops being valid: this controller's own (renewed at each start and while it runs) or the cluster's CA, in seconds since the Unix epoch",
    );
    let own = ctx.member.tls.credentials().map(|c| c.cert_pem.clone());
    let ca = ctx.ca.as_ref().map(|ca| ca.cert_pem().to_string());
    for (holder, pem) in [("controller", own), ("ca", ca)] {
        if let Some(at) = pem.and_then(|p| ballast::tls::not_after(&p).ok()) {
            expiry
                .get_or_create(&HolderLabels {
                    holder: holder.to_string(),
                })
                .set(at);
        }
    }
}
