//! The controller's own certificate renewed while it runs (TLS on). A
//! controller issues itself a certificate at every start; from
//! `--renew-certificate-days` before it expires, it issues itself a new
//! one from the CA it holds, and its agent server and its channels to
//! the nodes and the other controllers show it from their next handshake
//! on (`Tls::renew`); the servers end each connection within
//! `ballast::grpc::CONNECTION_AGE`. Checked a minute after the start,
//! then every hour. It owns when to renew; what a certificate says is
//! `ballast::tls`'s.

use std::sync::Arc;

use ballast::tls::{Ca, Role, Tls, TlsError};
use chrono::{DateTime, Utc};

/// The default of `--renew-certificate-days`: twice the warning window of
/// `/metrics`' alert (30 days, docs/operations.md).
pub const RENEW_DAYS: i64 = 60;

/// Renews the certificate of `tls` when due, for ever.
pub async fn keep_renewing(tls: Tls, ca: Arc<Ca>, days: i64) {
    ballast::tls::keep_renewing("the controller's", || renew(&tls, &ca, days, Utc::now())).await
}

/// Renews it when it is due at `now`: whether it did.
#[tracing::instrument(skip_all)]
async fn renew(tls: &Tls, ca: &Ca, days: i64, now: DateTime<Utc>) -> Result<bool, TlsError> {
    let fresh = tls
        // Kept in memory only: nothing to write.
        .renew_if_due(
            now,
            days,
            || async { ca.issue(&Role::Controller) },
            |_| Ok(()),
        )
        .await?;
    if let Some(c) = &fresh {
        tracing::info!(
            not_after = ballast::tls::not_after(&c.cert_pem).unwrap_or_default(),
            "the controller's certificate was renewed"
        );
    }
    Ok(fresh.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn its_certificate_is_renewed_once_due_and_stays_a_controllers() {
        let ca = Ca::generate().unwrap();
        let tls = Tls::on(ca.issue(&Role::Controller).unwrap()).unwrap();
        let first = tls.credentials().unwrap().cert_pem.clone();
        let now = Utc::now();
        assert!(!renew(&tls, &ca, 60, now).await.unwrap(), "a year left");
        assert_eq!(tls.credentials().unwrap().cert_pem, first);
        // Within 400 days of its end: due (the new one ends a moment
        // later).
        assert!(renew(&tls, &ca, 400, now).await.unwrap());
        let second = tls.credentials().unwrap().cert_pem.clone();
        assert_ne!(second, first);
        assert!(ballast::tls::pem_holds(&second, &Role::Controller));
    }
}
