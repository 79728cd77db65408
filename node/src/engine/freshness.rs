//! Freshness: which replicas hold the volume's latest acknowledged data.
//!
//! The controller's store records that set with a generation. The engine
//! keeps the record true: whenever its set of `rw` replicas changes (one
//! failed an I/O, one finished its rebuild, one was taken out), it records
//! the new set through a [`Recorder`] — and it acknowledges a write only
//! when every replica of the record has it. So a replica dropped from the
//! volume is out of the record before any write it lacks is acknowledged,
//! and a later attach, which opens only recorded replicas, can never serve
//! stale data.
//!
//! A record refused because the generation moved on (another engine, or an
//! operator's salvage, owns the volume now) fences this engine: every write
//! fails from then on. A controller that cannot be reached is asked again;
//! meanwhile the writes that need the record wait (never acknowledged
//! early), up to [`ACK_WAIT`], then fail.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

/// The replica set as the store records it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplicaSet {
    pub generation: u64,
    pub replicas: BTreeSet<String>,
}

/// Why a record was not made.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The controller could not be reached: ask again.
    #[error("the controller is unreachable: {0}")]
    Unreachable(String),
    /// The store's generation is not ours: this engine is stale.
    #[error("refused: {0}")]
    Refused(String),
}

/// What records the replica set in the store (the controller, over the
/// agent protocol's `RecordReplicaSet`).
#[tonic::async_trait]
pub trait Recorder: Send + Sync + 'static {
    /// Records `replicas` as the volume's set after `generation`; returns
    /// the new generation.
    async fn record(
        &self,
        generation: u64,
        replicas: &[String],
        reason: &str,
    ) -> Result<u64, RecordError>;
}

/// How long a write waits for the record it needs before it fails.
pub const ACK_WAIT: Duration = Duration::from_secs(30);

/// The engine's side of the record.
pub struct Freshness {
    recorder: Option<Arc<dyn Recorder>>,
    recorded: watch::Sender<ReplicaSet>,
    /// Why this engine is fenced, once it is.
    fenced: watch::Sender<Option<String>>,
}

impl Freshness {
    /// Starts from the record the engine was started with. Without a
    /// recorder (an engine driven in-process by a test), nothing is
    /// recorded and acknowledgements are not held back.
    pub fn new(start: ReplicaSet, recorder: Option<Arc<dyn Recorder>>) -> Self {
        Freshness {
            recorder,
            recorded: watch::channel(start).0,
            fenced: watch::channel(None).0,
        }
    }

    /// Whether changes are recorded (a recorder was given).
    pub fn keeps_record(&self) -> bool {
        self.recorder.is_some()
    }

    /// The record as this engine last made or found it.
    pub fn recorded(&self) -> ReplicaSet {
        self.recorded.borrow().clone()
    }

    /// Why the engine is fenced, if it is.
    pub fn fenced(&self) -> Option<String> {
        self.fenced.borrow().clone()
    }

    /// Whether a write that every replica in `acked` has may be
    /// acknowledged now: every recorded replica is among them.
    pub fn covers(&self, acked: &[&str]) -> bool {
        if self.recorder.is_none() {
            return true;
        }
        self.fenced.borrow().is_none()
            && self
                .recorded
                .borrow()
                .replicas
                .iter()
                .all(|r| acked.contains(&r.as_str()))
    }

    /// Waits until a write that `acked` have may be acknowledged; an error
    /// when the engine is fenced or the record does not come in time.
    pub async fn wait_covered(&self, acked: &[String]) -> Result<(), String> {
        let acked: Vec<&str> = acked.iter().map(String::as_str).collect();
        let mut rx = self.recorded.subscribe();
        let mut fenced = self.fenced.subscribe();
        let deadline = tokio::time::Instant::now() + ACK_WAIT;
        loop {
            if let Some(why) = self.fenced() {
                return Err(format!("engine fenced: {why}"));
            }
            if self.covers(&acked) {
                return Ok(());
            }
            tokio::select! {
                _ = rx.changed() => {}
                _ = fenced.changed() => {}
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(format!(
                        "the replica set without the failed replicas was not recorded within {}s: \
                         the write is not acknowledged",
                        ACK_WAIT.as_secs()
                    ));
                }
            }
        }
    }

    /// Records `wanted` when it differs from the record; retries while the
    /// controller is unreachable. Returns whether `wanted` is the record
    /// (false when the engine is fenced). Only one task may call it: two
    /// records at once would race on the generation.
    pub async fn record(&self, wanted: &BTreeSet<String>, reason: &str) -> bool {
        let Some(recorder) = &self.recorder else {
            return true;
        };
        let mut backoff = Duration::from_millis(100);
        loop {
            let now = self.recorded();
            if self.fenced().is_some() || wanted.is_empty() {
                return false;
            }
            if &now.replicas == wanted {
                return true;
            }
            let names: Vec<String> = wanted.iter().cloned().collect();
            match recorder.record(now.generation, &names, reason).await {
                Ok(generation) => {
                    tracing::info!(generation, replicas = ?names, reason, "replica set recorded");
                    self.recorded.send_replace(ReplicaSet {
                        generation,
                        replicas: wanted.clone(),
                    });
                    return true;
                }
                Err(RecordError::Refused(why)) => {
                    tracing::error!(error = %why, "the store refused the replica set: this engine is fenced and fails every write");
                    self.fenced.send_replace(Some(why));
                    return false;
                }
                Err(RecordError::Unreachable(why)) => {
                    tracing::warn!(error = %why, "cannot record the replica set; writes that need it wait");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
    }
}

type ControlplaneClient = ballast::proto::agent::v1::controlplane_client::ControlplaneClient<
    ballast::cluster_token::Authed,
>;

/// Records through the controller's `RecordReplicaSet` (agent protocol).
pub struct ControllerRecorder {
    /// Its connections show the engine's certificate held at their
    /// making (`Tls::renew`).
    client: ControlplaneClient,
    volume: String,
    node_id: String,
    /// The attachment the engine was started for, which every record
    /// claims: the controller refuses those of an engine it replaced.
    epoch: u64,
}

impl ControllerRecorder {
    /// `controller` is the controller's agent endpoint (`http://host:port`).
    /// Its calls are made as `member` (the node's token and certificate)
    /// for the engine of attachment `epoch`.
    pub fn new(
        controller: &str,
        volume: &str,
        node_id: &str,
        epoch: u64,
        member: &ballast::tls::Member,
    ) -> Result<Self, String> {
        let channel = member
            .channel(controller, &ballast::tls::Role::Controller)
            .map_err(|e| e.to_string())?;
        Ok(ControllerRecorder {
            client: ControlplaneClient::new(channel),
            volume: volume.to_string(),
            node_id: node_id.to_string(),
            epoch,
        })
    }
}

#[tonic::async_trait]
impl Recorder for ControllerRecorder {
    async fn record(
        &self,
        generation: u64,
        replicas: &[String],
        reason: &str,
    ) -> Result<u64, RecordError> {
        let req = ballast::proto::agent::v1::RecordReplicaSetRequest {
            volume: self.volume.clone(),
            node_id: self.node_id.clone(),
            generation,
            replicas: replicas.to_vec(),
            reason: reason.to_string(),
            engine_epoch: self.epoch,
        };
        let mut c = self.client.clone();
        match tokio::time::timeout(Duration::from_secs(5), c.record_replica_set(req)).await {
            Err(_) => Err(RecordError::Unreachable("no answer in 5s".into())),
            Ok(Ok(r)) => Ok(r.into_inner().generation),
            Ok(Err(s)) => match s.code() {
                tonic::Code::FailedPrecondition
                | tonic::Code::NotFound
                | tonic::Code::InvalidArgument => {
                    Err(RecordError::Refused(s.message().to_string()))
                }
                _ => Err(RecordError::Unreachable(s.to_string())),
            },
        }
    }
}
