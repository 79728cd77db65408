//! The Ballast node plugin: the node's hands. It owns its disks (identity
//! files, usage), registers with the controller and heartbeats, and serves
//! the CSI socket. Replicas, the engine and frontends come in later
//! releases.
//!
//! It decides nothing about placement and never imports the controller
//! crate: it meets the controller only through the agent protocol.

pub mod agent;
pub mod bufio;
pub mod context;
pub mod csi;
pub mod daemon;
pub mod disks;
pub mod engine;
pub mod error;
pub mod frontend;
pub mod replica;
pub mod sync;

pub use daemon::{NodeConfig, run};
