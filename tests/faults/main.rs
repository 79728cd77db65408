//! The fault suite: schedules of crashes, full disks and flipped blocks
//! applied to a real cluster while a writer writes through NBD. Every
//! acknowledged write must read back, or the volume must refuse to serve
//! and say which replica holds the latest data; never stale data. The
//! fixed schedules are the sequences that once lost data; the random ones
//! are seeded (`BALLAST_FAULT_SEED`, `BALLAST_FAULT_SCHEDULES`) so a failure
//! is replayed by its seed, alone with `BALLAST_FAULT_ONLY` (its number).

#[path = "../../cli/tests/common/mod.rs"]
mod common;
#[path = "../../node/tests/support/forgetful.rs"]
mod forgetful;
#[allow(dead_code)] // shared with the scenario suite, which uses all of it
#[path = "../scenarios/harness.rs"]
mod harness;
mod schedule;
mod writer;

use schedule::{Draw, Fault::*, Rng, Schedule, random, run};

fn fixed(name: &str, replicas: usize, faults: Vec<schedule::Fault>) {
    // No fixed schedule but the one below flips a block in every replica
    // the volume trusts to hold it.
    fixed_losing(name, replicas, faults, 0);
}

/// `fixed`, where no check, made while the faults last, may be refused:
/// the volume must serve through them.
fn fixed_serving(name: &str, replicas: usize, faults: Vec<schedule::Fault>) {
    let o = fixed_losing(name, replicas, faults, 0);
    assert!(
        o.refused.is_empty(),
        "{name}: an attach was refused while the faults lasted: {:?}",
        o.refused
    );
}

/// `fixed`, where at most `lost` acknowledged writes may fail their reads
/// because a block of each was flipped in every replica trusted to hold
/// it (never served flipped).
fn fixed_losing(
    name: &str,
    replicas: usize,
    faults: Vec<schedule::Fault>,
    lost: usize,
) -> schedule::Outcome {
    let s = Schedule {
        name: name.into(),
        replicas,
        faults,
    };
    match run(&s) {
        Ok(o) => {
            eprintln!(
                "{name}: {} writes acknowledged ({} flushed), {} checks refused with a reason",
                o.acknowledged,
                o.flushed,
                o.refused.len()
            );
            assert!(
                o.lost_to_corruption <= lost,
                "{name}: {} writes lost to flipped blocks, where a sound copy allowed no more than {lost}",
                o.lost_to_corruption
            );
            o
        }
        Err(e) => panic!("{e}"),
    }
}

/// Found by the soak of 2026-12-01 (seed 20261201, random schedule 24):
/// with every node back, the attach was refused.
#[test]
fn a_node_down_then_the_other_ones_disk_full_then_both_back() {
    fixed(
        "node-down-then-disk-full",
        2,
        vec![
            Pause(300),
            Pause(1406),
            Pause(1438),
            KillNode(1),
            Pause(514),
            FillDisk(2),
            Pause(1263),
            Check,
            Pause(955),
            Pause(1338),
        ],
    );
}

/// A replica's node loses power while the writer writes: its disk keeps
/// only what was flushed, and the page cache is gone. The other replicas
/// serve every acknowledged write, and the node's replica, back after the
/// new boot, is rebuilt or reused and serves them too.
#[test]
fn a_replica_node_loses_power_while_writing_and_comes_back() {
    fixed(
        "power-cut",
        3,
        vec![
            Pause(800),
            PowerCut(1),
            Pause(1500),
            Check,
            RestartNode(1),
            Settle,
            Pause(800),
            Check,
        ],
    );
}

/// A replica's node is rebooted, planned, while the writer writes: its
/// node plugin closes its replica clean at SIGTERM, so that the new boot
/// trusts that replica's head and write log instead of checking it as
/// after a power cut; it is caught up and serves every acknowledged write.
#[test]
fn a_replica_node_rebooted_planned_trusts_its_replica_and_comes_back() {
    fixed(
        "planned-reboot",
        3,
        vec![
            Pause(800),
            Reboot(1),
            TrustedAfterReboot(1),
            Pause(800),
            Check,
            Settle,
            Pause(800),
            Check,
        ],
    );
}

/// Two replicas, on node-2 and node-3: each node loses power in turn,
/// the second once the first's replica is back in service, so that the
/// last check reads every acknowledged write from the replica that came
/// back from a power cut alone.
#[test]
fn each_replica_node_loses_power_in_turn() {
    fixed(
        "power-cut-in-turn",
        2,
        vec![
            Pause(800),
            PowerCut(1),
            Pause(1000),
            RestartNode(1),
            Settle,
            Pause(800),
            Check,
            PowerCut(2),
            Pause(800),
            Check,
            RestartNode(2),
            Settle,
            Pause(500),
        ],
    );
}

/// Every machine loses power at once while the writer writes, the
/// engine's included: every flushed write reads back, what no flush
/// covered holds its bytes or zeros block by block, and the replicas,
/// each opened in a new boot, are made equal again (rebuilt: no write log
/// can be trusted) and serve.
fn every_machine_loses_power_at_once(replicas: usize) {
    fixed(
        &format!("power-cut-all-{replicas}"),
        replicas,
        vec![
            Pause(1000),
            PowerCutAll,
            Pause(1000),
            Check,
            Settle,
            Pause(800),
            Check,
        ],
    );
}

#[test]
fn every_machine_loses_power_at_once_one_replica() {
    every_machine_loses_power_at_once(1);
}

#[test]
fn every_machine_loses_power_at_once_two_replicas() {
    every_machine_loses_power_at_once(2);
}

#[test]
fn every_machine_loses_power_at_once_three_replicas() {
    every_machine_loses_power_at_once(3);
}

/// Found by the soak of seed 20261226, power schedule 26: a block of an
/// acknowledged, flushed write flipped in node-3's replica, then node-2's
/// power cut (its replica left behind, node-3's the last current one),
/// then node-3's. A new boot checked every block of the head and took
/// the flipped one as a write no flush covered: the volume served the
/// flipped bytes. A new boot now checks only the regions written lately
/// (`replica/regions.rs`), so the flipped block fails its reads, as it
/// would have without the cut, until node-2's replica joins again and
/// gives its copy, which has the checksum node-3's recorded
/// (`engine/spare.rs`); the check may come before that. (The flip takes
/// the first write; the writer is well past its region at node-3's cut.)
#[test]
fn a_block_flipped_in_the_last_current_replica_then_its_power_cut() {
    fixed_losing(
        "flip-then-last-replica-power-cut",
        2,
        vec![
            Pause(300),
            CorruptHead(2),
            Pause(1147),
            PowerCut(1),
            Pause(4000),
            PowerCut(2),
            Pause(1500),
        ],
        1,
    );
}

/// Found by the soaks of seeds 20261246, 20261250 and 20261261 (this is
/// reboots schedule 4 of the last): node-2's disk filled, so that its
/// replica was dropped from the record, and node-3's, the one current
/// replica, held a block flipped where its head held none (the first
/// write, frozen below by the rebuild node-2's replica began); then every
/// machine's power cut. Its new boot found the block failing its checksum
/// in a region written lately, took it as it was (it could be a flushed
/// write whose checksum was not synced yet), and no current replica held
/// it sound: the volume served the flipped bytes. The one current replica
/// now syncs its checksums at every flush while a stale one exists
/// (`engine/guard.rs`), so its new boot knows the block held no flushed
/// write of the head, and reads it from the layer below
/// (`Replica::drop_unflushed`).
#[test]
fn a_block_flipped_in_the_last_current_replica_with_the_other_on_a_full_disk_then_every_machine_loses_power()
 {
    fixed(
        "flip-in-the-last-current-replica-then-power-cut-all",
        2,
        vec![
            Pause(300),
            FillDisk(1),
            Pause(1247),
            CorruptHead(2),
            Pause(956),
            PowerCutAll,
            Pause(852),
            Reboot(2),
            Pause(852),
            Check,
            Pause(1424),
            KillEngine,
            Pause(2000),
        ],
    );
}

/// Found by the soak of seed 20261250 (reboots schedule 1): a block of
/// node-3's head flipped, node-2 killed (its replica dropped from the
/// record, node-3's the one current replica), then every machine's power
/// cut. Node-3's new boot found the block failing its checksum in a region
/// written lately and took it as it was: the volume served the flipped
/// bytes. Node-3's replica now guards its checksums once it is the only
/// one (`engine/guard.rs`): its new boot keeps the block's checksum, the
/// controller names node-2's replica to the starting engine as stale,
/// and the engine takes node-2's copy, which matches it
/// (`Engine::settle_from_stale`).
#[test]
fn a_block_flipped_in_one_replica_then_the_other_killed_then_every_machine_loses_power() {
    fixed(
        "flip-then-other-killed-then-power-cut-all",
        2,
        vec![
            Pause(300),
            CorruptHead(2),
            Pause(1168),
            KillNode(1),
            Pause(353),
            PowerCutAll,
            Pause(2076),
            Check,
            Pause(1064),
            KillController,
            Pause(2000),
        ],
    );
}

/// A block flipped in each of three replicas (another acknowledged write
/// in each, in the region written lately), every disk filled, then every
/// machine's power cut: each replica's new boot finds its flipped block
/// failing its checksum and must record it as suspect before it serves,
/// in a new file, for which no disk had room. Every open failed, and the
/// volume could not attach until space was freed. Each replica now gives
/// up the room it keeps for that (`replica/room.rs`), opens, and takes
/// the sound copy of its suspect block from the others: the check made
/// while the disks are still full is served, not refused.
#[test]
fn a_block_flipped_in_each_replica_then_every_disk_full_then_every_machine_loses_power() {
    fixed_serving(
        "flips-then-every-disk-full-then-power-cut-all",
        3,
        vec![
            Pause(800),
            CorruptHead(0),
            CorruptHead(1),
            CorruptHead(2),
            FillDisk(0),
            FillDisk(1),
            FillDisk(2),
            PowerCutAll,
            Pause(1500),
            Check,
            Pause(500),
        ],
    );
}

/// Found by the soak of seed 20261219, power schedule 17: a block of an
/// acknowledged, flushed write flipped in node-1's replica, then every
/// machine's power cut. After a power cut a block that does not match its
/// checksum may hold a write no flush covered, so the replica took it as
/// it found it, and served the flipped bytes. It is now suspect, and takes
/// the sound copy another replica holds before the volume serves.
#[test]
fn a_block_flipped_in_one_replica_then_every_machine_loses_power() {
    fixed(
        "flip-then-power-cut-all",
        3,
        vec![
            Pause(300),
            KillNode(1),
            Pause(933),
            CorruptHead(0),
            Pause(1263),
            PowerCutAll,
            Pause(697),
        ],
    );
}

/// Found by the soak of seed 20261233, reboots schedule 14: every
/// machine's power cut, then node-1's disk full. The engine restarted on
/// node-1 could not open its local replica there, and waited 20 s for it
/// as for a node not back yet; the controller gave up on the start, its
/// dropped request left that engine's process running unrecorded, and
/// the next attachment's start took it for its own: a stale engine whose
/// writes the fenced replicas refused, and the volume faulted. A replica
/// whose server fails it is no longer waited for, a start runs to its
/// end, and a start for a later attachment replaces an earlier one's
/// engine.
#[test]
fn every_machine_loses_power_then_the_engines_node_fills_its_disk() {
    fixed(
        "power-cut-all-then-disk-full",
        3,
        vec![
            Pause(300),
            CorruptHead(1),
            Pause(596),
            PowerCutAll,
            Pause(332),
            FillDisk(0),
            Pause(944),
            Check,
            Pause(1134),
        ],
    );
}

/// A block flipped in the engine's replica, every machine's power cut,
/// and one replica's machine does not come back: the engine's replica
/// holds a suspect block (the flipped one, in a region written lately),
/// and its start waits a while for the missing replica to help settle
/// it. It must then serve from the replicas that came back (the other
/// holds the block sound), not wait for the missing one.
#[test]
fn every_machine_loses_power_and_one_does_not_come_back() {
    fixed(
        "power-cut-all-one-stays-down",
        3,
        vec![
            Pause(300),
            CorruptHead(0),
            Pause(700),
            PowerCutAllBut(2),
            Pause(1000),
            Check,
            RestartNode(2),
            Settle,
            Check,
        ],
    );
}

#[test]
fn engine_killed_twice_while_writing() {
    fixed(
        "engine-killed-twice",
        3,
        vec![
            Pause(800),
            KillEngine,
            Pause(1500),
            KillEngine,
            Pause(1500),
            Check,
            Pause(500),
        ],
    );
}

#[test]
fn replica_node_killed_and_restarted_while_writing() {
    fixed(
        "node-killed-restarted",
        3,
        vec![
            Pause(800),
            KillNode(2),
            Pause(1500),
            Check,
            RestartNode(2),
            Pause(1500),
        ],
    );
}

#[test]
fn two_replica_nodes_down_and_back_in_reverse_order() {
    fixed(
        "two-down-reverse",
        3,
        vec![
            Pause(800),
            KillNode(1),
            Pause(800),
            KillNode(2),
            Pause(800),
            RestartNode(2),
            RestartNode(1),
            Pause(1500),
        ],
    );
}

/// Both replica nodes other than the volume's go down while the writer
/// writes, one after the other, and come back, in each of the four
/// orders; the volume is checked with one back and with both back.
fn node_restarts_in_every_order(replicas: usize) {
    for (down, up) in [
        ([1, 2], [1, 2]),
        ([1, 2], [2, 1]),
        ([2, 1], [1, 2]),
        ([2, 1], [2, 1]),
    ] {
        fixed(
            &format!("{replicas}-replicas-down-{down:?}-up-{up:?}"),
            replicas,
            vec![
                Pause(600),
                KillNode(down[0]),
                Pause(800),
                KillNode(down[1]),
                Pause(600),
                RestartNode(up[0]),
                Pause(800),
                Check,
                RestartNode(up[1]),
                Pause(800),
                Check,
            ],
        );
    }
}

#[test]
fn two_replicas_nodes_restart_in_every_order() {
    node_restarts_in_every_order(2);
}

#[test]
fn three_replicas_nodes_restart_in_every_order() {
    node_restarts_in_every_order(3);
}

#[test]
fn the_replica_with_the_latest_data_down_last_refuses_then_serves() {
    // Two replicas (node-2, node-3), the volume on node-1. node-3 goes
    // down and only node-2 takes writes; then node-2 goes down too. With
    // only node-3 (stale) back, the volume must refuse and name node-2's
    // replica; with node-2 back, every write reads back.
    fixed(
        "latest-down-last",
        2,
        vec![
            Pause(800),
            KillNode(2),
            Pause(1500),
            Check,
            KillNode(1),
            Pause(500),
            RestartNode(2),
            Check,
        ],
    );
}

#[test]
fn controller_killed_while_writing() {
    fixed(
        "controller-killed",
        3,
        vec![
            Pause(800),
            KillController,
            Pause(1500),
            KillEngine,
            Pause(800),
            RestartController,
            Pause(1500),
            Check,
        ],
    );
}

#[test]
fn a_replica_disk_full_then_freed() {
    fixed(
        "disk-full",
        3,
        vec![
            Pause(800),
            FillDisk(2),
            Pause(1500),
            Check,
            FreeDisk(2),
            Pause(1500),
        ],
    );
}

#[test]
fn a_corrupt_head_block_is_never_served() {
    fixed(
        "corrupt-head",
        3,
        vec![Pause(1200), CorruptHead(0), Pause(500), Check, Pause(500)],
    );
}

/// The shape of the soak's seed 20261204, moves schedule 17: another
/// block flipped in each replica, then a snapshot, whose freeze checks
/// every head. Each bad block is repaired from the others, so the volume
/// settles back to three replicas (it stayed at one when a bad block
/// failed its whole replica).
#[test]
fn another_block_flipped_in_each_replica_then_a_snapshot() {
    fixed(
        "flipped-in-each",
        3,
        vec![
            Pause(800),
            CorruptHead(1),
            Pause(300),
            CorruptHead(2),
            Pause(300),
            CorruptHead(0),
            Pause(300),
            Snapshot,
            Pause(500),
        ],
    );
}

/// Found by the soak of 2026-12-02 (seed 20261204, moves schedule 3): a
/// replica deleted on a full disk was a 500 ENOSPC, as the deletion's bin
/// could not be made there.
#[test]
fn a_replica_deleted_on_a_full_disk() {
    fixed(
        "delete-on-full-disk",
        3,
        vec![
            Pause(800),
            FillDisk(1),
            Pause(300),
            DeleteReplica(1),
            Pause(1000),
        ],
    );
}

/// Found by the soak of 2026-12-02 (seed 20261206, moves schedule 9): two
/// nodes down, then a block flipped in the last rw replica. Every rebuild
/// began with a snapshot whose freeze failed on that block, so the volume
/// stayed at one replica. The nodes that come back held the block as it
/// was last written (the flip takes the first acknowledged write, written
/// before they went down), and their write logs show it: the block is
/// repaired from them, and the volume settles back to three.
#[test]
fn two_nodes_down_then_a_block_flipped_in_the_last_replica() {
    fixed(
        "bad-block-in-the-last-replica",
        3,
        vec![
            Pause(800),
            KillNode(2),
            Pause(700),
            KillNode(1),
            Pause(1200),
            CorruptHead(0),
            Pause(500),
            DeleteReplica(0),
            Pause(1000),
        ],
    );
}

#[test]
fn engine_killed_while_a_replica_node_is_down() {
    fixed(
        "engine-killed-node-down",
        3,
        vec![
            Pause(800),
            KillNode(1),
            Pause(800),
            KillEngine,
            Pause(1500),
            Check,
            RestartNode(1),
            Pause(800),
        ],
    );
}

#[test]
fn random_schedules() {
    random_runs(Draw::Faults);
}

/// The same, with replicas added, removed, deleted and evicted and
/// snapshots taken and deleted between the faults.
#[test]
fn random_schedules_that_move_replicas() {
    random_runs(Draw::Moves);
}

/// The same, with power cuts between the faults: a replica node's, and
/// every machine's at once.
#[test]
fn random_schedules_with_power_cuts() {
    random_runs(Draw::PowerCuts);
}

/// The same, with replica nodes frozen (SIGSTOP: connections open, nothing
/// answered) and thawed, some for longer than the replica timeout.
#[test]
fn random_schedules_with_freezes() {
    random_runs(Draw::Freezes);
}

/// The same, with planned reboots of replica nodes besides the power
/// cuts: a node plugin stopped by SIGTERM (its replicas closed clean), a
/// new boot, the node back; no acknowledged write may be lost to one.
#[test]
fn random_schedules_with_reboots() {
    random_runs(Draw::Reboots);
}

fn random_runs(draw: Draw) {
    let seed: u64 = std::env::var("BALLAST_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let count: u64 = std::env::var("BALLAST_FAULT_SCHEDULES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    // Replays one schedule of a seed: the ones before it are drawn, not run.
    let only: Option<u64> = std::env::var("BALLAST_FAULT_ONLY")
        .ok()
        .and_then(|s| s.parse().ok());
    let mut rng = Rng::new(seed);
    let mut failures = Vec::new();
    for i in 0..count {
        let s = random(&mut rng, i, draw);
        if only.is_some_and(|o| o != i) {
            continue;
        }
        // Said first, so that a schedule whose run panics can be replayed.
        eprintln!("{} (seed {seed}): {:?}", s.name, s.faults);
        match run(&s) {
            Ok(o) => eprintln!(
                "{} (seed {seed}): {} acknowledged, {} refused with a reason, \
                 {} lost to a block flipped in every replica holding it",
                s.name,
                o.acknowledged,
                o.refused.len(),
                o.lost_to_corruption
            ),
            Err(e) => {
                eprintln!("FAILED {} (seed {seed}): {e}", s.name);
                failures.push(e);
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {count} random schedules (seed {seed}) broke:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
