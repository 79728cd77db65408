//! The node agent: the client that registers with the controller and
//! heartbeats, and the `NodeAgent` gRPC server the controller calls.

mod heartbeat;
mod rebuild;
mod server;

pub use heartbeat::run_heartbeats;
pub use server::NodeAgentService;
