//! `ballast controller`: opens the store, binds every listener (failing
//! fast on any), then serves the CSI socket, the agent endpoint and the
//! REST API until SIGTERM or SIGINT.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ballast::bearer::Tokens;
use ballast::cluster_token::ClusterToken;
use ballast::error::ServeError;
use ballast::proto::agent::v1::controlplane_server::ControlplaneServer;
use ballast::proto::agent::v1::enrollment_server::EnrollmentServer;
use ballast::store::{RedbStore, Store};
use ballast::tls::{Ca, Member, Role, Tls};
use tokio::sync::watch;

use crate::context::Context;
use crate::forward::{RoutedControlplane, Router};
use crate::nodes::{ControlplaneService, run_liveness};

/// Where the controller keeps its state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreSpec {
    /// A redb file.
    Embedded(PathBuf),
    /// Custom resources in the Kubernetes API.
    Kubernetes,
}

impl std::str::FromStr for StoreSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "kubernetes" {
            return Ok(StoreSpec::Kubernetes);
        }
        match s.strip_prefix("embedded:") {
            Some(p) if !p.is_empty() => Ok(StoreSpec::Embedded(PathBuf::from(p))),
            _ => Err(format!(
                "{s:?} is not a store; accepted values: embedded:<path>, kubernetes"
            )),
        }
    }
}

/// How the controller reaches a cluster when the store is Kubernetes.
#[derive(Clone, Debug, Default)]
pub struct KubeOptions {
    /// A kubeconfig file; None: in-cluster, else the usual places.
    pub kubeconfig: Option<PathBuf>,
    /// The namespace of Ballast's objects.
    pub namespace: String,
    /// Apply the CRDs (and create the namespace) at start, for a cluster
    /// not installed from `deploy/` (e.g. `ballast local --store kubernetes`).
    pub install_crds: bool,
    /// How long the leader's Lease lasts unrenewed (0: the default, 15 s).
    pub lease_duration: Duration,
    /// The agent endpoint the other controllers forward calls to
    /// (default: `http://` and `--agent-listen`).
    pub advertise: Option<String>,
    /// The image of the drain guard pods (default: this controller's own,
    /// read from its pod, else `ballast:0.1.0`).
    pub guard_image: Option<String>,
    /// The Secret holding the cluster token (made when missing).
    pub cluster_token_secret: Option<String>,
    /// The Secret holding the cluster CA (made when missing): TLS on.
    pub cluster_ca_secret: Option<String>,
}

#[derive(Clone, Debug)]
pub struct ControllerConfig {
    pub store: StoreSpec,
    pub kubernetes: KubeOptions,
    pub csi_endpoint: String,
    pub api_listen: SocketAddr,
    pub agent_listen: SocketAddr,
    pub resync_interval: Duration,
    pub node_down_timeout: Duration,
    /// A file holding the bearer token REST changes must carry.
    pub api_token_file: Option<PathBuf>,
    /// A file holding the cluster token of the agent endpoint and the node
    /// agents' calls.
    pub cluster_token_file: Option<PathBuf>,
    /// The directory of the cluster CA (`ca.crt`, `ca.key`; made when
    /// missing): TLS on.
    pub cluster_ca_dir: Option<PathBuf>,
    /// Running engines' certificates are renewed this many days before
    /// they expire.
    pub renew_engine_certificates_days: i64,
    /// With TLS on, its own certificate is renewed while it runs this
    /// many days before it expires (`certificate`).
    pub renew_certificate_days: i64,
}

/// The cluster token: from `--cluster-token-file`, or from the Secret of
/// `--cluster-token-secret` (Kubernetes store), when one is given.
async fn cluster_token(
    config: &ControllerConfig,
    client: Option<&kube::Client>,
) -> Result<ClusterToken, ServeError> {
    if let Some(path) = &config.cluster_token_file {
        let token = ClusterToken::read(path)
            .map_err(|e| ServeError::Config(format!("--cluster-token-file: {e}")))?;
        // A change of the file reaches every channel and gate.
        token.keep_reading();
        return Ok(token);
    }
    let Some(name) = &config.kubernetes.cluster_token_secret else {
        return Ok(ClusterToken::default());
    };
    let client = client.ok_or_else(|| {
        ServeError::Config("--cluster-token-secret needs --store kubernetes".into())
    })?;
    let token = crate::kubernetes::secrets::read_or_make_token(
        client.clone(),
        &config.kubernetes.namespace,
        name,
    )
    .await
    .map_err(|e| ServeError::Config(format!("--cluster-token-secret: {e}")))?;
    // A change of the Secret reaches every channel and gate.
    crate::kubernetes::secrets::keep_reading_token(
        client.clone(),
        &config.kubernetes.namespace,
        name,
        &token,
    );
    Ok(token)
}

/// The cluster CA, when TLS is on: from `--cluster-ca-dir`, or from the
/// Secret of `--cluster-ca-secret` (Kubernetes store). Nodes enroll with a
/// token, so TLS needs one.
async fn cluster_ca(
    config: &ControllerConfig,
    client: Option<&kube::Client>,
    token: &ClusterToken,
) -> Result<Option<Arc<Ca>>, ServeError> {
    let k = &config.kubernetes;
    if (config.cluster_ca_dir.is_some() || k.cluster_ca_secret.is_some()) && !token.is_set() {
        return Err(ServeError::Config(
            "TLS (--cluster-ca-dir or --cluster-ca-secret) needs a cluster token: nodes enroll with it".into(),
        ));
    }
    if let Some(dir) = &config.cluster_ca_dir {
        return Ca::in_dir(dir)
            .map(|ca| Some(Arc::new(ca)))
            .map_err(|e| ServeError::Config(format!("--cluster-ca-dir: {e}")));
    }
    let Some(name) = &k.cluster_ca_secret else {
        return Ok(None);
    };
    let (Some(client), Some(token_secret)) = (client, &k.cluster_token_secret) else {
        return Err(ServeError::Config(
            "--cluster-ca-secret needs --store kubernetes and --cluster-token-secret (where the nodes read the CA's certificate)".into(),
        ));
    };
    crate::kubernetes::secrets::read_or_make_ca(client.clone(), &k.namespace, name, token_secret)
        .await
        .map(|ca| Some(Arc::new(ca)))
        .map_err(|e| ServeError::Config(format!("--cluster-ca-secret: {e}")))
}

/// What this controller proves itself with: the token, and a certificate
/// of its own from the CA (new at every start) when TLS is on.
fn member(token: ClusterToken, ca: Option<&Ca>) -> Result<Member, ServeError> {
    let tls = match ca {
        Some(ca) => ca
            .issue(&Role::Controller)
            .and_then(Tls::on)
            .map_err(|e| ServeError::Config(format!("the controller's certificate: {e}")))?,
        None => Tls::default(),
    };
    Ok(Member { token, tls })
}

/// The REST gate: the token of `--api-token-file`, when given.
fn gate(config: &ControllerConfig) -> Result<crate::api::gate::Gate, ServeError> {
    let Some(path) = &config.api_token_file else {
        return Ok(crate::api::gate::Gate::default());
    };
    let token = Tokens::read(path, &crate::api::gate::API_TOKEN)
        .map_err(|e| ServeError::Config(format!("--api-token-file: {e}")))?;
    // A change of the file reaches the gate.
    token.keep_reading();
    Ok(crate::api::gate::Gate { token })
}

/// The store, and the cluster's client when the store is Kubernetes.
async fn open_store(
    config: &ControllerConfig,
) -> Result<(Arc<dyn Store>, Option<kube::Client>), ServeError> {
    match &config.store {
        StoreSpec::Embedded(path) => Ok((Arc::new(RedbStore::open(path)?), None)),
        StoreSpec::Kubernetes => {
            let k = &config.kubernetes;
            let client = crate::kubernetes::client(k.kubeconfig.as_deref())
                .await
                .map_err(kube_failed)?;
            if k.install_crds {
                crate::kubernetes::install_crds(&client)
                    .await
                    .map_err(kube_failed)?;
                crate::kubernetes::ensure_namespace(&client, &k.namespace)
                    .await
                    .map_err(kube_failed)?;
            }
            let store =
                crate::kubernetes::KubeStore::connect(client.clone(), &k.namespace, &instance())
                    .await
                    .map_err(kube_failed)?;
            Ok((Arc::new(store), Some(client)))
        }
    }
}

fn kube_failed(e: crate::kubernetes::KubeError) -> ServeError {
    ServeError::Config(e.to_string())
}

/// The context: on Kubernetes, this controller leads only while it holds
/// the Lease, and the election runs from now on.
fn context(
    config: &ControllerConfig,
    store: Arc<dyn Store>,
    client: Option<kube::Client>,
    member: Member,
    ca: Option<Arc<Ca>>,
) -> Arc<Context> {
    let Some(client) = client else {
        return Context::serving(store, config.node_down_timeout, member, ca);
    };
    let k = &config.kubernetes;
    let mut timing = crate::kubernetes::Timing::default();
    if !k.lease_duration.is_zero() {
        timing = crate::kubernetes::Timing {
            duration: k.lease_duration,
            renew_deadline: k.lease_duration * 2 / 3,
            retry: (k.lease_duration / 7).max(Duration::from_millis(200)),
        };
    }
    let endpoint = k
        .advertise
        .clone()
        .unwrap_or_else(|| format!("http://{}", config.agent_listen));
    let elector = crate::kubernetes::Elector::new(
        client.clone(),
        &k.namespace,
        &instance(),
        &endpoint,
        timing,
    );
    let ctx = Context::elected(
        store,
        config.node_down_timeout,
        elector.watch(),
        client,
        member,
        ca,
    );
    tokio::spawn(elector.run());
    ctx
}

/// Runs the leader's work (liveness, the reconcile loop, scrubs, and on
/// Kubernetes the sync of Kubernetes Nodes' facts) once this controller
/// leads. A leader that loses the Lease exits: what it had in
/// flight is the new leader's, and its restart starts as a follower.
fn lead(
    ctx: Arc<Context>,
    resync_interval: Duration,
    client: Option<kube::Client>,
    kube: KubeOptions,
) {
    tokio::spawn(async move {
        let mut changes = ctx.leadership_changes();
        if changes.wait_for(|l| l.leading).await.is_err() {
            return;
        }
        tracing::info!("leading: planning and acting");
        ctx.began_leading();
        tokio::spawn(run_liveness(ctx.clone()));
        tokio::spawn(crate::executor::run_reconcile(ctx.clone(), resync_interval));
        tokio::spawn(crate::executor::run_scrub(ctx.clone(), resync_interval));
        tokio::spawn(crate::executor::run_merge(ctx.clone(), resync_interval));
        if let Some(client) = client {
            tokio::spawn(crate::kubernetes::nodes::run_sync(
                ctx.clone(),
                client.clone(),
                resync_interval,
            ));
            let image = match kube.guard_image {
                Some(image) => image,
                None => crate::kubernetes::drain_guard::own_image(&client, &kube.namespace).await,
            };
            let guards = crate::kubernetes::drain_guard::Guards {
                namespace: kube.namespace.clone(),
                image,
            };
            tokio::spawn(crate::kubernetes::drain_guard::run_guards(
                ctx.clone(),
                client,
                guards,
                resync_interval,
            ));
        }
        if changes.wait_for(|l| !l.leading).await.is_ok() {
            tracing::error!("lost the lease to another controller; exiting");
            std::process::exit(1);
        }
    });
}

/// This controller's name in events: the pod's (`POD_NAME`), else the host's.
fn instance() -> String {
    std::env::var("POD_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
            Some(host.trim().to_string()).filter(|h| !h.is_empty())
        })
        .unwrap_or_else(|| "ballast-controller".into())
}

/// Runs the controller until a shutdown signal.
pub async fn run(config: ControllerConfig) -> Result<(), ServeError> {
    if config.node_down_timeout.is_zero() {
        return Err(ServeError::Config(
            "--node-down-timeout must be more than 0".into(),
        ));
    }
    let socket = ballast::grpc::unix_path(&config.csi_endpoint)?;
    let api = ballast::grpc::bind_tcp("REST API", config.api_listen).await?;
    let agent = ballast::grpc::bind_tcp("agent endpoint", config.agent_listen).await?;
    let (store, client) = open_store(&config).await?;
    let token = cluster_token(&config, client.as_ref()).await?;
    let ca = cluster_ca(&config, client.as_ref(), &token).await?;
    let member = member(token, ca.as_deref())?;
    let renewal = ca.clone().map(|ca| {
        tokio::spawn(crate::certificate::keep_renewing(
            member.tls.clone(),
            ca,
            config.renew_certificate_days,
        ))
    });
    let ctx = context(&config, store, client.clone(), member.clone(), ca);
    let router = Router::new(ctx.clone());

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let ready = Arc::new(AtomicBool::new(false));
    let csi = crate::csi::serve(
        socket.clone(),
        ctx.clone(),
        router.clone(),
        ready.clone(),
        stopped(),
    )?;
    // The agent endpoint serves the agent protocol, and the CSI Controller
    // service for the calls other controllers forward here.
    // Nodes (and their engines) and other controllers call the agent
    // protocol; only controllers forward CSI calls; a node without a
    // certificate may only enroll (when TLS is on).
    let agent_router = ballast::grpc::server()
        .add_service(ControlplaneServer::with_interceptor(
            RoutedControlplane::new(
                ControlplaneService::new(ctx.clone())
                    .renewing_engines_within(config.renew_engine_certificates_days),
                router.clone(),
            ),
            member.gate(&[Role::AnyNode, Role::Controller]),
        ))
        .add_service(tonic::service::interceptor::InterceptedService::new(
            crate::csi::routed(ctx.clone(), router),
            member.gate(&[Role::Controller]),
        ))
        .add_service(EnrollmentServer::with_interceptor(
            crate::nodes::EnrollmentService::new(ctx.clone()),
            member.token.gate(),
        ));
    let agent_server = {
        let (tls, stop) = (member.tls.clone(), stopped());
        async move { tls.serve(agent_router, agent, stop).await }
    };
    let api_server = axum::serve(api, crate::api::router_with(ctx.clone(), gate(&config)?))
        .with_graceful_shutdown(stopped());
    lead(
        ctx.clone(),
        config.resync_interval,
        client,
        config.kubernetes.clone(),
    );

    tracing::info!(
        store = ?config.store,
        csi = %socket.display(),
        api = %config.api_listen,
        agent = %config.agent_listen,
        node_down_timeout = ?config.node_down_timeout,
        resync_interval = ?config.resync_interval,
        "controller started"
    );
    ready.store(true, Ordering::SeqCst);

    let csi = tokio::spawn(csi);
    let agent_task = tokio::spawn(agent_server);
    let api_task = tokio::spawn(async move { api_server.await });
    ballast::grpc::shutdown_signal().await;
    let _ = stop_tx.send(true);
    if let Some(r) = renewal {
        r.abort();
    }
    let (c, a, h) = tokio::join!(csi, agent_task, api_task);
    let _ = std::fs::remove_file(&socket);
    ballast::grpc::ended("CSI server", c);
    ballast::grpc::ended("agent server", a);
    ballast::grpc::ended("API server", h);
    tracing::info!("controller stopped");
    Ok(())
}
