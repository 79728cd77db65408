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
//! owns no state: everything is in the node plugin's files.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

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

/// Serves the engine host on `socket` until the process ends: each
/// request starts one engine of `exe`.
pub fn serve(socket: &Path, exe: &Path) -> Result<(), Error> {
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).map_err(|e| Error::disk(dir, e.to_string()))?;
    }
    let _ = std::fs::remove_file(socket);
    let listener = UnixListener::bind(socket).map_err(|e| Error::disk(socket, e.to_string()))?;
    tracing::info!(socket = %socket.display(), "engine host serving");
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
        let answer = match start(&conn, exe) {
            Ok(pid) => Answer::Started { pid },
            Err(error) => Answer::Refused { error },
        };
        if let Ok(line) = serde_json::to_string(&answer) {
            let _ = (&conn).write_all(format!("{line}\n").as_bytes());
        }
    }
    Ok(())
}

/// Reads one request (with the descriptor it carries, if any) and starts
/// its engine; its pid.
fn start(conn: &UnixStream, exe: &Path) -> Result<i32, String> {
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
    std::thread::spawn(move || {
        let code = child.wait().ok().and_then(|s| s.code()).unwrap_or(-1);
        tracing::info!(pid, code, "engine exited");
        let _ = std::fs::write(exit, code.to_string());
    });
    Ok(pid)
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
