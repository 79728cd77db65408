//! The engine processes of the volumes attached to this node (the node
//! context holds them; the agent and the CSI service ask them). Each engine
//! runs as `ballast engine` in its own process, so that restarting the node
//! plugin never interrupts a volume. The engine is this process's child, or,
//! with an engine host (`--engine-host`), the host's, so that even the death
//! of the node plugin's whole process group or container spares it. The
//! node plugin re-adopts running engines (by their pid files) when it
//! starts.
//!
//! **A handover to a new engine host.** When another host takes the
//! socket (a rollout of the engine host), the engines of the old one move
//! to it one at a time: a heartbeat marks one of them (`handover`), the
//! controller starts it again, and it comes up under the new host, taking
//! over its block device as after a crash (the writes in flight are sent
//! again, the replicas caught up). The old host ends once it has none.
//!
//! **One change of a volume's engine at a time.** A start, a stop and
//! each change of a running engine (its replicas, size, export,
//! credentials) take the volume's guard and hold it to their end; the
//! table of engines is held only to read or change an entry, never while
//! an engine is waited for. So one volume's start, which may wait up to
//! 20 s for an engine whose replicas' nodes are not back, holds up no
//! other volume, and no heartbeat (which lists the engines).
//!
//! **Only the engine it started.** A volume's engine is healthy only if
//! the processes serving its sockets are that engine: a stray engine of
//! the volume (one whose start was abandoned, binding its paths late)
//! would take its clients' I/O and its control. A start stops any stray
//! before it spawns and checks who serves once its engine is up; a
//! health check that finds another process there reports the engine for
//! the controller to start again.
//!
//! Files per volume, in `<state-dir>/frontends/`: `<volume>.sock` (NBD),
//! `<volume>.ctl` (control), `<volume>.pid`, `<volume>.status.json`
//! (written by the engine).

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ballast::proto::agent::v1::{EngineReplica, EngineStatus, StartEngineRequest};
use ballast::tls::{Role, pem_holds};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::sync::Mutex;

use crate::engine_host;
use crate::error::Error;
use crate::frontend::control::{self, ControlError, ControlRequest, FailureKind};

#[derive(Clone, Debug)]
struct Running {
    pid: i32,
    spec: StartEngineRequest,
    /// The FUSE connection of the volume's block device, while exported:
    /// kept here so that it outlives the engine, and an engine started
    /// after a crash takes it over (the loop device and the filesystem on
    /// it never see the gap). Dropped when the volume is unexported.
    fuse: Option<Arc<OwnedFd>>,
    /// The engine host that started it (its pid; None: this process did,
    /// or none is known). When another host serves the socket, the engine
    /// is handed over to it.
    host: Option<i32>,
}

/// Where an engine records its volume's replica set: the controller's
/// agent endpoint, as this node.
#[derive(Clone, Debug)]
pub struct RecordAt {
    pub controller: String,
    pub node_id: String,
    /// The cluster token's file, passed on to the engine.
    pub token_file: Option<PathBuf>,
    /// The node's TLS credentials' directory (TLS on): engines get their
    /// own credentials, or these when the controller sent none.
    pub tls_dir: Option<PathBuf>,
}

/// How each engine runs, as the node's flags say.
#[derive(Clone, Copy, Debug)]
pub struct Tuning {
    /// `--writeback-every`: start the lent replica's writeback after this
    /// many bytes written (0: left to the kernel).
    pub writeback_every: u64,
    /// `--workers`: async worker threads (0: one per core, at most 4).
    pub workers: u16,
}

pub struct Engines {
    dir: PathBuf,
    exe: PathBuf,
    /// This node's disks, where a local replica's files are.
    disks: Vec<PathBuf>,
    /// Passed to each engine.
    tuning: Tuning,
    record_at: RecordAt,
    /// The engine host's socket; None: engines are this process's children.
    host: Option<PathBuf>,
    /// The engines, by volume: held only to read or change an entry.
    running: Mutex<BTreeMap<String, Running>>,
    /// Each volume's guard: one change of its engine at a time.
    guards: std::sync::Mutex<BTreeMap<String, Arc<Mutex<()>>>>,
    /// Woken when an engine this process started exits, or one was handed
    /// over to a new engine host, so that the next heartbeat reports it at
    /// once (and marks the next engine to hand over).
    report_now: Arc<tokio::sync::Notify>,
    /// The FUSE connections of block devices whose engine could not be
    /// started again (after a crash, or in a handover), with the volume's
    /// size: kept, so that the next start takes the device over, and the
    /// filesystem on it sees a longer pause instead of a dead device.
    /// Taken under the volume's guard.
    left: std::sync::Mutex<BTreeMap<String, (u64, Arc<OwnedFd>)>>,
    /// The engine host (its pid) under which a handover failed: no more
    /// engines are handed over to it. Another host that takes the socket
    /// starts the handovers again.
    failed_handover: std::sync::Mutex<Option<i32>>,
}

/// The node's error for what an engine answered on its control socket.
fn control_error(e: ControlError) -> Error {
    match e.kind {
        FailureKind::Busy => Error::Busy(e.message),
        FailureKind::Unreachable => Error::Unavailable(e.message),
        FailureKind::Refused => Error::Refused(e.message),
        FailureKind::Invalid => Error::Invalid {
            field: "replica".into(),
            message: e.message,
        },
        FailureKind::Corrupt => Error::SourceCorrupt(e.message),
        FailureKind::Failed => Error::Internal(e.message),
    }
}

/// How long an engine may take to answer a health check.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(2);

fn alive(pid: i32) -> bool {
    kill(Pid::from_raw(pid), None).is_ok()
}

/// Waits up to `limit` for process `pid` to be gone; whether it is.
async fn gone_within(pid: i32, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while alive(pid) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    !alive(pid)
}

/// Why an engine started by engine host `started_by` is to move to the
/// one serving the socket now (`host_now`): a new host replaced its own
/// there (a rollout of the engine host). None when the same host serves,
/// when no host serves, or when no host started it.
fn stale_host(started_by: Option<i32>, host_now: Option<i32>) -> Option<String> {
    let (was, now) = (started_by?, host_now?);
    (was != now).then(|| format!("its engine host (pid {was}) was replaced by pid {now}"))
}

/// The parent of process `pid` (from `/proc/<pid>/stat`, whose fourth
/// field it is; the second, the command in parentheses, may hold spaces).
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

/// The process that listens on the unix socket at `path` (see
/// `engine_host::listener_pid`), within the health check's time.
async fn server_of(path: &Path) -> std::io::Result<Option<i32>> {
    engine_host::listener_pid(path, HEALTH_TIMEOUT).await
}

/// Why the engine of pid `pid`, with `sockets` (NBD, control), is not
/// healthy, if it is not: its process is gone, it does not answer on its
/// control socket within the health check's time, or another process
/// serves its sockets.
async fn problem_of(sockets: [PathBuf; 2], pid: i32) -> Option<String> {
    if !alive(pid) {
        return Some(format!("its process {pid} exited"));
    }
    let ping = control::call(&sockets[1], &ControlRequest::Ping);
    match tokio::time::timeout(HEALTH_TIMEOUT, ping).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Some(format!("its control socket fails: {}", e.message)),
        Err(_) => {
            return Some(format!(
                "its control socket did not answer in {}s",
                HEALTH_TIMEOUT.as_secs()
            ));
        }
    }
    // What answered is the engine itself, and its clients reach it: a
    // stray engine of the volume (one whose start was abandoned) may have
    // bound the paths since.
    for path in &sockets {
        match server_of(path).await {
            Ok(Some(p)) if p != pid => {
                return Some(format!("process {p} serves {}, not it", path.display()));
            }
            Ok(_) => {}
            Err(e) => return Some(format!("nothing serves {}: {e}", path.display())),
        }
    }
    None
}

/// Refuses process `pid`, found serving `path`, unless it is an engine of
/// `volume` (one that may be stopped): anything else is never killed.
fn only_an_engine(pid: i32, path: &Path, volume: &str) -> Result<(), Error> {
    if engine_of(pid, volume) {
        return Ok(());
    }
    Err(Error::Internal(format!(
        "process {pid} serves {}, and it is not an engine of {volume}",
        path.display()
    )))
}

/// Whether process `pid` is an engine of `volume` (`ballast engine ...
/// --volume VOLUME ...`, as this node starts them), by its command line.
fn engine_of(pid: i32, volume: &str) -> bool {
    let Ok(line) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = line.split(|b| *b == 0).collect();
    args.get(1) == Some(&b"engine".as_slice())
        && args
            .windows(2)
            .any(|w| w[0] == b"--volume" && w[1] == volume.as_bytes())
}

impl Engines {
    /// `state_dir/frontends` holds the sockets; `exe` is the ballast binary.
    pub fn new(
        state_dir: &Path,
        exe: PathBuf,
        disks: Vec<PathBuf>,
        tuning: Tuning,
        record_at: RecordAt,
        host: Option<PathBuf>,
    ) -> Self {
        Engines {
            dir: state_dir.join("frontends"),
            exe,
            disks,
            tuning,
            record_at,
            host,
            running: Mutex::new(BTreeMap::new()),
            guards: std::sync::Mutex::default(),
            report_now: Arc::default(),
            left: std::sync::Mutex::default(),
            failed_handover: std::sync::Mutex::default(),
        }
    }

    /// Notified when an engine this process started exits, or one was
    /// handed over: the heartbeat goes at once.
    pub fn report_now(&self) -> Arc<tokio::sync::Notify> {
        self.report_now.clone()
    }

    /// The guard of `volume`'s engine, once every change of it that came
    /// before has ended.
    async fn guard(&self, volume: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let guard = {
            let mut guards = self.guards.lock().unwrap_or_else(|e| e.into_inner());
            // Those no one holds or waits for go.
            guards.retain(|_, g| Arc::strong_count(g) > 1);
            guards.entry(volume.to_string()).or_default().clone()
        };
        guard.lock_owned().await
    }

    /// The engine of `volume` as the table has it, if its process lives.
    async fn alive_entry(&self, volume: &str) -> Option<Running> {
        let running = self.running.lock().await;
        running.get(volume).filter(|r| alive(r.pid)).cloned()
    }

    /// The engine of `volume`, which a change asks of: NOT_FOUND when none
    /// runs on this node.
    async fn running_engine(&self, volume: &str) -> Result<Running, Error> {
        self.alive_entry(volume)
            .await
            .ok_or_else(|| Error::NotFound(format!("no engine of {volume} runs on this node")))
    }

    /// Changes the spec of `volume`'s engine in the table, and its
    /// record, with `f` (an engine that ended meanwhile: nothing).
    async fn respec(&self, volume: &str, f: impl FnOnce(&mut StartEngineRequest)) {
        let mut running = self.running.lock().await;
        if let Some(r) = running.get_mut(volume) {
            f(&mut r.spec);
            self.record(r.pid, &r.spec);
        }
    }

    /// Why the engine of `volume` (pid `pid`) is not healthy, if it is not
    /// (see [`problem_of`]).
    async fn problem(&self, volume: &str, pid: i32) -> Option<String> {
        problem_of(self.sockets(volume), pid).await
    }

    /// The sockets of `volume`'s engine: NBD (its clients') and control
    /// (this node's).
    fn sockets(&self, volume: &str) -> [PathBuf; 2] {
        [self.socket(volume), self.control(volume)]
    }

    /// Stops each engine of `volume` that still serves its sockets: a
    /// stray, since a start calls this only once no engine of the volume
    /// is to run (one whose start was abandoned, or one replaced that has
    /// not died yet). A process serving them that is not an engine of the
    /// volume is not touched, and the start fails naming it.
    async fn stop_strays(&self, volume: &str) -> Result<(), Error> {
        for path in self.sockets(volume) {
            let Ok(Some(p)) = server_of(&path).await else {
                continue;
            };
            only_an_engine(p, &path, volume)?;
            tracing::warn!(pid = p, socket = %path.display(), "stopping a stray engine of the volume");
            let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
            gone_within(p, Duration::from_secs(5)).await;
        }
        Ok(())
    }

    pub fn socket(&self, volume: &str) -> PathBuf {
        self.dir.join(format!("{volume}.sock"))
    }

    fn pid_file(&self, volume: &str) -> PathBuf {
        self.dir.join(format!("{volume}.pid"))
    }

    fn control(&self, volume: &str) -> PathBuf {
        self.dir.join(format!("{volume}.ctl"))
    }

    fn status_file(&self, volume: &str) -> PathBuf {
        self.dir.join(format!("{volume}.status.json"))
    }

    pub fn endpoint(&self, volume: &str) -> String {
        format!(
            "nbd+unix:///{volume}?socket={}",
            self.socket(volume).display()
        )
    }

    /// Re-adopts engines that outlived a previous node plugin.
    pub async fn adopt(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut running = self.running.lock().await;
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(volume) = name.strip_suffix(".pid") else {
                continue;
            };
            let Ok(text) = std::fs::read_to_string(e.path()) else {
                continue;
            };
            let mut lines = text.lines();
            let (Some(pid), Some(spec)) = (
                lines.next().and_then(|p| p.parse::<i32>().ok()),
                lines.next(),
            ) else {
                continue;
            };
            let Ok(spec) = serde_json::from_str::<serde_json::Value>(spec) else {
                continue;
            };
            if alive(pid) && self.socket(volume).exists() {
                tracing::info!(volume, pid, "re-adopted a running engine");
                let strings = |v: &serde_json::Value| -> Vec<String> {
                    v.as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|r| r.as_str().map(str::to_string))
                                .collect()
                        })
                        .unwrap_or_default()
                };
                let spec = StartEngineRequest {
                    volume: volume.to_string(),
                    size: spec["size"].as_u64().unwrap_or(0),
                    replicas: strings(&spec["replicas"]),
                    local: spec["local"].as_str().unwrap_or_default().to_string(),
                    generation: spec["generation"].as_u64().unwrap_or(0),
                    current: strings(&spec["current"]),
                    stale: strings(&spec["stale"]),
                    epoch: spec["epoch"].as_u64().unwrap_or(0),
                    replica_timeout_seconds: spec["replicaTimeoutSeconds"]
                        .as_u64()
                        .and_then(|s| u32::try_from(s).ok())
                        .unwrap_or(0),
                    // The running engine holds its credentials; they are
                    // not kept in the record.
                    ..Default::default()
                };
                let fuse = self.device_of(volume).await;
                let host = self.host.as_ref().and_then(|_| parent_of(pid));
                running.insert(
                    volume.to_string(),
                    Running {
                        pid,
                        spec,
                        fuse,
                        host,
                    },
                );
            }
        }
    }

    /// The FUSE connection of an exported engine (none when it is not
    /// exported, or cannot say).
    async fn device_of(&self, volume: &str) -> Option<Arc<OwnedFd>> {
        self.connection_of(volume).await.ok().flatten()
    }

    /// The FUSE connection of the block device `volume`'s engine exports
    /// (None: it exports none, or did not hand it over, which is logged);
    /// an error when the engine could not be reached (it ended).
    async fn connection_of(&self, volume: &str) -> Result<Option<Arc<OwnedFd>>, ControlError> {
        if !crate::frontend::blockdev::is_mountpoint(&self.export_dir(volume)) {
            return Ok(None);
        }
        match control::device(&self.control(volume)).await {
            Ok(fd) => Ok(Some(Arc::new(fd))),
            Err(e) => {
                tracing::warn!(volume, error = %e.message, "the engine did not hand over its block device's connection");
                match e.kind {
                    FailureKind::Unreachable => Err(e),
                    _ => Ok(None),
                }
            }
        }
    }

    /// Starts the engine of a volume, or returns the one already running
    /// and healthy for this attachment or a later one (its replicas are
    /// managed through add and remove). A dead engine is started again; a
    /// hung one is killed first, and so is one under an engine host that
    /// another replaced (a handover: it comes up under the new host), and
    /// one started for an earlier attachment, whose writes the replicas
    /// may refuse (a detach raises their fences). Its caller runs it to
    /// its end on a task of its own (the agent's `start_engine`).
    #[tracing::instrument(skip_all, fields(volume = %spec.volume))]
    pub async fn start(&self, spec: StartEngineRequest) -> Result<EngineStatus, Error> {
        let invalid = |field: &str, m: String| Error::Invalid {
            field: field.into(),
            message: m,
        };
        ballast::model::validate_name(&spec.volume).map_err(|m| invalid("volume", m))?;
        if spec.replicas.is_empty() {
            return Err(invalid("replicas", "at least one replica is needed".into()));
        }
        for r in &spec.stale {
            r.parse::<crate::engine::ReplicaAddr>()
                .map_err(|m| invalid("stale", m))?;
        }
        let _volume = self.guard(&spec.volume).await;
        // The block device the last engine served (its size and FUSE
        // connection), for the next to take over.
        let device: Option<(u64, Arc<OwnedFd>)>;
        // The host an engine is handed over to (a handover), if one is.
        let mut handing_to = None;
        let known = self.running.lock().await.get(&spec.volume).cloned();
        if let Some(r) = known {
            let why = match self.problem(&spec.volume, r.pid).await {
                Some(why) => Some(why),
                // Healthy, but under an engine host replaced since: it moves
                // to the new one (a handover), its block device kept.
                None => {
                    let now = self.host_now().await;
                    let stale = stale_host(r.host, now);
                    handing_to = now.filter(|_| stale.is_some());
                    // Started for an earlier attachment: the replicas may
                    // be fenced past it already (a detach raises their
                    // fences), and refuse its writes. A retry for the same
                    // attachment keeps it.
                    stale.or_else(|| {
                        (r.spec.epoch < spec.epoch).then(|| {
                            format!(
                                "it serves attachment {} of the volume and attachment {} is asked for",
                                r.spec.epoch, spec.epoch
                            )
                        })
                    })
                }
            };
            match why {
                None if r.spec.size == spec.size => {
                    return Ok(self.status(&spec.volume, true, ""));
                }
                None => {
                    return Err(invalid(
                        "size",
                        format!(
                            "an engine of {} already runs at size {}",
                            spec.volume, r.spec.size
                        ),
                    ));
                }
                Some(why) => {
                    tracing::warn!(pid = r.pid, problem = %why, "replacing the volume's engine");
                    if alive(r.pid) {
                        let _ = kill(Pid::from_raw(r.pid), Signal::SIGKILL);
                        // Gone before the next one serves its block device.
                        gone_within(r.pid, Duration::from_secs(5)).await;
                    }
                    // Its block device goes on with the new engine.
                    device = r.fuse.map(|f| (r.spec.size, f));
                }
            }
            self.running.lock().await.remove(&spec.volume);
        } else {
            // A block device whose last engine could not be started again.
            device = self.left_device(&spec.volume);
        }
        if let Err(e) = self.stop_strays(&spec.volume).await {
            if let Some((size, fd)) = device {
                let mut left = self.left.lock().unwrap_or_else(|e| e.into_inner());
                left.insert(spec.volume.clone(), (size, fd));
            }
            return Err(e);
        }
        let takeover = device
            .filter(|(size, _)| *size == spec.size)
            .filter(|_| crate::frontend::blockdev::is_mountpoint(&self.export_dir(&spec.volume)))
            .map(|(_, fd)| fd);
        let (started, pid) = match self.spawn(&spec, takeover.as_ref()).await {
            Ok(s) => s,
            Err(e) => {
                if let Some(fd) = takeover {
                    let mut left = self.left.lock().unwrap_or_else(|e| e.into_inner());
                    left.insert(spec.volume.clone(), (spec.size, fd));
                }
                if let Some(host) = handing_to {
                    tracing::error!(host, error = %e, "a handover to a new engine host failed: no other engine is handed over to it");
                    *self
                        .failed_handover
                        .lock()
                        .unwrap_or_else(|e| e.into_inner()) = Some(host);
                }
                return Err(e);
            }
        };
        let host = match started {
            Started::Hosted(_) => parent_of(pid),
            Started::Child(_) => None,
        };
        if let Started::Child(mut child) = started {
            // The engine outlives this process; reap it in the background,
            // and have its exit reported at once. (A host reaps its own.)
            let exited = self.report_now.clone();
            std::thread::spawn(move || {
                let _ = child.wait();
                exited.notify_one();
            });
        }
        self.record(pid, &spec);
        tracing::info!(
            pid,
            took_over_block_device = takeover.is_some(),
            "engine started"
        );
        if handing_to.is_some() {
            // The next engine to hand over is marked at once.
            self.report_now.notify_one();
        }
        let volume = spec.volume.clone();
        self.running.lock().await.insert(
            volume.clone(),
            Running {
                pid,
                spec,
                fuse: takeover,
                host,
            },
        );
        Ok(self.status(&volume, true, ""))
    }

    /// Starts the volume's engine (this process's child, or the engine
    /// host's) and waits until it serves; it and its pid.
    async fn spawn(
        &self,
        spec: &StartEngineRequest,
        takeover: Option<&Arc<OwnedFd>>,
    ) -> Result<(Started, i32), Error> {
        let takeover = takeover.map(|f| f.as_ref());
        let (mut cmd, log) = self.command(spec, takeover)?;
        let mut started = match &self.host {
            Some(host) => {
                let args = cmd
                    .get_args()
                    .map(|a| a.to_string_lossy().into_owned())
                    .collect();
                Started::Hosted(engine_host::spawn(host, args, &log, takeover).await?)
            }
            None => Started::Child(
                cmd.spawn()
                    .map_err(|e| Error::Internal(format!("cannot start the engine: {e}")))?,
            ),
        };
        let pid = started.pid();
        let sockets = self.sockets(&spec.volume);
        wait_up(&mut started, &sockets, &log, &spec.volume).await?;
        Ok((started, pid))
    }

    /// The block device a volume's last engine left when the next could
    /// not start, taken out (its size and FUSE connection).
    fn left_device(&self, volume: &str) -> Option<(u64, Arc<OwnedFd>)> {
        self.left
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(volume)
    }

    /// The command line of the volume's engine, its output going to its
    /// log (returned); a block device it takes over is passed as an fd.
    fn command(
        &self,
        spec: &StartEngineRequest,
        takeover: Option<&OwnedFd>,
    ) -> Result<(std::process::Command, PathBuf), Error> {
        std::fs::create_dir_all(&self.dir).map_err(|e| Error::disk(&self.dir, e.to_string()))?;
        let socket = self.socket(&spec.volume);
        let _ = std::fs::remove_file(&socket);
        let _ = std::fs::remove_file(self.status_file(&spec.volume));
        let log = self.dir.join(format!("{}.log", spec.volume));
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| Error::disk(&log, e.to_string()))?;
        let err = out
            .try_clone()
            .map_err(|e| Error::disk(&log, e.to_string()))?;
        let mut cmd = std::process::Command::new(&self.exe);
        cmd.arg("engine")
            .args(["--volume", &spec.volume, "--size", &spec.size.to_string()])
            .arg("--socket")
            .arg(&socket)
            .arg("--status-file")
            .arg(self.status_file(&spec.volume))
            .arg("--control-socket")
            .arg(self.control(&spec.volume))
            .arg("--writeback-every")
            .arg(self.tuning.writeback_every.to_string())
            .args(["--workers", &self.tuning.workers.to_string()])
            .args(["--controller", &self.record_at.controller])
            .args(["--node-id", &self.record_at.node_id])
            .args(["--generation", &spec.generation.to_string()])
            .args(["--epoch", &spec.epoch.to_string()]);
        if let Some(f) = &self.record_at.token_file {
            cmd.arg("--cluster-token-file").arg(f);
        }
        if let Some(d) = self.engine_tls(spec)? {
            cmd.arg("--tls-dir").arg(d);
        }
        if spec.replica_timeout_seconds > 0 {
            cmd.args([
                "--replica-timeout",
                &spec.replica_timeout_seconds.to_string(),
            ]);
        }
        for r in &spec.replicas {
            cmd.args(["--replica", r]);
        }
        for r in &spec.current {
            cmd.args(["--current", r]);
        }
        for r in &spec.stale {
            cmd.args(["--stale", r]);
        }
        if !spec.local.is_empty() {
            cmd.args(["--local", &spec.local]);
            // The engine reads the local replica's files directly.
            if let Some(dir) = self
                .disks
                .iter()
                .map(|d| crate::replica::replica_dir(d, &spec.local))
                .find(|d| d.join(crate::replica::META_FILE).exists())
            {
                cmd.arg("--local-dir").arg(dir);
            }
        }
        if let Some(fd) = takeover {
            engine_host::pass_fd(&mut cmd, fd.as_raw_fd(), engine_host::TAKEOVER_FD);
            cmd.args(["--fuse-fd", &engine_host::TAKEOVER_FD.to_string()])
                .arg("--fuse-dir")
                .arg(self.export_dir(&spec.volume));
        }
        cmd.stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err);
        Ok((cmd, log))
    }

    /// Writes the pid file: the pid and the engine's replicas.
    fn record(&self, pid: i32, spec: &StartEngineRequest) {
        let record = serde_json::json!({
            "size": spec.size,
            "replicas": spec.replicas,
            "local": spec.local,
            "generation": spec.generation,
            "current": spec.current,
            "stale": spec.stale,
            "epoch": spec.epoch,
            "replicaTimeoutSeconds": spec.replica_timeout_seconds,
        });
        let _ = std::fs::write(self.pid_file(&spec.volume), format!("{pid}\n{record}\n"));
    }

    /// Asks the running engine of `volume` to add `replica` (`NAME@ADDR`)
    /// and rebuild it from `source` (or a replica it picks), copying at
    /// most `bytes_per_second` (0: no limit).
    #[tracing::instrument(skip_all, fields(volume = %volume, replica = %replica))]
    pub async fn add_replica(
        &self,
        volume: &str,
        replica: &str,
        (source, bytes_per_second): (Option<String>, u64),
    ) -> Result<(), Error> {
        let at: crate::engine::ReplicaAddr = replica.parse().map_err(|m| Error::Invalid {
            field: "replica".into(),
            message: m,
        })?;
        let _volume = self.guard(volume).await;
        self.running_engine(volume).await?;
        let req = ControlRequest::Add {
            replica: replica.to_string(),
            source,
            bytes_per_second,
        };
        control::call(&self.control(volume), &req)
            .await
            .map_err(control_error)?;
        self.respec(volume, |spec| {
            spec.replicas
                .retain(|x| !x.starts_with(&format!("{}@", at.name)));
            spec.replicas.push(replica.to_string());
        })
        .await;
        Ok(())
    }

    /// Asks the running engine of `volume` to take user snapshot `id`: I/O
    /// paused, every rw replica frozen at the same point.
    #[tracing::instrument(skip_all, fields(volume = %volume, snapshot = %id))]
    pub async fn snapshot(&self, volume: &str, id: &str) -> Result<(), Error> {
        self.running_engine(volume).await?;
        let req = ControlRequest::Snapshot {
            snapshot: id.to_string(),
        };
        control::call(&self.control(volume), &req)
            .await
            .map_err(control_error)
    }

    /// Grows the running engine of `volume` to `size` bytes (online
    /// expansion), and records the size it is to be started with again.
    #[tracing::instrument(skip_all, fields(volume = %volume, size))]
    pub async fn grow(&self, volume: &str, size: u64) -> Result<(), Error> {
        let _volume = self.guard(volume).await;
        self.running_engine(volume).await?;
        let req = ControlRequest::Grow { size };
        control::call(&self.control(volume), &req)
            .await
            .map_err(|e| match e.kind {
                FailureKind::Invalid => Error::Invalid {
                    field: "size".into(),
                    message: e.message,
                },
                _ => control_error(e),
            })?;
        self.respec(volume, |spec| spec.size = size).await;
        Ok(())
    }

    /// Gives the running engine of `volume` renewed credentials: they must
    /// name its volume, its attachment and this node. They replace its
    /// files and its recorded start (an engine started again after a
    /// crash starts with them), and the engine shows them from its next
    /// connection on.
    #[tracing::instrument(skip_all, fields(volume = %volume))]
    pub async fn renew(&self, volume: &str, cert_pem: &str, key_pem: &str) -> Result<(), Error> {
        let _volume = self.guard(volume).await;
        let r = self.running_engine(volume).await?;
        let names = [
            Role::Engine(volume.to_string()),
            Role::Attachment(volume.to_string(), r.spec.epoch),
            Role::Node(self.record_at.node_id.clone()),
        ];
        if let Some(missing) = names.iter().find(|n| !pem_holds(cert_pem, n)) {
            return Err(Error::Invalid {
                field: "tls_cert_pem".into(),
                message: format!(
                    "not a certificate for the engine of {volume} here: it does not name {}",
                    missing.name()
                ),
            });
        }
        let mut spec = r.spec.clone();
        spec.tls_cert_pem = cert_pem.to_string();
        spec.tls_key_pem = key_pem.to_string();
        self.engine_tls(&spec)?;
        control::call(&self.control(volume), &ControlRequest::Credentials)
            .await
            .map_err(control_error)?;
        self.respec(volume, |s| *s = spec).await;
        tracing::info!("renewed the engine's credentials");
        Ok(())
    }

    /// Asks the running engine of `volume` to merge `replica`, the local
    /// replica lent to it (see `Engine::merge`).
    #[tracing::instrument(skip_all, fields(volume = %volume, replica = %replica))]
    pub async fn merge(
        &self,
        volume: &str,
        replica: &str,
        keep: Vec<String>,
        rate: u64,
    ) -> Result<(), Error> {
        {
            let running = self.running.lock().await;
            if !running.get(volume).is_some_and(|r| alive(r.pid)) {
                return Err(Error::Busy(format!(
                    "replica {replica} is lent to an engine of {volume} that does not answer"
                )));
            }
        }
        let req = ControlRequest::Merge {
            replica: replica.to_string(),
            keep,
            rate,
        };
        control::call(&self.control(volume), &req)
            .await
            .map_err(control_error)
    }

    /// Takes `replica` (a name) out of the running engine of `volume`; no
    /// engine, nothing to do.
    #[tracing::instrument(skip_all, fields(volume = %volume, replica = %replica))]
    pub async fn remove_replica(&self, volume: &str, replica: &str) -> Result<(), Error> {
        let _volume = self.guard(volume).await;
        if self.alive_entry(volume).await.is_none() {
            return Ok(());
        }
        let req = ControlRequest::Remove {
            replica: replica.to_string(),
        };
        control::call(&self.control(volume), &req)
            .await
            .map_err(control_error)?;
        self.respec(volume, |spec| {
            spec.replicas
                .retain(|x| !x.starts_with(&format!("{replica}@")));
        })
        .await;
        Ok(())
    }

    /// Where the engine of `volume` exports its block-device file.
    pub fn export_dir(&self, volume: &str) -> PathBuf {
        self.dir.join(format!("{volume}.fuse"))
    }

    /// Asks the running engine of `volume` to export the volume as a file
    /// (FUSE) for a loop device; returns the file. Already exported: the
    /// same file.
    #[tracing::instrument(skip_all, fields(volume = %volume))]
    pub async fn export(&self, volume: &str) -> Result<PathBuf, Error> {
        let _volume = self.guard(volume).await;
        if self.alive_entry(volume).await.is_none() {
            return Err(Error::Refused(format!(
                "volume {volume} is not published at this node: no engine of it runs here"
            )));
        }
        let dir = self.export_dir(volume);
        let req = ControlRequest::Export { dir: dir.clone() };
        control::call(&self.control(volume), &req)
            .await
            .map_err(control_error)?;
        // An engine that ended in between leaves an export no one serves
        // or takes over: worth asking again, of the engine started next.
        let fuse = self.connection_of(volume).await.map_err(control_error)?;
        if let Some(r) = self.running.lock().await.get_mut(volume) {
            r.fuse = fuse;
        }
        Ok(dir.join(crate::frontend::blockdev::FILE_NAME))
    }

    /// Ends the export of `volume` (nothing to do without an engine).
    #[tracing::instrument(skip_all, fields(volume = %volume))]
    pub async fn unexport(&self, volume: &str) -> Result<(), Error> {
        let _volume = self.guard(volume).await;
        if self.alive_entry(volume).await.is_none() {
            // No engine serves it: end the connection it left.
            if let Some(r) = self.running.lock().await.get_mut(volume) {
                r.fuse = None;
            }
            drop(self.left_device(volume));
            self.drop_stale_export(volume);
            return Ok(());
        }
        control::call(&self.control(volume), &ControlRequest::Unexport)
            .await
            .map_err(control_error)?;
        if let Some(r) = self.running.lock().await.get_mut(volume) {
            r.fuse = None;
        }
        Ok(())
    }

    /// Unmounts (lazily) the export a dead engine left behind.
    fn drop_stale_export(&self, volume: &str) {
        let dir = self.export_dir(volume);
        if crate::frontend::blockdev::is_mountpoint(&dir) {
            let _ = nix::mount::umount2(&dir, nix::mount::MntFlags::MNT_DETACH);
        }
    }

    /// Stops the engine of a volume (nothing to do when none runs); says
    /// whether one ran.
    #[tracing::instrument(skip_all, fields(volume = %volume))]
    pub async fn stop(&self, volume: &str) -> Result<bool, Error> {
        let _volume = self.guard(volume).await;
        let stopped = self.alive_entry(volume).await.is_some();
        // A staged volume's filesystem or device sits on the engine's
        // export: stopping the engine under it would fail every I/O there.
        if stopped && crate::frontend::blockdev::is_mountpoint(&self.export_dir(volume)) {
            return Err(Error::Refused(format!(
                "volume {volume} is still staged on this node; NodeUnstageVolume first"
            )));
        }
        let ended = self.running.lock().await.remove(volume);
        if let Some(r) = ended {
            let pid = Pid::from_raw(r.pid);
            let _ = kill(pid, Signal::SIGTERM);
            if !gone_within(r.pid, Duration::from_secs(10)).await {
                let _ = kill(pid, Signal::SIGKILL);
            }
        }
        drop(self.left_device(volume));
        self.drop_stale_export(volume);
        for f in [
            self.socket(volume),
            self.control(volume),
            self.pid_file(volume),
            self.status_file(volume),
        ] {
            let _ = std::fs::remove_file(f);
        }
        let _ = std::fs::remove_dir_all(self.tls_dir(volume));
        Ok(stopped)
    }

    /// When the certificate of this node (None) or of the engine of
    /// `volume` that runs here expires, in seconds since the Unix epoch;
    /// None when it has none (TLS off) or it cannot be read.
    pub fn certificate_expiry(&self, volume: Option<&str>) -> Option<i64> {
        let dir = match volume {
            None => self.record_at.tls_dir.clone()?,
            Some(v) => self.tls_dir(v),
        };
        let pem = std::fs::read_to_string(dir.join(ballast::tls::CERT_FILE)).ok()?;
        ballast::tls::not_after(&pem).ok()
    }

    /// Where the credentials of the engine of `volume` are kept.
    fn tls_dir(&self, volume: &str) -> PathBuf {
        self.dir.join(format!("{volume}.tls"))
    }

    /// The credentials directory the engine of `spec` starts with, TLS on:
    /// its own, which the controller sent (kept beside its socket, with
    /// the node's CA certificate). The node's would not do: replicas take
    /// changes only from their volume's engine.
    fn engine_tls(&self, spec: &StartEngineRequest) -> Result<Option<PathBuf>, Error> {
        let Some(node_dir) = &self.record_at.tls_dir else {
            return Ok(None);
        };
        if spec.tls_cert_pem.is_empty() || spec.tls_key_pem.is_empty() {
            return Err(Error::Invalid {
                field: "tls_cert_pem".into(),
                message: "this node runs with TLS: the engine needs its own credentials, which replicas take changes from".into(),
            });
        }
        let failed =
            |e: ballast::tls::TlsError| Error::Internal(format!("the engine's credentials: {e}"));
        let ca = ballast::tls::Credentials::load(node_dir)
            .map_err(failed)?
            .ca_pem;
        let dir = self.tls_dir(&spec.volume);
        ballast::tls::Credentials::from_pem(&ca, &spec.tls_cert_pem, &spec.tls_key_pem)
            .save(&dir)
            .map_err(failed)?;
        Ok(Some(dir))
    }

    fn status(&self, volume: &str, running: bool, problem: &str) -> EngineStatus {
        let file: serde_json::Value = std::fs::read(self.status_file(volume))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let replicas = file["replicas"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|r| {
                        let text =
                            |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
                        let rb = &r["rebuild"];
                        EngineReplica {
                            name: text(&r["name"]),
                            addr: text(&r["addr"]),
                            mode: text(&r["mode"]),
                            error: text(&r["error"]),
                            rebuild_source: text(&rb["source"]),
                            kept_bytes: rb["keptBytes"].as_u64().unwrap_or(0),
                            copied_bytes: rb["copiedBytes"].as_u64().unwrap_or(0),
                            copy_path: text(&rb["path"]),
                            rebuild_done: rb["done"].as_bool().unwrap_or(false),
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
        let io: crate::engine::IoStats =
            serde_json::from_value(file["io"].clone()).unwrap_or_default();
        EngineStatus {
            volume: volume.to_string(),
            endpoint: self.endpoint(volume),
            running,
            replicas,
            problem: problem.to_string(),
            io: Some(ballast::proto::agent::v1::EngineIo {
                read_ops: io.read_ops,
                read_bytes: io.read_bytes,
                read_ns: io.read_ns,
                write_ops: io.write_ops,
                write_bytes: io.write_bytes,
                write_ns: io.write_ns,
                checksum_failures: io.checksum_failures,
                repairs: io.repairs,
                unreadable_reads: io.unreadable_reads,
                lost_blocks: io.lost_blocks,
            }),
            certificate_not_after: self.certificate_expiry(Some(volume)).unwrap_or(0),
            handover: false,
        }
    }

    /// The volumes whose engine runs under an engine host that another
    /// replaced: each waits for its handover (for the metrics).
    pub async fn awaiting_handover(&self) -> Vec<String> {
        let host_now = self.host_now().await;
        let running = self.running.lock().await;
        running
            .iter()
            .filter(|(_, r)| alive(r.pid) && stale_host(r.host, host_now).is_some())
            .map(|(v, _)| v.clone())
            .collect()
    }

    /// The pid of the engine host that serves the socket now (None: no
    /// host, or none listens).
    async fn host_now(&self) -> Option<i32> {
        match self.host.as_deref() {
            Some(socket) => engine_host::serving_pid(socket).await,
            None => None,
        }
    }

    /// Every engine this node started (or re-adopted) and has not been
    /// told to stop, with its health and its replicas' modes: a dead or
    /// hung one is listed with its problem, for the controller to restart.
    pub async fn list(&self) -> Vec<EngineStatus> {
        let entries: Vec<(String, i32, Option<i32>)> = {
            let running = self.running.lock().await;
            running
                .iter()
                .map(|(v, r)| (v.clone(), r.pid, r.host))
                .collect()
        };
        let host_now = self.host_now().await;
        let failed = *self
            .failed_handover
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // A handover to this host failed: the other engines stay.
        let mut handing_over = host_now.is_some() && failed == host_now;
        // Every engine checked at once: each hung one takes the health
        // check's whole time, and the heartbeat waits for the list.
        let mut checks = tokio::task::JoinSet::new();
        for (i, (volume, pid, _)) in entries.iter().enumerate() {
            let (sockets, pid) = (self.sockets(volume), *pid);
            checks.spawn(async move { (i, problem_of(sockets, pid).await) });
        }
        let mut problems = vec![Some("its health check failed".to_string()); entries.len()];
        while let Some(checked) = checks.join_next().await {
            if let Ok((i, problem)) = checked {
                problems[i] = problem;
            }
        }
        let mut out = Vec::new();
        for ((volume, _, host), problem) in entries.into_iter().zip(problems) {
            let mut status = self.status(
                &volume,
                problem.is_none(),
                problem.as_deref().unwrap_or_default(),
            );
            // One engine at a time moves to a new engine host: each move
            // pauses its volume's I/O while the engine starts again.
            if problem.is_none()
                && !handing_over
                && let Some(why) = stale_host(host, host_now)
            {
                status.handover = true;
                status.problem = why;
                handing_over = true;
            }
            out.push(status);
        }
        out
    }
}

/// A new engine: this process's child, or the engine host's (by pid).
enum Started {
    Child(std::process::Child),
    Hosted(i32),
}

impl Started {
    fn pid(&self) -> i32 {
        match self {
            Started::Child(c) => c.id() as i32,
            Started::Hosted(pid) => *pid,
        }
    }

    /// How it exited, if it has: its exit code (None: killed by a signal).
    fn exited(&mut self, log: &Path) -> Option<Option<i32>> {
        match self {
            Started::Child(c) => c.try_wait().ok().flatten().map(|s| s.code()),
            Started::Hosted(pid) => {
                if alive(*pid) {
                    return None;
                }
                // The host writes the code once it has reaped the engine.
                let code = std::fs::read_to_string(engine_host::exit_file(log)).ok()?;
                Some(code.trim().parse().ok().filter(|c| *c >= 0))
            }
        }
    }

    fn kill(&mut self) {
        match self {
            Started::Child(c) => {
                let _ = c.kill();
            }
            Started::Hosted(pid) => {
                let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
            }
        }
    }
}

/// Waits until a new engine serves its sockets (`sockets`: NBD and
/// control), itself: another process that took them (a stray engine of
/// the volume binding them late) is stopped, if an engine of the volume,
/// with the new one, whose paths it replaced. An engine that exits first
/// is answered with the last line of its log (refused when it found no
/// replica to serve).
async fn wait_up(
    started: &mut Started,
    sockets: &[PathBuf],
    log: &Path,
    volume: &str,
) -> Result<(), Error> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let pid = started.pid();
    let mut served = 0;
    while served < sockets.len() {
        if let Some(code) = started.exited(log) {
            let status = code.map_or("killed by a signal".to_string(), |c| {
                format!("exit code {c}")
            });
            let tail = std::fs::read_to_string(log).unwrap_or_default();
            let last = tail
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or_default()
                .to_string();
            let message = format!("the engine of {volume} exited ({status}): {last}");
            let no_replica = code == Some(i32::from(crate::engine::EXIT_NO_REPLICA));
            return Err(if no_replica {
                Error::Refused(message)
            } else {
                Error::Internal(message)
            });
        }
        if Instant::now() > deadline {
            started.kill();
            return Err(Error::Internal(format!(
                "the engine of {volume} did not come up"
            )));
        }
        let path = &sockets[served];
        // Bound but not listening yet, or not bound yet: waited for.
        match server_of(path).await {
            Ok(Some(p)) if p != pid => {
                started.kill();
                only_an_engine(p, path, volume)?;
                let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
                return Err(Error::Unavailable(format!(
                    "a stray engine of {volume} (process {p}) took {} as its engine started: both were stopped, and the start may be tried again",
                    path.display()
                )));
            }
            Ok(_) => {
                served += 1;
                continue;
            }
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}
