//! Blocks that no rw replica holds sound, taken from a replica that joins
//! the volume again. A rebuild begins with a snapshot, and freezing a head
//! checks each of its blocks: a bad block in the last rw replica would
//! fail every rebuild for ever, though the replica joining may still hold
//! that block as it was last written. Its copy is taken only when the
//! write logs prove that it missed no write to that block since:
//!
//! - the last rw replica's log after the joining one's revision, with
//!   none missing up to the engine's own revision (a replica that joined
//!   by a rebuild starts with an empty log, which proves nothing);
//! - the joining replica's own intents after its revision (writes that
//!   may have half landed there), as `catch_up` reads them after an
//!   unclean stop;
//! - and its copy passes its own block checksums.
//!
//! This module reads the joining replica and nothing else; the repair
//! writes through the engine (`Engine::repair_now`), and the join that
//! follows makes the joining replica anew.

use bytes::Bytes;

use super::Engine;
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
    /// bad. I/O must be paused.
    pub(super) async fn spare_copy(
        &self,
        spare: &Spare<'_>,
        start: u64,
        n: u32,
        bad: &str,
    ) -> Result<Bytes, String> {
        if !spare.client.takes_sums() {
            return Err("it keeps no block checksums to check its copy by".into());
        }
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
        let ours = spare
            .client
            .writes_since(spare.revision)
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
        spare.client.read(start, n).await.map_err(|e| e.to_string())
    }
}
