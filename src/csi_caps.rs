//! What Ballast can serve of a CSI volume capability, checked the same way
//! by the controller (CreateVolume, publish, validation) and the node
//! plugin (stage, publish), and what the controller's publication tells the
//! node about it.

use crate::proto::csi::v1::VolumeCapability;
use crate::proto::csi::v1::volume_capability::AccessType;
use crate::proto::csi::v1::volume_capability::access_mode::Mode;

/// The key of ControllerPublishVolume's publish context that says the
/// volume was published read-only (`"true"`): the node plugin then mounts
/// it read-only at every target path.
pub const READONLY_KEY: &str = "readonly";

/// Whether Ballast can serve a capability: single-node access (block or
/// mount with ext4/xfs). A reason when it cannot.
///
/// Of the single-node modes, SINGLE_NODE_SINGLE_WRITER allows one
/// publication at a time on the node (`single_writer`); the others allow a
/// volume to be published at several target paths of its node.
pub fn check_capability(cap: &VolumeCapability) -> Result<(), String> {
    let mode = cap
        .access_mode
        .as_ref()
        .map(|m| Mode::try_from(m.mode).unwrap_or(Mode::Unknown))
        .unwrap_or(Mode::Unknown);
    match mode {
        Mode::SingleNodeWriter
        | Mode::SingleNodeReaderOnly
        | Mode::SingleNodeSingleWriter
        | Mode::SingleNodeMultiWriter => {}
        Mode::Unknown => return Err("access_mode is missing or unknown".into()),
        other => {
            return Err(format!(
                "access mode {} is not supported",
                other.as_str_name()
            ));
        }
    }
    match &cap.access_type {
        Some(AccessType::Block(_)) => Ok(()),
        Some(AccessType::Mount(m)) => match m.fs_type.as_str() {
            "" | "ext4" | "xfs" => Ok(()),
            other => Err(format!("fs_type {other:?} is not supported (ext4, xfs)")),
        },
        None => Err("access_type (block or mount) is missing".into()),
    }
}

/// Whether a capability allows one publication at a time
/// (SINGLE_NODE_SINGLE_WRITER).
pub fn single_writer(cap: &VolumeCapability) -> bool {
    cap.access_mode
        .as_ref()
        .is_some_and(|m| m.mode == Mode::SingleNodeSingleWriter as i32)
}

/// Whether ControllerPublishVolume published the volume read-only
/// (`READONLY_KEY` in its publish context).
pub fn published_read_only(publish_context: &std::collections::HashMap<String, String>) -> bool {
    publish_context
        .get(READONLY_KEY)
        .is_some_and(|v| v == "true")
}

/// Whether a volume is to be used read-only on its node: a reader-only
/// access mode, or published read-only. Nothing the node does for it
/// writes to it on its own account (no filesystem repair).
pub fn read_only(
    cap: &VolumeCapability,
    publish_context: &std::collections::HashMap<String, String>,
) -> bool {
    let reader = cap
        .access_mode
        .as_ref()
        .is_some_and(|m| m.mode == Mode::SingleNodeReaderOnly as i32);
    reader || published_read_only(publish_context)
}
