//! PVC to mounted filesystem on a real API server, driven by the real CSI
//! sidecars (csi-provisioner, csi-attacher, csi-resizer, csi-snapshotter
//! and snapshot-controller of the test bench, with the VolumeSnapshot CRDs
//! of their release) on the controller's socket, with the CSIDriver and
//! the StorageClasses of `deploy/`. There is no kubelet: the test creates what the kubelet would
//! (CSINode objects, the Node labels of NodeGetInfo's topology, the
//! VolumeAttachment of a pod's volume, the scheduler's selected node), and
//! calls the node socket as the kubelet does, with the publish context the
//! attacher recorded. Data is checked by checksum after the volume comes
//! back on a node.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ballast::proto::csi::v1::node_client::NodeClient;
use ballast::proto::csi::v1::volume_capability::{self, AccessType, access_mode::Mode};
use ballast::proto::csi::v1::{
    NodeExpandVolumeRequest, NodePublishVolumeRequest, NodeStageVolumeRequest,
    NodeUnpublishVolumeRequest, NodeUnstageVolumeRequest, VolumeCapability,
};
use k8s_openapi::api::core::v1::{Node as KubeNode, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::harness::*;
use crate::kube_cluster::KubeCluster;

/// A test bench tool running for the test, killed on drop.
struct Sidecar(Child);

impl Sidecar {
    fn start(name: &str, args: &[String], log: PathBuf) -> Sidecar {
        let bin = ballast_k8s_harness::tool(name).unwrap_or_else(|e| panic!("{e}"));
        let out = std::fs::File::create(log).unwrap();
        let child = Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        Sidecar(child)
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn mount_cap() -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(volume_capability::MountVolume {
            fs_type: "ext4".into(),
            ..Default::default()
        })),
        access_mode: Some(volume_capability::AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

struct Bench {
    k: KubeCluster,
    client: kube::Client,
    _sidecars: Vec<Sidecar>,
}

impl Bench {
    fn start() -> Bench {
        assert!(
            nix::unistd::geteuid().is_root(),
            "staging a volume needs root (CI runs as root)"
        );
        let k = KubeCluster::start(3);
        let client = k.rt.block_on(k.cp.client()).unwrap();
        // The deploy's CSIDriver and StorageClasses, as `kubectl apply` does.
        let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/base");
        let kubectl = ballast_k8s_harness::tool("kubectl").unwrap_or_else(|e| panic!("{e}"));
        let out = Command::new(kubectl)
            .arg("--kubeconfig")
            .arg(&k.cp.kubeconfig)
            .args(["apply", "-f"])
            .arg(deploy.join("csidriver.yaml"))
            .args(["-f"])
            .arg(deploy.join("storageclasses.yaml"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        // The VolumeSnapshot CRDs, as a cluster with snapshots has them.
        let crds = [
            "volumesnapshotclasses",
            "volumesnapshotcontents",
            "volumesnapshots",
        ];
        for crd in crds {
            let file =
                ballast_k8s_harness::tool(&format!("crds/snapshot.storage.k8s.io_{crd}.yaml"))
                    .unwrap_or_else(|e| panic!("{e}"));
            kubectl_ok(&k, &["apply", "-f", &file.display().to_string()], None);
        }
        for crd in crds {
            kubectl_ok(
                &k,
                &[
                    "wait",
                    "--for=condition=established",
                    "--timeout=60s",
                    &format!("crd/{crd}.snapshot.storage.k8s.io"),
                ],
                None,
            );
        }
        // What the kubelet registers for each node: its CSINode, and the
        // Node labels of the plugin's topology.
        k.rt.block_on(async {
            let csinodes: Api<CSINode> = Api::all(client.clone());
            let nodes: Api<KubeNode> = Api::all(client.clone());
            for n in &k.c.nodes {
                let csinode: CSINode = serde_json::from_value(json!({
                    "metadata": {"name": n.id},
                    "spec": {"drivers": [{
                        "name": "ballast.csi.dev",
                        "nodeID": n.id,
                        "topologyKeys": [ballast::topology::NODE_KEY],
                    }]},
                }))
                .unwrap();
                csinodes
                    .create(&PostParams::default(), &csinode)
                    .await
                    .unwrap();
                let labels = json!({"metadata": {"labels": {ballast::topology::NODE_KEY: n.id}}});
                nodes
                    .patch(&n.id, &PatchParams::default(), &Patch::Merge(&labels))
                    .await
                    .unwrap();
            }
        });
        let dir = k.c.dir.path().to_path_buf();
        let socket = k.c.ctl.socket.display().to_string();
        let common = |more: &[&str]| -> Vec<String> {
            let mut a = vec![
                format!("--csi-address={socket}"),
                format!("--kubeconfig={}", k.cp.kubeconfig.display()),
                "--timeout=60s".to_string(),
                "--v=3".to_string(),
            ];
            a.extend(more.iter().map(|s| s.to_string()));
            a
        };
        let sidecars = vec![
            Sidecar::start(
                "csi-provisioner",
                &common(&[
                    "--strict-topology",
                    "--immediate-topology=false",
                    "--extra-create-metadata",
                    "--default-fstype=ext4",
                ]),
                dir.join("csi-provisioner.log"),
            ),
            Sidecar::start("csi-attacher", &common(&[]), dir.join("csi-attacher.log")),
            Sidecar::start(
                "csi-resizer",
                &common(&["--handle-volume-inuse-error=false"]),
                dir.join("csi-resizer.log"),
            ),
            Sidecar::start(
                "csi-snapshotter",
                &common(&[]),
                dir.join("csi-snapshotter.log"),
            ),
            Sidecar::start(
                "snapshot-controller",
                &[
                    format!("--kubeconfig={}", k.cp.kubeconfig.display()),
                    "--leader-election=false".to_string(),
                    "--v=3".to_string(),
                ],
                dir.join("snapshot-controller.log"),
            ),
        ];
        Bench {
            k,
            client,
            _sidecars: sidecars,
        }
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), "default")
    }

    fn api_all<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::all(self.client.clone())
    }

    /// What the sidecars said, for a failure's message.
    fn logs(&self) -> String {
        [
            "csi-provisioner",
            "csi-attacher",
            "csi-resizer",
            "csi-snapshotter",
            "snapshot-controller",
        ]
        .iter()
        .map(|s| {
            let text = std::fs::read_to_string(self.k.c.dir.path().join(format!("{s}.log")))
                .unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            format!(
                "--- {s}:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
    }

    fn create_pvc(&self, name: &str, class: &str, size: &str, annotations: BTreeMap<&str, &str>) {
        let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": annotations},
            "spec": {
                "storageClassName": class,
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": size}},
            },
        }))
        .unwrap();
        self.k
            .rt
            .block_on(
                self.api::<PersistentVolumeClaim>()
                    .create(&PostParams::default(), &pvc),
            )
            .unwrap();
    }

    /// The PV a PVC is bound to, once it is Bound.
    fn bound_pv(&self, pvc: &str) -> PersistentVolume {
        let name = wait_for(Duration::from_secs(120), "the PVC Bound", || {
            let c = self
                .k
                .rt
                .block_on(self.api::<PersistentVolumeClaim>().get(pvc))
                .ok()?;
            let bound = c.status.as_ref()?.phase.as_deref() == Some("Bound");
            bound.then(|| c.spec?.volume_name).flatten()
        });
        self.k
            .rt
            .block_on(self.api_all::<PersistentVolume>().get(&name))
            .unwrap_or_else(|e| panic!("{e}\n{}", self.logs()))
    }

    /// A VolumeAttachment of `pv` at `node`, as the kubelet's attach
    /// controller makes for a pod; its publish context once attached.
    fn attach(&self, pv: &str, node: &str) -> HashMap<String, String> {
        let name = format!("va-{pv}-{node}");
        let va: VolumeAttachment = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "attacher": "ballast.csi.dev",
                "nodeName": node,
                "source": {"persistentVolumeName": pv},
            },
        }))
        .unwrap();
        let api = self.api_all::<VolumeAttachment>();
        self.k
            .rt
            .block_on(api.create(&PostParams::default(), &va))
            .unwrap();
        wait_for(
            Duration::from_secs(90),
            "the VolumeAttachment attached",
            || {
                let va = self.k.rt.block_on(api.get(&name)).ok()?;
                let st = va.status?;
                st.attached.then(|| {
                    st.attachment_metadata
                        .unwrap_or_default()
                        .into_iter()
                        .collect()
                })
            },
        )
    }

    /// Deletes the VolumeAttachment and waits until the attacher has
    /// detached (its finalizer gone, the object with it).
    fn detach(&self, pv: &str, node: &str) {
        let name = format!("va-{pv}-{node}");
        let api = self.api_all::<VolumeAttachment>();
        self.k
            .rt
            .block_on(api.delete(&name, &DeleteParams::default()))
            .unwrap();
        wait_for(Duration::from_secs(90), "the VolumeAttachment gone", || {
            matches!(self.k.rt.block_on(api.get_opt(&name)), Ok(None)).then_some(())
        });
    }

    fn node_client(&self, node: &str) -> NodeClient<tonic::transport::Channel> {
        let n = self.k.c.nodes.iter().find(|n| n.id == node).unwrap();
        let _in = self.k.rt.enter();
        NodeClient::new(ballast::grpc::unix_channel(&n.socket).unwrap())
    }
}

/// Runs kubectl on the bench's API server (with `stdin` when given) and
/// returns what it printed; fails the test when kubectl fails.
fn kubectl_ok(k: &KubeCluster, args: &[&str], stdin: Option<&str>) -> String {
    use std::io::Write;
    let kubectl = ballast_k8s_harness::tool("kubectl").unwrap_or_else(|e| panic!("{e}"));
    let mut child = Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(&k.cp.kubeconfig)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input
        .write_all(stdin.unwrap_or_default().as_bytes())
        .unwrap();
    drop(input);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The kubelet's part for one pod on `node`: stage (with the attacher's
/// publish context) and publish; the staging and target paths.
fn kubelet_up(
    b: &Bench,
    node: &str,
    volume: &str,
    context: &HashMap<String, String>,
) -> (PathBuf, PathBuf) {
    let dir = b.k.c.dir.path().join("kubelet").join(node);
    let (staging, target) = (
        dir.join("staging").join(volume),
        dir.join("pods").join(volume),
    );
    let mut c = b.node_client(node);
    b.k.rt
        .block_on(c.node_stage_volume(NodeStageVolumeRequest {
            volume_id: volume.into(),
            publish_context: context.clone(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(mount_cap()),
            ..Default::default()
        }))
        .unwrap();
    b.k.rt
        .block_on(c.node_publish_volume(NodePublishVolumeRequest {
            volume_id: volume.into(),
            staging_target_path: staging.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: Some(mount_cap()),
            ..Default::default()
        }))
        .unwrap();
    (staging, target)
}

fn kubelet_down(b: &Bench, node: &str, volume: &str, staging: &Path, target: &Path) {
    let mut c = b.node_client(node);
    b.k.rt
        .block_on(c.node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: volume.into(),
            target_path: target.display().to_string(),
        }))
        .unwrap();
    b.k.rt
        .block_on(c.node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: volume.into(),
            staging_target_path: staging.display().to_string(),
        }))
        .unwrap();
}

fn blake3_of(path: &Path) -> String {
    blake3::hash(&std::fs::read(path).unwrap())
        .to_hex()
        .to_string()
}

/// Bytes of the filesystem mounted at `path`.
fn fs_size(path: &Path) -> u64 {
    let s = nix::sys::statvfs::statvfs(path).unwrap();
    s.blocks() as u64 * s.fragment_size() as u64
}

fn replicas_of(b: &Bench, volume: &str) -> Vec<serde_json::Value> {
    get_json(&format!("{}/v1/replicas?volume={volume}", b.k.c.api))
        .and_then(|v| v["items"].as_array().cloned())
        .unwrap_or_default()
}

/// Replica directories of `volume` left on any node's disks.
fn replica_dirs_of(b: &Bench, volume: &str) -> Vec<PathBuf> {
    b.k.c
        .nodes
        .iter()
        .filter_map(|n| {
            std::fs::read_dir(b.k.c.dir.path().join(&n.id).join("disk-1/replicas")).ok()
        })
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|f| f.to_string_lossy().starts_with(&format!("{volume}-")))
        })
        .collect()
}

#[test]
fn kube_a_pvc_is_provisioned_attached_staged_written_grown_and_deleted_through_the_real_sidecars() {
    let b = Bench::start();
    let _teardown = Teardown(b.k.c.dir.path().to_path_buf());

    // A PVC on `ballast` becomes Bound to a PV the provisioner made, whose
    // handle is a Ballast volume of 3 replicas.
    b.create_pvc("data", "ballast", "64Mi", BTreeMap::new());
    let pv = b.bound_pv("data");
    let pv_name = pv.metadata.name.clone().unwrap();
    let csi = pv.spec.as_ref().and_then(|s| s.csi.clone()).unwrap();
    assert_eq!(csi.driver, "ballast.csi.dev");
    let volume = csi.volume_handle.clone();
    let stored = b.k.rt.block_on(async {
        let api: Api<ballast::model::VolumeResource> = Api::namespaced(b.client.clone(), "ballast");
        api.get(&volume).await
    });
    let stored = stored.unwrap_or_else(|e| panic!("the volume {volume} is not an object: {e}"));
    assert_eq!(stored.spec.number_of_replicas, 3);
    wait_for(Duration::from_secs(60), "3 replicas of the volume", || {
        (replicas_of(&b, &volume).len() == 3).then_some(())
    });

    // Attached at node-2 by the attacher: the engine runs there.
    let context = b.attach(&pv_name, "node-2");
    assert!(context.contains_key("frontendEndpoint"), "{context:?}");
    let v = get_json(&format!("{}/v1/volumes/{volume}", b.k.c.api)).unwrap();
    assert_eq!(v["status"]["attachedNode"], "node-2", "{v}");

    // The kubelet's part on node-2: files written through the mount.
    let (staging, target) = kubelet_up(&b, "node-2", &volume, &context);
    let files: Vec<(PathBuf, String)> = (0..3u8)
        .map(|i| {
            let p = target.join(format!("file-{i}"));
            let data: Vec<u8> = (0..(1usize << 20) + usize::from(i) * 4099)
                .map(|j| ((j * 131 + usize::from(i) * 7) % 251) as u8)
                .collect();
            std::fs::write(&p, &data).unwrap();
            let sum = blake3_of(&p);
            (p, sum)
        })
        .collect();
    assert!(
        Command::new("sync")
            .arg("-f")
            .arg(&target)
            .status()
            .unwrap()
            .success()
    );
    let size_before = fs_size(&target);

    // A VolumeSnapshot of the PVC while a pod writes to it: made by
    // snapshot-controller and csi-snapshotter through CreateSnapshot.
    let later = target.join("after-the-snapshot");
    kubectl_ok(
        &b.k,
        &["apply", "-f", "-"],
        Some(
            &json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
                    "metadata": {"name": "ballast"}, "driver": "ballast.csi.dev",
                    "deletionPolicy": "Delete"})
            .to_string(),
        ),
    );
    kubectl_ok(
        &b.k,
        &["apply", "-n", "default", "-f", "-"],
        Some(
            &json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                    "metadata": {"name": "data-snap"},
                    "spec": {"volumeSnapshotClassName": "ballast",
                             "source": {"persistentVolumeClaimName": "data"}}})
            .to_string(),
        ),
    );
    wait_for(
        Duration::from_secs(90),
        "the VolumeSnapshot ready to use",
        || {
            let ready = kubectl_ok(
                &b.k,
                &[
                    "get",
                    "-n",
                    "default",
                    "volumesnapshot",
                    "data-snap",
                    "-o",
                    "jsonpath={.status.readyToUse}",
                ],
                None,
            );
            (ready == "true").then_some(())
        },
    );
    std::fs::write(&later, b"written after the snapshot").unwrap();
    kubelet_down(&b, "node-2", &volume, &staging, &target);
    b.detach(&pv_name, "node-2");
    let v = get_json(&format!("{}/v1/volumes/{volume}", b.k.c.api)).unwrap();
    assert!(v["status"]["attachedNode"].is_null(), "detached: {v}");
    let taken = get_json(&format!("{}/v1/snapshots?volume={volume}", b.k.c.api)).unwrap();
    assert_eq!(taken["items"].as_array().map(Vec::len), Some(1), "{taken}");

    // A PVC restored from it, on another node: the files as they were at
    // the snapshot, and not the one written after it.
    let restored: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "restored"},
        "spec": {
            "storageClassName": "ballast",
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "64Mi"}},
            "dataSource": {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot",
                           "name": "data-snap"},
        },
    }))
    .unwrap();
    b.k.rt
        .block_on(
            b.api::<PersistentVolumeClaim>()
                .create(&PostParams::default(), &restored),
        )
        .unwrap();
    let restored_pv = b.bound_pv("restored");
    let restored_name = restored_pv.metadata.name.clone().unwrap();
    let restored_volume = restored_pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.clone())
        .unwrap()
        .volume_handle;
    let context = b.attach(&restored_name, "node-1");
    let (r_staging, r_target) = kubelet_up(&b, "node-1", &restored_volume, &context);
    for (p, sum) in &files {
        let there = r_target.join(p.file_name().unwrap());
        assert_eq!(
            &blake3_of(&there),
            sum,
            "{} restored as written",
            there.display()
        );
    }
    assert!(!r_target.join("after-the-snapshot").exists());
    kubelet_down(&b, "node-1", &restored_volume, &r_staging, &r_target);
    b.detach(&restored_name, "node-1");

    // The restored PVC and the snapshot deleted: the VolumeSnapshotContent
    // goes, and Ballast's snapshot with it (DeleteSnapshot).
    b.k.rt
        .block_on(
            b.api::<PersistentVolumeClaim>()
                .delete("restored", &DeleteParams::default()),
        )
        .unwrap();
    kubectl_ok(
        &b.k,
        &["delete", "-n", "default", "volumesnapshot", "data-snap"],
        None,
    );
    wait_for(
        Duration::from_secs(90),
        "Ballast's snapshot deleted",
        || {
            let left = get_json(&format!("{}/v1/snapshots?volume={volume}", b.k.c.api))?;
            (left["items"].as_array().map(Vec::len) == Some(0)).then_some(())
        },
    );

    // Grown: the PVC asks for more; the resizer grows every replica.
    let grow = json!({"spec": {"resources": {"requests": {"storage": "128Mi"}}}});
    b.k.rt
        .block_on(b.api::<PersistentVolumeClaim>().patch(
            "data",
            &PatchParams::default(),
            &Patch::Merge(&grow),
        ))
        .unwrap();
    wait_for(
        Duration::from_secs(90),
        "the PV grown by the resizer",
        || {
            let pv =
                b.k.rt
                    .block_on(b.api_all::<PersistentVolume>().get(&pv_name))
                    .ok()?;
            let cap = pv.spec?.capacity?.get("storage")?.0.clone();
            (cap == "128Mi").then_some(())
        },
    );
    let v = get_json(&format!("{}/v1/volumes/{volume}", b.k.c.api)).unwrap();
    assert_eq!(v["spec"]["size"], 128u64 << 20, "{v}");

    // Back on node-2, staged (the filesystem grows to the device) and
    // expanded as the kubelet does: every file reads back.
    let context = b.attach(&pv_name, "node-2");
    let (staging, target) = kubelet_up(&b, "node-2", &volume, &context);
    let mut c = b.node_client("node-2");
    b.k.rt
        .block_on(c.node_expand_volume(NodeExpandVolumeRequest {
            volume_id: volume.clone(),
            volume_path: target.display().to_string(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(mount_cap()),
            ..Default::default()
        }))
        .unwrap();
    assert!(
        fs_size(&target) > size_before + (48 << 20),
        "the filesystem grew: {} -> {}",
        size_before,
        fs_size(&target)
    );
    for (p, sum) in &files {
        assert_eq!(&blake3_of(p), sum, "{} reads back as written", p.display());
    }
    kubelet_down(&b, "node-2", &volume, &staging, &target);
    b.detach(&pv_name, "node-2");

    // Strict-local, WaitForFirstConsumer: provisioned once the scheduler
    // picked node-3 for the pod, on node-3, and the PV keeps pods there.
    b.create_pvc(
        "scratch",
        "ballast-strict-local",
        "32Mi",
        BTreeMap::from([("volume.kubernetes.io/selected-node", "node-3")]),
    );
    let local_pv = b.bound_pv("scratch");
    let local = local_pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.clone())
        .unwrap()
        .volume_handle;
    let affinity =
        serde_json::to_value(local_pv.spec.as_ref().unwrap().node_affinity.clone()).unwrap();
    assert_eq!(
        affinity["required"]["nodeSelectorTerms"][0]["matchExpressions"][0],
        json!({"key": ballast::topology::NODE_KEY, "operator": "In", "values": ["node-3"]}),
        "{affinity}"
    );
    let on: Vec<String> = replicas_of(&b, &local)
        .iter()
        .filter_map(|r| r["spec"]["nodeId"].as_str().map(str::to_string))
        .collect();
    assert_eq!(on, ["node-3"], "its one replica is on the pod's node");

    // Deleting the PVCs deletes the PVs, the volumes and every replica's data.
    for pvc in ["data", "scratch"] {
        b.k.rt
            .block_on(
                b.api::<PersistentVolumeClaim>()
                    .delete(pvc, &DeleteParams::default()),
            )
            .unwrap();
    }
    for (pv, vol) in [
        (pv_name.as_str(), volume.as_str()),
        (local_pv.metadata.name.as_deref().unwrap(), local.as_str()),
    ] {
        wait_for(Duration::from_secs(90), "the PV deleted", || {
            matches!(
                b.k.rt.block_on(b.api_all::<PersistentVolume>().get_opt(pv)),
                Ok(None)
            )
            .then_some(())
        });
        wait_for(
            Duration::from_secs(60),
            "the volume and its replicas gone",
            || {
                let gone = get_json(&format!("{}/v1/volumes/{vol}", b.k.c.api))
                    .is_none_or(|v| v["name"] != vol);
                (gone && replicas_of(&b, vol).is_empty() && replica_dirs_of(&b, vol).is_empty())
                    .then_some(())
            },
        );
    }
}
