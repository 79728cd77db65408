//! Records as Kubernetes objects and back: which resource a kind is, the
//! record's body beside the object's metadata, resource versions as the
//! store's revisions, and API errors as store errors. Used by the store,
//! its watch caches and its events; it calls nothing.

use ballast::crd::{GROUP, VERSION};
use ballast::model::Kind;
use ballast::store::{Raw, StoreError};
use kube::api::{ApiResource, DynamicObject, ObjectMeta};
use serde_json::Value;

/// The API resource of a kind.
pub fn resource(kind: Kind) -> ApiResource {
    let (name, plural) = match kind {
        Kind::Volume => ("Volume", "volumes"),
        Kind::Replica => ("Replica", "replicas"),
        Kind::Node => ("Node", "nodes"),
        Kind::Setting => ("Setting", "settings"),
        Kind::Event => ("Event", "events"),
        Kind::Snapshot => ("Snapshot", "snapshots"),
    };
    ApiResource {
        group: GROUP.into(),
        version: VERSION.into(),
        api_version: format!("{GROUP}/{VERSION}"),
        kind: name.into(),
        plural: plural.into(),
    }
}

/// A store error for anything the API server or the client says.
pub fn backend(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(e.to_string())
}

/// A Kubernetes resource version as the store's revision. The API server
/// backed by etcd gives etcd's revision, a number; anything else is 0.
pub fn revision(rv: &str) -> u64 {
    rv.parse().unwrap_or(0)
}

pub fn object_rv(o: &DynamicObject) -> u64 {
    o.metadata
        .resource_version
        .as_deref()
        .map(revision)
        .unwrap_or(0)
}

/// The key of a kind's name in its record (a node's is its `id`).
fn name_key(kind: Kind) -> &'static str {
    match kind {
        Kind::Node => "id",
        _ => "name",
    }
}

pub fn is_empty(v: &Value) -> bool {
    v.is_null() || v.as_object().is_some_and(|m| m.is_empty())
}

/// A record's body (everything but its name, version and status) and its
/// status, if it has that key.
pub fn split(kind: Kind, value: &Value) -> Result<(Value, Option<Value>), StoreError> {
    let Value::Object(map) = value else {
        return Err(StoreError::Backend(format!(
            "a {kind} record must be a JSON object"
        )));
    };
    let mut body = map.clone();
    body.remove(name_key(kind));
    body.remove("resourceVersion");
    let status = body.remove("status");
    Ok((Value::Object(body), status))
}

pub fn to_object(kind: Kind, name: &str, body: &Value, rv: Option<u64>) -> DynamicObject {
    let mut obj = DynamicObject::new(name, &resource(kind));
    obj.metadata = ObjectMeta {
        name: Some(name.to_string()),
        resource_version: rv.map(|v| v.to_string()),
        ..Default::default()
    };
    obj.data = body.clone();
    obj
}

pub fn with_status(mut obj: DynamicObject, status: Value) -> DynamicObject {
    if let Value::Object(map) = &mut obj.data {
        map.insert("status".into(), status);
    }
    obj
}

/// A custom resource as a store record.
pub fn from_object(kind: Kind, obj: DynamicObject) -> Result<Raw, StoreError> {
    let name = obj.metadata.name.clone().unwrap_or_default();
    let resource_version = object_rv(&obj);
    let mut map = match obj.data {
        Value::Object(map) => map,
        _ => serde_json::Map::new(),
    };
    map.remove("apiVersion");
    map.remove("kind");
    map.remove("metadata");
    map.insert(name_key(kind).into(), Value::String(name.clone()));
    Ok(Raw {
        name,
        resource_version,
        value: Value::Object(map),
    })
}
