//! Events as Kubernetes Events (`events.k8s.io/v1`), about the Ballast
//! object they concern, so that `kubectl describe volume.ballast.csi.dev X`
//! and `kubectl get events` show them, and as store records for
//! `/v1/events` and `ballastctl events`.
//!
//! Ballast's events carry a label so that they are listed apart from the
//! cluster's others; the API server ages them out (one hour by default),
//! besides the pruning of the recorder.

use ballast::model::Kind;
use ballast::store::{Raw, StoreError};
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use serde_json::{Value, json};

use super::objects::{backend, resource, revision};

/// The label every Ballast event carries.
const LABEL: &str = "app.kubernetes.io/managed-by";
const LABEL_VALUE: &str = "ballast";
/// Who reports: the controller, as `kubectl get events` shows it.
const CONTROLLER: &str = "ballast.csi.dev/controller";
/// The longest note the events API accepts.
const NOTE_LIMIT: usize = 1024;

/// The controller's events in one namespace.
pub struct EventLog {
    api: Api<Event>,
    namespace: String,
    instance: String,
}

impl EventLog {
    pub fn new(client: kube::Client, namespace: &str, instance: &str) -> EventLog {
        EventLog {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            instance: instance.to_string(),
        }
    }

    /// Records an event from its store record (`object`, `reason`,
    /// `message`, `time`). `uid` finds the uid of the object it is about.
    pub async fn create(
        &self,
        name: &str,
        value: &Value,
        uid: impl Fn(Kind, &str) -> Option<String>,
    ) -> Result<u64, StoreError> {
        let text = |key: &str| value[key].as_str().unwrap_or_default().to_string();
        let object = text("object");
        let reason = text("reason");
        let time: DateTime<Utc> = serde_json::from_value(value["time"].clone())
            .map_err(|e| StoreError::Backend(format!("event {name}: time: {e}")))?;
        let (kind, object_name) = object.split_once('/').unwrap_or(("volume", &object));
        let kind = Kind::ALL
            .into_iter()
            .find(|k| k.singular() == kind)
            .unwrap_or(Kind::Volume);
        let mut note = text("message");
        if note.len() > NOTE_LIMIT {
            let mut cut = NOTE_LIMIT - 3;
            while !note.is_char_boundary(cut) {
                cut -= 1;
            }
            note.truncate(cut);
            note.push_str("...");
        }
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                labels: Some([(LABEL.to_string(), LABEL_VALUE.to_string())].into()),
                ..Default::default()
            },
            event_time: Some(MicroTime(timestamp(time))),
            action: Some(reason.clone()),
            reason: Some(reason.clone()),
            note: Some(note),
            type_: Some(event_type(&reason).into()),
            reporting_controller: Some(CONTROLLER.into()),
            reporting_instance: Some(self.instance.clone()),
            regarding: Some(ObjectReference {
                api_version: Some(resource(kind).api_version),
                kind: Some(resource(kind).kind),
                name: Some(object_name.to_string()),
                namespace: Some(self.namespace.clone()),
                uid: uid(kind, object_name),
                ..Default::default()
            }),
            ..Default::default()
        };
        let created = self
            .api
            .create(&PostParams::default(), &event)
            .await
            .map_err(|e| match &e {
                kube::Error::Api(s) if s.code == 409 => StoreError::AlreadyExists {
                    kind: Kind::Event,
                    name: name.to_string(),
                },
                _ => backend(e),
            })?;
        Ok(created
            .metadata
            .resource_version
            .as_deref()
            .map(revision)
            .unwrap_or(0))
    }

    pub async fn get(&self, name: &str) -> Result<Option<Raw>, StoreError> {
        let event = self.api.get_opt(name).await.map_err(backend)?;
        Ok(event.filter(is_ours).map(record))
    }

    /// Every Ballast event of the namespace, ordered by name (by time).
    pub async fn list(&self) -> Result<Vec<Raw>, StoreError> {
        let params = ListParams::default().labels(&format!("{LABEL}={LABEL_VALUE}"));
        let mut all: Vec<Raw> = self
            .api
            .list(&params)
            .await
            .map_err(backend)?
            .items
            .into_iter()
            .map(record)
            .collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(all)
    }

    pub async fn delete(&self, name: &str) -> Result<(), StoreError> {
        match self.api.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Err(StoreError::NotFound {
                kind: Kind::Event,
                name: name.to_string(),
            }),
            Err(e) => Err(backend(e)),
        }
    }
}

fn is_ours(e: &Event) -> bool {
    e.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.get(LABEL).map(String::as_str) == Some(LABEL_VALUE))
}

/// Events whose reason says something failed or is at risk are warnings.
fn event_type(reason: &str) -> &'static str {
    const WARN: [&str; 9] = [
        "Fail", "Fault", "Lost", "Corrupt", "Block", "Refus", "Down", "Degraded", "Expir",
    ];
    if WARN.iter().any(|w| reason.contains(w)) {
        "Warning"
    } else {
        "Normal"
    }
}

fn timestamp(t: DateTime<Utc>) -> Timestamp {
    Timestamp::from_nanosecond(i128::from(t.timestamp_nanos_opt().unwrap_or_default()))
        .unwrap_or(Timestamp::UNIX_EPOCH)
}

/// A Kubernetes event as a store record of Ballast's event shape.
fn record(e: Event) -> Raw {
    let name = e.metadata.name.clone().unwrap_or_default();
    let rv = e
        .metadata
        .resource_version
        .as_deref()
        .map(revision)
        .unwrap_or(0);
    let regarding = e.regarding.unwrap_or_default();
    let kind = regarding.kind.unwrap_or_default().to_lowercase();
    let time = e
        .event_time
        .map(|t| t.0.as_nanosecond())
        .and_then(|n| i64::try_from(n).ok())
        .map(DateTime::from_timestamp_nanos)
        .unwrap_or_default();
    Raw {
        name: name.clone(),
        resource_version: rv,
        value: json!({
            "name": name,
            "object": format!("{kind}/{}", regarding.name.unwrap_or_default()),
            "reason": e.reason.unwrap_or_default(),
            "message": e.note.unwrap_or_default(),
            "time": time,
        }),
    }
}
