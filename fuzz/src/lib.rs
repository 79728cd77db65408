//! The fuzz targets' bodies: each takes bytes as a peer, a disk or a user
//! could hand them to Ballast, runs the parser on them, and checks what an
//! accepted input promises. A panic (or a sanitizer's report) is a find.
//! The `fuzz_targets/` binaries hand them to libFuzzer (cargo-fuzz); the
//! test `tests/corpus.rs` replays `corpus/<target>/` through them on the
//! stable toolchain. Test code: it asserts, and `expect`s what the harness
//! itself needs.

use std::collections::HashMap;
use std::path::Path;

use ballast_controller::csi::params::StorageClassParams;
use ballast_controller::sim::{Scenario, Sim};
use ballast_controller::volumes::MAX_REPLICAS;
use ballast_node::frontend::nbd::{Command, handshake};
use ballast_node::replica::Meta;
use ballast_node::wire::protocol::{MAX_DATA, REQUEST_HEADER, RESPONSE_HEADER, Request, Response};

/// A target: it takes one input.
pub type Target = fn(&[u8]);

/// Every target, by name, as the corpus directories are named.
pub const TARGETS: &[(&str, Target)] = &[
    ("nbd_handshake", nbd_handshake),
    ("nbd_request", nbd_request),
    ("replica_frame", replica_frame),
    ("replica_meta", replica_meta),
    ("scenario_yaml", scenario_yaml),
    ("storage_class_params", storage_class_params),
];

/// The NBD handshake, with `data` as all the client sends: it ends (an
/// error, an abort or transmission) and never panics.
pub fn nbd_handshake(data: &[u8]) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let mut stream = tokio::io::join(data, tokio::io::sink());
    let _ = rt.block_on(handshake(&mut stream, "vol", 1 << 30));
}

/// NBD request headers (28 bytes each) for a volume whose size is the
/// first 8 bytes: `in_range` holds exactly when the request fits.
pub fn nbd_request(data: &[u8]) {
    let Some((size, rest)) = data.split_first_chunk::<8>() else {
        return;
    };
    let size = u64::from_le_bytes(*size);
    for h in rest.chunks_exact(28) {
        let h: &[u8; 28] = h.try_into().expect("28 bytes");
        if let Ok(c) = Command::decode(h, size) {
            let end = c.offset.checked_add(u64::from(c.len));
            assert_eq!(c.in_range, end.is_some_and(|e| e <= size));
        }
    }
}

/// Replica protocol headers: an accepted request announces no more
/// payload than the protocol allows (at most `MAX_DATA` of data, and for a
/// write with FLAG_SUMS 4 bytes of checksum per 4 KiB block of it), and
/// encodes back to what decodes to itself; responses decode without
/// panicking.
pub fn replica_frame(data: &[u8]) {
    for h in data.chunks_exact(REQUEST_HEADER) {
        let h: &[u8; REQUEST_HEADER] = h.try_into().expect("a header");
        if let Ok(r) = Request::decode(h) {
            let sums = r.sums_len();
            assert!(sums <= MAX_DATA as usize / 1024, "{r:?}");
            assert!(r.payload_len() - sums <= MAX_DATA as usize, "{r:?}");
            assert_eq!(Request::decode(&r.encode()).ok(), Some(r));
        }
    }
    for h in data.chunks_exact(RESPONSE_HEADER) {
        let h: &[u8; RESPONSE_HEADER] = h.try_into().expect("a header");
        let _ = Response::decode(h);
    }
}

/// A replica's `meta.json`: an accepted one names only layer files (no
/// path), and has a head.
pub fn replica_meta(data: &[u8]) {
    if let Ok(m) = Meta::parse(data, Path::new("meta.json")) {
        assert!(!m.chain.is_empty());
        for name in m.chain.iter().chain(m.frozen.keys()).chain(&m.pending) {
            assert!(
                !name.contains('/') && name != ".." && name != ".",
                "{name:?}"
            );
        }
    }
}

/// Scenario YAML: parsed, and an accepted scenario builds its simulated
/// cluster or says why not.
pub fn scenario_yaml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(s) = Scenario::parse(text) {
        // Large clusters are valid but not this target's business.
        if s.nodes.len() + s.volumes.len() <= 64 {
            let _ = Sim::new(&s);
        }
    }
}

/// StorageClass parameters, one `key=value` per line: accepted values are
/// within their ranges.
pub fn storage_class_params(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let params: HashMap<String, String> = text
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    if let Ok(p) = StorageClassParams::try_from(&params) {
        if let Some(n) = p.number_of_replicas {
            assert!((1..=MAX_REPLICAS).contains(&n), "{n}");
        }
        if let Some(m) = p.stale_replica_timeout {
            assert!(m >= 1);
        }
    }
}
