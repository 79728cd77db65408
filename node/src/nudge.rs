//! A runtime's nudge: a thread that keeps a tokio runtime's parked
//! workers turning while another worker is blocked in a system call (a
//! write held on a disk that hangs). Both processes that write to disks
//! from their async workers start one: the node plugin (its replica
//! server's inline writes) and an engine (its lent replica's).
//!
//! It owns one thread and touches nothing but the runtime's scheduler.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// A thread that schedules an empty task on the runtime every
/// `Nudger::EVERY`, so that a parked worker wakes and turns the I/O driver
/// even while another is blocked (a write held on a disk that hangs, say).
/// A worker parked on its condition variable, while another turned the
/// driver, is woken only when a task is scheduled; with the blocked one no
/// longer turning the driver, no socket or timer schedules any, and the
/// whole runtime stops (seen: one write held on a frozen disk stopped the
/// node's heartbeats). Stops when dropped.
pub struct Nudger {
    stop: Arc<AtomicBool>,
}

impl Nudger {
    const EVERY: std::time::Duration = std::time::Duration::from_millis(250);

    pub fn start(runtime: tokio::runtime::Handle) -> Nudger {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let spawned = std::thread::Builder::new()
            .name("runtime-nudge".into())
            .spawn(move || {
                while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::sleep(Nudger::EVERY);
                    drop(runtime.spawn(async {}));
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "no thread to nudge the runtime: a worker held on a hung disk may stop it");
        }
        Nudger { stop }
    }
}

impl Drop for Nudger {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}
