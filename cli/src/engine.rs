//! `ballast engine`: one volume's engine and its NBD socket, in a process
//! of its own so that restarting the node plugin never interrupts I/O.

use crate::args::EngineArgs;

pub async fn run(a: EngineArgs) -> Result<(), String> {
    if a.size == 0 || !a.size.is_multiple_of(4096) {
        return Err(format!(
            "--size {} is not a positive multiple of 4096",
            a.size
        ));
    }
    let engine =
        ballast_node::engine::Engine::start(&a.volume, a.size, &a.replicas, a.local.clone())
            .await
            .map_err(|e| e.to_string())?;
    if let Some(dir) = a.local_dir.clone()
        && let Err(e) = engine.lend_local(dir, a.writeback_every).await
    {
        tracing::warn!(error = %e, "the local replica was not lent; its I/O goes through its server");
    }
    for m in engine.status().await {
        tracing::info!(replica = %m.name, addr = %m.addr, mode = %m.mode, error = ?m.error, "replica");
    }
    if let Some(path) = a.status_file.clone() {
        let e = engine.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = e.changed.notified() => {}
                }
                let status = serde_json::json!({"volume": e.volume, "replicas": e.status().await});
                let tmp = path.with_extension("tmp");
                if std::fs::write(&tmp, status.to_string()).is_ok() {
                    let _ = std::fs::rename(&tmp, &path);
                }
            }
        });
    }
    let _control = match a.control_socket.clone() {
        Some(path) => {
            let e = engine.clone();
            Some(tokio::spawn(async move {
                if let Err(err) = ballast_node::engine::control::serve(e, &path).await {
                    tracing::error!(socket = %path.display(), error = %err, "control socket failed");
                }
            }))
        }
        None => None,
    };
    let _fuse = match &a.fuse_dir {
        Some(dir) => {
            if let Err(e) = ballast_node::frontend::blockdev::set_io_flusher() {
                tracing::warn!(error = %e, "cannot mark the engine an I/O flusher");
            }
            let rt = tokio::runtime::Handle::current();
            let m = ballast_node::frontend::blockdev::mount(engine.clone(), rt, dir)
                .map_err(|e| format!("FUSE mount at {}: {e}", dir.display()))?;
            tracing::info!(file = %m.file().display(), "serving the block-device file");
            Some(m)
        }
        None => None,
    };
    let socket = a.socket.clone();
    let served = tokio::select! {
        r = ballast_node::frontend::nbd::serve_unix(engine, &socket) => r.map_err(|e| format!("{}: {e}", socket.display())),
        _ = ballast::grpc::shutdown_signal() => Ok(()),
    };
    let _ = std::fs::remove_file(&socket);
    if let Some(path) = &a.control_socket {
        let _ = std::fs::remove_file(path);
    }
    served
}
