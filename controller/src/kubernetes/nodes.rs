//! Kubernetes Nodes as the source of truth about Ballast's nodes, on the
//! leader: a Ballast node named as a Kubernetes Node takes its zone from
//! the label `topology.kubernetes.io/zone`, and is `cordoned` exactly when
//! the Node is unschedulable (`kubectl cordon`, `kubectl drain`), so that
//! the drain policies, `autoEvicting` and `drainBlocked` follow them.
//!
//! The Nodes are followed by a watch (resumed from the last version, listed
//! again when it is too old); a Ballast node is written only when what
//! Kubernetes says differs from its record.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ballast::model::{Kind, Node};
use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use tokio::sync::watch;
use tokio_stream::StreamExt;

use super::objects::revision;
use crate::context::Context;
use crate::error::Error;

/// The label that names a Node's zone.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// What a Kubernetes Node says of the Ballast node of its name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Facts {
    pub zone: Option<String>,
    pub unschedulable: bool,
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
                    let all = list
                        .items
                        .iter()
                        .map(|n| (n.metadata.name.clone().unwrap_or_default(), facts_of(n)))
                        .collect();
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
                    facts.send_if_modified(|all| all.remove(&name).is_some());
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

/// Writes what `facts` say into the Ballast node `name`, if it exists and
/// differs.
async fn apply(ctx: &Context, name: &str, facts: &Facts) -> Result<(), Error> {
    let Some(node) = ctx.store.get::<Node>(name).await? else {
        return Ok(()); // not a Ballast node (yet)
    };
    let zone = facts.zone.as_ref().filter(|z| **z != node.spec.zone);
    if zone.is_none() && node.status.cordoned == facts.unschedulable {
        return Ok(());
    }
    ctx.store
        .modify::<Node, Error>(name, |n| {
            let before = (n.spec.zone.clone(), n.status.cordoned);
            if let Some(z) = &facts.zone {
                n.spec.zone = z.clone();
            }
            n.status.cordoned = facts.unschedulable;
            Ok(before != (n.spec.zone.clone(), n.status.cordoned))
        })
        .await?;
    let what = match (zone, facts.unschedulable) {
        (Some(z), _) => format!("zone {z} from the Kubernetes Node's label {ZONE_LABEL}"),
        (None, true) => "cordoned: the Kubernetes Node is unschedulable".to_string(),
        (None, false) => "uncordoned: the Kubernetes Node is schedulable".to_string(),
    };
    ctx.event(Kind::Node, name, "KubernetesNode", what).await;
    Ok(())
}
