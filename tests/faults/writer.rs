//! The writer of the fault suite: writes 64 KiB at a time through the
//! volume's NBD endpoint with `qemu-io`, each write to a slot no write used
//! before and with a pattern of its own, and records every write that
//! qemu-io reports done — the acknowledged ones. A failed batch (the engine
//! gone, the volume refusing) burns its slots; nothing is ever written
//! twice, so what an acknowledged slot must hold is known exactly.

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Bytes per write and per slot.
pub const SLOT: u64 = 64 << 10;

/// An acknowledged write.
#[derive(Clone, Copy, Debug)]
pub struct Ack {
    pub offset: u64,
    pub pattern: u8,
    /// A flush that covers it was acknowledged too.
    pub flushed: bool,
}

fn pattern_of(slot: u64) -> u8 {
    (slot % 251) as u8 + 1
}

/// Runs batches of writes against `endpoint` until stopped.
pub struct Writer {
    pub acks: Arc<Mutex<Vec<Ack>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Batches that hung for `BATCH_LIMIT` and were killed.
    hung: Arc<std::sync::atomic::AtomicUsize>,
}

impl Writer {
    /// Starts writing to slots from `first_slot` on, `slots` at most, in
    /// batches of `batch` writes and a flush.
    pub fn start(endpoint: &str, first_slot: u64, slots: u64, batch: u64) -> Writer {
        let acks: Arc<Mutex<Vec<Ack>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let hung: Arc<std::sync::atomic::AtomicUsize> = Arc::default();
        let (a, s, h, endpoint) = (
            acks.clone(),
            stop.clone(),
            hung.clone(),
            endpoint.to_string(),
        );
        let thread = std::thread::spawn(move || {
            let mut slot = first_slot;
            while !s.load(Ordering::SeqCst) && slot + batch <= first_slot + slots {
                let (done, killed) = write_run(&endpoint, slot, batch, true);
                if killed {
                    h.fetch_add(1, Ordering::SeqCst);
                }
                a.lock().unwrap().extend(done);
                slot += batch;
                // A batch that failed at once (no engine yet) waits a little.
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Writer {
            acks,
            stop,
            thread: Some(thread),
            hung,
        }
    }

    /// Stops after the batch in flight; returns every acknowledged write,
    /// and how many batches hung and were killed.
    pub fn finish(mut self) -> (Vec<Ack>, usize) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let acks = self.acks.lock().unwrap().clone();
        (acks, self.hung.load(Ordering::SeqCst))
    }
}

/// How long one qemu-io run may take before it is killed: a write that
/// never completes is not acknowledged (the schedule's final check says
/// whether the volume serves again); a read-back that hangs is a failure.
const BATCH_LIMIT: &str = "60";

/// One qemu-io run of `count` writes from `slot` and no flush: the writes
/// it reported done, none flushed.
pub fn write_unflushed(endpoint: &str, slot: u64, count: u64) -> Vec<Ack> {
    write_run(endpoint, slot, count, false).0
}

/// One qemu-io run: `batch` writes from `slot`, then a flush when `flush`.
/// Returns the writes it reported done (flushed when the flush was
/// reported too), and whether it hung and was killed.
fn write_run(endpoint: &str, slot: u64, batch: u64, flush: bool) -> (Vec<Ack>, bool) {
    let mut c = Command::new("timeout");
    c.args(["-s", "KILL", BATCH_LIMIT, "qemu-io", "-f", "raw"]);
    if !flush {
        // qemu flushes a device it closes, unless its cache mode ignores
        // flushes.
        c.args(["-t", "unsafe"]);
    }
    for s in slot..slot + batch {
        c.args([
            "-c",
            &format!("write -P {} {} {SLOT}", pattern_of(s), s * SLOT),
        ]);
    }
    if flush {
        c.args(["-c", "flush", "-c", "write -P 255 0 0"]);
    }
    let Ok(out) = c.arg(endpoint).output() else {
        return (Vec::new(), false);
    };
    let killed = out.status.code() == Some(137) || out.status.code().is_none();
    if killed {
        eprintln!("a batch of writes from slot {slot} hung for {BATCH_LIMIT} s and was killed");
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut acks: Vec<Ack> = text
        .lines()
        .filter_map(|l| {
            // "wrote 65536/65536 bytes at offset 1048576"
            let rest = l.strip_prefix(&format!("wrote {SLOT}/{SLOT} bytes at offset "))?;
            let offset: u64 = rest.trim().parse().ok()?;
            (offset >= slot * SLOT && offset < (slot + batch) * SLOT).then_some(Ack {
                offset,
                pattern: pattern_of(offset / SLOT),
                flushed: false,
            })
        })
        .collect();
    // qemu-io goes on after a failed command: the flush counts when it did
    // not fail and the command after it was reached.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let flush_failed = text.contains("flush failed") || stderr.contains("flush failed");
    if !flush_failed && text.contains("wrote 0/0 bytes at offset 0") {
        for a in &mut acks {
            a.flushed = true;
        }
    }
    (acks, killed)
}

/// What a read-back found wrong.
#[derive(Debug, Default)]
pub struct Unread {
    /// Read, but not the bytes written: stale or corrupt data was served.
    pub wrong: Vec<u64>,
    /// The read failed (an I/O error, never data).
    pub failed: Vec<u64>,
}

/// Reads every acknowledged write back through `endpoint`, and sorts the
/// ones that do not hold their pattern by how they went wrong.
pub fn unreadable(endpoint: &str, acks: &[Ack]) -> Result<Unread, String> {
    let mut bad = Unread::default();
    for chunk in acks.chunks(64) {
        let mut c = Command::new("timeout");
        c.args(["-s", "KILL", BATCH_LIMIT, "qemu-io", "-f", "raw"]);
        for a in chunk {
            c.args(["-c", &format!("read -P {} {} {SLOT}", a.pattern, a.offset)]);
        }
        let out = c
            .arg(endpoint)
            .output()
            .map_err(|e| format!("qemu-io: {e}"))?;
        if out.status.code() == Some(137) || out.status.code().is_none() {
            return Err(format!(
                "reading the acknowledged writes back hung for {BATCH_LIMIT} s"
            ));
        }
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        if !out.status.success() && !text.contains("read ") {
            return Err(format!("qemu-io could not read: {text}"));
        }
        // Each read prints "read N/N bytes at offset X" when done, after a
        // "Pattern verification failed at offset X" line when it differs.
        let lines: Vec<&str> = text.lines().collect();
        for a in chunk {
            let done = format!("read {SLOT}/{SLOT} bytes at offset {}", a.offset);
            let differs = format!("Pattern verification failed at offset {}, ", a.offset);
            if lines.iter().any(|l| l.contains(&differs)) {
                bad.wrong.push(a.offset);
            } else if !lines.iter().any(|l| l.trim() == done) {
                bad.failed.push(a.offset);
            }
        }
    }
    Ok(bad)
}

/// For writes acknowledged but not flushed when every machine lost power:
/// the offsets of those whose 4 KiB blocks do not each hold either the
/// write's pattern or zeros (the slot's bytes before it: each slot is
/// written once), or fail to read. A power cut may keep any part of an
/// unflushed write, but never other bytes, and never an error.
/// Also says how many blocks held the new bytes and how many zeros.
pub fn torn_otherwise(endpoint: &str, acks: &[Ack]) -> Result<(Vec<u64>, usize, usize), String> {
    const B: u64 = 4096;
    // Which blocks read back as `pattern(ack)`, in one qemu-io run.
    let matching = |pattern: &dyn Fn(&Ack) -> u8| -> Result<Vec<bool>, String> {
        let mut c = Command::new("timeout");
        c.args(["-s", "KILL", BATCH_LIMIT, "qemu-io", "-f", "raw"]);
        for a in acks {
            for b in 0..SLOT / B {
                c.args([
                    "-c",
                    &format!("read -P {} {} {B}", pattern(a), a.offset + b * B),
                ]);
            }
        }
        let out = c
            .arg(endpoint)
            .output()
            .map_err(|e| format!("qemu-io: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = text.lines().collect();
        let mut ok = Vec::new();
        for a in acks {
            for b in 0..SLOT / B {
                let at = a.offset + b * B;
                let done = format!("read {B}/{B} bytes at offset {at}");
                let differs = format!("Pattern verification failed at offset {at}, ");
                ok.push(
                    lines.iter().any(|l| l.trim() == done)
                        && !lines.iter().any(|l| l.contains(&differs)),
                );
            }
        }
        Ok(ok)
    };
    let new = matching(&|a: &Ack| a.pattern)?;
    let old = matching(&|_: &Ack| 0)?;
    let per = (SLOT / B) as usize;
    let torn = acks
        .iter()
        .enumerate()
        .filter(|(i, _)| (i * per..(i + 1) * per).any(|k| !new[k] && !old[k]))
        .map(|(_, a)| a.offset)
        .collect();
    let kept = new.iter().filter(|n| **n).count();
    let zeros = old.iter().zip(&new).filter(|(o, n)| **o && !**n).count();
    Ok((torn, kept, zeros))
}
