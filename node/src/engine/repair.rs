//! Repair: blocks that failed their checksum in a replica, found by a read
//! (served from another replica) or by a snapshot's freeze, are read again
//! from the other rw replicas, or from a replica joining again when the
//! last one holds them bad (`spare`), written to every replica as a write
//! of what the volume holds, and read back from the replica that failed.
//! A replica whose blocks come back bad again is dropped.
//!
//! It reads and writes through the engine's own paths, with I/O paused;
//! it decides nothing about which replicas a volume has.

use super::{BLOCK, ClientError, Engine, EngineError, IoCounters, spare};

impl Engine {
    /// Repairs the blocks of `offset..+len` in the replicas `bad`, which
    /// each failed a checksum there (replica and error): with I/O paused,
    /// the blocks are read from the other rw replicas and written back to
    /// every replica, as a write of what the volume already holds. A bad
    /// replica that does not take the write is dropped, as for any write;
    /// one whose blocks no other replica serves now keeps serving the rest.
    #[tracing::instrument(skip_all, fields(volume = %self.volume, offset, len))]
    pub(super) async fn repair(&self, offset: u64, len: u64, bad: Vec<(String, ClientError)>) {
        let _pause = self.io.write().await;
        self.repair_now(offset, len, &bad, None).await;
    }

    /// `repair`, with I/O already paused. When no other rw replica serves
    /// the blocks, a replica about to join (`spare`) may (see `spare`).
    /// Returns whether every block was written back.
    pub(super) async fn repair_now(
        &self,
        offset: u64,
        len: u64,
        bad: &[(String, ClientError)],
        spare: Option<&spare::Spare<'_>>,
    ) -> bool {
        let start = offset / BLOCK * BLOCK;
        let end = offset
            .saturating_add(len)
            .div_ceil(BLOCK)
            .saturating_mul(BLOCK)
            .min(self.size());
        // A read's range, in whole blocks: within what a read may ask for.
        let Ok(n) = u32::try_from(end.saturating_sub(start)) else {
            return false;
        };
        let names: Vec<&str> = bad.iter().map(|(n, _)| n.as_str()).collect();
        let mut read = self.read_excluding(start, n, &names).await;
        if let (Err(EngineError::NoReplica(_)), Some(spare), [(last, e)]) = (&read, spare, bad) {
            let recorded = e.corruption().and_then(|c| c.at.zip(c.recorded));
            read = match self.spare_copy(spare, start, n, last, recorded).await {
                Ok(data) => {
                    tracing::warn!(volume = %self.volume, replica = %last, spare = spare.name, start, end,
                        "blocks that failed their checksum in the last rw replica taken from the replica joining, whose copy the write logs, or the checksum the last one recorded, show is the blocks as last written");
                    Ok(data)
                }
                Err(why) => Err(EngineError::NoReplica(format!(
                    "no other rw replica, and the joining {} cannot give them: {why}",
                    spare.name
                ))),
            };
        }
        let done = match read {
            Ok(data) => self.write_now(start, data, false).await,
            Err(e) => Err(e),
        };
        if let Err(why) = done {
            for (name, e) in bad {
                tracing::warn!(volume = %self.volume, replica = %name, error = %e, why = %why,
                    "blocks that failed their checksum were not repaired");
            }
            return false;
        }
        // Read back: a replica whose blocks go bad again on the way or on
        // its disk is dropped, to be rebuilt, not repaired for ever.
        let mut all = true;
        for (name, e) in bad {
            let link: Vec<_> = self
                .rw_links()
                .await
                .into_iter()
                .filter(|(n, _)| n == name)
                .collect();
            let sound = !link.is_empty() && self.read_from(link, start, n, None).await.is_ok();
            if sound {
                IoCounters::count(&self.counters.repairs, 1);
                tracing::warn!(volume = %self.volume, replica = %name, start, end, error = %e,
                    "blocks that failed their checksum repaired from another replica");
            } else {
                tracing::warn!(volume = %self.volume, replica = %name, start, end, error = %e,
                    "blocks that failed their checksum are bad again once repaired");
                self.fail(name, e).await;
                all = false;
            }
        }
        all
    }
}
