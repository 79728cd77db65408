//! The drain guard: how `kubectl drain` meets the drain policy (BEHAVIOR.md
//! "Eviction and drain"). While a Ballast node is `drainBlocked`, a guard
//! pod runs on its Kubernetes Node, covered by a PodDisruptionBudget that
//! allows no disruption. A drain evicts every pod that no DaemonSet owns, so
//! it waits on the guard's eviction. As soon as the policy allows the drain,
//! the budget and the guard pod go, and the drain proceeds.
//!
//! On the leader. It decides nothing: `drainBlocked` is the planner's. It
//! calls the API server only when a node's `drainBlocked` changes (and
//! lists the guards once, at start, to learn what an earlier leader left).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ballast::model::{Kind, Node};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

use crate::context::Context;
use crate::error::Error;

/// The label of a guard pod and its budget; its value is the node's name.
pub const GUARD_LABEL: &str = "ballast.csi.dev/drain-guard";

/// The name of the guard pod and of its budget on `node`.
pub fn guard_name(node: &str) -> String {
    format!("ballast-drain-guard-{node}")
}

/// Where the guards live and what they run.
#[derive(Clone, Debug)]
pub struct Guards {
    pub namespace: String,
    /// The image of the guard pod (Ballast's own: `ballast guard`).
    pub image: String,
}

/// The image the guards run when none is given: this controller's own, as
/// its pod (`POD_NAME`) says, else `ballast:0.1.0`.
pub async fn own_image(client: &kube::Client, namespace: &str) -> String {
    let fallback = "ballast:0.1.0".to_string();
    let Ok(pod_name) = std::env::var("POD_NAME") else {
        return fallback;
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let Ok(pod) = pods.get(&pod_name).await else {
        return fallback;
    };
    pod.spec
        .and_then(|s| {
            s.containers.into_iter().find(|c| {
                c.args
                    .as_ref()
                    .is_some_and(|a| a.first().is_some_and(|x| x == "controller"))
            })
        })
        .and_then(|c| c.image)
        .unwrap_or(fallback)
}

fn guard_pod(node: &str, image: &str) -> Result<Pod, Error> {
    serde_json::from_value(json!({
        "metadata": {
            "name": guard_name(node),
            "labels": {GUARD_LABEL: node, "app.kubernetes.io/part-of": "ballast"},
        },
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            // A cordoned or tainted node keeps its guard.
            "tolerations": [{"operator": "Exists"}],
            "containers": [{
                "name": "guard",
                "image": image,
                "args": ["guard"],
                "resources": {"requests": {"cpu": "1m", "memory": "8Mi"}},
            }],
        },
    }))
    .map_err(|e| Error::Internal(format!("the guard pod of {node}: {e}")))
}

fn guard_budget(node: &str) -> Result<PodDisruptionBudget, Error> {
    serde_json::from_value(json!({
        "metadata": {
            "name": guard_name(node),
            "labels": {GUARD_LABEL: node, "app.kubernetes.io/part-of": "ballast"},
        },
        "spec": {
            "minAvailable": 1,
            "selector": {"matchLabels": {GUARD_LABEL: node}},
        },
    }))
    .map_err(|e| Error::Internal(format!("the guard budget of {node}: {e}")))
}

fn unavailable(e: kube::Error) -> Error {
    Error::Unavailable(format!("the API server: {e}"))
}

/// A create that finds the object there already is done.
fn created<T>(r: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// A delete that finds nothing is done.
fn deleted<T>(r: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

async fn raise(
    pods: &Api<Pod>,
    budgets: &Api<PodDisruptionBudget>,
    g: &Guards,
    node: &str,
) -> Result<(), Error> {
    let pp = PostParams::default();
    // The budget first: a guard pod is never there without it.
    created(budgets.create(&pp, &guard_budget(node)?).await).map_err(unavailable)?;
    created(pods.create(&pp, &guard_pod(node, &g.image)?).await).map_err(unavailable)
}

async fn lower(
    pods: &Api<Pod>,
    budgets: &Api<PodDisruptionBudget>,
    node: &str,
) -> Result<(), Error> {
    let dp = DeleteParams::default();
    deleted(budgets.delete(&guard_name(node), &dp).await).map_err(unavailable)?;
    deleted(pods.delete(&guard_name(node), &dp).await).map_err(unavailable)
}

/// Keeps a guard on every drain-blocked node, and none elsewhere: on every
/// change of a node's record, and every `resync` for what failed.
pub async fn run_guards(ctx: Arc<Context>, client: kube::Client, g: Guards, resync: Duration) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &g.namespace);
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client, &g.namespace);
    let mut changes = ctx.store.subscribe();
    // What an earlier leader left up.
    let mut up: BTreeSet<String> = loop {
        match budgets
            .list(&ListParams::default().labels(GUARD_LABEL))
            .await
        {
            Ok(list) => {
                break list
                    .items
                    .iter()
                    .filter_map(|b| b.metadata.labels.as_ref()?.get(GUARD_LABEL).cloned())
                    .collect();
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the drain guards; trying again");
                tokio::time::sleep(resync).await;
            }
        }
    };
    loop {
        if let Err(e) = pass(&ctx, &pods, &budgets, &g, &mut up).await {
            tracing::warn!(error = %e, "drain guards not in line with the nodes");
        }
        tokio::select! {
            got = changes.recv() => {
                if matches!(got, Err(tokio::sync::broadcast::error::RecvError::Closed)) {
                    return;
                }
            }
            _ = tokio::time::sleep(resync) => {}
        }
    }
}

/// One pass: raises the guards of nodes now drain-blocked, lowers the rest.
#[tracing::instrument(skip_all)]
async fn pass(
    ctx: &Context,
    pods: &Api<Pod>,
    budgets: &Api<PodDisruptionBudget>,
    g: &Guards,
    up: &mut BTreeSet<String>,
) -> Result<(), Error> {
    let nodes: Vec<Node> = ctx.store.list().await?;
    let blocked: BTreeSet<String> = nodes
        .iter()
        .filter(|n| n.status.drain_blocked)
        .map(|n| n.id.clone())
        .collect();
    for node in blocked.difference(&up.clone()) {
        raise(pods, budgets, g, node).await?;
        up.insert(node.clone());
        let why = nodes
            .iter()
            .find(|n| &n.id == node)
            .and_then(|n| n.status.drain_blocked_reason.clone())
            .unwrap_or_default();
        ctx.event(
            Kind::Node,
            node,
            "DrainGuardRaised",
            format!(
                "a drain of this node waits on pod {}: {why}",
                guard_name(node)
            ),
        )
        .await;
    }
    for node in up.clone().difference(&blocked) {
        lower(pods, budgets, node).await?;
        up.remove(node);
        ctx.event(
            Kind::Node,
            node,
            "DrainGuardLowered",
            "the drain policy allows a drain of this node now",
        )
        .await;
    }
    Ok(())
}
