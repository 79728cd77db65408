//! What the daemons ask of the kernel as they start (`ballast::limits`),
//! on real processes.

mod common;

use std::time::Duration;

use common::*;

/// Started with the soft limit of open files a container gets (1,024
/// under containerd 2), the controller and the node each raise it to
/// their hard limit (2^20 at most) as they start: a node keeps every
/// replica it serves open, two files per layer.
#[test]
fn the_controller_and_the_node_raise_a_containers_soft_limit_of_open_files() {
    let dir = tempfile::tempdir().unwrap();
    let (_, hard) = open_files_limits(std::process::id() as i32);
    let want = hard.min(ballast::limits::OPEN_FILES);
    assert!(
        want > CONTAINER_OPEN_FILES,
        "this process's hard limit of open files is {hard}, no more than a container's soft one: raise it (ulimit -Hn) to test the raise"
    );
    let (api, agent) = (free_addr(), free_addr());
    let socket = dir.path().join("controller.sock");
    let store = dir.path().join("store.redb");
    let args = controller_args(&store, &socket, api, agent, "30s");
    let proc = Proc::spawn_as_in_a_container(&args, dir.path().join("controller.log"));
    let ctl = ControllerProc::up(proc, args, socket, store);
    let node = start_node_by(
        Proc::spawn_as_in_a_container,
        dir.path(),
        "node-1",
        &format!("http://{}", ctl.agent),
        &[],
    );
    for (what, p) in [("controller", &ctl.proc), ("node", &node.proc)] {
        let got = wait_for_or(
            Duration::from_secs(30),
            &format!("the {what} to raise its soft limit of open files to {want}"),
            || {
                let (soft, h) = open_files_limits(p.pid());
                (soft == want).then_some(h)
            },
            || {
                format!(
                    "its limits: {:?}; its log:\n{}",
                    open_files_limits(p.pid()),
                    p.log_text()
                )
            },
        );
        assert_eq!(got, hard, "the {what}'s hard limit stays");
    }
}
