//! The executor: carries out decisions through the node agents. It writes
//! its intent to the store before calling a node (a volume `creating`, a
//! replica record before the replica), and rolls back what it started when
//! a step fails. It decides nothing: placement comes from the planner.
//!
//! `volume` carries out the volume lifecycle (create, attach, detach,
//! delete); `actions` carries out each planner action; `replica` is the
//! one way a replica is made (and unmade when that fails); `reconcile` is the
//! loop that observes, plans and acts on every change and resync tick;
//! `scrub` has every replica's frozen layers checked on its node;
//! `interrupted` fails a rebuild whose controller died, to start it again;
//! `conditions` writes on each volume's record what the plan cannot do;
//! `snapshot` takes, deletes and restores snapshots; `merge` folds the
//! layers no snapshot needs; `pace` is the rate a rebuild's copy keeps.

mod actions;
pub mod conditions;
pub mod effects;
mod interrupted;
pub mod merge;
mod pace;
mod reconcile;
mod replica;
mod scrub;
pub mod snapshot;
mod volume;

pub use actions::{carry_out, delete_replica};
pub use merge::run_merge;
pub use reconcile::run_reconcile;
pub use scrub::{run_scrub, scrub_now};
pub use volume::{Restart, attach, create, delete, detach, expand, restart_engine};

use ballast::model::Replica;

/// `replicas` grouped by their node, each group in the order given: the
/// passes that go node by node (merge, scrub) look a node's replicas up
/// instead of walking them all per node.
fn by_node<'a>(
    replicas: impl IntoIterator<Item = &'a Replica>,
) -> rustc_hash::FxHashMap<&'a str, Vec<&'a Replica>> {
    let mut groups: rustc_hash::FxHashMap<&str, Vec<&Replica>> = Default::default();
    for r in replicas {
        groups.entry(r.spec.node_id.as_str()).or_default().push(r);
    }
    groups
}
