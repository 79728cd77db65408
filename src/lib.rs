//! Ballast core: what the controller and the node plugin share.
//!
//! This crate owns the model (volumes, replicas, nodes, settings, events),
//! the settings registry, the store of record and the generated wire
//! protocols (CSI and Ballast's agent protocol). It does no placement and
//! touches no disk beyond the store file.

pub mod api;
pub mod bearer;
pub mod cluster_token;
pub mod crd;
pub mod csi_caps;
pub mod csi_identity;
pub mod error;
pub mod grpc;
pub mod guard;
pub mod limits;
pub mod logging;
pub mod model;
pub mod proto;
pub mod quantity;
pub mod settings;
pub mod store;
pub mod tls;
pub mod topology;

/// The CSI driver name, reported by GetPluginInfo.
pub const DRIVER_NAME: &str = "ballast.csi.dev";
/// The version of this build, reported by GetPluginInfo.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
