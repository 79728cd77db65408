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
use ballast_node::replica::{
    BOOKKEEPING_FILES, META_FILE, Meta, Replica, read_fence, sums_path_of,
};
use ballast_node::wire::protocol::{MAX_DATA, REQUEST_HEADER, RESPONSE_HEADER, Request, Response};

/// A target: it takes one input.
pub type Target = fn(&[u8]);

/// Every target, by name, as the corpus directories are named.
pub const TARGETS: &[(&str, Target)] = &[
    ("nbd_handshake", nbd_handshake),
    ("nbd_request", nbd_request),
    ("replica_frame", replica_frame),
    ("replica_meta", replica_meta),
    ("replica_dir", replica_dir),
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

/// The replica the `replica_dir` target mangles: 1 MiB, a frozen layer
/// under its head, written and flushed, then written again with no flush
/// and dropped, as a killed process leaves it. Returns it (still open)
/// with what each of its blocks holds.
fn replica_written(dir: &Path) -> (Replica, Vec<u8>) {
    const SIZE: usize = 1 << 20;
    let mut r = Replica::create_for(dir, "vol", SIZE as u64).expect("a new replica");
    let mut model = vec![0u8; SIZE];
    let mut revision = 0;
    let mut write = |r: &mut Replica, blocks: std::ops::Range<usize>, byte: u8| {
        revision += 1;
        let range = blocks.start * 4096..blocks.end * 4096;
        let data: Vec<u8> = range.clone().map(|i| byte ^ (i / 4096) as u8).collect();
        r.write(range.start as u64, &data, Some(revision))
            .expect("a write");
        model[range].copy_from_slice(&data);
    };
    write(&mut r, 0..64, 0xa1);
    r.flush().expect("a flush");
    r.snapshot(Some("s1")).expect("a snapshot");
    write(&mut r, 32..96, 0xb2);
    r.flush().expect("a flush");
    write(&mut r, 100..110, 0xc3);
    (r, model)
}

/// A replica's directory as a disk could hand it back: the replica above,
/// then one of its files mangled: the first byte picks the file, the
/// second how (bytes written over it at the offset in the next four, the
/// file cut at that offset, or the file replaced by the rest), the rest
/// is the bytes. Opening it fails or succeeds and never panics. Opened,
/// every block reads or fails, and with only its bookkeeping mangled (not
/// `meta.json`, nor a layer's data) a block that reads holds what was
/// written there: a file that says which blocks to check, or what was
/// written lately, may make blocks fail but never makes one read other
/// bytes. A block written then, and read back, holds what was written.
pub fn replica_dir(data: &[u8]) {
    let [which, how, o0, o1, o2, o3, bytes @ ..] = data else {
        return;
    };
    let shm = Path::new("/dev/shm");
    let tmp = if shm.is_dir() {
        tempfile::tempdir_in(shm)
    } else {
        tempfile::tempdir()
    }
    .expect("a temporary directory");
    let dir = tmp.path().join("vol-r1");
    let (r, model) = replica_written(&dir);
    let chain = r.chain();
    drop(r);
    let (frozen, head) = (&chain[0], &chain[1]);
    // Each file, and whether it holds only bookkeeping (the data must
    // read back whatever happens to it).
    let mut files = vec![(META_FILE.to_string(), false)];
    files.extend(BOOKKEEPING_FILES.map(|f| (f.to_string(), true)));
    files.extend([
        (sums_of(head), true),
        (sums_of(frozen), true),
        (head.clone(), false),
        (frozen.clone(), false),
    ]);
    let (name, bookkeeping) = &files[*which as usize % files.len()];
    let path = dir.join(name);
    let offset = u64::from(u32::from_le_bytes([*o0, *o1, *o2, *o3]));
    mangle(&path, *how, offset, bytes);

    let _ = read_fence(&dir);
    let Ok(mut r) = Replica::open(&dir) else {
        return;
    };
    // What the engine asks of a replica it opens, all read from those files.
    let _ = (r.suspects(), r.recent_runs(), r.layers(), r.writes_since(0));
    let _ = r.verify();
    let mut block = vec![0u8; 4096];
    for (b, want) in model.chunks(4096).enumerate() {
        let read = r.read(b as u64 * 4096, &mut block);
        if read.is_ok() && *bookkeeping {
            assert!(
                block == want,
                "block {b} reads other bytes after {name} was mangled"
            );
        }
    }
    let fresh = vec![0x5a; 4096];
    let next = r.revision() + 1;
    let written = r.write(200 * 4096, &fresh, Some(next)).is_ok() && r.flush().is_ok();
    if written && r.read(200 * 4096, &mut block).is_ok() {
        assert!(
            block == fresh,
            "a block written and flushed reads other bytes"
        );
    }
}

/// The name of a layer's checksums file.
fn sums_of(layer: &str) -> String {
    sums_path_of(Path::new(layer))
        .to_string_lossy()
        .into_owned()
}

/// Writes `bytes` over `path` at `offset` (`how` 0), cuts it at `offset`
/// (1), or replaces it by `bytes` (2); a missing file is made.
fn mangle(path: &Path, how: u8, offset: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .expect("the file to mangle");
    let len = file.metadata().expect("its size").len();
    match how % 3 {
        0 => {
            let at = offset % (len + 1);
            file.write_all_at(bytes, at).expect("bytes written over it");
        }
        1 => file.set_len(offset % (len + 1)).expect("the file cut"),
        _ => {
            file.set_len(0).expect("the file emptied");
            file.write_all_at(bytes, 0).expect("the file replaced");
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
