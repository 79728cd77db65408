//! The cluster token changes while a volume runs (docs/security.md, "Secrets"):
//! every member reads its token file again, and with the new token first
//! added as a second line, then made the first, then the old one dropped,
//! no call between members is refused at any step. Data is written first
//! and verified by checksum afterwards.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ballast::cluster_token::ClusterToken;
use ballast::tls::{Member, Role};
use serde_json::json;
use tonic::Code;

use crate::harness::*;

/// What a member logs each time it takes a changed token file.
const CHANGED: &str = "the cluster token file changed";
/// What a controller logs each time it takes a changed token Secret.
const SECRET_CHANGED: &str = "the cluster token's Secret changed";
/// What a member is told when a call it made lacked the token.
const REFUSED: &str = "this cluster's token is required";

/// How many times the log at `path` says its tokens changed.
fn reloads(path: &Path) -> usize {
    let log = std::fs::read_to_string(path).unwrap_or_default();
    log.matches(CHANGED).count() + log.matches(SECRET_CHANGED).count()
}

/// Waits until every log of `logs` says its tokens changed `n` times.
fn wait_reloaded(logs: &[PathBuf], n: usize) {
    let behind = || -> Vec<&PathBuf> { logs.iter().filter(|l| reloads(l) < n).collect() };
    wait_for_or(
        Duration::from_secs(90),
        &format!("every member to read the token file again {n} times"),
        || behind().is_empty().then_some(()),
        || format!("behind: {:?}", behind()),
    );
}

/// Every gate of the cluster: each node agent, and the controller's agent
/// endpoint, with the name a client expects of each.
fn gates(c: &Cluster) -> Vec<(String, Role)> {
    let mut out: Vec<(String, Role)> = c
        .nodes
        .iter()
        .map(|n| {
            let agent = c.node(&n.id)["status"]["agentEndpoint"]
                .as_str()
                .unwrap()
                .to_string();
            (agent, Role::Node(n.id.clone()))
        })
        .collect();
    out.push((format!("http://{}", c.ctl.agent), Role::Controller));
    out
}

/// One call with `token` (and a controller's certificate) to each gate:
/// GetNodeStatus of a node agent, a forwarded CSI call to the controller;
/// each outcome with the gate's name.
async fn gated_calls(
    gates: &[(String, Role)],
    member: &Member,
) -> Vec<(String, Result<(), tonic::Status>)> {
    use ballast::proto::agent::v1::GetNodeStatusRequest;
    use ballast::proto::agent::v1::node_agent_client::NodeAgentClient;
    use ballast::proto::csi::v1::ControllerGetCapabilitiesRequest;
    use ballast::proto::csi::v1::controller_client::ControllerClient;
    let mut out = Vec::new();
    for (url, role) in gates {
        let channel = member.channel(url, role).unwrap();
        let r = if *role == Role::Controller {
            ControllerClient::new(channel)
                .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
                .await
                .map(drop)
        } else {
            NodeAgentClient::new(channel)
                .get_node_status(GetNodeStatusRequest {})
                .await
                .map(drop)
        };
        out.push((role.name(), r));
    }
    out
}

/// What each gate answers a call with `token`.
fn calls(c: &Cluster, token: &str) -> Vec<(String, Result<(), tonic::Status>)> {
    let member = Member {
        token: ClusterToken::from_text(token),
        tls: member_as(c.dir.path(), Role::Controller).tls,
    };
    let gates = gates(c);
    runtime().block_on(gated_calls(&gates, &member))
}

fn all_accept(c: &Cluster, token: &str) {
    for (gate, r) in calls(c, token) {
        if let Err(e) = r {
            panic!("{gate} refused a token it should take: {e}");
        }
    }
}

fn all_refuse(c: &Cluster, token: &str) {
    for (gate, r) in calls(c, token) {
        let e = r.expect_err(&format!("{gate} took a token it should refuse"));
        assert_eq!(e.code(), Code::Unauthenticated, "{gate}: {e}");
    }
}

/// The three steps from `old` to `new`, each handed to `write` (the text
/// of the token file or Secret), each awaited in every log of `logs`
/// (every member's) before the next, with what each gate takes checked
/// at each step.
fn three_steps(c: &Cluster, logs: &[PathBuf], (old, new): (&str, &str), write: impl Fn(String)) {
    for l in logs {
        assert_eq!(reloads(l), 0, "{}", l.display());
    }
    all_accept(c, old);
    all_refuse(c, new);
    // 1. Both, the old one first.
    write(format!("{old}\n{new}\n"));
    wait_reloaded(logs, 1);
    all_accept(c, new);
    all_accept(c, old);
    // 2. Both, the new one first.
    write(format!("{new}\n{old}\n"));
    wait_reloaded(logs, 2);
    all_accept(c, new);
    all_accept(c, old);
    // 3. The new one alone.
    write(format!("{new}\n"));
    wait_reloaded(logs, 3);
    all_accept(c, new);
    all_refuse(c, old);
}

/// That no log of `logs` shows a call refused for its token.
fn no_call_refused(logs: &[PathBuf]) {
    for l in logs {
        let log = std::fs::read_to_string(l).unwrap_or_default();
        assert!(
            !log.contains(REFUSED),
            "{} shows a call refused for its token",
            l.display()
        );
    }
}

/// The token changes in three steps, each written to the one token file
/// every member reads (as a Secret mounted by every pod would be): the new
/// token as a second line (accepted everywhere, the old one still sent),
/// then as the first (sent everywhere, the old one still accepted), then
/// alone. Each member reads the file again by itself, the engine running
/// the volume included, and no call between them is refused at any step:
/// the nodes stay up, and afterwards the engine started before the change
/// rebuilds a third replica and records it with the new token. The data
/// reads back by checksum, through NBD and from every replica's files.
#[test]
fn the_cluster_token_changes_without_a_window_and_the_volume_keeps_its_data() {
    let c = Cluster::start(3, 1);
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 2}));
    let endpoint = c.attach("v", "node-1");
    c.wait_settled("v", 2, Duration::from_secs(60));
    let dir = c.dir.path();
    let data = write_data(dir, &endpoint, 31);

    let file = cluster_token(dir);
    let old = std::fs::read_to_string(&file).unwrap().trim().to_string();
    let new = format!("{old}-the-next-one");
    let mut logs = vec![c.ctl.proc.log.clone()];
    logs.extend(c.nodes.iter().map(|n| n.proc.log.clone()));
    // The volume's engine, started by node-1 with the old token.
    logs.push(dir.join("node-1").join("state/frontends/v.log"));
    three_steps(&c, &logs, (&old, &new), |text| {
        std::fs::write(&file, text).unwrap()
    });

    // The members still talk: every node is up, and the engine started
    // with the old token records a new replica set.
    for n in &c.nodes {
        assert!(node_is_up(&c.node(&n.id)), "{} is not up", n.id);
    }
    c.ok(
        "PATCH",
        "/v1/volumes/v",
        Some(json!({"numberOfReplicas": 3})),
    );
    c.wait_settled("v", 3, Duration::from_secs(120));
    let recorded = c.volume("v")["status"]["currentReplicas"].clone();
    assert_eq!(recorded.as_array().map(Vec::len), Some(3), "{recorded}");
    // At no step was a member's call refused for its token.
    no_call_refused(&logs);
    verify_data(dir, &endpoint, &data);
    verify_replicas(&c, "v", &data);
}

/// The same three steps with the controller on the Kubernetes store,
/// reading its token from the Secret `ballast-cluster-token` (as deploy/
/// runs it), and the node from a file, as the DaemonSet mounts that
/// Secret: the controller reads the Secret again by itself, and no call
/// between it and the node is refused at any step.
#[test]
fn a_controller_on_kubernetes_reads_its_changed_token_secret_without_a_window() {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::Secret;

    let k = crate::kube_cluster::KubeCluster::start(1);
    let c = &k.c;
    let dir = c.dir.path();
    let file = cluster_token(dir);
    let old = std::fs::read_to_string(&file).unwrap().trim().to_string();
    let new = format!("{old}-the-next-one");
    let logs = vec![c.ctl.proc.log.clone(), c.nodes[0].proc.log.clone()];
    let secret = |text: String| {
        k.rt.block_on(async {
            let api: kube::Api<Secret> =
                kube::Api::namespaced(k.cp.client().await.unwrap(), "ballast");
            let patch = json!({"data": {"token": ByteString(text.clone().into_bytes())}});
            api.patch(
                "ballast-cluster-token",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .unwrap();
        });
        // The kubelet would write the mounted file the same way.
        std::fs::write(&file, text).unwrap();
    };
    // The test acts as a controller: it issues itself a certificate from
    // the CA's Secret, which only controllers read.
    k.rt.block_on(async {
        let api: kube::Api<Secret> = kube::Api::namespaced(k.cp.client().await.unwrap(), "ballast");
        let data = api.get("ballast-cluster-ca").await.unwrap().data.unwrap();
        let key = ballast::tls::CA_KEY_FILE;
        std::fs::write(cluster_ca_dir(dir).join(key), &data[key].0).unwrap();
    });
    three_steps(c, &logs, (&old, &new), secret);
    assert!(node_is_up(&c.node("node-1")), "node-1 is not up");
    no_call_refused(&logs);
}

/// node-1's credentials with a certificate of the cluster of `dir`'s CA
/// that expires in `days` days (the node plugin's own last a year), and
/// the cluster's token.
fn node_1_expiring_in(dir: &Path, days: i64) -> Member {
    let ca_dir = cluster_ca_dir(dir);
    let ca_pem = std::fs::read_to_string(ca_dir.join("ca.crt")).unwrap();
    let ca_key = std::fs::read_to_string(ca_dir.join("ca.key")).unwrap();
    let ca = ballast::tls::Ca::from_pem(&ca_pem, &ca_key).unwrap();
    let credentials = ca
        .issue_expiring(&[Role::Node("node-1".into())], days)
        .unwrap();
    Member {
        token: ClusterToken::read(&cluster_token(dir)).unwrap(),
        tls: ballast::tls::Tls::on(credentials).unwrap(),
    }
}

/// Three heartbeats for node-1 as `member`, to the controller whose agent
/// endpoint is `agent`.
fn three_heartbeats(member: &Member, agent: &str) {
    use ballast::proto::agent::v1::HeartbeatRequest;
    use ballast::proto::agent::v1::controlplane_client::ControlplaneClient;
    runtime().block_on(async {
        let channel = member
            .channel(&format!("http://{agent}"), &Role::Controller)
            .unwrap();
        let mut client = ControlplaneClient::new(channel);
        for _ in 0..3 {
            client
                .heartbeat(HeartbeatRequest {
                    node_id: "node-1".into(),
                    ..Default::default()
                })
                .await
                .unwrap();
        }
    });
}

/// That `c` recorded one `CertificateExpiring` event, on node-1, saying
/// when and what to do.
fn warned_once(c: &Cluster) {
    let events = c.all_events("CertificateExpiring");
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["object"], "node/node-1", "{events:?}");
    let message = events[0]["message"].as_str().unwrap();
    assert!(
        message.contains("in 9 days") && message.contains("was not renewed"),
        "{message}"
    );
}

/// A node whose certificate nears its end is warned of it. Heartbeats for
/// node-1 made with a certificate of the cluster's CA that names node-1
/// and expires in ten days record one `CertificateExpiring` event on
/// node-1 (once a day, however many heartbeats), saying to restart its
/// node plugin. The node plugin's own certificate, a year ahead, records
/// none.
#[test]
fn a_node_whose_certificate_nears_its_end_is_warned_once_a_day() {
    let c = Cluster::start(1, 1);
    // The node's own heartbeats have gone on for a while: no warning.
    std::thread::sleep(Duration::from_secs(2));
    assert!(c.all_events("CertificateExpiring").is_empty());
    three_heartbeats(
        &node_1_expiring_in(c.dir.path(), 10),
        &c.ctl.agent.to_string(),
    );
    warned_once(&c);
}

/// The same through a follower: the leader sees only the follower's
/// certificate on a forwarded heartbeat, and takes the node's expiry from
/// what the follower's handshake read.
#[test]
fn kube_a_node_heartbeating_to_a_follower_is_warned_of_its_certificate_too() {
    use k8s_openapi::api::core::v1::Secret;
    let k = crate::kube_cluster::KubeCluster::start_with(2, 1);
    std::thread::sleep(Duration::from_secs(2));
    assert!(k.c.all_events("CertificateExpiring").is_empty());
    // The CA's key, from the Secret the controllers keep it in, to sign
    // with.
    k.rt.block_on(async {
        let api: kube::Api<Secret> = kube::Api::namespaced(k.cp.client().await.unwrap(), "ballast");
        let data = api.get("ballast-cluster-ca").await.unwrap().data.unwrap();
        let dir = cluster_ca_dir(k.c.dir.path());
        std::fs::write(dir.join("ca.key"), &data["ca.key"].0).unwrap();
    });
    let follower = k.followers[0].agent.to_string();
    three_heartbeats(&node_1_expiring_in(k.c.dir.path(), 10), &follower);
    warned_once(&k.c);
}

/// A running engine's certificate is renewed in place: with every
/// certificate within `--renew-engine-certificates-days` of its end (400,
/// more than the year one lasts), the controller renews the engine's at
/// the first heartbeat that shows it, through its node, and not again
/// for an hour. The engine then makes new connections with it (a third
/// replica built, a replica whose node was killed taken back), and the
/// data reads back by checksum, through NBD and from every replica's files.
#[test]
fn a_running_engines_certificate_is_renewed_in_place_and_it_keeps_serving() {
    let mut c = Cluster::start_with_args(3, 1, None, &["--renew-engine-certificates-days", "400"]);
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 2}));
    let endpoint = c.attach("v", "node-1");
    c.wait_settled("v", 2, Duration::from_secs(60));
    let dir = c.dir.path().to_path_buf();
    let data = write_data(&dir, &endpoint, 41);
    const RENEWED: &str = "EngineCertificateRenewed";
    wait_for(
        Duration::from_secs(60),
        "the engine's certificate renewed",
        || (!c.all_events(RENEWED).is_empty()).then_some(()),
    );
    let state = dir.join("node-1/state");
    let engine_log = std::fs::read_to_string(state.join("frontends/v.log")).unwrap();
    assert!(
        engine_log.contains("renewed the engine's certificate"),
        "the engine's log: {engine_log}"
    );
    let node_log = std::fs::read_to_string(&c.nodes[0].proc.log).unwrap();
    assert!(node_log.contains("renewed the engine's credentials"));
    // What the engine reads again: its volume's, its attachment's and its
    // node's names.
    let pem = std::fs::read_to_string(state.join("frontends/v.tls").join(ballast::tls::CERT_FILE))
        .unwrap();
    let epoch = c.volume("v")["status"]["engineEpoch"].as_u64().unwrap();
    for role in [
        Role::Engine("v".into()),
        Role::Attachment("v".into(), epoch),
        Role::Node("node-1".into()),
    ] {
        assert!(ballast::tls::pem_holds(&pem, &role), "{role:?}");
    }
    // New connections: a third replica, built by the engine (JOIN, FILL).
    c.ok(
        "PATCH",
        "/v1/volumes/v",
        Some(json!({"numberOfReplicas": 3})),
    );
    c.wait_settled("v", 3, Duration::from_secs(120));
    verify_data(&dir, &endpoint, &data);
    // And a replica's node killed while the volume is written, and started
    // again: the engine dials its replica anew to rebuild it.
    c.kill_node(1);
    let more = write_data(&dir, &endpoint, 42);
    c.restart_node(1);
    c.wait_settled("v", 3, Duration::from_secs(120));
    let engine_log = std::fs::read_to_string(state.join("frontends/v.log")).unwrap();
    let (renewed_at, rebuilt) = (
        engine_log.find("renewed the engine's certificate").unwrap(),
        engine_log.matches("replica joined").count(),
    );
    assert_eq!(rebuilt, 2, "two rebuilds: {engine_log}");
    assert!(
        engine_log.find("replica joined").unwrap() > renewed_at,
        "both after the renewal: {engine_log}"
    );
    verify_data(&dir, &endpoint, &more);
    verify_replicas(&c, "v", &more);
    // Heartbeats went on all along: one renewal an hour.
    let renewed = c.all_events(RENEWED);
    assert_eq!(renewed.len(), 1, "{renewed:#?}");
}

/// The leaf certificate a TLS server at `addr` shows a client that expects
/// the name `name` and shows `client`'s certificate (DER).
fn served_certificate(addr: &str, name: &str, client: &ballast::tls::Credentials) -> Vec<u8> {
    let config = client.rustls_client().unwrap();
    let name = rustls::pki_types::ServerName::try_from(name.to_string()).unwrap();
    let mut conn = rustls::ClientConnection::new(config, name).unwrap();
    let mut tcp = std::net::TcpStream::connect(addr.trim_start_matches("http://")).unwrap();
    while conn.is_handshaking() {
        conn.complete_io(&mut tcp).unwrap();
    }
    conn.peer_certificates().unwrap()[0].to_vec()
}

/// DER of the first certificate in `pem`.
fn der_of(pem: &str) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .to_vec()
}

/// A node plugin's and a controller's own certificates are renewed while
/// they run: with every certificate within `--renew-certificate-days` of
/// its end (400, more than the year one lasts), each renews its own at
/// its first check, a minute after its start, and not again for an hour.
/// From then on their servers show the new ones: the controller's agent
/// endpoint, the node's agent endpoint and its replica server (the same
/// certificate, kept in the node's files). New connections take them:
/// node-1's heartbeats move to a new one, where the controller sees its
/// new certificate (a `CertificateRenewed` event), the volume moved to
/// the other node reads node-1's replica through it, and after the
/// controller is restarted node-1's heartbeats keep it ready. The data reads back by checksum
/// through NBD and from every replica's files.
#[test]
fn the_node_plugins_and_the_controllers_certificates_are_renewed_while_they_run() {
    let renew = ["--renew-certificate-days", "400"];
    let mut c = Cluster::start_with_all_args(2, 1, None, &renew, &renew);
    let dir = c.dir.path().to_path_buf();
    let node_dir = dir.join("node-1/state/tls");
    let creds = || ballast::tls::Credentials::load(&node_dir).unwrap();
    let node = c.node("node-1");
    let (agent, replicas) = (
        node["status"]["agentEndpoint"]
            .as_str()
            .unwrap()
            .to_string(),
        node["status"]["replicaEndpoint"]
            .as_str()
            .unwrap()
            .to_string(),
    );
    let controller = c.ctl.agent.to_string();
    let node_name = Role::Node("node-1".into()).name();
    let served = |creds: &ballast::tls::Credentials| {
        [
            served_certificate(&controller, &Role::Controller.name(), creds),
            served_certificate(&agent, &node_name, creds),
            served_certificate(&replicas, &node_name, creds),
        ]
    };
    let before = served(&creds());
    assert_eq!(
        before[1],
        der_of(&creds().cert_pem),
        "node-1 shows its files'"
    );
    assert_eq!(before[1], before[2], "one certificate for both servers");

    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 2}));
    let endpoint = c.attach("v", "node-1");
    c.wait_settled("v", 2, Duration::from_secs(60));
    let data = write_data(&dir, &endpoint, 43);

    let after = wait_for(
        Duration::from_secs(150),
        "the controller's and node-1's certificates renewed",
        || {
            let now = served(&creds());
            (now[0] != before[0] && now[1] != before[1]).then_some(now)
        },
    );
    assert_eq!(
        after[1],
        der_of(&creds().cert_pem),
        "node-1 keeps the new one"
    );
    assert_eq!(after[1], after[2], "the replica server shows it too");
    let holds = |der: &[u8], role: &Role| {
        ballast::tls::holds(&[rustls::pki_types::CertificateDer::from(der)], role)
    };
    assert!(holds(&after[0], &Role::Controller));
    assert!(holds(&after[1], &Role::Node("node-1".into())));
    // One renewal each, at the first check, none since.
    let renewals = |log: &Path, what: &str| {
        let text = std::fs::read_to_string(log).unwrap();
        text.matches(&format!("the {what}'s certificate was renewed"))
            .count()
    };
    assert_eq!(renewals(&c.ctl.proc.log, "controller"), 1);
    // Each node's heartbeats then go on a new connection: the controller
    // checks the new certificate and tells of it, once per node.
    let told = wait_for(
        Duration::from_secs(30),
        "a CertificateRenewed event on each node",
        || {
            let e = c.all_events("CertificateRenewed");
            (e.len() >= 2).then_some(e)
        },
    );
    let mut objects: Vec<&str> = told.iter().filter_map(|e| e["object"].as_str()).collect();
    objects.sort();
    assert_eq!(objects, ["node/node-1", "node/node-2"], "{told:?}");

    // New connections with them: the volume on node-2 reads node-1's
    // replica (node-2's engine checks node-1's new certificate).
    c.ok("POST", "/v1/volumes/v/detach", None);
    let endpoint = c.attach("v", "node-2");
    c.wait_settled("v", 2, Duration::from_secs(60));
    verify_data(&dir, &endpoint, &data);
    let more = write_data(&dir, &endpoint, 44);
    // The controller started again (a certificate of its own start):
    // node-1 connects anew with its renewed certificate and stays ready.
    c.ctl.proc.signal(nix::sys::signal::Signal::SIGKILL);
    c.ctl.proc.wait_exit(Duration::from_secs(10));
    c.ctl.restart();
    // Past the node-down timeout (4 s) twice: ready only if its
    // heartbeats were taken.
    std::thread::sleep(Duration::from_secs(8));
    for _ in 0..4 {
        assert_eq!(c.node("node-1")["status"]["ready"], json!(true));
        std::thread::sleep(Duration::from_secs(1));
    }
    let node_log = c.nodes[0].proc.log_text();
    assert!(
        !node_log.contains("PermissionDenied") && !node_log.contains("Unauthenticated"),
        "{node_log}"
    );
    verify_data(&dir, &endpoint, &more);
    verify_replicas(&c, "v", &more);

    assert_eq!(renewals(&c.nodes[0].proc.log, "node"), 1);
}
