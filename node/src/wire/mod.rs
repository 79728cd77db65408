//! The wire: the replica data protocol (`protocol`), its client
//! (`client`), its transport (`tls`: plain TCP or mutual TLS; `readers`:
//! the certificates a fill reads another node's replica with), and the
//! messages both sides share. It sits on the replica
//! format (it carries its layers and write log) and under sync, the
//! server and the engine; it opens no replica itself.

pub mod client;
pub mod protocol;
pub mod readers;
pub mod tls;

use crate::replica::{LayerInfo, LayerSpec};

/// What a JOIN carries.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct JoinSpec {
    pub frozen: Vec<LayerSpec>,
    pub head: String,
    pub revision: u64,
}

impl JoinSpec {
    /// The join that follows the source's chain: its frozen layers, and a new
    /// head named as the source's.
    pub fn following(layers: &[LayerInfo], revision: u64) -> Result<JoinSpec, String> {
        let (head, frozen) = layers.split_last().ok_or("the source has no layers")?;
        let frozen = frozen
            .iter()
            .map(|l| {
                Ok(LayerSpec {
                    name: l.name.clone(),
                    checksum: l
                        .checksum
                        .clone()
                        .ok_or_else(|| format!("layer {} has no checksum", l.name))?,
                    snapshot: l.snapshot.clone(),
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(JoinSpec {
            frozen,
            head: head.name.clone(),
            revision,
        })
    }
}

/// What a SNAPSHOT with `FLAG_LOSE` carries: the label, and the blocks of
/// the head the engine gives up as lost should they fail their checksums
/// (see `Replica::snapshot_losing`).
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct LoseSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    pub lose: std::collections::BTreeSet<u64>,
}

/// How long a new connection has to open a replica: the server closes one
/// that has not, and the client gives up on a server that has not answered.
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Socket buffers: large enough for a 64 KiB request or reply and its header.
pub const IO_BUFFER: usize = 256 * 1024;
