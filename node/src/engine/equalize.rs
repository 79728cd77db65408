//! Making the replicas equal where they were written lately, as an engine
//! starts. After an unclean stop (the engine killed, a node's power cut),
//! replicas at the same revision may still differ where writes that no
//! flush covered were under way: one reached a replica and not another,
//! and a cut may have lost the write-log entry or the revision that
//! would have said so while the data reached the disk (the catch-up
//! compares write logs and revisions only). Every write lands in a region
//! its replica recorded dirty on the disk before the data
//! (`replica::regions`), and a region stays so until flushes well after
//! its last write: the blocks where two replicas may differ lie in the
//! union of their dirty regions.
//!
//! There the engine compares what each replica's reads return, block by
//! block, by CRC32C (VIEW_SUMS: 4 bytes a block cross the wire, no data),
//! and copies the keeper's blocks where another's differ, then flushes
//! it. The keeper is the replica the catch-up makes the others equal to:
//! the first rw one at the highest revision. A replica below it compares
//! the same way: the writes it lacks were never acknowledged as durable
//! (every replica the volume's record holds took part in every flush
//! acknowledged), and they too lie in the union of the regions. So after a
//! power cut, when no write log can say what changed, the replicas are
//! compared there instead of rebuilt whole. Which replicas are members, and their modes, is the
//! engine's; this only reads and writes through their clients, and fails
//! one (`err`, to be rebuilt) that cannot be compared or made equal.

use ballast::model::ReplicaMode;

use std::ops::Range;

use super::settle::sound_runs;
use super::{Link, Member, RebuildStatus};
use crate::replica::BLOCK;
use crate::wire::client::{ClientError, ReplicaClient};
use crate::wire::protocol::{MAX_DATA, status};

/// Blocks compared per VIEW_SUMS request (the most one request covers).
const CHUNK: u64 = MAX_DATA as u64 / BLOCK;

/// Sorted runs of blocks `[first, last)`, overlapping and adjacent ones
/// merged.
fn union(mut runs: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    runs.retain(|(a, b)| a < b);
    runs.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (a, b) in runs {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// `runs` cut into pieces of at most `CHUNK` blocks.
fn chunks(runs: &[(u64, u64)]) -> Vec<(u64, u64)> {
    runs.iter()
        .flat_map(|&(a, b)| {
            (a..b)
                .step_by(CHUNK as usize)
                .map(move |s| (s, (s + CHUNK).min(b)))
        })
        .collect()
}

/// Whether the replica's server does not know the op (a node of a version
/// before it): it is then not compared, as before.
fn unknown_op(e: &ClientError) -> bool {
    matches!(e, ClientError::Failed { status: s, message, .. }
        if *s == status::INVALID && message.contains("unknown op"))
}

/// The blocks of `chunk` where `theirs` differs from `keeper`'s sums.
fn differing(chunk: (u64, u64), keeper: &[u32], theirs: &[u32]) -> Vec<u64> {
    (chunk.0..chunk.1)
        .zip(keeper.iter().zip(theirs))
        .filter(|(_, (k, t))| k != t)
        .map(|(b, _)| b)
        .collect()
}

/// What one replica's comparison came to.
#[derive(Default)]
struct Outcome {
    differing: u64,
    copied: u64,
    /// Blocks the keeper could not read, left as the replica holds them.
    unreadable: u64,
}

/// Makes every rw member hold what the keeper (the first at revision
/// `best`, the highest) holds over the union of their regions written
/// lately. `revisions[i]` is member `i`'s. Returns the members made equal
/// to the keeper so, which the catch-up leaves as they are; none when
/// they could not be compared.
pub(super) async fn equalize_recent(
    volume: &str,
    members: &mut [Member],
    revisions: &[u64],
    best: u64,
) -> Vec<usize> {
    let remote = |m: &Member| match (&m.link, m.mode) {
        (Some(Link::Remote(c)), ReplicaMode::Rw) => Some(c.clone()),
        _ => None,
    };
    // The keeper first, then the others in order.
    let mut peers: Vec<(usize, std::sync::Arc<ReplicaClient>)> = members
        .iter()
        .enumerate()
        .filter_map(|(i, m)| remote(m).map(|c| (i, c)))
        .collect();
    let Some(first) = peers.iter().position(|(i, _)| revisions[*i] == best) else {
        return Vec::new();
    };
    peers[..=first].rotate_right(1);
    let Some(((k, keeper), others)) = peers.split_first() else {
        return Vec::new();
    };
    if others.is_empty() {
        return Vec::new();
    }
    let keeper_name = members[*k].at.name.clone();
    let mut runs = Vec::new();
    for (i, c) in &peers {
        match c.recent_runs().await {
            Ok(r) => runs.extend(r),
            Err(e) if unknown_op(&e) => {
                tracing::warn!(volume, replica = %members[*i].at.name, "the replica's node cannot say where it was written lately (an older version): the replicas are not compared there");
                return Vec::new();
            }
            Err(e) if i == k => {
                tracing::warn!(volume, replica = %keeper_name, error = %e, "the keeper cannot say where it was written lately: the replicas are not compared");
                return Vec::new();
            }
            Err(e) => fail(&mut members[*i], &keeper_name, &e.to_string()),
        }
    }
    let runs = chunks(&union(runs));
    let blocks: u64 = runs.iter().map(|(a, b)| b - a).sum();
    let mut equal = Vec::new();
    for (i, dst) in others {
        if members[*i].mode != ReplicaMode::Rw {
            continue;
        }
        match compare_and_copy(keeper, dst, &runs, best).await {
            Ok(o) => {
                equal.push(*i);
                let m = &mut members[*i];
                if o.differing > 0 {
                    tracing::warn!(volume, replica = %m.at.name, keeper = %keeper_name, blocks,
                        differing = o.differing, copied_bytes = o.copied, unreadable = o.unreadable,
                        "blocks of the regions written lately that differed from the keeper's after an unclean stop, made equal");
                    m.rebuild = Some(RebuildStatus {
                        source: keeper_name.clone(),
                        kept_bytes: 0,
                        copied_bytes: o.copied,
                        path: "recent-regions".into(),
                        done: true,
                    });
                } else {
                    tracing::info!(volume, replica = %m.at.name, keeper = %keeper_name, blocks,
                        "the regions written lately hold the keeper's blocks");
                }
            }
            Err(why) => fail(&mut members[*i], &keeper_name, &why),
        }
    }
    equal
}

/// Compares `dst` with `keeper` over `runs` (each at most `CHUNK` blocks)
/// and copies the keeper's blocks where they differ, written at
/// `revision`, then flushes `dst`.
async fn compare_and_copy(
    keeper: &ReplicaClient,
    dst: &ReplicaClient,
    runs: &[(u64, u64)],
    revision: u64,
) -> Result<Outcome, String> {
    let mut out = Outcome::default();
    for &(a, b) in runs {
        let (offset, len) = (a * BLOCK, ((b - a) * BLOCK) as u32);
        let theirs = keeper.view_sums(offset, len);
        let ours = dst.view_sums(offset, len);
        let (theirs, ours) = tokio::join!(theirs, ours);
        let theirs = theirs.map_err(|e| format!("the keeper's sums: {e}"))?;
        let ours = ours.map_err(|e| e.to_string())?;
        let blocks = differing((a, b), &theirs, &ours);
        out.differing += blocks.len() as u64;
        for run in sound_runs(&blocks, &[]).0 {
            if copy_run(keeper, dst, &run, revision).await? {
                out.copied += (run.end - run.start) * BLOCK;
                continue;
            }
            // A run the keeper cannot read whole is copied block by block.
            // A block it cannot read at all (bad there) stays as `dst`
            // holds it: a read of it from the keeper fails, and the
            // engine's repair gives the keeper `dst`'s copy.
            if run.end - run.start == 1 {
                out.unreadable += 1;
                continue;
            }
            for b in run {
                if copy_run(keeper, dst, &(b..b + 1), revision).await? {
                    out.copied += BLOCK;
                } else {
                    out.unreadable += 1;
                }
            }
        }
    }
    if out.copied > 0 {
        dst.flush().await.map_err(|e| e.to_string())?;
    }
    Ok(out)
}

/// Copies blocks `run` from `keeper` to `dst` (written at `revision`):
/// false when the keeper cannot read them, an error when `dst` fails the
/// write.
async fn copy_run(
    keeper: &ReplicaClient,
    dst: &ReplicaClient,
    run: &Range<u64>,
    revision: u64,
) -> Result<bool, String> {
    let (offset, len) = (run.start * BLOCK, ((run.end - run.start) * BLOCK) as u32);
    let Ok(data) = keeper.read(offset, len).await else {
        return Ok(false);
    };
    dst.write(offset, &data, revision, false)
        .await
        .map(|()| true)
        .map_err(|e| e.to_string())
}

/// Takes `m` out of the volume's rw set: it may differ from the keeper
/// where nothing can tell, so it is rebuilt.
fn fail(m: &mut Member, keeper: &str, why: &str) {
    tracing::warn!(replica = %m.at.name, keeper, error = why, "cannot be compared with the keeper where it was written lately; the replica is rebuilt");
    m.mode = ReplicaMode::Err;
    m.error = Some(format!(
        "cannot be made equal to {keeper} where it was written lately: {why}"
    ));
    m.link = None;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_of_every_replica_merge_into_one_sorted_union() {
        let runs = vec![(10, 20), (0, 5), (15, 30), (30, 31), (40, 40), (50, 60)];
        assert_eq!(union(runs), vec![(0, 5), (10, 31), (50, 60)]);
    }

    #[test]
    fn a_run_longer_than_a_request_is_cut_into_requests() {
        let runs = [(0, CHUNK * 2 + 3), (CHUNK * 5, CHUNK * 5 + 1)];
        assert_eq!(
            chunks(&runs),
            vec![
                (0, CHUNK),
                (CHUNK, 2 * CHUNK),
                (2 * CHUNK, 2 * CHUNK + 3),
                (CHUNK * 5, CHUNK * 5 + 1)
            ]
        );
        assert_eq!(CHUNK * BLOCK, u64::from(MAX_DATA));
    }

    #[test]
    fn only_the_blocks_whose_sums_differ_are_taken() {
        assert_eq!(
            differing((100, 105), &[1, 2, 3, 4, 5], &[1, 9, 3, 0, 5]),
            vec![101, 103]
        );
    }
}
