//! The read path: a read is served by one replica, the local one first;
//! a replica that fails it is dropped and the next one asked, and blocks
//! that fail their checksums are noted for `repair`. One bad block in the
//! last replica that holds it fails that read alone, never the volume.

use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::{Engine, EngineError, IoCounters, Link};
use crate::replica::BLOCK;
use crate::wire::client::ClientError;
use crate::wire::protocol::MAX_DATA;

impl Engine {
    /// Reads `len` bytes at `offset` from one replica (see the module's
    /// head), and has the blocks that failed their checksums on the way
    /// written back to the replicas that held them bad.
    pub async fn read(&self, offset: u64, len: u32) -> Result<Bytes, EngineError> {
        self.check(offset, u64::from(len))?;
        // A fenced engine is stale: another one may be writing elsewhere.
        if let Some(why) = self.freshness.fenced() {
            return Err(EngineError::NotRecorded(format!("engine fenced: {why}")));
        }
        let io = self.io.read().await;
        let start = std::time::Instant::now();
        let mut bad = Vec::new();
        let read = self.read_noting(offset, len, Some(&mut bad)).await;
        drop(io);
        IoCounters::count(&self.counters.checksum_failures, bad.len() as u64);
        if let Err(EngineError::Corrupt { .. }) = &read {
            // The last replica that could serve it held it bad too.
            IoCounters::count(&self.counters.checksum_failures, 1);
            IoCounters::count(&self.counters.unreadable_reads, 1);
        }
        if !bad.is_empty() {
            // The replicas that failed a checksum get the range back from
            // the others (see `repair`).
            self.repair(offset, u64::from(len), bad).await;
        }
        if read.is_ok() {
            self.counters.read(u64::from(len), start.elapsed());
        }
        read
    }

    /// A read from `name` failed with `e`. The replica is dropped, unless
    /// the block is corrupt there and no replica after it can serve it:
    /// then one bad block fails this read only, and the last replica that
    /// holds the rest of the volume keeps serving it.
    pub(super) async fn read_failed(
        &self,
        name: &str,
        e: &ClientError,
        others: bool,
    ) -> Option<EngineError> {
        if e.is_corrupt() && !others {
            tracing::error!(volume = %self.volume, replica = name, error = %e,
                "a block is corrupt in the last replica that holds it; the read fails");
            return Some(EngineError::Corrupt {
                replica: name.to_string(),
                message: e.to_string(),
            });
        }
        self.fail(name, e).await;
        None
    }

    /// Reads with I/O already held (shared or exclusive).
    pub(super) async fn read_now(&self, offset: u64, len: u32) -> Result<Bytes, EngineError> {
        self.read_noting(offset, len, None).await
    }

    /// Reads from the rw replicas but `skip`, with I/O held: a repair's
    /// read. One whose blocks fail their checksums there too is passed
    /// over, not dropped: a block bad in several replicas must not cost
    /// the volume all but one of them.
    pub(super) async fn read_excluding(
        &self,
        offset: u64,
        len: u32,
        skip: &[&str],
    ) -> Result<Bytes, EngineError> {
        let links: Vec<_> = self
            .rw_links()
            .await
            .into_iter()
            .filter(|(n, _)| !skip.contains(&n.as_str()))
            .collect();
        let mut also_bad = Vec::new();
        self.read_from(links, offset, len, Some(&mut also_bad))
            .await
    }

    /// Whether an rw replica besides `name` holds block `block` sound.
    /// Each is asked alone, so that a bad block there drops none.
    pub(super) async fn sound_elsewhere(&self, name: &str, block: u64) -> bool {
        for link in self.rw_links().await.into_iter().filter(|(n, _)| n != name) {
            if self
                .read_from(vec![link], block * BLOCK, BLOCK as u32, None)
                .await
                .is_ok()
            {
                return true;
            }
        }
        false
    }

    /// Reads with I/O held. With `bad`, a replica whose blocks fail their
    /// checksum while another replica may serve them is noted there rather
    /// than dropped: the caller repairs it once I/O is let go.
    pub(super) async fn read_noting(
        &self,
        offset: u64,
        len: u32,
        bad: Option<&mut Vec<(String, ClientError)>>,
    ) -> Result<Bytes, EngineError> {
        let links = self.rw_links().await;
        self.read_from(links, offset, len, bad).await
    }

    pub(super) async fn read_from(
        &self,
        links: Vec<(String, Link)>,
        offset: u64,
        len: u32,
        mut bad: Option<&mut Vec<(String, ClientError)>>,
    ) -> Result<Bytes, EngineError> {
        let mut last = String::from("no rw replica");
        let count = links.len();
        for (i, (name, link)) in links.into_iter().enumerate() {
            let others = i + 1 < count;
            // Noted for repair rather than dropped: a bad block while
            // another replica may hold it sound. A lost one is passed over
            // (the others lost it too): nothing to repair it from, and no
            // replica to drop for it.
            let mut note = |e: &ClientError| match bad.as_deref_mut() {
                Some(bad) if others && e.is_corrupt() => {
                    bad.push((name.clone(), e.clone()));
                    true
                }
                _ => false,
            };
            let e = match self.read_link(link, offset, len).await {
                Ok(out) => return Ok(out),
                Err(e) => e,
            };
            last = e.to_string();
            if (e.is_lost() && others) || note(&e) {
                continue;
            }
            if let Some(e) = self.read_failed(&name, &e, others).await {
                return Err(e);
            }
        }
        Err(EngineError::NoReplica(last))
    }

    /// One replica's read of `len` bytes at `offset`. The lent replica is
    /// read inline, without a thread hop: a read of the local disk, mostly
    /// from the page cache, is short. A remote one's read of one chunk (the
    /// usual case) is returned as it came off the socket; larger reads are
    /// put together.
    pub(super) async fn read_link(
        &self,
        link: Link,
        offset: u64,
        len: u32,
    ) -> Result<Bytes, ClientError> {
        let c = match link {
            Link::Lent(l) => {
                let b = l.read(offset, len)?;
                self.direct_reads.fetch_add(1, Ordering::Relaxed);
                return Ok(Bytes::from(b));
            }
            Link::Remote(c) => c,
        };
        if len <= MAX_DATA {
            return c.read(offset, len).await;
        }
        let mut out = bytes::BytesMut::with_capacity(len as usize);
        let mut pos = 0u32;
        while pos < len {
            let n = (len - pos).min(MAX_DATA);
            out.extend_from_slice(&c.read(offset + u64::from(pos), n).await?);
            pos += n;
        }
        Ok(out.freeze())
    }
}
