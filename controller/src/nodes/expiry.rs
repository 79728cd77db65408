//! Certificates near their end. A node's heartbeats show its certificate
//! (TLS on); from 30 days before it expires, the controller records a
//! `CertificateExpiring` event on the node, once a day. A node plugin
//! renews its own from `--renew-certificate-days` (60 by default) before
//! its end, and its connections end within the hour after, so a warning
//! means its renewals have failed: its log says why, and a restart of
//! the node plugin enrolls it again. (Engines' are renewed by the
//! controller: `renewal`.) A node's certificate that ends later than the
//! one its heartbeats showed before is a `CertificateRenewed` event. It
//! owns the warning and that event only; the date is read from the
//! certificate the TLS handshake verified.

use std::collections::HashMap;
use std::sync::Mutex;

use ballast::model::Kind;
use chrono::{DateTime, Utc};

use crate::context::Context;

/// How long before a node's certificate expires the warnings start.
pub const WARN_DAYS: i64 = 30;

/// When each node was last warned, and the end of the certificate each
/// node's heartbeats last showed.
#[derive(Debug, Default)]
pub struct Warnings {
    last: Mutex<HashMap<String, DateTime<Utc>>>,
    seen: Mutex<HashMap<String, i64>>,
}

impl Warnings {
    /// Forgets the certificate node `node_id`'s heartbeats showed: it
    /// registers (it started, and enrolled anew), so the next one is no
    /// renewal while it runs.
    pub fn registered(&self, node_id: &str) {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(node_id);
    }

    /// Warns of node `node_id`'s certificate, valid until `not_after`
    /// (seconds since the Unix epoch), when it is due; and records a
    /// `CertificateRenewed` event when it ends later than the one its
    /// heartbeats showed before.
    pub async fn check(&self, ctx: &Context, node_id: &str, not_after: i64) {
        let renewed = {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            renewal(node_id, not_after, &mut seen)
        };
        if let Some(m) = renewed {
            tracing::info!(node = %node_id, "{m}");
            ctx.event(Kind::Node, node_id, "CertificateRenewed", m)
                .await;
        }
        let message = {
            let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
            warning(node_id, not_after, ctx.now(), &mut last)
        };
        if let Some(m) = message {
            tracing::warn!(node = %node_id, "{m}");
            ctx.event(Kind::Node, node_id, "CertificateExpiring", m)
                .await;
        }
    }
}

/// What to say when node `node_id`'s heartbeats show a certificate valid
/// until `not_after` and the last one they showed (`seen` keeps it) ended
/// sooner: a renewal while the node runs. Nothing the first time a node
/// is seen, nor after it registers again (`Warnings::registered`).
fn renewal(node_id: &str, not_after: i64, seen: &mut HashMap<String, i64>) -> Option<String> {
    let before = seen.insert(node_id.to_string(), not_after)?;
    if not_after <= before {
        // The latest seen stays: a connection made before a renewal, still
        // open, tells nothing new.
        seen.insert(node_id.to_string(), before);
        return None;
    }
    let at = |t: i64| DateTime::from_timestamp(t, 0).unwrap_or_default();
    Some(format!(
        "node {node_id}'s certificate was renewed: it expires at {} (the one before at {})",
        at(not_after),
        at(before)
    ))
}

/// The warning due at `now` for node `node_id`'s certificate, valid until
/// `not_after`: from [`WARN_DAYS`] before, once a day (`last` keeps when
/// each node was last warned).
fn warning(
    node_id: &str,
    not_after: i64,
    now: DateTime<Utc>,
    last: &mut HashMap<String, DateTime<Utc>>,
) -> Option<String> {
    let until = DateTime::from_timestamp(not_after, 0)?;
    let left = until - now;
    if left > chrono::Duration::days(WARN_DAYS) {
        return None;
    }
    if last
        .get(node_id)
        .is_some_and(|t| now - *t < chrono::Duration::days(1))
    {
        return None;
    }
    last.insert(node_id.to_string(), now);
    Some(if left > chrono::Duration::zero() {
        format!(
            "node {node_id}'s certificate expires at {until} (in {} days) and was not renewed: see its node plugin's log, or restart the node plugin to renew it",
            left.num_days()
        )
    } else {
        format!(
            "node {node_id}'s certificate expired at {until} and was not renewed: see its node plugin's log, or restart the node plugin to renew it"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn a_renewal_is_told_once_when_the_heartbeats_show_a_later_certificate() {
        let mut seen = HashMap::new();
        let (year, later) = (1_800_000_000, 1_800_000_000 + 86_400 * 300);
        assert_eq!(renewal("n1", year, &mut seen), None, "first seen");
        assert_eq!(renewal("n1", year, &mut seen), None, "the same");
        let m = renewal("n1", later, &mut seen).unwrap();
        assert!(m.contains("was renewed") && m.contains("n1"), "{m}");
        assert_eq!(renewal("n1", later, &mut seen), None, "told once");
        // The one before again (a connection made before the renewal):
        // nothing, and the later one is not told again after it.
        assert_eq!(renewal("n1", year, &mut seen), None);
        assert_eq!(renewal("n1", later, &mut seen), None);
        assert_eq!(renewal("n2", later, &mut seen), None, "n2 first seen");
        // A node that registers again (a start, a new enrollment) is seen
        // anew: its start's certificate is no renewal while it runs.
        let w = Warnings::default();
        w.seen.lock().unwrap().insert("n1".into(), year);
        w.registered("n1");
        assert_eq!(renewal("n1", later, &mut w.seen.lock().unwrap()), None);
    }

    #[test]
    fn a_node_is_warned_from_thirty_days_before_once_a_day() {
        let now = Utc.timestamp_opt(1_800_000_000, 0).unwrap();
        let day = 86_400;
        let mut last = HashMap::new();
        let at = |d: i64| now.timestamp() + d * day;
        // A year ahead, or 31 days: nothing.
        assert_eq!(warning("n1", at(365), now, &mut last), None);
        assert_eq!(warning("n1", at(31), now, &mut last), None);
        // 30 days: a warning naming what to do, then none that day.
        let m = warning("n1", at(30), now, &mut last).unwrap();
        assert!(
            m.contains("in 30 days") && m.contains("was not renewed"),
            "{m}"
        );
        assert_eq!(warning("n1", at(30), now, &mut last), None);
        // Another node is warned for itself.
        assert!(warning("n2", at(3), now, &mut last).is_some());
        // A day later, again; and once it has expired, it says so.
        let later = now + chrono::Duration::days(1);
        assert!(warning("n1", at(30), later, &mut last).is_some());
        let gone = now + chrono::Duration::days(40);
        let m = warning("n1", at(30), gone, &mut last).unwrap();
        assert!(m.contains("expired at"), "{m}");
    }
}
