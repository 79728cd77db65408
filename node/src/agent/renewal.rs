//! The node's own certificate renewed while it runs (TLS on). From
//! `--renew-certificate-days` before it expires, the node gets a new one
//! the way it got the first: it enrolls again (a new key, a signing
//! request with the cluster token; `enroll::ask`), or, with `--tls-dir`,
//! reads that directory again, where whoever issued those files put a
//! later certificate. Its agent server, its channels to the controller
//! and its replica protocol show the new one from their next handshake
//! on (`Tls::renew`: one slot for all of them), and the servers end each
//! connection within `ballast::grpc::CONNECTION_AGE`, so none keeps the
//! old one past that. Checked a minute after the start, then every hour.
//! It owns when to renew and the swap; enrollment's protocol is
//! `enroll`'s.

use std::path::PathBuf;

use ballast::cluster_token::ClusterToken;
use ballast::tls::{Credentials, Tls, TlsError};
use chrono::{DateTime, Utc};

/// The default of `--renew-certificate-days`: twice the controller's
/// warning window (`CertificateExpiring`, 30 days), so that a warning
/// means a renewal has failed for a month.
pub const RENEW_DAYS: i64 = 60;
/// Where a new certificate comes from.
#[derive(Debug)]
pub enum Source {
    /// Enrolled again with the controller; the credentials are kept in
    /// `dir` (where the engines read the CA).
    Enroll {
        controller: String,
        node_id: String,
        ca_file: PathBuf,
        token: ClusterToken,
        dir: PathBuf,
    },
    /// Read again from `--tls-dir`.
    Dir(PathBuf),
}

/// The node's renewals.
#[derive(Debug)]
pub struct Renewal {
    pub tls: Tls,
    pub source: Source,
    pub days: i64,
    /// Counts the renewals, for the heartbeats to make a new channel
    /// (`heartbeat::Reconnect`).
    pub renewed: tokio::sync::watch::Sender<u64>,
}

impl Renewal {
    /// Checks a minute after the start, then every hour, for ever.
    pub async fn run(self) {
        ballast::tls::keep_renewing("the node's", || self.check(Utc::now())).await
    }

    /// Renews the certificate when it is due at `now`: whether it did.
    #[tracing::instrument(skip_all)]
    async fn check(&self, now: DateTime<Utc>) -> Result<bool, TlsError> {
        let fresh = self
            .tls
            .renew_if_due(
                now,
                self.days,
                || async {
                    match &self.source {
                        Source::Enroll {
                            controller,
                            node_id,
                            ca_file,
                            token,
                            ..
                        } => super::enroll::ask(controller, node_id, ca_file, token)
                            .await
                            .map_err(|e| TlsError::NotRenewed(e.to_string())),
                        Source::Dir(dir) => Credentials::load(dir),
                    }
                },
                |fresh| match &self.source {
                    // Enrolled: kept in the state directory before it is shown.
                    Source::Enroll { dir, .. } => fresh.save(dir),
                    Source::Dir(_) => Ok(()),
                },
            )
            .await?;
        let Some(fresh) = fresh else {
            return Ok(false);
        };
        self.renewed.send_modify(|n| *n += 1);
        tracing::info!(
            not_after = ballast::tls::not_after(&fresh.cert_pem).unwrap_or_default(),
            "the node's certificate was renewed"
        );
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ballast::tls::{Ca, Role};

    /// Node node-1's credentials from `ca`, valid for `days`.
    fn node_credentials(ca: &Ca, days: i64) -> Credentials {
        ca.issue_expiring(&[Role::Node("node-1".into())], days)
            .unwrap()
    }

    /// From `--tls-dir`: renewed only when due, only to a new certificate
    /// of the same CA that ends no sooner (the same one is nothing new, and
    /// no failure); the slot then holds it.
    #[tokio::test]
    async fn a_certificate_read_again_is_taken_only_when_due_later_and_of_the_ca() {
        let ca = Ca::generate().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let first = node_credentials(&ca, 100);
        first.save(dir.path()).unwrap();
        let tls = Tls::on(first.clone()).unwrap();
        let r = Renewal {
            tls: tls.clone(),
            source: Source::Dir(dir.path().to_path_buf()),
            days: 30,
            renewed: tokio::sync::watch::channel(0).0,
        };
        let now = Utc::now();
        let in_days = |d: i64| now + chrono::Duration::days(d);
        assert!(!r.check(now).await.unwrap(), "100 days left: not due");
        // Due, but the directory holds the same certificate: nothing new
        // yet, and no failure (a directory renewed by another issuer is
        // read every hour until its files change).
        assert!(!r.check(in_days(80)).await.unwrap());
        assert_eq!(tls.credentials().unwrap().cert_pem, first.cert_pem);
        // Of another CA, later: refused, and the one held stays.
        node_credentials(&Ca::generate().unwrap(), 365)
            .save(dir.path())
            .unwrap();
        assert!(r.check(in_days(80)).await.is_err());
        assert_eq!(tls.credentials().unwrap().cert_pem, first.cert_pem);
        // One of the CA that ends sooner: refused.
        node_credentials(&ca, 50).save(dir.path()).unwrap();
        let e = r.check(in_days(80)).await.unwrap_err().to_string();
        assert!(e.contains("ends before"), "{e}");
        assert_eq!(tls.credentials().unwrap().cert_pem, first.cert_pem);
        // A later one of the CA: taken.
        let second = node_credentials(&ca, 365);
        second.save(dir.path()).unwrap();
        assert!(r.check(in_days(80)).await.unwrap());
        assert_eq!(tls.credentials().unwrap().cert_pem, second.cert_pem);
        assert_eq!(*r.renewed.borrow(), 1, "told once, to the heartbeats");
        // And not due any more.
        assert!(!r.check(in_days(80)).await.unwrap());
    }
}
