//! The objects of record, as the store and the REST API hold them (JSON in
//! camelCase): Volume, Replica, Node (with disks), Setting, Snapshot, Event.
//!
//! Every object has a name (a node's is its `id`), a `resourceVersion`
//! set by the store, a `spec` (what is wanted) and a `status` (what is).

/// Declares the spec of a custom resource of `ballast.csi.dev/v1alpha1`:
/// namespaced, with a status subresource, a short name, its print columns
/// (name, type, JSON path) and an `Age` column last. `options` passes
/// further `#[kube]` options (such as `no_spec`).
macro_rules! custom_resource {
    (
        kind: $kind:tt, root: $root:tt, status: $status:tt, short: $short:tt,
        options: [$($option:tt)*],
        columns: [$(($name:tt, $type:tt, $path:tt)),* $(,)?],
        $(#[$attr:meta])*
        pub struct $spec:ident $body:tt
    ) => {
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize, kube::CustomResource, JsonSchema)]
        #[allow(clippy::duplicated_attributes)] // print columns repeat their types
        #[kube(
            group = "ballast.csi.dev",
            version = "v1alpha1",
            namespaced,
            kind = $kind,
            root = $root,
            status = $status,
            shortname = $short,
            $($option)*
            $(printcolumn(name = $name, type_ = $type, json_path = $path),)*
            printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
        )]
        $(#[$attr])*
        pub struct $spec $body
    };
}

mod enums;
mod event;
mod node;
mod replica;
mod setting;
mod snapshot;
mod volume;

pub use enums::*;
pub use event::Event;
pub use node::{DiskSpec, DiskStatus, Node, NodeResource, NodeSpec, NodeStatus};
pub use replica::{RebuildProgress, Replica, ReplicaResource, ReplicaSpec, ReplicaStatus};
pub use setting::{Setting, SettingBody, SettingResource, SettingStatus};
pub use snapshot::{Snapshot, SnapshotResource, SnapshotSpec, SnapshotStatus};
pub use volume::{
    Condition, DEFAULT_STALE_REPLICA_TIMEOUT, MAX_VOLUME_SIZE, Volume, VolumeResource,
    VolumeSource, VolumeSpec, VolumeStatus,
};

/// The kinds of object the store holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Volume,
    Replica,
    Node,
    Setting,
    Event,
    Snapshot,
}

impl Kind {
    pub const ALL: [Kind; 6] = [
        Kind::Volume,
        Kind::Replica,
        Kind::Node,
        Kind::Setting,
        Kind::Event,
        Kind::Snapshot,
    ];

    /// Lower-case plural, as in the REST paths and the store tables.
    pub fn plural(self) -> &'static str {
        match self {
            Kind::Volume => "volumes",
            Kind::Replica => "replicas",
            Kind::Node => "nodes",
            Kind::Setting => "settings",
            Kind::Event => "events",
            Kind::Snapshot => "snapshots",
        }
    }

    /// Lower-case singular, as in `volume/NAME` event references.
    pub fn singular(self) -> &'static str {
        match self {
            Kind::Volume => "volume",
            Kind::Replica => "replica",
            Kind::Node => "node",
            Kind::Setting => "setting",
            Kind::Event => "event",
            Kind::Snapshot => "snapshot",
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.singular())
    }
}

/// An object the store can hold.
pub trait Object: serde::Serialize + serde::de::DeserializeOwned + Clone + Send + 'static {
    const KIND: Kind;
    fn name(&self) -> &str;
    fn resource_version(&self) -> u64;
    fn set_resource_version(&mut self, v: u64);
}

macro_rules! impl_object {
    ($t:ty, $kind:expr, $field:ident) => {
        impl Object for $t {
            const KIND: Kind = $kind;
            fn name(&self) -> &str {
                &self.$field
            }
            fn resource_version(&self) -> u64 {
                self.resource_version
            }
            fn set_resource_version(&mut self, v: u64) {
                self.resource_version = v;
            }
        }
    };
}

impl_object!(Volume, Kind::Volume, name);
impl_object!(Replica, Kind::Replica, name);
impl_object!(Node, Kind::Node, id);
impl_object!(Setting, Kind::Setting, name);
impl_object!(Event, Kind::Event, name);
impl_object!(Snapshot, Kind::Snapshot, name);

/// Validates an object name: 1..=63 characters of lower-case letters,
/// digits and '-', starting and ending with a letter or digit (a DNS label,
/// so that names work as Kubernetes object names too).
pub fn validate_name(name: &str) -> Result<(), String> {
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if name.is_empty() || name.len() > 63 {
        return Err(format!("name {name:?} must be 1 to 63 characters long"));
    }
    if !name.chars().all(ok_char) || !edge(name.chars().next()) || !edge(name.chars().last()) {
        return Err(format!(
            "name {name:?} must be lower-case letters, digits and '-', starting and ending with a letter or digit"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_dns_labels() {
        assert!(validate_name("pvc-1234").is_ok());
        assert!(validate_name("").is_err());
        assert!(validate_name("-x").is_err());
        assert!(validate_name("Upper").is_err());
        assert!(validate_name(&"a".repeat(64)).is_err());
    }
}
