//! Rebuild over real replica servers on loopback: a replica joins a running
//! volume, receives every write from that moment, and fills its frozen
//! layers by local copy (same node) or remote sync (another node).

#[allow(dead_code)] // shared with the engine tests; this one makes its servers itself
mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ballast::model::ReplicaMode;
use ballast_node::engine::{Engine, MemberStatus, ReplicaAddr};
use ballast_node::replica::Replica;
use ballast_node::replica::replica_dir;
use ballast_node::server::ReplicaServer;
use ballast_node::sync::local::CopyPath;
use ballast_node::wire::JoinSpec;
use ballast_node::wire::client::ReplicaClient;
use common::{chain_of, engine_over, frozen_at_first, head_file};
use tokio::net::TcpListener;

const SIZE: u64 = 16 << 20;

/// A replica server over `disks`; returns its address.
async fn server(disks: &[&Path]) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(
        ReplicaServer::new(disks.iter().map(|d| d.to_path_buf()).collect()).serve(listener),
    );
    addr
}

/// Two nodes' replica servers, each over a disk of its own with a new
/// replica: `v-r0` on the first, `v-r1` on the second.
struct TwoNodes {
    d1: tempfile::TempDir,
    d2: tempfile::TempDir,
    s1: String,
    s2: String,
    r0: ReplicaAddr,
    r1: ReplicaAddr,
}

async fn two_nodes() -> TwoNodes {
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (s1, s2) = (server(&[d1.path()]).await, server(&[d2.path()]).await);
    let r0 = replica(d1.path(), "v-r0", &s1);
    let r1 = replica(d2.path(), "v-r1", &s2);
    TwoNodes {
        d1,
        d2,
        s1,
        s2,
        r0,
        r1,
    }
}

fn replica(disk: &Path, name: &str, addr: &str) -> ReplicaAddr {
    Replica::create(&replica_dir(disk, name), SIZE).unwrap();
    ReplicaAddr {
        name: name.into(),
        addr: addr.into(),
    }
}

/// A pattern that differs per block and per generation.
fn pattern(offset: u64, len: usize, generation: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((offset as usize + i) / 4096 % 251) as u8 ^ generation.wrapping_mul(37))
        .collect()
}

async fn wait_rw(engine: &Engine, name: &str) -> MemberStatus {
    for _ in 0..600 {
        let st = engine.status().await;
        let m = st.iter().find(|m| m.name == name).unwrap().clone();
        assert_ne!(m.mode, ReplicaMode::Err, "rebuild failed: {m:?}");
        if m.mode == ReplicaMode::Rw {
            return m;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{name} did not become rw");
}

async fn image(at: &ReplicaAddr) -> Vec<u8> {
    let c = ReplicaClient::connect(&at.addr, &at.name).await.unwrap();
    c.read(0, SIZE as u32).await.unwrap().to_vec()
}

async fn layers(at: &ReplicaAddr) -> Vec<(String, Option<String>)> {
    let c = ReplicaClient::connect(&at.addr, &at.name).await.unwrap();
    c.layers()
        .await
        .unwrap()
        .into_iter()
        .map(|l| (l.name, l.checksum))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_under_concurrent_writes_ends_with_all_replicas_identical_layer_by_layer() {
    let nodes = two_nodes().await;
    let TwoNodes { r0, r1, .. } = &nodes;
    let engine = engine_over(SIZE, std::slice::from_ref(r0), None).await;
    // Data before the rebuild: the first 8 MiB, with holes every other MiB.
    for mib in (0..8u64).step_by(2) {
        engine
            .write(mib << 20, &pattern(mib << 20, 1 << 20, 1), false)
            .await
            .unwrap();
    }
    let before = blake3::hash(&engine.read(0, 8 << 20).await.unwrap());
    // Writers keep going during the rebuild, over the upper half, aligned
    // and not.
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..3u64)
        .map(|w| {
            let (e, stop) = (engine.clone(), stop.clone());
            tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::SeqCst) || n < 20 {
                    let offset =
                        (8 << 20) + w * (2 << 20) + (n * 7919 % 500) * 4096 + (n % 3) * 512;
                    let len = 4096 + (n % 4) as usize * 1000;
                    let data = pattern(offset, len, n as u8);
                    let fua = n.is_multiple_of(5);
                    if w == 2 {
                        // The NBD server's way: answered by callback.
                        let (tx, rx) = tokio::sync::oneshot::channel();
                        e.write_then(
                            offset,
                            data.into(),
                            fua,
                            Box::new(move |r| {
                                let _ = tx.send(r);
                            }),
                        )
                        .await;
                        rx.await.unwrap().unwrap();
                    } else {
                        e.write(offset, &data, fua).await.unwrap();
                    }
                    if n.is_multiple_of(9) {
                        e.trim(offset + 8192, 3 * 4096 + 100).await.unwrap();
                    }
                    n += 1;
                }
                n
            })
        })
        .collect();
    engine.add_replica(r1.clone(), None, 0).await.unwrap();
    let m = wait_rw(&engine, "v-r1").await;
    stop.store(true, Ordering::SeqCst);
    for w in writers {
        assert!(w.await.unwrap() >= 20);
    }
    let rebuild = m.rebuild.unwrap();
    assert!(rebuild.done);
    assert_eq!(rebuild.path, "remote");
    assert_eq!(rebuild.source, "v-r0");
    assert!(rebuild.copied_bytes >= 4 << 20, "{rebuild:?}");
    engine.flush().await.unwrap();
    // One more snapshot freezes the heads: every layer must then be equal.
    engine.snapshot(None).await.unwrap();
    let (l0, l1) = (layers(r0).await, layers(r1).await);
    assert_eq!(l0, l1, "layer chains differ");
    assert!(l0.len() >= 3 && l0[..l0.len() - 1].iter().all(|l| l.1.is_some()));
    let (i0, i1) = (image(r0).await, image(r1).await);
    assert!(i0 == i1, "replica contents differ");
    assert_eq!(
        blake3::hash(&i1[..8 << 20]),
        before,
        "data written before the rebuild changed"
    );
}

/// Two nodes' replica servers (`v-r0` on the first, whose table is
/// kept, `v-r1` on the second), `v-r0` holding two frozen layers: the
/// first `lower` bytes, then `upper` (offset, length) over them.
struct ToMerge {
    d1: tempfile::TempDir,
    d2: tempfile::TempDir,
    table: Arc<ballast_node::replica::Replicas>,
    r0: ReplicaAddr,
    r1: ReplicaAddr,
}

async fn to_merge(lower: u64, (at, len): (u64, u64)) -> ToMerge {
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let s1 = listener.local_addr().unwrap().to_string();
    let server1 = ReplicaServer::new(vec![d1.path().to_path_buf()]);
    let table = server1.replicas().clone();
    tokio::spawn(server1.serve(listener));
    let s2 = server(&[d2.path()]).await;
    let (r0, r1) = (
        replica(d1.path(), "v-r0", &s1),
        replica(d2.path(), "v-r1", &s2),
    );
    let src = ReplicaClient::connect(&s1, "v-r0").await.unwrap();
    src.write(0, &pattern(0, lower as usize, 1), 1, false)
        .await
        .unwrap();
    src.snapshot(None).await.unwrap();
    src.write(at, &pattern(at, len as usize, 2), 2, false)
        .await
        .unwrap();
    src.snapshot(None).await.unwrap();
    ToMerge {
        d1,
        d2,
        table,
        r0,
        r1,
    }
}

/// A rebuild asked for while the only rw replica is being merged fails
/// before it freezes anything: the source has a layer without its
/// checksum until the merge ends. Before, each attempt froze every
/// replica's head first, one more layer for the merge to fold; the
/// controller's attempts a few seconds apart kept the merge from ending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_from_a_merging_source_fails_without_freezing_a_layer() {
    // 5 MiB only the lowest layer holds: merged at 1 MiB/s, about 5 s.
    let ToMerge {
        d1: _d1,
        d2: _d2,
        table,
        r0,
        r1,
    } = to_merge(5 << 20, (8 << 20, 1 << 20)).await;
    let engine = engine_over(SIZE, std::slice::from_ref(&r0), None).await;
    let merging = tokio::spawn(async move { table.merge("v-r0", vec![], 1 << 20).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = layers(&r0).await;
    let err = engine.add_replica(r1.clone(), None, 0).await.unwrap_err();
    assert!(
        err.to_string().contains("no rw replica to copy from"),
        "{err}"
    );
    assert_eq!(layers(&r0).await, before, "the attempt froze a layer");
    merging.await.unwrap().unwrap();
    engine.add_replica(r1, None, 0).await.unwrap();
    assert_eq!(wait_rw(&engine, "v-r1").await.mode, ReplicaMode::Rw);
}

/// A merge of the source asked for while a rebuild fills from it (the
/// controller's records may not show the rebuild yet) waits for the fill:
/// it would change the layers the fill reads, which would then fail their
/// check on arrival and be copied again. A source lent to the engine is
/// merged by the engine, which knows the rebuild and refuses; one its
/// server holds is refused by the server, which a fill's reads of its
/// frozen layers tell. The fill goes through at its first attempt, the
/// merge after it, and the rebuilt replica holds every byte the source
/// holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merge_of_the_source_asked_for_during_a_fill_waits_for_it() {
    for lend in [false, true] {
        merge_during_fill(lend).await;
    }
}

async fn merge_during_fill(lend: bool) {
    // The lowest layer holds 4 MiB, the one above it 2 MiB over half of
    // them: the merge folds the lower one's other 2 MiB up.
    let ToMerge {
        d1,
        d2: _d2,
        table,
        r0,
        r1,
    } = to_merge(4 << 20, (2 << 20, 2 << 20)).await;
    let engine = engine_over(SIZE, std::slice::from_ref(&r0), Some("v-r0")).await;
    lend_if(&engine, &replica_dir(d1.path(), "v-r0"), lend).await;
    let want = blake3::hash(&engine.read(0, SIZE as u32).await.unwrap());
    // 1 MiB/s: the fill of the first layer alone takes about 4 s.
    engine.add_replica(r1.clone(), None, 1 << 20).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let chain = || chain_of(&replica_dir(d1.path(), "v-r0"));
    let before = chain();
    if lend {
        let e = engine.merge("v-r0", vec![], 64 << 20).await.unwrap_err();
        assert!(
            matches!(e, ballast_node::engine::EngineError::Busy(_)),
            "{e}"
        );
    } else {
        let e = table.merge("v-r0", vec![], 64 << 20).await.unwrap_err();
        assert!(
            matches!(e, ballast_node::replica::ReplicaError::Busy(_)),
            "{e}"
        );
    }
    assert_eq!(chain(), before, "a layer was merged during the fill");
    let rebuilt = wait_rw(&engine, "v-r1").await;
    assert_eq!(rebuilt.mode, ReplicaMode::Rw, "{rebuilt:?}");
    assert!(
        rebuilt.rebuild.as_ref().is_some_and(|r| r.done),
        "{rebuilt:?}"
    );
    let st = engine.status().await;
    let source = st.iter().find(|m| m.name == "v-r0").unwrap();
    assert_eq!(
        source.mode,
        ReplicaMode::Rw,
        "the source was blamed: {source:?}"
    );
    assert!(
        !replica_dir(d1.path(), "v-r0")
            .join("corrupt-layers")
            .exists(),
        "a layer of the source was marked corrupt"
    );
    // Once the fill has ended (its server sees its connection end), the
    // merge goes through.
    copies_end(&table, "v-r0").await;
    let merged = if lend {
        engine.merge("v-r0", vec![], 64 << 20).await.unwrap()
    } else {
        table.merge("v-r0", vec![], 64 << 20).await.unwrap()
    };
    assert!(merged.merged > 0, "{merged:?}");
    assert!(
        chain().len() < before.len(),
        "nothing was merged: {before:?}"
    );
    engine.flush().await.unwrap();
    assert_eq!(
        blake3::hash(&image(&r1).await),
        want,
        "the rebuilt replica's data differs from the source's"
    );
    assert_eq!(
        blake3::hash(&engine.read(0, SIZE as u32).await.unwrap()),
        want,
        "the merge changed a read"
    );
    // Each of the target's frozen layers is whole: it has its checksum,
    // and the read above checked every block against its own.
    engine.snapshot(None).await.unwrap();
    let l1 = layers(&r1).await;
    assert!(l1[..l1.len() - 1].iter().all(|l| l.1.is_some()), "{l1:?}");
}

/// A merge of a source asked for while a fill on its own node copies it
/// (from its files, not through its server's reads of frozen layers)
/// waits for the fill too: the fill tells the node's table of replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merge_of_a_source_a_local_fill_copies_waits_for_it() {
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let s = listener.local_addr().unwrap().to_string();
    let server = ReplicaServer::new(vec![d1.path().to_path_buf(), d2.path().to_path_buf()]);
    let table = server.replicas().clone();
    tokio::spawn(server.serve(listener));
    let (r0, r1) = (
        replica(d1.path(), "v-r0", &s),
        replica(d2.path(), "v-r1", &s),
    );
    let src = ReplicaClient::connect(&s, "v-r0").await.unwrap();
    let dst = ReplicaClient::connect(&s, "v-r1").await.unwrap();
    // As in `to_merge`: 4 MiB, then 2 MiB over half of them.
    src.write(0, &pattern(0, 4 << 20, 1), 1, false)
        .await
        .unwrap();
    src.snapshot(None).await.unwrap();
    src.write(2 << 20, &pattern(2 << 20, 2 << 20, 2), 2, false)
        .await
        .unwrap();
    join(&src, &dst).await;
    let chain = || chain_of(&replica_dir(d1.path(), "v-r0"));
    let before = chain();
    // 1 MiB/s: about 6 s.
    let source = format!("v-r0@{s}");
    let fill = tokio::spawn(async move { dst.fill(&source, 1 << 20).await });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let e = table.merge("v-r0", vec![], 64 << 20).await.unwrap_err();
    assert!(
        matches!(e, ballast_node::replica::ReplicaError::Busy(_)),
        "{e}"
    );
    assert_eq!(chain(), before, "a layer was merged during the fill");
    let report = fill.await.unwrap().unwrap();
    assert_ne!(report["path"], "remote", "{report}");
    copies_end(&table, "v-r0").await;
    let merged = table.merge("v-r0", vec![], 64 << 20).await.unwrap();
    assert!(merged.merged > 0, "{merged:?}");
    assert!(
        chain().len() < before.len(),
        "nothing was merged: {before:?}"
    );
    assert!(
        image(&r0).await == image(&r1).await,
        "the filled replica's data differs from the source's"
    );
}

/// Waits until no copy reads `name`'s layers: a fill's source connection
/// is seen to end by its server a moment after the fill answers.
async fn copies_end(table: &ballast_node::replica::Replicas, name: &str) {
    for _ in 0..100 {
        if table.copied_from(name).is_none() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{name} is still copied from after its fill ended");
}

/// Allocated bytes of a file.
fn allocated(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().blocks() * 512
}

/// Writes 4 KiB of garbage at `at` into a layer file, behind its
/// replica's back: the block goes bad on its disk.
fn spoil(file: &Path, at: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
    f.write_all_at(&[0xeeu8; 4096], at).unwrap();
}

/// One server with two disks: `v-r0` on the first holds eight extents of
/// 32 KiB (one per MiB, from `pattern` with `seed`), and `v-r1` on the
/// second has joined it, its layer still to fill.
struct TwoDisks {
    d1: tempfile::TempDir,
    d2: tempfile::TempDir,
    s: String,
    r0: ReplicaAddr,
    r1: ReplicaAddr,
    src: ReplicaClient,
    dst: ReplicaClient,
}

async fn two_disks_joined(seed: u8) -> TwoDisks {
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let s = server(&[d1.path(), d2.path()]).await;
    let r0 = replica(d1.path(), "v-r0", &s);
    let r1 = replica(d2.path(), "v-r1", &s);
    let src = ReplicaClient::connect(&s, "v-r0").await.unwrap();
    let dst = ReplicaClient::connect(&s, "v-r1").await.unwrap();
    for k in 0..8u64 {
        src.write(k << 20, &pattern(k << 20, 32 << 10, seed), k + 1, false)
            .await
            .unwrap();
    }
    join(&src, &dst).await;
    TwoDisks {
        d1,
        d2,
        s,
        r0,
        r1,
        src,
        dst,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_on_the_same_node_copies_locally_and_keeps_the_holes() {
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let s = server(&[d1.path(), d2.path()]).await;
    let r0 = replica(d1.path(), "v-r0", &s);
    let r1 = replica(d2.path(), "v-r1", &s);
    let engine = engine_over(SIZE, std::slice::from_ref(&r0), Some("v-r0")).await;
    for k in 0..16u64 {
        let at = k * (1 << 20) + (k % 3) * 8192;
        engine
            .write(at, &pattern(at, 64 << 10, 2), false)
            .await
            .unwrap();
    }
    let before = blake3::hash(&engine.read(0, SIZE as u32).await.unwrap());
    engine
        .add_replica(r1.clone(), Some("v-r0".into()), 0)
        .await
        .unwrap();
    let m = wait_rw(&engine, "v-r1").await;
    let rebuild = m.rebuild.unwrap();
    // A local way: on ext4 (no reflink) the extents read through an
    // io_uring, or copy_file_range where the kernel refuses io_uring.
    assert!(
        ["reflink", "io-uring", "copy-file-range"].contains(&rebuild.path.as_str()),
        "{rebuild:?}"
    );
    assert_eq!(rebuild.copied_bytes, 16 * (64 << 10));
    let src = replica_dir(d1.path(), "v-r0").join("layer-000001.img");
    let dst = replica_dir(d2.path(), "v-r1").join("layer-000001.img");
    assert_eq!(std::fs::metadata(&dst).unwrap().len(), SIZE);
    assert_eq!(allocated(&dst), allocated(&src), "holes were not kept");
    assert_eq!(blake3::hash(&image(&r1).await), before);
}

/// Freezes the source's head and joins `target` to its chain; returns the
/// report of the join.
async fn join(source: &ReplicaClient, target: &ReplicaClient) -> serde_json::Value {
    source.snapshot(None).await.unwrap();
    let spec = following(source).await;
    serde_json::to_value(target.join(&spec).await.unwrap()).unwrap()
}

/// The join that follows `source`'s chain as it is now.
async fn following(source: &ReplicaClient) -> JoinSpec {
    let info = source.info().await.unwrap();
    let layers = source.layers().await.unwrap();
    JoinSpec::following(&layers, info["revision"].as_u64().unwrap()).unwrap()
}

struct Immutable<'a>(&'a Path);

impl Drop for Immutable<'_> {
    fn drop(&mut self) {
        let _ = std::process::Command::new("chattr")
            .arg("-i")
            .arg(self.0)
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_local_copy_falls_back_to_remote_sync_with_a_clean_target() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root for chattr (CI runs as root)"
    );
    // Every field bound: what is left out is dropped here (a TempDir
    // with its replica).
    let TwoDisks {
        d1: _d1,
        d2,
        s,
        r0,
        r1,
        src: _src,
        dst,
    } = two_disks_joined(3).await;
    // The local copy writes a temp file beside the target layer and renames
    // it; an immutable file in its way makes that path unwritable, while
    // the remote sync writes into the layer file itself.
    let dir = replica_dir(d2.path(), "v-r1");
    let blocker = dir.join(".layer-000001.img.partial");
    std::fs::write(&blocker, b"").unwrap();
    let ok = std::process::Command::new("chattr")
        .arg("+i")
        .arg(&blocker)
        .status()
        .unwrap();
    assert!(ok.success(), "chattr +i failed");
    let _undo = Immutable(&blocker);
    let report = dst.fill(&format!("v-r0@{s}"), 0).await.unwrap();
    assert_eq!(report["path"], "remote", "{report}");
    assert_eq!(report["bytes"], 8 * (32 << 10));
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".partial") && n != ".layer-000001.img.partial")
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    assert_eq!(layers(&r0).await[..1], layers(&r1).await[..1]);
    assert!(image(&r0).await == image(&r1).await);
}

/// A local fill (source and target on two disks of one node) whose
/// source's frozen layer went bad on its disk: the fill fails as the
/// source's fault, the source's layer is marked corrupt, and the target's
/// layer stays pending, so none of it is ever served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_fill_from_a_corrupt_source_is_the_sources_fault_and_completes_nothing() {
    let TwoDisks {
        d1,
        d2: _d2,
        s,
        r0: _,
        r1: _,
        src,
        dst,
    } = two_disks_joined(6).await;
    // A block inside the fourth extent of the source's frozen layer.
    let frozen = replica_dir(d1.path(), "v-r0").join("layer-000001.img");
    spoil(&frozen, (3 << 20) + 8192);
    let err = dst.fill(&format!("v-r0@{s}"), 0).await.unwrap_err();
    assert!(err.is_corrupt(), "the source is not blamed: {err}");
    assert_eq!(dst.info().await.unwrap()["pending"], 1);
    drop((src, dst));
    assert!(
        Replica::open(&replica_dir(d1.path(), "v-r0"))
            .unwrap()
            .is_corrupt("layer-000001.img"),
        "the source's layer is not marked corrupt"
    );
}

/// Two servers, source `v-r0` with two frozen layers of 1 MiB each, and
/// target `v-r1` after a first fill whose second layer arrived wrong (the
/// join named another checksum for it): the first layer complete, the
/// second filled but pending.
struct CutOff {
    disks: (tempfile::TempDir, tempfile::TempDir),
    source: (String, ReplicaAddr),
    target: ReplicaAddr,
    src: ReplicaClient,
    dst: ReplicaClient,
}

async fn cut_off_after_one_layer() -> CutOff {
    let n = two_nodes().await;
    let src = ReplicaClient::connect(&n.s1, "v-r0").await.unwrap();
    let dst = ReplicaClient::connect(&n.s2, "v-r1").await.unwrap();
    src.write(0, &pattern(0, 1 << 20, 4), 1, false)
        .await
        .unwrap();
    src.snapshot(None).await.unwrap();
    src.write(4 << 20, &pattern(4 << 20, 1 << 20, 5), 2, false)
        .await
        .unwrap();
    src.snapshot(None).await.unwrap();
    let mut spec = following(&src).await;
    spec.frozen[1].checksum = "0".repeat(64);
    dst.join(&spec).await.unwrap();
    let source = format!("v-r0@{}", n.s1);
    let err = dst.fill(&source, 0).await.unwrap_err();
    assert!(err.to_string().contains("checksum"), "{err}");
    let pending = dst.info().await.unwrap()["pending"].as_u64().unwrap();
    assert_eq!(pending, 1);
    CutOff {
        disks: (n.d1, n.d2),
        source: (source, n.r0),
        target: n.r1,
        src,
        dst,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_cut_off_resumes_from_the_layers_it_had_finished() {
    let CutOff {
        disks: _disks,
        source: (s1, r0),
        target: r1,
        src,
        dst,
    } = cut_off_after_one_layer().await;
    // The next attempt keeps the finished layer and fills only the other,
    // from what the first attempt left in it: its blocks are the source's,
    // so none travels again, and the layer's checksum now matches.
    let report = join(&src, &dst).await;
    assert_eq!(report["kept"], serde_json::json!(["layer-000001.img"]));
    assert_eq!(report["keptBytes"], 1 << 20);
    assert_eq!(report["seeded"], serde_json::json!(["layer-000002.img"]));
    let filled = dst.fill(&s1, 0).await.unwrap();
    assert_eq!(filled["bytes"], 0, "{filled}");
    assert_eq!(filled["reused"], 1 << 20, "{filled}");
    assert_eq!(dst.info().await.unwrap()["pending"], 0);
    assert_eq!(layers(&r0).await[..3], layers(&r1).await[..3]);
    assert!(image(&r0).await == image(&r1).await);
}

/// A replica server on a runtime of its own, so that a test can stop it the
/// way a crash stops a process: every task dropped, files left as they are.
struct Process {
    rt: Option<tokio::runtime::Runtime>,
    addr: String,
}

impl Process {
    fn start(disk: &Path) -> Process {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let disk = disk.to_path_buf();
        let addr = rt.block_on(async move {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap().to_string();
            tokio::spawn(ReplicaServer::new(vec![disk]).serve(l));
            addr
        });
        Process { rt: Some(rt), addr }
    }

    fn kill(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

#[test]
fn a_rebuild_cut_off_by_a_restart_resumes_from_the_layers_it_had_finished() {
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let size = 1u64 << 30;
    let src_dir = replica_dir(d1.path(), "v-r0");
    {
        // The source: a small frozen layer, then a large one.
        let mut r = Replica::create(&src_dir, size).unwrap();
        r.write(0, &pattern(0, 1 << 20, 6), Some(1)).unwrap();
        r.snapshot(None).unwrap();
        let chunk = pattern(0, 8 << 20, 7);
        for k in 0..48u64 {
            r.write(k * (16 << 20), &chunk, Some(2 + k)).unwrap();
        }
        r.snapshot(None).unwrap();
    }
    Replica::create(&replica_dir(d2.path(), "v-r1"), size).unwrap();
    let source = Process::start(d1.path());
    let mut target = Process::start(d2.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (s_addr, t_addr) = (source.addr.clone(), target.addr.clone());
    rt.block_on(async {
        let src = ReplicaClient::connect(&s_addr, "v-r0").await.unwrap();
        let dst = ReplicaClient::connect(&t_addr, "v-r1").await.unwrap();
        let spec = following(&src).await;
        let joined = dst.join(&spec).await.unwrap();
        assert_eq!(joined.pending.len(), 2);
        let fill = tokio::spawn(async move { dst.fill(&format!("v-r0@{s_addr}"), 0).await });
        // Wait until the first layer is complete, then cut the target off.
        let probe = ReplicaClient::connect(&t_addr, "v-r1").await.unwrap();
        loop {
            if probe.info().await.unwrap()["pending"] == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(probe);
        // The fill dies with the target below.
        drop(fill);
    });
    target.kill();
    // The target's files after the crash: one layer done, one pending.
    let on_disk = Replica::open(&replica_dir(d2.path(), "v-r1")).unwrap();
    assert_eq!(on_disk.pending(), ["layer-000002.img"]);
    drop(on_disk);
    let target = Process::start(d2.path());
    rt.block_on(async {
        let src = ReplicaClient::connect(&source.addr, "v-r0").await.unwrap();
        let dst = ReplicaClient::connect(&target.addr, "v-r1").await.unwrap();
        let spec = following(&src).await;
        let joined = dst.join(&spec).await.unwrap();
        assert_eq!(joined.kept, ["layer-000001.img"]);
        assert_eq!(joined.kept_bytes, 1 << 20);
        let report = dst.fill(&format!("v-r0@{}", source.addr), 0).await.unwrap();
        assert_eq!(report["bytes"], 48 * (8u64 << 20), "{report}");
        let a = ReplicaClient::connect(&source.addr, "v-r0").await.unwrap();
        let (la, lb) = (a.layers().await.unwrap(), dst.layers().await.unwrap());
        assert_eq!(la[..2], lb[..2]);
        for k in [0u64, 17, 47] {
            let at = k * (16 << 20);
            assert!(a.read(at, 8 << 20).await.unwrap() == dst.read(at, 8 << 20).await.unwrap());
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fill_reports_its_progress_while_it_runs() {
    let chunk = pattern(0, 8 << 20, 9);
    let j = joined(1 << 30, |r| {
        for k in 0..64u64 {
            r.write(k * (16 << 20), &chunk, Some(k + 1)).unwrap();
        }
    })
    .await;
    let (target, dst, source) = (j.target, j.dst, j.source);
    assert_eq!(target.fill_progress("v-r1"), None);
    let fill = tokio::spawn(async move { dst.fill(&source, 0).await });
    let mut seen = Vec::new();
    while !fill.is_finished() {
        if let Some(p) = target.fill_progress("v-r1") {
            seen.push(p);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    fill.await.unwrap().unwrap();
    let total = 64 * (8u64 << 20);
    assert!(
        seen.iter().any(|&(done, t)| t == total && done < total),
        "no progress seen mid-fill: {:?}",
        seen.first()
    );
    assert!(
        seen.windows(2).all(|w| w[0].0 <= w[1].0),
        "progress went back"
    );
    assert_eq!(
        target.fill_progress("v-r1"),
        None,
        "progress stays after the fill"
    );
}

/// `v-r1` (on the second disk, served by `target`) joined to the chain of
/// `v-r0` (on the first, its server at `source`), whose one frozen layer
/// holds what `write` wrote; nothing filled yet.
struct Joined {
    _disks: (tempfile::TempDir, tempfile::TempDir),
    target: Arc<ReplicaServer>,
    /// `target`'s address.
    target_addr: String,
    dst: ReplicaClient,
    spec: JoinSpec,
    source: String,
}

async fn joined(size: u64, write: impl FnOnce(&mut Replica)) -> Joined {
    joined_on(size, false, write).await
}

/// `joined`, with both disks on one node (`target` serves `v-r0` too)
/// when `one_node`: a fill of `v-r1` then copies within the node.
async fn joined_on(size: u64, one_node: bool, write: impl FnOnce(&mut Replica)) -> Joined {
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    {
        let mut r = Replica::create(&replica_dir(d1.path(), "v-r0"), size).unwrap();
        write(&mut r);
        r.snapshot(None).unwrap();
    }
    Replica::create(&replica_dir(d2.path(), "v-r1"), size).unwrap();
    let mut disks = vec![d2.path().to_path_buf()];
    if one_node {
        disks.push(d1.path().to_path_buf());
    }
    let target = ReplicaServer::new(disks);
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let s2 = l.local_addr().unwrap().to_string();
    tokio::spawn(target.clone().serve(l));
    let s1 = if one_node {
        s2.clone()
    } else {
        server(&[d1.path()]).await
    };
    let src = ReplicaClient::connect(&s1, "v-r0").await.unwrap();
    let dst = ReplicaClient::connect(&s2, "v-r1").await.unwrap();
    let spec = following(&src).await;
    dst.join(&spec).await.unwrap();
    Joined {
        _disks: (d1, d2),
        target,
        target_addr: s2,
        dst,
        spec,
        source: format!("v-r0@{s1}"),
    }
}

/// A paced fill under way: `joined` with 32 MiB in the frozen layer,
/// filled at 512 KiB/s, a piece (4 MiB) every 8 s, once its first piece
/// is written.
struct PacedFill {
    j: Joined,
    fill: tokio::task::JoinHandle<
        Result<ballast_node::sync::FillReport, ballast_node::sync::SyncError>,
    >,
}

async fn a_paced_fill() -> PacedFill {
    let j = joined(64 << 20, |r| {
        r.write(0, &pattern(0, 32 << 20, 3), Some(1)).unwrap();
    })
    .await;
    let fill = {
        let (target, source) = (j.target.clone(), j.source.clone());
        tokio::spawn(async move { target.fill("v-r1", &source, 512 << 10).await })
    };
    let mut waited = 0;
    while j
        .target
        .fill_progress("v-r1")
        .is_none_or(|(done, _)| done == 0)
    {
        assert!(waited < 3000, "no piece written in 30 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
        waited += 1;
    }
    PacedFill { j, fill }
}

/// Ends the task of `fill` (its caller, or the engine's connection, goes
/// away) and waits until `target` no longer runs a fill of `v-r1`: within
/// 4 s after `what`, where a paced fill's next piece is due 8 s later.
async fn call_off<T>(fill: tokio::task::JoinHandle<T>, target: &ReplicaServer, what: &str) {
    fill.abort();
    let _ = fill.await;
    let ended = std::time::Instant::now();
    while target.fill_progress("v-r1").is_some() {
        assert!(
            ended.elapsed() < Duration::from_secs(4),
            "the fill still runs 4 s after {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A paced fill whose caller goes away (its call cut: an attach called a
/// detached volume's copy off) stops at once, though it waits for its
/// pace; while it runs, a join of its replica is refused (BUSY) rather
/// than change the layers under its writes. Once it has stopped, the join
/// is taken, and a fill completes the layer, checked against the source's
/// checksum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fill_called_off_stops_at_once_and_no_join_comes_while_it_runs() {
    let PacedFill { j, fill } = a_paced_fill().await;
    let busy = j.dst.join(&j.spec).await.unwrap_err();
    assert!(busy.is_busy(), "a join while the fill runs: {busy}");

    // Called off while it waits 8 s for its next piece: it stops at once,
    // not when the piece is due.
    call_off(fill, &j.target, "it was called off").await;
    j.dst.join(&j.spec).await.unwrap();
    let done = j.target.fill("v-r1", &j.source, 0).await.unwrap();
    assert_eq!(done.layers.len(), 1, "{done:?}");
}

/// An engine asked to rebuild a replica a fill still writes to (one
/// called off writes its last pieces first) fails with "being filled"
/// before it freezes anything: INFO says the fill runs. Before, the
/// engine froze every rw replica's head, then met the join's BUSY: one
/// more layer for the merge to fold at each attempt. Once the fill has
/// ended, the same rebuild goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_of_a_replica_being_filled_fails_without_freezing_a_layer() {
    let PacedFill { j, fill } = a_paced_fill().await;
    let info = j.dst.info().await.unwrap();
    assert_eq!(info["filling"], true, "{info}");
    let (_, r0_addr) = j.source.split_once('@').unwrap();
    let r0 = ReplicaAddr {
        name: "v-r0".into(),
        addr: r0_addr.into(),
    };
    let r1 = ReplicaAddr {
        name: "v-r1".into(),
        addr: j.target_addr.clone(),
    };
    let engine = engine_over(64 << 20, std::slice::from_ref(&r0), None).await;
    let before = layers(&r0).await;
    let err = engine.add_replica(r1.clone(), None, 0).await.unwrap_err();
    assert!(
        matches!(err, ballast_node::engine::EngineError::Filling { .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("a fill of it is still writing"),
        "{err}"
    );
    assert_eq!(layers(&r0).await, before, "the attempt froze a layer");

    call_off(fill, &j.target, "it was called off").await;
    assert_eq!(j.dst.info().await.unwrap()["filling"], false);
    engine.add_replica(r1, None, 0).await.unwrap();
    assert_eq!(wait_rw(&engine, "v-r1").await.mode, ReplicaMode::Rw);
}

/// A replica's deletion calls off a fill of it (an engine's, whose caller
/// stays) and waits for it to end: the fill stops at once, though it
/// waits for its pace, and fails saying it was called off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fill_is_called_off_for_its_replicas_deletion_and_ends_at_once() {
    let PacedFill { j, fill } = a_paced_fill().await;
    assert!(
        j.target.call_off_fill("v-r1", Duration::from_secs(4)).await,
        "the fill still runs 4 s after it was called off"
    );
    let e = fill.await.unwrap().unwrap_err();
    assert!(e.to_string().contains("called off"), "{e}");
    assert!(
        j.target.call_off_fill("v-r0", Duration::ZERO).await,
        "no fill of v-r0 runs here"
    );
}

/// Waits for the first piece of `target`'s fill of `v-r1`, asked at
/// `asked` at `rate` bytes per second: no more was copied by then than
/// the rate allows.
async fn kept_its_pace(target: &ReplicaServer, asked: std::time::Instant, rate: u64) {
    let (done, seen) = loop {
        if let Some((done, _)) = target.fill_progress("v-r1").filter(|(d, _)| *d > 0) {
            break (done, asked.elapsed());
        }
        assert!(
            asked.elapsed() < Duration::from_secs(30),
            "no piece in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(
        done as f64 <= rate as f64 * seen.as_secs_f64(),
        "{done} bytes copied {seen:?} after the fill was asked for at {rate} bytes per second"
    );
}

/// An engine's FILL keeps the pace it asks for (the header's offset:
/// `replica-rebuild-rate`), and is called off when its connection ends
/// (the engine stopped, or gave the replica up): it stops at once though
/// it waits for its pace, and the replica is free for the next join.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engines_fill_keeps_its_pace_and_is_called_off_when_its_connection_ends() {
    let j = joined(64 << 20, |r| {
        r.write(0, &pattern(0, 32 << 20, 3), Some(1)).unwrap();
    })
    .await;
    const RATE: u64 = 512 << 10;
    let asked = std::time::Instant::now();
    let fill = {
        let (dst, source) = (j.dst, j.source.clone());
        tokio::spawn(async move { dst.fill(&source, RATE).await })
    };
    kept_its_pace(&j.target, asked, RATE).await;

    // The engine's connection ends while the fill waits 8 s for its next
    // piece: the fill stops at once.
    call_off(fill, &j.target, "its connection ended").await;
    // Free for the next join; a fill then completes the layer, checked
    // against the source's checksum.
    let dst = ReplicaClient::connect(&j.target_addr, "v-r1")
        .await
        .unwrap();
    dst.join(&j.spec).await.unwrap();
    let done = dst.fill(&j.source, 0).await.unwrap();
    assert_eq!(done["layers"].as_array().map(Vec::len), Some(1), "{done}");
}

/// A copy within a node keeps the fill's pace too (a rebuild's rate
/// spares the disks of one node, which its pods share, as it spares the
/// network), and is called off at once though it waits for its pace; its
/// copy is whole. Before 2026-12-06 a copy within a node took no pace,
/// ran at the disk's speed, and could not be called off mid-layer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fill_within_a_node_keeps_its_pace_and_is_called_off_at_once() {
    let written = pattern(0, 32 << 20, 5);
    let j = joined_on(64 << 20, true, |r| {
        r.write(0, &written, Some(1)).unwrap();
    })
    .await;
    const RATE: u64 = 512 << 10;
    let asked = std::time::Instant::now();
    let fill = {
        let (target, source) = (j.target.clone(), j.source.clone());
        tokio::spawn(async move { target.fill("v-r1", &source, RATE).await })
    };
    kept_its_pace(&j.target, asked, RATE).await;
    // Called off while it waits 8 s for its next piece: it stops at once.
    call_off(fill, &j.target, "it was called off").await;

    // Paced at a rate it keeps within a second, the copy within the node
    // is whole.
    j.dst.join(&j.spec).await.unwrap();
    let report = j.target.fill("v-r1", &j.source, 64 << 20).await.unwrap();
    assert!(report.path != CopyPath::Remote, "{report:?}");
    assert_eq!(report.bytes, 32 << 20);
    for k in 0..4u64 {
        let at = k * (8 << 20);
        let got = j.dst.read(at, 8 << 20).await.unwrap();
        assert!(
            got[..] == written[at as usize..][..8 << 20],
            "the copy differs in its {k}th 8 MiB"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_whose_frozen_layer_is_corrupt_is_failed_and_never_copied() {
    let (d1, d2, d3) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let (s1, s2, s3) = (
        server(&[d1.path()]).await,
        server(&[d2.path()]).await,
        server(&[d3.path()]).await,
    );
    let r0 = replica(d1.path(), "v-r0", &s1);
    let r1 = replica(d2.path(), "v-r1", &s2);
    let r2 = replica(d3.path(), "v-r2", &s3);
    let engine = engine_over(SIZE, std::slice::from_ref(&r0), None).await;
    engine
        .write(0, &pattern(0, 1 << 20, 1), true)
        .await
        .unwrap();
    // r1 joins: the data is frozen into a layer of r0 and copied to r1.
    engine.add_replica(r1.clone(), None, 0).await.unwrap();
    wait_rw(&engine, "v-r1").await;
    // r0's frozen layer goes bad on its disk.
    let frozen = layers(&r0)
        .await
        .into_iter()
        .find(|(_, sum)| sum.is_some())
        .unwrap()
        .0;
    spoil(&replica_dir(d1.path(), "v-r0").join(&frozen), 8192);
    // r2 joins, asking for r0 as its source: the copy finds the corrupt
    // block, r0 (the source) is failed as well as the unfinished r2, and
    // nothing corrupt reached r2.
    engine
        .add_replica(r2.clone(), Some("v-r0".into()), 0)
        .await
        .unwrap();
    let mut status = engine.status().await;
    for _ in 0..600 {
        status = engine.status().await;
        if status.iter().filter(|m| m.mode == ReplicaMode::Err).count() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mode = |n: &str| status.iter().find(|m| m.name == n).unwrap().mode;
    assert_eq!(
        (mode("v-r0"), mode("v-r1"), mode("v-r2")),
        (ReplicaMode::Err, ReplicaMode::Rw, ReplicaMode::Err),
        "{status:?}"
    );
    let why = status[0].error.clone().unwrap_or_default();
    assert!(why.contains("corrupt") || why.contains("checksum"), "{why}");
    // The volume reads the right data, from r1; r0's layer is marked.
    assert_eq!(
        engine.read(0, 1 << 20).await.unwrap().to_vec(),
        pattern(0, 1 << 20, 1)
    );
    assert!(
        Replica::open(&replica_dir(d1.path(), "v-r0"))
            .unwrap()
            .is_corrupt(&frozen)
    );
    // Asked again without a wish, r2 is rebuilt from the sound replica.
    engine.add_replica(r2.clone(), None, 0).await.unwrap();
    wait_rw(&engine, "v-r2").await;
    assert_eq!(image(&r2).await, image(&r1).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_replica_copies_only_the_blocks_that_changed_while_it_was_out() {
    let nodes = two_nodes().await;
    let TwoNodes { d1, d2, r0, r1, .. } = &nodes;
    let engine = engine_over(SIZE, std::slice::from_ref(r0), None).await;
    let mib = |n: u64| n << 20;
    engine
        .write(0, &pattern(0, 1 << 20, 1), false)
        .await
        .unwrap();
    engine.add_replica(r1.clone(), None, 0).await.unwrap();
    wait_rw(&engine, "v-r1").await;
    // Both replicas' heads get 8 MiB: the layer a later rebuild has to
    // bring r1 up to.
    for n in 2..10 {
        engine
            .write(mib(n), &pattern(mib(n), 1 << 20, 2), false)
            .await
            .unwrap();
    }
    engine.flush().await.unwrap();
    // r1 is out; the volume goes on: one MiB rewritten, one trimmed (a
    // hole in the source's head where r1's holds data), one new.
    engine.remove_replica("v-r1").await.unwrap();
    engine
        .write(mib(3), &pattern(mib(3), 1 << 20, 3), false)
        .await
        .unwrap();
    engine.trim(mib(5), 1 << 20).await.unwrap();
    engine
        .write(mib(12), &pattern(mib(12), 1 << 20, 3), false)
        .await
        .unwrap();
    engine.flush().await.unwrap();
    let want = blake3::hash(&engine.read(0, SIZE as u32).await.unwrap());
    engine.add_replica(r1.clone(), None, 0).await.unwrap();
    let m = wait_rw(&engine, "v-r1").await;
    let rebuild = m.rebuild.unwrap();
    assert_eq!(rebuild.path, "remote", "{rebuild:?}");
    // The rewritten and the new MiB travel; the six MiB it held alike do not.
    assert_eq!(rebuild.copied_bytes, mib(2), "{rebuild:?}");
    assert_eq!(rebuild.kept_bytes, mib(1) + mib(6), "{rebuild:?}");
    assert_eq!(blake3::hash(&image(r1).await), want);
    engine.snapshot(None).await.unwrap();
    assert_eq!(layers(r0).await, layers(r1).await, "layer chains differ");
    for layer in ["layer-000002.img", "layer-000003.img"] {
        let src = replica_dir(d1.path(), "v-r0").join(layer);
        let dst = replica_dir(d2.path(), "v-r1").join(layer);
        assert_eq!(
            allocated(&dst),
            allocated(&src),
            "{layer}: allocation differs"
        );
    }
}

/// `block` changed so that its CRC32C stays the same: a few bytes flipped
/// near its start, and four bytes at its end set to cancel them (CRC32C is
/// linear over GF(2) for blocks of one length, so that is a 32-bit linear
/// system).
fn crc_collision(block: &[u8]) -> Vec<u8> {
    use ballast_node::replica::block_sum;
    let zero = vec![0u8; block.len()];
    let base = block_sum(&zero);
    let f = |d: &[u8]| block_sum(d) ^ base;
    let tail = block.len() - 4;
    let mut diff = zero.clone();
    diff[10..18].copy_from_slice(b"tampered");
    let target = f(&diff);
    // Row j: what flipping bit j of the tail does to the CRC.
    let mut rows: Vec<(u32, u32)> = (0..32)
        .map(|j| {
            let mut d = zero.clone();
            d[tail + j / 8] ^= 1 << (j % 8);
            (f(&d), 1u32 << j)
        })
        .collect();
    // Gaussian elimination: reduce the rows to one per leading bit.
    let mut basis: Vec<(u32, u32)> = Vec::new();
    for bit in (0..32).rev() {
        if let Some(i) = rows.iter().position(|r| r.0 >> bit & 1 == 1) {
            let pivot = rows.remove(i);
            for r in rows.iter_mut().chain(basis.iter_mut()) {
                if r.0 >> bit & 1 == 1 {
                    *r = (r.0 ^ pivot.0, r.1 ^ pivot.1);
                }
            }
            basis.push(pivot);
        }
    }
    assert_eq!(basis.len(), 32, "the tail's bits span every CRC");
    let x = basis
        .iter()
        .filter(|(v, _)| (target & v) != 0 && v.is_power_of_two())
        .fold(0u32, |x, (_, combo)| x ^ combo);
    for j in 0..32 {
        if x >> j & 1 == 1 {
            diff[tail + j / 8] ^= 1 << (j % 8);
        }
    }
    assert_eq!(f(&diff), 0);
    let out: Vec<u8> = block.iter().zip(&diff).map(|(a, b)| a ^ b).collect();
    assert_ne!(out, block);
    assert_eq!(block_sum(&out), block_sum(block));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seeded_block_whose_checksum_agrees_on_other_data_is_caught_and_the_layer_copied_whole() {
    let CutOff {
        disks: (_d1, d2),
        source: (s1, r0),
        target: r1,
        src,
        dst,
    } = cut_off_after_one_layer().await;
    // One of its blocks is changed on the disk without changing its CRC32C.
    let seed = replica_dir(d2.path(), "v-r1").join("layer-000002.img");
    let at = (4 << 20) + 7 * 4096;
    let block = pattern(at, 4096, 5);
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&seed).unwrap();
        f.write_all_at(&crc_collision(&block), at).unwrap();
        f.sync_all().unwrap();
    }
    let report = join(&src, &dst).await;
    assert_eq!(report["seeded"], serde_json::json!(["layer-000002.img"]));
    let filled = dst.fill(&s1, 0).await.unwrap();
    // The compare kept the block, the layer's checksum did not match, and
    // the layer was copied whole.
    assert_eq!(filled["bytes"], 1 << 20, "{filled}");
    assert_eq!(filled["reused"], 0, "{filled}");
    assert_eq!(dst.info().await.unwrap()["pending"], 0);
    let c = ReplicaClient::connect(&r1.addr, &r1.name).await.unwrap();
    assert_eq!(
        c.read(at, 4096).await.unwrap().to_vec(),
        block,
        "the changed block survived the fill"
    );
    assert!(image(&r1).await == image(&r0).await);
}

/// The source's layer goes bad on its disk at one block, and a read finds
/// it, so the layer is marked for that block. Its table still says what
/// the layer held when frozen: the seeded fill gets its sums, keeps the
/// seed's blocks (the bad one's among them, sound in the seed), and the
/// layer completes against its recorded checksum with nothing copied.
/// (Before, a marked layer refused its sums, and every fill of it failed
/// though the seed held it whole.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_layer_marked_for_a_bad_block_gives_its_sums_and_the_seed_keeps_the_sound_block() {
    let CutOff {
        disks: (d1, _d2),
        source: (s1, _r0),
        target: _r1,
        src,
        dst,
    } = cut_off_after_one_layer().await;
    let at = (4 << 20) + 3 * 4096;
    spoil(&replica_dir(d1.path(), "v-r0").join("layer-000002.img"), at);
    let err = src.read(at, 4096).await.unwrap_err();
    assert!(err.is_corrupt(), "{err}");
    assert!(
        Replica::open(&replica_dir(d1.path(), "v-r0"))
            .unwrap()
            .is_corrupt("layer-000002.img"),
        "the layer is marked"
    );
    let report = join(&src, &dst).await;
    assert_eq!(report["seeded"], serde_json::json!(["layer-000002.img"]));
    let filled = dst.fill(&s1, 0).await.unwrap();
    assert_eq!(filled["bytes"], 0, "{filled}");
    assert_eq!(filled["reused"], 1 << 20, "{filled}");
    assert_eq!(dst.info().await.unwrap()["pending"], 0);
    assert_eq!(
        dst.read(at, 4096).await.unwrap().to_vec(),
        pattern(at, 4096, 5),
        "the target holds the block sound"
    );
}

/// What a fault schedule found (seed 20261206, moves schedule 9): the
/// last rw replica holds a block bad, and every rebuild's snapshot fails
/// on it. A replica that held the volume before and comes back gives the
/// block, but only when the write logs show it missed no write to it: one
/// not written while it was out is repaired from it, and the volume has
/// two whole replicas again. A block written while it was out has no
/// sound copy anywhere: it is frozen as lost, the rebuild completes, and
/// the block fails its reads in both replicas (never the returning one's
/// stale copy) while every other block reads back; written again, it is
/// sound in both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_bad_in_the_last_replica_is_taken_from_a_returning_one_that_missed_no_write_to_it()
{
    for lend in [false, true] {
        bad_in_the_last_replica(lend).await;
    }
}

/// Lends the replica at `dir` to `engine` when `lend`.
async fn lend_if(engine: &Arc<Engine>, dir: &Path, lend: bool) {
    if lend {
        engine
            .lend_local(dir.to_path_buf(), ballast_node::replica::WRITEBACK_EVERY)
            .await
            .unwrap();
    }
}

/// The blocks at `lost` (ascending) fail their reads as lost, through the
/// engine (its first replica, v-r0) and through `r1`; every other byte of
/// both is `want`.
async fn all_but_lost(engine: &Engine, r1: &ReplicaAddr, want: &[u8], lost: &[u64], what: &str) {
    let mut from = 0;
    let mut rest = Vec::new();
    for &at in lost {
        let e = engine.read(at, 4096).await.unwrap_err();
        assert!(e.to_string().contains("lost"), "{what}: {at}: {e}");
        let e = read_at(r1, at, 4096).await.unwrap_err();
        assert!(e.contains("lost"), "{what}: v-r1: {at}: {e}");
        rest.push((from, at as usize));
        from = at as usize + 4096;
    }
    rest.push((from, SIZE as usize));
    for (from, to) in rest.into_iter().filter(|(f, t)| t > f) {
        let (at, n) = (from as u64, (to - from) as u32);
        // The engine reads v-r0 first (through its server, or lent).
        let got = engine.read(at, n).await.unwrap();
        assert!(got == want[from..to], "{what}: v-r0 at {at}+{n}");
        let got = read_at(r1, at, n).await.unwrap();
        assert!(got == want[from..to], "{what}: v-r1 at {at}+{n}");
    }
}

/// Reads `at` through the replica `r`'s server.
async fn read_at(r: &ReplicaAddr, at: u64, len: u32) -> Result<Vec<u8>, String> {
    let c = ReplicaClient::connect(&r.addr, &r.name).await.unwrap();
    c.read(at, len)
        .await
        .map(|b| b.to_vec())
        .map_err(|e| e.to_string())
}

/// The test above, with the last replica reached through its server or
/// lent to the engine.
async fn bad_in_the_last_replica(lend: bool) {
    let nodes = two_nodes().await;
    let TwoNodes { d1, r0, r1, .. } = &nodes;
    let engine = engine_over(SIZE, &[r0.clone(), r1.clone()], Some("v-r0")).await;
    let r0_dir = replica_dir(d1.path(), "v-r0");
    lend_if(&engine, &r0_dir, lend).await;
    let blocks = |from: u64, n: u64| (from * 4096, (n * 4096) as usize);
    let (at, len) = blocks(0, 16);
    engine.write(at, &pattern(at, len, 1), false).await.unwrap();
    engine.flush().await.unwrap();
    let mut want = vec![0u8; SIZE as usize];
    want[..len].copy_from_slice(&pattern(0, len, 1));
    // r1 goes out; block 5 is written while it is out.
    engine.remove_replica("v-r1").await.unwrap();
    let (five, one) = blocks(5, 1);
    engine
        .write(five, &pattern(five, one, 2), false)
        .await
        .unwrap();
    engine.flush().await.unwrap();
    want[five as usize..five as usize + one].copy_from_slice(&pattern(five, one, 2));

    // Block 9, not written while r1 was out, goes bad in r0: it is taken
    // from r1, and r1 rebuilt.
    let (nine, _) = blocks(9, 1);
    spoil(&head_file(&r0_dir), nine);
    engine.add_replica(r1.clone(), None, 0).await.unwrap();
    wait_rw(&engine, "v-r1").await;
    // r0 serves the engine's reads first (through its server, or lent).
    assert!(
        engine.read(0, SIZE as u32).await.unwrap() == want,
        "lend {lend}: v-r0 serves the whole volume sound"
    );
    assert!(
        image(r1).await == want,
        "lend {lend}: v-r1 serves the whole volume sound"
    );
    assert_eq!(engine.io().lost_blocks, 0, "lend {lend}");

    // r1 goes out again; block 5 is written, and then goes bad in r0. r1's
    // copy is older: no replica holds it sound.
    engine.remove_replica("v-r1").await.unwrap();
    engine
        .write(five, &pattern(five, one, 3), false)
        .await
        .unwrap();
    engine.flush().await.unwrap();
    spoil(&head_file(&r0_dir), five);
    engine.add_replica(r1.clone(), None, 0).await.unwrap();
    wait_rw(&engine, "v-r1").await;
    assert_eq!(engine.io().lost_blocks, 1, "lend {lend}");
    // v-r1 fails the lost block, and never serves its old copy.
    all_but_lost(&engine, r1, &want, &[five], &format!("lend {lend}")).await;
    let (before, after) = (five as usize, five as usize + one);
    let status = engine.status().await;
    assert!(
        status.iter().all(|m| m.mode == ReplicaMode::Rw),
        "lend {lend}: {status:?}"
    );

    // Written again, block 5 is sound in both.
    engine
        .write(five, &pattern(five, one, 4), false)
        .await
        .unwrap();
    want[before..after].copy_from_slice(&pattern(five, one, 4));
    assert!(
        engine.read(0, SIZE as u32).await.unwrap() == want,
        "lend {lend}"
    );
    assert!(image(r1).await == want, "lend {lend}: v-r1");
}

/// The same, where the write logs cannot prove it: so many writes while
/// the replica was out that the last one's log no longer reaches back to
/// it (as after a power cut, whose new boot forgets the logs). Its copy
/// of the bad block has the checksum the last replica recorded for it
/// (sent with the CORRUPT reply): that is the block as last written, and
/// it is taken (`engine/spare.rs`). Not the stale copy of a block
/// written while it was out, whose checksum differs: that one is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_bad_in_the_last_replica_is_taken_from_a_returning_one_whose_copy_has_its_recorded_checksum()
 {
    let nodes = two_nodes().await;
    let TwoNodes { d1, r0, r1, .. } = &nodes;
    let engine = engine_over(SIZE, &[r0.clone(), r1.clone()], Some("v-r0")).await;
    let r0_dir = replica_dir(d1.path(), "v-r0");
    let block = |b: u64| (b * 4096, 4096usize);
    let (at, len) = (0, 16 * 4096);
    engine.write(at, &pattern(at, len, 1), false).await.unwrap();
    engine.flush().await.unwrap();
    let mut want = vec![0u8; SIZE as usize];
    want[..len].copy_from_slice(&pattern(0, len, 1));
    // r1 goes out; block 12 is written more times than a log holds, and
    // block 5 once.
    engine.remove_replica("v-r1").await.unwrap();
    let (twelve, one) = block(12);
    for round in 0..ballast_node::replica::LOG_ENTRIES + 8 {
        let data = pattern(twelve, one, (round % 200) as u8 + 2);
        engine.write(twelve, &data, false).await.unwrap();
        want[twelve as usize..twelve as usize + one].copy_from_slice(&data);
    }
    let (five, _) = block(5);
    let data = pattern(five, one, 250);
    engine.write(five, &data, false).await.unwrap();
    want[five as usize..five as usize + one].copy_from_slice(&data);
    engine.flush().await.unwrap();

    // Block 9, not written while r1 was out, goes bad in r0: r1's copy
    // has r0's recorded checksum, and is taken.
    let (nine, _) = block(9);
    spoil(&head_file(&r0_dir), nine);
    engine.add_replica(r1.clone(), None, 0).await.unwrap();
    wait_rw(&engine, "v-r1").await;
    assert_eq!(engine.io().lost_blocks, 0);
    assert!(
        engine.read(0, SIZE as u32).await.unwrap() == want,
        "v-r0 serves the whole volume sound"
    );
    assert!(image(r1).await == want, "v-r1 serves it sound");

    // r1 out again, block 5 written, then bad in r0: r1's copy is older,
    // its checksum not the recorded one, so no replica holds it sound.
    engine.remove_replica("v-r1").await.unwrap();
    let data = pattern(five, one, 251);
    engine.write(five, &data, false).await.unwrap();
    engine.flush().await.unwrap();
    spoil(&head_file(&r0_dir), five);
    engine.add_replica(r1.clone(), None, 0).await.unwrap();
    wait_rw(&engine, "v-r1").await;
    assert_eq!(engine.io().lost_blocks, 1);
    all_but_lost(&engine, r1, &want, &[five], "the stale copy").await;
}

/// A block of a frozen layer goes bad in the last rw replica, and the
/// replica that joins holds no copy of that layer (a new one): no replica
/// holds the block sound. The first rebuild fails on it, and the engine
/// gives it up as lost in the last replica, with a second block gone bad
/// in the same layer (before, that one failed each loss of the first,
/// and no rebuild ever completed), and the layer's checksum is taken
/// again; the next rebuild completes. The blocks fail their reads in both
/// replicas, every other block reads back, and written again they are
/// sound in both. Through the last replica's server, lent, and with the
/// new replica on the same node (a local copy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_gone_bad_in_a_frozen_layer_no_replica_holds_sound_is_lost_and_the_next_rebuild_completes()
 {
    for (lend, same_node) in [(false, false), (true, false), (false, true)] {
        frozen_block_lost(lend, same_node).await;
    }
}

async fn frozen_block_lost(lend: bool, same_node: bool) {
    let what = format!("lend {lend}, same node {same_node}");
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (s1, s2) = if same_node {
        let s = server(&[d1.path(), d2.path()]).await;
        (s.clone(), s)
    } else {
        (server(&[d1.path()]).await, server(&[d2.path()]).await)
    };
    let r0 = replica(d1.path(), "v-r0", &s1);
    let engine = engine_over(SIZE, std::slice::from_ref(&r0), Some("v-r0")).await;
    let r0_dir = replica_dir(d1.path(), "v-r0");
    lend_if(&engine, &r0_dir, lend).await;
    let len = 64 * 4096;
    engine.write(0, &pattern(0, len, 1), false).await.unwrap();
    engine.snapshot(None).await.unwrap();
    let mut want = vec![0u8; SIZE as usize];
    want[..len].copy_from_slice(&pattern(0, len, 1));
    let frozen = chain_of(&r0_dir)[0].clone();
    let (seven, forty) = (7 * 4096, 40 * 4096);
    for at in [seven, forty] {
        spoil(&r0_dir.join(&frozen), at);
    }
    assert!(
        engine.read(seven, 4096).await.is_err(),
        "{what}: no sound copy"
    );

    let r1 = replica(d2.path(), "v-r1", &s2);
    engine.add_replica(r1.clone(), None, 0).await.unwrap();
    let failed = async {
        loop {
            let st = engine.status().await;
            if let Some(m) = st
                .iter()
                .find(|m| m.name == "v-r1" && m.mode == ReplicaMode::Err)
            {
                return m.clone();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let m = tokio::time::timeout(Duration::from_secs(30), failed)
        .await
        .unwrap_or_else(|_| panic!("{what}: the first rebuild did not fail"));
    assert!(
        m.error.as_deref().unwrap_or_default().contains("corrupt"),
        "{what}: {m:?}"
    );
    assert_eq!(engine.io().lost_blocks, 2, "{what}");

    engine.add_replica(r1.clone(), None, 0).await.unwrap();
    wait_rw(&engine, "v-r1").await;
    all_but_lost(&engine, &r1, &want, &[seven, forty], &what).await;
    for at in [seven, forty] {
        let (before, after) = (at as usize, at as usize + 4096);
        engine
            .write(at, &pattern(at, 4096, 2), false)
            .await
            .unwrap();
        want[before..after].copy_from_slice(&pattern(at, 4096, 2));
    }
    assert!(engine.read(0, SIZE as u32).await.unwrap() == want, "{what}");
    assert!(image(&r1).await == want, "{what}: v-r1");
}

/// A block of the last replica's frozen layer goes bad, and is read (so
/// the layer is marked for it). A replica that comes back holds its old
/// copy of that layer: the fill compares block checksums with the
/// source's table, keeps the returning replica's sound block, and checks
/// the layer whole against its recorded checksum. Before, a marked layer
/// gave no checksums, and every rebuild failed on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_block_in_the_last_replicas_frozen_layer_is_kept_sound_from_a_returning_replicas_seed()
 {
    let nodes = two_nodes().await;
    let TwoNodes { d1, r0, r1, .. } = &nodes;
    let engine = engine_over(SIZE, &[r0.clone(), r1.clone()], None).await;
    let len = 64 * 4096;
    engine.write(0, &pattern(0, len, 1), false).await.unwrap();
    engine.flush().await.unwrap();
    // r1 goes out with the head as it is; r0 freezes that head.
    engine.remove_replica("v-r1").await.unwrap();
    engine.snapshot(None).await.unwrap();
    let r0_dir = replica_dir(d1.path(), "v-r0");
    let frozen = layers(r0).await[0].0.clone();
    spoil(&r0_dir.join(&frozen), 7 * 4096);
    assert!(engine.read(7 * 4096, 4096).await.is_err(), "no sound copy");
    assert!(
        Replica::open(&r0_dir).unwrap().is_corrupt(&frozen),
        "the layer is marked"
    );
    engine.add_replica(r1.clone(), None, 0).await.unwrap();
    let m = wait_rw(&engine, "v-r1").await;
    let rebuild = m.rebuild.unwrap();
    assert_eq!(rebuild.copied_bytes, 0, "{rebuild:?}");
    // Served from r1 and repaired in r0; both whole now.
    let mut want = vec![0u8; SIZE as usize];
    want[..len].copy_from_slice(&pattern(0, len, 1));
    assert!(engine.read(0, SIZE as u32).await.unwrap() == want);
    assert!(image(r1).await == want, "v-r1 serves the whole volume");
    assert!(image(r0).await == want, "v-r0 serves the whole volume");
}

/// An offline rebuild (a detached volume's: no engine) waits for its
/// source as long as the source answers, and no longer. Its source's node
/// frozen right when it asked for the freeze of the source's head (the
/// proxy answers nothing more, as a stopped process or a cut network
/// leaves it): the rebuild is given up once the source leaves its pings
/// unanswered, Unavailable, which the controller tries again without
/// counting it; before, it waited for as long as the node stayed frozen,
/// up to the controller's copy timeout of 6 h, holding the volume's
/// rebuild. Its source busy instead (its replica locked for longer than
/// the silence allowed, as a freeze reading a large head holds it): the
/// rebuild waits, and completes with every byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offline_rebuild_waits_for_a_busy_source_and_gives_up_one_that_stopped_answering() {
    use ballast_node::agent::rebuild::offline;
    use ballast_node::wire::client::Liveness;
    use ballast_node::wire::protocol::Op;
    let liveness = Liveness {
        every: Duration::from_millis(200),
        silence: Duration::from_secs(1),
    };
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let source = ReplicaAddr {
        name: "v-r0".into(),
        addr: listener.local_addr().unwrap().to_string(),
    };
    let served = ReplicaServer::new(vec![d1.path().to_path_buf()]);
    let table = served.replicas().clone();
    tokio::spawn(served.serve(listener));
    Replica::create(&replica_dir(d1.path(), "v-r0"), SIZE).unwrap();
    Replica::create(&replica_dir(d2.path(), "v-r1"), SIZE).unwrap();
    let target = ReplicaServer::new(vec![d2.path().to_path_buf()]);
    let writer = ReplicaClient::connect(&source.addr, "v-r0").await.unwrap();
    let data = pattern(0, 4 << 20, 7);
    writer.write(0, &data, 1, false).await.unwrap();
    writer.flush().await.unwrap();

    let (frozen, gate) = frozen_at_first(&source, Op::Snapshot).await;
    let from = format!("v-r0@{}", frozen.addr);
    let given_up = tokio::time::timeout(
        Duration::from_secs(60),
        offline(&target, "v-r1", (&from, 0), liveness),
    )
    .await
    .expect("the rebuild waited a minute for a source that answers nothing");
    let Err(ballast_node::error::Error::Unavailable(why)) = given_up else {
        panic!("given up as unavailable: {given_up:?}")
    };
    assert!(why.contains("no answer to a ping"), "{why}");
    gate.send_replace(true);

    // The source's replica busy for 3 s: its pings are answered meanwhile.
    let busy = table.find_async("v-r0").await.unwrap();
    let released = Arc::new(AtomicBool::new(false));
    let (locked_tx, locked) = tokio::sync::oneshot::channel();
    let holder = {
        let released = released.clone();
        std::thread::spawn(move || {
            let _held = busy.write().unwrap();
            let _ = locked_tx.send(());
            std::thread::sleep(Duration::from_secs(3));
            released.store(true, Ordering::SeqCst);
        })
    };
    locked.await.unwrap();
    let done = offline(&target, "v-r1", (&from, 0), liveness)
        .await
        .expect("the rebuild waited for its busy source");
    assert!(
        released.load(Ordering::SeqCst),
        "the rebuild ended while its source was locked"
    );
    holder.join().unwrap();
    assert!(done.copied_bytes >= data.len() as u64, "{done:?}");
    let copy = Replica::open_view(&replica_dir(d2.path(), "v-r1")).unwrap();
    let mut back = vec![0u8; data.len()];
    copy.read(0, &mut back).unwrap();
    assert!(back == data, "the rebuilt replica holds other data");
}
