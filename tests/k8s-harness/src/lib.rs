//! A real Kubernetes control plane for tests: etcd, kube-apiserver and
//! kube-controller-manager, the binaries the test bench builds
//! (`tools/k8s/build`), found the envtest way through `KUBEBUILDER_ASSETS`.
//!
//! `ControlPlane::start` generates a CA, serving and client certificates
//! and a service-account key, starts the three on free loopback ports,
//! writes a kubeconfig and waits for `/readyz`. Dropping it stops every
//! process it started, also when a test panics; the processes die with
//! the thread that started them if the test process itself is killed.
//! It owns nothing of Ballast: tests put Ballast on top.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// What goes wrong while setting up the control plane.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "{0}\nBuild the test bench and point KUBEBUILDER_ASSETS at it: \
         `tools/k8s/build target/k8s-tools && export KUBEBUILDER_ASSETS=$PWD/target/k8s-tools` \
         (the project's `./test` does both)"
    )]
    MissingTool(String),
    #[error("certificates: {0}")]
    Certificates(#[from] rcgen::Error),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("{what} did not become ready in {limit:?}; the last lines of its log:\n{log}")]
    NotReady {
        what: String,
        limit: Duration,
        log: String,
    },
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    #[error("the API server's metrics: {0}")]
    Metrics(String),
}

/// Requests the API server served, by verb, group and resource (from
/// `apiserver_request_total`, summed over codes, scopes and versions).
pub type RequestCounts = std::collections::BTreeMap<(String, String, String), u64>;

/// The request counts of the API server's `/metrics` text.
pub fn parse_request_counts(metrics: &str) -> RequestCounts {
    let mut counts = RequestCounts::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{name}=\"")))
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or_default()
                .to_string()
        };
        let n = value.trim().parse::<f64>().unwrap_or(0.0) as u64;
        *counts
            .entry((label("verb"), label("group"), label("resource")))
            .or_default() += n;
    }
    counts
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

/// The directory of the test bench's binaries: `KUBEBUILDER_ASSETS`.
pub fn assets() -> Result<PathBuf, Error> {
    let dir = std::env::var_os("KUBEBUILDER_ASSETS")
        .filter(|d| !d.is_empty())
        .ok_or_else(|| Error::MissingTool("KUBEBUILDER_ASSETS is not set".into()))?;
    Ok(PathBuf::from(dir))
}

/// A binary of the test bench (`etcd`, `kube-apiserver`, `csi-sanity`,
/// `csi-provisioner`, ...), or an error that says how to build it.
pub fn tool(name: &str) -> Result<PathBuf, Error> {
    let dir = assets()?;
    let path = dir.join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::MissingTool(format!(
            "{name} is not in KUBEBUILDER_ASSETS ({})",
            dir.display()
        )))
    }
}

/// `N` different loopback ports that were free a moment ago. They are
/// held all at once while picked: ports picked one after another can come
/// back the same (etcd was once given one port for its clients and its
/// peers, and failed with "address already in use").
pub fn free_ports<const N: usize>() -> Result<[u16; N], Error> {
    let mut held = Vec::with_capacity(N);
    let mut ports = [0u16; N];
    for port in ports.iter_mut() {
        let l = TcpListener::bind("127.0.0.1:0").map_err(io("bind a free port"))?;
        *port = l.local_addr().map_err(io("bind a free port"))?.port();
        held.push(l);
    }
    Ok(ports)
}

/// A process of the control plane; killed on drop.
struct Proc {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn spawn(name: &'static str, bin: &Path, args: &[String], dir: &Path) -> Result<Proc, Error> {
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log).map_err(io(format!("create {}", log.display())))?;
        let err = out.try_clone().map_err(io("log file"))?;
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        // SAFETY: prctl is async-signal-safe; nothing else runs in the child
        // between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                    .map_err(std::io::Error::from)
            });
        }
        let child = cmd
            .spawn()
            .map_err(io(format!("start {}", bin.display())))?;
        Ok(Proc { name, child, log })
    }

    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::killpg(pid, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The files of a cluster's trust: a CA, the API server's serving
/// certificate, an admin client certificate and the service-account key.
struct Pki {
    ca: PathBuf,
    serving_cert: PathBuf,
    serving_key: PathBuf,
    admin_cert: PathBuf,
    admin_key: PathBuf,
    sa_key: PathBuf,
    sa_pub: PathBuf,
}

fn write(path: PathBuf, text: &str) -> Result<PathBuf, Error> {
    std::fs::write(&path, text).map_err(io(format!("write {}", path.display())))?;
    Ok(path)
}

impl Pki {
    fn generate(dir: &Path) -> Result<Pki, Error> {
        let ca_key = KeyPair::generate()?;
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "ballast-test-ca");
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca, ca_key);

        let serving_key = KeyPair::generate()?;
        let mut serving = CertificateParams::new(vec![
            "localhost".to_string(),
            "127.0.0.1".to_string(),
            "kubernetes.default.svc".to_string(),
        ])?;
        serving
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_cert = serving.signed_by(&serving_key, &issuer)?;

        // system:masters: the admin of the test cluster.
        let admin_key = KeyPair::generate()?;
        let mut admin = CertificateParams::new(Vec::<String>::new())?;
        admin.distinguished_name.push(DnType::CommonName, "admin");
        admin
            .distinguished_name
            .push(DnType::OrganizationName, "system:masters");
        admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let admin_cert = admin.signed_by(&admin_key, &issuer)?;

        let sa = KeyPair::generate()?;
        Ok(Pki {
            ca: write(dir.join("ca.crt"), &ca_cert.pem())?,
            serving_cert: write(dir.join("apiserver.crt"), &serving_cert.pem())?,
            serving_key: write(dir.join("apiserver.key"), &serving_key.serialize_pem())?,
            admin_cert: write(dir.join("admin.crt"), &admin_cert.pem())?,
            admin_key: write(dir.join("admin.key"), &admin_key.serialize_pem())?,
            sa_key: write(dir.join("service-account.key"), &sa.serialize_pem())?,
            sa_pub: write(dir.join("service-account.pub"), &sa.public_key_pem())?,
        })
    }
}

/// The controllers of kube-controller-manager a Ballast test needs: the PV
/// binder (a PVC bound to the PV the provisioner makes), the PV and PVC
/// protection finalizers, disruption (PodDisruptionBudgets and the
/// eviction API), the garbage collector, namespaces and service accounts.
pub const CONTROLLERS: &str = "persistentvolume-binder-controller,persistentvolume-protection-controller,\
persistentvolumeclaim-protection-controller,disruption-controller,garbage-collector-controller,\
namespace-controller,serviceaccount-controller";

/// A running control plane; everything stops when it is dropped.
pub struct ControlPlane {
    // Dropped in reverse order of start: the controller manager first.
    procs: Vec<Proc>,
    dir: PathBuf,
    _temp: Option<tempfile::TempDir>,
    /// `https://127.0.0.1:<port>`.
    pub server: String,
    /// A kubeconfig with the cluster's admin credentials.
    pub kubeconfig: PathBuf,
}

impl ControlPlane {
    /// Starts a control plane in a new temporary directory, removed on drop.
    pub async fn start() -> Result<ControlPlane, Error> {
        let temp = tempfile::Builder::new()
            .prefix("ballast-k8s-")
            .tempdir()
            .map_err(io("create a temporary directory"))?;
        let mut cp = Self::start_in(temp.path()).await?;
        cp._temp = Some(temp);
        Ok(cp)
    }

    /// Starts a control plane whose files (certificates, etcd's data, the
    /// kubeconfig and every process's log) are in `dir`, which is kept.
    /// Its ports are picked free, but another process may take one before
    /// etcd or the API server binds it: then it starts again, on new
    /// ports, up to twice more.
    pub async fn start_in(dir: &Path) -> Result<ControlPlane, Error> {
        let mut again = 2;
        loop {
            match Self::start_once(dir).await {
                Err(Error::NotReady { log, .. })
                    if again > 0 && log.contains("address already in use") =>
                {
                    again -= 1;
                    let _ = std::fs::remove_dir_all(dir.join("etcd"));
                }
                started => return started,
            }
        }
    }

    async fn start_once(dir: &Path) -> Result<ControlPlane, Error> {
        let (etcd, apiserver, kcm) = (
            tool("etcd")?,
            tool("kube-apiserver")?,
            tool("kube-controller-manager")?,
        );
        std::fs::create_dir_all(dir).map_err(io(format!("create {}", dir.display())))?;
        let dir = dir
            .canonicalize()
            .map_err(io(format!("resolve {}", dir.display())))?;
        let pki = Pki::generate(&dir)?;
        let mut cp = ControlPlane {
            procs: Vec::new(),
            server: String::new(),
            kubeconfig: dir.join("kubeconfig"),
            dir: dir.clone(),
            _temp: None,
        };

        let [client, peer, port, kcm_port] = free_ports()?;
        let etcd_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let s = |v: &str| v.to_string();
        cp.procs.push(Proc::spawn(
            "etcd",
            &etcd,
            &[
                s("--data-dir"),
                dir.join("etcd").display().to_string(),
                s("--listen-client-urls"),
                etcd_url.clone(),
                s("--advertise-client-urls"),
                etcd_url.clone(),
                s("--listen-peer-urls"),
                peer_url.clone(),
                s("--initial-advertise-peer-urls"),
                peer_url.clone(),
                s("--initial-cluster"),
                format!("default={peer_url}"),
                // A test cluster: no fsync, and a smaller backend.
                s("--unsafe-no-fsync"),
                s("--quota-backend-bytes"),
                s("1073741824"),
            ],
            &dir,
        )?);

        cp.server = format!("https://127.0.0.1:{port}");
        let path = |p: &Path| p.display().to_string();
        cp.procs.push(Proc::spawn(
            "kube-apiserver",
            &apiserver,
            &[
                s("--etcd-servers"),
                etcd_url,
                s("--bind-address"),
                s("127.0.0.1"),
                s("--advertise-address"),
                s("127.0.0.1"),
                s("--secure-port"),
                port.to_string(),
                s("--cert-dir"),
                dir.join("apiserver-certs").display().to_string(),
                s("--tls-cert-file"),
                path(&pki.serving_cert),
                s("--tls-private-key-file"),
                path(&pki.serving_key),
                s("--client-ca-file"),
                path(&pki.ca),
                s("--service-account-issuer"),
                s("https://kubernetes.default.svc"),
                s("--service-account-key-file"),
                path(&pki.sa_pub),
                s("--service-account-signing-key-file"),
                path(&pki.sa_key),
                s("--service-cluster-ip-range"),
                s("10.0.0.0/24"),
                s("--authorization-mode"),
                s("RBAC"),
                s("--allow-privileged=true"),
                // No kubelet mints tokens here; pods need no token volume.
                s("--disable-admission-plugins"),
                s("ServiceAccount"),
            ],
            &dir,
        )?);
        cp.write_kubeconfig(&pki)?;
        cp.wait_ready(Duration::from_secs(120)).await?;

        cp.procs.push(Proc::spawn(
            "kube-controller-manager",
            &kcm,
            &[
                s("--kubeconfig"),
                path(&cp.kubeconfig),
                s("--authentication-kubeconfig"),
                path(&cp.kubeconfig),
                s("--authorization-kubeconfig"),
                path(&cp.kubeconfig),
                s("--controllers"),
                s(CONTROLLERS),
                s("--leader-elect=false"),
                s("--bind-address"),
                s("127.0.0.1"),
                s("--secure-port"),
                kcm_port.to_string(),
                s("--service-account-private-key-file"),
                path(&pki.sa_key),
                s("--root-ca-file"),
                path(&pki.ca),
                s("--use-service-account-credentials=false"),
            ],
            &dir,
        )?);
        Ok(cp)
    }

    fn write_kubeconfig(&self, pki: &Pki) -> Result<(), Error> {
        let config = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {
                "server": self.server,
                "certificate-authority": pki.ca,
            }}],
            "users": [{"name": "admin", "user": {
                "client-certificate": pki.admin_cert,
                "client-key": pki.admin_key,
            }}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "admin"}}],
            "current-context": "test",
        });
        // JSON is YAML: every kubeconfig reader takes it.
        write(self.kubeconfig.clone(), &config.to_string())?;
        Ok(())
    }

    /// An admin client of the API server.
    pub async fn client(&self) -> Result<kube::Client, Error> {
        let kc = kube::config::Kubeconfig::read_from(&self.kubeconfig)
            .map_err(|e| Error::Kubeconfig(e.to_string()))?;
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .map_err(|e| Error::Kubeconfig(e.to_string()))?;
        kube::Client::try_from(config).map_err(|e| Error::Kubeconfig(e.to_string()))
    }

    /// The requests the API server has served so far (see
    /// [`parse_request_counts`]).
    pub async fn request_counts(&self) -> Result<RequestCounts, Error> {
        let client = self.client().await?;
        let req = http::Request::get("/metrics")
            .body(Vec::new())
            .map_err(|e| Error::Metrics(e.to_string()))?;
        let text = client
            .request_text(req)
            .await
            .map_err(|e| Error::Metrics(e.to_string()))?;
        Ok(parse_request_counts(&text))
    }

    async fn wait_ready(&mut self, limit: Duration) -> Result<(), Error> {
        let client = self.client().await?;
        let end = Instant::now() + limit;
        loop {
            if let Some(i) = self.procs.iter_mut().position(|p| !p.running()) {
                let p = &self.procs[i];
                return Err(Error::NotReady {
                    what: format!("{} (it exited)", p.name),
                    limit,
                    log: p.tail(),
                });
            }
            let req = http::Request::get("/readyz").body(Vec::new());
            if let Ok(req) = req
                && let Ok(body) = client.request_text(req).await
                && body.trim() == "ok"
            {
                return Ok(());
            }
            if Instant::now() > end {
                let apiserver = &self.procs[self.procs.len() - 1];
                return Err(Error::NotReady {
                    what: format!("{} at {}", apiserver.name, self.server),
                    limit,
                    log: apiserver.tail(),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The directory of the cluster's files and logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The log of a process of the control plane (`etcd`,
    /// `kube-apiserver`, `kube-controller-manager`).
    pub fn log(&self, name: &str) -> String {
        self.procs
            .iter()
            .find(|p| p.name == name)
            .map(|p| std::fs::read_to_string(&p.log).unwrap_or_default())
            .unwrap_or_default()
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        while let Some(p) = self.procs.pop() {
            drop(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_picked_together_are_all_different() {
        for _ in 0..200 {
            let ports = free_ports::<4>().unwrap();
            let mut seen = ports.to_vec();
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen.len(), 4, "a port picked twice: {ports:?}");
            assert!(ports.iter().all(|p| *p > 0), "{ports:?}");
        }
    }

    #[test]
    fn request_counts_sum_over_codes_by_verb_group_and_resource() {
        let text = r#"# HELP apiserver_request_total Counter of apiserver requests
apiserver_request_total{code="200",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 12
apiserver_request_total{code="409",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 1
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="nodes",scope="cluster",subresource="",verb="LIST",version="v1"} 3
apiserver_request_duration_seconds_count{verb="GET"} 9
"#;
        let c = parse_request_counts(text);
        let key = |v: &str, g: &str, r: &str| (v.to_string(), g.to_string(), r.to_string());
        assert_eq!(c[&key("PUT", "coordination.k8s.io", "leases")], 13);
        assert_eq!(c[&key("LIST", "", "nodes")], 3);
        assert_eq!(c.len(), 2);
    }
}
