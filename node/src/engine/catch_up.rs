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
