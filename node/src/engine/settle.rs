//! Settling suspect blocks after a power cut. A replica opened in a new
//! boot checks its head; a block that no longer matches its checksum is
//! taken as it is and recorded as suspect (`Replica::suspect`): it holds
//! a write no flush covered, or bytes gone bad. A starting engine gives
//! each such block the copy another rw replica holds sound, before the
//! catch-up, so that the replica the others are made equal to has none
//! that another could settle. A block no replica holds sound takes the
//! copy of the first rw replica (the keeper) in every other, so that all
//! hold the same: each may hold a different write that no flush covered,
//! and a volume must read the same whichever replica serves it.
//!
//! A volume whose record holds one replica has no other rw copy to settle
//! from. Where that replica kept the disk's checksum of a suspect block
//! (its checksums were synced at every flush, `guard`), the block takes a
//! copy of one of the volume's stale replicas, those the record leaves
//! out, that matches it (`from_stale`): the checksum is the block's state
//! at the last flush or later, so such a copy loses no flushed write. One
//! that matches nowhere stays as it is.
//!
//! Adjacent suspect blocks that one source holds sound are copied as one
//! run (one read, one write), since each write that settles suspect blocks
//! costs the replica a flush and a durable rewrite of its suspect list.
//! It only reads and writes through the replicas' clients; which replicas
//! are members, and their modes, is the engine's.

use std::ops::Range;
use std::time::Duration;

use ballast::model::ReplicaMode;

use super::{Link, Member, ReplicaAddr};
use crate::replica::BLOCK;
use crate::wire::client::ReplicaClient;
use crate::wire::tls::WireTls;

/// How long an engine whose replicas hold suspect blocks waits for the
/// volume's other replicas to be reachable before it serves without them.
pub(super) const SUSPECTS_WAIT: Duration = Duration::from_secs(20);

/// The most blocks one copy settles (1 MiB).
const RUN: u64 = 256;

/// How long a stale replica is given to send its copies of suspect blocks
/// (`from_stale`).
const STALE_WAIT: Duration = Duration::from_secs(20);

/// Of `blocks` (suspect in the replica being settled, in order), the runs
/// of adjacent ones that a source whose suspect blocks are `theirs` (in
/// order) holds sound, each at most `RUN` long; and the blocks it does
/// not hold sound, left for another source.
pub(super) fn sound_runs(blocks: &[u64], theirs: &[u64]) -> (Vec<Range<u64>>, Vec<u64>) {
    let mut runs: Vec<Range<u64>> = Vec::new();
    let mut left = Vec::new();
    for &b in blocks {
        if theirs.binary_search(&b).is_ok() {
            left.push(b);
            continue;
        }
        match runs.last_mut() {
            Some(r) if r.end == b && r.end - r.start < RUN => r.end += 1,
            _ => runs.push(b..b + 1),
        }
    }
    (runs, left)
}

/// Each replica's suspect blocks take the sound copy another rw member
/// holds, where one does; a block suspect in every replica takes the
/// keeper's (the first rw member's), which keeps what it holds.
/// `suspects[i]` and `revisions[i]` are member `i`'s.
pub(super) async fn settle_suspects(
    volume: &str,
    members: &[Member],
    suspects: &[Vec<u64>],
    revisions: &[u64],
) {
    let remote = |i: usize| match (&members[i].link, members[i].mode) {
        (Some(Link::Remote(c)), ReplicaMode::Rw) => Some(c.clone()),
        _ => None,
    };
    let sorted: Vec<Vec<u64>> = suspects
        .iter()
        .map(|s| {
            let mut s = s.clone();
            s.sort_unstable();
            s.dedup();
            s
        })
        .collect();
    let keeper = (0..members.len()).find(|&i| remote(i).is_some());
    for (i, blocks) in sorted.iter().enumerate() {
        let Some(dst) = remote(i).filter(|_| !blocks.is_empty()) else {
            continue;
        };
        let mut left = blocks.clone();
        let (mut settled, mut copies) = (0u64, 0u64);
        // Sources holding the blocks sound, then the keeper's copy of the
        // rest, sound or not.
        let sources = sorted
            .iter()
            .enumerate()
            .map(|(j, theirs)| (j, theirs.as_slice(), false))
            .chain(keeper.map(|k| (k, &[][..], true)));
        let mut kept = 0u64;
        for (j, theirs, from_keeper) in sources {
            let Some(src) = remote(j).filter(|_| j != i && !left.is_empty()) else {
                continue;
            };
            let before = left.len() as u64;
            let (runs, mut unsound) = sound_runs(&left, theirs);
            for run in runs {
                copies += 1;
                if copy(&src, &dst, &run, revisions[i]).await {
                    settled += run.end - run.start;
                    continue;
                }
                if run.end - run.start == 1 {
                    unsound.push(run.start);
                    continue;
                }
                // A run that fails as a whole (a block of it bad in the
                // source, say) is tried again block by block.
                for b in run {
                    copies += 1;
                    if copy(&src, &dst, &(b..b + 1), revisions[i]).await {
                        settled += 1;
                    } else {
                        unsound.push(b);
                    }
                }
            }
            unsound.sort_unstable();
            if from_keeper {
                kept = before - unsound.len() as u64;
            }
            left = unsound;
        }
        tracing::warn!(volume, replica = %members[i].at.name, suspect = blocks.len(),
            settled = settled - kept, kept, unsettled = left.len(), copies,
            "suspect blocks after a power cut taken from replicas that hold them sound, and those no replica holds sound from the first rw replica's copy, so that all hold the same");
    }
}

/// The checksums on the disk a replica's INFO says it kept for some of its
/// suspect blocks (`suspect_sums`: `[[block, crc32c], ...]`), by block.
pub(super) fn kept_sums(info: &serde_json::Value) -> std::collections::BTreeMap<u64, u32> {
    info["suspect_sums"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|pair| {
                    let b = pair.get(0)?.as_u64()?;
                    let sum = u32::try_from(pair.get(1)?.as_u64()?).ok()?;
                    Some((b, sum))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Settles the suspect blocks of `dst`, the volume's one rw replica
/// (named `name`, at `revision`), whose checksums on the disk it kept
/// (`kept`), from the first of the `stale` replicas whose copy matches
/// that checksum. Returns the blocks settled.
pub(super) async fn from_stale(
    volume: &str,
    (name, dst, revision): (&str, &ReplicaClient, u64),
    kept: &std::collections::BTreeMap<u64, u32>,
    stale: &[ReplicaAddr],
    tls: &WireTls,
) -> u64 {
    let mut left: Vec<u64> = kept.keys().copied().collect();
    let mut settled = 0u64;
    for at in stale {
        if left.is_empty() {
            break;
        }
        // A stale replica is a help, not a need: one that does not answer
        // holds the start back no longer than this.
        let found = tokio::time::timeout(STALE_WAIT, matching_copies(tls, at, &left, kept)).await;
        let (copies, mut unmatched) = match found {
            Ok(Ok(found)) => found,
            Ok(Err(e)) => {
                tracing::info!(volume, replica = %at.name, error = %e, "a stale replica could not be asked for its copies of suspect blocks");
                continue;
            }
            Err(_) => {
                tracing::info!(volume, replica = %at.name, wait = ?STALE_WAIT, "a stale replica did not give its copies of suspect blocks in time");
                continue;
            }
        };
        for (run, data) in copies {
            if dst
                .write(run.start * BLOCK, &data, revision, false)
                .await
                .is_ok()
            {
                settled += run.end - run.start;
            } else {
                unmatched.extend(run);
            }
        }
        unmatched.sort_unstable();
        left = unmatched;
    }
    tracing::warn!(
        volume,
        replica = name,
        kept = kept.len(),
        settled,
        unsettled = left.len(),
        "suspect blocks of the volume's one current replica, whose checksums it kept, taken from stale replicas whose copies match them; those no copy matches are served as they are"
    );
    settled
}

/// The stale replica `at`'s copies of blocks `left` that match the
/// checksums `kept`, in runs of adjacent blocks with their data; and the
/// blocks whose copy does not match or cannot be read.
async fn matching_copies(
    tls: &WireTls,
    at: &ReplicaAddr,
    left: &[u64],
    kept: &std::collections::BTreeMap<u64, u32>,
) -> Result<(Vec<(Range<u64>, bytes::Bytes)>, Vec<u64>), crate::wire::client::ClientError> {
    let src = ReplicaClient::dial(tls, &at.addr, &at.name).await?;
    let (mut copies, mut unmatched) = (Vec::new(), Vec::new());
    let (runs, _) = sound_runs(left, &[]);
    for run in runs {
        // A run that cannot be read whole (a block of it bad there) is
        // read again block by block.
        let parts = match read_run(&src, &run).await {
            Some(data) => vec![(run, Some(data))],
            None => {
                let mut each = Vec::new();
                for b in run {
                    each.push((b..b + 1, read_run(&src, &(b..b + 1)).await));
                }
                each
            }
        };
        for (part, data) in parts {
            let Some(data) = data else {
                unmatched.extend(part);
                continue;
            };
            // Only the blocks whose copy is the checksum kept.
            let mut matching = Vec::new();
            crate::replica::each_block_sum(&data, |i, sum| {
                let b = part.start + i as u64;
                if kept.get(&b) == Some(&sum) {
                    matching.push(b);
                } else {
                    unmatched.push(b);
                }
            });
            let (runs, _) = sound_runs(&matching, &[]);
            for c in runs {
                let from = ((c.start - part.start) * BLOCK) as usize;
                let to = ((c.end - part.start) * BLOCK) as usize;
                copies.push((c, data.slice(from..to)));
            }
        }
    }
    Ok((copies, unmatched))
}

/// Blocks `run` of `src`, or None when they cannot be read.
async fn read_run(src: &ReplicaClient, run: &Range<u64>) -> Option<bytes::Bytes> {
    let len = u32::try_from((run.end - run.start) * BLOCK).ok()?;
    src.read(run.start * BLOCK, len).await.ok()
}

/// Copies blocks `run` from `src` to `dst` (written at `revision`).
async fn copy(src: &ReplicaClient, dst: &ReplicaClient, run: &Range<u64>, revision: u64) -> bool {
    match read_run(src, run).await {
        Some(data) => dst
            .write(run.start * BLOCK, &data, revision, false)
            .await
            .is_ok(),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adjacent_blocks_the_source_holds_sound_make_one_run() {
        let blocks: Vec<u64> = (10..20).chain([30, 31, 40]).collect();
        let (runs, left) = sound_runs(&blocks, &[]);
        assert_eq!(runs, vec![10..20, 30..32, 40..41]);
        assert!(left.is_empty());
    }

    #[test]
    fn a_block_suspect_in_the_source_too_splits_the_run_and_is_left() {
        let blocks: Vec<u64> = (10..20).collect();
        let (runs, left) = sound_runs(&blocks, &[0, 14, 15, 99]);
        assert_eq!(runs, vec![10..14, 16..20]);
        assert_eq!(left, vec![14, 15]);
    }

    #[test]
    fn a_run_is_at_most_a_mebibyte() {
        let blocks: Vec<u64> = (0..RUN * 2 + 5).collect();
        let (runs, left) = sound_runs(&blocks, &[]);
        assert_eq!(runs, vec![0..RUN, RUN..2 * RUN, 2 * RUN..2 * RUN + 5]);
        assert!(left.is_empty());
        assert_eq!(RUN * BLOCK, 1 << 20);
    }
}
