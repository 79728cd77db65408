//! The node agent: the client that registers with the controller and
//! heartbeats, the `NodeAgent` gRPC server the controller calls, and the
//! offline rebuild it runs for a detached volume. Engine processes are
//! `crate::engines`'; replicas are `crate::replica`'s.

mod heartbeat;
mod rebuild;
mod server;

pub use heartbeat::run_heartbeats;
pub use server::NodeAgentService;
