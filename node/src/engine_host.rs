//! The engine host: where a node's engines live when the node plugin must
//! be free to die (`ballast engine-host`, a pod of its own in Kubernetes,
//! as Longhorn's instance managers are). The node plugin asks it, over a
//! unix socket, to start an engine. The engine is the host's child, so a
//! crash of the node plugin's container, or a rollout of its DaemonSet,
//! leaves the volume served. The node plugin re-adopts the engine by its
//! pid file when it starts.
//!
//! The protocol is one request per connection: a JSON line
//! `{"args": [...], "log": "<path>"}`, with the FUSE connection of a block
//! device to take over attached (SCM_RIGHTS) when there is one. The answer
//! is `{"pid": N}` or `{"error": "..."}`. The host runs only
//! `ballast engine …`, with its output to the log. When the engine exits, its
//! exit code is written to `<log>.exit`, for the node plugin to read. It
//! owns no state: everything is in the node plugin's files. A connection
//! closed without a request is the node plugin asking who serves the
//! socket (the listener's pid, from the socket's peer credentials).
//!
//! **A new host takes over from an old one** (a rollout of the engine
//! host): the new one binds the same socket path, and the node plugin
//! moves the old one's engines to it one at a time (`engines`, "handover").
//! A host told to stop (SIGTERM) serves on, and ends once it has no engine
//! left.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// Where a started engine finds a block device it takes over (`--fuse-fd`).
pub const TAKEOVER_FD: i32 = 3;

#[derive(Debug, Serialize, Deserialize)]
struct Request {
    args: Vec<String>,
    log: PathBuf,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
enum Answer {
    Started { pid: i32 },
    Refused { error: String },
}

/// The file an engine's exit code is written to, beside its log.
pub fn exit_file(log: &Path) -> PathBuf {
    let mut name = log.as_os_str().to_owned();
    name.push(".exit");
    PathBuf::from(name)
}

/// Has the child started by `cmd` find `fd` at `at`.
pub fn pass_fd(cmd: &mut std::process::Command, fd: i32, at: i32) {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec this calls only dup2 and fcntl, which
    // are async-signal-safe, and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if fd == at {
                let flags = libc::fcntl(at, libc::F_GETFD);
                if flags < 0 || libc::fcntl(at, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(fd, at) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// An engine host: the engines it started, counted, so that a host told
/// to stop knows when it has none left.
pub struct Host {
    exe: PathBuf,
    socket: PathBuf,
    engines: Arc<AtomicUsize>,
}

/// How long a host told to stop waits for a new host to take its socket
/// before it ends with its engines still running (they end with it).
const AWAIT_SUCCESSOR: std::time::Duration = std::time::Duration::from_secs(10);

impl Host {
    /// A host on `socket` whose engines run `exe` (`ballast engine …`).
    pub fn new(exe: PathBuf, socket: PathBuf) -> Host {
        Host {
            exe,
            socket,
            engines: Arc::default(),
        }
    }

    /// Binds `socket`, taking it from a host already there (whose engines
    /// the node plugin then moves here), and serves it on a thread of its
    /// own: each request starts one engine.
    pub fn serve(&self) -> Result<(), Error> {
        let socket = self.socket.as_path();
        if let Some(dir) = socket.parent() {
            std::fs::create_dir_all(dir).map_err(|e| Error::disk(dir, e.to_string()))?;
        }
        let _ = std::fs::remove_file(socket);
        let listener =
            UnixListener::bind(socket).map_err(|e| Error::disk(socket, e.to_string()))?;
        tracing::info!(socket = %socket.display(), "engine host serving");
        let (exe, engines) = (self.exe.clone(), self.engines.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let conn = match conn {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "engine host: a connection failed");
                        continue;
                    }
                };
                // A client that says nothing does not hold up the next one.
                let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(10)));
                let answer = match start(&conn, &exe, &engines) {
                    Ok(Some(pid)) => Answer::Started { pid },
                    Ok(None) => continue, // asked who serves: its peer credentials said
                    Err(error) => Answer::Refused { error },
                };
                if let Ok(line) = serde_json::to_string(&answer) {
                    let _ = (&conn).write_all(format!("{line}\n").as_bytes());
                }
            }
        });
        Ok(())
    }

    /// How many of the engines it started still run.
    pub fn engines(&self) -> usize {
        self.engines.load(Ordering::SeqCst)
    }

    /// For a host told to stop: returns once no engine it started runs,
    /// each handed over to the host that took the socket (or ended).
    /// Serving goes on meanwhile. When no other host takes the socket
    /// within [`AWAIT_SUCCESSOR`], it returns with its engines running
    /// (they end with the host's pod, and start again, after a crash,
    /// under the next host).
    pub async fn until_empty(&self) {
        let told_at = tokio::time::Instant::now();
        let mut told = usize::MAX;
        loop {
            let n = self.engines();
            if n == 0 {
                tracing::info!("engine host: no engine left, stopping");
                return;
            }
            let successor = serving_pid(&self.socket)
                .await
                .filter(|p| *p != std::process::id() as i32);
            if successor.is_none() && told_at.elapsed() > AWAIT_SUCCESSOR {
                tracing::warn!(
                    engines = n,
                    "engine host stopping: no new host took its socket, and its engines end with it"
                );
                return;
            }
            if n != told && successor.is_some() {
                tracing::info!(
                    engines = n,
                    successor,
                    "engine host stopping once its engines are handed over to the new host"
                );
                told = n;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
}

/// How long a look at who listens on a unix socket waits for its
/// connection to be taken.
pub const LISTENER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// The process that listens on the unix socket at `path`, from the peer
/// credentials of a connection to it (None: it is in a PID namespace this
/// process does not see). An error when nothing listens there, or when
/// the connection is not taken within `limit` (a listener that hangs).
pub async fn listener_pid(path: &Path, limit: std::time::Duration) -> std::io::Result<Option<i32>> {
    let connect = tokio::net::UnixStream::connect(path);
    let conn = tokio::time::timeout(limit, connect)
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    Ok(conn.peer_cred()?.pid().filter(|p| *p > 0))
}

/// The pid of the engine host listening on `socket` now (None: no host
/// listens there, or it takes no connection in [`LISTENER_TIMEOUT`]).
pub async fn serving_pid(socket: &Path) -> Option<i32> {
    listener_pid(socket, LISTENER_TIMEOUT).await.ok().flatten()
}

/// Reads one request (with the descriptor it carries, if any) and starts
/// its engine; its pid (None: the connection was closed without one).
fn start(conn: &UnixStream, exe: &Path, engines: &Arc<AtomicUsize>) -> Result<Option<i32>, String> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    let mut buf = vec![0u8; 64 << 10];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let msg = recvmsg::<()>(
        conn.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(|e| format!("reading the request: {e}"))?;
    let mut fd: Option<OwnedFd> = None;
    for c in msg.cmsgs().map_err(|e| e.to_string())? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            for raw in fds {
                // SAFETY: the kernel just gave this process the descriptor.
                fd.get_or_insert(unsafe { OwnedFd::from_raw_fd(raw) });
            }
        }
    }
    let n = msg.bytes;
    if n == 0 && fd.is_none() {
        return Ok(None);
    }
    let mut text = String::from_utf8_lossy(&buf[..n]).into_owned();
    // A long request may come in more than one read.
    if !text.ends_with('\n') {
        let mut rest = String::new();
        BufReader::new(conn)
            .read_line(&mut rest)
            .map_err(|e| format!("reading the request: {e}"))?;
        text.push_str(&rest);
    }
    let req: Request =
        serde_json::from_str(text.trim()).map_err(|e| format!("a malformed request: {e}"))?;
    if req.args.first().map(String::as_str) != Some("engine") {
        return Err(format!(
            "args: only `ballast engine …` runs here, not {:?}",
            req.args.first()
        ));
    }
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&req.log)
        .map_err(|e| format!("{}: {e}", req.log.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(exit_file(&req.log));
    let mut cmd = std::process::Command::new(exe);
    cmd.args(&req.args)
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err);
    if let Some(fd) = &fd {
        pass_fd(&mut cmd, fd.as_raw_fd(), TAKEOVER_FD);
    }
    let mut child = cmd.spawn().map_err(|e| format!("cannot start: {e}"))?;
    drop(fd);
    let pid = child.id() as i32;
    tracing::info!(pid, args = ?req.args, "engine started");
    let exit = exit_file(&req.log);
    engines.fetch_add(1, Ordering::SeqCst);
    let engines = engines.clone();
    std::thread::spawn(move || {
        let code = child.wait().ok().and_then(|s| s.code()).unwrap_or(-1);
        tracing::info!(pid, code, "engine exited");
        let _ = std::fs::write(exit, code.to_string());
        engines.fetch_sub(1, Ordering::SeqCst);
    });
    Ok(Some(pid))
}

/// Asks the engine host at `socket` to start `ballast` with `args`, its
/// output to `log`, taking over `fd` when given; the engine's pid.
pub async fn spawn(
    socket: &Path,
    args: Vec<String>,
    log: &Path,
    fd: Option<&OwnedFd>,
) -> Result<i32, Error> {
    let line = serde_json::to_string(&Request {
        args,
        log: log.to_path_buf(),
    })
    .map_err(|e| Error::Internal(e.to_string()))?;
    let socket = socket.to_path_buf();
    let fd = fd
        .map(|f| f.try_clone())
        .transpose()
        .map_err(|e| Error::Internal(e.to_string()))?;
    let unreachable = |e: String| Error::Unavailable(format!("the engine host: {e}"));
    tokio::task::spawn_blocking(move || {
        use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
        let conn = UnixStream::connect(&socket)
            .map_err(|e| unreachable(format!("{}: {e}", socket.display())))?;
        conn.set_read_timeout(Some(std::time::Duration::from_secs(20)))
            .map_err(|e| unreachable(e.to_string()))?;
        let bytes = format!("{line}\n");
        let fds: Vec<i32> = fd.iter().map(|f| f.as_raw_fd()).collect();
        let cmsgs: Vec<ControlMessage> = if fds.is_empty() {
            Vec::new()
        } else {
            vec![ControlMessage::ScmRights(&fds)]
        };
        let sent = sendmsg::<()>(
            conn.as_raw_fd(),
            &[std::io::IoSlice::new(bytes.as_bytes())],
            &cmsgs,
            MsgFlags::empty(),
            None,
        )
        .map_err(|e| unreachable(e.to_string()))?;
        if sent < bytes.len() {
            (&conn)
                .write_all(&bytes.as_bytes()[sent..])
                .map_err(|e| unreachable(e.to_string()))?;
        }
        let mut answer = String::new();
        BufReader::new(&conn)
            .read_line(&mut answer)
            .map_err(|e| unreachable(e.to_string()))?;
        match serde_json::from_str::<Answer>(answer.trim()) {
            Ok(Answer::Started { pid }) => Ok(pid),
            Ok(Answer::Refused { error }) => {
                Err(Error::Internal(format!("the engine host: {error}")))
            }
            Err(e) => Err(unreachable(format!("a malformed answer {answer:?}: {e}"))),
        }
    })
    .await
    .map_err(|e| Error::Internal(e.to_string()))?
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host whose "engines" are `sleep 60`, on a socket in `dir`.
    fn host_in(dir: &Path) -> Host {
        let exe = dir.join("engine.sh");
        std::fs::write(&exe, "#!/bin/sh\nexec sleep 60\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let host = Host::new(exe, dir.join("host.sock"));
        host.serve().unwrap();
        host
    }

    #[tokio::test]
    async fn a_host_told_to_stop_waits_for_a_successor_only_while_it_has_engines() {
        let dir = tempfile::tempdir().unwrap();
        let host = host_in(dir.path());
        // It serves the socket itself: no successor.
        assert_eq!(
            serving_pid(&host.socket).await,
            Some(std::process::id() as i32)
        );
        // With no engine, it stops at once.
        tokio::time::timeout(std::time::Duration::from_secs(1), host.until_empty())
            .await
            .expect("a host with no engine stops at once");
        let log = dir.path().join("engine.log");
        let pid = spawn(&host.socket, vec!["engine".into()], &log, None)
            .await
            .unwrap();
        assert_eq!(host.engines(), 1);
        // With one, and no other host on the socket, it waits for one for
        // a while, then stops with its engine still running.
        let began = std::time::Instant::now();
        host.until_empty().await;
        assert!(began.elapsed() >= AWAIT_SUCCESSOR, "{:?}", began.elapsed());
        assert_eq!(host.engines(), 1);
        // The engine ends: the count follows, and its exit is written.
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        for _ in 0..100 {
            if host.engines() == 0 && exit_file(&log).exists() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert_eq!(host.engines(), 0);
        assert!(exit_file(&log).exists());
    }

    #[tokio::test]
    async fn only_ballast_engine_runs_under_a_host() {
        let dir = tempfile::tempdir().unwrap();
        let host = host_in(dir.path());
        let log = dir.path().join("other.log");
        let refused = spawn(&host.socket, vec!["node".into()], &log, None).await;
        assert!(
            refused
                .as_ref()
                .is_err_and(|e| e.to_string().contains("only `ballast engine")),
            "{refused:?}"
        );
        assert_eq!(host.engines(), 0);
    }
}
