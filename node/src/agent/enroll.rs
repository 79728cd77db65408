//! Enrollment (TLS on): at every start the node makes a new key, sends a
//! signing request with the cluster token to the controller (whose
//! certificate it checks against `--cluster-ca-file`), and keeps the
//! certificate it gets back in its state directory, where its engines read
//! it. A new start is a new key: restarting a node rotates its credentials.
//! A renewal while the node runs asks the same way (`renewal`).

use std::path::Path;
use std::time::Duration;

use ballast::cluster_token::ClusterToken;
use ballast::error::ServeError;
use ballast::proto::agent::v1::IssueCertificateRequest;
use ballast::proto::agent::v1::enrollment_client::EnrollmentClient;
use ballast::tls::{Credentials, Enrollment};

/// How long a starting node waits for a controller to enroll it.
pub const ENROLL_FOR: Duration = Duration::from_secs(120);

/// The node's new credentials, kept in `dir`.
pub async fn enroll(
    controller: &str,
    node_id: &str,
    ca_file: &Path,
    token: &ClusterToken,
    dir: &Path,
) -> Result<Credentials, ServeError> {
    let credentials = ask(controller, node_id, ca_file, token).await?;
    credentials
        .save(dir)
        .map_err(|e| ServeError::Config(format!("keeping the node's certificate: {e}")))?;
    tracing::info!(dir = %dir.display(), "enrolled: certificate issued by the cluster CA");
    Ok(credentials)
}

/// New credentials for the node: a new key, and its certificate from the
/// controller (nothing kept).
#[tracing::instrument(skip_all, fields(node = %node_id))]
pub async fn ask(
    controller: &str,
    node_id: &str,
    ca_file: &Path,
    token: &ClusterToken,
) -> Result<Credentials, ServeError> {
    let config = |m: String| ServeError::Config(format!("--cluster-ca-file: {m}"));
    if !token.is_set() {
        return Err(config(
            "enrolling needs the cluster token (--cluster-token-file)".into(),
        ));
    }
    let request = Enrollment::new(node_id).map_err(|e| config(e.to_string()))?;
    let started = tokio::time::Instant::now();
    // The controller makes the CA at its first start: wait for it.
    let ca_pem = loop {
        match std::fs::read_to_string(ca_file) {
            Ok(pem) => break pem,
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound && started.elapsed() < ENROLL_FOR =>
            {
                tracing::debug!(file = %ca_file.display(), "waiting for the cluster CA's certificate");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(config(format!("{}: {e}", ca_file.display()))),
        }
    };
    let channel =
        ballast::grpc::tcp_channel_with(controller, Some(ballast::tls::enrolling_client(&ca_pem)))?;
    let mut client = EnrollmentClient::with_interceptor(channel, token.sender());
    let ask = async {
        loop {
            let req = IssueCertificateRequest {
                node_id: node_id.to_string(),
                csr_pem: request.csr_pem.clone(),
            };
            match client.issue_certificate(req).await {
                Ok(r) => return Ok(r.into_inner()),
                Err(s)
                    if s.code() == tonic::Code::Unavailable || s.code() == tonic::Code::Unknown =>
                {
                    tracing::debug!(error = %s, "enrolling with the controller");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(s) => return Err(s),
            }
        }
    };
    let answer = tokio::time::timeout(ENROLL_FOR.saturating_sub(started.elapsed()), ask)
        .await
        .map_err(|_| {
            ServeError::Config(format!(
                "no controller at {controller} enrolled this node within {ENROLL_FOR:?}"
            ))
        })?
        .map_err(|s| {
            ServeError::Config(format!(
                "the controller refused to enroll this node: {}",
                s.message()
            ))
        })?;
    Ok(request.finish(&ca_pem, &answer.cert_pem))
}
