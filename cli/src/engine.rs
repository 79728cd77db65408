//! `ballast engine`: one volume's engine and its NBD socket, in a process
//! of its own so that restarting the node plugin never interrupts I/O.

use crate::args::EngineArgs;

/// Why the engine process ended; the node agent reads its exit status.
#[derive(Debug, thiserror::Error)]
pub enum EngineExit {
    /// None of the replicas it was given could be opened.
    #[error("{0}")]
    NoReplica(String),
    #[error("{0}")]
    Failed(String),
}

impl EngineExit {
    pub fn code(&self) -> u8 {
        match self {
            EngineExit::NoReplica(_) => ballast_node::engine::EXIT_NO_REPLICA,
            EngineExit::Failed(_) => 1,
        }
    }
}

impl From<String> for EngineExit {
    fn from(s: String) -> Self {
        EngineExit::Failed(s)
    }
}

/// The most async workers an engine runs when asked for none in
/// particular (`--workers 0`).
pub const DEFAULT_WORKERS_MAX: usize = 4;

/// The async worker threads an engine runs for `--workers asked` on a
/// machine of `cores`: as asked, or with 0 one per core, at most
/// `DEFAULT_WORKERS_MAX`. An engine serves one volume, and starts all
/// its workers at once, with a few threads more (an engine of three
/// replicas here: 9 threads with 2 workers, among them a sender per
/// replica). One worker per core of a node of 64 cores made some 70
/// threads per engine, 14,000 for 200 attached volumes in the engine
/// host's pod: far over a pod's limit of processes where its cluster sets
/// one (4,096 by default under OpenShift 4.11 and later), and the next
/// engine could not start.
pub fn workers(asked: u16, cores: usize) -> usize {
    match asked {
        0 => cores.clamp(1, DEFAULT_WORKERS_MAX),
        n => usize::from(n),
    }
}

/// How long a stopping engine waits for its I/O under way to end before
/// it closes its local replica clean (`Engine::close`).
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

pub async fn run(a: EngineArgs) -> Result<(), EngineExit> {
    // The lent replica's writes run on the async workers: one held on a
    // disk that hangs must not stop the others.
    let _nudger = ballast_node::nudge::Nudger::start(tokio::runtime::Handle::current());
    if a.size == 0 || !a.size.is_multiple_of(4096) {
        return Err(EngineExit::Failed(format!(
            "--size {} is not a positive multiple of 4096",
            a.size
        )));
    }
    // How this CPU takes a block's checksum is timed at its first use: here,
    // at the start, rather than in the volume's first write.
    let way = ballast_node::replica::SumWay::of_this_cpu();
    tracing::info!(volume = %a.volume, ?way, "block checksums");
    use ballast_node::engine::freshness::ControllerRecorder;
    use ballast_node::engine::{Engine, Recorder, ReplicaSet};
    let token = match &a.cluster_token_file {
        Some(path) => ballast::cluster_token::ClusterToken::read(path)
            .map_err(|e| EngineExit::Failed(format!("--cluster-token-file: {e}")))?,
        None => Default::default(),
    };
    // The node's file: a change of it reaches the engine's calls too.
    token.keep_reading();
    let (tls, wire) = tls(&a)?;
    let wire = wire.for_attachment(a.epoch);
    let on = tls.is_on();
    let member = ballast::tls::Member { token, tls };
    let controller_recorder = match (&a.controller, &a.node_id) {
        (Some(controller), Some(node)) => Some(std::sync::Arc::new(ControllerRecorder::new(
            controller, &a.volume, node, a.epoch, &member,
        )?)),
        _ => None,
    };
    let recorder = controller_recorder
        .clone()
        .map(|r| r as std::sync::Arc<dyn Recorder>);
    // A renewal: the node agent wrote the engine's new credentials into
    // --tls-dir; the replicas' connections and the controller's made after
    // it show them (the wire shares the gRPC sides' slot).
    let renew: ballast_node::frontend::control::Renew = match (&a.tls_dir, on) {
        (Some(dir), true) => {
            let (dir, tls) = (dir.clone(), member.tls.clone());
            Some(std::sync::Arc::new(move || {
                let credentials =
                    ballast::tls::Credentials::load(&dir).map_err(|e| format!("--tls-dir: {e}"))?;
                tls.renew(credentials).map_err(|e| e.to_string())
            }))
        }
        _ => None,
    };
    let recorded = ReplicaSet {
        generation: a.generation,
        replicas: a.current.iter().cloned().collect(),
    };
    let engine = Engine::start(
        &a.volume,
        a.size,
        &a.replicas,
        a.local.clone(),
        recorded,
        recorder,
        wire,
    )
    .await
    .map_err(|e| match e {
        ballast_node::engine::EngineError::NoReplica(_) => EngineExit::NoReplica(e.to_string()),
        e => EngineExit::Failed(e.to_string()),
    })?;
    engine.settle_from_stale(&a.stale).await;
    engine.watch_stalls(std::time::Duration::from_secs(a.replica_timeout));
    if let Some(dir) = a.local_dir.clone()
        && let Err(e) = engine.lend_local(dir, a.writeback_every).await
    {
        tracing::warn!(error = %e, "the local replica was not lent; its I/O goes through its server");
    }
    for m in engine.status().await {
        tracing::info!(replica = %m.name, addr = %m.addr, mode = %m.mode, error = ?m.error, "replica");
    }
    if let Some(path) = a.status_file.clone() {
        tokio::spawn(write_status(engine.clone(), path));
    }
    let exported = match &a.fuse_dir {
        Some(dir) => Some(block_device(&engine, dir, a.fuse_fd)?),
        None => None,
    };
    // With a control socket the export is the control socket's to end.
    let (_control, _fuse) = match a.control_socket.clone() {
        Some(path) => {
            let e = engine.clone();
            let task = tokio::spawn(async move {
                if let Err(err) =
                    ballast_node::frontend::control::serve(e, &path, exported, renew).await
                {
                    tracing::error!(socket = %path.display(), error = %err, "control socket failed");
                }
            });
            (Some(task), None)
        }
        None => (None, exported),
    };
    let socket = a.socket.clone();
    let engine_for_close = engine.clone();
    let served = tokio::select! {
        r = ballast_node::frontend::nbd::serve_unix(engine, &socket) => r.map_err(|e| format!("{}: {e}", socket.display())),
        _ = ballast::grpc::shutdown_signal() => Ok(()),
    };
    let _ = std::fs::remove_file(&socket);
    if let Some(path) = &a.control_socket {
        let _ = std::fs::remove_file(path);
    }
    // Told to stop: the local replica is closed clean, and no I/O follows.
    let _closed = engine_for_close.close(CLOSE_WAIT).await;
    Ok(served?)
}

/// The engine's TLS toward the controller and the replicas: the node's
/// credentials in --tls-dir, when given.
fn tls(
    a: &EngineArgs,
) -> Result<(ballast::tls::Tls, ballast_node::wire::tls::WireTls), EngineExit> {
    let Some(dir) = &a.tls_dir else {
        return Ok(Default::default());
    };
    let failed = |e: ballast::tls::TlsError| EngineExit::Failed(format!("--tls-dir: {e}"));
    let credentials = ballast::tls::Credentials::load(dir).map_err(failed)?;
    let node = a.node_id.as_deref().ok_or_else(|| {
        EngineExit::Failed("--tls-dir needs --node-id (the node whose credentials they are)".into())
    })?;
    let tls = ballast::tls::Tls::on(credentials.clone()).map_err(failed)?;
    let slot = tls
        .slot()
        .ok_or_else(|| EngineExit::Failed("--tls-dir: TLS is off".into()))?;
    let wire =
        ballast_node::wire::tls::WireTls::showing(&credentials, node, slot).map_err(failed)?;
    Ok((tls, wire))
}

/// Keeps the engine's status in `path` (for the node agent), written
/// anew on every change and every second, atomically.
async fn write_status(e: std::sync::Arc<ballast_node::engine::Engine>, path: std::path::PathBuf) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = e.changed.notified() => {}
        }
        let workers = tokio::runtime::Handle::current().metrics().num_workers();
        let status = serde_json::json!({
            "volume": e.volume, "replicas": e.status().await, "io": e.io(), "workers": workers
        });
        let tmp = path.with_extension("tmp");
        if std::fs::write(&tmp, status.to_string()).is_ok() {
            let _ = std::fs::rename(&tmp, &path);
        }
    }
}

/// The block device under `dir`: the one an engine that died served,
/// taken over through its FUSE connection `fd`, or a new one.
fn block_device(
    engine: &std::sync::Arc<ballast_node::engine::Engine>,
    dir: &std::path::Path,
    fd: Option<i32>,
) -> Result<ballast_node::frontend::blockdev::FuseMount, EngineExit> {
    use ballast_node::frontend::blockdev;
    if let Err(e) = blockdev::set_io_flusher() {
        tracing::warn!(error = %e, "cannot mark the engine an I/O flusher");
    }
    let rt = tokio::runtime::Handle::current();
    let m = match fd {
        Some(fd) => {
            // SAFETY: the node agent opened this descriptor for this
            // process alone; nothing else here owns it.
            let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
            blockdev::resume(engine.clone(), rt, dir, fd)
        }
        None => blockdev::mount(engine.clone(), rt, dir),
    }
    .map_err(|e| format!("FUSE at {}: {e}", dir.display()))?;
    tracing::info!(file = %m.file().display(), "serving the block-device file");
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engine_asked_for_no_number_of_workers_runs_one_per_core_up_to_a_few() {
        assert_eq!(workers(0, 1), 1);
        assert_eq!(workers(0, 2), 2);
        assert_eq!(workers(0, 64), DEFAULT_WORKERS_MAX);
        assert_eq!(workers(0, 0), 1);
        // As many as asked, whatever the cores.
        assert_eq!(workers(1, 64), 1);
        assert_eq!(workers(16, 2), 16);
    }
}
