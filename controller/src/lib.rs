//! The Ballast controller: the store of record, the REST API, the CSI
//! controller socket, the registry of nodes (registration, heartbeats,
//! liveness), the pure planner (`planner`, and `sim` to run it on a model),
//! the executor with the control loop that carries its plans out
//! (`executor`), how it reaches the node agents (`agents`), the offline
//! copies a user's call on their volume calls off (`call_off`), the record
//! of which replicas may serve (`freshness`), and its own certificate
//! (`certificate`).
//!
//! It never touches a disk and never imports the node crate: nodes are
//! reached only through the agent protocol in the core crate.

pub mod agents;
pub mod api;
pub mod call_off;
pub mod certificate;
pub mod context;
pub mod csi;
pub mod daemon;
pub mod error;
pub mod events;
pub mod executor;
pub mod forward;
pub mod freshness;
pub mod kubernetes;
pub mod metrics;
pub mod mirror;
pub mod nodes;
pub mod observe;
pub mod planner;
pub mod settings_check;
pub mod sim;
#[cfg(test)]
mod test_store;
pub mod ui;
pub mod volumes;

pub use context::Context;
pub use daemon::{ControllerConfig, run};
pub use error::Error;
