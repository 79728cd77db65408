//! Fault schedules and their runner. A schedule is a list of faults applied
//! to a real cluster (controller and three node processes, each on its own
//! 256 MiB ext4 disk) while the writer writes to a volume attached at
//! node-1. At each `Check`, and once at the end with every node and the
//! controller back and every disk freed, one of two things must hold:
//! every acknowledged write reads back, or the attach is refused with the
//! reason (which replica, on which node, holds the latest data). Never
//! stale data, never a lost acknowledged write.

use std::time::Duration;

use serde_json::json;

use crate::harness::*;
use crate::writer::{Ack, SLOT, Writer, torn_otherwise, unreadable, write_unflushed};

/// Writes to the volume between faults: batches of this many.
const BATCH: u64 = 8;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL the volume's engine (on node-1).
    KillEngine,
    /// SIGKILL node process `i` (0 is node-1).
    KillNode(usize),
    RestartNode(usize),
    /// Freeze node `i`'s process (SIGSTOP; 1 or 2: no engine runs there):
    /// its connections stay open and nothing answers, as a hung process or
    /// a network that drops packets leaves them. `ThawNode` (SIGCONT)
    /// lets it go on.
    FreezeNode(usize),
    ThawNode(usize),
    KillController,
    RestartController,
    /// Cut node `i`'s power (1 or 2: no engine runs there): its process
    /// killed, and its disk's unflushed writes gone with the page cache
    /// (the nodes' disks forget, `forgetful.rs`); the disk is mounted
    /// again as the next boot would, the node left down until
    /// `RestartNode`.
    PowerCut(usize),
    /// Cut every machine's power at once: the engine and every node
    /// killed, every disk's unflushed writes gone with the page cache; the
    /// disks mounted again and the nodes started (the controller, on a
    /// machine of its own, stays). Just before, the writer stops and 10
    /// MiB are written with no flush after them, and the replicas' heads
    /// written back and committed by their filesystems, not their
    /// checksums nor their write logs (as their early writeback and the
    /// next journal commit do on their own). Writes
    /// acknowledged but not flushed may then hold any part of their bytes,
    /// block by block, but never other bytes and never an error; flushed
    /// ones hold all.
    PowerCutAll,
    /// `PowerCutAll`, but node `i`'s machine does not come back: its node
    /// stays down until `RestartNode`. (Not drawn at random.)
    PowerCutAllBut(usize),
    /// A planned reboot of node `i` (1 or 2: no engine runs there): its
    /// node plugin told to stop (SIGTERM), which closes its replicas clean,
    /// its filesystem synced as a shutdown does, then the machine's new
    /// boot (its disk's cache and the page cache gone, as in `PowerCut`)
    /// and the node started again. Every acknowledged write is checked as
    /// written, flushed or not: a planned reboot loses none.
    Reboot(usize),
    /// Once node `i`'s replica is opened after its last `Reboot`, the
    /// node's log must say that the new boot trusted it (no head check,
    /// its write log kept), and never that it checked it as after a power
    /// cut. (Not drawn at random: a replica in a fill, on a full disk, or
    /// not opened since an earlier crash of its node is checked, rightly.)
    TrustedAfterReboot(usize),
    /// Wait until the volume has all its replicas rw again (one rebuilt
    /// or reused after its node came back).
    Settle,
    /// Fill node `i`'s disk to the last block; `FreeDisk` gives it back.
    FillDisk(usize),
    FreeDisk(usize),
    /// Flip an acknowledged block in node `i`'s replica's head.
    CorruptHead(usize),
    /// Ask for this many replicas (`PATCH /v1/volumes/v`): the planner
    /// removes one, or builds one while the writer writes.
    Replicas(usize),
    /// Delete node `i`'s replica (`DELETE /v1/replicas/{name}`); the
    /// planner builds another. A refusal (the last that holds the latest
    /// data) is an answer too.
    DeleteReplica(usize),
    /// Ask for node `i`'s replicas to move off it, or stop asking.
    Evict(usize, bool),
    /// Take a snapshot while the writer writes; `DeleteSnapshot` deletes
    /// the oldest one taken, which merges its layer.
    Snapshot,
    DeleteSnapshot,
    /// Let the writer go on for this many milliseconds.
    Pause(u64),
    /// Every acknowledged write reads back now, or the attach is refused
    /// with a reason.
    Check,
}

impl Fault {
    /// A request that moves or layers replicas rather than a fault.
    fn moves(&self) -> bool {
        matches!(
            self,
            Fault::Replicas(_)
                | Fault::DeleteReplica(_)
                | Fault::Evict(..)
                | Fault::Snapshot
                | Fault::DeleteSnapshot
        )
    }
}

#[derive(Clone, Debug)]
pub struct Schedule {
    pub name: String,
    /// 3: a replica on every node; 2: on node-2 and node-3 (node-1, where
    /// the volume is attached, holds none).
    pub replicas: usize,
    pub faults: Vec<Fault>,
}

/// What a schedule ended with.
#[derive(Debug, Default)]
pub struct Outcome {
    pub acknowledged: usize,
    pub flushed: usize,
    /// Checks refused with a reason (the reasons).
    pub refused: Vec<String>,
    /// Acknowledged writes whose block was flipped in every replica that
    /// held it (a double fault): their reads fail, with an error, never
    /// with other data.
    pub lost_to_corruption: usize,
}

struct Run {
    c: Cluster,
    replicas: usize,
    endpoint: String,
    acks: Vec<Ack>,
    writer: Option<Writer>,
    next_slot: u64,
    down: Vec<bool>,
    /// Nodes whose process is stopped (`FreezeNode`).
    frozen: [bool; 3],
    controller_down: bool,
    fillers: Vec<Option<std::path::PathBuf>>,
    /// The offsets of the acknowledged writes a CorruptHead flipped.
    flipped: std::collections::BTreeSet<u64>,
    /// Where each node's log stood at its last `Reboot`.
    rebooted_at: [usize; 3],
    /// A power cut came: from then on a write acknowledged without a
    /// flush after it may have lost any part of its bytes (a replica that
    /// held it alone lost its page cache).
    power_cut: bool,
    /// Snapshots taken and not deleted yet, oldest first; how many taken.
    snapshots: Vec<String>,
    snapshots_taken: usize,
    outcome: Outcome,
    /// Batches of writes that hung and were killed.
    hung: usize,
}

/// Slots of the 64 MiB volume the writer may use.
const SLOTS: u64 = SIZE / SLOT;

impl Run {
    fn start_writer(&mut self) {
        let slots = SLOTS.saturating_sub(self.next_slot);
        self.writer = Some(Writer::start(&self.endpoint, self.next_slot, slots, BATCH));
    }

    fn stop_writer(&mut self) {
        if let Some(w) = self.writer.take() {
            let (acks, hung) = w.finish();
            self.acks.extend(acks);
            self.hung += hung;
        }
        // Slots of failed batches are never used again.
        self.next_slot = self.next_slot.max(
            self.acks
                .iter()
                .map(|a| a.offset / SLOT + BATCH)
                .max()
                .unwrap_or(0),
        ) + BATCH;
    }

    fn engine_pid(&self) -> Option<i32> {
        engine_pid(&self.c.path("node-1").join("state"), "v")
    }

    fn reboot(&mut self, i: usize) -> Result<(), String> {
        let node = format!("node-{}", i + 1);
        let before = self.c.nodes[i].proc.log_text().len();
        let proc = &mut self.c.nodes[i].proc;
        proc.signal(nix::sys::signal::Signal::SIGTERM);
        if proc.wait_exit(Duration::from_secs(30)).is_none() {
            return Err(format!(
                "{node}: its node plugin did not stop in 30 s of SIGTERM"
            ));
        }
        self.down[i] = true;
        let at = self.c.forgetful[i].at.clone();
        let synced = std::process::Command::new("sync")
            .arg("-f")
            .arg(&at)
            .status()
            .map_err(|e| e.to_string())?;
        if !synced.success() {
            return Err(format!("sync -f {}: {synced}", at.display()));
        }
        let lost = self.c.forgetful[i].power_cut();
        // Nothing is lost: every acknowledged write is checked as it was
        // written, flushed or not.
        eprintln!("{node}: rebooted, {lost} blocks lost from its disk's cache");
        self.apply(&Fault::RestartNode(i))?;
        self.rebooted_at[i] = before;
        Ok(())
    }

    fn trusted_after_reboot(&mut self, i: usize) -> Result<(), String> {
        let node = format!("node-{}", i + 1);
        // Its replica is opened once the engine or the controller asks for
        // it again.
        let trusted = "opened in a new boot after a clean close";
        let checked = "opened in a new boot (a power cut";
        let end = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            let log = self.c.nodes[i].proc.log_text();
            let since = log.get(self.rebooted_at[i]..).unwrap_or_default();
            if since.contains(checked) {
                return Err(format!(
                    "{node}: a replica closed at the node plugin's stop was checked as after a power cut"
                ));
            }
            if since.contains(trusted) {
                return Ok(());
            }
            if std::time::Instant::now() > end {
                return Err(format!(
                    "{node}: no replica opened after its planned reboot in 120 s"
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn apply(&mut self, f: &Fault) -> Result<(), String> {
        match f {
            Fault::KillEngine => {
                if let Some(pid) = self.engine_pid() {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
            Fault::KillNode(i) => {
                self.c.kill_node(*i);
                self.down[*i] = true;
                self.frozen[*i] = false;
            }
            Fault::FreezeNode(i) => {
                self.c.nodes[*i]
                    .proc
                    .signal(nix::sys::signal::Signal::SIGSTOP);
                self.frozen[*i] = true;
            }
            Fault::ThawNode(i) => {
                self.c.nodes[*i]
                    .proc
                    .signal(nix::sys::signal::Signal::SIGCONT);
                self.frozen[*i] = false;
            }
            Fault::RestartNode(i) => {
                // With the controller down the node cannot register yet:
                // it does once the controller is back.
                if self.controller_down {
                    self.c.respawn_node(*i);
                } else {
                    self.c.restart_node(*i);
                }
                self.down[*i] = false;
            }
            Fault::PowerCut(i) => {
                self.power_cut = true;
                self.apply(&Fault::KillNode(*i))?;
                let lost = self.c.forgetful[*i].power_cut();
                eprintln!(
                    "node-{}: power cut, {lost} blocks lost from its disk's cache",
                    i + 1
                );
            }
            Fault::PowerCutAll => self.power_cut_all(None)?,
            Fault::PowerCutAllBut(i) => self.power_cut_all(Some(*i))?,
            Fault::Reboot(i) => self.reboot(*i)?,
            Fault::TrustedAfterReboot(i) => self.trusted_after_reboot(*i)?,
            Fault::Settle => {
                self.c
                    .wait_settled("v", self.replicas, Duration::from_secs(180));
            }
            Fault::KillController => {
                self.c.ctl.proc.signal(nix::sys::signal::Signal::SIGKILL);
                self.c.ctl.proc.wait_exit(Duration::from_secs(10));
                self.controller_down = true;
            }
            Fault::RestartController => {
                self.c.ctl.restart();
                self.controller_down = false;
            }
            Fault::FillDisk(i) => {
                let disk = self.c.path(&format!("node-{}", i + 1)).join("disk-1");
                self.fillers[*i] = Some(fill_disk(&disk));
            }
            Fault::FreeDisk(i) => {
                if let Some(f) = self.fillers[*i].take() {
                    std::fs::remove_dir_all(f).map_err(|e| e.to_string())?;
                }
            }
            Fault::CorruptHead(i) => self.corrupt_head(*i)?,
            // The requests below need the controller; with it down they
            // are not made (the schedule said to ask, and no one answers).
            Fault::Replicas(n) if !self.controller_down => {
                self.ask(
                    "PATCH",
                    "/v1/volumes/v",
                    Some(json!({"numberOfReplicas": n})),
                )?;
            }
            Fault::DeleteReplica(i) if !self.controller_down => {
                if let Some(r) = self.c.replica_on("v", &format!("node-{}", i + 1)) {
                    let name = r["name"].as_str().unwrap_or_default();
                    self.ask("DELETE", &format!("/v1/replicas/{name}"), None)?;
                }
            }
            Fault::Evict(i, on) if !self.controller_down => {
                self.ask(
                    "PATCH",
                    &format!("/v1/nodes/node-{}", i + 1),
                    Some(json!({"evictionRequested": on})),
                )?;
            }
            Fault::Snapshot if !self.controller_down => {
                self.snapshots_taken += 1;
                let name = format!("s-{}", self.snapshots_taken);
                if self.ask(
                    "POST",
                    "/v1/snapshots",
                    Some(json!({"name": name, "volume": "v"})),
                )? {
                    self.snapshots.push(name);
                }
            }
            Fault::DeleteSnapshot if !self.controller_down => {
                if !self.snapshots.is_empty() {
                    let name = self.snapshots[0].clone();
                    if self.ask("DELETE", &format!("/v1/snapshots/{name}"), None)? {
                        self.snapshots.remove(0);
                    }
                }
            }
            Fault::Replicas(_)
            | Fault::DeleteReplica(_)
            | Fault::Evict(..)
            | Fault::Snapshot
            | Fault::DeleteSnapshot => {}
            Fault::Pause(ms) => std::thread::sleep(Duration::from_millis(*ms)),
            Fault::Check => {
                self.stop_writer();
                self.check()?;
                self.start_writer();
            }
        }
        Ok(())
    }

    /// Every machine's power cut at once (`PowerCutAll`), every node but
    /// `left_down` started again.
    fn power_cut_all(&mut self, left_down: Option<usize>) -> Result<(), String> {
        self.stop_writer();
        let unflushed = write_unflushed(&self.endpoint, self.next_slot, 160);
        eprintln!(
            "{} writes acknowledged with no flush after them",
            unflushed.len()
        );
        self.acks.extend(unflushed);
        self.next_slot += 160;
        for f in &self.c.forgetful {
            crate::forgetful::heads_reach_the_disk(&f.at);
        }
        self.apply(&Fault::KillEngine)?;
        for i in 0..self.down.len() {
            if !self.down[i] {
                self.apply(&Fault::KillNode(i))?;
            }
        }
        self.power_cut = true;
        for i in 0..self.down.len() {
            let lost = self.c.forgetful[i].power_cut();
            eprintln!(
                "node-{}: power cut, {lost} blocks lost from its disk's cache",
                i + 1
            );
        }
        // The engine's node first: its engine starts before the
        // other replicas' nodes are back, and waits for them to
        // settle its replica's suspect blocks.
        for i in 0..self.down.len() {
            if Some(i) == left_down {
                self.down[i] = true;
                eprintln!("node-{}: its machine does not come back", i + 1);
            } else {
                self.apply(&Fault::RestartNode(i))?;
            }
        }
        self.start_writer();
        Ok(())
    }

    /// A request to the controller: true when done; false when it refused
    /// with a reason (busy, a node down, nowhere to go); Err on anything
    /// else (a server error, an answer that says nothing).
    fn ask(
        &self,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<bool, String> {
        let (s, v) = call(method, &self.c.url(path), body);
        match s {
            200..=299 => Ok(true),
            404 | 409 | 422 | 503 if v["error"].as_str().is_some_and(|e| !e.is_empty()) => {
                eprintln!("{method} {path}: {s} {}", v["error"]);
                Ok(false)
            }
            _ => Err(format!("{method} {path}: {s} {v}")),
        }
    }

    /// Flips a block of an acknowledged write in node `i`'s replica head.
    fn corrupt_head(&mut self, i: usize) -> Result<(), String> {
        let node = format!("node-{}", i + 1);
        let dir = if self.controller_down {
            // No records to ask: the volume's replica on the node's disk.
            let replicas = self.c.path(&node).join("disk-1").join("replicas");
            let found = std::fs::read_dir(&replicas).ok().and_then(|d| {
                d.flatten().map(|e| e.path()).find(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("v-"))
                })
            });
            let Some(dir) = found else {
                return Ok(());
            };
            dir
        } else {
            let Some(r) = self.c.replica_on("v", &node) else {
                return Ok(());
            };
            self.c
                .path(&node)
                .join(r["spec"]["diskId"].as_str().unwrap_or("disk-1"))
                .join("replicas")
                .join(r["name"].as_str().unwrap_or_default())
        };
        let Ok(replica) = ballast_node::replica::Replica::open_view(&dir) else {
            return Ok(());
        };
        let head = replica.chain().last().cloned().unwrap_or_default();
        // Each flip takes another acknowledged write, so flips of two
        // replicas leave a sound copy of each block where one was current.
        let mut acks = self.acks.clone();
        if let Some(w) = &self.writer
            && let Ok(a) = w.acks.lock()
        {
            acks.extend(a.iter().copied());
        }
        let acked = match acks.len() {
            0 => None,
            n => acks.get(self.flipped.len() * 7 % n).copied(),
        };
        if let Some(a) = acked {
            // A head that is not there (a rebuild under way) is left.
            let _ = flip_block(&dir.join(head), a.offset);
            self.flipped.insert(a.offset);
        }
        Ok(())
    }

    /// Detaches, attaches again at node-1 (a new engine, from the replicas
    /// the store records as current) and reads every acknowledged write
    /// back; a refusal must say why.
    fn check(&mut self) -> Result<(), String> {
        let mut last = String::new();
        for _ in 0..60 {
            let (s, v) = call("POST", &self.c.url("/v1/volumes/v/detach"), None);
            if s == 200 {
                break;
            }
            last = v.to_string();
            std::thread::sleep(Duration::from_millis(500));
        }
        for _ in 0..60 {
            let (s, v) = call(
                "POST",
                &self.c.url("/v1/volumes/v/attach"),
                Some(json!({"nodeId": "node-1"})),
            );
            match s {
                200 => {
                    let endpoint = v["status"]["frontendEndpoint"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string();
                    let (cut, whole): (Vec<Ack>, Vec<Ack>) =
                        self.acks.iter().partition(|a| self.power_cut && !a.flushed);
                    let (torn, kept, zeros) = torn_otherwise(&endpoint, &cut)?;
                    // A block flipped in every replica fails its read.
                    let torn: Vec<u64> = torn
                        .into_iter()
                        .filter(|o| !self.flipped.contains(o))
                        .collect();
                    if !cut.is_empty() {
                        eprintln!(
                            "writes unflushed at a power cut: {kept} blocks hold their bytes, {zeros} zeros"
                        );
                    }
                    if !torn.is_empty() {
                        return Err(format!(
                            "of {} writes unflushed at a power cut, {} read back other bytes \
                             than their own or zeros, or failed (offsets {:?})",
                            cut.len(),
                            torn.len(),
                            &torn[..torn.len().min(8)]
                        ));
                    }
                    let bad = unreadable(&endpoint, &whole)?;
                    // A failed read is allowed only where a block was
                    // flipped; wrong data never is.
                    let (lost, failed): (Vec<u64>, Vec<u64>) = bad
                        .failed
                        .into_iter()
                        .partition(|o| self.flipped.contains(o));
                    if bad.wrong.is_empty() && failed.is_empty() {
                        self.outcome.lost_to_corruption = lost.len();
                        return Ok(());
                    }
                    return Err(format!(
                        "of {} acknowledged writes, {} read back other data (offsets {:?}) \
                         and {} failed to read where no block was flipped (offsets {:?})",
                        self.acks.len(),
                        bad.wrong.len(),
                        &bad.wrong[..bad.wrong.len().min(8)],
                        failed.len(),
                        &failed[..failed.len().min(8)]
                    ));
                }
                422 => {
                    let why = v["error"].as_str().unwrap_or_default().to_string();
                    if why.contains("holds") || why.contains("latest data") {
                        self.outcome.refused.push(why);
                        return Ok(());
                    }
                    last = why;
                }
                // Busy with a step of the control loop, or a node not
                // ready yet: try again.
                _ => last = v.to_string(),
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        Err(format!("the volume neither served nor said why: {last}"))
    }

    /// Everything back: nodes, controller, disks.
    fn restore(&mut self) -> Result<(), String> {
        if self.controller_down {
            self.apply(&Fault::RestartController)?;
        }
        for i in 0..self.frozen.len() {
            if self.frozen[i] {
                self.apply(&Fault::ThawNode(i))?;
            }
        }
        for i in 0..self.down.len() {
            if self.down[i] {
                self.apply(&Fault::RestartNode(i))?;
            }
        }
        for i in 0..self.fillers.len() {
            self.apply(&Fault::FreeDisk(i))?;
        }
        // Back as the controller sees it too: a controller started again
        // reads a node that was down or frozen as "not ready" from its
        // record until that node's next heartbeat (within a second), and
        // rightly refuses an attach that needs it meanwhile.
        let api = self.c.api.clone();
        for n in &self.c.nodes {
            wait_for(
                Duration::from_secs(90),
                &format!("{} ready again", n.id),
                || node(&api, &n.id).filter(node_is_up),
            );
        }
        Ok(())
    }
}

/// Runs a schedule; Err says what broke (with the schedule).
pub fn run(s: &Schedule) -> Result<Outcome, String> {
    let c = if s.faults.iter().any(|f| {
        matches!(
            f,
            Fault::PowerCut(_) | Fault::PowerCutAll | Fault::PowerCutAllBut(_) | Fault::Reboot(_)
        )
    }) {
        Cluster::start_on_forgetful_disks(3, 256 << 20)
    } else {
        Cluster::start_with(3, 1, Some(256 << 20))
    };
    if s.replicas < 3 {
        c.patch_node("node-1", json!({"allowScheduling": false}));
    }
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": s.replicas}));
    // No replacement replica while a node is only briefly down.
    c.set("replica-replenishment-wait-interval", json!(3600));
    let endpoint = c.attach("v", "node-1");
    c.wait_settled("v", s.replicas, Duration::from_secs(90));
    let mut run = Run {
        c,
        replicas: s.replicas,
        endpoint,
        acks: Vec::new(),
        writer: None,
        next_slot: 0,
        down: vec![false; 3],
        frozen: [false; 3],
        controller_down: false,
        fillers: vec![None, None, None],
        flipped: Default::default(),
        rebooted_at: [0; 3],
        power_cut: false,
        snapshots: Vec::new(),
        snapshots_taken: 0,
        outcome: Outcome::default(),
        hung: 0,
    };
    let played = play(&mut run, s);
    // The evidence of a schedule that broke, or whose writes hung, is kept
    // (`BALLAST_KEEP_TEST_DIRS=1` keeps every schedule's).
    if played.is_err() || run.hung > 0 {
        run.c.dir.disable_cleanup(true);
        eprintln!(
            "{}: {} batch(es) hung, {}; its cluster's directory (logs, disks) is kept: {}",
            s.name,
            run.hung,
            if played.is_err() { "broke" } else { "passed" },
            run.c.dir.path().display()
        );
    }
    played
}

/// Plays schedule `s` on `run`'s cluster: its faults under the writer,
/// then the checks that every acknowledged write is there.
fn play(run: &mut Run, s: &Schedule) -> Result<Outcome, String> {
    run.start_writer();
    let context = |e: String| format!("schedule {:?}: {e}", s);
    for f in &s.faults {
        run.apply(f).map_err(context)?;
    }
    run.stop_writer();
    run.restore().map_err(context)?;
    let moves = s.faults.iter().any(Fault::moves);
    if moves {
        // Asked back to what it was made with: the replica count, and no
        // node evicted.
        run.apply(&Fault::Replicas(s.replicas)).map_err(context)?;
        for i in 0..3 {
            run.apply(&Fault::Evict(i, false)).map_err(context)?;
        }
    }
    // Everything is back: the volume must serve, with every write.
    let refused_before = run.outcome.refused.len();
    run.check().map_err(context)?;
    if moves {
        // It converges to the count it was made with, and the replicas it
        // built or kept serve every write once more.
        run.c
            .wait_settled("v", s.replicas, Duration::from_secs(180));
        run.check().map_err(context)?;
    }
    if run.outcome.refused.len() > refused_before {
        return Err(context(format!(
            "with every node back, the attach was refused: {:?}",
            run.outcome.refused.last()
        )));
    }
    run.outcome.acknowledged = run.acks.len();
    run.outcome.flushed = run.acks.iter().filter(|a| a.flushed).count();
    if run.acks.is_empty() {
        return Err(context("no write was acknowledged at all".into()));
    }
    Ok(std::mem::take(&mut run.outcome))
}

/// A small seeded generator (xorshift64*), for random schedules.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

/// What a random schedule draws from besides the faults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Draw {
    /// Crashes, full disks and flipped blocks only.
    Faults,
    /// Also replica counts changed, replicas deleted, nodes evicted, and
    /// snapshots taken and deleted.
    Moves,
    /// Also power cuts: a replica node's, and every machine's at once.
    PowerCuts,
    /// Also replica nodes frozen (SIGSTOP) and thawed, some for longer
    /// than the replica timeout.
    Freezes,
    /// Also planned reboots of a replica node, besides the power cuts.
    Reboots,
}

/// A random schedule of 3 to 7 faults that makes sense in order (a node is
/// restarted only when down, a disk freed only when full). `Faults` and
/// `Moves` draw the schedules they always drew for a seed.
pub fn random(rng: &mut Rng, index: u64, draw: Draw) -> Schedule {
    let replicas = 2 + rng.below(2) as usize;
    let (mut down, mut full, mut ctl_down) = ([false; 3], [false; 3], false);
    let mut evicting = [false; 3];
    let mut frozen = [false; 3];
    let mut faults = vec![Fault::Pause(300)];
    let kinds = match draw {
        Draw::Faults => 8,
        Draw::Moves => 13,
        Draw::PowerCuts => 10,
        Draw::Reboots => 11,
        Draw::Freezes => 12,
    };
    let power = matches!(draw, Draw::PowerCuts | Draw::Reboots);
    for _ in 0..3 + rng.below(5) {
        let i = rng.below(3) as usize;
        let f = match rng.below(kinds) {
            0 => Fault::KillEngine,
            1 | 2 if !down[i] && i != 0 => {
                down[i] = true;
                frozen[i] = false;
                Fault::KillNode(i)
            }
            1 | 2 if down[i] => {
                down[i] = false;
                Fault::RestartNode(i)
            }
            3 if !ctl_down => {
                ctl_down = true;
                Fault::KillController
            }
            3 => {
                ctl_down = false;
                Fault::RestartController
            }
            4 if !full[i] => {
                full[i] = true;
                Fault::FillDisk(i)
            }
            4 => {
                full[i] = false;
                Fault::FreeDisk(i)
            }
            5 => Fault::CorruptHead(i),
            6 if !ctl_down => Fault::Check,
            8 if power && !down[i] && i != 0 => {
                down[i] = true;
                Fault::PowerCut(i)
            }
            9 if power && !ctl_down => {
                // Every node comes back with the machines.
                down = [false; 3];
                Fault::PowerCutAll
            }
            10 if draw == Draw::Reboots && !down[i] && i != 0 => Fault::Reboot(i),
            8..=11 if draw == Draw::Freezes && !down[i] && i != 0 => {
                frozen[i] = !frozen[i];
                if frozen[i] {
                    // Frozen for a while: about a third of the time past
                    // the replica timeout (8 s), then its other faults.
                    faults.push(Fault::FreezeNode(i));
                    Fault::Pause(2000 + rng.below(10_000))
                } else {
                    Fault::ThawNode(i)
                }
            }
            8..=11 if draw == Draw::Freezes => Fault::Pause(500 + rng.below(1500)),
            8..=10 if power => Fault::Pause(500 + rng.below(1500)),
            8 => Fault::Replicas(if rng.below(2) == 0 {
                replicas - 1
            } else {
                replicas
            }),
            9 => Fault::DeleteReplica(i),
            10 => {
                evicting[i] = !evicting[i];
                Fault::Evict(i, evicting[i])
            }
            11 => Fault::Snapshot,
            12 => Fault::DeleteSnapshot,
            _ => Fault::Pause(500 + rng.below(1500)),
        };
        faults.push(f);
        faults.push(Fault::Pause(300 + rng.below(1200)));
    }
    Schedule {
        name: format!(
            "{}-{index}",
            match draw {
                Draw::Faults => "random",
                Draw::Moves => "moves",
                Draw::PowerCuts => "power",
                Draw::Reboots => "reboots",
                Draw::Freezes => "freezes",
            }
        ),
        replicas,
        faults,
    }
}
