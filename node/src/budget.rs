//! What one connection may hold in memory on its client's behalf: the
//! bytes of replies read and not yet written to it, and of requests
//! received and not yet applied. A connection takes a share before it
//! starts a request and gives it back when the memory is freed; when the
//! budget is spent it reads no more requests, so a client that never reads
//! its replies holds no more than the budget. Used by the NBD frontend and
//! the replica server; it touches no socket itself.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Bytes a connection may have pending, in KiB (64 MiB).
pub const CONNECTION_BUDGET_KIB: u32 = 64 << 10;

/// A share of a budget, given back when dropped.
pub type Share = OwnedSemaphorePermit;

/// One connection's budget.
#[derive(Clone)]
pub struct Budget(Arc<Semaphore>);

impl Default for Budget {
    fn default() -> Self {
        Budget(Arc::new(Semaphore::new(CONNECTION_BUDGET_KIB as usize)))
    }
}

/// The KiB `bytes` take (at least 1; a request larger than the whole
/// budget takes all of it).
fn kib_of(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(1024))
        .unwrap_or(u32::MAX)
        .clamp(1, CONNECTION_BUDGET_KIB)
}

impl Budget {
    /// A share for `bytes`, now if the budget has it.
    pub fn try_take(&self, bytes: u64) -> Option<Share> {
        self.0.clone().try_acquire_many_owned(kib_of(bytes)).ok()
    }

    /// A share for `bytes`, waiting until the budget has it. None only if
    /// the budget was closed (it never is).
    pub async fn take(&self, bytes: u64) -> Option<Share> {
        self.0.clone().acquire_many_owned(kib_of(bytes)).await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_counted_in_kib_and_come_back_when_dropped() {
        let b = Budget::default();
        let all = b.try_take(u64::MAX).unwrap();
        assert!(b.try_take(1).is_none(), "spent");
        drop(all);
        let one = b.try_take(0).unwrap();
        assert_eq!(one.num_permits(), 1);
        let big = b.try_take(32 << 20).unwrap();
        assert_eq!(big.num_permits(), 32 << 10);
    }
}
