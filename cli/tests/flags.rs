//! Bad command lines: a non-zero exit and a message that says what is wrong.

mod common;

use std::process::Command;

use common::*;

/// Runs `ballast` with the words of `line` as its arguments.
fn run(line: &str) -> (i32, String) {
    let out = Command::new(BALLAST)
        .args(line.split_whitespace())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn an_unknown_flag_exits_non_zero_and_names_it() {
    let (code, text) =
        run("controller --store embedded:/tmp/x --csi-endpoint unix:///tmp/x.sock --colour red");
    assert_ne!(code, 0);
    assert!(text.contains("--colour"), "{text}");
}

#[test]
fn a_node_without_disk_exits_non_zero_and_says_disk_is_required() {
    let dir = tempfile::tempdir().unwrap();
    let (code, text) = run(&format!(
        "node \
         --node-id n1 \
         --controller http://127.0.0.1:1 \
         --csi-endpoint unix://{}/n.sock \
         --agent-listen 127.0.0.1:0 \
         --replica-listen 127.0.0.1:0 \
         --state-dir {}/state",
        dir.path().display(),
        dir.path().display()
    ));
    assert_ne!(code, 0);
    assert!(text.contains("--disk"), "{text}");
}

#[test]
fn a_node_with_a_missing_disk_directory_exits_non_zero_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-disk");
    let sock = format!("unix://{}", dir.path().join("n.sock").display());
    let (code, text) = run(&format!(
        "node \
         --node-id n1 \
         --disk {} \
         --controller http://127.0.0.1:1 \
         --csi-endpoint {} \
         --agent-listen 127.0.0.1:0 \
         --replica-listen 127.0.0.1:0 \
         --state-dir {}",
        missing.to_str().unwrap(),
        sock,
        dir.path().join("state").display()
    ));
    assert_ne!(code, 0);
    assert!(
        text.contains("no-such-disk") && text.contains("cannot open"),
        "{text}"
    );
}

#[test]
fn a_bad_node_id_and_a_relative_socket_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().to_str().unwrap();
    let (code, text) = run(&format!(
        "node \
         --node-id Node_1 \
         --disk {} \
         --controller http://127.0.0.1:1 \
         --csi-endpoint unix:///tmp/n.sock \
         --agent-listen 127.0.0.1:0 \
         --replica-listen 127.0.0.1:0",
        disk
    ));
    assert_ne!(code, 0);
    assert!(text.contains("--node-id"), "{text}");
    let (code, text) = run(&format!(
        "controller \
         --store embedded:{disk}/s.redb \
         --csi-endpoint unix://rel.sock \
         --api-listen 127.0.0.1:0 \
         --agent-listen 127.0.0.1:0"
    ));
    assert_ne!(code, 0);
    assert!(text.contains("unix:///absolute/path"), "{text}");
}

#[test]
fn a_node_refuses_to_register_an_unspecified_address_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let sock = format!("unix://{}", dir.path().join("n.sock").display());
    for (flag, line) in [
        (
            "--replica-listen",
            "--agent-listen 127.0.0.1:0 --replica-listen 0.0.0.0:9511",
        ),
        (
            "--agent-listen",
            "--agent-listen [::]:9510 --replica-listen 127.0.0.1:0",
        ),
    ] {
        let (code, text) = run(&format!(
            "node --node-id n1 --disk {} --controller http://127.0.0.1:1 --csi-endpoint {sock} {line}",
            dir.path().display()
        ));
        assert_eq!(code, 2, "{text}");
        assert!(
            text.contains(flag) && text.contains("not an address other nodes can reach"),
            "{text}"
        );
    }
}

#[test]
fn a_renewal_window_of_zero_days_is_refused_naming_the_flag() {
    let (code, text) = run(
        "controller --store embedded:/tmp/x --csi-endpoint unix:///tmp/x.sock \
         --renew-engine-certificates-days 0",
    );
    assert_ne!(code, 0);
    assert!(text.contains("--renew-engine-certificates-days"), "{text}");
    for command in [
        "controller --store embedded:/tmp/x --csi-endpoint unix:///tmp/x.sock",
        "node --node-id n1 --disk /tmp/x",
    ] {
        let (code, text) = run(&format!("{command} --renew-certificate-days 0"));
        assert_eq!(code, 2, "{text}");
        assert!(text.contains("--renew-certificate-days"), "{text}");
    }
}
