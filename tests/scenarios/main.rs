//! Every scenario of the seeds' test plans, on real processes: a controller
//! and node processes on loopback, directories as disks, volumes served by
//! engine processes over NBD. Data is written before every move and
//! verified by checksum after it, through NBD and in every replica's files.

#[path = "../../cli/tests/common/mod.rs"]
mod common;
// Disks that forget, for the fault suite's power cuts (it shares the harness).
#[allow(dead_code)]
#[path = "../../node/tests/support/forgetful.rs"]
mod forgetful;
mod harness;

mod disk_loss;
mod kube_cluster;
mod kube_drain;
mod kube_nodes;
mod kube_provisioning;
mod leader;
mod modify;
mod offline_copies;
mod orphans;
mod paced_rebuilds;
mod rogue;
mod rotation;
mod safety;
mod seed000_auto_balance;
mod seed001_disk_pressure;
mod seed002_eviction_drain;
mod seed003_data_locality;
mod seed004_reuse;
mod snapshots;
