//! The real `ballast controller` and `ballast node` processes on loopback:
//! registration, liveness after SIGKILL, the store lock, clean shutdown.

mod common;

use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::Signal;

#[test]
fn two_nodes_register_and_a_killed_node_turns_not_ready_then_ready_again() {
    let dir = tempfile::tempdir().unwrap();
    // Short timeout so the test is quick; the behaviour is the same at 30s.
    let ctl = start_controller(dir.path(), "2s");
    let agent = format!("http://{}", ctl.agent);
    let n1 = start_node(dir.path(), "node-1", &agent);
    let mut n2 = start_node(dir.path(), "node-2", &agent);

    for id in ["node-1", "node-2"] {
        let n = wait_for(
            Duration::from_secs(30),
            &format!("{id} registered and ready"),
            || node(&ctl.api, id).filter(node_is_up),
        );
        assert_eq!(n["spec"]["zone"], format!("zone-{id}"));
        assert!(
            n["spec"]["disks"]["disk-1"]["path"]
                .as_str()
                .unwrap()
                .ends_with("disk-1")
        );
        assert!(
            n["status"]["disks"]["disk-1"]["storageAvailable"]
                .as_u64()
                .unwrap()
                > 0
        );
    }
    let list = get_json(&format!("{}/v1/nodes", ctl.api)).unwrap();
    assert_eq!(list["items"].as_array().unwrap().len(), 2);

    // SIGKILL node-2: no goodbye, only silence.
    let killed_at = Instant::now();
    n2.proc.signal(Signal::SIGKILL);
    n2.proc
        .wait_exit(Duration::from_secs(5))
        .expect("node-2 died");
    wait_for(Duration::from_secs(30), "node-2 not ready", || {
        node(&ctl.api, "node-2").filter(|n| n["status"]["ready"] == false)
    });
    let took = killed_at.elapsed();
    // Not before the timeout: it was silent, not gone early.
    assert!(
        took >= Duration::from_millis(1500),
        "marked down after only {took:?}"
    );
    assert!(
        node_is_up(&node(&ctl.api, "node-1").unwrap()),
        "node-1 stays ready"
    );
    // The event is written after the status that it tells of.
    wait_for(Duration::from_secs(10), "a NodeDown event", || {
        event_reasons(&ctl.api, "node/node-2")
            .contains(&"NodeDown".to_string())
            .then_some(())
    });

    // Restart it with the same flags: ready again, same disk id.
    let since = chrono::Utc::now();
    let restarted = Proc::spawn(&n2.args, dir.path().join("node-2.again.log"));
    let n = wait_for(Duration::from_secs(30), "node-2 ready again", || {
        node(&ctl.api, "node-2").filter(|n| node_up_since(n, since))
    });
    assert_eq!(
        n["status"]["disks"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["disk-1"]
    );
    wait_for(Duration::from_secs(10), "a NodeReady event", || {
        event_reasons(&ctl.api, "node/node-2")
            .contains(&"NodeReady".to_string())
            .then_some(())
    });
    let reasons = event_reasons(&ctl.api, "node/node-2");
    assert_eq!(
        reasons,
        ["NodeRegistered", "NodeDown", "NodeReady"],
        "events of node-2"
    );
    drop((n1, restarted));
}

#[test]
fn a_second_controller_on_the_same_store_fails_at_once_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let first = start_controller(dir.path(), "30s");
    let args = controller_args(
        &first.store,
        &dir.path().join("second.sock"),
        free_addr(),
        free_addr(),
        "30s",
    );
    let mut second = Proc::spawn(&args, dir.path().join("second.log"));
    let status = second.proc_wait();
    assert!(!status.success());
    let log = second.log_text();
    assert!(log.contains("already open in another process"), "{log}");
    // The first is unaffected.
    assert!(get_json(&format!("{}/healthz", first.api)).is_some());
}

trait WaitExit {
    fn proc_wait(&mut self) -> std::process::ExitStatus;
}

impl WaitExit for Proc {
    fn proc_wait(&mut self) -> std::process::ExitStatus {
        self.wait_exit(Duration::from_secs(10))
            .expect("process exits at once")
    }
}

#[test]
fn sigterm_and_sigint_stop_the_daemons_cleanly_and_remove_their_sockets() {
    let dir = tempfile::tempdir().unwrap();
    let mut ctl = start_controller(dir.path(), "30s");
    let mut n = start_node(dir.path(), "node-1", &format!("http://{}", ctl.agent));
    wait_for(Duration::from_secs(30), "node-1 ready", || {
        node(&ctl.api, "node-1").filter(node_is_up)
    });
    assert!(n.socket.exists() && ctl.socket.exists());

    n.proc.signal(Signal::SIGINT);
    let s = n
        .proc
        .wait_exit(Duration::from_secs(10))
        .expect("node stops on SIGINT");
    assert!(s.success(), "node exit status {s}");
    assert!(!n.socket.exists(), "node socket removed");

    ctl.proc.signal(Signal::SIGTERM);
    let s = ctl
        .proc
        .wait_exit(Duration::from_secs(10))
        .expect("controller stops on SIGTERM");
    assert!(s.success(), "controller exit status {s}");
    assert!(!ctl.socket.exists(), "controller socket removed");
    assert!(ctl.proc.log_text().contains("controller stopped"));
}

#[test]
fn a_stale_socket_file_is_replaced_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("controller.sock");
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    assert!(sock.exists());
    let ctl = start_controller(dir.path(), "30s");
    let rt = runtime();
    let info = rt.block_on(async {
        let ch = ballast::grpc::unix_channel(&ctl.socket).unwrap();
        ballast::proto::csi::v1::identity_client::IdentityClient::new(ch)
            .get_plugin_info(ballast::proto::csi::v1::GetPluginInfoRequest {})
            .await
    });
    assert_eq!(info.unwrap().into_inner().name, "ballast.csi.dev");
}

#[test]
fn ballastctl_ends_quietly_when_its_reader_goes_away() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Command, Stdio};

    let dir = tempfile::tempdir().unwrap();
    let ctl = start_controller(dir.path(), "30s");
    for args in [&["setting", "list"][..], &["-o", "json", "setting", "list"]] {
        // The reader is gone before anything is printed: `| head -0`. Its
        // end of the pipe is closed before the child starts (closed after
        // the spawn, a fast child could print into the pipe first, and end
        // well).
        let (reader, writer) = nix::unistd::pipe().unwrap();
        drop(reader);
        let child = Command::new(BALLASTCTL)
            .arg("--api")
            .arg(&ctl.api)
            .args(args)
            .stdout(Stdio::from(writer))
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.is_empty(), "{args:?}: it said {err:?}");
        assert_eq!(
            out.status.signal(),
            Some(nix::libc::SIGPIPE),
            "{args:?}: ended by the broken pipe, as a filter does: {}",
            out.status
        );
    }
}

/// The API token changes without a restart: the controller reads its
/// `--api-token-file` again, takes each token of it (one per line), and
/// refuses one dropped from it, while it runs.
#[test]
fn the_api_token_changes_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("api-token");
    std::fs::write(&token, "the old token\n").unwrap();
    let ctl = start_controller_with(
        dir.path(),
        "30s",
        &["--api-token-file", token.to_str().unwrap()],
    );
    let set = |with: &str| {
        let mut args = vec!["--token", with];
        args.extend(["setting", "set", "replica-auto-balance", "best-effort"]);
        ballastctl(&ctl.api, &args)
    };
    assert!(set("the old token").0);
    let (ok, _, err) = set("the-new-token");
    assert!(!ok && err.contains("bearer token"), "{err}");
    // Both: the new one is taken once the file is read again.
    std::fs::write(&token, "the old token\nthe-new-token\n").unwrap();
    wait_for(Duration::from_secs(30), "the new token taken", || {
        set("the-new-token").0.then_some(())
    });
    assert!(set("the old token").0, "the old token is still in the file");
    // The new one alone: the old one is refused once it is read again.
    std::fs::write(&token, "the-new-token\n").unwrap();
    wait_for(Duration::from_secs(30), "the old token refused", || {
        (!set("the old token").0).then_some(())
    });
    assert!(set("the-new-token").0);
    let log = ctl.proc.log_text();
    assert_eq!(
        log.matches("the API token file changed").count(),
        2,
        "{log}"
    );
}

/// A controller with `--api-token-file`: ballastctl changes nothing without
/// the token, and changes what it is told with it (flag or environment);
/// reads need none; a `text/plain` POST is refused with 415.
#[test]
fn with_an_api_token_changes_need_it_and_a_text_plain_post_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("api-token");
    std::fs::write(&token, "t0ken-of-the-test\n").unwrap();
    let ctl = start_controller_with(
        dir.path(),
        "30s",
        &["--api-token-file", token.to_str().unwrap()],
    );
    let set = ["setting", "set", "replica-auto-balance", "best-effort"];
    let (ok, _, err) = ballastctl(&ctl.api, &set);
    assert!(!ok, "a change went through without the token");
    assert!(err.contains("bearer token"), "{err}");
    let (ok, out, _) = ballastctl(&ctl.api, &["setting", "get", "replica-auto-balance"]);
    assert!(ok && out.contains("disabled"), "reads need no token: {out}");

    let mut with_flag = vec!["--token", "t0ken-of-the-test"];
    with_flag.extend(set);
    let (ok, _, err) = ballastctl(&ctl.api, &with_flag);
    assert!(ok, "{err}");
    let out = std::process::Command::new(BALLASTCTL)
        .args([
            "--api",
            &ctl.api,
            "setting",
            "set",
            "replica-auto-balance",
            "least-effort",
        ])
        .env("BALLAST_API_TOKEN", "t0ken-of-the-test")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let (_, out, _) = ballastctl(&ctl.api, &["setting", "get", "replica-auto-balance"]);
    assert!(out.contains("least-effort"), "{out}");

    // What any web page may send: a text/plain POST, token or not.
    let rt = runtime();
    let status = rt.block_on(async {
        reqwest::Client::new()
            .post(format!("{}/v1/volumes", ctl.api))
            .header("content-type", "text/plain")
            .bearer_auth("t0ken-of-the-test")
            .body(r#"{"name": "v", "size": "1Gi"}"#)
            .send()
            .await
            .unwrap()
            .status()
    });
    assert_eq!(status.as_u16(), 415);
    let volumes = get_json(&format!("{}/v1/volumes", ctl.api)).unwrap();
    assert_eq!(
        volumes["items"].as_array().map(Vec::len),
        Some(0),
        "{volumes}"
    );
}
