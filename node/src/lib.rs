//! The Ballast node plugin: the node's hands. It owns its disks (identity
//! files, usage, the disk monitor), registers with the controller and
//! heartbeats, serves the CSI socket and the agent, hosts replicas
//! (`replica`), runs volume engines (`engine`) with their frontends
//! (`frontend`), and copies replica data for rebuilds (`sync`).
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
