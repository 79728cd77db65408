//! Kubernetes as the store of record and the control plane.
//!
//! Owns: the store backend over the API server (`store`: custom resources
//! of group `ballast.csi.dev`, each kind read from a watch cache kept by
//! `watch`, events as `events.k8s.io` Events), leader election (`lease`),
//! what Kubernetes Nodes say of Ballast's nodes (`nodes`), the drain guard
//! that makes `kubectl drain` wait (`drain_guard`), and how a
//! controller connects (`client`). It makes no storage decision: the
//! executor and the planner work on the `Store` trait, whatever is behind.

pub mod drain_guard;
mod events;
pub mod lease;
pub mod nodes;
mod objects;
pub mod secrets;
mod store;
mod watch;

pub use lease::{Elector, Timing};
pub use store::KubeStore;

/// What goes wrong connecting to a cluster.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("kubeconfig {path}: {reason}")]
    Kubeconfig { path: String, reason: String },
    #[error("no kubeconfig given and not in a cluster: {0}")]
    NoConfig(String),
    #[error("the API server: {0}")]
    Api(#[from] kube::Error),
    #[error(
        "the CRDs of ballast.csi.dev are not installed ({0}); install them with `ballast crds | kubectl apply -f -`"
    )]
    NoCrds(String),
    /// The cluster token's or CA's Secret is unusable (or could not be made).
    #[error("the cluster's secrets: {0}")]
    ClusterSecret(String),
}

/// A client for the cluster: from the kubeconfig file when one is given,
/// else from the pod's service account (in-cluster), else from the usual
/// kubeconfig places (`KUBECONFIG`, `~/.kube/config`).
pub async fn client(kubeconfig: Option<&std::path::Path>) -> Result<kube::Client, KubeError> {
    let config = match kubeconfig {
        Some(path) => {
            let bad = |reason: String| KubeError::Kubeconfig {
                path: path.display().to_string(),
                reason,
            };
            let file = kube::config::Kubeconfig::read_from(path).map_err(|e| bad(e.to_string()))?;
            kube::Config::from_custom_kubeconfig(file, &Default::default())
                .await
                .map_err(|e| bad(e.to_string()))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| KubeError::NoConfig(e.to_string()))?,
    };
    Ok(kube::Client::try_from(config)?)
}

/// Installs (or updates) every CRD of `ballast.csi.dev` by server-side
/// apply and waits until the API server serves them, for a cluster set up
/// by `ballast local --store kubernetes` and for tests. A cluster
/// installed from `deploy/` has them from its manifests.
pub async fn install_crds(client: &kube::Client) -> Result<(), KubeError> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Api, Patch, PatchParams};
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply("ballast").force();
    let mut names = Vec::new();
    for crd in ballast::crd::crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &params, &Patch::Apply(&crd)).await?;
        names.push(name);
    }
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    for name in names {
        loop {
            let crd = api.get(&name).await?;
            let established = crd
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                return Err(KubeError::NoCrds(format!("{name} not established in 60 s")));
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

/// Creates `namespace` unless it exists.
pub async fn ensure_namespace(client: &kube::Client, namespace: &str) -> Result<(), KubeError> {
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::{Api, ObjectMeta, PostParams};
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(namespace.to_string()),
            ..Default::default()
        },
        ..Default::default()
    };
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
