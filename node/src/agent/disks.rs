//! Which disks the node opens: those of its Ballast Node's spec, and its
//! default disks — those its platform names (on Kubernetes, the Node's
//! annotation `ballast.csi.dev/default-disks`), else its `--disk` flags.
//! The controller answers for the spec and the platform; a controller that
//! cannot be reached leaves the node to its flags.

use std::time::Duration;

use ballast::cluster_token::Authed;
use ballast::proto::agent::v1::controlplane_client::ControlplaneClient;
use ballast::proto::agent::v1::{DiskPlacement, NodeDisksRequest, NodeDisksResponse};

use crate::disks::DiskArg;

/// How long the node waits for the controller's answer before it opens its
/// flags' disks alone.
const ASK_FOR: Duration = Duration::from_secs(10);

fn arg(p: &DiskPlacement) -> DiskArg {
    DiskArg {
        path: p.path.clone().into(),
        tags: p.tags.clone(),
    }
}

/// The spec's disks, then the defaults (the platform's, else `flags`),
/// each directory once (the first mention's tags win; paths are compared
/// as the filesystem resolves them).
pub fn merge(answer: &NodeDisksResponse, flags: &[DiskArg]) -> Vec<DiskArg> {
    let defaults: Vec<DiskArg> = if answer.defaults.is_empty() {
        flags.to_vec()
    } else {
        answer.defaults.iter().map(arg).collect()
    };
    let resolved = |d: &DiskArg| std::fs::canonicalize(&d.path).unwrap_or_else(|_| d.path.clone());
    let mut out: Vec<DiskArg> = Vec::new();
    for d in answer.spec.iter().map(arg).chain(defaults) {
        if !out.iter().any(|o| resolved(o) == resolved(&d)) {
            out.push(d);
        }
    }
    out
}

/// Asks the controller which disks to open, for up to [`ASK_FOR`].
pub async fn disks_to_open(controller: &Authed, node_id: &str, flags: &[DiskArg]) -> Vec<DiskArg> {
    let mut client = ControlplaneClient::new(controller.clone());
    let ask = async {
        loop {
            let req = NodeDisksRequest {
                node_id: node_id.to_string(),
            };
            match client.node_disks(req).await {
                Ok(r) => return Ok(r.into_inner()),
                // A refusal (a bad annotation) is the operator's to fix.
                Err(s) if s.code() == tonic::Code::InvalidArgument => return Err(s),
                Err(s) => {
                    tracing::debug!(error = %s, "asking the controller for this node's disks");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    };
    match tokio::time::timeout(ASK_FOR, ask).await {
        Ok(Ok(answer)) => {
            let disks = merge(&answer, flags);
            tracing::info!(
                spec = answer.spec.len(),
                defaults_from = if answer.defaults_from.is_empty() { "the --disk flags" } else { answer.defaults_from.as_str() },
                disks = ?disks.iter().map(|d| d.path.display().to_string()).collect::<Vec<_>>(),
                "disks to open"
            );
            disks
        }
        Ok(Err(refused)) => {
            tracing::error!(error = %refused.message(), "the controller refused this node's default disks; opening the --disk flags' disks");
            flags.to_vec()
        }
        Err(_) => {
            tracing::warn!(
                "the controller did not answer which disks to open within {ASK_FOR:?}; opening the --disk flags' disks"
            );
            flags.to_vec()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(path: &str, tags: &[&str]) -> DiskPlacement {
        DiskPlacement {
            path: path.into(),
            tags: tags.iter().map(|t| t.to_string()).collect(),
        }
    }

    fn paths(d: &[DiskArg]) -> Vec<String> {
        d.iter().map(|d| d.path.display().to_string()).collect()
    }

    #[test]
    fn the_spec_comes_first_then_the_platform_defaults_else_the_flags() {
        let flags: Vec<DiskArg> = vec!["/flag:hdd".parse().unwrap(), "/a".parse().unwrap()];
        let none = NodeDisksResponse::default();
        assert_eq!(merge(&none, &flags), flags);
        let spec = NodeDisksResponse {
            spec: vec![p("/a", &["ssd"]), p("/b", &[])],
            ..Default::default()
        };
        let got = merge(&spec, &flags);
        assert_eq!(paths(&got), ["/a", "/b", "/flag"]);
        assert_eq!(got[0].tags, ["ssd"], "the spec's tags win");
        let annotated = NodeDisksResponse {
            spec: vec![p("/b", &[])],
            defaults: vec![p("/ann", &["nvme"])],
            defaults_from: "annotation".into(),
        };
        assert_eq!(paths(&merge(&annotated, &flags)), ["/b", "/ann"]);
    }
}
