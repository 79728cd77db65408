//! Blocks that no rw replica holds sound, taken from a replica that joins
//! the volume again. A rebuild begins with a snapshot, and freezing a head
//! checks each of its blocks: a bad block in the last rw replica would
//! fail every rebuild for ever, though the replica joining may still hold
//! that block as it was last written. Its copy is taken only when it
//! passes its own block checksums, and either the write logs prove that
//! it missed no write to that block since:
//!
//! - the last rw replica's log after the joining one's revision, with
//!   none missing up to the engine's own revision (a replica that joined
//!   by a rebuild starts with an empty log, which proves nothing);
//! - the joining replica's own intents after its revision (writes that
//!   may have half landed there), as `catch_up` reads them after an
//!   unclean stop;
//!
//! or, for one block, its copy has the checksum the last rw replica
//! recorded for it (sent with the CORRUPT reply): that is the block as
//! last written there, the same trust a rebuild's reuse puts in equal
//! checksums. The logs prove nothing after a power cut (a new boot
//! forgets them), while a block in a region left alone before the cut
//! (`replica/regions.rs`) keeps its recorded checksum.
//!
//! This module reads the joining replica and nothing else; the repair
//! writes through the engine (`Engine::repair_now`), and the join that
//! follows makes the joining replica anew.

use bytes::Bytes;

use super::{BLOCK, Engine};
use crate::wire::client::ReplicaClient;

/// A replica about to join the volume, not yet a member.
pub(super) struct Spare<'a> {
    pub name: &'a str,
    pub client: &'a ReplicaClient,
    /// Its revision, as it said before the join.
    pub revision: u64,
}

impl Engine {
    /// The blocks `start..start + n` as `spare` holds them, or why its copy
    /// cannot be trusted; `bad` is the last rw replica, which holds them
    /// bad, and `recorded` the block (its offset) its error named, with the
    /// checksum it recorded for it. I/O must be paused.
    pub(super) async fn spare_copy(
        &self,
        spare: &Spare<'_>,
        start: u64,
        n: u32,
        bad: &str,
        recorded: Option<(u64, u32)>,
    ) -> Result<Bytes, String> {
        if !spare.client.takes_sums() {
            return Err("it keeps no block checksums to check its copy by".into());
        }
        let why = match self.logs_prove(spare, start, n, bad).await {
            Ok(()) => {
                return self
                    .joining_answer((spare.name, spare.client), spare.client.read(start, n))
                    .await
                    .map_err(|e| e.to_string());
            }
            Err(why) => why,
        };
        match recorded {
            Some((at, sum)) if at == start && u64::from(n) == BLOCK => {
                let data = self
                    .joining_answer((spare.name, spare.client), spare.client.read(start, n))
                    .await
                    .map_err(|e| format!("{why}; and its copy: {e}"))?;
                if crate::replica::block_sum(&data) == sum {
                    Ok(data)
                } else {
                    Err(format!(
                        "{why}; and its copy is not the block {bad} recorded"
                    ))
                }
            }
            _ => Err(why),
        }
    }

    /// Whether the write logs prove that `spare` missed no write to blocks
    /// `start..start + n` since its revision; why not.
    async fn logs_prove(
        &self,
        spare: &Spare<'_>,
        start: u64,
        n: u32,
        bad: &str,
    ) -> Result<(), String> {
        let now = self.revision.load(std::sync::atomic::Ordering::SeqCst);
        if spare.revision > now {
            return Err(format!(
                "its revision {} is past the volume's {now}",
                spare.revision
            ));
        }
        let link = self
            .rw_links()
            .await
            .into_iter()
            .find(|(name, _)| name == bad)
            .map(|(_, link)| link)
            .ok_or_else(|| format!("{bad} is no longer rw"))?;
        let theirs = link
            .writes_since(spare.revision)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| {
                format!(
                    "the write log of {bad} does not reach back to revision {}",
                    spare.revision
                )
            })?;
        if spare.revision < now && theirs.last().map(|e| e.revision) != Some(now) {
            return Err(format!(
                "the write log of {bad} does not reach its revision {now}"
            ));
        }
        let ours = self
            .joining_answer(
                (spare.name, spare.client),
                spare.client.writes_since(spare.revision),
            )
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("its write log after revision {} has a gap", spare.revision))?;
        let end = start + u64::from(n);
        if let Some(w) = theirs
            .iter()
            .chain(&ours)
            .find(|w| w.offset < end && start < w.offset.saturating_add(w.len))
        {
            return Err(format!(
                "the write of revision {} touched the blocks after its revision {}",
                w.revision, spare.revision
            ));
        }
        Ok(())
    }
}
