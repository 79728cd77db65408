//! Leader election with a `coordination.k8s.io/v1` Lease, so that of the
//! controllers running on one cluster exactly one plans and acts.
//!
//! Every controller tries every `retry` to take or renew the Lease
//! `ballast-controller`: it takes it when it is free, or when its holder
//! has not renewed it for a whole lease duration as this controller's own
//! clock measures it (from when it last saw the Lease change, never by
//! comparing clocks); it renews it while it holds it. Every write names
//! the Lease's resource version, so two controllers never both win. A
//! leader that cannot renew within `renew_deadline` stops leading. The
//! holder's agent endpoint is written in an annotation, for the others to
//! forward to. A leader renews from the Lease its last write returned,
//! without reading it first: it reads only when a renewal fails.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::context::Leadership;

/// The Lease's name.
pub const LEASE: &str = "ballast-controller";
/// The annotation holding the leader's agent endpoint.
pub const ENDPOINT_ANNOTATION: &str = "ballast.csi.dev/agent-endpoint";

/// The timing of the election.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// How long a Lease not renewed stays its holder's.
    pub duration: Duration,
    /// How long a leader keeps leading without a successful renewal.
    pub renew_deadline: Duration,
    /// How often every controller tries.
    pub retry: Duration,
}

impl Default for Timing {
    /// client-go's defaults: 15 s, 10 s, 2 s.
    fn default() -> Self {
        Timing {
            duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry: Duration::from_secs(2),
        }
    }
}

/// One controller's candidacy.
pub struct Elector {
    api: Api<Lease>,
    identity: String,
    endpoint: String,
    timing: Timing,
    state: watch::Sender<Leadership>,
}

/// What this controller last saw of the Lease, and when it saw it change.
struct Seen {
    version: String,
    at: Instant,
}

impl Elector {
    pub fn new(
        client: kube::Client,
        namespace: &str,
        identity: &str,
        endpoint: &str,
        timing: Timing,
    ) -> Elector {
        Elector {
            api: Api::namespaced(client, namespace),
            identity: identity.to_string(),
            endpoint: endpoint.to_string(),
            timing,
            state: watch::Sender::new(Leadership::default()),
        }
    }

    /// Who leads, updated as it changes.
    pub fn watch(&self) -> watch::Receiver<Leadership> {
        self.state.subscribe()
    }

    /// Runs the election for ever.
    #[tracing::instrument(skip_all, fields(identity = %self.identity))]
    pub async fn run(self) {
        let mut seen: Option<Seen> = None;
        let mut held: Option<Lease> = None;
        let mut renewed = Instant::now();
        loop {
            let state = match self.try_once(&mut seen, &mut held).await {
                Ok(state) => {
                    if state.leading {
                        renewed = Instant::now();
                    }
                    state
                }
                Err(e) => {
                    tracing::warn!(error = %e, "lease: cannot reach the API server");
                    let mut state = self.state.borrow().clone();
                    if state.leading && renewed.elapsed() > self.timing.renew_deadline {
                        tracing::warn!("lease: not renewed within the deadline; stepping down");
                        state.leading = false;
                    }
                    state
                }
            };
            self.state.send_if_modified(|s| {
                let changed = *s != state;
                if changed {
                    tracing::info!(leading = state.leading, holder = ?state.holder, "leadership");
                    *s = state;
                }
                changed
            });
            tokio::time::sleep(self.timing.retry).await;
        }
    }

    /// One attempt to take or renew the Lease. `held`: the Lease as this
    /// controller's last successful write left it, if it holds it.
    async fn try_once(
        &self,
        seen: &mut Option<Seen>,
        held: &mut Option<Lease>,
    ) -> Result<Leadership, kube::Error> {
        if let Some(lease) = held.take() {
            let transitions = lease
                .spec
                .as_ref()
                .and_then(|s| s.lease_transitions)
                .unwrap_or(0);
            return self.write(Some(lease), transitions, held).await;
        }
        let now = Instant::now();
        let Some(lease) = self.api.get_opt(LEASE).await? else {
            return self.write(None, 0, held).await;
        };
        let version = lease.metadata.resource_version.clone().unwrap_or_default();
        if seen.as_ref().is_none_or(|s| s.version != version) {
            *seen = Some(Seen {
                version: version.clone(),
                at: now,
            });
        }
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let duration = spec
            .lease_duration_seconds
            .map(|s| Duration::from_secs(s.max(1) as u64))
            .unwrap_or(self.timing.duration);
        let expired = seen.as_ref().is_some_and(|s| now - s.at > duration);
        let transitions = spec.lease_transitions.unwrap_or(0);
        match holder {
            Some(h) if h == self.identity => self.write(Some(lease), transitions, held).await,
            Some(h) if !expired => Ok(Leadership {
                leading: false,
                holder: Some((h, endpoint_of(&lease))),
            }),
            // Free, or its holder stopped renewing: take it.
            _ => self.write(Some(lease), transitions + 1, held).await,
        }
    }

    /// Writes the Lease as held by this controller: creates it, or replaces
    /// the version read. Losing the race is not an error: someone else
    /// leads. What it wrote is kept in `held`, to renew from.
    async fn write(
        &self,
        current: Option<Lease>,
        transitions: i32,
        held: &mut Option<Lease>,
    ) -> Result<Leadership, kube::Error> {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let renewing = current.as_ref().is_some_and(|l| {
            l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some(&self.identity)
        });
        let acquire_time = match &current {
            Some(l) if renewing => l.spec.as_ref().and_then(|s| s.acquire_time.clone()),
            _ => Some(now.clone()),
        };
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(LEASE.into()),
                resource_version: current
                    .as_ref()
                    .and_then(|l| l.metadata.resource_version.clone()),
                annotations: Some(
                    [(ENDPOINT_ANNOTATION.to_string(), self.endpoint.clone())].into(),
                ),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.identity.clone()),
                lease_duration_seconds: Some(self.timing.duration.as_secs().max(1) as i32),
                acquire_time,
                renew_time: Some(now),
                lease_transitions: Some(transitions),
                ..Default::default()
            }),
        };
        let result = match current {
            None => self.api.create(&PostParams::default(), &lease).await,
            Some(_) => {
                self.api
                    .replace(LEASE, &PostParams::default(), &lease)
                    .await
            }
        };
        match result {
            Ok(written) => {
                *held = Some(written);
                Ok(Leadership {
                    leading: true,
                    holder: Some((self.identity.clone(), self.endpoint.clone())),
                })
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Leadership {
                leading: false,
                holder: None,
            }),
            Err(e) => Err(e),
        }
    }
}

fn endpoint_of(lease: &Lease) -> String {
    lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ENDPOINT_ANNOTATION).cloned())
        .unwrap_or_default()
}
