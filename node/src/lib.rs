//! The Ballast node plugin: the node's hands. It owns its disks (identity
//! files, usage, the disk monitor), registers with the controller and
//! heartbeats, serves the CSI socket and the agent, hosts replicas, runs
//! volume engines (`engine`) with their frontends (`frontend`), and copies
//! replica data for rebuilds.
//!
//! The data plane is four layers, each using only those below it: the
//! replica format and the table of open replicas (`replica`), the wire
//! protocol and its client (`wire`), the copy of layers (`sync`), and the
//! replica server (`server`). The engine sits on the wire; its frontends
//! (NBD, FUSE, the control socket) sit on the engine.
//!
//! It decides nothing about placement and never imports the controller
//! crate: it meets the controller only through the agent protocol.

pub mod agent;
pub mod budget;
pub mod bufio;
pub mod context;
pub mod csi;
pub mod daemon;
pub mod disks;
pub mod engine;
pub mod engine_host;
pub mod engines;
pub mod error;
pub mod frontend;
pub mod metrics;
pub mod nudge;
pub mod replica;
pub mod server;
pub mod sync;
pub mod wire;

pub use daemon::{NodeConfig, run};
