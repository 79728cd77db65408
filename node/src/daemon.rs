//! `ballast node`: binds its ports (failing fast), enrolls (TLS on), asks
//! the controller which disks to open, opens them, then
//! registers with the controller, heartbeats, and serves the CSI socket and
//! the agent endpoint until SIGTERM or SIGINT.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use ballast::cluster_token::{Authed, ClusterToken};
use ballast::error::ServeError;
use ballast::proto::agent::v1::node_agent_server::NodeAgentServer;
use ballast::tls::{Member, Role, Tls};
use tokio::sync::watch;

use crate::agent::{NodeAgentService, run_heartbeats};
use crate::context::NodeContext;
use crate::disks::{DiskArg, open_disks};
use crate::wire::readers::Readers;
use crate::wire::tls::WireTls;

#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub node_id: String,
    pub zone: String,
    pub tags: Vec<String>,
    pub disks: Vec<DiskArg>,
    /// `http://host:port` of the controller's agent endpoint.
    pub controller: String,
    pub csi_endpoint: String,
    pub agent_listen: SocketAddr,
    pub replica_listen: SocketAddr,
    pub state_dir: Option<PathBuf>,
    /// The kubelet's directory: CSI staging and target paths lie below it
    /// (or below the state directory).
    pub kubelet_dir: PathBuf,
    /// The cluster token's file (see `ballast::cluster_token`).
    pub cluster_token_file: Option<PathBuf>,
    /// The cluster CA's certificate: TLS on, the node enrolls at start
    /// (see `ballast::tls`).
    pub cluster_ca_file: Option<PathBuf>,
    /// Credentials issued by other means: TLS on, without enrolling.
    pub tls_dir: Option<PathBuf>,
    /// The most volumes published here at once (0: no limit).
    pub max_volumes: u32,
    /// Start a replica head's writeback after this many bytes written (0:
    /// left to the kernel).
    pub writeback_every: u64,
    /// Async worker threads of each engine (0: one per core, at most 4).
    pub engine_workers: u16,
    /// The engine host's socket (`unix://…`): engines are started there,
    /// so that they outlive this process's group and container.
    pub engine_host: Option<String>,
    /// Where `/metrics` is served (HTTP), if anywhere.
    pub metrics_listen: Option<SocketAddr>,
    /// With TLS on, the node's certificate is renewed while it runs this
    /// many days before it expires (`agent::renewal`).
    pub renew_certificate_days: i64,
}

/// Runs the node plugin until a shutdown signal.
pub async fn run(config: NodeConfig) -> Result<(), ServeError> {
    let _nudger = crate::nudge::Nudger::start(tokio::runtime::Handle::current());
    ballast::model::validate_name(&config.node_id)
        .map_err(|m| ServeError::Config(format!("--node-id: {m}")))?;
    // The checksums' way for this CPU, timed at the start rather than in
    // the first read a replica verifies.
    let way = crate::replica::SumWay::of_this_cpu();
    tracing::info!(node = %config.node_id, ?way, "block checksums");
    // Sockets and engine files; by default in the temporary directory.
    let state_dir = config
        .state_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("ballast-{}", config.node_id)));
    std::fs::create_dir_all(&state_dir).map_err(|source| ServeError::Io {
        path: state_dir.clone(),
        source,
    })?;
    let socket = ballast::grpc::unix_path(&config.csi_endpoint)?;
    // Its ports first: a taken or bad address fails at once, before the
    // node enrolls or asks the controller anything.
    let agent = ballast::grpc::bind_tcp("agent endpoint", config.agent_listen).await?;
    let replica_listener =
        ballast::grpc::bind_tcp("replica endpoint", config.replica_listen).await?;
    let metrics_listener = match config.metrics_listen {
        Some(addr) => Some(ballast::grpc::bind_tcp("metrics endpoint", addr).await?),
        None => None,
    };
    let token = match &config.cluster_token_file {
        Some(path) => ClusterToken::read(path)
            .map_err(|e| ServeError::Config(format!("--cluster-token-file: {e}")))?,
        None => ClusterToken::default(),
    };
    // A change of the file reaches every channel and gate.
    token.keep_reading();
    let (tls, tls_dir) = node_tls(&config, &state_dir, &token).await?;
    let credentials = tls.credentials();
    let member = Member { token, tls };
    // Every call to the controller carries the cluster token (and this
    // node's certificate).
    let controller = member.channel(&config.controller, &Role::Controller)?;
    // Fills read other nodes' replicas with readers' certificates, which
    // the controller gives.
    let wire = match (credentials, member.tls.slot()) {
        (Some(c), Some(slot)) => WireTls::showing(&c, &config.node_id, slot)
            .map_err(|e| ServeError::Config(format!("TLS: {e}")))?
            .reading_through(Readers::new(controller.clone(), &config.node_id, &c.ca_pem)),
        _ => WireTls::default(),
    };
    let disks = open_wanted_disks(&config, &controller, &state_dir).await?;
    let replica_server = crate::server::ReplicaServer::serving_with(
        crate::replica::Replicas::with_writeback(
            disks.iter().map(|d| d.path.clone()).collect(),
            config.writeback_every,
        ),
        wire,
    );
    let ctx = context(
        &config,
        &state_dir,
        &socket,
        disks,
        replica_server.clone(),
        tls_dir,
    )?;
    ctx.engines.adopt().await;
    let table = replica_server.replicas().clone();
    let replica_task = tokio::spawn(replica_server.serve(replica_listener));

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    if let Some(l) = metrics_listener {
        let (ctx, stop) = (ctx.clone(), stopped());
        tokio::spawn(async move {
            if let Err(e) = crate::metrics::serve(l, ctx, stop).await {
                tracing::error!(error = %e, "metrics endpoint ended");
            }
        });
    }
    let csi = tokio::spawn(crate::csi::serve(
        socket.clone(),
        ctx.clone(),
        state_dir.clone(),
        config.kubelet_dir.clone(),
        stopped(),
    )?);
    // Only controllers call the node agent.
    let agent_router = ballast::grpc::server().add_service(NodeAgentServer::with_interceptor(
        NodeAgentService::new(ctx.clone()),
        member.gate(&[Role::Controller]),
    ));
    let agent_server = {
        let (tls, stop) = (member.tls.clone(), stopped());
        tokio::spawn(async move { tls.serve(agent_router, agent, stop).await })
    };
    let (renewed, renewals) = watch::channel(0u64);
    let heartbeats = tokio::spawn(run_heartbeats(
        ctx.clone(),
        controller,
        crate::agent::Reconnect {
            member: member.clone(),
            url: config.controller.clone(),
            renewed: renewals,
        },
    ));
    let renewal = member.tls.is_on().then(|| {
        tokio::spawn(
            crate::agent::Renewal {
                tls: member.tls.clone(),
                source: renewal_source(&config, &state_dir, &member.token),
                days: config.renew_certificate_days,
                renewed,
            }
            .run(),
        )
    });
    tracing::info!(
        node = %ctx.node_id,
        zone = %ctx.zone,
        disks = ?ctx.disks.iter().map(|d| format!("{}={}", d.id, d.path.display())).collect::<Vec<_>>(),
        csi = %socket.display(),
        agent = %config.agent_listen,
        controller = %config.controller,
        "node started"
    );

    ballast::grpc::shutdown_signal().await;
    let _ = stop_tx.send(true);
    heartbeats.abort();
    if let Some(r) = renewal {
        r.abort();
    }
    replica_task.abort();
    let (c, a) = tokio::join!(csi, agent_server);
    let _ = std::fs::remove_file(&socket);
    ballast::grpc::ended("CSI server", c);
    ballast::grpc::ended("agent server", a);
    // Every replica it holds open is closed clean, so that a planned
    // reboot checks no head (its engines close their lent ones).
    let _ = tokio::task::spawn_blocking(move || table.close_all("the node plugin stopped")).await;
    tracing::info!("node stopped");
    Ok(())
}

/// The node's TLS and the directory of its credentials (which its engines
/// read): given (`--tls-dir`), or got by enrolling (`--cluster-ca-file`)
/// and kept in `<state-dir>/tls`; or TLS off.
async fn node_tls(
    config: &NodeConfig,
    state_dir: &std::path::Path,
    token: &ClusterToken,
) -> Result<(Tls, Option<PathBuf>), ServeError> {
    if let Some(dir) = &config.tls_dir {
        let credentials = ballast::tls::Credentials::load(dir)
            .map_err(|e| ServeError::Config(format!("--tls-dir: {e}")))?;
        return Ok((on(credentials)?, Some(dir.clone())));
    }
    let Some(ca) = &config.cluster_ca_file else {
        return Ok((Tls::default(), None));
    };
    let dir = enrolled_dir(state_dir);
    let credentials =
        crate::agent::enroll(&config.controller, &config.node_id, ca, token, &dir).await?;
    Ok((on(credentials)?, Some(dir)))
}

fn on(credentials: ballast::tls::Credentials) -> Result<Tls, ServeError> {
    Tls::on(credentials).map_err(|e| ServeError::Config(format!("TLS: {e}")))
}

/// Where an enrolled node keeps its credentials.
fn enrolled_dir(state_dir: &std::path::Path) -> PathBuf {
    state_dir.join("tls")
}

/// Where a renewal of the node's certificate comes from: the files of
/// `--tls-dir` read again, or a new enrollment kept where the first is.
fn renewal_source(
    config: &NodeConfig,
    state_dir: &std::path::Path,
    token: &ClusterToken,
) -> crate::agent::renewal::Source {
    use crate::agent::renewal::Source;
    match (&config.tls_dir, &config.cluster_ca_file) {
        (Some(dir), _) => Source::Dir(dir.clone()),
        (None, ca_file) => Source::Enroll {
            controller: config.controller.clone(),
            node_id: config.node_id.clone(),
            ca_file: ca_file.clone().unwrap_or_default(),
            token: token.clone(),
            dir: enrolled_dir(state_dir),
        },
    }
}

/// The disks this node opens: its flags' (which must exist), its Ballast
/// Node's spec and its default disks, as the controller answers. The
/// node's records of its disks are in `<state-dir>/disks`.
async fn open_wanted_disks(
    config: &NodeConfig,
    controller: &Authed,
    state_dir: &std::path::Path,
) -> Result<Vec<crate::disks::Disk>, ServeError> {
    for d in &config.disks {
        crate::disks::dir_of(d).map_err(|e| ServeError::Config(e.to_string()))?;
    }
    let wanted = crate::agent::disks_to_open(controller, &config.node_id, &config.disks).await;
    if wanted.is_empty() {
        return Err(ServeError::Config(
            "disk: no disks to open: give --disk, or name them in the Ballast Node's spec or the Kubernetes Node's annotation ballast.csi.dev/default-disks".into(),
        ));
    }
    open_disks(&wanted, &state_dir.join("disks")).map_err(|e| ServeError::Config(e.to_string()))
}

/// What every task of the node gets: its identity, disks, endpoints, the
/// replica server and the engines it starts.
fn context(
    config: &NodeConfig,
    state_dir: &std::path::Path,
    socket: &std::path::Path,
    disks: Vec<crate::disks::Disk>,
    replicas: Arc<crate::server::ReplicaServer>,
    tls_dir: Option<PathBuf>,
) -> Result<Arc<NodeContext>, ServeError> {
    let exe = std::env::current_exe().map_err(|source| ServeError::Io {
        path: PathBuf::from("/proc/self/exe"),
        source,
    })?;
    let disk_paths = disks.iter().map(|d| d.path.clone()).collect();
    let engine_host = config
        .engine_host
        .as_deref()
        .map(ballast::grpc::unix_path)
        .transpose()?;
    Ok(Arc::new(NodeContext {
        node_id: config.node_id.clone(),
        zone: config.zone.clone(),
        tags: config.tags.clone(),
        disks,
        agent_endpoint: format!("http://{}", config.agent_listen),
        replica_endpoint: config.replica_listen.to_string(),
        csi_endpoint: format!("unix://{}", socket.display()),
        max_volumes: config.max_volumes,
        registered: Arc::new(AtomicBool::new(false)),
        replicas: Some(replicas),
        engines: crate::engines::Engines::new(
            state_dir,
            exe,
            disk_paths,
            crate::engines::Tuning {
                writeback_every: config.writeback_every,
                workers: config.engine_workers,
            },
            crate::engines::RecordAt {
                controller: config.controller.clone(),
                node_id: config.node_id.clone(),
                token_file: config.cluster_token_file.clone(),
                tls_dir,
            },
            engine_host,
        ),
    }))
}
