//! Nodes as the controller knows them: enrollment (a node's certificate,
//! when TLS is on), readers (a node's certificate to read another node's
//! replica for a fill), registration and heartbeats (the `Controlplane` gRPC
//! service that node agents call), and liveness (a node silent for
//! `--node-down-timeout` turns not ready), the warning that a node's
//! certificate nears its end, and the renewal of running engines'
//! certificates.
//!
//! A node's flags seed its spec (zone, tags, disks) at first registration;
//! after that the API owns zone and tags, and new disks are added.

mod enrollment;
mod expiry;
mod liveness;
mod readers;
mod registry;
mod renewal;

pub use enrollment::EnrollmentService;
pub use liveness::{check_liveness, run_liveness};
pub use registry::ControlplaneService;
pub use renewal::RENEW_DAYS;
