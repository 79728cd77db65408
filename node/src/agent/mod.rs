//! The node agent: its enrollment (TLS on), the client that registers
//! with the controller and heartbeats, the `NodeAgent` gRPC server the controller calls, and the
//! offline rebuild it runs for a detached volume, and which disks the node
//! opens (asked of the controller at start). Engine processes are
//! `crate::engines`'; replicas are `crate::replica`'s.

mod disks;
mod enroll;
mod heartbeat;
pub mod rebuild;
pub mod renewal;
mod server;

pub use disks::disks_to_open;
pub use enroll::enroll;
pub use heartbeat::{Reconnect, run_heartbeats};
pub use renewal::Renewal;
pub use server::NodeAgentService;
