//! What every RPC and task of the node plugin gets: its identity, disks,
//! the replica server (and through it the replica table), the engine
//! processes, and whether it is registered.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use ballast::proto::agent::v1::DiskStatus;

use crate::disks::Disk;

pub struct NodeContext {
    pub node_id: String,
    pub zone: String,
    pub tags: Vec<String>,
    pub disks: Vec<Disk>,
    /// Endpoints this node announces to the controller.
    pub agent_endpoint: String,
    pub replica_endpoint: String,
    pub csi_endpoint: String,
    /// The most volumes that may be published here at once (0: no limit):
    /// registered with the controller, which enforces it, and reported to
    /// the CO (NodeGetInfo).
    pub max_volumes: u32,
    /// Set once the controller accepted our registration; Probe reports it.
    pub registered: Arc<AtomicBool>,
    /// Serves this node's replicas over the replica data protocol.
    pub replicas: Option<Arc<crate::server::ReplicaServer>>,
    /// The engine processes of volumes attached here.
    pub engines: crate::engines::Engines,
}

impl NodeContext {
    /// Every disk, measured now.
    pub fn disk_status(&self) -> Vec<DiskStatus> {
        self.disks.iter().map(Disk::status).collect()
    }
}
