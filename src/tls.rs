//! Mutual TLS between the members of one cluster. It owns the cluster's CA
//! (made once by the controller, which alone holds its key), the
//! certificates the CA issues (each controller's own, and each node's when
//! it enrolls, from the node's signing request: the node's key never leaves
//! it), the TLS settings of the agent and controlplane gRPC and of the
//! replica protocol, and the reading of who a peer is from its certificate
//! (`Role`). It opens no socket; it reads and writes only the files it is
//! given.
//!
//! Names: a controller's certificate is for `controller.ballast.internal`,
//! node N's for `N.node.ballast.internal` and `node.ballast.internal`;
//! the engine of volume V, started for its attachment E, holds
//! `V.volume.ballast.internal` and `E.V.attachment.ballast.internal`
//! besides its node's names; a node the controller lets read volume V's
//! replicas for a rebuild or a restore holds `V.reader.ballast.internal`
//! besides its own names, for an hour. A client checks the name of
//! the peer it means to reach; a server reads the role of its client from
//! the same names.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tonic::service::Interceptor;

use crate::cluster_token::{Authed, Both, ClusterToken};
use tonic::transport::{Certificate, ClientTlsConfig};
use tonic::{Request, Status};

/// The DNS suffix of every member's certificate names (never resolved).
pub const DOMAIN: &str = "ballast.internal";
/// How long a member's certificate is valid; it is renewed at every start,
/// and before it expires while its holder runs.
pub const MEMBER_DAYS: i64 = 365;
/// When a member first checks whether its certificate is due for renewal,
/// after its start, and how often after that (at most one renewal an
/// hour).
const RENEWAL_FIRST_CHECK: std::time::Duration = std::time::Duration::from_secs(60);
const RENEWAL_EVERY: std::time::Duration = std::time::Duration::from_secs(3600);
/// How long a reader's certificate is valid: it is asked for per fill, and
/// a fill holds one connection, checked at its handshake (a fill that
/// loses it fails, and the next asks again). Members' clocks must agree
/// within it.
pub const READER_VALID: std::time::Duration = std::time::Duration::from_secs(3600);
/// How long the CA is valid.
pub const CA_DAYS: i64 = 3650;
/// The files of a CA's directory (`--cluster-ca-dir`).
pub const CA_CERT_FILE: &str = "ca.crt";
pub const CA_KEY_FILE: &str = "ca.key";
/// The protocol gRPC runs on, as TLS names it (ALPN).
const ALPN_H2: &[u8] = b"h2";
/// The files of a member's credentials directory (besides `ca.crt`).
pub const CERT_FILE: &str = "tls.crt";
pub const KEY_FILE: &str = "tls.key";

/// How long [`Credentials::load`] reads again a key that is not its
/// certificate's, waiting for the writer replacing them to finish.
pub const LOAD_SETTLES_IN: std::time::Duration = std::time::Duration::from_secs(1);

/// What goes wrong with certificates and TLS settings.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("certificate: {0}")]
    Certificate(#[from] rcgen::Error),
    #[error("TLS settings: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("{0}")]
    Invalid(String),
    /// A renewal found no certificate to take: its source failed, or gave
    /// none newer than the one held.
    #[error("no new certificate: {0}")]
    NotRenewed(String),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TlsError + '_ {
    move |source| TlsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Who a certificate says its holder is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    Controller,
    /// A node plugin (and the engines it starts, which use its certificate).
    Node(String),
    /// Any node: what a client checks when it knows only an address.
    AnyNode,
    /// The engine of a volume: the one the controller started, on the node
    /// it chose. Its certificate also carries that node's names.
    Engine(String),
    /// The attachment of a volume an engine was started for (the volume's
    /// `status.engineEpoch` then): replicas fence out the engines of
    /// earlier attachments, and a claim of one must be in the certificate.
    Attachment(String, u64),
    /// A node the controller lets read a volume's replicas: the target of
    /// a rebuild of that volume, or of a restore from it.
    Reader(String),
}

impl Role {
    /// The name a certificate of this role is valid for, and the one a
    /// client checks.
    pub fn name(&self) -> String {
        match self {
            Role::Controller => format!("controller.{DOMAIN}"),
            Role::Node(id) => format!("{id}.node.{DOMAIN}"),
            Role::AnyNode => format!("node.{DOMAIN}"),
            Role::Engine(volume) => format!("{volume}.volume.{DOMAIN}"),
            Role::Attachment(volume, epoch) => format!("{epoch}.{volume}.attachment.{DOMAIN}"),
            Role::Reader(volume) => format!("{volume}.reader.{DOMAIN}"),
        }
    }

    /// Every name a certificate of this role carries.
    fn names(&self) -> Vec<String> {
        match self {
            Role::Node(_) => vec![self.name(), Role::AnyNode.name()],
            _ => vec![self.name()],
        }
    }
}

/// Whether `certs` (a peer's chain, end entity first, already verified
/// against the CA by the handshake) belong to `role`.
pub fn holds(certs: &[CertificateDer<'_>], role: &Role) -> bool {
    let Some(leaf) = certs.first() else {
        return false;
    };
    let Ok(cert) = webpki::EndEntityCert::try_from(leaf) else {
        return false;
    };
    let Ok(name) = ServerName::try_from(role.name()) else {
        return false;
    };
    cert.verify_is_valid_for_subject_name(&name).is_ok()
}

/// Whether the certificate in `cert_pem` belongs to `role` (its chain not
/// verified here: for checking what a member was sent is what it asked).
pub fn pem_holds(cert_pem: &str, role: &Role) -> bool {
    CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .is_ok_and(|certs| holds(&certs, role))
}

/// Whether `certs` (a peer's chain, end entity first, already verified
/// against the CA by the handshake) are an engine's, of whatever volume:
/// their first names a volume (`Role::Engine`).
pub fn is_engine(certs: &[CertificateDer<'_>]) -> bool {
    let Some(leaf) = certs.first() else {
        return false;
    };
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(leaf) else {
        return false;
    };
    let Ok(Some(names)) = cert.subject_alternative_name() else {
        return false;
    };
    let suffix = format!(".volume.{DOMAIN}");
    names.value.general_names.iter().any(
        |n| matches!(n, x509_parser::extensions::GeneralName::DNSName(d) if d.ends_with(&suffix)),
    )
}

/// The date `days` from today, as a certificate date (at midnight UTC,
/// so that "from yesterday" covers the differences between members'
/// clocks).
fn date(days: i64) -> time::OffsetDateTime {
    use chrono::Datelike;
    let d = chrono::Utc::now().date_naive() + chrono::Duration::days(days);
    rcgen::date_time_ymd(d.year(), d.month() as u8, d.day() as u8)
}

/// The parameters of a member's certificate for `roles` (the first names
/// it), valid for [`MEMBER_DAYS`] from now, to the second: a certificate
/// made later ends later, so a renewal always shows as one.
fn member_params(roles: &[Role]) -> Result<CertificateParams, TlsError> {
    member_params_until(roles, member_end())
}

/// When a member's certificate made now ends.
fn member_end() -> time::OffsetDateTime {
    let end = time::OffsetDateTime::now_utc() + time::Duration::days(MEMBER_DAYS);
    end.replace_nanosecond(0).unwrap_or(end)
}

fn member_params_until(
    roles: &[Role],
    not_after: time::OffsetDateTime,
) -> Result<CertificateParams, TlsError> {
    let first = roles
        .first()
        .ok_or_else(|| TlsError::Invalid("a certificate for no role".into()))?;
    let mut p = CertificateParams::new(roles.iter().flat_map(Role::names).collect::<Vec<_>>())?;
    p.distinguished_name.push(DnType::CommonName, first.name());
    p.distinguished_name
        .push(DnType::OrganizationName, "ballast cluster");
    p.is_ca = IsCa::ExplicitNoCa;
    p.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    p.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    p.not_before = date(-1);
    p.not_after = not_after;
    Ok(p)
}

/// The cluster's certificate authority.
pub struct Ca {
    cert_pem: String,
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Ca")
    }
}

impl Ca {
    /// A new CA with a new key.
    pub fn generate() -> Result<Ca, TlsError> {
        let key = KeyPair::generate()?;
        let mut p = CertificateParams::new(Vec::<String>::new())?;
        p.distinguished_name
            .push(DnType::CommonName, format!("ballast cluster CA ({DOMAIN})"));
        p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        p.not_before = date(-1);
        p.not_after = date(CA_DAYS);
        let cert = p.self_signed(&key)?;
        Ok(Ca {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            issuer: Issuer::new(p, key),
        })
    }

    /// The CA of these PEM texts.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Ca, TlsError> {
        let issuer = Issuer::from_ca_cert_pem(cert_pem, KeyPair::from_pem(key_pem)?)?;
        Ok(Ca {
            cert_pem: cert_pem.to_string(),
            key_pem: key_pem.to_string(),
            issuer,
        })
    }

    /// The CA kept in `dir` (`ca.crt`, `ca.key`), made there when missing.
    pub fn in_dir(dir: &Path) -> Result<Ca, TlsError> {
        let (cert, key) = (dir.join(CA_CERT_FILE), dir.join(CA_KEY_FILE));
        if cert.exists() || key.exists() {
            let c = std::fs::read_to_string(&cert).map_err(io_err(&cert))?;
            let k = std::fs::read_to_string(&key).map_err(io_err(&key))?;
            return Ca::from_pem(&c, &k);
        }
        let ca = Ca::generate()?;
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        write_private(&key, &ca.key_pem)?;
        write_atomically(&cert, &ca.cert_pem, 0o644)?;
        Ok(ca)
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// New credentials (a new key) for `role`: a controller's own, and
    /// tests'.
    pub fn issue(&self, role: &Role) -> Result<Credentials, TlsError> {
        self.issue_for(std::slice::from_ref(role))
    }

    /// The credentials of the engine of `volume` that the controller
    /// starts on node `node_id` for the volume's attachment `attachment`
    /// (its engine epoch): it may change that volume's replicas (no one
    /// else may), fences out the engines of earlier attachments, and is
    /// that node for everything else.
    pub fn issue_engine(
        &self,
        volume: &str,
        node_id: &str,
        attachment: u64,
    ) -> Result<Credentials, TlsError> {
        crate::model::validate_name(volume).map_err(TlsError::Invalid)?;
        crate::model::validate_name(node_id).map_err(TlsError::Invalid)?;
        self.issue_for(&[
            Role::Engine(volume.to_string()),
            Role::Attachment(volume.to_string(), attachment),
            Role::Node(node_id.to_string()),
        ])
    }

    /// New credentials for `roles` whose certificate ends `days` days from
    /// today (at midnight UTC): how tests make one near its end.
    #[cfg(any(test, feature = "contract-tests"))]
    pub fn issue_expiring(&self, roles: &[Role], days: i64) -> Result<Credentials, TlsError> {
        self.issue_until(roles, date(days))
    }

    fn issue_for(&self, roles: &[Role]) -> Result<Credentials, TlsError> {
        self.issue_until(roles, member_end())
    }

    fn issue_until(
        &self,
        roles: &[Role],
        not_after: time::OffsetDateTime,
    ) -> Result<Credentials, TlsError> {
        let key = KeyPair::generate()?;
        let cert = member_params_until(roles, not_after)?.signed_by(&key, &self.issuer)?;
        Ok(Credentials {
            ca_pem: self.cert_pem.clone(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// The certificate for node `node_id` of the signing request `csr_pem`:
    /// only its public key is taken; the names, uses and dates are the
    /// CA's (a request cannot ask for another role).
    pub fn sign(&self, node_id: &str, csr_pem: &str) -> Result<String, TlsError> {
        crate::model::validate_name(node_id).map_err(TlsError::Invalid)?;
        let mut csr = CertificateSigningRequestParams::from_pem(csr_pem)?;
        csr.params = member_params(&[Role::Node(node_id.to_string())])?;
        Ok(csr.signed_by(&self.issuer)?.pem())
    }

    /// The certificate that lets node `node_id` read the replicas of
    /// `volume` (a rebuild's or a restore's source), for
    /// [`READER_VALID`] from now, for the key of the signing request
    /// `csr_pem`: the names are the CA's, as in [`Ca::sign`].
    pub fn sign_reader(
        &self,
        node_id: &str,
        volume: &str,
        csr_pem: &str,
    ) -> Result<String, TlsError> {
        crate::model::validate_name(node_id).map_err(TlsError::Invalid)?;
        crate::model::validate_name(volume).map_err(TlsError::Invalid)?;
        let mut csr = CertificateSigningRequestParams::from_pem(csr_pem)?;
        csr.params = member_params_until(
            &[
                Role::Reader(volume.to_string()),
                Role::Node(node_id.to_string()),
            ],
            time::OffsetDateTime::now_utc() + READER_VALID,
        )?;
        Ok(csr.signed_by(&self.issuer)?.pem())
    }
}

/// A node's enrollment: a new key and the signing request the controller
/// signs.
pub struct Enrollment {
    key: KeyPair,
    pub csr_pem: String,
}

impl Enrollment {
    pub fn new(node_id: &str) -> Result<Enrollment, TlsError> {
        let key = KeyPair::generate()?;
        let csr = member_params(&[Role::Node(node_id.to_string())])?.serialize_request(&key)?;
        Ok(Enrollment {
            csr_pem: csr.pem()?,
            key,
        })
    }

    /// The credentials once the CA `ca_pem` signed `cert_pem`.
    pub fn finish(self, ca_pem: &str, cert_pem: &str) -> Credentials {
        Credentials {
            ca_pem: ca_pem.to_string(),
            cert_pem: cert_pem.to_string(),
            key_pem: self.key.serialize_pem(),
        }
    }
}

/// When the certificate `cert_pem` (the first in it) stops being valid, in
/// seconds since the Unix epoch: what `/metrics` shows, so that an
/// operator sees a renewal coming.
pub fn not_after(cert_pem: &str) -> Result<i64, TlsError> {
    let cert = CertificateDer::from_pem_slice(cert_pem.as_bytes())
        .map_err(|e| TlsError::Invalid(format!("not a PEM certificate: {e}")))?;
    leaf_not_after(&[cert]).ok_or_else(|| TlsError::Invalid("not an X.509 certificate".into()))
}

/// When the first of `certs` (a peer's chain, end entity first) stops
/// being valid, in seconds since the Unix epoch.
pub fn leaf_not_after(certs: &[CertificateDer<'_>]) -> Option<i64> {
    let (_, cert) = x509_parser::parse_x509_certificate(certs.first()?).ok()?;
    Some(cert.validity().not_after.timestamp())
}

/// Whether a certificate valid until `not_after` (seconds since the Unix
/// epoch; 0: unknown) is due for renewal at `now`: within `days` of its
/// end, or past it.
pub fn due_for_renewal(not_after: i64, now: chrono::DateTime<chrono::Utc>, days: i64) -> bool {
    not_after > 0
        && chrono::DateTime::from_timestamp(not_after, 0)
            .is_some_and(|until| until - now < chrono::Duration::days(days))
}

/// Runs `check` (a renewal of `whose` certificate, when it is due)
/// [`RENEWAL_FIRST_CHECK`] after the start, then every [`RENEWAL_EVERY`],
/// for ever; a failure is logged, and tried again at the next check.
pub async fn keep_renewing<F>(whose: &str, mut check: impl FnMut() -> F)
where
    F: std::future::Future<Output = Result<bool, TlsError>>,
{
    tokio::time::sleep(RENEWAL_FIRST_CHECK).await;
    loop {
        if let Err(e) = check().await {
            tracing::warn!(error = %e, "{whose} certificate was not renewed; it is tried again in an hour");
        }
        tokio::time::sleep(RENEWAL_EVERY).await;
    }
}

/// A member's CA certificate, certificate and key, in PEM.
#[derive(Clone)]
pub struct Credentials {
    pub ca_pem: String,
    pub cert_pem: String,
    key_pem: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credentials")
    }
}

impl Credentials {
    /// Credentials from their PEM texts (an engine's, as the controller
    /// sends them).
    pub fn from_pem(ca_pem: &str, cert_pem: &str, key_pem: &str) -> Credentials {
        Credentials {
            ca_pem: ca_pem.to_string(),
            cert_pem: cert_pem.to_string(),
            key_pem: key_pem.to_string(),
        }
    }

    /// The key, PEM (to hand an engine's credentials to its node).
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// The credentials kept in `dir` (`ca.crt`, `tls.crt`, `tls.key`), with
    /// a key that is the certificate's. A writer replaces the files one at
    /// a time (a renewal's [`save`](Self::save), or a kubelet updating a
    /// mounted Secret), so a read between two of its renames can find the
    /// new key beside the old certificate: such a read is taken again, for
    /// up to [`LOAD_SETTLES_IN`], before the mismatch is an error.
    pub fn load(dir: &Path) -> Result<Credentials, TlsError> {
        let started = std::time::Instant::now();
        loop {
            let read = Self::read(dir)?;
            match read.certified_key() {
                Ok(_) => return Ok(read),
                Err(e) if started.elapsed() >= LOAD_SETTLES_IN => {
                    return Err(TlsError::Invalid(format!(
                        "{}: {KEY_FILE} and {CERT_FILE} do not make a pair: {e}",
                        dir.display()
                    )));
                }
                Err(_) => std::thread::sleep(LOAD_SETTLES_IN / 50),
            }
        }
    }

    /// The files as they are, read one after the other.
    fn read(dir: &Path) -> Result<Credentials, TlsError> {
        let read = |f: &str| {
            let p = dir.join(f);
            std::fs::read_to_string(&p).map_err(io_err(&p))
        };
        Ok(Credentials {
            ca_pem: read(CA_CERT_FILE)?,
            cert_pem: read(CERT_FILE)?,
            key_pem: read(KEY_FILE)?,
        })
    }

    /// Keeps them in `dir`, the key readable by its owner only. Each file
    /// is replaced whole, and all three are written and synced before the
    /// first is renamed into place, so the key and its certificate change
    /// within microseconds of each other ([`load`](Self::load) reads past
    /// that).
    pub fn save(&self, dir: &Path) -> Result<(), TlsError> {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let files = [
            (KEY_FILE, &self.key_pem, 0o600),
            (CERT_FILE, &self.cert_pem, 0o644),
            (CA_CERT_FILE, &self.ca_pem, 0o644),
        ];
        let mut written = Vec::with_capacity(files.len());
        for (name, text, mode) in files {
            let path = dir.join(name);
            written.push((written_aside(&path, text, mode)?, path));
        }
        for (tmp, path) in written {
            std::fs::rename(&tmp, &path).map_err(io_err(&path))?;
        }
        Ok(())
    }

    /// A gRPC server's settings, showing the certificate in `slot`: a
    /// client may come without a certificate (a node enrolling), and the
    /// services' gates decide who may call what; one with a certificate
    /// not of the cluster's CA fails the handshake.
    fn grpc_server_in(&self, slot: Arc<CertSlot>) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            self.roots()?,
            provider.clone(),
        )
        .allow_unauthenticated()
        .build()
        .map_err(|e| TlsError::Invalid(format!("client verifier: {e}")))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(verifier)
            .with_cert_resolver(slot);
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        Ok(Arc::new(config))
    }

    /// A gRPC client's settings, showing the certificate in `slot` (the
    /// server's name is checked per connection).
    fn grpc_client_in(&self, slot: Arc<CertSlot>) -> Result<Arc<rustls::ClientConfig>, TlsError> {
        let mut config = self.client_config(slot)?;
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        Ok(Arc::new(config))
    }

    fn roots(&self) -> Result<Arc<rustls::RootCertStore>, TlsError> {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(self.ca_pem.as_bytes()) {
            let c = c.map_err(|e| TlsError::Invalid(format!("the CA certificate: {e}")))?;
            roots.add(c)?;
        }
        Ok(Arc::new(roots))
    }

    fn chain_and_key(
        &self,
    ) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
        let chain = CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsError::Invalid(format!("the certificate: {e}")))?;
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())
            .map_err(|e| TlsError::Invalid(format!("the key: {e}")))?;
        Ok((chain, key))
    }

    /// The certificate and key, ready to sign handshakes: refused when
    /// the key is not the certificate's, or there is no certificate.
    fn certified_key(&self) -> Result<Arc<rustls::sign::CertifiedKey>, TlsError> {
        let (chain, key) = self.chain_and_key()?;
        let provider = rustls::crypto::ring::default_provider();
        Ok(Arc::new(rustls::sign::CertifiedKey::from_der(
            chain, key, &provider,
        )?))
    }

    /// A replica server's settings: every client shows a certificate of
    /// the cluster, or the handshake fails.
    pub fn rustls_server(&self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        self.rustls_server_in(CertSlot::of(self)?)
    }

    /// The same, showing the certificate in `slot` (which a renewal
    /// replaces) instead of these credentials'.
    pub fn rustls_server_in(
        &self,
        slot: Arc<CertSlot>,
    ) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            self.roots()?,
            provider.clone(),
        )
        .build()
        .map_err(|e| TlsError::Invalid(format!("client verifier: {e}")))?;
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(verifier)
            .with_cert_resolver(slot);
        Ok(Arc::new(config))
    }

    /// A replica client's settings (the server's name is checked per
    /// connection).
    pub fn rustls_client(&self) -> Result<Arc<rustls::ClientConfig>, TlsError> {
        self.rustls_client_in(CertSlot::of(self)?)
    }

    /// The same, showing the certificate in `slot`.
    pub fn rustls_client_in(
        &self,
        slot: Arc<CertSlot>,
    ) -> Result<Arc<rustls::ClientConfig>, TlsError> {
        Ok(Arc::new(self.client_config(slot)?))
    }

    fn client_config(&self, slot: Arc<CertSlot>) -> Result<rustls::ClientConfig, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(self.roots()?)
            .with_client_cert_resolver(slot);
        // No resumption: a resumed session keeps the identity it was made
        // with, so after a renewal the server would still see the old
        // certificate. Every connection shows the one held now.
        config.resumption = rustls::client::Resumption::disabled();
        Ok(config)
    }
}

/// The certificate and key a member's TLS sides show, which a renewal
/// replaces in place: handshakes after it show the new certificate, and
/// connections already made keep theirs. A renewal keeps the CA: the
/// peers a member trusts do not change with its own certificate.
#[derive(Debug)]
pub struct CertSlot(std::sync::RwLock<Arc<rustls::sign::CertifiedKey>>);

impl CertSlot {
    pub fn of(credentials: &Credentials) -> Result<Arc<CertSlot>, TlsError> {
        Ok(Arc::new(CertSlot(std::sync::RwLock::new(
            credentials.certified_key()?,
        ))))
    }

    /// Shows `credentials`' certificate from the next handshake on.
    pub fn renew(&self, credentials: &Credentials) -> Result<(), TlsError> {
        let key = credentials.certified_key()?;
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = key;
        Ok(())
    }

    fn current(&self) -> Arc<rustls::sign::CertifiedKey> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl rustls::server::ResolvesServerCert for CertSlot {
    fn resolve(
        &self,
        _: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.current())
    }
}

impl rustls::client::ResolvesClientCert for CertSlot {
    fn resolve(
        &self,
        _: &[&[u8]],
        _: &[rustls::SignatureScheme],
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.current())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// A gRPC client's settings for a node that has no certificate yet: it
/// checks the controller's against the CA and shows none.
pub fn enrolling_client(ca_pem: &str) -> ClientTlsConfig {
    ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .domain_name(Role::Controller.name())
}

/// Writes `text` to `path` through a temporary file renamed over it.
fn write_atomically(path: &Path, text: &str, mode: u32) -> Result<(), TlsError> {
    let tmp = written_aside(path, text, mode)?;
    std::fs::rename(&tmp, path).map_err(io_err(path))
}

/// `text` written and synced beside `path` (its name and `.tmp`), in the
/// file that is returned, to be renamed over it.
fn written_aside(path: &Path, text: &str, mode: u32) -> Result<PathBuf, TlsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .and_then(|mut f| f.write_all(text.as_bytes()).and_then(|()| f.sync_all()))
        .map_err(io_err(&tmp))?;
    Ok(tmp)
}

fn write_private(path: &Path, text: &str) -> Result<(), TlsError> {
    write_atomically(path, text, 0o600)
}

/// A process's TLS: its credentials, or none (plain TCP, as before TLS).
/// Its gRPC servers and channels show the certificate from one
/// [`CertSlot`], so a renewal reaches every handshake after it.
#[derive(Clone, Debug, Default)]
pub struct Tls(Option<Arc<Held>>);

#[derive(Debug)]
struct Held {
    credentials: std::sync::RwLock<Arc<Credentials>>,
    slot: Arc<CertSlot>,
    server: Arc<rustls::ServerConfig>,
    client: Arc<rustls::ClientConfig>,
}

impl Tls {
    /// TLS with `credentials`: refused when the key is not the
    /// certificate's, or a certificate does not parse.
    pub fn on(credentials: Credentials) -> Result<Tls, TlsError> {
        let slot = CertSlot::of(&credentials)?;
        let server = credentials.grpc_server_in(slot.clone())?;
        let client = credentials.grpc_client_in(slot.clone())?;
        Ok(Tls(Some(Arc::new(Held {
            credentials: std::sync::RwLock::new(Arc::new(credentials)),
            slot,
            server,
            client,
        }))))
    }

    /// The credentials held now (the last renewal's).
    pub fn credentials(&self) -> Option<Arc<Credentials>> {
        self.0.as_ref().map(|h| {
            h.credentials
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
        })
    }

    /// The slot the gRPC sides show their certificate from, for other
    /// sides (the replica protocol's) to share.
    pub fn slot(&self) -> Option<Arc<CertSlot>> {
        self.0.as_ref().map(|h| h.slot.clone())
    }

    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// Holds `credentials` from now on, and shows their certificate from
    /// the next handshake on, on every copy of this `Tls`. Refused, with
    /// nothing changed, when TLS is off, when they are of another CA (a
    /// renewal keeps whom a member trusts), or when the key is not the
    /// certificate's.
    pub fn renew(&self, credentials: Credentials) -> Result<(), TlsError> {
        let Some(h) = &self.0 else {
            return Err(TlsError::Invalid("TLS is off: nothing to renew".into()));
        };
        if self
            .credentials()
            .is_some_and(|c| c.ca_pem != credentials.ca_pem)
        {
            return Err(TlsError::Invalid(
                "a renewal's CA certificate differs from the one held".into(),
            ));
        }
        h.slot.renew(&credentials)?;
        *h.credentials.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(credentials);
        Ok(())
    }

    /// Renews the certificate when it is due at `now` (within `days` of
    /// its end): takes what `fresh` gives, if it is a new certificate that
    /// ends no sooner than the one held, has `keep` keep it (in files),
    /// and only then shows it, so that what a member shows is what it
    /// finds again at a restart; returns it. None: not due, TLS off, or
    /// `fresh` gave the certificate held (nothing new yet, as from a
    /// directory whose files were not replaced since).
    pub async fn renew_if_due<F>(
        &self,
        now: chrono::DateTime<chrono::Utc>,
        days: i64,
        fresh: impl FnOnce() -> F,
        keep: impl FnOnce(&Credentials) -> Result<(), TlsError>,
    ) -> Result<Option<Credentials>, TlsError>
    where
        F: std::future::Future<Output = Result<Credentials, TlsError>>,
    {
        let Some(held) = self.credentials() else {
            return Ok(None);
        };
        let until = not_after(&held.cert_pem)?;
        if !due_for_renewal(until, now, days) {
            return Ok(None);
        }
        let fresh = fresh().await?;
        if fresh.cert_pem == held.cert_pem {
            // Nothing new yet (files not replaced since): not a failure.
            return Ok(None);
        }
        if not_after(&fresh.cert_pem)? < until {
            return Err(TlsError::NotRenewed(format!(
                "the one given ends before the one held (at {})",
                chrono::DateTime::from_timestamp(until, 0).unwrap_or_default()
            )));
        }
        keep(&fresh)?;
        self.renew(fresh.clone())?;
        Ok(Some(fresh))
    }

    /// A channel to the server(s) of `url` (see `grpc::tcp_channel` and
    /// `grpc::tls_channel`), checked to be `peer` when TLS is on.
    pub fn channel(
        &self,
        url: &str,
        peer: &Role,
    ) -> Result<tonic::transport::Channel, crate::error::ServeError> {
        self.channel_calls(url, peer, crate::grpc::Calls::Bounded)
    }

    /// As `channel`, its calls bounded as `calls` says.
    pub fn channel_calls(
        &self,
        url: &str,
        peer: &Role,
        calls: crate::grpc::Calls,
    ) -> Result<tonic::transport::Channel, crate::error::ServeError> {
        match &self.0 {
            None => crate::grpc::tcp_channel_calls(url, None, calls),
            Some(h) => crate::grpc::tls_channel(url, h.client.clone(), &peer.name(), calls),
        }
    }

    /// Serves `router` on `listener` until `signal`, over TLS when it is
    /// on (see `grpc::serve_tcp`).
    pub async fn serve(
        &self,
        router: tonic::transport::server::Router,
        listener: tokio::net::TcpListener,
        signal: impl std::future::Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error> {
        crate::grpc::serve_tcp(
            router,
            listener,
            self.0.as_ref().map(|h| h.server.clone()),
            signal,
        )
        .await
    }

    /// The interceptor that lets through only callers whose certificate
    /// is of one of `roles` (everyone, when TLS is off).
    pub fn require(&self, roles: &[Role]) -> RequirePeer {
        RequirePeer {
            on: self.is_on(),
            roles: roles.into(),
        }
    }
}

/// Refuses a call whose client certificate is of none of its roles.
#[derive(Clone, Debug)]
pub struct RequirePeer {
    on: bool,
    roles: Arc<[Role]>,
}

impl Interceptor for RequirePeer {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        if !self.on {
            return Ok(request);
        }
        match request.peer_certs() {
            Some(certs) if self.roles.iter().any(|r| holds(&certs, r)) => Ok(request),
            Some(_) => Err(Status::permission_denied(format!(
                "only {} may make this call",
                self.roles
                    .iter()
                    .map(Role::name)
                    .collect::<Vec<_>>()
                    .join(" or ")
            ))),
            None => Err(Status::unauthenticated(
                "a client certificate of this cluster is required",
            )),
        }
    }
}

/// Whether the caller of `request` may speak for node `node_id`: with TLS
/// on, its certificate is that node's or a controller's. (A call without a
/// certificate is the gates' to refuse; TLS off, anyone may.)
pub fn acts_for_node<T>(request: &Request<T>, node_id: &str) -> Result<(), Status> {
    match request.peer_certs() {
        None => Ok(()),
        Some(c) if holds(&c, &Role::Node(node_id.to_string())) || holds(&c, &Role::Controller) => {
            Ok(())
        }
        Some(_) => Err(Status::permission_denied(format!(
            "only node {node_id}'s certificate may make this call for it"
        ))),
    }
}

/// Whether the caller of `request`, claiming to be the engine of volume
/// `volume`'s attachment `epoch`, may: with TLS on, an engine's
/// certificate must name that attachment (a node's or a controller's may
/// claim any of its own; TLS off, anyone may).
pub fn claims_attachment<T>(request: &Request<T>, volume: &str, epoch: u64) -> Result<(), Status> {
    match request.peer_certs() {
        Some(c) if is_engine(&c) && !holds(&c, &Role::Attachment(volume.to_string(), epoch)) => {
            Err(Status::permission_denied(format!(
                "this engine's certificate does not name attachment {epoch} of volume {volume}"
            )))
        }
        _ => Ok(()),
    }
}

/// What a member of the cluster proves itself with: the cluster token on
/// every call, and its certificate when TLS is on.
#[derive(Clone, Debug, Default)]
pub struct Member {
    pub token: ClusterToken,
    pub tls: Tls,
}

impl Member {
    /// A channel to `url` checked to be `peer`, whose calls carry the token.
    pub fn channel(&self, url: &str, peer: &Role) -> Result<Authed, crate::error::ServeError> {
        self.channel_calls(url, peer, crate::grpc::Calls::Bounded)
    }

    /// As `channel`, its calls bounded as `calls` says.
    pub fn channel_calls(
        &self,
        url: &str,
        peer: &Role,
        calls: crate::grpc::Calls,
    ) -> Result<Authed, crate::error::ServeError> {
        Ok(tonic::service::interceptor::InterceptedService::new(
            self.tls.channel_calls(url, peer, calls)?,
            self.token.sender(),
        ))
    }

    /// The gate of a service only `roles` may call (and that wants the
    /// token).
    pub fn gate(&self, roles: &[Role]) -> Both<RequirePeer> {
        self.token.gate().and(self.tls.require(roles))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn a_certificate_is_due_within_the_days_before_it_expires() {
        let now = chrono::Utc
            .with_ymd_and_hms(2026, 11, 29, 12, 0, 0)
            .unwrap();
        let at = |days: i64| (now + chrono::Duration::days(days)).timestamp();
        assert!(!due_for_renewal(at(31), now, 30));
        assert!(due_for_renewal(at(29), now, 30));
        assert!(due_for_renewal(at(-1), now, 30), "expired: still renewed");
        assert!(!due_for_renewal(0, now, 30), "unknown");
        assert!(due_for_renewal(at(365), now, 400));
    }

    fn der(pem: &str) -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap()
    }

    #[test]
    fn a_signed_request_gets_the_node_s_names_only() {
        let ca = Ca::generate().unwrap();
        let e = Enrollment::new("node-1").unwrap();
        let cert = ca.sign("node-1", &e.csr_pem).unwrap();
        let certs = der(&cert);
        assert!(holds(&certs, &Role::Node("node-1".into())));
        assert!(holds(&certs, &Role::AnyNode));
        assert!(!holds(&certs, &Role::Node("node-2".into())));
        assert!(!holds(&certs, &Role::Controller));
        // A request for node-1 signed as node-2 carries node-2's names.
        let other = ca.sign("node-2", &e.csr_pem).unwrap();
        assert!(holds(&der(&other), &Role::Node("node-2".into())));
        assert!(!holds(&der(&other), &Role::Node("node-1".into())));
        assert!(ca.sign("../x", &e.csr_pem).is_err());
        let c = e.finish(ca.cert_pem(), &cert);
        c.rustls_server().unwrap();
        c.rustls_client().unwrap();
    }

    #[test]
    fn an_engine_certificate_names_its_volume_and_its_node() {
        let ca = Ca::generate().unwrap();
        let c = ca.issue_engine("vol-1", "node-2", 7).unwrap();
        let certs = der(&c.cert_pem);
        assert!(holds(&certs, &Role::Engine("vol-1".into())));
        assert!(!holds(&certs, &Role::Engine("vol-2".into())));
        // It names its attachment, and no other.
        assert!(holds(&certs, &Role::Attachment("vol-1".into(), 7)));
        assert!(!holds(&certs, &Role::Attachment("vol-1".into(), 8)));
        assert!(!holds(&certs, &Role::Attachment("vol-1".into(), 6)));
        assert!(!holds(&certs, &Role::Attachment("vol-2".into(), 7)));
        assert!(holds(&certs, &Role::Node("node-2".into())));
        assert!(holds(&certs, &Role::AnyNode));
        assert!(!holds(&certs, &Role::Controller));
        assert!(is_engine(&certs));
        // A node's certificate drives no volume, nor does a reader's.
        let n = ca.issue(&Role::Node("node-2".into())).unwrap();
        assert!(!holds(&der(&n.cert_pem), &Role::Engine("vol-1".into())));
        assert!(!is_engine(&der(&n.cert_pem)));
        let r = Enrollment::new("node-2").unwrap();
        let r = ca.sign_reader("node-2", "vol-1", &r.csr_pem).unwrap();
        assert!(!is_engine(&der(&r)));
        assert!(!is_engine(&der(&ca
            .issue(&Role::Controller)
            .unwrap()
            .cert_pem)));
        assert!(!is_engine(&[]));
        assert!(ca.issue_engine("../v", "node-2", 1).is_err());
    }

    /// A handshake in memory; the leaf certificates each side was shown
    /// (the server's, the client's).
    fn handshake(
        client: Arc<rustls::ClientConfig>,
        server: Arc<rustls::ServerConfig>,
    ) -> (CertificateDer<'static>, CertificateDer<'static>) {
        let name = ServerName::try_from(Role::AnyNode.name()).unwrap();
        let mut c = rustls::Connection::from(rustls::ClientConnection::new(client, name).unwrap());
        let mut s = rustls::Connection::from(rustls::ServerConnection::new(server).unwrap());
        // What one side has to send, read by the other.
        fn pump(from: &mut rustls::Connection, to: &mut rustls::Connection) {
            let mut buf = Vec::new();
            while from.wants_write() {
                from.write_tls(&mut buf).unwrap();
            }
            let mut rd = &buf[..];
            while !rd.is_empty() {
                to.read_tls(&mut rd).unwrap();
            }
            to.process_new_packets().unwrap();
        }
        for _ in 0..10 {
            pump(&mut c, &mut s);
            pump(&mut s, &mut c);
            if !c.is_handshaking() && !s.is_handshaking() {
                break;
            }
        }
        let leaf = |certs: Option<&[CertificateDer<'static>]>| certs.unwrap()[0].clone();
        (leaf(c.peer_certificates()), leaf(s.peer_certificates()))
    }

    /// A renewal shows the new certificate from the next handshake on, on
    /// both sides, with the same settings.
    #[test]
    fn a_renewed_certificate_is_shown_from_the_next_handshake_on() {
        let ca = Ca::generate().unwrap();
        let (first, second) = (
            ca.issue_engine("vol-1", "node-1", 1).unwrap(),
            ca.issue_engine("vol-1", "node-1", 1).unwrap(),
        );
        let peer = ca.issue(&Role::Node("node-2".into())).unwrap();
        let leaf = |c: &Credentials| der(&c.cert_pem)[0].clone();
        assert_ne!(leaf(&first), leaf(&second), "two certificates");
        let slot = CertSlot::of(&first).unwrap();
        let server = first.rustls_server_in(slot.clone()).unwrap();
        let client = first.rustls_client_in(slot.clone()).unwrap();
        // Fresh settings on the peer's side for each handshake: its own
        // sessions resumed would carry the certificates of the first.
        let peer_server = || peer.rustls_server().unwrap();
        let peer_client = || peer.rustls_client().unwrap();
        assert_eq!(handshake(client.clone(), peer_server()).1, leaf(&first));
        assert_eq!(handshake(peer_client(), server.clone()).0, leaf(&first));
        // A certificate with another's key is refused, and changes nothing.
        let mismatched = Credentials::from_pem(&second.ca_pem, &second.cert_pem, first.key_pem());
        assert!(slot.renew(&mismatched).is_err());
        assert_eq!(handshake(client.clone(), peer_server()).1, leaf(&first));
        slot.renew(&second).unwrap();
        assert_eq!(handshake(client, peer_server()).1, leaf(&second));
        assert_eq!(handshake(peer_client(), server).0, leaf(&second));
    }

    #[test]
    fn a_reader_certificate_names_its_volume_and_its_node_for_an_hour() {
        let ca = Ca::generate().unwrap();
        // The request asks for another node; the CA names the one it is
        // told, and the volume.
        let asked = Enrollment::new("node-9").unwrap();
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let pem = ca.sign_reader("node-2", "vol-1", &asked.csr_pem).unwrap();
        let certs = der(&pem);
        assert!(holds(&certs, &Role::Reader("vol-1".into())));
        assert!(!holds(&certs, &Role::Reader("vol-2".into())));
        assert!(holds(&certs, &Role::Node("node-2".into())));
        assert!(!holds(&certs, &Role::Node("node-9".into())));
        // It reads; it drives nothing.
        assert!(!holds(&certs, &Role::Engine("vol-1".into())));
        assert!(!holds(&certs, &Role::Attachment("vol-1".into(), 0)));
        assert!(!holds(&certs, &Role::Controller));
        let until = not_after(&pem).unwrap();
        let hour = READER_VALID.as_secs() as i64;
        assert!(
            (now + hour..=now + hour + 60).contains(&until),
            "valid until {until}, an hour after {now}"
        );
        // A member's own certificate lasts a year from its making, to the
        // second.
        let year = MEMBER_DAYS * 86_400;
        let member = not_after(&ca.issue(&Role::Controller).unwrap().cert_pem).unwrap();
        assert!(
            (now + year..=now + year + 60).contains(&member),
            "valid until {member}, a year after {now}"
        );
        assert!(not_after("not a certificate").is_err());
        // A node's own certificate reads no volume.
        let n = ca.issue(&Role::Node("node-2".into())).unwrap();
        assert!(!holds(&der(&n.cert_pem), &Role::Reader("vol-1".into())));
        assert!(ca.sign_reader("node-2", "../v", &asked.csr_pem).is_err());
        assert!(ca.sign_reader("node-2", "vol-1", "not a request").is_err());
    }

    #[test]
    fn a_ca_is_kept_in_its_directory_and_read_back() {
        let d = tempfile::tempdir().unwrap();
        let a = Ca::in_dir(d.path()).unwrap();
        let b = Ca::in_dir(d.path()).unwrap();
        assert_eq!(a.cert_pem(), b.cert_pem());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(d.path().join(CA_KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // A certificate the re-read CA issues is the first CA's.
        let c = b.issue(&Role::Controller).unwrap();
        assert!(holds(&der(&c.cert_pem), &Role::Controller));
        c.save(&d.path().join("member")).unwrap();
        let again = Credentials::load(&d.path().join("member")).unwrap();
        assert_eq!(again.cert_pem, c.cert_pem);
    }

    /// A renewal replaces the files while another process reads them (the
    /// engines, a test): every load gets a key that is its certificate's,
    /// one set or the other, never the new key beside the old certificate.
    /// A pair that stays apart is an error naming the directory.
    #[test]
    fn a_load_while_the_files_are_replaced_gets_a_key_and_its_certificate() {
        let d = tempfile::tempdir().unwrap();
        let ca = Ca::generate().unwrap();
        let sets = [0, 1].map(|_| ca.issue(&Role::Node("node-1".into())).unwrap());
        sets[0].save(d.path()).unwrap();
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let stop = Arc::new(AtomicBool::new(false));
        let saved = Arc::new(AtomicUsize::new(0));
        let writer = {
            let (dir, stop, saved) = (d.path().to_path_buf(), stop.clone(), saved.clone());
            let sets = sets.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let n = saved.load(Ordering::Relaxed);
                    sets[n % 2].save(&dir).unwrap();
                    saved.store(n + 1, Ordering::Relaxed);
                }
            })
        };
        // At least 300 loads, and on until the files were replaced 50
        // times while they ran: on a busy machine the writer may not be
        // scheduled before the first 300 are done.
        let mut loads = 0;
        let replaced_during = |from: usize| saved.load(Ordering::Relaxed) - from;
        let first = saved.load(Ordering::Relaxed);
        while (loads < 300 || replaced_during(first) < 50) && !writer.is_finished() {
            let read = Credentials::load(d.path()).unwrap();
            let set = sets.iter().find(|s| s.cert_pem == read.cert_pem).unwrap();
            assert_eq!(read.key_pem, set.key_pem, "the key of the certificate read");
            read.rustls_client().unwrap();
            loads += 1;
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().expect("the writer saves every time");
        assert!(replaced_during(first) >= 50, "the files were replaced");
        // Apart for good: the error says where.
        let apart = tempfile::tempdir().unwrap();
        sets[0].save(apart.path()).unwrap();
        std::fs::write(apart.path().join(KEY_FILE), sets[1].key_pem()).unwrap();
        let e = Credentials::load(apart.path()).unwrap_err().to_string();
        assert!(
            e.contains(&apart.path().display().to_string()) && e.contains(KEY_FILE),
            "{e}"
        );
    }
}
