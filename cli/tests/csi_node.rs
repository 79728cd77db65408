//! The CSI Node service end to end, as root, as a CO drives it: a real
//! controller and node, CreateVolume and ControllerPublishVolume on the
//! controller socket, then NodeStage/NodePublish on the node socket (FUSE
//! export, loop device, ext4, bind mounts), files written through the
//! published path, everything torn down, published and staged again, and
//! the files verified. Mounts and loop devices are cleaned up even when a
//! test fails.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ballast::proto::csi::v1::controller_client::ControllerClient;
use ballast::proto::csi::v1::node_client::NodeClient;
use ballast::proto::csi::v1::volume_capability::{self, AccessType, access_mode::Mode};
use ballast::proto::csi::v1::{
    CapacityRange, ControllerPublishVolumeRequest, ControllerUnpublishVolumeRequest,
    CreateVolumeRequest, DeleteVolumeRequest, NodeGetInfoRequest, NodeGetVolumeStatsRequest,
    NodeGetVolumeStatsResponse, NodePublishVolumeRequest, NodeStageVolumeRequest,
    NodeUnpublishVolumeRequest, NodeUnstageVolumeRequest, VolumeCapability, VolumeUsage,
    volume_usage,
};
use common::*;
use tonic::Code;
use tonic::transport::Channel;

const SIZE: i64 = 64 << 20;

fn cap(block: bool) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(if block {
            AccessType::Block(volume_capability::BlockVolume {})
        } else {
            AccessType::Mount(volume_capability::MountVolume {
                fs_type: "ext4".into(),
                ..Default::default()
            })
        }),
        access_mode: Some(volume_capability::AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

/// A block or mount volume's capability in access mode `mode`.
fn cap_as(block: bool, mode: Mode) -> VolumeCapability {
    let mut c = cap(block);
    c.access_mode = Some(volume_capability::AccessMode { mode: mode as i32 });
    c
}

struct Csi {
    rt: tokio::runtime::Runtime,
    ctl: ControllerClient<Channel>,
    node: NodeClient<Channel>,
}

impl Csi {
    fn create(&mut self, name: &str, block: bool) {
        self.create_with(name, block, 1);
    }

    /// `create`, with `replicas` replicas.
    fn create_with(&mut self, name: &str, block: bool, replicas: usize) {
        let req = CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(CapacityRange {
                required_bytes: SIZE,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![cap(block)],
            parameters: HashMap::from([("numberOfReplicas".into(), replicas.to_string())]),
            ..Default::default()
        };
        self.rt.block_on(self.ctl.create_volume(req)).unwrap();
    }

    fn publish(&mut self, name: &str, block: bool) -> HashMap<String, String> {
        self.publish_as(name, block, false).unwrap()
    }

    fn publish_as(
        &mut self,
        name: &str,
        block: bool,
        readonly: bool,
    ) -> Result<HashMap<String, String>, tonic::Status> {
        let req = ControllerPublishVolumeRequest {
            volume_id: name.into(),
            node_id: "node-1".into(),
            volume_capability: Some(cap(block)),
            readonly,
            ..Default::default()
        };
        self.rt
            .block_on(self.ctl.controller_publish_volume(req))
            .map(|r| r.into_inner().publish_context)
    }

    fn unpublish(&mut self, name: &str) {
        let req = ControllerUnpublishVolumeRequest {
            volume_id: name.into(),
            node_id: "node-1".into(),
            ..Default::default()
        };
        self.rt
            .block_on(self.ctl.controller_unpublish_volume(req))
            .unwrap();
    }

    fn stage(
        &mut self,
        name: &str,
        staging: &Path,
        block: bool,
        context: &HashMap<String, String>,
    ) -> Result<(), tonic::Status> {
        let req = NodeStageVolumeRequest {
            volume_id: name.into(),
            publish_context: context.clone(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(cap(block)),
            ..Default::default()
        };
        self.rt.block_on(self.node.node_stage_volume(req)).map(drop)
    }

    fn unstage(&mut self, name: &str, staging: &Path) {
        let req = NodeUnstageVolumeRequest {
            volume_id: name.into(),
            staging_target_path: staging.display().to_string(),
        };
        self.rt
            .block_on(self.node.node_unstage_volume(req))
            .unwrap();
    }

    fn node_publish(
        &mut self,
        name: &str,
        staging: &Path,
        target: &Path,
        block: bool,
    ) -> Result<(), tonic::Status> {
        self.node_publish_as(name, (staging, target), cap(block))
    }

    fn node_publish_as(
        &mut self,
        name: &str,
        (staging, target): (&Path, &Path),
        cap: VolumeCapability,
    ) -> Result<(), tonic::Status> {
        let req = NodePublishVolumeRequest {
            volume_id: name.into(),
            staging_target_path: staging.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: Some(cap),
            ..Default::default()
        };
        self.rt
            .block_on(self.node.node_publish_volume(req))
            .map(drop)
    }

    fn node_unpublish(&mut self, name: &str, target: &Path) {
        let req = NodeUnpublishVolumeRequest {
            volume_id: name.into(),
            target_path: target.display().to_string(),
        };
        self.rt
            .block_on(self.node.node_unpublish_volume(req))
            .unwrap();
    }
}

impl Csi {
    /// ControllerPublish, NodeStage, NodePublish: the volume in the pod.
    fn up(&mut self, name: &str, staging: &Path, target: &Path, block: bool) {
        let context = self.publish(name, block);
        self.stage(name, staging, block, &context).unwrap();
        self.node_publish(name, staging, target, block).unwrap();
    }

    /// NodeUnpublish, NodeUnstage, ControllerUnpublish.
    fn down(&mut self, name: &str, staging: &Path, target: &Path) {
        self.node_unpublish(name, target);
        self.unstage(name, staging);
        self.unpublish(name);
    }

    /// Takes a mount volume down, brings it up again, checks its files,
    /// and takes it down.
    fn again(&mut self, name: &str, staging: &Path, target: &Path, files: &[(PathBuf, Vec<u8>)]) {
        self.down(name, staging, target);
        self.up(name, staging, target, false);
        assert_files(files);
        self.down(name, staging, target);
    }

    /// After a node plugin restart: the files read back, and the new plugin
    /// (reached through a new connection to `socket`, as a CO makes) takes
    /// the volume down, up and down again.
    fn after_restart(
        &mut self,
        socket: &Path,
        name: &str,
        (staging, target): (&Path, &Path),
        files: &[(PathBuf, Vec<u8>)],
    ) {
        assert_files(files);
        self.connect_node(socket);
        self.again(name, staging, target, files);
    }

    /// A new connection to a node plugin's socket, as a CO makes.
    fn connect_node(&mut self, socket: &Path) {
        let _in = self.rt.enter();
        self.node = NodeClient::new(ballast::grpc::unix_channel(socket).unwrap());
    }
}

/// Waits until node-1, started again at `restarted`, is up and its log
/// says `line`.
fn back_with(
    ctl: &ControllerProc,
    n: &NodeProc,
    restarted: chrono::DateTime<chrono::Utc>,
    line: &str,
) {
    wait_for(Duration::from_secs(30), "node-1 back", || {
        node(&ctl.api, "node-1").filter(|v| node_up_since(v, restarted))
    });
    wait_for(Duration::from_secs(20), line, || {
        n.proc.log_text().contains(line).then_some(())
    });
}

/// Writes a file and syncs it, file by file: a global sync would wait on
/// any FUSE export left without its server on this machine.
fn write_synced((path, data): &(PathBuf, Vec<u8>)) {
    std::fs::write(path, data).unwrap();
    std::fs::File::open(path).unwrap().sync_all().unwrap();
}

/// Every file reads back as written.
fn assert_files(files: &[(PathBuf, Vec<u8>)]) {
    for (p, data) in files {
        assert!(
            std::fs::read(p).unwrap() == *data,
            "{} differs",
            p.display()
        );
    }
}

fn cluster(dir: &Path) -> (ControllerProc, NodeProc, Csi) {
    cluster_with(dir, &[])
}

fn cluster_with(dir: &Path, node_flags: &[&str]) -> (ControllerProc, NodeProc, Csi) {
    cluster_by(Proc::spawn, dir, node_flags)
}

/// Like `cluster_with`, the node plugin started by `spawn`.
fn cluster_by(
    spawn: fn(&[String], PathBuf) -> Proc,
    dir: &Path,
    node_flags: &[&str],
) -> (ControllerProc, NodeProc, Csi) {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (CI runs as root)"
    );
    let (ctl, n) = controller_with_one_node_by(spawn, dir, node_flags);
    let rt = runtime();
    let (ctl_client, node_client) = {
        let _in = rt.enter();
        (
            ControllerClient::new(ballast::grpc::unix_channel(&ctl.socket).unwrap()),
            NodeClient::new(ballast::grpc::unix_channel(&n.socket).unwrap()),
        )
    };
    let csi = Csi {
        ctl: ctl_client,
        node: node_client,
        rt,
    };
    (ctl, n, csi)
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| ((i * 131 + usize::from(seed) * 7) % 251) as u8)
        .collect()
}

#[test]
fn a_mount_volume_is_staged_published_written_and_keeps_its_files_through_a_second_publish() {
    let dir = tempfile::tempdir().unwrap();
    let (_ctl, _n, mut csi) = cluster(dir.path());
    let (staging, target) = (dir.path().join("staging"), dir.path().join("pod/mount"));
    let _cleanup = Teardown(dir.path().to_path_buf());
    let info = csi
        .rt
        .block_on(csi.node.node_get_info(NodeGetInfoRequest {}))
        .unwrap()
        .into_inner();
    assert_eq!(info.node_id, "node-1");

    csi.create("fsvol", false);
    // Not published at this node yet: staging is refused.
    let refused = csi
        .stage("fsvol", &staging, false, &HashMap::new())
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused}");
    let context = csi.publish("fsvol", false);
    assert!(context.contains_key("frontendEndpoint"), "{context:?}");
    // Publishing before staging is refused.
    let refused = csi
        .node_publish("fsvol", &staging, &target, false)
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused}");
    csi.stage("fsvol", &staging, false, &context).unwrap();
    csi.stage("fsvol", &staging, false, &context).unwrap();
    csi.node_publish("fsvol", &staging, &target, false).unwrap();
    csi.node_publish("fsvol", &staging, &target, false).unwrap();

    let files: Vec<(PathBuf, Vec<u8>)> = (0..4u8)
        .map(|i| {
            (
                target.join(format!("file-{i}")),
                pattern((1 << 20) + usize::from(i) * 4099, i),
            )
        })
        .collect();
    for (p, data) in &files {
        std::fs::write(p, data).unwrap();
    }
    // This filesystem only (syncfs), not every one on the machine.
    std::process::Command::new("sync")
        .arg("-f")
        .arg(&target)
        .status()
        .unwrap();
    let stats = volume_stats(&mut csi, "fsvol", &target);
    let bytes = bytes_of(&stats);
    assert!(bytes.total > 0 && bytes.total <= SIZE, "{bytes:?}");
    assert!(bytes.used >= 4 << 20, "{bytes:?}");
    let condition = stats.volume_condition.unwrap();
    assert!(!condition.abnormal, "{condition:?}");
    assert!(
        condition.message.starts_with("1 replicas rw"),
        "{condition:?}"
    );
    let missing = csi
        .rt
        .block_on(csi.node.node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: "fsvol".into(),
            volume_path: dir.path().join("nowhere").display().to_string(),
            ..Default::default()
        }))
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);

    // The engine is not stopped under a staged volume.
    let refused = csi
        .rt
        .block_on(
            csi.ctl
                .controller_unpublish_volume(ControllerUnpublishVolumeRequest {
                    volume_id: "fsvol".into(),
                    node_id: "node-1".into(),
                    ..Default::default()
                }),
        )
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused}");
    assert!(std::fs::read(&files[0].0).unwrap() == files[0].1);

    // Everything down, twice (idempotent), then up again.
    for _ in 0..2 {
        csi.node_unpublish("fsvol", &target);
        csi.unstage("fsvol", &staging);
    }
    assert!(!target.exists());
    csi.unpublish("fsvol");
    csi.up("fsvol", &staging, &target, false);
    assert_files(&files);
    csi.down("fsvol", &staging, &target);
    csi.rt
        .block_on(csi.ctl.delete_volume(DeleteVolumeRequest {
            volume_id: "fsvol".into(),
            ..Default::default()
        }))
        .unwrap();
}

/// A volume published read-only (ControllerPublishVolume `readonly`) is
/// mounted read-only at its target path, whatever NodePublishVolume asks;
/// publishing it again at the same node writable is ALREADY_EXISTS. Its
/// data, written while it was writable, reads back.
#[test]
fn a_volume_published_read_only_is_mounted_read_only_and_keeps_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let (_ctl, _n, mut csi) = cluster(dir.path());
    let _cleanup = Teardown(dir.path().to_path_buf());
    let (staging, target) = (dir.path().join("staging"), dir.path().join("pod/mount"));
    csi.create("ro", false);
    csi.up("ro", &staging, &target, false);
    let data = pattern(1 << 20, 3);
    std::fs::write(target.join("f"), &data).unwrap();
    csi.down("ro", &staging, &target);

    let context = csi.publish_as("ro", false, true).unwrap();
    assert_eq!(context.get("readonly").map(String::as_str), Some("true"));
    let again = csi.publish_as("ro", false, false).unwrap_err();
    assert_eq!(again.code(), Code::AlreadyExists, "{again}");
    csi.stage("ro", &staging, false, &context).unwrap();
    let req = NodePublishVolumeRequest {
        volume_id: "ro".into(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(cap(false)),
        publish_context: context,
        ..Default::default()
    };
    csi.rt.block_on(csi.node.node_publish_volume(req)).unwrap();
    let refused = std::fs::write(target.join("g"), b"no").unwrap_err();
    assert_eq!(
        refused.raw_os_error(),
        Some(nix::errno::Errno::EROFS as i32),
        "{refused}"
    );
    assert!(std::fs::read(target.join("f")).unwrap() == data);
    csi.down("ro", &staging, &target);
}

/// A loop device that another opener still holds after the unstage's
/// detach (here the test itself; on a node, a mount of its filesystem
/// left in another mount namespace, or udev's probe) lets go of the
/// volume's file only at that opener's last close. The unstage waits a
/// little, then says so (ABORTED, naming the device) and keeps the
/// volume's export, every time it is asked while the holder holds; once
/// the holder lets go, it ends and leaves no device. Before, the FUSE
/// unmount failed ("Device or resource busy") and fell back to a lazy
/// unmount that waited for the holder: the unstage hung while it held
/// (here for ever: the holder is the caller), then failed INTERNAL, and
/// the next unstage said done (a CI run met it: another test's mount
/// namespace held a copy of the filesystem for a second).
#[test]
fn an_unstage_whose_device_another_opener_holds_says_so_and_ends_once_it_lets_go() {
    use ballast_node::frontend::blockdev::is_mountpoint;
    let dir = tempfile::tempdir().unwrap();
    let (_ctl, _n, mut csi) = cluster(dir.path());
    let _cleanup = Teardown(dir.path().to_path_buf());
    let (staging, target) = places_of(dir.path(), "held");
    csi.create("held", true);
    csi.up("held", &staging, &target, true);
    let data = pattern(1 << 20, 5);
    write_device(&target, 0, &data);
    csi.node_unpublish("held", &target);
    let export = dir.path().join("node-1/state/frontends/held.fuse");
    let devices = loops_on(&export.join("volume"));
    assert_eq!(devices.len(), 1, "one device on the export");
    let _left = DetachLeft(loops_on(&export.join("volume")));
    let holder = std::fs::File::open(&devices[0].name).unwrap();

    for attempt in 1..=2 {
        let req = NodeUnstageVolumeRequest {
            volume_id: "held".into(),
            staging_target_path: staging.display().to_string(),
        };
        let e = csi
            .rt
            .block_on(csi.node.node_unstage_volume(req))
            .unwrap_err();
        assert_eq!(e.code(), Code::Aborted, "attempt {attempt}: {e}");
        assert!(
            e.message().contains(&devices[0].name) && e.message().contains("another opener"),
            "attempt {attempt}: {e}"
        );
        assert!(
            is_mountpoint(&export),
            "attempt {attempt}: the export went while its device held it"
        );
    }
    // What the device shows is still the volume's.
    let mut read = vec![0u8; data.len()];
    std::os::unix::fs::FileExt::read_exact_at(&holder, &mut read, 0).unwrap();
    assert!(read == data, "the held device reads the volume's data");

    drop(holder);
    csi.unstage("held", &staging);
    assert!(loops_on(&export.join("volume")).is_empty(), "a device left");
    assert!(!is_mountpoint(&export), "the export left mounted");
    csi.unpublish("held");
}

/// CSI v1.13 health from the node: a volume published here is healthy (no
/// entry), one whose engine does not run here is INACCESSIBLE, and ready
/// disks report no storage problem.
#[test]
fn the_node_reports_the_health_of_what_it_serves() {
    use ballast::proto::csi::v1::{
        NodeGetStorageHealthRequest, NodeGetVolumeHealthRequest, VolumeHealthErrorType,
    };
    let dir = tempfile::tempdir().unwrap();
    let (_ctl, _n, mut csi) = cluster(dir.path());
    let _cleanup = Teardown(dir.path().to_path_buf());
    let (staging, target) = (dir.path().join("staging"), dir.path().join("pod/mount"));
    csi.create("healthy", false);
    csi.create("elsewhere", false);
    csi.up("healthy", &staging, &target, false);
    let mut health = |volume: &str| {
        csi.rt
            .block_on(csi.node.node_get_volume_health(NodeGetVolumeHealthRequest {
                volume_id: volume.into(),
                ..Default::default()
            }))
            .unwrap()
            .into_inner()
            .volume_health
            .unwrap()
    };
    let h = health("healthy");
    assert_eq!(h.volume_id, "healthy");
    assert!(h.health_statuses.is_empty(), "{h:?}");
    let h = health("elsewhere");
    assert_eq!(
        h.health_statuses
            .iter()
            .map(|e| e.status)
            .collect::<Vec<_>>(),
        vec![VolumeHealthErrorType::Inaccessible as i32],
        "{h:?}"
    );
    let storage = csi
        .rt
        .block_on(
            csi.node
                .node_get_storage_health(NodeGetStorageHealthRequest::default()),
        )
        .unwrap()
        .into_inner();
    assert!(storage.backend_health.is_empty(), "{storage:?}");
    csi.down("healthy", &staging, &target);
}

/// SINGLE_NODE_MULTI_WRITER publications share a volume between target
/// paths of its node; a SINGLE_NODE_SINGLE_WRITER one has it to itself.
#[test]
fn a_single_writer_has_its_volume_to_itself_while_multi_writers_share_it() {
    let dir = tempfile::tempdir().unwrap();
    let (_ctl, _n, mut csi) = cluster(dir.path());
    let _cleanup = Teardown(dir.path().to_path_buf());
    let staging = dir.path().join("staging");
    let targets: Vec<PathBuf> = (1..=3)
        .map(|i| dir.path().join(format!("pod-{i}/mount")))
        .collect();
    csi.create("shared", false);
    let context = csi.publish("shared", false);
    csi.stage("shared", &staging, false, &context).unwrap();
    for t in &targets[..2] {
        csi.node_publish_as(
            "shared",
            (&staging, t),
            cap_as(false, Mode::SingleNodeMultiWriter),
        )
        .unwrap();
    }
    // One filesystem at both paths.
    let data = pattern(1 << 20, 7);
    std::fs::write(targets[0].join("f"), &data).unwrap();
    assert!(std::fs::read(targets[1].join("f")).unwrap() == data);
    let single = cap_as(false, Mode::SingleNodeSingleWriter);
    let refused = csi
        .node_publish_as("shared", (&staging, &targets[2]), single.clone())
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused}");
    for t in &targets[..2] {
        csi.node_unpublish("shared", t);
    }
    csi.node_publish_as("shared", (&staging, &targets[2]), single.clone())
        .unwrap();
    // Again at the same path: nothing to do.
    csi.node_publish_as("shared", (&staging, &targets[2]), single)
        .unwrap();
    let refused = csi
        .node_publish_as(
            "shared",
            (&staging, &targets[0]),
            cap_as(false, Mode::SingleNodeMultiWriter),
        )
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused}");
    assert!(std::fs::read(targets[2].join("f")).unwrap() == data);
    csi.down("shared", &staging, &targets[2]);
}

#[test]
fn a_block_volume_is_published_as_a_device_file_that_reads_back_what_was_written_and_discarded() {
    let dir = tempfile::tempdir().unwrap();
    let (_ctl, _n, mut csi) = cluster(dir.path());
    let (staging, target) = (dir.path().join("staging"), dir.path().join("pod/dev"));
    let _cleanup = Teardown(dir.path().to_path_buf());
    csi.create("blkvol", true);
    let context = csi.publish("blkvol", true);
    csi.stage("blkvol", &staging, true, &context).unwrap();
    // Staged as a block device, it cannot be published as a filesystem.
    let wrong = csi
        .node_publish("blkvol", &staging, &target, false)
        .unwrap_err();
    assert_eq!(wrong.code(), Code::InvalidArgument, "{wrong}");
    csi.node_publish("blkvol", &staging, &target, true).unwrap();
    let data = pattern(3 << 20, 9);
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut dev = std::fs::OpenOptions::new()
            .write(true)
            .open(&target)
            .unwrap();
        dev.seek(SeekFrom::Start(1 << 20)).unwrap();
        dev.write_all(&data).unwrap();
        dev.sync_all().unwrap();
        assert_eq!(dev.seek(SeekFrom::End(0)).unwrap(), SIZE as u64);
    }
    let mut back = vec![0u8; data.len()];
    {
        use std::os::unix::fs::FileExt;
        std::fs::File::open(&target)
            .unwrap()
            .read_exact_at(&mut back, 1 << 20)
            .unwrap();
    }
    assert!(back == data, "the device read back differs");
    // A discard through the device (the loop device turns it into a FUSE
    // fallocate, the engine into a trim): that range reads as zeros.
    let out = std::process::Command::new("blkdiscard")
        .args([
            "-o",
            &(2u64 << 20).to_string(),
            "-l",
            &(1u64 << 20).to_string(),
        ])
        .arg(&target)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut expected = data.clone();
    expected[1 << 20..2 << 20].fill(0);
    csi.down("blkvol", &staging, &target);
    // The bytes are in the volume, not in a page cache: read them through
    // the NBD endpoint of a fresh engine.
    let context = csi.publish("blkvol", true);
    let endpoint = context["frontendEndpoint"].clone();
    let image = dir.path().join("image.raw");
    let out = std::process::Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "raw", &endpoint])
        .arg(&image)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all = std::fs::read(&image).unwrap();
    assert!(all[1 << 20..(1 << 20) + data.len()] == expected[..]);
    csi.unpublish("blkvol");
}

/// A controller and two nodes, node-1's disk an ext4 of its own (a loop
/// device, which a test may freeze), and a CSI client of the controller
/// and node-1. The disk is small: the cluster asks for no space kept free.
fn two_nodes_the_first_on_ext4(dir: &Path) -> (ControllerProc, Vec<NodeProc>, Csi, PathBuf) {
    let disk = ext4_disk(dir, "node-1");
    let (ctl, nodes) = cluster_of_nodes(dir, "10s", 2, &[]);
    let rt = runtime();
    let csi = {
        let _in = rt.enter();
        Csi {
            ctl: ControllerClient::new(ballast::grpc::unix_channel(&ctl.socket).unwrap()),
            node: NodeClient::new(ballast::grpc::unix_channel(&nodes[0].socket).unwrap()),
            rt,
        }
    };
    (ctl, nodes, csi, disk)
}

/// `write_device` from a thread of its own, which must end within
/// `wait`; `held` says what would hold it.
fn write_device_within(at: &Path, offset: u64, data: Vec<u8>, wait: Duration, held: &str) {
    let (tx, rx) = std::sync::mpsc::channel();
    let at = at.to_path_buf();
    std::thread::spawn(move || {
        write_device(&at, offset, &data);
        let _ = tx.send(());
    });
    match rx.recv_timeout(wait) {
        Ok(()) => {}
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("the write still waits after {wait:?}: {held}")
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("the write failed"),
    }
}

/// A disk that hangs under the replica the engine writes itself (on its
/// own node: the local replica lent to it) holds up the block device's
/// writes only for the replica timeout. Two replicas, on node-1 (whose
/// disk is an ext4 of its own, frozen with fsfreeze) and node-2; the
/// block device published on node-1. With the disk frozen, 4 MiB written
/// through the device and synced: the engine's watch gives up node-1's
/// replica, whose disk holds a write, while node-2's answers; the write
/// that hung is answered by the engine, on a serving thread other than
/// the one the disk holds, and the sync goes to node-2's replica. Before,
/// the writes and the sync waited for as long as the disk stayed frozen.
/// Thawed, node-1's replica is brought back up to date, and the bytes
/// read back from a fresh engine, which reads its local replica first.
#[test]
fn a_frozen_disk_under_the_engines_own_replica_holds_up_the_block_device_only_for_the_replica_timeout()
 {
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = Teardown(dir.path().to_path_buf());
    let (ctl, _nodes, mut csi, disk) = two_nodes_the_first_on_ext4(dir.path());
    let (staging, target) = (dir.path().join("staging"), dir.path().join("pod/dev"));
    let v = "lent-held";
    csi.create_with(v, true, 2);
    csi.up(v, &staging, &target, true);
    assert_eq!(replica_nodes(&ctl.api, v), ["node-1", "node-2"]);
    write_device(&target, 0, &vec![0x21; 4 << 20]);

    let frozen = Frozen::freeze(&disk);
    let (data, wait) = (vec![0x41; 4 << 20], Duration::from_secs(90));
    write_device_within(&target, 4 << 20, data, wait, "node-1's frozen disk");
    wait_robustness_within(&ctl.api, v, "degraded", Duration::from_secs(30));

    drop(frozen);
    wait_robustness_within(&ctl.api, v, "healthy", Duration::from_secs(120));
    csi.down(v, &staging, &target);
    let endpoint = csi.publish(v, true)["frontendEndpoint"].clone();
    let (ok, out) = qemu_io(&endpoint, &["read -P 0x21 0 4M", "read -P 0x41 4M 4M"]);
    assert!(ok, "{out}");
    csi.unpublish(v);
}

/// The same disk, hung under the lent replica, holds up an NBD
/// connection only for the replica timeout. The connection's one reading
/// task makes the lent replica's write itself, and the frozen disk holds
/// it there: the write is answered by the give-up, but the requests that
/// follow it on the connection were never read, and waited for as long as
/// the disk stayed frozen. Now another task takes the reading over once
/// the replica is given up. With the disk frozen, qemu-io writes 4 MiB,
/// 4 MiB more and flushes, on one connection; all answered. Thawed, the
/// replica is brought back up to date and every byte reads back.
#[test]
fn a_frozen_disk_under_the_engines_own_replica_holds_up_an_nbd_connection_only_for_the_replica_timeout()
 {
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = Teardown(dir.path().to_path_buf());
    let (ctl, _nodes, mut csi, disk) = two_nodes_the_first_on_ext4(dir.path());
    let v = "lent-held-nbd";
    csi.create_with(v, false, 2);
    let endpoint = csi.publish(v, false)["frontendEndpoint"].clone();
    assert_eq!(replica_nodes(&ctl.api, v), ["node-1", "node-2"]);
    let (ok, out) = qemu_io(&endpoint, &["write -P 0x21 0 4M", "flush"]);
    assert!(ok, "{out}");

    let frozen = Frozen::freeze(&disk);
    let (tx, rx) = std::sync::mpsc::channel();
    let at = endpoint.clone();
    std::thread::spawn(move || {
        let cmds = ["write -P 0x41 4M 4M", "write -P 0x42 8M 4M", "flush"];
        let _ = tx.send(qemu_io_with(&at, &["-t", "writeback"], &cmds));
    });
    let (ok, out) = rx
        .recv_timeout(Duration::from_secs(90))
        .expect("the connection still waits on node-1's frozen disk after 90 s");
    assert!(ok, "{out}");
    wait_robustness_within(&ctl.api, v, "degraded", Duration::from_secs(30));

    drop(frozen);
    wait_robustness_within(&ctl.api, v, "healthy", Duration::from_secs(120));
    csi.unpublish(v);
    let endpoint = csi.publish(v, false)["frontendEndpoint"].clone();
    let reads = [
        "read -P 0x21 0 4M",
        "read -P 0x41 4M 4M",
        "read -P 0x42 8M 4M",
    ];
    let (ok, out) = qemu_io(&endpoint, &reads);
    assert!(ok, "{out}");
    csi.unpublish(v);
}

/// The same disk, hung while the engine merges its own replica's layers
/// (a snapshot deleted, the merge paced at 1 MiB/s so that it is under
/// way), holds up the block device only for the replica timeout. A merge
/// takes the replica's lock step by step, and a step the disk holds held
/// every write behind it for as long as the disk stayed frozen: the
/// writes waited for the lock, which did not count as the replica's
/// stall. Now it counts: the replica is given up, the merge stops at its
/// next step, and the writes go on with node-2's replica. Thawed, the
/// replica is brought back up to date and every byte reads back.
#[test]
fn a_frozen_disk_under_a_merge_of_the_engines_own_replica_holds_up_the_block_device_only_for_the_replica_timeout()
 {
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = Teardown(dir.path().to_path_buf());
    let (ctl, _nodes, mut csi, disk) = two_nodes_the_first_on_ext4(dir.path());
    ctl_ok(&ctl.api, &["setting", "set", "layer-merge-rate", "1"]);
    let (staging, target) = (dir.path().join("staging"), dir.path().join("pod/dev"));
    let v = "lent-merging";
    csi.create_with(v, true, 2);
    csi.up(v, &staging, &target, true);
    assert_eq!(replica_nodes(&ctl.api, v), ["node-1", "node-2"]);
    let snapshot = |name: &str| ctl_ok(&ctl.api, &["snapshot", "create", name, "--volume", v]);
    write_device(&target, 0, &vec![0x31; 24 << 20]);
    snapshot("s");
    write_device(&target, 20 << 20, &vec![0x32; 8 << 20]);
    snapshot("t");
    write_device(&target, 40 << 20, &vec![0x33; 1 << 20]);

    // s's 20 MiB that t does not cover move up, 4 MiB a step, one step
    // about every 4 s.
    ctl_ok(&ctl.api, &["snapshot", "delete", "s"]);
    let replicas = disk.join("replicas");
    let meta = || {
        let only = std::fs::read_dir(&replicas).ok()?.flatten().next()?;
        std::fs::read_to_string(only.path().join("meta.json")).ok()
    };
    wait_for_or(
        Duration::from_secs(60),
        "node-1's replica to begin its merge",
        || meta().filter(|m| m.contains("\"merging\"")).map(drop),
        || format!("{:?}", meta()),
    );
    let frozen = Frozen::freeze(&disk);
    // The merge's next step begins and the disk holds it, the lock held.
    std::thread::sleep(Duration::from_secs(6));
    let (data, wait) = (vec![0x41; 4 << 20], Duration::from_secs(90));
    let held = "the merge on node-1's frozen disk";
    write_device_within(&target, 48 << 20, data, wait, held);
    wait_robustness_within(&ctl.api, v, "degraded", Duration::from_secs(30));

    drop(frozen);
    wait_robustness_within(&ctl.api, v, "healthy", Duration::from_secs(120));
    csi.down(v, &staging, &target);
    let endpoint = csi.publish(v, true)["frontendEndpoint"].clone();
    let reads = [
        "read -P 0x31 0 20M",
        "read -P 0x32 20M 8M",
        "read -P 0 28M 12M",
        "read -P 0x33 40M 1M",
        "read -P 0x41 48M 4M",
    ];
    let (ok, out) = qemu_io(&endpoint, &reads);
    assert!(ok, "{out}");
    csi.unpublish(v);
}

#[test]
fn a_volume_grows_published_and_unpublished_and_its_filesystem_follows() {
    use ballast::proto::csi::v1::{ControllerExpandVolumeRequest, NodeExpandVolumeRequest};
    let dir = tempfile::tempdir().unwrap();
    let (ctl, _n, mut csi) = cluster(dir.path());
    let (staging, target) = (dir.path().join("staging"), dir.path().join("pod/mount"));
    let _cleanup = Teardown(dir.path().to_path_buf());
    let expand = |csi: &mut Csi, bytes: i64| {
        csi.rt.block_on(
            csi.ctl
                .controller_expand_volume(ControllerExpandVolumeRequest {
                    volume_id: "growvol".into(),
                    capacity_range: Some(CapacityRange {
                        required_bytes: bytes,
                        limit_bytes: 0,
                    }),
                    volume_capability: Some(cap(false)),
                    ..Default::default()
                }),
        )
    };
    let total = |csi: &mut Csi| bytes_of(&volume_stats(csi, "growvol", &target)).total;
    csi.create("growvol", false);
    let context = csi.publish("growvol", false);
    csi.stage("growvol", &staging, false, &context).unwrap();
    csi.node_publish("growvol", &staging, &target, false)
        .unwrap();
    let data = pattern(5 << 20, 3);
    std::fs::write(target.join("data"), &data).unwrap();
    let before = total(&mut csi);
    // Published and mounted, it grows online: the engine and every
    // replica, then the loop device, then the mounted ext4 (resize2fs),
    // which the kernel allows only with CAP_SYS_RESOURCE: without it the
    // node says so, and the filesystem grows at the next stage.
    let grown = expand(&mut csi, 2 * SIZE).unwrap().into_inner();
    assert_eq!(grown.capacity_bytes, 2 * SIZE);
    assert!(grown.node_expansion_required);
    let answer = csi
        .rt
        .block_on(csi.node.node_expand_volume(NodeExpandVolumeRequest {
            volume_id: "growvol".into(),
            volume_path: target.display().to_string(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(cap(false)),
            ..Default::default()
        }));
    let online = total(&mut csi);
    if ballast_node::csi::has_cap_sys_resource() {
        assert_eq!(answer.unwrap().into_inner().capacity_bytes, 2 * SIZE);
        assert!(
            online > before + SIZE / 2,
            "the mounted filesystem did not grow: {before} -> {online}"
        );
    } else {
        let e = answer.unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
        assert!(e.message().contains("CAP_SYS_RESOURCE"), "{e}");
        assert_eq!(online, before, "the mounted filesystem stays as it was");
    }
    // The room it has takes data, and the old data is there.
    let more = pattern((SIZE as usize) / 4, 9);
    std::fs::write(target.join("more"), &more).unwrap();
    assert!(std::fs::read(target.join("data")).unwrap() == data);
    assert!(std::fs::read(target.join("more")).unwrap() == more);
    csi.down("growvol", &staging, &target);
    let before = online;

    // Unpublished, it grows offline; the filesystem follows at the next
    // stage.
    let grown = expand(&mut csi, 3 * SIZE).unwrap().into_inner();
    assert_eq!(grown.capacity_bytes, 3 * SIZE);
    assert!(grown.node_expansion_required);
    // Again: the same answer. Smaller: refused.
    assert_eq!(
        expand(&mut csi, 3 * SIZE)
            .unwrap()
            .into_inner()
            .capacity_bytes,
        3 * SIZE
    );
    let shrink = expand(&mut csi, SIZE).unwrap_err();
    assert_eq!(shrink.code(), Code::OutOfRange, "{shrink}");
    let volume = get_json(&format!("{}/v1/volumes/growvol", ctl.api)).unwrap();
    assert_eq!(volume["spec"]["size"], 3 * SIZE, "{volume}");

    let context = csi.publish("growvol", false);
    csi.stage("growvol", &staging, false, &context).unwrap();
    let answer = csi
        .rt
        .block_on(csi.node.node_expand_volume(NodeExpandVolumeRequest {
            volume_id: "growvol".into(),
            volume_path: staging.display().to_string(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(cap(false)),
            ..Default::default()
        }))
        .unwrap()
        .into_inner();
    assert_eq!(answer.capacity_bytes, 3 * SIZE);
    csi.node_publish("growvol", &staging, &target, false)
        .unwrap();
    let after = total(&mut csi);
    assert!(
        after > before + SIZE / 2,
        "the filesystem did not grow: {before} -> {after}"
    );
    assert!(std::fs::read(target.join("data")).unwrap() == data);
    assert!(std::fs::read(target.join("more")).unwrap() == more);
    csi.down("growvol", &staging, &target);
}

/// A mounted xfs grows online: the engine, the loop device and the
/// filesystem (xfs_growfs) while a pod has it mounted.
#[test]
fn a_mounted_xfs_volume_grows_online_and_keeps_its_data() {
    use ballast::proto::csi::v1::{ControllerExpandVolumeRequest, NodeExpandVolumeRequest};
    let dir = tempfile::tempdir().unwrap();
    let (_ctl, _n, mut csi) = cluster(dir.path());
    let (staging, target) = (dir.path().join("staging"), dir.path().join("pod/mount"));
    let _cleanup = Teardown(dir.path().to_path_buf());
    // xfs wants 300 MiB at least.
    let size = 320i64 << 20;
    let xfs = VolumeCapability {
        access_type: Some(AccessType::Mount(volume_capability::MountVolume {
            fs_type: "xfs".into(),
            ..Default::default()
        })),
        access_mode: Some(volume_capability::AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    };
    let req = CreateVolumeRequest {
        name: "xfsvol".into(),
        capacity_range: Some(CapacityRange {
            required_bytes: size,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![xfs.clone()],
        parameters: HashMap::from([
            ("numberOfReplicas".into(), "1".into()),
            ("fsType".into(), "xfs".into()),
        ]),
        ..Default::default()
    };
    csi.rt.block_on(csi.ctl.create_volume(req)).unwrap();
    let context = csi.publish("xfsvol", false);
    let stage = NodeStageVolumeRequest {
        volume_id: "xfsvol".into(),
        publish_context: context,
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(xfs.clone()),
        ..Default::default()
    };
    csi.rt.block_on(csi.node.node_stage_volume(stage)).unwrap();
    let publish = NodePublishVolumeRequest {
        volume_id: "xfsvol".into(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(xfs.clone()),
        ..Default::default()
    };
    csi.rt
        .block_on(csi.node.node_publish_volume(publish))
        .unwrap();
    let data = pattern(7 << 20, 5);
    std::fs::write(target.join("data"), &data).unwrap();
    let before = bytes_of(&volume_stats(&mut csi, "xfsvol", &target)).total;
    let grown = csi
        .rt
        .block_on(
            csi.ctl
                .controller_expand_volume(ControllerExpandVolumeRequest {
                    volume_id: "xfsvol".into(),
                    capacity_range: Some(CapacityRange {
                        required_bytes: 2 * size,
                        limit_bytes: 0,
                    }),
                    volume_capability: Some(xfs.clone()),
                    ..Default::default()
                }),
        )
        .unwrap()
        .into_inner();
    assert!(grown.node_expansion_required);
    let answer = csi
        .rt
        .block_on(csi.node.node_expand_volume(NodeExpandVolumeRequest {
            volume_id: "xfsvol".into(),
            volume_path: target.display().to_string(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(xfs),
            ..Default::default()
        }))
        .unwrap()
        .into_inner();
    assert_eq!(answer.capacity_bytes, 2 * size);
    let after = bytes_of(&volume_stats(&mut csi, "xfsvol", &target)).total;
    assert!(
        after > before + size / 2,
        "the mounted xfs did not grow: {before} -> {after}"
    );
    let more = pattern((size as usize) / 2, 6);
    std::fs::write(target.join("more"), &more).unwrap();
    assert!(std::fs::read(target.join("data")).unwrap() == data);
    assert!(std::fs::read(target.join("more")).unwrap() == more);
    csi.down("xfsvol", &staging, &target);
}

#[test]
fn a_mounted_volume_keeps_working_while_the_node_plugin_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let (ctl, mut n, mut csi) = cluster(dir.path());
    let (staging, target) = (dir.path().join("staging"), dir.path().join("pod/mount"));
    let _cleanup = Teardown(dir.path().to_path_buf());
    csi.create("keep", false);
    csi.up("keep", &staging, &target, false);
    let files: Vec<(PathBuf, Vec<u8>)> = (0..3u8)
        .map(|i| {
            (
                target.join(format!("f{i}")),
                pattern((2 << 20) + usize::from(i), i),
            )
        })
        .collect();
    let write = |i: usize| {
        std::fs::write(&files[i].0, &files[i].1).unwrap();
        // This filesystem only (syncfs), not every one on the machine.
        std::process::Command::new("sync")
            .arg("-f")
            .arg(&target)
            .status()
            .unwrap();
    };
    write(0);
    // The node plugin dies: the engine (its own process), the FUSE export
    // and the loop device stay, and so does the mount.
    n.proc.signal(nix::sys::signal::Signal::SIGKILL);
    n.proc.wait_exit(Duration::from_secs(5)).unwrap();
    write(1);
    let restarted = chrono::Utc::now();
    // (The old handle is forgotten, not dropped: its drop kills its process
    // group, where the engine runs; the test's cleanup stops the engine.)
    let old = std::mem::replace(
        &mut n.proc,
        Proc::spawn(&n.args, dir.path().join("node-1.restarted.log")),
    );
    std::mem::forget(old);
    // The engine asks its new server for its replica again.
    back_with(&ctl, &n, restarted, "replica lent to its engine");
    write(2);
    // The restarted plugin tears down what its predecessor set up.
    csi.after_restart(&n.socket, "keep", (&staging, &target), &files);
}

/// With an engine host, the engine is the host's child: the death of the
/// node plugin's whole process group (as of its container) spares it. A
/// writer goes on writing and syncing through the mount while the group is
/// SIGKILLed, while no plugin runs and after a new one is up. The new
/// plugin re-adopts the engine (same pid) and tears down what its
/// predecessor set up; every file reads back.
#[test]
fn a_written_volume_survives_the_node_plugins_whole_process_group_with_an_engine_host() {
    let dir = tempfile::tempdir().unwrap();
    let host_socket = format!("unix://{}", dir.path().join("engine-host.sock").display());
    let host = Proc::spawn(
        &[
            "engine-host".to_string(),
            "--socket".to_string(),
            host_socket.clone(),
        ],
        dir.path().join("engine-host.log"),
    );
    let (ctl, mut n, mut csi) = cluster_with(dir.path(), &["--engine-host", &host_socket]);
    let (staging, target) = (dir.path().join("staging"), dir.path().join("pod/mount"));
    let _cleanup = Teardown(dir.path().to_path_buf());
    csi.create("hosted", false);
    csi.up("hosted", &staging, &target, false);
    let state = dir.path().join("node-1/state");
    let engine = engine_pid(&state, "hosted").unwrap();
    assert!(
        host.log_text().contains("engine started"),
        "the engine host started the engine: {}",
        host.log_text()
    );

    // A writer: a new file and a sync, over and over, until told to stop;
    // `synced` counts the files that are written and synced.
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let (stop, synced) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
    );
    let writer = {
        let (stop, synced, target) = (stop.clone(), synced.clone(), target.clone());
        std::thread::spawn(move || {
            let mut written = Vec::new();
            let mut i = 0u8;
            while !stop.load(Ordering::Relaxed) {
                let p = target.join(format!("w{i}"));
                let data = pattern((256 << 10) + usize::from(i), i);
                std::fs::write(&p, &data).unwrap();
                let done = std::process::Command::new("sync")
                    .arg("-f")
                    .arg(&target)
                    .status();
                assert!(done.unwrap().success(), "sync failed after {i} files");
                written.push((p, data));
                synced.fetch_add(1, Ordering::SeqCst);
                i = i.wrapping_add(1);
                std::thread::sleep(Duration::from_millis(50));
            }
            written
        })
    };
    // Wait for `more` files synced after `from`, however long the machine
    // takes (it is busy when the whole suite runs).
    let synced_past = |from: usize, more: usize, what: &str| {
        wait_for(Duration::from_secs(60), what, || {
            assert!(!writer.is_finished(), "the writer stopped early: {what}");
            (synced.load(Ordering::SeqCst) >= from + more).then_some(())
        })
    };
    synced_past(0, 3, "the writer's first files");
    // The node plugin's whole process group dies, as its container would.
    nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(n.proc.pid()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    n.proc.wait_exit(Duration::from_secs(5)).unwrap();
    let at_kill = synced.load(Ordering::SeqCst);
    assert!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(engine), None).is_ok(),
        "the engine outlived the node plugin's group"
    );
    // Writes go on, synced, while no node plugin runs.
    synced_past(at_kill, 5, "files synced while the node plugin is dead");
    let restarted = chrono::Utc::now();
    n.proc = Proc::spawn(&n.args, dir.path().join("node-1.restarted.log"));
    back_with(&ctl, &n, restarted, "re-adopted a running engine");
    assert_eq!(
        engine_pid(&state, "hosted"),
        Some(engine),
        "the same engine"
    );
    // And after the new plugin re-adopted the engine.
    synced_past(
        synced.load(Ordering::SeqCst),
        3,
        "files synced after the restart",
    );
    stop.store(true, Ordering::Relaxed);
    let written = writer.join().unwrap();
    // The new plugin tears down what its predecessor set up, and the files
    // are there on the next stage.
    csi.after_restart(&n.socket, "hosted", (&staging, &target), &written);
}

/// The parent of process `pid`, from `/proc/<pid>/stat`.
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

/// A controller and a node plugin whose engines live in an engine host on
/// `<dir>/engine-host.sock`: the host's arguments (to start another on the
/// same socket), the host, the cluster, and the node's metrics URL.
fn hosted_cluster(dir: &Path) -> (Vec<String>, Proc, ControllerProc, NodeProc, Csi, String) {
    hosted_cluster_by(Proc::spawn, dir)
}

/// Like `hosted_cluster`, the node plugin started by `spawn`.
fn hosted_cluster_by(
    spawn: fn(&[String], PathBuf) -> Proc,
    dir: &Path,
) -> (Vec<String>, Proc, ControllerProc, NodeProc, Csi, String) {
    let socket = format!("unix://{}", dir.join("engine-host.sock").display());
    let args = vec![
        "engine-host".to_string(),
        "--socket".to_string(),
        socket.clone(),
    ];
    let host = Proc::spawn(&args, dir.join("engine-host-old.log"));
    let metrics = free_addr().to_string();
    let flags = ["--engine-host", &socket, "--metrics-listen", &metrics];
    let (ctl, n, csi) = cluster_by(spawn, dir, &flags);
    (args, host, ctl, n, csi, format!("http://{metrics}/metrics"))
}

/// Whether the node's metrics at `url` say that volume `v`'s engine waits
/// for a handover (None: no engine of it is listed).
fn awaits_handover(url: &str, v: &str) -> Option<bool> {
    let text = get_text(url)?;
    let line = text.lines().find(|l| {
        l.starts_with("ballast_engine_awaiting_handover{") && l.contains(&format!("volume=\"{v}\""))
    })?;
    Some(line.ends_with(" 1"))
}

/// Where volume `v` is staged, and published for its pod.
fn places_of(dir: &Path, v: &str) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("staging-{v}")),
        dir.join(format!("pod-{v}/mount")),
    )
}

/// A rollout of the engine host: a new host takes the socket, then the old
/// one is told to stop (SIGTERM), as a DaemonSet with a surge does it. The
/// node plugin moves the engines to the new host one at a time, each
/// keeping its block device: writers on two mounted volumes go on without
/// an error, the old host ends by itself once its engines have left, the
/// volumes are never faulted, and every file reads back, then again after
/// a fresh stage under the new host.
#[test]
fn a_new_engine_host_takes_the_engines_over_one_at_a_time_under_mounted_filesystems() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let dir = tempfile::tempdir().unwrap();
    // Dropped last: the processes go first, so that no FUSE connection
    // outlives its holders while the mounts on it are taken down.
    let _cleanup = Teardown(dir.path().to_path_buf());
    let (host_args, mut old_host, ctl, n, mut csi, metrics) = hosted_cluster(dir.path());
    let volumes = ["one", "two"];
    let places = |v: &str| places_of(dir.path(), v);
    for v in volumes {
        csi.create(v, false);
        let (staging, target) = places(v);
        csi.up(v, &staging, &target, false);
    }
    let state = dir.path().join("node-1/state");
    let pids: Vec<i32> = volumes
        .iter()
        .map(|v| engine_pid(&state, v).unwrap())
        .collect();
    for pid in &pids {
        assert_eq!(
            parent_of(*pid),
            Some(old_host.pid()),
            "the old host runs the engines"
        );
    }

    // A writer per volume: 256 KiB and an fsync at a time, each chunk a
    // pattern of its own, over and over the 16 MiB of one file (chunk `i`
    // at slot `i % 64`), failing on any error.
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = volumes
        .iter()
        .map(|v| {
            let chunks = Arc::new(AtomicUsize::new(0));
            let (stop, count, path) = (stop.clone(), chunks.clone(), places(v).1.join("during"));
            let handle = std::thread::spawn(move || -> Result<(), String> {
                use std::os::unix::fs::FileExt;
                let f = std::fs::File::create(&path).map_err(|e| e.to_string())?;
                let mut i = 0usize;
                while !stop.load(Ordering::SeqCst) {
                    f.write_all_at(
                        &pattern(256 << 10, (i % 250) as u8),
                        (i % 64) as u64 * (256 << 10),
                    )
                    .and_then(|()| f.sync_data())
                    .map_err(|e| format!("chunk {i}: {e}"))?;
                    i += 1;
                    count.store(i, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(10));
                }
                Ok(())
            });
            (chunks, handle)
        })
        .collect();
    let past = |from: &[usize], more: usize, what: &str| {
        wait_for(Duration::from_secs(60), what, || {
            writers
                .iter()
                .zip(from)
                .all(|((c, _), f)| c.load(Ordering::SeqCst) >= f + more)
                .then_some(())
        })
    };
    past(&[0, 0], 4, "the writers under way");

    // The new host takes the socket; the old one is told to stop.
    let new_host = Proc::spawn(&host_args, dir.path().join("engine-host-new.log"));
    wait_for(Duration::from_secs(20), "the new host serving", || {
        new_host
            .log_text()
            .contains("engine host serving")
            .then_some(())
    });
    old_host.signal(nix::sys::signal::Signal::SIGTERM);
    let faulted = |v: &str| {
        get_json(&format!("{}/v1/volumes/{v}", ctl.api))
            .is_some_and(|j| j["status"]["robustness"] == "faulted")
    };
    let moved = wait_for(
        Duration::from_secs(120),
        "every engine under the new host",
        || {
            for v in volumes {
                assert!(!faulted(v), "{v} was faulted during the handover");
            }
            let now: Vec<i32> = volumes
                .iter()
                .filter_map(|v| engine_pid(&state, v))
                .collect();
            (now.len() == 2 && now.iter().all(|p| parent_of(*p) == Some(new_host.pid())))
                .then_some(now)
        },
    );
    for v in volumes {
        assert_eq!(awaits_handover(&metrics, v), Some(false), "{v}");
    }
    assert!(
        moved.iter().zip(&pids).all(|(a, b)| a != b),
        "new engines: {moved:?} after {pids:?}"
    );
    // The old host ends by itself, its engines gone.
    let exit = old_host.wait_exit(Duration::from_secs(30));
    assert!(
        exit.is_some_and(|s| s.success()),
        "the old host did not end once empty: {exit:?}: {}",
        old_host.log_text()
    );
    let at_move: Vec<usize> = writers
        .iter()
        .map(|(c, _)| c.load(Ordering::SeqCst))
        .collect();
    past(&at_move, 8, "the writers past the handover");
    stop.store(true, Ordering::SeqCst);

    // One at a time: the node plugin replaced an engine and had it up
    // under the new host before it replaced the next.
    let log = n.proc.log_text();
    let steps: Vec<&str> = log
        .lines()
        .filter_map(|l| {
            if l.contains("replacing the volume's engine") {
                Some("replace")
            } else if l.contains("engine started") && l.contains("took_over_block_device=true") {
                Some("started")
            } else {
                None
            }
        })
        .collect();
    assert_eq!(steps, ["replace", "started", "replace", "started"], "{log}");
    for v in volumes {
        let reasons = event_reasons(&ctl.api, &format!("volume/{v}"));
        assert!(
            reasons.contains(&"EngineHandedOver".to_string()),
            "{v}: {reasons:?}"
        );
        assert!(
            !reasons.contains(&"EngineDown".to_string()),
            "{v}: {reasons:?}"
        );
    }

    // Every chunk acknowledged is in the files, now and after a fresh
    // stage under the new host.
    for (v, (chunks, handle)) in volumes.iter().zip(writers) {
        handle.join().unwrap().unwrap();
        let written = chunks.load(Ordering::SeqCst);
        // Each slot holds the last chunk written to it.
        let slots = written.min(64);
        let during: Vec<u8> = (0..slots)
            .flat_map(|k| {
                let last = k + (written - 1 - k) / 64 * 64;
                pattern(256 << 10, (last % 250) as u8)
            })
            .collect();
        let (staging, target) = places(v);
        let files = [(target.join("during"), during)];
        assert_files(&files);
        csi.again(v, &staging, &target, &files);
    }
}

/// A process killed when dropped, however the test ends.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An engine host that answers every start with an error, on `socket`
/// (a python script: what a broken build of the host would do).
fn broken_engine_host(dir: &Path, socket: &Path) -> Killed {
    let script = dir.join("broken-host.py");
    std::fs::write(
        &script,
        r#"import os, socket, sys
path = sys.argv[1]
try:
    os.unlink(path)
except FileNotFoundError:
    pass
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
s.listen(16)
print("broken host serving", flush=True)
while True:
    c, _ = s.accept()
    c.settimeout(10)
    try:
        if c.recv(65536):
            c.sendall(b'{"error": "this engine host is broken"}\n')
    except OSError:
        pass
    c.close()
"#,
    )
    .unwrap();
    let child = std::process::Command::new("python3")
        .arg(&script)
        .arg(socket)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("python3 runs the broken engine host (./test installs it)");
    let rt = runtime();
    wait_for(Duration::from_secs(10), "the broken host serving", || {
        rt.block_on(ballast_node::engine_host::serving_pid(socket))
            .filter(|p| *p == child.id() as i32)
    });
    Killed(child)
}

/// A handover to a new engine host that cannot start engines fails for
/// one volume and stops there: the other engines stay under the old host.
/// The failed volume's block device is kept (its I/O waits), and once a
/// working host takes the socket, that volume's engine starts under it,
/// taking the device over, and the other is handed over. The old host
/// ends by itself; every file reads back from the devices, the devices
/// take new writes, and the files are there after a fresh stage.
#[test]
fn a_failed_handover_stops_the_others_and_keeps_the_block_device_until_a_working_host_comes() {
    let dir = tempfile::tempdir().unwrap();
    // Dropped last: the processes go first, so that no FUSE connection
    // outlives its holders while the mounts on it are taken down.
    let _cleanup = Teardown(dir.path().to_path_buf());
    let (host_args, mut old_host, ctl, n, mut csi, metrics) = hosted_cluster(dir.path());
    let socket = dir.path().join("engine-host.sock");
    let volumes = ["one", "two"];
    let places = |v: &str| places_of(dir.path(), v);
    let mut files = Vec::new();
    for (i, v) in volumes.iter().enumerate() {
        csi.create(v, false);
        let (staging, target) = places(v);
        csi.up(v, &staging, &target, false);
        let file = (target.join("before"), pattern(4 << 20, 30 + i as u8));
        write_synced(&file);
        files.push(file);
    }
    let state = dir.path().join("node-1/state");
    let two = engine_pid(&state, "two").unwrap();

    // A broken host takes the socket; the old one is told to stop.
    let broken = broken_engine_host(dir.path(), &socket);
    old_host.signal(nix::sys::signal::Signal::SIGTERM);
    wait_for(Duration::from_secs(60), "a failed handover", || {
        n.proc
            .log_text()
            .contains("a handover to a new engine host failed")
            .then_some(())
    });
    // Two heartbeats later (each would mark the next engine; each starts
    // volume one's engine again, in vain), nothing else moved: volume
    // two's engine is the same, under the old host, and never went down.
    let reasons = |v: &str| event_reasons(&ctl.api, &format!("volume/{v}"));
    wait_for(Duration::from_secs(60), "two more heartbeats", || {
        let down = reasons("one").iter().filter(|r| *r == "EngineDown").count();
        (down >= 2).then_some(())
    });
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(engine_pid(&state, "two"), Some(two));
    assert_eq!(parent_of(two), Some(old_host.pid()));
    assert_eq!(awaits_handover(&metrics, "two"), Some(true));
    assert!(
        old_host.child.try_wait().unwrap().is_none(),
        "the old host waits"
    );
    let handed = n
        .proc
        .log_text()
        .matches("replacing the volume's engine")
        .count();
    assert_eq!(handed, 1, "only the first engine was handed over");

    // A working host takes the socket.
    drop(broken);
    let new_host = Proc::spawn(&host_args, dir.path().join("engine-host-new.log"));
    wait_for(
        Duration::from_secs(120),
        "every engine under the new host",
        || {
            let now: Vec<i32> = volumes
                .iter()
                .filter_map(|v| engine_pid(&state, v))
                .collect();
            (now.len() == 2 && now.iter().all(|p| parent_of(*p) == Some(new_host.pid())))
                .then_some(())
        },
    );
    let exit = old_host.wait_exit(Duration::from_secs(30));
    assert!(
        exit.is_some_and(|s| s.success()),
        "the old host did not end once empty: {exit:?}: {}",
        old_host.log_text()
    );
    for v in volumes {
        assert_eq!(awaits_handover(&metrics, v), Some(false), "{v}");
    }
    let log = n.proc.log_text();
    assert_eq!(
        log.matches("took_over_block_device=true").count(),
        2,
        "both engines took their block device over: {log}"
    );
    assert!(
        reasons("one").contains(&"EngineDown".to_string()),
        "{:?}",
        reasons("one")
    );
    assert!(
        reasons("two").contains(&"EngineHandedOver".to_string()),
        "{:?}",
        reasons("two")
    );
    assert!(
        !reasons("two").contains(&"EngineDown".to_string()),
        "{:?}",
        reasons("two")
    );

    // From the devices, not the page cache, and the devices take writes.
    std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    assert_files(&files);
    for (i, v) in volumes.iter().enumerate() {
        let file = (places(v).1.join("after"), pattern(1 << 20, 40 + i as u8));
        write_synced(&file);
        files.push(file);
    }
    for v in volumes {
        let (staging, target) = places(v);
        let mine: Vec<_> = files
            .iter()
            .filter(|(p, _)| p.starts_with(&target))
            .cloned()
            .collect();
        csi.again(v, &staging, &target, &mine);
    }
}

#[test]
fn a_killed_engine_is_replaced_under_a_mounted_filesystem_that_goes_on_without_an_error() {
    use std::io::Write;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let (ctl, _n, mut csi) = cluster(dir.path());
    let (staging, target) = (dir.path().join("staging"), dir.path().join("pod/mount"));
    let _cleanup = Teardown(dir.path().to_path_buf());
    csi.create("crashvol", false);
    csi.up("crashvol", &staging, &target, false);
    let before = (target.join("before"), pattern(4 << 20, 5));
    std::fs::write(&before.0, &before.1).unwrap();
    // This filesystem only (syncfs), not every one on the machine.
    nix::unistd::syncfs(std::fs::File::open(&before.0).unwrap()).unwrap();
    // A writer goes on through the filesystem: 256 KiB and an fsync at a
    // time, each chunk a pattern of its own, failing on any error.
    let (stop, chunks) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
    );
    let writer = {
        let (stop, chunks, path) = (stop.clone(), chunks.clone(), target.join("during"));
        std::thread::spawn(move || -> Result<(), String> {
            let mut f = std::fs::File::create(&path).map_err(|e| e.to_string())?;
            let mut i = 0usize;
            while !stop.load(Ordering::SeqCst) && i < 160 {
                f.write_all(&pattern(256 << 10, (i % 250) as u8))
                    .and_then(|()| f.sync_data())
                    .map_err(|e| format!("chunk {i}: {e}"))?;
                i += 1;
                chunks.store(i, Ordering::SeqCst);
            }
            Ok(())
        })
    };
    wait_for(Duration::from_secs(30), "the writer under way", || {
        (chunks.load(Ordering::SeqCst) >= 4).then_some(())
    });
    let state = dir.path().join("node-1/state");
    let pid = engine_pid(&state, "crashvol").unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let at_kill = chunks.load(Ordering::SeqCst);
    // The controller starts the engine again; the writer, blocked
    // meanwhile, goes on through the same loop device and filesystem.
    wait_for(Duration::from_secs(60), "the writer past the crash", || {
        (chunks.load(Ordering::SeqCst) >= at_kill + 8).then_some(())
    });
    let new_pid = engine_pid(&state, "crashvol").unwrap();
    assert_ne!(new_pid, pid, "the engine was not replaced");
    stop.store(true, Ordering::SeqCst);
    writer.join().unwrap().unwrap();
    let written = chunks.load(Ordering::SeqCst);
    let during: Vec<u8> = (0..written)
        .flat_map(|i| pattern(256 << 10, (i % 250) as u8))
        .collect();
    let files = [before, (target.join("during"), during)];
    assert_files(&files);
    wait_event(&ctl.api, "volume/crashvol", "EngineRestarted");
    // Unstaged and staged again (a fresh engine, a fresh mount), every
    // byte is in the volume.
    csi.again("crashvol", &staging, &target, &files);
}

/// Whether a loop device is backed by `file` now.
fn looped(file: &Path) -> bool {
    !loops_on(file).is_empty()
}

/// How many mounts sit at `point` now (stacked ones count each).
fn mounts_at(point: &Path) -> usize {
    let point = point.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.split(' ').nth(4) == Some(point.as_str()))
        .count()
}

/// A staging record that cannot be read (a torn write, a full disk, a
/// hand's edit) or that is gone (the node plugin ended between setting up
/// the loop device and recording it) does not make a second loop device
/// over the volume's export, nor mount its filesystem a second time at
/// the staging path (two block devices of one filesystem, both mounted,
/// would corrupt it): the next NodeStage takes the loop device that is
/// there and records it again, with where the volume is published (from
/// the kernel's mounts: a filesystem's, or a block device file's bind
/// mounts), and NodeUnstage detaches every loop device of the export,
/// recorded or not. The files read back throughout.
#[test]
fn a_staging_record_that_is_torn_or_gone_makes_no_second_device_and_unstage_leaves_none() {
    let dir = tempfile::tempdir().unwrap();
    let (_ctl, _n, mut csi) = cluster(dir.path());
    let _cleanup = Teardown(dir.path().to_path_buf());
    let state = dir.path().join("node-1/state");
    let (staging, target) = (dir.path().join("staging"), dir.path().join("pod/mount"));
    let file = state.join("frontends/torn.fuse/volume");
    let record = state.join("staged/torn.json");
    csi.create("torn", false);
    let context = csi.publish("torn", false);
    csi.stage("torn", &staging, false, &context).unwrap();
    csi.node_publish("torn", &staging, &target, false).unwrap();
    let files = [(target.join("kept"), pattern(3 << 20, 5))];
    write_synced(&files[0]);
    assert_eq!((loops_on(&file).len(), mounts_at(&staging)), (1, 1));

    // Torn: the next stage takes the device and the mount that are there,
    // and where the volume is published: a single writer elsewhere is
    // refused while it is published at `target`.
    let whole = std::fs::read(&record).unwrap();
    std::fs::write(&record, &whole[..whole.len() / 2]).unwrap();
    csi.stage("torn", &staging, false, &context).unwrap();
    assert_eq!((loops_on(&file).len(), mounts_at(&staging)), (1, 1));
    assert_files(&files);
    let elsewhere = dir.path().join("pod/elsewhere");
    no_single_writer_while_at(&mut csi, "torn", (&staging, &elsewhere), false, &target);
    // Published again at the same target: the record knows it again.
    csi.node_publish("torn", &staging, &target, false).unwrap();
    csi.node_unpublish("torn", &target);

    // Gone: NodeUnstage still detaches the device.
    std::fs::remove_file(&record).unwrap();
    csi.unstage("torn", &staging);
    assert_eq!((loops_on(&file).len(), mounts_at(&staging)), (0, 0));

    // Gone before the mount: the next stage takes the device there.
    csi.stage("torn", &staging, false, &context).unwrap();
    std::fs::remove_file(&record).unwrap();
    nix::mount::umount(&staging).unwrap();
    csi.stage("torn", &staging, false, &context).unwrap();
    assert_eq!((loops_on(&file).len(), mounts_at(&staging)), (1, 1));
    csi.node_publish("torn", &staging, &target, false).unwrap();
    assert_files(&files);
    csi.down("torn", &staging, &target);
    assert_eq!((loops_on(&file).len(), mounts_at(&staging)), (0, 0));

    // A block volume: its publication is a bind mount of its device file.
    let (staging, target) = (
        dir.path().join("staging-block"),
        dir.path().join("pod/block"),
    );
    csi.create("torn-block", true);
    let context = csi.publish("torn-block", true);
    csi.stage("torn-block", &staging, true, &context).unwrap();
    csi.node_publish("torn-block", &staging, &target, true)
        .unwrap();
    std::fs::write(state.join("staged/torn-block.json"), b"{").unwrap();
    csi.stage("torn-block", &staging, true, &context).unwrap();
    let elsewhere = dir.path().join("pod/block-2");
    no_single_writer_while_at(
        &mut csi,
        "torn-block",
        (&staging, &elsewhere),
        true,
        &target,
    );
    csi.down("torn-block", &staging, &target);
}

/// A publication of `volume` as a single writer at `elsewhere` is
/// refused (FAILED_PRECONDITION) while the volume is published at
/// `target`, which the refusal names.
fn no_single_writer_while_at(
    csi: &mut Csi,
    volume: &str,
    (staging, elsewhere): (&Path, &Path),
    block: bool,
    target: &Path,
) {
    let refused = csi
        .node_publish_as(
            volume,
            (staging, elsewhere),
            cap_as(block, Mode::SingleNodeSingleWriter),
        )
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused}");
    assert!(
        refused.message().contains(&target.display().to_string()),
        "{refused}"
    );
}

/// A loop device as util-linux lists it.
#[derive(Clone, Debug, PartialEq)]
struct Loop {
    name: String,
    file: String,
    /// The device number ("major:minor") and inode of its file.
    id: (String, u64),
}

fn loop_list() -> Vec<Loop> {
    let out = std::process::Command::new("losetup")
        .args([
            "--list",
            "--json",
            "--output",
            "NAME,BACK-FILE,BACK-INO,BACK-MAJ:MIN",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    if out.stdout.is_empty() {
        return Vec::new();
    }
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    list["loopdevices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| Loop {
            name: d["name"].as_str().unwrap().to_string(),
            file: d["back-file"].as_str().unwrap_or_default().to_string(),
            id: (
                d["back-maj:min"]
                    .as_str()
                    .unwrap_or_default()
                    .trim()
                    .to_string(),
                d["back-ino"].as_u64().unwrap_or_default(),
            ),
        })
        .collect()
}

/// The loop devices on `file` as util-linux finds them: by the file's
/// device number and inode, or by its path.
fn loops_on(file: &Path) -> Vec<Loop> {
    use std::os::unix::fs::MetadataExt;
    let id = std::fs::metadata(file).ok().map(|m| {
        let dev = m.dev();
        let (major, minor) = (nix::sys::stat::major(dev), nix::sys::stat::minor(dev));
        (format!("{major}:{minor}"), m.ino())
    });
    let path = file.display().to_string();
    loop_list()
        .into_iter()
        .filter(|d| d.file == path || Some(&d.id) == id.as_ref())
        .collect()
}

/// Detaches, when dropped, those of its loop devices still on the file
/// they were found on: a test that fails leaves none behind, and leaves
/// alone a number another test has been given since.
struct DetachLeft(Vec<Loop>);

impl Drop for DetachLeft {
    fn drop(&mut self) {
        let now = loop_list();
        for d in self
            .0
            .iter()
            .filter(|d| now.iter().any(|n| n.name == d.name && n.id == d.id))
        {
            let _ = std::process::Command::new("losetup")
                .args(["-d", &d.name])
                .status();
        }
    }
}

/// The node plugin runs in a mount namespace of its own, as in its
/// container (the state and kubelet directories shared both ways), and
/// its engines in an engine host. The container ends: the node plugin's
/// whole process group, and its mount namespace with it. The loop devices
/// it set up now have files the kernel names from their filesystem's root
/// (`/volume`): not by the path of the volume's export. A new node plugin,
/// in a new namespace, still finds them by their file's identity:
/// NodeStageVolume again (as a kubelet that restarted asks it) neither
/// attaches a second device nor mounts a second time, NodePublishVolume
/// at a new target serves the files and the device written before, and
/// NodeUnstageVolume leaves no device behind.
#[test]
fn a_node_plugin_after_its_containers_mount_namespace_ended_finds_the_devices_it_set_up() {
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = Teardown(dir.path().to_path_buf());
    // The test's directory stands for the host's: shared, so that the
    // node plugin's namespace and this one see each other's mounts.
    use nix::mount::{MsFlags, mount};
    mount(
        Some(dir.path()),
        dir.path(),
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .unwrap();
    mount(
        None::<&str>,
        dir.path(),
        None::<&str>,
        MsFlags::MS_SHARED,
        None::<&str>,
    )
    .unwrap();
    let (_, _host, ctl, mut n, mut csi, _) =
        hosted_cluster_by(Proc::spawn_in_own_mounts, dir.path());
    let state = dir.path().join("node-1/state");
    let file = |v: &str| state.join(format!("frontends/{v}.fuse/volume"));
    let (staging, target) = (
        |v: &str| places_of(dir.path(), v).0,
        |v: &str| places_of(dir.path(), v).1,
    );
    csi.create("fs", false);
    csi.up("fs", &staging("fs"), &target("fs"), false);
    let files = [(target("fs").join("kept"), pattern(3 << 20, 7))];
    write_synced(&files[0]);
    csi.create("blk", true);
    csi.up("blk", &staging("blk"), &target("blk"), true);
    let data = pattern(1 << 20, 8);
    write_device(&target("blk"), 1 << 20, &data);
    let devices: Vec<_> = ["fs", "blk"].iter().map(|v| loops_on(&file(v))).collect();
    assert_eq!(devices.iter().map(Vec::len).collect::<Vec<_>>(), [1, 1]);
    let _left = DetachLeft(devices.concat());

    nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(n.proc.pid()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    n.proc.wait_exit(Duration::from_secs(5)).unwrap();
    // The namespace is gone: the devices' files are no longer named by
    // the exports' paths.
    let named = |d: &str| {
        std::fs::read_to_string(format!("/sys/block/{}/loop/backing_file", &d[5..])).unwrap()
    };
    for d in &devices {
        assert_eq!(named(&d[0].name).trim(), "/volume", "{}", d[0].name);
    }

    let restarted = chrono::Utc::now();
    n.proc = Proc::spawn_in_own_mounts(&n.args, dir.path().join("node-1.restarted.log"));
    back_with(&ctl, &n, restarted, "re-adopted a running engine");
    csi.connect_node(&n.socket);
    let context = csi.publish("fs", false);
    csi.stage("fs", &staging("fs"), false, &context).unwrap();
    let context = csi.publish("blk", true);
    csi.stage("blk", &staging("blk"), true, &context).unwrap();
    for (i, v) in ["fs", "blk"].into_iter().enumerate() {
        let names = |l: &[Loop]| l.iter().map(|d| d.name.clone()).collect::<Vec<_>>();
        assert_eq!(
            names(&loops_on(&file(v))),
            names(&devices[i]),
            "{v}: its device"
        );
    }
    assert_eq!(mounts_at(&staging("fs")), 1);
    let again = |v: &str| dir.path().join(format!("pod-again-{v}/mount"));
    csi.node_publish("fs", &staging("fs"), &again("fs"), false)
        .unwrap();
    assert!(std::fs::read(again("fs").join("kept")).unwrap() == files[0].1);
    csi.node_publish("blk", &staging("blk"), &again("blk"), true)
        .unwrap();
    assert!(read_device(&again("blk"), 1 << 20, data.len()) == data);
    for v in ["fs", "blk"] {
        csi.node_unpublish(v, &again(v));
        csi.down(v, &staging(v), &target(v));
        assert!(loops_on(&file(v)).is_empty(), "{v}: a device left");
    }
    assert_eq!(mounts_at(&staging("fs")), 0);
}

/// An ext4 left marked with errors, as a crash of the pod's node may
/// leave it, is checked by NodeStageVolume before it is mounted: one
/// whose errors `e2fsck -p` repairs (a wrong link count) is repaired and
/// mounted clean, its files there; one whose errors need a person (its
/// root directory gone) is not mounted: FAILED_PRECONDITION, saying why,
/// and nothing is left set up. Before, either was mounted as it was. A
/// volume published read-only is not repaired.
#[test]
fn an_ext4_marked_with_errors_is_repaired_before_the_mount_and_one_beyond_repair_is_not_mounted() {
    let dir = tempfile::tempdir().unwrap();
    let (_ctl, _n, mut csi) = cluster(dir.path());
    let _cleanup = Teardown(dir.path().to_path_buf());
    let file = dir
        .path()
        .join("node-1/state/frontends/checked.fuse/volume");
    let (staging, target) = places_of(dir.path(), "checked");
    csi.create("checked", false);
    let context = csi.publish("checked", false);
    csi.stage("checked", &staging, false, &context).unwrap();
    csi.node_publish("checked", &staging, &target, false)
        .unwrap();
    let files = [(target.join("kept"), pattern(2 << 20, 3))];
    write_synced(&files[0]);
    csi.node_unpublish("checked", &target);
    csi.unstage("checked", &staging);
    let state = |device: &str| {
        let header = must("dumpe2fs", &["-h", device]);
        let line = header.lines().find(|l| l.starts_with("Filesystem state:"));
        line.unwrap()
            .trim_start_matches("Filesystem state:")
            .trim()
            .to_string()
    };
    // The filesystem spoiled through the volume staged as a block device.
    let spoil = |csi: &mut Csi, debugfs: &str| {
        csi.stage("checked", &staging, true, &context).unwrap();
        let device = loops_on(&file)[0].name.clone();
        must("debugfs", &["-w", "-R", debugfs, &device]);
        must("tune2fs", &["-E", "force_fsck", &device]);
        assert_eq!(state(&device), "clean with errors");
        csi.unstage("checked", &staging);
    };

    spoil(&mut csi, "set_inode_field <11> links_count 5");
    // Published read-only: not repaired (nothing writes to it unasked).
    let mut read_only = context.clone();
    read_only.insert("readonly".into(), "true".into());
    csi.stage("checked", &staging, false, &read_only).unwrap();
    assert_eq!(state(&loops_on(&file)[0].name), "clean with errors");
    csi.unstage("checked", &staging);
    csi.stage("checked", &staging, false, &context).unwrap();
    assert_eq!(state(&loops_on(&file)[0].name), "clean");
    csi.node_publish("checked", &staging, &target, false)
        .unwrap();
    assert_files(&files);
    csi.node_unpublish("checked", &target);
    csi.unstage("checked", &staging);

    spoil(&mut csi, "clri <2>");
    let refused = csi.stage("checked", &staging, false, &context).unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused}");
    assert!(refused.message().contains("e2fsck -p"), "{refused}");
    assert_eq!((loops_on(&file).len(), mounts_at(&staging)), (0, 0));
    csi.unpublish("checked");
}

/// An ext4 error while the volume is mounted (raised through the
/// kernel's own trigger, `/sys/fs/ext4/<device>/trigger_fs_error`) turns
/// the volume's condition abnormal in NodeGetVolumeStats, saying what the
/// filesystem recorded; staged again, e2fsck checks it (the superblock is
/// marked with errors) and the condition is normal again, the files there.
/// NodeGetVolumeHealth says the same (DEGRADED, FilesystemErrors).
#[test]
fn an_ext4_error_while_mounted_turns_the_condition_abnormal_until_a_stage_checks_it() {
    use ballast::proto::csi::v1::{NodeGetVolumeHealthRequest, VolumeHealthErrorType};
    let dir = tempfile::tempdir().unwrap();
    let (_ctl, _n, mut csi) = cluster(dir.path());
    let _cleanup = Teardown(dir.path().to_path_buf());
    let file = dir.path().join("node-1/state/frontends/errs.fuse/volume");
    let (staging, target) = places_of(dir.path(), "errs");
    csi.create("errs", false);
    csi.up("errs", &staging, &target, false);
    let files = [(target.join("kept"), pattern(1 << 20, 4))];
    write_synced(&files[0]);
    let condition = |csi: &mut Csi| volume_stats(csi, "errs", &target).volume_condition.unwrap();
    let before = condition(&mut csi);
    assert!(!before.abnormal, "{before:?}");

    let device = loops_on(&file)[0].name.clone();
    let trigger = format!("/sys/fs/ext4/{}/trigger_fs_error", &device["/dev/".len()..]);
    std::fs::write(&trigger, "raised by a test").unwrap();
    let after = condition(&mut csi);
    assert!(
        after.abnormal
            && after.message.contains("recorded 1 error(s)")
            && after.message.contains("trigger_test_error"),
        "{after:?}"
    );
    // NodeGetVolumeHealth says it too.
    let health = |csi: &mut Csi| {
        let req = NodeGetVolumeHealthRequest {
            volume_id: "errs".into(),
            ..Default::default()
        };
        let h = csi.rt.block_on(csi.node.node_get_volume_health(req));
        h.unwrap()
            .into_inner()
            .volume_health
            .unwrap()
            .health_statuses
    };
    let entries = health(&mut csi);
    assert!(
        entries.iter().any(|e| e.reason == "FilesystemErrors"
            && e.status == VolumeHealthErrorType::Degraded as i32),
        "{entries:?}"
    );

    csi.down("errs", &staging, &target);
    csi.up("errs", &staging, &target, false);
    let checked = condition(&mut csi);
    assert!(!checked.abnormal, "{checked:?}");
    assert!(health(&mut csi).is_empty());
    assert_files(&files);
    csi.down("errs", &staging, &target);
}

/// Writes `data` at `offset` of the device file `at`, durably.
fn write_device(at: &Path, offset: u64, data: &[u8]) {
    use std::os::unix::fs::FileExt;
    let dev = std::fs::OpenOptions::new().write(true).open(at).unwrap();
    dev.write_all_at(data, offset).unwrap();
    dev.sync_all().unwrap();
}

/// Reads `len` bytes at `offset` of the device file `at`.
fn read_device(at: &Path, offset: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let mut back = vec![0u8; len];
    std::fs::File::open(at)
        .unwrap()
        .read_exact_at(&mut back, offset)
        .unwrap();
    back
}

/// A staging record outlives a reboot, loop devices do not: the number
/// it names may be another volume's device by then. Such a record is
/// never taken at its word: NodePublishVolume refuses (it would hand the
/// pod the other volume's data), NodeStageVolume sets the volume up on a
/// device of its own, and NodeUnstageVolume leaves the other volume's
/// device attached. Each volume reads back its own data.
#[test]
fn a_staging_record_older_than_a_reboot_never_reaches_another_volumes_device() {
    let dir = tempfile::tempdir().unwrap();
    let (_ctl, _n, mut csi) = cluster(dir.path());
    let _cleanup = Teardown(dir.path().to_path_buf());
    let state = dir.path().join("node-1/state");
    let staging = |v: &str| dir.path().join(format!("staging-{v}"));
    let target = |v: &str| dir.path().join(format!("pod/{v}"));
    for (i, v) in ["mine", "other"].into_iter().enumerate() {
        csi.create(v, true);
        let context = csi.publish(v, true);
        csi.stage(v, &staging(v), true, &context).unwrap();
        csi.node_publish(v, &staging(v), &target(v), true).unwrap();
        write_device(&target(v), 1 << 20, &pattern(1 << 20, i as u8));
        csi.node_unpublish(v, &target(v));
    }
    let record = |v: &str| state.join(format!("staged/{v}.json"));
    let device_of = |v: &str| {
        let r: serde_json::Value =
            serde_json::from_slice(&std::fs::read(record(v)).unwrap()).unwrap();
        PathBuf::from(r["device"].as_str().unwrap())
    };
    let theirs = device_of("other");
    // "mine" down (its device detached), and its record put back naming
    // the device "other" has: what a reboot that gave the numbers anew
    // leaves.
    let kept = std::fs::read(record("mine")).unwrap();
    csi.unstage("mine", &staging("mine"));
    let mut stale: serde_json::Value = serde_json::from_slice(&kept).unwrap();
    stale["device"] = serde_json::json!(theirs);
    std::fs::write(record("mine"), serde_json::to_vec(&stale).unwrap()).unwrap();

    let refused = csi
        .node_publish("mine", &staging("mine"), &target("mine"), true)
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused}");
    let published: fn(&Path) -> bool = ballast_node::frontend::blockdev::is_mountpoint;
    assert!(!published(&target("mine")));
    // Unstaged on that record: the other volume's device stays.
    csi.unstage("mine", &staging("mine"));
    let other_file = state.join("frontends/other.fuse/volume");
    assert_eq!(loops_on(&other_file).len(), 1);

    std::fs::write(record("mine"), serde_json::to_vec(&stale).unwrap()).unwrap();
    let context = csi.publish("mine", true);
    csi.stage("mine", &staging("mine"), true, &context).unwrap();
    assert_ne!(device_of("mine"), theirs);
    assert_eq!(loops_on(&state.join("frontends/mine.fuse/volume")).len(), 1);
    for (i, v) in ["mine", "other"].into_iter().enumerate() {
        csi.node_publish(v, &staging(v), &target(v), true).unwrap();
        assert!(
            read_device(&target(v), 1 << 20, 1 << 20) == pattern(1 << 20, i as u8),
            "{v} does not read back its own data"
        );
        csi.down(v, &staging(v), &target(v));
    }
}

/// The volume's engine is killed in the middle of its NodeStage: once
/// its block device's file is exported (while the node asks the engine
/// for the export's connection, then sets up the loop device over the
/// file), and once a loop device is set up over the file (while the
/// node formats it). The controller starts the engine again, which takes
/// the export over or exports anew; the stage, asked again as the
/// kubelet does when it failed as worth trying again, ends; the
/// filesystem is made and mounted, and what is written through it is
/// there after the volume is taken down and up again. (A stage asked
/// again after the first kill failed for good: the dead engine's mount
/// was in the way of the next export.)
#[test]
fn an_engine_killed_in_the_middle_of_node_stage_is_replaced_and_the_stage_ends() {
    let dir = tempfile::tempdir().unwrap();
    let (ctl, _n, mut csi) = cluster(dir.path());
    let _cleanup = Teardown(dir.path().to_path_buf());
    let state = dir.path().join("node-1/state");
    let exported: fn(&Path) -> bool = ballast_node::frontend::blockdev::is_mountpoint;
    let formatting: fn(&Path) -> bool = |export| looped(&export.join("volume"));
    for (i, (volume, when)) in [("exporting", exported), ("formatting", formatting)]
        .into_iter()
        .enumerate()
    {
        let staging = dir.path().join(format!("staging-{volume}"));
        let target = dir.path().join(format!("pod/{volume}"));
        csi.create(volume, false);
        let context = csi.publish(volume, false);
        let first = engine_pid(&state, volume).unwrap();
        let export = state.join(format!("frontends/{volume}.fuse"));
        let killer = std::thread::spawn(move || {
            let end = std::time::Instant::now() + Duration::from_secs(60);
            while !when(&export) {
                assert!(std::time::Instant::now() < end, "the moment never came");
                std::thread::sleep(Duration::from_millis(1));
            }
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(first),
                nix::sys::signal::Signal::SIGKILL,
            )
            .unwrap();
        });
        // As the kubelet does: a stage that failed is asked again. It
        // fails only as worth trying again (the engine it asked ended).
        let end = std::time::Instant::now() + Duration::from_secs(60);
        let mut failed = Vec::new();
        while let Err(e) = csi.stage(volume, &staging, false, &context) {
            assert_eq!(e.code(), Code::Unavailable, "{volume}: {e:?}");
            failed.push(e.message().to_string());
            assert!(
                std::time::Instant::now() < end,
                "{volume}: no stage ended: {failed:?}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        killer.join().unwrap();
        eprintln!("{volume}: stages that failed before one ended: {failed:?}");
        let now = engine_pid(&state, volume).unwrap();
        assert_ne!(now, first, "{volume}: the engine was not replaced");
        wait_event(&ctl.api, &format!("volume/{volume}"), "EngineRestarted");
        csi.node_publish(volume, &staging, &target, false).unwrap();
        let file = (target.join("after-stage"), pattern(8 << 20, 9 + i as u8));
        write_synced(&file);
        std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
        let files = [file];
        assert_files(&files);
        csi.again(volume, &staging, &target, &files);
    }
}

/// What `f` returns, run on a thread of its own, within `limit`; a panic
/// naming `what` otherwise (the thread is left where it waits).
fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(t) => t,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: not done within {limit:?}")
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("{what}: failed"),
    }
}

/// NodeUnstageVolume on a connection of its own to the node plugin's
/// `socket`, as a kubelet's worker sends it.
fn unstage_apart(socket: &Path, volume: &str, staging: &Path) -> Result<(), tonic::Status> {
    let rt = runtime();
    let mut node = {
        let _in = rt.enter();
        NodeClient::new(ballast::grpc::unix_channel(socket).unwrap())
    };
    let req = NodeUnstageVolumeRequest {
        volume_id: volume.into(),
        staging_target_path: staging.display().to_string(),
    };
    rt.block_on(node.node_unstage_volume(req)).map(drop)
}

/// An engine that stops answering (its process stopped, as a hung engine
/// is) holds up the CSI calls that wait on its volume's I/O, and nothing
/// else. With as many unstages held (their unmount waits on the engine)
/// as the node plugin has async workers, and the controller stopped too
/// (nothing replaces the engines meanwhile), another volume is staged,
/// published, written and read back: its replica is served by the same
/// node plugin, and its stage looks at every loop device, the held
/// volumes' among them. Then the controller runs again, hears from the
/// node that the engines hang, replaces them, and the held unstages end.
/// Every file reads back.
#[test]
fn calls_waiting_on_a_hung_engine_hold_up_no_other_volume_and_end_when_it_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let (ctl, n, mut csi) = cluster(dir.path());
    let _cleanup = Teardown(dir.path().to_path_buf());
    let state = dir.path().join("node-1/state");
    let at = |v: &str| {
        (
            dir.path().join(format!("staging-{v}")),
            dir.path().join(format!("pod/{v}")),
        )
    };
    // The node plugin runs one async worker per core.
    let workers = std::thread::available_parallelism().unwrap().get();
    let hung: Vec<String> = (0..workers).map(|i| format!("hung-{i}")).collect();
    let mut files = Vec::new();
    for (i, v) in hung.iter().enumerate() {
        let (staging, target) = at(v);
        csi.create(v, false);
        csi.up(v, &staging, &target, false);
        let file = (target.join("kept"), pattern(4 << 20, i as u8));
        write_synced(&file);
        files.push((v.clone(), file.1));
        csi.node_unpublish(v, &target);
    }
    csi.create("free", false);
    let context = csi.publish("free", false);
    let engines: Vec<i32> = hung
        .iter()
        .map(|v| engine_pid(&state, v).unwrap())
        .collect();
    let mut stopped = vec![ctl.proc.pid()];
    stopped.extend(&engines);
    let _thaw = Thaw(stopped.clone());
    for pid in &stopped {
        stop_process(*pid);
    }

    let held: Vec<_> = hung
        .iter()
        .map(|v| {
            let (socket, v, (staging, _)) = (n.socket.clone(), v.clone(), at(v));
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || tx.send(unstage_apart(&socket, &v, &staging)));
            rx
        })
        .collect();
    // Time for every held unstage to reach its unmount.
    std::thread::sleep(Duration::from_secs(2));

    let (staging, target) = at("free");
    let free = (target.join("written"), pattern(8 << 20, 77));
    let mut csi = within(
        Duration::from_secs(60),
        "the other volume staged, published, written and read back while the hung engine's calls wait",
        {
            let free = free.clone();
            move || {
                csi.stage("free", &staging, false, &context).unwrap();
                csi.node_publish("free", &staging, &target, false).unwrap();
                write_synced(&free);
                assert_files(&[free]);
                csi
            }
        },
    );
    for (v, rx) in hung.iter().zip(&held) {
        assert!(
            matches!(rx.try_recv(), Err(std::sync::mpsc::TryRecvError::Empty)),
            "{v}: the unstage was not held by its stopped engine"
        );
    }

    // The controller runs again: it replaces the hung engines.
    ctl.proc.signal(nix::sys::signal::Signal::SIGCONT);
    for ((v, rx), old) in hung.iter().zip(&held).zip(&engines) {
        let ended = rx
            .recv_timeout(Duration::from_secs(90))
            .unwrap_or_else(|_| panic!("{v}: the held unstage never ended"));
        ended.unwrap_or_else(|e| panic!("{v}: {e:?}"));
        assert_ne!(engine_pid(&state, v), Some(*old), "{v}: not replaced");
        wait_event(&ctl.api, &format!("volume/{v}"), "EngineRestarted");
    }
    for (v, data) in &files {
        let (staging, target) = at(v);
        let context = csi.publish(v, false);
        csi.stage(v, &staging, false, &context).unwrap();
        csi.node_publish(v, &staging, &target, false).unwrap();
        assert_files(&[(target.join("kept"), data.clone())]);
        csi.down(v, &staging, &target);
    }
    let (staging, target) = at("free");
    assert_files(&[free]);
    csi.down("free", &staging, &target);
}

fn volume_stats(csi: &mut Csi, volume: &str, target: &Path) -> NodeGetVolumeStatsResponse {
    csi.rt
        .block_on(csi.node.node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: volume.into(),
            volume_path: target.display().to_string(),
            ..Default::default()
        }))
        .unwrap()
        .into_inner()
}

/// What the stats count in bytes.
fn bytes_of(stats: &NodeGetVolumeStatsResponse) -> VolumeUsage {
    stats
        .usage
        .iter()
        .find(|u| u.unit == volume_usage::Unit::Bytes as i32)
        .cloned()
        .unwrap()
}

/// The message of a refused call, which must name the field.
fn refused(r: Result<(), tonic::Status>, code: Code, field: &str) -> String {
    let e = r.unwrap_err();
    assert_eq!(e.code(), code, "{e}");
    assert!(e.message().contains(field), "{e}");
    e.message().to_string()
}

#[test]
fn the_node_plugin_mounts_only_below_the_kubelet_and_its_state_directories() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let (_ctl, _n, mut csi) = cluster(dir.path());
    let _cleanup = Teardown(dir.path().to_path_buf());
    let (staging, target) = (dir.path().join("staging"), dir.path().join("pod/mount"));
    csi.create("confined", false);
    let context = csi.publish("confined", false);

    // Outside the kubelet directory (the test's), through '..', and
    // through a symlink inside it that leads out.
    let escape = dir.path().join("escape");
    std::os::unix::fs::symlink(outside.path(), &escape).unwrap();
    let dotdot = PathBuf::from(format!("{}/../elsewhere", dir.path().display()));
    for bad in [
        outside.path().join("staging"),
        dotdot,
        escape.join("staging"),
    ] {
        let m = refused(
            csi.stage("confined", &bad, false, &context),
            Code::InvalidArgument,
            "staging_target_path",
        );
        assert!(m.contains(&bad.display().to_string()), "{m}");
    }
    // A volume id that would be a path is no volume's.
    refused(
        csi.stage("../../confined", &staging, false, &context),
        Code::NotFound,
        "volume_id",
    );
    assert_eq!(
        std::fs::read_dir(outside.path()).unwrap().count(),
        0,
        "nothing was made outside"
    );

    csi.stage("confined", &staging, false, &context).unwrap();
    refused(
        csi.node_publish("confined", &staging, &outside.path().join("mount"), false),
        Code::InvalidArgument,
        "target_path",
    );
    refused(
        csi.node_publish("confined", Path::new("/"), &target, false),
        Code::InvalidArgument,
        "staging_target_path",
    );
    let unpublish_root =
        csi.rt
            .block_on(csi.node.node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: "confined".into(),
                target_path: "/".into(),
            }));
    refused(
        unpublish_root.map(drop),
        Code::InvalidArgument,
        "target_path",
    );

    // The volume itself works where it belongs, and keeps what is written.
    csi.node_publish("confined", &staging, &target, false)
        .unwrap();
    let data = pattern(1 << 20, 9);
    std::fs::write(target.join("file"), &data).unwrap();
    csi.again(
        "confined",
        &staging,
        &target,
        &[(target.join("file"), data)],
    );
}
