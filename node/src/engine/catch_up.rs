//! Catching up after an unclean stop. An engine that died mid-write leaves
//! its current replicas at different revisions, or at one revision with
//! different writes half done: none of those writes was acknowledged, but
//! the replicas must be made equal before they serve. Every replica logs
//! each write's intent (offset, length, op) before its data (see
//! `replica::revision`), so the ranges that may differ are known: the
//! replica with the highest revision gives its content for exactly those
//! ranges, and the other one takes them. Only when a write log does not
//! reach back far enough is the replica rebuilt in full instead.

use std::collections::BTreeMap;

use ballast::model::ReplicaMode;

use super::{Link, Member, RebuildStatus};
use crate::replica::{LogEntry, LogOp};
use crate::wire::client::ReplicaClient;
use crate::wire::protocol::MAX_DATA;

/// Makes `dst` (at revision `dst_rev`) hold what `src` (at `src_rev`, the
/// highest) holds, by copying the ranges either logged after `dst_rev`.
/// Returns the bytes copied; an error says why it could not.
pub(super) async fn catch_up(
    src: &ReplicaClient,
    dst: &ReplicaClient,
    dst_rev: u64,
    src_rev: u64,
) -> Result<u64, String> {
    let theirs = src
        .writes_since(dst_rev)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| {
            format!("the write log of the replica at {src_rev} does not reach back to {dst_rev}")
        })?;
    if src_rev > dst_rev && theirs.last().map(|e| e.revision) < Some(src_rev) {
        return Err(format!(
            "the write log of the replica at {src_rev} ends before it"
        ));
    }
    // Its own intents past its revision: writes that may have landed there.
    let ours = dst
        .writes_since(dst_rev)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("its write log after {dst_rev} has a gap"))?;
    // One write per revision: the same write in both logs, when in both.
    let mut writes: BTreeMap<u64, LogEntry> = ours.into_iter().map(|e| (e.revision, e)).collect();
    writes.extend(theirs.into_iter().map(|e| (e.revision, e)));
    let mut copied = 0;
    for e in writes.values() {
        // Past the source's revision: an intent of a write that never
        // ended; its range takes the source's content all the same.
        let revision = e.revision.min(src_rev);
        match e.op {
            LogOp::Trim => {
                let len =
                    u32::try_from(e.len).map_err(|_| "a trim too long to copy".to_string())?;
                dst.trim(e.offset, len, revision)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            LogOp::Write => {
                let mut pos = 0u64;
                while pos < e.len {
                    let n = (e.len - pos).min(u64::from(MAX_DATA)) as u32;
                    let data = src
                        .read(e.offset + pos, n)
                        .await
                        .map_err(|e| e.to_string())?;
                    dst.write(e.offset + pos, &data, revision, false)
                        .await
                        .map_err(|e| e.to_string())?;
                    pos += u64::from(n);
                }
                copied += e.len;
            }
        }
    }
    dst.flush().await.map_err(|e| e.to_string())?;
    Ok(copied)
}

/// After an unclean stop the replicas may differ in the writes that were
/// in flight: the others take those ranges from one at the highest
/// revision (`best`), where their write logs say which. Returns those
/// whose logs cannot say (a power cut leaves them unable to), with why:
/// the regions they wrote lately are compared next (`equalize`), and one
/// that cannot be compared there either is failed, to be rebuilt
/// (`fail_behind`).
pub(super) async fn catch_up_members(
    volume: &str,
    members: &mut [Member],
    revisions: &[u64],
    best: u64,
) -> Vec<(usize, String)> {
    let mut behind = Vec::new();
    let source = members
        .iter()
        .zip(revisions)
        .position(|(m, r)| m.mode == ReplicaMode::Rw && *r == best);
    let src = source.and_then(|i| match &members[i].link {
        Some(Link::Remote(c)) => Some((members[i].at.name.clone(), c.clone())),
        _ => None,
    });
    let Some((src_name, src)) = src else {
        return behind;
    };
    for (i, (m, r)) in members.iter_mut().zip(revisions).enumerate() {
        let Some(Link::Remote(dst)) = &m.link else {
            continue;
        };
        if Some(i) == source || m.mode != ReplicaMode::Rw {
            continue;
        }
        match catch_up(&src, dst, *r, best).await {
            Ok(copied) => {
                if copied > 0 || *r < best {
                    tracing::info!(volume, replica = %m.at.name, source = %src_name, from = r, to = best, copied, "caught up after an unclean stop");
                    m.rebuild = Some(RebuildStatus {
                        source: src_name.clone(),
                        kept_bytes: 0,
                        copied_bytes: copied,
                        path: "catch-up".into(),
                        done: true,
                    });
                }
            }
            Err(why) => {
                tracing::info!(volume, replica = %m.at.name, error = %why, "cannot catch up from the write logs; the regions written lately are compared");
                behind.push((
                    i,
                    format!("revision {r} may differ from {best} and it cannot catch up: {why}"),
                ));
            }
        }
    }
    behind
}

/// Fails each member of `behind` (with why its log could not catch it up)
/// that the comparison of the regions written lately did not make equal
/// either (not in `equal`): it is rebuilt.
pub(super) fn fail_behind(
    volume: &str,
    members: &mut [Member],
    behind: Vec<(usize, String)>,
    equal: &[usize],
) {
    for (i, why) in behind {
        let m = &mut members[i];
        if equal.contains(&i) || m.mode != ReplicaMode::Rw {
            continue;
        }
        tracing::warn!(volume, replica = %m.at.name, error = %why, "cannot be made equal; the replica is rebuilt");
        m.mode = ReplicaMode::Err;
        m.error = Some(why);
        m.link = None;
    }
}
