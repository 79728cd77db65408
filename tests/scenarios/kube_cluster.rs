//! A cluster on the Kubernetes store for the scenarios: controllers with
//! `--store kubernetes` on the test bench's real API server (one leads by
//! the Lease, the others forward), and nodes that are Kubernetes Nodes
//! too. Used by seed 002's drain on a `kubectl cordon` and by the leader
//! failover test.

use std::time::Duration;

use ballast_k8s_harness::ControlPlane;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node as KubeNode;
use serde_json::json;

use crate::harness::*;

const NAMESPACE: &str = "ballast";
const LEASE_DURATION: &str = "6s";
const TOKEN_SECRET: &str = "ballast-cluster-token";

fn kube_controller(
    dir: &std::path::Path,
    i: usize,
    kubeconfig: &std::path::Path,
) -> ControllerProc {
    let (api, agent) = (free_addr(), free_addr());
    let socket = dir.join(format!("controller-{i}.sock"));
    let args: Vec<String> = [
        "controller",
        "--store",
        "kubernetes",
        "--kubeconfig",
        &kubeconfig.display().to_string(),
        "--namespace",
        NAMESPACE,
        "--install-crds",
        "--lease-duration",
        LEASE_DURATION,
        "--csi-endpoint",
        &format!("unix://{}", socket.display()),
        "--api-listen",
        &api.to_string(),
        "--agent-listen",
        &agent.to_string(),
        "--node-down-timeout",
        "4s",
        "--resync-interval",
        "1s",
        // As deploy/ runs it: the token and the CA in Secrets the
        // controllers make (TLS on).
        "--cluster-token-secret",
        TOKEN_SECRET,
        "--cluster-ca-secret",
        "ballast-cluster-ca",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let name = format!("controller-{i}");
    let proc = Proc::spawn_env(
        &args,
        dir.join(format!("{name}.log")),
        &[("POD_NAME", &name)],
    );
    ControllerProc::up(proc, args, socket, dir.join("unused"))
}

/// A node plugin as its DaemonSet runs it: named by `NODE_NAME` (the
/// downward API's `spec.nodeName`), not by a flag. (`Cluster::restart_node`
/// starts it again with the flags only: not for these nodes.)
/// With `flag_disk` false, it has no `--disk`: its disks come from its
/// Ballast Node's spec and its Kubernetes Node's annotation.
pub fn kube_node(dir: &std::path::Path, id: &str, agents: &str, flag_disk: bool) -> NodeProc {
    let (mut args, socket) = node_args(dir, id, agents);
    let at = args.iter().position(|a| a == "--node-id").unwrap();
    args.drain(at..at + 2);
    if !flag_disk {
        let at = args.iter().position(|a| a == "--disk").unwrap();
        args.drain(at..at + 2);
    }
    let proc = Proc::spawn_env(&args, dir.join(format!("{id}.log")), &[("NODE_NAME", id)]);
    NodeProc {
        proc,
        id: id.into(),
        socket,
        args,
    }
}

/// The Lease's holder, once there is one.
pub fn holder(rt: &tokio::runtime::Runtime, cp: &ControlPlane) -> Option<String> {
    rt.block_on(async {
        let leases: kube::Api<Lease> = kube::Api::namespaced(cp.client().await.ok()?, NAMESPACE);
        let lease = leases.get_opt("ballast-controller").await.ok()??;
        lease.spec?.holder_identity
    })
}

/// A cluster on the Kubernetes store: controllers on the test bench's API
/// server, and nodes that are Kubernetes Nodes too (`node-i`, labelled
/// with zone `kube-zone-i`; there is no kubelet, the Node objects stand
/// for the machines). `c.ctl` is the leader; the other controllers follow.
pub struct KubeCluster {
    pub c: Cluster,
    /// The other controllers, kept running (and stopped with the cluster).
    pub followers: Vec<ControllerProc>,
    pub leader: String,
    pub cp: ControlPlane,
    pub rt: tokio::runtime::Runtime,
}

impl KubeCluster {
    pub fn start(nodes: usize) -> KubeCluster {
        KubeCluster::start_with(1, nodes)
    }

    pub fn start_with(controllers: usize, nodes: usize) -> KubeCluster {
        let rt = runtime();
        let cp = rt
            .block_on(ControlPlane::start())
            .unwrap_or_else(|e| panic!("{e}"));
        let mut dir = tempfile::tempdir().unwrap();
        if std::env::var_os("BALLAST_KEEP_TEST_DIRS").is_some() {
            dir.disable_cleanup(true);
            eprintln!("test directory: {}", dir.path().display());
        }
        rt.block_on(async {
            let api: kube::Api<KubeNode> = kube::Api::all(cp.client().await.unwrap());
            for i in 1..=nodes {
                let node: KubeNode = serde_json::from_value(json!({
                    "metadata": {
                        "name": format!("node-{i}"),
                        "labels": {"topology.kubernetes.io/zone": format!("kube-zone-{i}")},
                    },
                }))
                .unwrap();
                api.create(&Default::default(), &node).await.unwrap();
            }
        });
        let mut ctls: Vec<ControllerProc> = (0..controllers)
            .map(|i| kube_controller(dir.path(), i, &cp.kubeconfig))
            .collect();
        let leader = wait_for(Duration::from_secs(60), "a leader", || holder(&rt, &cp));
        let li: usize = leader.trim_start_matches("controller-").parse().unwrap();
        // The nodes get the token and the CA's certificate the controllers
        // keep in their Secret, as a DaemonSet mounts it.
        rt.block_on(async {
            let api: kube::Api<k8s_openapi::api::core::v1::Secret> =
                kube::Api::namespaced(cp.client().await.unwrap(), NAMESPACE);
            let data = api.get(TOKEN_SECRET).await.unwrap().data.unwrap();
            std::fs::write(dir.path().join("cluster-token"), &data["token"].0).unwrap();
            let ca = cluster_ca_dir(dir.path());
            std::fs::create_dir_all(&ca).unwrap();
            std::fs::write(ca.join("ca.crt"), &data["ca.crt"].0).unwrap();
        });
        // Nodes may call any controller: followers forward to the leader.
        let agents: Vec<String> = ctls.iter().map(|c| format!("http://{}", c.agent)).collect();
        let agents = agents.join(",");
        let node_procs: Vec<NodeProc> = (1..=nodes)
            .map(|i| kube_node(dir.path(), &format!("node-{i}"), &agents, true))
            .collect();
        let ctl = ctls.remove(li);
        let c = Cluster {
            nodes: node_procs,
            api: ctl.api.clone(),
            ctl,
            _mounts: Vec::new(),
            forgetful: Vec::new(),
            dir,
        };
        for n in &c.nodes {
            wait_for(Duration::from_secs(90), "node ready", || {
                node(&c.api, &n.id).filter(node_is_up)
            });
        }
        free_space_is_not_the_test(&c.api);
        KubeCluster {
            c,
            followers: ctls,
            leader,
            cp,
            rt,
        }
    }

    /// `kubectl cordon` / `uncordon`: patches the Kubernetes Node.
    pub fn cordon(&self, node: &str, on: bool) {
        self.rt.block_on(async {
            let api: kube::Api<KubeNode> = kube::Api::all(self.cp.client().await.unwrap());
            let patch = json!({"spec": {"unschedulable": on}});
            api.patch(
                node,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .unwrap();
        });
    }
}
