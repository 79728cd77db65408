//! The engine's control socket, `<state-dir>/frontends/<volume>.ctl`: the
//! node agent asks a running engine to add or remove a replica, and to
//! export the volume as a file for a loop device (FUSE) or stop. One JSON
//! request per line, one JSON answer per line:
//! `{"op":"add","replica":"NAME@HOST:PORT","source":"NAME"}`,
//! `{"op":"remove","replica":"NAME"}`, `{"op":"snapshot","snapshot":"ID"}`
//! (every rw replica frozen at one point as that user snapshot),
//! `{"op":"grow","size":BYTES}` (the volume grows while it serves),
//! `{"op":"merge","replica":"NAME","keep":["ID"],"rate":BYTES}` (the lent
//! local replica's layers no snapshot needs are merged),
//! `{"op":"export","dir":"/path"}` (the
//! file is `<dir>/volume`), `{"op":"unexport"}`, `{"op":"device"}` (the
//! export's FUSE connection, passed as a file descriptor with the answer,
//! which the node agent keeps so that an engine started after a crash
//! takes it over), `{"op":"credentials"}` (the engine reads its
//! credentials again, which the node agent renewed in its `--tls-dir`, and
//! shows them from its next connection on) or `{"op":"ping"}` (the node
//! agent's health check); the
//! answer is
//! `{"ok":true}` or
//! `{"kind":"busy|unreachable|refused|invalid|failed","error":"..."}`.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use crate::engine::{Engine, EngineError, ReplicaAddr};

#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum ControlRequest {
    Add {
        replica: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        source: Option<String>,
        /// Bytes per second the rebuild copies, over the network or within
        /// the node; 0 (or absent, from a node plugin before it): no limit.
        #[serde(default, skip_serializing_if = "is_zero")]
        bytes_per_second: u64,
    },
    Remove {
        replica: String,
    },
    Snapshot {
        snapshot: String,
    },
    Grow {
        size: u64,
    },
    Merge {
        replica: String,
        keep: Vec<String>,
        rate: u64,
    },
    Export {
        dir: std::path::PathBuf,
    },
    Unexport,
    Device,
    Credentials,
    Ping,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// How the engine takes its renewed credentials (None: it runs without
/// TLS).
pub type Renew = Option<Arc<dyn Fn() -> Result<(), String> + Send + Sync>>;

/// The volume's FUSE export, while there is one.
type Export = Arc<std::sync::Mutex<Option<super::blockdev::FuseMount>>>;

/// Why a control request failed, for the node agent to answer with the
/// right code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailureKind {
    /// Another rebuild runs; try again later.
    Busy,
    /// A replica could not be reached, or the engine itself (it ended,
    /// and may be started again): worth trying again.
    Unreachable,
    /// Valid, but refused as things stand (the last rw replica).
    Refused,
    /// The request itself is wrong.
    Invalid,
    /// A replica's data failed its checksums (found by a merge).
    Corrupt,
    Failed,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ControlError {
    pub kind: FailureKind,
    #[serde(rename = "error")]
    pub message: String,
}

impl ControlError {
    fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        ControlError {
            kind,
            message: message.into(),
        }
    }
}

impl From<EngineError> for ControlError {
    fn from(e: EngineError) -> Self {
        let kind = match e {
            EngineError::Busy(_) | EngineError::Filling { .. } => FailureKind::Busy,
            // Each may pass: a node comes back, space is freed; with no
            // replica usable the volume waits for one to come back.
            EngineError::Unreachable { .. }
            | EngineError::NoSpace(_)
            | EngineError::NoReplica(_) => FailureKind::Unreachable,
            EngineError::Refused { .. } => FailureKind::Refused,
            EngineError::Invalid(_) => FailureKind::Invalid,
            EngineError::FoundCorrupt { .. } => FailureKind::Corrupt,
            _ => FailureKind::Failed,
        };
        ControlError::new(kind, e.to_string())
    }
}

/// Answers one request; a `device` request's answer carries the export's
/// FUSE connection.
async fn handle(
    engine: &Arc<Engine>,
    export: &Export,
    renew: &Renew,
    line: &str,
) -> Result<Option<OwnedFd>, ControlError> {
    let invalid = |m: String| ControlError::new(FailureKind::Invalid, m);
    let failed = |m: String| ControlError::new(FailureKind::Failed, m);
    let req: ControlRequest =
        serde_json::from_str(line).map_err(|e| invalid(format!("request: {e}")))?;
    match req {
        ControlRequest::Add {
            replica,
            source,
            bytes_per_second,
        } => {
            let at: ReplicaAddr = replica.parse().map_err(invalid)?;
            engine.add_replica(at, source, bytes_per_second).await?;
            Ok(None)
        }
        ControlRequest::Remove { replica } => {
            engine.remove_replica(&replica).await?;
            Ok(None)
        }
        ControlRequest::Snapshot { snapshot } => {
            if !crate::replica::valid_snapshot_id(&snapshot) {
                return Err(invalid(format!("{snapshot:?} is not a snapshot id")));
            }
            engine.snapshot(Some(&snapshot)).await?;
            Ok(None)
        }
        ControlRequest::Grow { size } => {
            engine.grow(size).await?;
            let current = export.lock().map_err(|_| failed("poisoned".into()))?;
            if let Some(m) = current.as_ref() {
                m.size_changed()
                    .map_err(|e| failed(format!("telling FUSE the new size: {e}")))?;
            }
            Ok(None)
        }
        ControlRequest::Merge {
            replica,
            keep,
            rate,
        } => {
            engine.merge(&replica, keep, rate).await?;
            Ok(None)
        }
        ControlRequest::Ping => Ok(None),
        ControlRequest::Credentials => {
            let renew = renew
                .as_ref()
                .ok_or_else(|| invalid("this engine runs without TLS".into()))?;
            renew().map_err(failed)?;
            tracing::info!(volume = %engine.volume, "renewed the engine's certificate");
            Ok(None)
        }
        ControlRequest::Device => {
            let current = export.lock().map_err(|_| failed("poisoned".into()))?;
            let m = current
                .as_ref()
                .ok_or_else(|| invalid("the volume is not exported".into()))?;
            let fd = m
                .device()
                .try_clone_to_owned()
                .map_err(|e| failed(format!("dup of the FUSE device: {e}")))?;
            Ok(Some(fd))
        }
        ControlRequest::Export { dir } => {
            let (engine, export) = (engine.clone(), export.clone());
            let rt = tokio::runtime::Handle::current();
            tokio::task::spawn_blocking(move || {
                let mut current = export.lock().map_err(|_| failed("poisoned".into()))?;
                match current.as_ref() {
                    Some(m) if m.dir == dir => return Ok(None),
                    Some(m) => {
                        return Err(invalid(format!("already exported at {}", m.dir.display())));
                    }
                    None => {}
                }
                if let Err(e) = super::blockdev::set_io_flusher() {
                    tracing::warn!(error = %e, "cannot mark the engine an I/O flusher");
                }
                let m = super::blockdev::mount(engine, rt, &dir)
                    .map_err(|e| failed(format!("FUSE mount at {}: {e}", dir.display())))?;
                tracing::info!(file = %m.file().display(), "serving the block-device file");
                *current = Some(m);
                Ok(None)
            })
            .await
            .map_err(|e| failed(e.to_string()))?
        }
        ControlRequest::Unexport => {
            let export = export.clone();
            tokio::task::spawn_blocking(move || {
                let mut current = export.lock().map_err(|_| failed("poisoned".into()))?;
                let Some(m) = current.as_mut() else {
                    return Ok(None);
                };
                // Kept, and served, when it cannot go yet: the next call
                // tries again (dropped, it would go lazily while a holder
                // of its file still wrote through it).
                m.unmount()
                    .map_err(|e| failed(format!("FUSE unmount of {}: {e}", m.dir.display())))?;
                *current = None;
                Ok(None)
            })
            .await
            .map_err(|e| failed(e.to_string()))?
        }
    }
}

/// Serves the control socket until the task is dropped. `exported` is an
/// export the engine already serves (one it took over after a crash).
pub async fn serve(
    engine: Arc<Engine>,
    path: &Path,
    exported: Option<super::blockdev::FuseMount>,
    renew: Renew,
) -> std::io::Result<()> {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    let export: Export = Arc::new(std::sync::Mutex::new(exported));
    loop {
        // A failed accept (a peer gone before it was accepted, no file
        // descriptor free for a moment) must not end the control socket.
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "control socket accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let (engine, export, renew) = (engine.clone(), export.clone(), renew.clone());
        tokio::spawn(async move {
            let (rd, mut wr) = stream.into_split();
            let mut lines = BufReader::new(rd).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let (answer, fd) = match handle(&engine, &export, &renew, &line).await {
                    Ok(fd) => (serde_json::json!({"ok": true}), fd),
                    Err(e) => (serde_json::to_value(&e).unwrap_or_default(), None),
                };
                if let Some(fd) = fd {
                    let line = format!("{answer}\n");
                    if send_with_fd(wr.as_ref(), line.as_bytes(), &fd)
                        .await
                        .is_err()
                    {
                        return;
                    }
                    continue;
                }
                if wr
                    .write_all(format!("{answer}\n").as_bytes())
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
    }
}

/// Sends one request to the engine behind `path` and waits for its answer.
pub async fn call(path: &Path, req: &ControlRequest) -> Result<(), ControlError> {
    // An engine that is not there, or ends before it answers, may be
    // started again (a crash): worth trying again.
    let gone = |m: String| ControlError::new(FailureKind::Unreachable, m);
    let stream = UnixStream::connect(path).await.map_err(|e| {
        gone(format!(
            "the engine's control socket {}: {e}",
            path.display()
        ))
    })?;
    let (rd, mut wr) = stream.into_split();
    let line = serde_json::to_string(req)
        .map_err(|e| ControlError::new(FailureKind::Failed, e.to_string()))?;
    wr.write_all(format!("{line}\n").as_bytes())
        .await
        .map_err(|e| gone(format!("the engine's control socket: {e}")))?;
    let mut lines = BufReader::new(rd).lines();
    let answer = lines
        .next_line()
        .await
        .map_err(|e| gone(format!("the engine's control socket: {e}")))?
        .ok_or_else(|| gone("the engine closed its control socket before it answered".into()))?;
    if let Ok(e) = serde_json::from_str::<ControlError>(&answer) {
        return Err(e);
    }
    Ok(())
}

/// Writes `bytes` with `fd` attached (SCM_RIGHTS).
async fn send_with_fd(sock: &UnixStream, bytes: &[u8], fd: &OwnedFd) -> std::io::Result<()> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    let fds = [fd.as_raw_fd()];
    loop {
        sock.writable().await?;
        let sent = sock.try_io(tokio::io::Interest::WRITABLE, || {
            sendmsg::<()>(
                sock.as_raw_fd(),
                &[std::io::IoSlice::new(bytes)],
                &[ControlMessage::ScmRights(&fds)],
                MsgFlags::empty(),
                None,
            )
            .map_err(std::io::Error::from)
        });
        match sent {
            Ok(n) if n == bytes.len() => return Ok(()),
            Ok(_) => return Err(std::io::Error::other("short write on the control socket")),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Asks the engine behind `path` for its export's FUSE connection.
pub async fn device(path: &Path) -> Result<OwnedFd, ControlError> {
    let path = path.to_path_buf();
    let failed = |m: String| ControlError::new(FailureKind::Failed, m);
    // As in `call`: an engine not there, or ending before it answers.
    let gone = |m: String| ControlError::new(FailureKind::Unreachable, m);
    tokio::task::spawn_blocking(move || {
        use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
        use std::io::Write;
        let mut s = std::os::unix::net::UnixStream::connect(&path).map_err(|e| {
            gone(format!(
                "the engine's control socket {}: {e}",
                path.display()
            ))
        })?;
        s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .map_err(|e| failed(e.to_string()))?;
        let line =
            serde_json::to_string(&ControlRequest::Device).map_err(|e| failed(e.to_string()))?;
        s.write_all(format!("{line}\n").as_bytes())
            .map_err(|e| gone(format!("the engine's control socket: {e}")))?;
        let mut buf = vec![0u8; 4096];
        let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
        let mut iov = [std::io::IoSliceMut::new(&mut buf)];
        let msg = recvmsg::<()>(
            s.as_fd().as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(|e| gone(format!("reading the answer: {e}")))?;
        let mut fd = None;
        for c in msg.cmsgs().map_err(|e| failed(e.to_string()))? {
            if let ControlMessageOwned::ScmRights(fds) = c {
                for raw in fds {
                    // SAFETY: the kernel just gave this process the
                    // descriptor; nothing else owns it.
                    let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                    fd.get_or_insert(owned);
                }
            }
        }
        let n = msg.bytes;
        if n == 0 && fd.is_none() {
            return Err(gone(
                "the engine closed its control socket before it answered".into(),
            ));
        }
        let answer = String::from_utf8_lossy(&buf[..n]).into_owned();
        if let Ok(e) = serde_json::from_str::<ControlError>(answer.trim()) {
            return Err(e);
        }
        fd.ok_or_else(|| failed("the engine sent no descriptor".into()))
    })
    .await
    .map_err(|e| failed(e.to_string()))?
}
