//! The daemons' flags (INTERFACES.md §1). Each also reads `BALLAST_<FLAG>`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ballast_controller::ControllerConfig;
use ballast_controller::daemon::StoreSpec;
use ballast_node::NodeConfig;
use ballast_node::disks::DiskArg;
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::parse_duration;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct ControllerArgs {
    /// Where state lives: embedded:<path> (a redb file) or kubernetes.
    #[arg(long, env = "BALLAST_STORE")]
    pub store: StoreSpec,
    /// The CSI socket, unix:///path/controller.sock
    #[arg(long, env = "BALLAST_CSI_ENDPOINT")]
    pub csi_endpoint: String,
    /// REST API address.
    #[arg(long, env = "BALLAST_API_LISTEN", default_value = "127.0.0.1:9500")]
    pub api_listen: SocketAddr,
    /// Where nodes register and heartbeat.
    #[arg(long, env = "BALLAST_AGENT_LISTEN", default_value = "127.0.0.1:9501")]
    pub agent_listen: SocketAddr,
    /// How often the reconcile loop runs without a change.
    #[arg(long, env = "BALLAST_RESYNC_INTERVAL", default_value = "5s", value_parser = parse_duration)]
    pub resync_interval: Duration,
    /// A node with no heartbeat for this long turns not ready.
    #[arg(long, env = "BALLAST_NODE_DOWN_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub node_down_timeout: Duration,
    /// With TLS on, a running engine's certificate (valid for a year) is
    /// renewed in place this many days before it expires: its node's
    /// heartbeats say when.
    #[arg(long, env = "BALLAST_RENEW_ENGINE_CERTIFICATES_DAYS", default_value_t = ballast_controller::nodes::RENEW_DAYS, value_parser = clap::value_parser!(i64).range(1..))]
    pub renew_engine_certificates_days: i64,
    /// With TLS on, the controller's own certificate (valid for a year,
    /// issued at each start) is renewed while it runs, this many days
    /// before it expires. Checked a minute after the start, then every
    /// hour.
    #[arg(long, env = "BALLAST_RENEW_CERTIFICATE_DAYS", default_value_t = ballast_controller::certificate::RENEW_DAYS, value_parser = clap::value_parser!(i64).range(1..))]
    pub renew_certificate_days: i64,
    /// A file holding a bearer token that every REST change (POST, PUT,
    /// PATCH, DELETE) must carry; reads stay open. One token per line,
    /// each accepted; read again every 5 seconds.
    #[arg(long, env = "BALLAST_API_TOKEN_FILE")]
    pub api_token_file: Option<PathBuf>,
    /// A file holding the cluster token (at least 16 characters) that
    /// every call of the agent endpoint must carry, and that it sends to
    /// the node agents; the same file as the nodes'. While the token
    /// changes it holds two, one per line: the first is sent, each is
    /// accepted. Read again every 5 seconds.
    #[arg(long, env = "BALLAST_CLUSTER_TOKEN_FILE")]
    pub cluster_token_file: Option<PathBuf>,
    /// Turns TLS on: the directory of the cluster CA (`ca.crt`, `ca.key`),
    /// made there when missing. The agent endpoint then serves TLS, signs
    /// the certificates nodes enroll for, and calls node agents with a
    /// certificate of its own. Needs a cluster token. Nodes get `ca.crt`
    /// as their --cluster-ca-file.
    #[arg(long, env = "BALLAST_CLUSTER_CA_DIR")]
    pub cluster_ca_dir: Option<PathBuf>,
    #[command(flatten)]
    pub kubernetes: KubeArgs,
}

/// How to reach the cluster when `--store kubernetes`.
#[derive(Clone, Debug, Args)]
pub struct KubeArgs {
    /// A kubeconfig file (default: in-cluster config, else KUBECONFIG or ~/.kube/config).
    #[arg(long, env = "BALLAST_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// The namespace of Ballast's objects.
    #[arg(long, env = "BALLAST_NAMESPACE", default_value = "ballast-system")]
    pub namespace: String,
    /// Apply the CRDs and create the namespace at start (a cluster installed
    /// from deploy/ has them already).
    #[arg(long, env = "BALLAST_INSTALL_CRDS")]
    pub install_crds: bool,
    /// How long the leader's Lease lasts unrenewed; another controller
    /// takes over after it (renewed every seventh of it).
    #[arg(long, env = "BALLAST_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,
    /// The agent endpoint other controllers forward calls to
    /// (default: http://<--agent-listen>; in a pod, http://$(POD_IP):9501).
    #[arg(long, env = "BALLAST_ADVERTISE")]
    pub advertise: Option<String>,
    /// The image of the drain guard pods (default: this controller's own,
    /// read from its pod).
    #[arg(long, env = "BALLAST_GUARD_IMAGE")]
    pub guard_image: Option<String>,
    /// The Secret holding the cluster token (key `token`), made with a
    /// random token when missing; the node plugins mount it as their
    /// --cluster-token-file. Read again every 15 seconds (one token per
    /// line while it changes). (Or give --cluster-token-file instead.)
    #[arg(long, env = "BALLAST_CLUSTER_TOKEN_SECRET")]
    pub cluster_token_secret: Option<String>,
    /// Turns TLS on with the cluster CA kept in this Secret (keys `ca.crt`,
    /// `ca.key`), made when missing; its certificate is also put into the
    /// token's Secret as `ca.crt`, for the nodes. (Or --cluster-ca-dir.)
    #[arg(long, env = "BALLAST_CLUSTER_CA_SECRET")]
    pub cluster_ca_secret: Option<String>,
}

impl From<KubeArgs> for ballast_controller::daemon::KubeOptions {
    fn from(a: KubeArgs) -> Self {
        ballast_controller::daemon::KubeOptions {
            kubeconfig: a.kubeconfig,
            namespace: a.namespace,
            install_crds: a.install_crds,
            lease_duration: a.lease_duration,
            advertise: a.advertise,
            guard_image: a.guard_image,
            cluster_token_secret: a.cluster_token_secret,
            cluster_ca_secret: a.cluster_ca_secret,
        }
    }
}

impl From<ControllerArgs> for ControllerConfig {
    fn from(a: ControllerArgs) -> Self {
        ControllerConfig {
            store: a.store,
            kubernetes: a.kubernetes.into(),
            csi_endpoint: a.csi_endpoint,
            api_listen: a.api_listen,
            agent_listen: a.agent_listen,
            resync_interval: a.resync_interval,
            node_down_timeout: a.node_down_timeout,
            api_token_file: a.api_token_file,
            cluster_token_file: a.cluster_token_file,
            cluster_ca_dir: a.cluster_ca_dir,
            renew_engine_certificates_days: a.renew_engine_certificates_days,
            renew_certificate_days: a.renew_certificate_days,
        }
    }
}

#[derive(Debug, Args)]
pub struct NodeArgs {
    /// This node's id (a DNS label, e.g. node-1). Without it, `NODE_NAME`
    /// (the downward API's `spec.nodeName` in a pod) names the node.
    #[arg(long, env = "BALLAST_NODE_ID")]
    pub node_id: Option<String>,
    /// Zone of the node.
    #[arg(long, env = "BALLAST_ZONE", default_value = "")]
    pub zone: String,
    /// Node tags, comma separated.
    #[arg(long, env = "BALLAST_TAGS", value_delimiter = ',')]
    pub tags: Vec<String>,
    /// A default disk: <path>[:tag1,tag2]. Repeat for several disks. The
    /// node opens these (unless its Kubernetes Node's annotation
    /// ballast.csi.dev/default-disks names its defaults) and the disks of
    /// its Ballast Node's spec.
    #[arg(long = "disk", env = "BALLAST_DISK")]
    pub disks: Vec<DiskArg>,
    /// The controller's agent endpoint, e.g. http://127.0.0.1:9501
    #[arg(long, env = "BALLAST_CONTROLLER")]
    pub controller: String,
    /// The CSI socket, unix:///path/node.sock
    #[arg(long, env = "BALLAST_CSI_ENDPOINT")]
    pub csi_endpoint: String,
    /// Where the controller calls this node (it registers this address).
    /// Default: the address this node reaches the controller from, port
    /// 9502.
    #[arg(long, env = "BALLAST_AGENT_LISTEN")]
    pub agent_listen: Option<SocketAddr>,
    /// Where other nodes' engines reach this node's replicas (it registers
    /// this address). Default: the address this node reaches the
    /// controller from, port 9503. Never 0.0.0.0: not an address a peer
    /// can reach, and not one to open to every network.
    #[arg(long, env = "BALLAST_REPLICA_LISTEN")]
    pub replica_listen: Option<SocketAddr>,
    /// Sockets and frontends of attached volumes.
    #[arg(long, env = "BALLAST_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// The kubelet's directory. CSI staging and target paths must lie
    /// below it or below the state directory; others are refused.
    #[arg(long, env = "BALLAST_KUBELET_DIR", default_value = "/var/lib/kubelet")]
    pub kubelet_dir: PathBuf,
    /// A file holding the cluster token (the controller's): its agent
    /// refuses calls without it, and its calls to the controller, and its
    /// engines', carry it. While the token changes it holds two, one per
    /// line: the first is sent, each is accepted. Read again every 5
    /// seconds.
    #[arg(long, env = "BALLAST_CLUSTER_TOKEN_FILE")]
    pub cluster_token_file: Option<PathBuf>,
    /// Turns TLS on: the cluster CA's certificate (the controller's
    /// `ca.crt`). The node then enrolls at start (a new key, and a
    /// certificate the controller signs, kept in `<state-dir>/tls`), and its
    /// agent, its replica server and its engines speak mutual TLS only.
    /// Needs --cluster-token-file.
    #[arg(long, env = "BALLAST_CLUSTER_CA_FILE", requires = "cluster_token_file")]
    pub cluster_ca_file: Option<PathBuf>,
    /// Turns TLS on with credentials already in this directory (`ca.crt`,
    /// `tls.crt`, `tls.key`), issued by the cluster's CA for this node's
    /// names (`<node-id>.node.ballast.internal` and
    /// `node.ballast.internal`), instead of enrolling: certificates from
    /// your own issuer.
    #[arg(long, env = "BALLAST_TLS_DIR", conflicts_with = "cluster_ca_file")]
    pub tls_dir: Option<PathBuf>,
    /// With TLS on, the node's certificate (valid for a year) is renewed
    /// while it runs, this many days before it expires: it enrolls again,
    /// or with --tls-dir reads that directory again for a later one.
    /// Checked a minute after the start, then every hour.
    #[arg(long, env = "BALLAST_RENEW_CERTIFICATE_DAYS", default_value_t = ballast_node::agent::renewal::RENEW_DAYS, value_parser = clap::value_parser!(i64).range(1..))]
    pub renew_certificate_days: i64,
    /// The most volumes that may be published at this node at once (its
    /// attach limit: reported to the CO, which schedules by it, and
    /// enforced by the controller); 0: no limit.
    #[arg(long, env = "BALLAST_MAX_VOLUMES_PER_NODE", default_value_t = 0)]
    pub max_volumes_per_node: u32,
    /// Start writing a replica's new data to its disk after this many
    /// bytes written to it (e.g. 8Mi), so that a flush waits only for the
    /// rest; 0 leaves it to the kernel.
    #[arg(long, env = "BALLAST_WRITEBACK_EVERY", default_value = "8Mi", value_parser = parse_size)]
    pub writeback_every: u64,
    /// Async worker threads of each engine this node starts (0: one per
    /// core, at most 4). On a node of few cores shared by many volumes, 1
    /// takes less CPU per write; more let one busy volume use more cores.
    #[arg(long, env = "BALLAST_ENGINE_WORKERS", default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=256))]
    pub engine_workers: u16,
    /// Start engines in the engine host listening here (`unix:///path`),
    /// so that they outlive this process's group and container; without
    /// it, engines are this process's children.
    #[arg(long, env = "BALLAST_ENGINE_HOST")]
    pub engine_host: Option<String>,
    /// Serve Prometheus metrics (the engines' I/O) over HTTP at
    /// `http://ADDR/metrics`.
    #[arg(long, env = "BALLAST_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
}

/// The environment variable a pod's downward API sets to its node's name.
pub const NODE_NAME_ENV: &str = "NODE_NAME";

impl NodeArgs {
    /// The node's configuration: its id from `--node-id`, else from
    /// `NODE_NAME`.
    pub fn config(self) -> Result<NodeConfig, String> {
        let node_id = match self.node_id.clone() {
            Some(id) => id,
            None => std::env::var(NODE_NAME_ENV).map_err(|_| {
                format!(
                    "nodeId: give --node-id (or BALLAST_NODE_ID), or set {NODE_NAME_ENV} from the downward API's spec.nodeName"
                )
            })?,
        };
        let agent_listen =
            listen_address("--agent-listen", self.agent_listen, &self.controller, 9502)?;
        let replica_listen = listen_address(
            "--replica-listen",
            self.replica_listen,
            &self.controller,
            9503,
        )?;
        Ok(node_config(node_id, agent_listen, replica_listen, self))
    }
}

/// The local address this machine reaches `controller` (the first of a
/// comma-separated list of URLs) from: no packet is sent, the kernel only
/// picks the route.
fn address_toward(controller: &str) -> Result<std::net::IpAddr, String> {
    let first = controller.split(',').next().unwrap_or_default().trim();
    let hostport = first
        .split_once("://")
        .map_or(first, |(_, rest)| rest)
        .trim_end_matches('/');
    let target = std::net::ToSocketAddrs::to_socket_addrs(hostport)
        .map_err(|e| format!("{hostport}: {e}"))?
        .next()
        .ok_or_else(|| format!("{hostport}: no address"))?;
    let any: SocketAddr = if target.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        ([0u16; 8], 0).into()
    };
    let probe = std::net::UdpSocket::bind(any).map_err(|e| e.to_string())?;
    probe.connect(target).map_err(|e| e.to_string())?;
    probe
        .local_addr()
        .map(|a| a.ip())
        .map_err(|e| e.to_string())
}

/// A node's listening address for `flag`: as given (never unspecified), or
/// the address toward the controller with `port`.
fn listen_address(
    flag: &str,
    given: Option<SocketAddr>,
    controller: &str,
    port: u16,
) -> Result<SocketAddr, String> {
    match given {
        Some(a) if a.ip().is_unspecified() => Err(format!(
            "{flag}: {a} is not an address other nodes can reach, and opens the port to every network; give this node's address (the default is the one it reaches the controller from)"
        )),
        Some(a) => Ok(a),
        None => address_toward(controller)
            .map(|ip| SocketAddr::new(ip, port))
            .map_err(|e| format!("{flag}: not given, and no address toward the controller {controller}: {e}; give it")),
    }
}

fn node_config(
    node_id: String,
    agent_listen: SocketAddr,
    replica_listen: SocketAddr,
    a: NodeArgs,
) -> NodeConfig {
    NodeConfig {
        node_id,
        zone: a.zone,
        tags: a.tags,
        disks: a.disks,
        controller: a.controller,
        csi_endpoint: a.csi_endpoint,
        agent_listen,
        replica_listen,
        state_dir: a.state_dir,
        kubelet_dir: a.kubelet_dir,
        cluster_token_file: a.cluster_token_file,
        cluster_ca_file: a.cluster_ca_file,
        tls_dir: a.tls_dir,
        max_volumes: a.max_volumes_per_node,
        writeback_every: a.writeback_every,
        engine_workers: a.engine_workers,
        engine_host: a.engine_host,
        metrics_listen: a.metrics_listen,
        renew_certificate_days: a.renew_certificate_days,
    }
}

#[derive(Debug, Args)]
pub struct LocalArgs {
    /// Node processes to start.
    #[arg(long, env = "BALLAST_NODES", default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub nodes: u16,
    /// Zones, assigned round-robin to the nodes.
    #[arg(long, env = "BALLAST_ZONES", default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub zones: u16,
    /// Disks (directories) per node.
    #[arg(long, env = "BALLAST_DISKS_PER_NODE", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub disks_per_node: u16,
    /// Where the store, disks, sockets and logs live.
    #[arg(long, env = "BALLAST_DIR", default_value = ".ballast")]
    pub dir: PathBuf,
    /// REST API address; the other ports follow it.
    #[arg(long, env = "BALLAST_API_LISTEN", default_value = "127.0.0.1:9500")]
    pub api_listen: SocketAddr,
    /// Passed to the controller.
    #[arg(long, env = "BALLAST_NODE_DOWN_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub node_down_timeout: Duration,
    /// Passed to every node: CSI staging and target paths must lie below
    /// it (or below the node's state directory under --dir).
    #[arg(long, env = "BALLAST_KUBELET_DIR", default_value = "/var/lib/kubelet")]
    pub kubelet_dir: PathBuf,
    /// Passed to every node: the most volumes published at it at once
    /// (0: no limit).
    #[arg(long, env = "BALLAST_MAX_VOLUMES_PER_NODE", default_value_t = 0)]
    pub max_volumes_per_node: u32,
    /// Where the controller keeps state: `embedded` (a redb file under
    /// --dir) or `kubernetes` (the API server of --kubeconfig; the CRDs and
    /// the namespace are created if missing).
    #[arg(long = "store", env = "BALLAST_LOCAL_STORE", default_value = "embedded", value_parser = ["embedded", "kubernetes"])]
    pub store: String,
    #[command(flatten)]
    pub kubernetes: KubeArgs,
}

fn parse_size(s: &str) -> Result<u64, String> {
    ballast::quantity::parse_size(s)
}

#[derive(Debug, Args)]
pub struct EngineArgs {
    /// The volume (also the NBD export name).
    #[arg(long, env = "BALLAST_VOLUME")]
    pub volume: String,
    /// The volume's size, e.g. 1Gi.
    #[arg(long, env = "BALLAST_SIZE", value_parser = parse_size)]
    pub size: u64,
    /// The NBD unix socket to serve, e.g. <state-dir>/frontends/<volume>.sock
    #[arg(long, env = "BALLAST_SOCKET")]
    pub socket: PathBuf,
    /// A replica: NAME@HOST:PORT. Repeat for each replica.
    #[arg(long = "replica", required = true)]
    pub replicas: Vec<ballast_node::engine::ReplicaAddr>,
    /// The replica on this node, read first.
    #[arg(long, env = "BALLAST_LOCAL")]
    pub local: Option<String>,
    /// The local replica's directory: its server lends it to the engine,
    /// whose reads and writes of it then go straight to its files.
    #[arg(long, env = "BALLAST_LOCAL_DIR", requires = "local")]
    pub local_dir: Option<PathBuf>,
    /// Start writing the lent replica's new data to its disk after this
    /// many bytes written to it; 0 leaves it to the kernel.
    #[arg(long, env = "BALLAST_WRITEBACK_EVERY", default_value = "8Mi", value_parser = parse_size)]
    pub writeback_every: u64,
    /// Async worker threads (0: one per core, at most 4).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=256))]
    pub workers: u16,
    /// Seconds a remote replica may leave a read or write unanswered while
    /// another replica answers; then the engine gives it up (the setting
    /// `engine-replica-timeout`, which the node plugin passes).
    #[arg(long, env = "BALLAST_REPLICA_TIMEOUT", default_value_t = ballast_node::engine::DEFAULT_REPLICA_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub replica_timeout: u64,
    /// Where to write the engine's status (JSON) every second.
    #[arg(long, env = "BALLAST_STATUS_FILE")]
    pub status_file: Option<PathBuf>,
    /// The control socket the node agent uses to add and remove replicas.
    #[arg(long, env = "BALLAST_CONTROL_SOCKET")]
    pub control_socket: Option<PathBuf>,
    /// Also serve the volume as the file `<DIR>/volume` on a FUSE mount,
    /// for a loop device (the kernel block device NodeStage mounts).
    #[arg(long, env = "BALLAST_FUSE_DIR")]
    pub fuse_dir: Option<PathBuf>,
    /// Take over the FUSE connection of the filesystem already mounted at
    /// --fuse-dir, open as this descriptor (the node agent passes the one
    /// an engine that died served), instead of mounting a new one.
    #[arg(long, requires = "fuse_dir")]
    pub fuse_fd: Option<i32>,
    /// The controller's agent endpoint, where the engine records which
    /// replicas hold the latest acknowledged data before it acknowledges a
    /// write that depends on it. The node plugin always passes it; without
    /// it (an engine run by hand on its own) nothing is recorded.
    #[arg(long, env = "BALLAST_CONTROLLER", requires = "node_id")]
    pub controller: Option<String>,
    /// The node the engine runs on (with --controller).
    #[arg(long, env = "BALLAST_NODE_ID")]
    pub node_id: Option<String>,
    /// The generation of the replica set the store records.
    #[arg(long, env = "BALLAST_GENERATION", default_value_t = 0)]
    pub generation: u64,
    /// The attachment the engine is started for (the volume's engine
    /// epoch): it claims it when it opens a replica, and a replica opened
    /// for a later one refuses its writes. With TLS on, its certificate
    /// must name it. 0 (an engine run by hand) claims none.
    #[arg(long, env = "BALLAST_EPOCH", default_value_t = 0)]
    pub epoch: u64,
    /// The cluster token its records carry (with --controller).
    #[arg(long, env = "BALLAST_CLUSTER_TOKEN_FILE")]
    pub cluster_token_file: Option<PathBuf>,
    /// Speak mutual TLS to replicas and the controller with the
    /// credentials in this directory (`ca.crt`, `tls.crt`, `tls.key`: the
    /// node plugin's, which passes it).
    #[arg(long, env = "BALLAST_TLS_DIR")]
    pub tls_dir: Option<PathBuf>,
    /// A replica the store records as holding the latest data (repeat).
    #[arg(long = "current")]
    pub current: Vec<String>,
    /// Another replica of the volume, which the record leaves out:
    /// NAME@HOST:PORT (repeat). Never served from; after a power cut a
    /// suspect block of the one current replica takes its copy when that
    /// matches the checksum kept on the disk.
    #[arg(long = "stale")]
    pub stale: Vec<ballast_node::engine::ReplicaAddr>,
}

/// `ballast`'s command line.
#[derive(Debug, Parser)]
#[command(
    name = "ballast",
    version,
    about = "Ballast: replicated block storage for Kubernetes"
)]
pub struct Cli {
    /// Log format.
    #[arg(long, env = "BALLAST_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the controller: store, REST API, CSI controller socket.
    Controller(ControllerArgs),
    /// Run a node plugin: disks, agent, CSI node socket.
    Node(NodeArgs),
    /// Run a whole cluster on this machine: a controller and N nodes.
    Local(LocalArgs),
    /// Run the engine of one volume: replicate over its replicas and serve
    /// it as NBD on a unix socket (started by the node plugin).
    Engine(EngineArgs),
    /// Run the planner against a model cluster described by a scenario file;
    /// prints one JSON line per `settle` step.
    Sim {
        /// The scenario (YAML).
        scenario: PathBuf,
    },
    /// Print the CustomResourceDefinitions of ballast.csi.dev (YAML), as
    /// deploy/crds/ holds them.
    Crds,
    /// Wait for a stop signal, doing nothing: the drain guard pod that the
    /// controller runs on a node whose drain the policy blocks.
    Guard,
    /// Run the engine host: start the engines a node plugin asks for, as
    /// this process's children, so that they outlive the node plugin.
    EngineHost {
        /// The socket the node plugin asks on (`unix:///path`).
        #[arg(long, env = "BALLAST_ENGINE_HOST")]
        socket: String,
    },
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn command_lines_are_well_formed() {
        Cli::command().debug_assert();
        crate::ctl::Cli::command().debug_assert();
    }

    #[test]
    fn node_flags_parse_with_tags_and_several_disks() {
        let cli = Cli::try_parse_from([
            "ballast",
            "node",
            "--node-id",
            "n1",
            "--tags",
            "a,b",
            "--disk",
            "/d1:ssd",
            "--disk",
            "/d2",
            "--controller",
            "http://127.0.0.1:1",
            "--csi-endpoint",
            "unix:///x.sock",
            "--agent-listen",
            "127.0.0.1:2",
            "--replica-listen",
            "127.0.0.1:3",
        ])
        .unwrap();
        let Command::Node(n) = cli.command else {
            panic!("not node")
        };
        assert_eq!(n.tags, ["a", "b"]);
        assert_eq!(n.disks.len(), 2);
        assert_eq!(n.disks[0].tags, ["ssd"]);
    }

    #[test]
    fn bad_durations_and_stores_are_refused_with_a_message() {
        let e = Cli::try_parse_from([
            "ballast",
            "controller",
            "--store",
            "sqlite:x",
            "--csi-endpoint",
            "unix:///x.sock",
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("embedded:<path>, kubernetes"), "{e}");
        let e = Cli::try_parse_from([
            "ballast",
            "controller",
            "--store",
            "embedded:/x",
            "--csi-endpoint",
            "unix:///x.sock",
            "--node-down-timeout",
            "soon",
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("not a duration"), "{e}");
    }
}
