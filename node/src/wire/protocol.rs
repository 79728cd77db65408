//! The replica data protocol: framed binary messages over TCP, with
//! request ids so that a client may pipeline and a server may answer out
//! of order.
//!
//! Request: a 40-byte header — magic "BREQ", op, flags, id, offset, length,
//! revision (little endian; the layer's chain index for LAYER_* ops) — then
//! `length` bytes of payload for WRITE, OPEN, JOIN and FILL. Response: a 24-byte header — magic "BRSP", status, id, length —
//! then `length` bytes (data for READ, JSON for INFO and LAYERS, the frozen
//! layer's name for SNAPSHOT, a message when status is not 0: for CORRUPT,
//! JSON with the message and where the data failed, see `error_body`).
//!
//! Every header is validated before anything is allocated or touched: a
//! bad magic closes the connection, an unknown op or an oversize length
//! gets an error reply.

pub const REQUEST_MAGIC: u32 = u32::from_le_bytes(*b"BREQ");
pub const RESPONSE_MAGIC: u32 = u32::from_le_bytes(*b"BRSP");
pub const REQUEST_HEADER: usize = 40;
/// The block checksums of FLAG_SUMS are of this many bytes each.
const BLOCK: u64 = crate::replica::BLOCK;
pub const RESPONSE_HEADER: usize = 24;
/// Largest READ or WRITE payload, and largest reply.
pub const MAX_DATA: u32 = 32 << 20;
/// Largest OPEN payload (a replica name).
pub const MAX_NAME: u32 = 255;
/// Request flag: make the write durable before answering.
pub const FLAG_FUA: u8 = 1;
/// TRIM flag: write zeros instead of punching holes.
pub const FLAG_ZEROES: u8 = 2;
/// LEND flag: give the replica back instead of borrowing it.
pub const FLAG_RETURN: u8 = 4;
/// WRITE flag: the `length` bytes of data are followed by the CRC32C of
/// each of their 4 KiB blocks, 4 bytes each, little endian, as the engine
/// computed them once for every replica: the replica records them instead
/// of computing its own. Only for whole blocks (offset and length), and
/// only to a replica whose OPEN reply said `{"sums": true}`.
pub const FLAG_SUMS: u8 = 8;
/// SNAPSHOT flag: the payload is a JSON `LoseSpec` (a label, and blocks of
/// the head to freeze as lost should they fail their checksums) instead of
/// the bare label.
pub const FLAG_LOSE: u8 = 16;
/// LAYERS flag: the caller copies the frozen layers it lists (a fill):
/// the replica is not merged until its connection ends, as a merge would
/// change them under the copy (a server that does not know the flag
/// answers the list all the same).
pub const FLAG_COPY: u8 = 32;
/// Largest JOIN or FILL payload.
pub const MAX_CONTROL: u32 = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    Read = 1,
    Write = 2,
    Flush = 3,
    Trim = 4,
    Info = 5,
    Snapshot = 6,
    Layers = 7,
    /// Binds the connection to a replica, by name (payload). `offset` is
    /// the attachment of the replica's volume the engine was started for
    /// (0: none claimed): the replica's fence rises to it, and a claim
    /// below the fence is refused (FENCED).
    Open = 8,
    /// Joins a rebuild: payload JSON `{frozen: [{name, checksum}], head,
    /// revision}`; replies a JSON join report.
    Join = 9,
    /// Fills the pending layers from `NAME@HOST:PORT` (payload), copying
    /// at most `offset` bytes per second (0: no limit), over the network
    /// or within the node;
    /// replies JSON `{path, bytes}` once every layer is checked and
    /// complete. It is called off when its connection ends.
    Fill = 10,
    /// Data extents of the frozen layer at chain index `revision`: JSON
    /// `[[offset, length], ...]` in bytes.
    LayerExtents = 11,
    /// Raw bytes of the layer at chain index `revision`.
    LayerRead = 12,
    /// Lends the opened replica to this connection's engine, which then
    /// does its I/O on the files itself; the server refuses every other
    /// read and mutation of it until the loan ends (FLAG_RETURN, or the
    /// connection closes).
    Lend = 13,
    /// The writes after revision `offset` that the replica's write log
    /// holds, oldest first: JSON `[{revision, op, offset, len}]`, or `null`
    /// when the log does not reach back that far.
    WriteLog = 14,
    /// Grows the replica to `offset` bytes (online expansion; never
    /// shrinks). Only from the volume's engine.
    Grow = 15,
    /// The CRC32C of each 4 KiB block of the frozen layer at chain index
    /// `revision` over `offset..offset + length` (block aligned): 4 bytes
    /// a block, little endian, 0 where the layer holds none. A rebuild
    /// compares them with the blocks its seed holds.
    LayerSums = 16,
    /// Gives up block `offset / 4096` of the frozen layer at chain index
    /// `revision` as lost, with every other block of the layer that fails:
    /// it fails its checksum, and the engine found no replica that holds
    /// it sound (see `Replica::lose_frozen_block`). Answers the blocks
    /// given up, JSON `[block, ...]`. Only from the volume's engine.
    Lose = 17,
    /// The runs of blocks of the head's regions written lately (see
    /// `Replica::recent_runs`): JSON `[[first, last], ...]`, in blocks,
    /// `last` excluded. A starting engine compares its replicas there.
    RecentRuns = 18,
    /// The CRC32C of each 4 KiB block a read returns over `offset..offset
    /// + length` (block aligned): 4 bytes a block, little endian; that of
    /// a block of zeros where no layer holds it (`Replica::view_sums`).
    ViewSums = 19,
    /// Answered at once, empty, by the connection's own task: no replica
    /// lock, no disk, no replica opened needed. A caller waiting on a long
    /// request (a freeze reading a large head) asks it to tell a server
    /// that works slowly from one that stopped answering
    /// (`ReplicaClient::answering`).
    Ping = 20,
    /// Syncs the head's checksums at every flush (`offset` 1), or at a
    /// flush that ends an interval (0): see `Replica::set_sums_every_flush`.
    /// Only from the volume's engine.
    SumsEveryFlush = 21,
    /// Reads the head ahead of its freeze, with the replica's writes
    /// passing between chunks (see `replica::warm`); answered empty
    /// once the whole head is read. Only a help for the freeze that
    /// follows, which then reads only what was written since. A server
    /// says it knows it in its answer to OPEN (`warm`).
    Warm = 22,
}

impl Op {
    /// Whether it changes the replica's data: what only the volume's
    /// engine may do, and a fenced one not. SNAPSHOT does not: it freezes
    /// the head as it is, and an offline rebuild asks it of its source
    /// with its node's certificate.
    pub fn mutates(self) -> bool {
        matches!(
            self,
            Op::Write
                | Op::Flush
                | Op::Trim
                | Op::Join
                | Op::Fill
                | Op::Lend
                | Op::Grow
                | Op::Lose
                | Op::SumsEveryFlush
        )
    }

    fn from_u8(v: u8) -> Option<Op> {
        Some(match v {
            1 => Op::Read,
            2 => Op::Write,
            3 => Op::Flush,
            4 => Op::Trim,
            5 => Op::Info,
            6 => Op::Snapshot,
            7 => Op::Layers,
            8 => Op::Open,
            9 => Op::Join,
            10 => Op::Fill,
            11 => Op::LayerExtents,
            12 => Op::LayerRead,
            13 => Op::Lend,
            14 => Op::WriteLog,
            15 => Op::Grow,
            16 => Op::LayerSums,
            17 => Op::Lose,
            18 => Op::RecentRuns,
            19 => Op::ViewSums,
            20 => Op::Ping,
            21 => Op::SumsEveryFlush,
            22 => Op::Warm,
            _ => return None,
        })
    }
}

/// Status codes of a response.
pub mod status {
    pub const OK: u32 = 0;
    /// Bad request (unknown op, bad length, bad range).
    pub const INVALID: u32 = 22;
    /// The replica failed the I/O.
    pub const IO: u32 = 5;
    /// No such replica, or none opened on this connection.
    pub const NOT_FOUND: u32 = 2;
    /// The replica is lent to an engine (or already lent, for LEND).
    pub const BUSY: u32 = 16;
    /// Not for this peer: it is not the volume's engine, its certificate
    /// does not name the attachment it claims, or it asks a LEND from
    /// another node.
    pub const DENIED: u32 = 13;
    /// The replica was opened for a later attachment of its volume: the
    /// engine of an earlier one may not change it (ESTALE).
    pub const FENCED: u32 = 116;
    /// Its disk is full: the write did not fit (what it held before stays).
    pub const NO_SPACE: u32 = 28;
    /// Data read does not match its checksum (of a FILL: the source's).
    pub const CORRUPT: u32 = 74;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub op: Op,
    pub flags: u8,
    pub id: u64,
    pub offset: u64,
    pub len: u32,
    pub revision: u64,
}

/// A header that cannot be served.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Not this protocol: the connection is closed.
    #[error("bad magic {0:#x}")]
    Magic(u32),
    /// Answered with an error; the connection goes on.
    #[error("request {id}: {reason}")]
    Refused { id: u64, reason: String },
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

impl Request {
    pub fn encode(&self) -> [u8; REQUEST_HEADER] {
        let mut b = [0u8; REQUEST_HEADER];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_le_bytes());
        b[4] = self.op as u8;
        b[5] = self.flags;
        b[8..16].copy_from_slice(&self.id.to_le_bytes());
        b[16..24].copy_from_slice(&self.offset.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[32..40].copy_from_slice(&self.revision.to_le_bytes());
        b
    }

    /// Decodes and validates a header. Never panics, whatever the bytes.
    pub fn decode(b: &[u8; REQUEST_HEADER]) -> Result<Request, FrameError> {
        let magic = u32_at(b, 0);
        if magic != REQUEST_MAGIC {
            return Err(FrameError::Magic(magic));
        }
        let id = u64_at(b, 8);
        let refuse = |reason: String| FrameError::Refused { id, reason };
        let op = Op::from_u8(b[4]).ok_or_else(|| refuse(format!("unknown op {}", b[4])))?;
        let len = u32_at(b, 24);
        let offset = u64_at(b, 16);
        match op {
            Op::Read | Op::Write | Op::LayerRead | Op::LayerSums | Op::ViewSums
                if len > MAX_DATA =>
            {
                return Err(refuse(format!("length {len} over the limit {MAX_DATA}")));
            }
            Op::Snapshot if b[5] & FLAG_LOSE != 0 && len > MAX_CONTROL => {
                return Err(refuse(format!(
                    "snapshot payload length {len} over {MAX_CONTROL}"
                )));
            }
            Op::Snapshot if b[5] & FLAG_LOSE == 0 && len > MAX_NAME => {
                return Err(refuse(format!(
                    "snapshot label length {len} over {MAX_NAME}"
                )));
            }
            Op::Open if len == 0 || len > MAX_NAME => {
                return Err(refuse(format!("name length {len} not in 1..={MAX_NAME}")));
            }
            Op::Join | Op::Fill if len == 0 || len > MAX_CONTROL => {
                return Err(refuse(format!(
                    "{op:?} payload length {len} not in 1..={MAX_CONTROL}"
                )));
            }
            Op::Flush
            | Op::Info
            | Op::Layers
            | Op::LayerExtents
            | Op::Lend
            | Op::WriteLog
            | Op::Grow
            | Op::Lose
            | Op::RecentRuns
            | Op::Ping
            | Op::Warm
                if len != 0 =>
            {
                return Err(refuse(format!("{op:?} carries no length, got {len}")));
            }
            _ => {}
        }
        if offset.checked_add(u64::from(len)).is_none() {
            return Err(refuse(format!("offset {offset} + length {len} overflows")));
        }
        let flags = b[5];
        if op == Op::Write
            && flags & FLAG_SUMS != 0
            && !(offset.is_multiple_of(BLOCK) && u64::from(len).is_multiple_of(BLOCK))
        {
            return Err(refuse(format!(
                "a write with checksums must be whole blocks: offset {offset}, length {len}"
            )));
        }
        Ok(Request {
            op,
            flags,
            id,
            offset,
            len,
            revision: u64_at(b, 32),
        })
    }

    /// Whether it changes the replica (see `Op::mutates`). A SNAPSHOT that
    /// gives up blocks as lost does: only the engine knows that no replica
    /// holds them sound.
    pub fn mutates(&self) -> bool {
        self.op.mutates() || (self.op == Op::Snapshot && self.flags & FLAG_LOSE != 0)
    }

    /// Bytes of payload that follow this header.
    pub fn payload_len(&self) -> usize {
        match self.op {
            Op::Write => self.len as usize + self.sums_len(),
            Op::Open | Op::Join | Op::Fill | Op::Snapshot => self.len as usize,
            _ => 0,
        }
    }

    /// Bytes of block checksums at the end of a WRITE's payload.
    pub fn sums_len(&self) -> usize {
        if self.op == Op::Write && self.flags & FLAG_SUMS != 0 {
            (u64::from(self.len) / BLOCK * 4) as usize
        } else {
            0
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Response {
    pub status: u32,
    pub id: u64,
    pub len: u32,
}

impl Response {
    pub fn encode(&self) -> [u8; RESPONSE_HEADER] {
        let mut b = [0u8; RESPONSE_HEADER];
        b[0..4].copy_from_slice(&RESPONSE_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.status.to_le_bytes());
        b[8..16].copy_from_slice(&self.id.to_le_bytes());
        b[16..20].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; RESPONSE_HEADER]) -> Result<Response, FrameError> {
        let magic = u32_at(b, 0);
        if magic != RESPONSE_MAGIC {
            return Err(FrameError::Magic(magic));
        }
        let r = Response {
            status: u32_at(b, 4),
            id: u64_at(b, 8),
            len: u32_at(b, 16),
        };
        if r.len > MAX_DATA {
            return Err(FrameError::Refused {
                id: r.id,
                reason: format!("reply of {} bytes over the limit", r.len),
            });
        }
        Ok(r)
    }
}

/// A CORRUPT reply's body: its message, and where the data failed.
#[derive(serde::Serialize, serde::Deserialize)]
struct CorruptBody {
    message: String,
    #[serde(flatten)]
    corruption: crate::replica::Corruption,
}

/// The body of an error reply: the message, or for CORRUPT with where the
/// data failed, the JSON `{"message", "layer", "at", "lost"}`.
pub fn error_body(
    status: u32,
    message: &str,
    corruption: Option<&crate::replica::Corruption>,
) -> Vec<u8> {
    match corruption {
        Some(c) if status == status::CORRUPT => serde_json::to_vec(&CorruptBody {
            message: message.to_string(),
            corruption: c.clone(),
        })
        .unwrap_or_else(|_| message.as_bytes().to_vec()),
        _ => message.as_bytes().to_vec(),
    }
}

/// The message of an error reply, and where the data failed when it is a
/// CORRUPT reply that says (a bare message says nowhere).
pub fn read_error_body(status: u32, body: &[u8]) -> (String, Option<crate::replica::Corruption>) {
    if status == status::CORRUPT
        && body.first() == Some(&b'{')
        && let Ok(b) = serde_json::from_slice::<CorruptBody>(body)
    {
        return (b.message, Some(b.corruption));
    }
    (String::from_utf8_lossy(body).into_owned(), None)
}

/// The protocol's status for a replica's error: the one mapping.
pub fn status_of(e: &crate::replica::ReplicaError) -> u32 {
    use crate::replica::ReplicaError;
    match e {
        ReplicaError::OutOfRange { .. } | ReplicaError::Invalid(_) => status::INVALID,
        ReplicaError::Corrupt(_)
        | ReplicaError::CorruptLayer { .. }
        | ReplicaError::CorruptBlock { .. }
        | ReplicaError::LostBlock { .. } => status::CORRUPT,
        ReplicaError::Busy(_) => status::BUSY,
        e @ ReplicaError::Io { .. } if e.is_no_space() => status::NO_SPACE,
        _ => status::IO,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_corrupt_reply_says_where_and_any_other_carries_its_message() {
        let c = crate::replica::Corruption {
            layer: Some("layer-000002.img".into()),
            at: Some(513 * BLOCK),
            lost: true,
            recorded: Some(0x1234_5678),
        };
        let body = error_body(status::CORRUPT, "block 513 is bad", Some(&c));
        assert_eq!(
            read_error_body(status::CORRUPT, &body),
            ("block 513 is bad".to_string(), Some(c.clone()))
        );
        // Another status carries the message alone, and so does a bare one.
        assert_eq!(error_body(status::IO, "{x}", Some(&c)), b"{x}");
        assert_eq!(
            read_error_body(status::CORRUPT, b"{not json"),
            ("{not json".to_string(), None)
        );
        assert_eq!(
            read_error_body(status::IO, &body).1,
            None,
            "only a CORRUPT reply says where"
        );
    }

    proptest! {
        #[test]
        fn decoding_random_bytes_never_panics(bytes in prop::array::uniform32(any::<u8>()), tail in prop::array::uniform8(any::<u8>())) {
            let mut b = [0u8; REQUEST_HEADER];
            b[..32].copy_from_slice(&bytes);
            b[32..].copy_from_slice(&tail);
            let _ = Request::decode(&b);
            let mut r = [0u8; RESPONSE_HEADER];
            r.copy_from_slice(&b[..RESPONSE_HEADER]);
            let _ = Response::decode(&r);
        }

        #[test]
        fn random_bytes_behind_a_valid_magic_are_validated(op in any::<u8>(), flags in any::<u8>(), id in any::<u64>(), offset in any::<u64>(), len in any::<u32>()) {
            let mut b = [0u8; REQUEST_HEADER];
            b[0..4].copy_from_slice(&REQUEST_MAGIC.to_le_bytes());
            b[4] = op;
            b[5] = flags;
            b[8..16].copy_from_slice(&id.to_le_bytes());
            b[16..24].copy_from_slice(&offset.to_le_bytes());
            b[24..28].copy_from_slice(&len.to_le_bytes());
            match Request::decode(&b) {
                Ok(r) => {
                    prop_assert!(r.payload_len() <= MAX_DATA as usize + MAX_DATA as usize / 1024);
                    if r.sums_len() > 0 {
                        prop_assert!(offset % BLOCK == 0 && u64::from(len) % BLOCK == 0);
                        prop_assert_eq!(r.payload_len(), len as usize + len as usize / 1024);
                    }
                    prop_assert!(offset.checked_add(u64::from(len)).is_some());
                    prop_assert_eq!(Request::decode(&r.encode()), Ok(r));
                }
                Err(FrameError::Refused { id: got, .. }) => prop_assert_eq!(got, id),
                Err(e) => prop_assert!(false, "unexpected {e:?}"),
            }
        }
    }

    /// A PING carries nothing: a length is refused, as for INFO.
    #[test]
    fn a_ping_with_a_length_is_refused() {
        let ping = |len| {
            Request::decode(
                &Request {
                    op: Op::Ping,
                    flags: 0,
                    id: 7,
                    offset: 0,
                    len,
                    revision: 0,
                }
                .encode(),
            )
        };
        assert!(ping(0).is_ok_and(|r| r.payload_len() == 0));
        assert!(matches!(ping(5), Err(FrameError::Refused { id: 7, .. })));
    }

    #[test]
    fn requests_and_responses_round_trip() {
        let r = Request {
            op: Op::Write,
            flags: 1,
            id: 7,
            offset: 4096,
            len: 512,
            revision: 9,
        };
        assert_eq!(Request::decode(&r.encode()), Ok(r));
        let s = Response {
            status: status::OK,
            id: 7,
            len: 0,
        };
        assert_eq!(Response::decode(&s.encode()), Ok(s));
        let mut bad = r.encode();
        bad[0] = b'X';
        assert!(matches!(Request::decode(&bad), Err(FrameError::Magic(_))));
    }
}
