//! `ballast controller`: opens the store, binds every listener (failing
//! fast on any), then serves the CSI socket, the agent endpoint and the
//! REST API until SIGTERM or SIGINT.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ballast::error::ServeError;
use ballast::proto::agent::v1::controlplane_server::ControlplaneServer;
use ballast::store::{RedbStore, Store};
use tokio::sync::watch;

use crate::context::Context;
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

#[derive(Clone, Debug)]
pub struct ControllerConfig {
    pub store: StoreSpec,
    pub csi_endpoint: String,
    pub api_listen: SocketAddr,
    pub agent_listen: SocketAddr,
    pub resync_interval: Duration,
    pub node_down_timeout: Duration,
}

fn open_store(spec: &StoreSpec) -> Result<Arc<dyn Store>, ServeError> {
    match spec {
        StoreSpec::Embedded(path) => Ok(Arc::new(RedbStore::open(path)?)),
        StoreSpec::Kubernetes => Err(ServeError::Config(
            "the kubernetes store backend is not in this release; use --store embedded:<path>"
                .into(),
        )),
    }
}

async fn bind_tcp(
    what: &'static str,
    addr: SocketAddr,
) -> Result<tokio::net::TcpListener, ServeError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind {
            what,
            addr: addr.to_string(),
            source,
        })
}

/// Runs the controller until a shutdown signal.
pub async fn run(config: ControllerConfig) -> Result<(), ServeError> {
    if config.node_down_timeout.is_zero() {
        return Err(ServeError::Config(
            "--node-down-timeout must be more than 0".into(),
        ));
    }
    let store = open_store(&config.store)?;
    let ctx = Context::new(store, config.node_down_timeout);
    let socket = ballast::grpc::unix_path(&config.csi_endpoint)?;
    let api = bind_tcp("REST API", config.api_listen).await?;
    let agent = bind_tcp("agent endpoint", config.agent_listen).await?;

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let ready = Arc::new(AtomicBool::new(false));
    let csi = crate::csi::serve(socket.clone(), ctx.clone(), ready.clone(), stopped())?;
    let agent_server = tonic::transport::Server::builder()
        .add_service(ControlplaneServer::new(ControlplaneService::new(
            ctx.clone(),
        )))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(agent),
            stopped(),
        );
    let api_server =
        axum::serve(api, crate::api::router(ctx.clone())).with_graceful_shutdown(stopped());
    let liveness = tokio::spawn(run_liveness(ctx.clone()));
    let reconcile = tokio::spawn(crate::executor::run_reconcile(
        ctx.clone(),
        config.resync_interval,
    ));
    let scrub = tokio::spawn(crate::executor::run_scrub(
        ctx.clone(),
        config.resync_interval,
    ));

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
    liveness.abort();
    scrub.abort();
    reconcile.abort();
    let (c, a, h) = tokio::join!(csi, agent_task, api_task);
    let _ = std::fs::remove_file(&socket);
    if let Ok(Err(e)) = c {
        tracing::warn!(error = %e, "CSI server ended with an error");
    }
    if let Ok(Err(e)) = a {
        tracing::warn!(error = %e, "agent server ended with an error");
    }
    if let Ok(Err(e)) = h {
        tracing::warn!(error = %e, "API server ended with an error");
    }
    tracing::info!("controller stopped");
    Ok(())
}
