//! The CSI conformance checks of `tests/sanity` against the sockets of a
//! real controller and a real node.

mod common;

use std::time::Duration;

use ballast_sanity::{Expectations, Target, controller_checks, identity_checks, node_checks};
use common::*;

fn check(socket: &std::path::Path, target: Target, ready: bool) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let outcomes = rt.block_on(async {
        let ch = ballast::grpc::unix_channel(socket).unwrap();
        let exp = Expectations {
            target,
            driver_name: ballast::DRIVER_NAME.into(),
            ready: Some(ready),
            node_id: None,
        };
        identity_checks(&ch, &exp).await
    });
    assert!(!outcomes.is_empty());
    let failures: Vec<String> = outcomes
        .iter()
        .filter_map(|o| o.failure.as_ref().map(|f| format!("{}: {f}", o.name)))
        .collect();
    assert!(
        failures.is_empty(),
        "{target:?} failed:\n{}",
        failures.join("\n")
    );
}

#[test]
fn identity_checks_pass_on_the_controller_and_node_sockets() {
    let dir = tempfile::tempdir().unwrap();
    let (ctl, n) = controller_with_one_node(dir.path());
    check(&ctl.socket, Target::Controller, true);
    check(&n.socket, Target::Node, true);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let run = |socket: &std::path::Path| {
        rt.block_on(async {
            let ch = ballast::grpc::unix_channel(socket).unwrap();
            node_checks(&ch).await
        })
    };
    let failures: Vec<String> = run(&n.socket)
        .iter()
        .filter_map(|o| o.failure.as_ref().map(|f| format!("{}: {f}", o.name)))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The controller socket serves no Node service: the checks fail there.
    assert!(run(&ctl.socket).iter().all(|o| o.failure.is_some()));
}

#[test]
fn a_node_that_has_not_registered_probes_not_ready_and_the_checks_see_it() {
    let dir = tempfile::tempdir().unwrap();
    // A controller address where nothing listens.
    let nobody = format!("http://{}", free_addr());
    let n = start_node(dir.path(), "node-1", &nobody);
    wait_for(Duration::from_secs(30), "node socket", || {
        n.socket.exists().then_some(())
    });
    check(&n.socket, Target::Node, false);
    // The same checks, expecting ready, must fail: the check can fail.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let outcomes = rt.block_on(async {
        let ch = ballast::grpc::unix_channel(&n.socket).unwrap();
        let exp = Expectations {
            target: Target::Node,
            driver_name: ballast::DRIVER_NAME.into(),
            ready: Some(true),
            node_id: None,
        };
        identity_checks(&ch, &exp).await
    });
    assert!(outcomes.iter().any(|o| {
        o.failure
            .as_deref()
            .is_some_and(|f| f.contains("ready=false"))
    }));
}

#[test]
fn the_checks_fail_against_the_wrong_role_or_name() {
    let dir = tempfile::tempdir().unwrap();
    let ctl = start_controller(dir.path(), "30s");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let outcomes = rt.block_on(async {
        let ch = ballast::grpc::unix_channel(&ctl.socket).unwrap();
        let exp = Expectations {
            target: Target::Node,
            driver_name: "other.csi.dev".into(),
            ready: None,
            node_id: None,
        };
        identity_checks(&ch, &exp).await
    });
    let failed: Vec<&str> = outcomes
        .iter()
        .filter(|o| o.failure.is_some())
        .map(|o| o.name)
        .collect();
    assert!(
        failed.iter().any(|n| n.contains("GetPluginInfo")),
        "{failed:?}"
    );
    assert!(
        failed.iter().any(|n| n.contains("GetPluginCapabilities")),
        "{failed:?}"
    );
}

#[test]
fn controller_checks_pass_against_a_controller_with_a_node_and_fail_against_a_node_socket() {
    let dir = tempfile::tempdir().unwrap();
    let (ctl, n) = controller_with_one_node(dir.path());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let run = |socket: &std::path::Path| {
        rt.block_on(async {
            let ch = ballast::grpc::unix_channel(socket).unwrap();
            let exp = Expectations {
                target: Target::Controller,
                driver_name: ballast::DRIVER_NAME.into(),
                ready: Some(true),
                node_id: Some("node-1".into()),
            };
            controller_checks(&ch, &exp).await
        })
    };
    let outcomes = run(&ctl.socket);
    assert_eq!(outcomes.len(), 5, "the publish checks ran too");
    let failures: Vec<String> = outcomes
        .iter()
        .filter_map(|o| o.failure.as_ref().map(|f| format!("{}: {f}", o.name)))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Nothing the checks made is left.
    let left = get_json(&format!("{}/v1/volumes", ctl.api)).unwrap();
    assert_eq!(left["items"].as_array().map(Vec::len), Some(0), "{left}");
    // A node socket serves no Controller service: every check fails.
    let outcomes = run(&n.socket);
    assert!(outcomes.iter().all(|o| o.failure.is_some()), "{outcomes:?}");
}
