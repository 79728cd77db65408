//! Kubernetes Nodes as the source of truth about Ballast's nodes, on the
//! leader: a Ballast node named as a Kubernetes Node takes its zone from
//! the label `topology.kubernetes.io/zone`, and is `cordoned` exactly when
//! the Node is unschedulable (`kubectl cordon`, `kubectl drain`), so that
//! the drain policies, `autoEvicting` and `drainBlocked` follow them. A
//! Node that is deleted, or NotReady for longer than the node-down
//! timeout, holds its Ballast node down (`status.heldDown`): not ready,
//! whatever its heartbeats say, until the Node is Ready again.
//!
//! The Nodes are followed by a watch (resumed from the last version, listed
//! again when it is too old); a Ballast node is written only when what
//! Kubernetes says differs from its record.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ballast::model::{Kind, Node};
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use tokio::sync::watch;
use tokio_stream::StreamExt;

use super::objects::revision;
use crate::context::Context;
use crate::error::Error;

/// The label that names a Node's zone.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// The annotation that names a Node's default disks, as JSON:
/// `[{"path": "/var/lib/ballast", "tags": ["ssd"]}]`.
pub const DEFAULT_DISKS_ANNOTATION: &str = "ballast.csi.dev/default-disks";

/// One default disk of [`DEFAULT_DISKS_ANNOTATION`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DefaultDisk {
    pub path: String,
    #[serde(default)]
    pub tags: Vec<String>,
}

/// The default disks of an annotation's value.
pub fn parse_default_disks(node: &str, value: &str) -> Result<Vec<DefaultDisk>, Error> {
    let field = format!("Kubernetes Node {node}: annotation {DEFAULT_DISKS_ANNOTATION}");
    let disks: Vec<DefaultDisk> = serde_json::from_str(value).map_err(|e| {
        Error::invalid(
            &field,
            format!("{e}; expected JSON such as [{{\"path\": \"/var/lib/ballast\", \"tags\": [\"ssd\"]}}]"),
        )
    })?;
    if let Some(d) = disks.iter().find(|d| !d.path.starts_with('/')) {
        return Err(Error::invalid(
            &field,
            format!("path {:?} is not absolute", d.path),
        ));
    }
    Ok(disks)
}

/// The default disks the Kubernetes Node `name` names, if it names any.
pub async fn default_disks(
    client: &kube::Client,
    name: &str,
) -> Result<Option<Vec<DefaultDisk>>, Error> {
    let api: Api<KubeNode> = Api::all(client.clone());
    let node = api
        .get_opt(name)
        .await
        .map_err(|e| Error::Unavailable(format!("reading Kubernetes Node {name}: {e}")))?;
    let value = node.and_then(|n| {
        n.metadata
            .annotations
            .and_then(|a| a.get(DEFAULT_DISKS_ANNOTATION).cloned())
    });
    value.map(|v| parse_default_disks(name, &v)).transpose()
}

/// What a Kubernetes Node says of the Ballast node of its name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Facts {
    pub zone: Option<String>,
    pub unschedulable: bool,
    /// Since when the Node's Ready condition has not been True (None: it
    /// is True, or the Node has no such condition, as with no kubelet).
    pub not_ready_since: Option<DateTime<Utc>>,
    /// The Node was deleted.
    pub deleted: bool,
}

fn facts_of(n: &KubeNode) -> Facts {
    Facts {
        zone: n
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(ZONE_LABEL).cloned())
            .filter(|z| !z.is_empty()),
        unschedulable: n
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false),
        not_ready_since: n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .filter(|c| c.status != "True")
            .map(|c| {
                c.last_transition_time
                    .as_ref()
                    .and_then(|t| {
                        DateTime::from_timestamp(t.0.as_second(), t.0.subsec_nanosecond() as u32)
                    })
                    .unwrap_or_else(Utc::now)
            }),
        deleted: false,
    }
}

/// A Node seen before and gone now.
fn deleted() -> Facts {
    Facts {
        deleted: true,
        ..Facts::default()
    }
}

type AllFacts = BTreeMap<String, Facts>;

/// Follows the Kubernetes Nodes for ever, publishing their facts.
async fn follow(api: Api<KubeNode>, facts: watch::Sender<AllFacts>) {
    let mut from: Option<String> = None;
    loop {
        let version = match &from {
            Some(v) => v.clone(),
            None => match api.list(&ListParams::default()).await {
                Ok(list) => {
                    let mut all: AllFacts = list
                        .items
                        .iter()
                        .map(|n| (n.metadata.name.clone().unwrap_or_default(), facts_of(n)))
                        .collect();
                    // Nodes deleted while no watch was open.
                    for name in facts.borrow().keys() {
                        all.entry(name.clone()).or_insert_with(deleted);
                    }
                    facts.send_replace(all);
                    list.metadata.resource_version.unwrap_or_default()
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot list Kubernetes Nodes; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            },
        };
        from = Some(version.clone());
        let stream = match api
            .watch(&WatchParams::default().timeout(290), &version)
            .await
        {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch Kubernetes Nodes; listing again");
                from = None;
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(WatchEvent::Added(n) | WatchEvent::Modified(n)) => {
                    let name = n.metadata.name.clone().unwrap_or_default();
                    from = n.metadata.resource_version.clone().or(from);
                    let f = facts_of(&n);
                    facts.send_if_modified(|all| all.insert(name, f.clone()) != Some(f));
                }
                Ok(WatchEvent::Deleted(n)) => {
                    let name = n.metadata.name.clone().unwrap_or_default();
                    from = n.metadata.resource_version.clone().or(from);
                    facts.send_if_modified(|all| all.insert(name, deleted()) != Some(deleted()));
                }
                Ok(WatchEvent::Bookmark(b)) => from = Some(b.metadata.resource_version),
                Ok(WatchEvent::Error(status)) => {
                    if status.code == 410 {
                        from = None; // too old: list again
                    }
                    break;
                }
                Err(_) => break,
            }
        }
        if from.as_deref().map(revision) == Some(0) {
            from = None;
        }
    }
}

/// Keeps the Ballast nodes in line with the Kubernetes Nodes, on every
/// change of a Node and every `resync`.
pub async fn run_sync(ctx: Arc<Context>, client: kube::Client, resync: Duration) {
    let (tx, mut rx) = watch::channel(AllFacts::new());
    tokio::spawn(follow(Api::all(client), tx));
    loop {
        let all = rx.borrow_and_update().clone();
        for (name, facts) in &all {
            if let Err(e) = apply(&ctx, name, facts).await {
                tracing::warn!(node = %name, error = %e, "cannot apply the Kubernetes Node's facts");
            }
        }
        tokio::select! {
            _ = rx.changed() => {}
            _ = tokio::time::sleep(resync) => {}
        }
    }
}

/// Why `facts` hold their node down at `now`, if they do.
fn held_down(facts: &Facts, now: DateTime<Utc>, timeout: Duration) -> Option<String> {
    if facts.deleted {
        return Some("its Kubernetes Node was deleted".to_string());
    }
    let since = facts.not_ready_since?;
    let timeout = chrono::Duration::from_std(timeout).unwrap_or(chrono::Duration::MAX);
    (now - since > timeout).then(|| {
        format!(
            "its Kubernetes Node has been NotReady since {} (longer than the node-down timeout)",
            since.to_rfc3339()
        )
    })
}

/// Writes what `facts` say into the Ballast node `name`, if it exists and
/// differs.
async fn apply(ctx: &Context, name: &str, facts: &Facts) -> Result<(), Error> {
    let Some(node) = ctx.store.get::<Node>(name).await? else {
        return Ok(()); // not a Ballast node (yet)
    };
    let down = held_down(facts, ctx.now(), ctx.node_down_timeout);
    let zone = facts.zone.as_ref().filter(|z| **z != node.spec.zone);
    let cordoned = if facts.deleted {
        node.status.cordoned
    } else {
        facts.unschedulable
    };
    if zone.is_none() && node.status.cordoned == cordoned && node.status.held_down == down {
        return Ok(());
    }
    ctx.store
        .modify::<Node, Error>(name, |n| {
            let before = (
                n.spec.zone.clone(),
                n.status.cordoned,
                n.status.held_down.clone(),
            );
            if let Some(z) = &facts.zone {
                n.spec.zone = z.clone();
            }
            n.status.cordoned = cordoned;
            n.status.held_down = down.clone();
            if down.is_some() {
                n.status.ready = false;
            }
            Ok(before
                != (
                    n.spec.zone.clone(),
                    n.status.cordoned,
                    n.status.held_down.clone(),
                ))
        })
        .await?;
    let mut what = Vec::new();
    if let Some(z) = zone {
        what.push(format!(
            "zone {z} from the Kubernetes Node's label {ZONE_LABEL}"
        ));
    }
    if node.status.cordoned != cordoned {
        what.push(if cordoned {
            "cordoned: the Kubernetes Node is unschedulable".to_string()
        } else {
            "uncordoned: the Kubernetes Node is schedulable".to_string()
        });
    }
    if node.status.held_down != down {
        what.push(match &down {
            Some(why) => format!("down: {why}"),
            None => "no longer held down: the Kubernetes Node is Ready; ready again at its next heartbeat".to_string(),
        });
    }
    if !what.is_empty() {
        ctx.event(Kind::Node, name, "KubernetesNode", what.join("; "))
            .await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().into()
    }

    #[test]
    fn default_disks_are_json_with_absolute_paths_and_a_bad_one_names_the_annotation() {
        let d = parse_default_disks("n", r#"[{"path": "/a", "tags": ["ssd"]}, {"path": "/b"}]"#)
            .unwrap();
        assert_eq!(d[0].tags, ["ssd"]);
        assert!(d[1].tags.is_empty());
        for bad in ["/a", r#"[{"path": "a"}]"#, r#"[{"path": "/a", "size": 1}]"#] {
            let e = parse_default_disks("n", bad).unwrap_err().to_string();
            assert!(e.contains(DEFAULT_DISKS_ANNOTATION), "{e}");
        }
    }

    #[test]
    fn a_node_is_held_down_when_deleted_or_not_ready_past_the_timeout() {
        let timeout = Duration::from_secs(30);
        let now = at("2026-01-01T00:01:00Z");
        assert_eq!(held_down(&Facts::default(), now, timeout), None);
        assert!(
            held_down(&deleted(), now, timeout)
                .unwrap()
                .contains("deleted")
        );
        let recent = Facts {
            not_ready_since: Some(at("2026-01-01T00:00:40Z")),
            ..Facts::default()
        };
        assert_eq!(held_down(&recent, now, timeout), None);
        let long = Facts {
            not_ready_since: Some(at("2026-01-01T00:00:20Z")),
            ..Facts::default()
        };
        assert!(
            held_down(&long, now, timeout)
                .unwrap()
                .contains("NotReady since")
        );
    }

    #[test]
    fn the_ready_condition_gives_since_when_a_node_is_not_ready() {
        let node: KubeNode = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n"},
            "status": {"conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {"type": "Ready", "status": "Unknown", "lastTransitionTime": "2026-01-01T00:00:20Z"},
            ]},
        }))
        .unwrap();
        assert_eq!(
            facts_of(&node).not_ready_since,
            Some(at("2026-01-01T00:00:20Z"))
        );
        let ready: KubeNode = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }))
        .unwrap();
        assert_eq!(facts_of(&ready).not_ready_since, None);
    }
}
