//! The CSI Node service. A volume published at this node has its engine
//! running here (ControllerPublishVolume started it). NodeStageVolume asks
//! the engine to export the volume as a file (FUSE), attaches a loop device
//! to it (one that stays attached if the node plugin restarts), and for a
//! mount volume makes the filesystem when the device holds none and mounts
//! it at the staging path. NodePublishVolume bind-mounts the staging path,
//! or for a block volume the device, at the target path. Unpublish and
//! unstage undo it in reverse order. NodeExpandVolume grows a staged
//! filesystem to its device after an (offline) expansion. Every call is
//! idempotent, and a call on a volume that another call is busy with is
//! ABORTED.
//!
//! What was staged is recorded in `<state-dir>/staged/<volume>.json` (the
//! device, the staging path, the targets), written whole and durably. The
//! kernel has the last word: a record counts only while its loop device
//! is on the volume's export (not after a reboot gave the number to
//! another), a stage takes a loop device already on the export rather
//! than make a second, and unstage detaches every one there, so a record
//! torn or lost by a crash neither doubles a mount nor leaks a device;
//! the stage that writes it again takes the targets from the kernel's
//! mounts of the device.
//! Devices are found by their file's identity (device number and inode)
//! as well as its path: one set up by a node plugin whose container (and
//! mount namespace) ended has a file the kernel names `/volume`.
//!
//! **A call waits on its volume alone.** Each call's work on files,
//! mounts and devices runs on the blocking pool, not on the async workers
//! that also serve the node's replicas, heartbeats and other calls: a
//! mount, an unmount or a filesystem check waits on the volume's I/O, so
//! on its engine, which may hang. Such a call holds its volume (another
//! call on it is ABORTED) and nothing else. A call whose client went
//! away runs to its end, so it never leaves a stage half done.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ballast::csi_caps::check_capability;
use ballast::guard::{KeyGuard, KeyedGuards};
use ballast::model::FsType;
use ballast::proto::csi::v1::node_server::Node;
use ballast::proto::csi::v1::node_service_capability::{self, rpc::Type as RpcType};
use ballast::proto::csi::v1::volume_capability::AccessType;
use ballast::proto::csi::v1::{
    NodeExpandVolumeRequest, NodeExpandVolumeResponse, NodeGetCapabilitiesRequest,
    NodeGetCapabilitiesResponse, NodeGetInfoRequest, NodeGetInfoResponse,
    NodeGetVolumeStatsRequest, NodeGetVolumeStatsResponse, NodePublishVolumeRequest,
    NodePublishVolumeResponse, NodeServiceCapability, NodeStageVolumeRequest,
    NodeStageVolumeResponse, NodeUnpublishVolumeRequest, NodeUnpublishVolumeResponse,
    NodeUnstageVolumeRequest, NodeUnstageVolumeResponse, VolumeCapability, VolumeCondition,
    VolumeUsage, volume_usage,
};
use ballast::proto::csi::v1::{
    NodeGetStorageHealthRequest, NodeGetStorageHealthResponse, NodeGetVolumeHealthRequest,
    NodeGetVolumeHealthResponse, StorageHealthErrorType, VolumeHealth, VolumeHealthErrorType,
    node_get_storage_health_response, volume_health::VolumeHealthEntry,
};
use tonic::{Request, Response, Status};

use crate::context::NodeContext;
use crate::error::Error;
use crate::frontend::blockdev::{
    FileId, LoopDevice, backing_file, backing_id, is_mountpoint, loops_of, mounted_from, mounts_of,
};

use super::paths::Confinement;

/// How long an unstage waits for a detached loop device that another
/// opener still holds.
const LET_GO: std::time::Duration = std::time::Duration::from_secs(5);

/// Waits until each detached device (with the file it had) has let go of
/// that file. LOOP_CLR_FD detaches at once only from the device's last
/// opener; another (udev's probe, a scan of the machine's loop devices, a
/// mount of its filesystem left in another mount namespace) defers it to
/// its own last close, and the volume's export stays busy until then.
/// Busy (ABORTED, the CO asks again) past `LET_GO`, naming the device.
fn wait_let_go(detached: &[(PathBuf, Option<PathBuf>)]) -> Result<(), Error> {
    let start = std::time::Instant::now();
    loop {
        let held: Vec<String> = detached
            .iter()
            .filter(|(device, file)| file.is_some() && backing_file(device) == *file)
            .map(|(device, _)| device.display().to_string())
            .collect();
        if held.is_empty() {
            return Ok(());
        }
        if start.elapsed() >= LET_GO {
            return Err(Error::Busy(format!(
                "{} still attached to the volume's file {:?} after its detach: another opener holds it (a mount of its filesystem in another mount namespace, or a process); it lets go at that opener's last close",
                held.join(", "),
                LET_GO
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

pub struct NodeService(Arc<Inner>);

/// What the calls share.
struct Inner {
    ctx: Arc<NodeContext>,
    /// `<state-dir>/staged`.
    records: PathBuf,
    /// Volumes a call is working on.
    busy: KeyedGuards,
    /// Where staging and target paths may lie.
    paths: Confinement,
}

/// Why a volume has no condition here.
const NO_ENGINE: &str = "no engine of the volume runs on this node";

/// What NodeStageVolume did, for publish and unstage; and where the
/// volume is published.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Staged {
    device: PathBuf,
    staging: PathBuf,
    block: bool,
    /// Target paths it was published at, and whether each publication
    /// wanted the volume to itself (SINGLE_NODE_SINGLE_WRITER).
    #[serde(default)]
    published: std::collections::BTreeMap<PathBuf, bool>,
    /// The boot it was staged in, and the identity of the export's file
    /// the device was attached to: what finds the device again once the
    /// file cannot be looked at (its engine died).
    #[serde(default)]
    boot: String,
    #[serde(default)]
    export: Option<FileId>,
}

/// This boot of the machine (`/proc/sys/kernel/random/boot_id`).
fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|b| b.trim().to_string())
        .unwrap_or_default()
}

fn required(value: &str, field: &str) -> Result<(), Error> {
    if value.is_empty() {
        return Err(Error::Invalid {
            field: field.into(),
            message: "is required".into(),
        });
    }
    Ok(())
}

/// A volume id that can name a volume: refused ids name no volume here.
/// (They would otherwise become paths: `<state-dir>/staged/<id>.json`.)
fn volume_id(id: &str) -> Result<(), Error> {
    required(id, "volume_id")?;
    ballast::model::validate_name(id)
        .map_err(|why| Error::NotFound(format!("volume_id: no volume has the id {id:?}: {why}")))
}

fn capability(cap: Option<&VolumeCapability>) -> Result<&VolumeCapability, Error> {
    let invalid = |message: String| Error::Invalid {
        field: "volume_capability".into(),
        message,
    };
    let cap = cap.ok_or_else(|| invalid("is required".into()))?;
    check_capability(cap).map_err(invalid)?;
    Ok(cap)
}

/// Runs a command to its end; its output, whatever its exit status.
fn output(cmd: &str, args: &[&std::ffi::OsStr]) -> Result<std::process::Output, Error> {
    std::process::Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| Error::Internal(format!("{cmd}: {e}")))
}

/// Runs a command that must succeed; its stderr is the error.
fn run(cmd: &str, args: &[&std::ffi::OsStr]) -> Result<(), Error> {
    let out = output(cmd, args)?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::Internal(format!(
            "{cmd} {}: {}",
            args.iter()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Checks the ext4 on `device` with `e2fsck -p`, as the kubelet's own
/// mounts do before a read-write mount: a filesystem marked clean is left as it is
/// (unless `full`, which resize2fs needs), one marked with errors is
/// checked and what is safe to repair unattended is repaired. Errors it
/// cannot repair so refuse the mount (FAILED_PRECONDITION), saying what
/// e2fsck said: mounted, they would spread.
fn check_ext4(device: &Path, full: bool) -> Result<(), Error> {
    let mut args = vec![os("-p")];
    if full {
        args.push(os("-f"));
    }
    args.push(device.as_os_str());
    let check = output("e2fsck", &args)?;
    let said = || {
        let mut text = String::from_utf8_lossy(&check.stdout).trim().to_string();
        let err = String::from_utf8_lossy(&check.stderr);
        if !err.trim().is_empty() {
            text = format!("{text} {}", err.trim());
        }
        text
    };
    match check.status.code() {
        // No errors.
        Some(0) => Ok(()),
        // Errors corrected (2: and the machine should reboot, which is
        // for a mounted root filesystem, not this one).
        Some(1 | 2) => {
            tracing::warn!(device = %device.display(), e2fsck = %said(), "filesystem errors corrected before the mount");
            Ok(())
        }
        Some(4) => Err(Error::Refused(format!(
            "the volume's ext4 on {} has errors e2fsck -p does not correct unattended; \
             it is not mounted (repair it by hand: stage the volume as a block device and run e2fsck on it): {}",
            device.display(),
            said()
        ))),
        code => Err(Error::Internal(format!(
            "e2fsck {} (exit {code:?}): {}",
            device.display(),
            said()
        ))),
    }
}

/// What the ext4 mounted at `path` has recorded of errors (the kernel's
/// `/sys/fs/ext4/<device>/`: the count its superblock keeps, which
/// e2fsck clears once it checked them); None when there are none, or
/// when no ext4 is mounted there.
fn filesystem_errors(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path).ok()?.dev();
    let (major, minor) = (nix::sys::stat::major(dev), nix::sys::stat::minor(dev));
    let block = std::fs::read_link(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    let at = Path::new("/sys/fs/ext4").join(block.file_name()?);
    let read = |name: &str| std::fs::read_to_string(at.join(name)).map(|t| t.trim().to_string());
    let count: u64 = read("errors_count").ok()?.parse().ok()?;
    if count == 0 {
        return None;
    }
    let first = read("first_error_func").unwrap_or_default();
    let when = read("first_error_time")
        .ok()
        .and_then(|t| t.parse::<i64>().ok())
        .and_then(|t| chrono::DateTime::from_timestamp(t, 0))
        .map_or_else(String::new, |t| format!(" at {}", t.to_rfc3339()));
    Some(format!(
        "its ext4 has recorded {count} error(s), the first in {first}{when}: its files may be damaged; \
         unstage and stage it again for e2fsck to check it"
    ))
}

/// Whether this process may resize a mounted ext4 (CAP_SYS_RESOURCE in
/// its effective set).
pub fn has_cap_sys_resource() -> bool {
    const CAP_SYS_RESOURCE: u32 = 24;
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("CapEff:"))?;
            u64::from_str_radix(line.split_whitespace().nth(1)?, 16).ok()
        })
        .is_some_and(|caps| caps >> CAP_SYS_RESOURCE & 1 == 1)
}

/// The filesystem on `device`, if it holds one.
fn filesystem_on(device: &Path) -> Result<Option<String>, Error> {
    let args = ["-p", "-o", "value", "-s", "TYPE"].map(os);
    let out = output("blkid", &[&args[..], &[device.as_os_str()]].concat())?;
    match out.status.code() {
        Some(0) => Ok(Some(
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
        )),
        // 2: nothing found.
        Some(2) => Ok(None),
        _ => Err(Error::Internal(format!(
            "blkid {}: {}",
            device.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))),
    }
}

/// The size of the ext4 filesystem on `device`, from its superblock.
fn ext4_bytes(device: &Path) -> Result<u64, Error> {
    let out = output("dumpe2fs", &[os("-h"), device.as_os_str()])?;
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    match (field("Block count:"), field("Block size:")) {
        (Some(n), Some(b)) => Ok(n * b),
        _ => Err(Error::Internal(format!(
            "dumpe2fs {}: no block count in {}",
            device.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))),
    }
}

/// The size of a device (or file) in bytes.
fn device_size(path: &Path) -> Result<u64, Error> {
    use std::io::Seek;
    std::fs::File::open(path)
        .and_then(|mut f| f.seek(std::io::SeekFrom::End(0)))
        .map_err(|e| Error::disk(path, e.to_string()))
}

fn os(s: &str) -> &std::ffi::OsStr {
    std::ffi::OsStr::new(s)
}

impl NodeService {
    pub fn new(ctx: Arc<NodeContext>, state_dir: &Path, kubelet_dir: &Path) -> Self {
        NodeService(Arc::new(Inner {
            ctx,
            records: state_dir.join("staged"),
            busy: KeyedGuards::default(),
            paths: Confinement::new([kubelet_dir.to_path_buf(), state_dir.to_path_buf()]),
        }))
    }

    /// Runs `call` on the blocking pool, in the span of the RPC.
    async fn blocking<T: Send + 'static>(
        &self,
        call: impl FnOnce(&Inner) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, Error> {
        let inner = self.0.clone();
        let span = tracing::Span::current();
        tokio::task::spawn_blocking(move || span.in_scope(|| call(&inner)))
            .await
            .map_err(|e| Error::Internal(format!("the call ended: {e}")))?
    }
}

/// Waits for an async call of the engines' table, from the blocking pool.
fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Handle::current().block_on(f)
}

impl Inner {
    /// Takes the volume for this call; another call on it: ABORTED.
    fn hold(&self, volume: &str) -> Result<KeyGuard, Error> {
        self.busy
            .try_take(volume)
            .ok_or_else(|| Error::Busy(format!("another call is working on volume {volume}")))
    }

    fn record_path(&self, volume: &str) -> PathBuf {
        self.records.join(format!("{volume}.json"))
    }

    /// The file of the volume's export, which its loop device is on.
    fn export_file(&self, volume: &str) -> PathBuf {
        self.ctx
            .engines
            .export_dir(volume)
            .join(crate::frontend::fuse::FILE_NAME)
    }

    /// What the record of `volume` says; None when there is none. One
    /// that cannot be read or parsed (torn, edited by hand) is an error
    /// naming its file.
    fn staged(&self, volume: &str) -> Result<Option<Staged>, Error> {
        let path = self.record_path(volume);
        let text = match std::fs::read(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::disk(&path, format!("the staging record: {e}"))),
        };
        serde_json::from_slice(&text).map(Some).map_err(|e| {
            Error::disk(
                &path,
                format!(
                    "the staging record cannot be parsed ({e}); NodeStageVolume records the volume again"
                ),
            )
        })
    }

    /// The record of `volume` when it is true now: its loop device is on
    /// the volume's export. A record older than a reboot names a device
    /// that is gone, or that another volume has now.
    fn staged_now(&self, volume: &str) -> Result<Option<Staged>, Error> {
        let on_export = loops_of(&self.export_file(volume));
        Ok(self
            .staged(volume)?
            .filter(|s| on_export.contains(&s.device)))
    }

    /// Writes the record of `volume` whole (a new file renamed over the
    /// old) and durably.
    fn record(&self, volume: &str, s: &Staged) -> Result<(), Error> {
        std::fs::create_dir_all(&self.records)
            .map_err(|e| Error::disk(&self.records, e.to_string()))?;
        let body = serde_json::to_vec(s).map_err(|e| Error::Internal(e.to_string()))?;
        crate::replica::write_durably(&self.records, &format!("{volume}.json"), &body)
            .map_err(|e| Error::disk(self.record_path(volume), e.to_string()))
    }

    /// Undoes a stage as far as it got; every step tolerates what is
    /// already undone. Every loop device on the volume's export goes,
    /// recorded or not (a record may be torn, or lost before it was
    /// written); a recorded one that now serves something else stays.
    fn teardown(&self, volume: &str, staging: &Path) -> Result<(), Error> {
        if is_mountpoint(staging) {
            run("umount", &[staging.as_os_str()])?;
        }
        let file = self.export_file(volume);
        let mut devices = loops_of(&file);
        match self.staged(volume) {
            // On the export of an engine that died, which cannot be looked
            // at or was unmounted since: the device the record names, if
            // it is still on the file it was attached to in this boot.
            Ok(Some(s))
                if !devices.contains(&s.device)
                    && s.boot == boot_id()
                    && s.export.is_some()
                    && backing_id(&s.device) == s.export =>
            {
                devices.push(s.device);
            }
            Err(e) => {
                tracing::warn!(volume, error = %e, "unstaging what is set up; the record is removed");
            }
            _ => {}
        }
        let mut detached = Vec::new();
        for device in devices {
            let file = backing_file(&device);
            if let Err(e) = LoopDevice::detach_path(&device)
                // ENXIO: already detached.
                && e.raw_os_error() != Some(libc::ENXIO)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                return Err(Error::Internal(format!(
                    "detaching {}: {e}",
                    device.display()
                )));
            }
            detached.push((device, file));
        }
        wait_let_go(&detached)?;
        block_on(self.ctx.engines.unexport(volume))?;
        let _ = std::fs::remove_file(self.record_path(volume));
        Ok(())
    }

    fn stage(&self, req: NodeStageVolumeRequest) -> Result<(), Error> {
        volume_id(&req.volume_id)?;
        required(&req.staging_target_path, "staging_target_path")?;
        let cap = capability(req.volume_capability.as_ref())?;
        let volume = req.volume_id.as_str();
        let staging = self
            .paths
            .check("staging_target_path", &req.staging_target_path)?;
        let block = matches!(cap.access_type, Some(AccessType::Block(_)));
        let _busy = self.hold(volume)?;
        let file = self.export_file(volume);
        let recorded = self.staged_now(volume).unwrap_or_else(|e| {
            tracing::warn!(volume, error = %e, "staging from what is set up; the record is written again");
            None
        });
        if let Some(s) = &recorded {
            if s.staging != staging || s.block != block {
                return Err(Error::AlreadyExists(format!(
                    "volume {volume} is staged at {} as {}",
                    s.staging.display(),
                    if s.block {
                        "a block device"
                    } else {
                        "a filesystem"
                    }
                )));
            }
            if block || mounted_from(&staging, &s.device) {
                return Ok(());
            }
        }
        // A loop device already on the export is taken, not a second one
        // (two block devices of one filesystem, both mounted, corrupt it):
        // the record was torn, or lost before it was written, or written
        // before the mount.
        let there = loops_of(&file);
        let mounted = there.iter().find(|d| mounted_from(&staging, d));
        if !block && mounted.is_none() && is_mountpoint(&staging) {
            return Err(Error::AlreadyExists(format!(
                "{} has a filesystem mounted that is not volume {volume}'s",
                staging.display()
            )));
        }
        let taken = mounted.or(there.first());
        let device = match taken {
            Some(d) => {
                tracing::info!(volume, device = %d.display(), "a loop device is on the volume's export already; the stage takes it");
                d.clone()
            }
            None => self.attach(volume)?,
        };
        // Where it is published: as recorded, or, without a record, where
        // the kernel has it mounted (each in the mode this stage asks).
        let published = match recorded {
            Some(s) => s.published,
            None => {
                let single = ballast::csi_caps::single_writer(cap);
                mounts_of(&device)
                    .into_iter()
                    .filter(|t| *t != staging)
                    .filter(|t| {
                        self.paths
                            .check("target_path", &t.to_string_lossy())
                            .is_ok()
                    })
                    .map(|t| (t, single))
                    .collect()
            }
        };
        self.record(
            volume,
            &Staged {
                device: device.clone(),
                staging: staging.clone(),
                block,
                published,
                boot: boot_id(),
                export: backing_id(&device),
            },
        )?;
        let mounted = if block {
            std::fs::create_dir_all(&staging).map_err(|e| Error::disk(&staging, e.to_string()))
        } else if mounted_from(&staging, &device) {
            Ok(())
        } else {
            self.make_and_mount(&req, cap, &device, &staging)
        };
        if let Err(e) = mounted {
            let _ = self.teardown(volume, &staging);
            return Err(e);
        }
        tracing::info!(volume, device = %device.display(), staging = %staging.display(), block, "volume staged");
        Ok(())
    }

    /// Exports the volume as a file and attaches a loop device to it that
    /// stays; the device.
    fn attach(&self, volume: &str) -> Result<PathBuf, Error> {
        let file = block_on(self.ctx.engines.export(volume))?;
        let device = LoopDevice::attach_to_stay(&file).map_err(|e| match e.raw_os_error() {
            // The export's engine ended, and its connection with it:
            // the next stage asks the engine started next.
            Some(libc::ENOTCONN) => Error::Unavailable(format!(
                "loop device: the engine of {volume} ended under its export ({e})"
            )),
            _ => Error::Internal(format!("loop device: {e}")),
        })?;
        Ok(device.path.clone())
    }

    /// Makes the filesystem when the device holds none, and mounts it.
    fn make_and_mount(
        &self,
        req: &NodeStageVolumeRequest,
        cap: &VolumeCapability,
        device: &Path,
        staging: &Path,
    ) -> Result<(), Error> {
        let Some(AccessType::Mount(m)) = &cap.access_type else {
            return Ok(());
        };
        let wanted = if !m.fs_type.is_empty() {
            m.fs_type.as_str()
        } else {
            req.volume_context
                .get("fsType")
                .map_or(FsType::Ext4.as_str(), String::as_str)
        };
        let fs: FsType = wanted.parse().map_err(|e: String| Error::Invalid {
            field: "fs_type".into(),
            message: e,
        })?;
        match filesystem_on(device)? {
            None => {
                let force = match fs {
                    FsType::Ext4 => "-F",
                    FsType::Xfs => "-f",
                };
                let extra = req
                    .volume_context
                    .get("mkfsParams")
                    .cloned()
                    .unwrap_or_default();
                let mut args: Vec<&std::ffi::OsStr> = vec![os(force)];
                args.extend(extra.split_whitespace().map(os));
                args.push(device.as_os_str());
                run(&format!("mkfs.{}", fs.as_str()), &args)?;
            }
            Some(found) if found != fs.as_str() => {
                return Err(Error::Refused(format!(
                    "the volume holds a {found} filesystem, not {fs}; it is not reformatted"
                )));
            }
            // Checked before every mount: a crash of the pod's node may
            // have left it marked with errors. The volume grew while
            // unpublished: the filesystem follows, checked in full first.
            Some(_) if fs == FsType::Ext4 => {
                let grown = ext4_bytes(device)? < device_size(device)?;
                // A read-only volume is not repaired, as the kubelet's own
                // mounts leave it.
                let read_only = ballast::csi_caps::read_only(cap, &req.publish_context)
                    || m.mount_flags.iter().any(|f| f == "ro");
                if grown || !read_only {
                    check_ext4(device, grown)?;
                }
                if grown {
                    run("resize2fs", &[device.as_os_str()])?;
                    tracing::info!(device = %device.display(), "filesystem grown to its device");
                }
            }
            Some(_) => {}
        }
        std::fs::create_dir_all(staging).map_err(|e| Error::disk(staging, e.to_string()))?;
        let mut args = vec![os("-t"), os(fs.as_str())];
        let flags = m.mount_flags.join(",");
        if !flags.is_empty() {
            args.extend([os("-o"), os(&flags)]);
        }
        args.extend([device.as_os_str(), staging.as_os_str()]);
        run("mount", &args)
    }

    fn unstage(&self, req: NodeUnstageVolumeRequest) -> Result<(), Error> {
        volume_id(&req.volume_id)?;
        required(&req.staging_target_path, "staging_target_path")?;
        let staging = self
            .paths
            .check("staging_target_path", &req.staging_target_path)?;
        let _busy = self.hold(&req.volume_id)?;
        self.teardown(&req.volume_id, &staging)?;
        tracing::info!(volume = %req.volume_id, "volume unstaged");
        Ok(())
    }

    fn publish(&self, req: NodePublishVolumeRequest) -> Result<(), Error> {
        volume_id(&req.volume_id)?;
        required(&req.staging_target_path, "staging_target_path")?;
        required(&req.target_path, "target_path")?;
        let staging = self
            .paths
            .check("staging_target_path", &req.staging_target_path)?;
        let target = self.paths.check("target_path", &req.target_path)?;
        let cap = capability(req.volume_capability.as_ref())?;
        let _busy = self.hold(&req.volume_id)?;
        let mut s = self.staged_now(&req.volume_id)?.ok_or_else(|| {
            Error::Refused(format!(
                "volume {} is not staged on this node (NodeStageVolume first)",
                req.volume_id
            ))
        })?;
        let block = matches!(cap.access_type, Some(AccessType::Block(_)));
        if block != s.block {
            return Err(Error::Invalid {
                field: "volume_capability".into(),
                message: "its access type is not the one the volume was staged with".into(),
            });
        }
        if is_mountpoint(&target) {
            return Ok(());
        }
        // A single writer has the volume to itself on its node; other
        // modes share it between target paths.
        let single = ballast::csi_caps::single_writer(cap);
        s.published.retain(|t, _| *t != target && is_mountpoint(t));
        if let Some((other, _)) = s.published.iter().find(|(_, sw)| single || **sw) {
            return Err(Error::Refused(format!(
                "volume {} is published at {} with SINGLE_NODE_SINGLE_WRITER, or is asked for that mode here: one target path at a time",
                req.volume_id,
                other.display()
            )));
        }
        let source = if block {
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent).map_err(|e| Error::disk(parent, e.to_string()))?;
            }
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&target)
                .map_err(|e| Error::disk(&target, e.to_string()))?;
            s.device.clone()
        } else {
            std::fs::create_dir_all(&target).map_err(|e| Error::disk(&target, e.to_string()))?;
            staging
        };
        run(
            "mount",
            &[os("--bind"), source.as_os_str(), target.as_os_str()],
        )?;
        // Read-only when this publication asks, or when the volume was
        // published to this node read-only (ControllerPublishVolume).
        if req.readonly || ballast::csi_caps::published_read_only(&req.publish_context) {
            run(
                "mount",
                &[os("-o"), os("remount,bind,ro"), target.as_os_str()],
            )?;
        }
        s.published.insert(target.clone(), single);
        self.record(&req.volume_id, &s)?;
        tracing::info!(volume = %req.volume_id, target = %target.display(), "volume published");
        Ok(())
    }

    fn unpublish(&self, req: NodeUnpublishVolumeRequest) -> Result<(), Error> {
        volume_id(&req.volume_id)?;
        required(&req.target_path, "target_path")?;
        let target = self.paths.check("target_path", &req.target_path)?;
        let _busy = self.hold(&req.volume_id)?;
        if is_mountpoint(&target) {
            run("umount", &[target.as_os_str()])?;
        }
        let removed = match std::fs::symlink_metadata(&target) {
            Ok(m) if m.is_dir() => std::fs::remove_dir(&target),
            Ok(_) => std::fs::remove_file(&target),
            Err(_) => Ok(()),
        };
        removed.map_err(|e| Error::disk(&target, e.to_string()))?;
        match self.staged(&req.volume_id) {
            Ok(Some(mut s)) => {
                if s.published.remove(&target).is_some() {
                    self.record(&req.volume_id, &s)?;
                }
            }
            // The next stage writes it again.
            Err(e) => {
                tracing::warn!(volume = %req.volume_id, error = %e, "unpublished; the record is not changed");
            }
            Ok(None) => {}
        }
        Ok(())
    }

    /// Grows a staged volume's filesystem to its device (which has the
    /// volume's new size since the engine restarted with it).
    fn expand(&self, req: NodeExpandVolumeRequest) -> Result<NodeExpandVolumeResponse, Error> {
        volume_id(&req.volume_id)?;
        required(&req.volume_path, "volume_path")?;
        let _busy = self.hold(&req.volume_id)?;
        let s = self.staged_now(&req.volume_id)?.ok_or_else(|| {
            Error::NotFound(format!(
                "volume {} is not staged on this node",
                req.volume_id
            ))
        })?;
        // Grown while published: the loop device takes the new size of the
        // engine's file first.
        let file = self.export_file(&req.volume_id);
        if file.exists() {
            LoopDevice::refresh_capacity(&s.device, &file)
                .map_err(|e| Error::disk(&s.device, format!("taking the new size: {e}")))?;
        }
        let size = device_size(&s.device)?;
        if !s.block {
            match filesystem_on(&s.device)?.as_deref() {
                // Stage already grew it (offline) when it could.
                Some("ext4") if ext4_bytes(&s.device)? >= size => {}
                // A mounted ext4 grows through EXT4_IOC_RESIZE_FS, which
                // the kernel allows only with CAP_SYS_RESOURCE.
                Some("ext4") if is_mountpoint(&s.staging) && !has_cap_sys_resource() => {
                    return Err(Error::Refused(format!(
                        "the volume's device grew to {size} bytes, but its mounted ext4 grows online only with \
                         CAP_SYS_RESOURCE, which this node plugin does not have; it grows when the volume is next staged"
                    )));
                }
                Some("ext4") => run("resize2fs", &[s.device.as_os_str()])?,
                Some("xfs") => run("xfs_growfs", &[s.staging.as_os_str()])?,
                other => {
                    return Err(Error::Refused(format!(
                        "cannot grow a {} filesystem",
                        other.unwrap_or("missing")
                    )));
                }
            }
            tracing::info!(volume = %req.volume_id, size, "filesystem grown");
        }
        Ok(NodeExpandVolumeResponse {
            capacity_bytes: i64::try_from(size).unwrap_or(i64::MAX),
        })
    }

    /// The replicas of the engine of `volume` on this node, counted by
    /// mode (rw, rebuilding, failed); none when no engine of it runs here.
    async fn replica_modes(&self, volume: &str) -> Option<(usize, usize, usize)> {
        let engines = self.ctx.engines.list().await;
        let e = engines.iter().find(|e| e.volume == volume && e.running)?;
        let count = |mode: &str| e.replicas.iter().filter(|r| r.mode == mode).count();
        Some((count("rw"), count("wo"), count("err")))
    }

    /// The volume's condition as its engine on this node sees it: abnormal
    /// when a replica failed or none is rw.
    async fn condition(&self, volume: &str) -> VolumeCondition {
        match self.replica_modes(volume).await {
            None => VolumeCondition {
                abnormal: true,
                message: NO_ENGINE.into(),
            },
            Some((rw, wo, err)) => VolumeCondition {
                abnormal: rw == 0 || err > 0,
                message: format!("{rw} replicas rw, {wo} rebuilding, {err} failed"),
            },
        }
    }

    /// The volume's health (CSI v1.13) as its engine on this node sees it
    /// (`replicas`: its replicas by mode): INACCESSIBLE when no replica is
    /// rw (or no engine of it runs here), DEGRADED when one failed, or when
    /// the ext4 staged here has recorded errors; no entry when all is well.
    fn health(&self, volume: &str, replicas: Option<(usize, usize, usize)>) -> VolumeHealth {
        let entry =
            |status: VolumeHealthErrorType, reason: &str, message: String| VolumeHealthEntry {
                status: status as i32,
                reason: reason.into(),
                message,
            };
        let mut health_statuses = match replicas {
            None => vec![entry(
                VolumeHealthErrorType::Inaccessible,
                "NotServedHere",
                NO_ENGINE.into(),
            )],
            Some((0, wo, err)) => vec![entry(
                VolumeHealthErrorType::Inaccessible,
                "NoReplica",
                format!("no replica rw: {wo} rebuilding, {err} failed"),
            )],
            Some((rw, wo, err)) if err > 0 => vec![entry(
                VolumeHealthErrorType::Degraded,
                "ReplicaFailed",
                format!("{rw} replicas rw, {wo} rebuilding, {err} failed"),
            )],
            Some(_) => Vec::new(),
        };
        let staged = self.staged_now(volume).ok().flatten();
        if let Some(errors) = staged
            .filter(|s| !s.block)
            .and_then(|s| filesystem_errors(&s.staging))
        {
            health_statuses.push(entry(
                VolumeHealthErrorType::Degraded,
                "FilesystemErrors",
                errors,
            ));
        }
        VolumeHealth {
            volume_id: volume.to_string(),
            health_statuses,
        }
    }

    /// This node's disks: one entry per disk that is not ready.
    fn storage_health(&self) -> NodeGetStorageHealthResponse {
        let backend_health = self
            .ctx
            .disk_status()
            .into_iter()
            .filter(|d| !d.ready)
            .map(|d| node_get_storage_health_response::StorageBackendHealth {
                status: StorageHealthErrorType::StorageUnreachable as i32,
                reason: "DiskNotReady".into(),
                message: format!("{} ({}): {}", d.id, d.path, d.message),
                volume_capability: None,
            })
            .collect();
        NodeGetStorageHealthResponse { backend_health }
    }

    fn stats(&self, req: NodeGetVolumeStatsRequest) -> Result<NodeGetVolumeStatsResponse, Error> {
        volume_id(&req.volume_id)?;
        required(&req.volume_path, "volume_path")?;
        // No volume of this node lies outside its paths: NOT_FOUND, as for
        // a path where nothing is.
        let path = self
            .paths
            .check("volume_path", &req.volume_path)
            .map_err(|e| match e {
                Error::Invalid { field, message } => Error::NotFound(format!("{field}: {message}")),
                e => e,
            })?;
        let path = path.as_path();
        let meta = std::fs::metadata(path)
            .map_err(|_| Error::NotFound(format!("{} does not exist", path.display())))?;
        let usage = if meta.is_dir() {
            let st =
                nix::sys::statvfs::statvfs(path).map_err(|e| Error::disk(path, e.to_string()))?;
            let unit = st.fragment_size();
            let (total, free, avail) = (
                st.blocks() * unit,
                st.blocks_free() * unit,
                st.blocks_available() * unit,
            );
            vec![
                VolumeUsage {
                    available: avail as i64,
                    total: total as i64,
                    used: total.saturating_sub(free) as i64,
                    unit: volume_usage::Unit::Bytes as i32,
                },
                VolumeUsage {
                    available: st.files_available() as i64,
                    total: st.files() as i64,
                    used: st.files().saturating_sub(st.files_free()) as i64,
                    unit: volume_usage::Unit::Inodes as i32,
                },
            ]
        } else {
            let size = device_size(path)?;
            vec![VolumeUsage {
                total: size as i64,
                unit: volume_usage::Unit::Bytes as i32,
                ..Default::default()
            }]
        };
        Ok(NodeGetVolumeStatsResponse {
            usage,
            volume_condition: None,
        })
    }
}

#[tonic::async_trait]
impl Node for NodeService {
    #[tracing::instrument(skip_all, fields(rpc = "NodeStageVolume", volume = %request.get_ref().volume_id))]
    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let req = request.into_inner();
        self.blocking(move |s| s.stage(req)).await?;
        Ok(Response::new(NodeStageVolumeResponse {}))
    }

    #[tracing::instrument(skip_all, fields(rpc = "NodeUnstageVolume", volume = %request.get_ref().volume_id))]
    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let req = request.into_inner();
        self.blocking(move |s| s.unstage(req)).await?;
        Ok(Response::new(NodeUnstageVolumeResponse {}))
    }

    #[tracing::instrument(skip_all, fields(rpc = "NodePublishVolume", volume = %request.get_ref().volume_id))]
    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let req = request.into_inner();
        self.blocking(move |s| s.publish(req)).await?;
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    #[tracing::instrument(skip_all, fields(rpc = "NodeUnpublishVolume", volume = %request.get_ref().volume_id))]
    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let req = request.into_inner();
        self.blocking(move |s| s.unpublish(req)).await?;
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    #[tracing::instrument(skip_all, fields(rpc = "NodeGetVolumeStats", volume = %request.get_ref().volume_id))]
    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let req = request.into_inner();
        let volume = req.volume_id.clone();
        let (mut stats, errors) = self
            .blocking(move |s| {
                let path = PathBuf::from(&req.volume_path);
                Ok((s.stats(req)?, filesystem_errors(&path)))
            })
            .await?;
        let mut condition = self.0.condition(&volume).await;
        if let Some(errors) = errors {
            condition.abnormal = true;
            condition.message = format!("{}; {errors}", condition.message);
        }
        stats.volume_condition = Some(condition);
        Ok(Response::new(stats))
    }

    #[tracing::instrument(skip_all, fields(rpc = "NodeGetVolumeHealth", volume = %request.get_ref().volume_id))]
    async fn node_get_volume_health(
        &self,
        request: Request<NodeGetVolumeHealthRequest>,
    ) -> Result<Response<NodeGetVolumeHealthResponse>, Status> {
        let volume = request.into_inner().volume_id;
        volume_id(&volume)?;
        let replicas = self.0.replica_modes(&volume).await;
        let health = self
            .blocking(move |s| Ok(s.health(&volume, replicas)))
            .await?;
        Ok(Response::new(NodeGetVolumeHealthResponse {
            volume_health: Some(health),
        }))
    }

    #[tracing::instrument(skip_all, fields(rpc = "NodeGetStorageHealth", node = %self.0.ctx.node_id))]
    async fn node_get_storage_health(
        &self,
        _request: Request<NodeGetStorageHealthRequest>,
    ) -> Result<Response<NodeGetStorageHealthResponse>, Status> {
        Ok(Response::new(self.0.storage_health()))
    }

    #[tracing::instrument(skip_all, fields(rpc = "NodeExpandVolume", volume = %request.get_ref().volume_id))]
    async fn node_expand_volume(
        &self,
        request: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        let req = request.into_inner();
        Ok(Response::new(self.blocking(move |s| s.expand(req)).await?))
    }

    #[tracing::instrument(skip_all, fields(rpc = "NodeGetCapabilities"))]
    async fn node_get_capabilities(
        &self,
        _request: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        let capabilities = [
            RpcType::StageUnstageVolume,
            RpcType::GetVolumeStats,
            RpcType::ExpandVolume,
            RpcType::VolumeCondition,
            RpcType::SingleNodeMultiWriter,
            RpcType::GetVolumeHealth,
            RpcType::GetStorageHealth,
        ]
        .into_iter()
        .map(|t| NodeServiceCapability {
            r#type: Some(node_service_capability::Type::Rpc(
                node_service_capability::Rpc { r#type: t as i32 },
            )),
        })
        .collect();
        Ok(Response::new(NodeGetCapabilitiesResponse { capabilities }))
    }

    #[tracing::instrument(skip_all, fields(rpc = "NodeGetInfo", node = %self.0.ctx.node_id))]
    async fn node_get_info(
        &self,
        _request: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.0.ctx.node_id.clone(),
            max_volumes_per_node: i64::from(self.0.ctx.max_volumes),
            accessible_topology: Some(ballast::topology::of_node(
                &self.0.ctx.node_id,
                &self.0.ctx.zone,
            )),
        }))
    }
}
