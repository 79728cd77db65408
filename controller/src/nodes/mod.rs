//! Nodes as the controller knows them: registration and heartbeats (the
//! `Controlplane` gRPC service that node agents call), and liveness (a node
//! silent for `--node-down-timeout` turns not ready).
//!
//! A node's flags seed its spec (zone, tags, disks) at first registration;
//! after that the API owns zone and tags, and new disks are added.

mod liveness;
mod registry;

pub use liveness::{check_liveness, run_liveness};
pub use registry::ControlplaneService;
