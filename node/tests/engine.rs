//! The engine over real replica servers on loopback.

mod common;

use std::sync::Arc;

use ballast::model::ReplicaMode;
use ballast_node::engine::{Engine, ReplicaAddr, ReplicaSet};
use ballast_node::replica::replica_dir;
use ballast_node::replica::{BLOCK, Replica, WRITEBACK_EVERY};
use ballast_node::server::ReplicaServer;
use ballast_node::wire::client::ReplicaClient;
use common::{
    NodeProcess, chain_of, engine_over, flip_block, frozen_at_first, gated_proxy, head_file, proxy,
    replica_server,
};
use tokio::net::TcpListener;

/// After an unclean stop a replica behind the others takes the writes it
/// missed from their write logs (`engine/catch_up.rs`); one whose log
/// cannot say, from a comparison of the regions written lately
/// (`engine/equalize.rs`). Either way only what differs is copied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_unclean_stop_a_replica_behind_takes_only_the_writes_it_missed() {
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = replica_server(d1.path(), "v-r1", 64 * BLOCK).await;
    let b = replica_server(d2.path(), "v-r2", 64 * BLOCK).await;
    // r1 took two more writes than r2 before the stop.
    let ca = ReplicaClient::connect(&a.addr, &a.name).await.unwrap();
    let cb = ReplicaClient::connect(&b.addr, &b.name).await.unwrap();
    ca.write(0, &[1u8; 512], 1, false).await.unwrap();
    cb.write(0, &[1u8; 512], 1, false).await.unwrap();
    ca.write(0, &[2u8; 512], 2, false).await.unwrap();
    ca.write(512, &[3u8; 512], 3, true).await.unwrap();
    drop((ca, cb));
    let engine = engine_over(64 * BLOCK, &[a.clone(), b.clone()], None).await;
    let status = engine.status().await;
    assert_eq!(status[0].mode, ReplicaMode::Rw);
    assert_eq!(status[1].mode, ReplicaMode::Rw, "{status:?}");
    let caught = status[1].rebuild.clone().unwrap();
    // The two writes it missed, 512 bytes each, and nothing else.
    assert_eq!(
        (caught.path.as_str(), caught.copied_bytes),
        ("catch-up", 1024),
        "{caught:?}"
    );
    // Both replicas now hold the same data, read straight from each.
    for at in [&a, &b] {
        let c = ReplicaClient::connect(&at.addr, &at.name).await.unwrap();
        assert_eq!(&c.read(0, 512).await.unwrap()[..], &[2u8; 512][..]);
        assert_eq!(&c.read(512, 512).await.unwrap()[..], &[3u8; 512][..]);
        assert_eq!(c.info().await.unwrap()["revision"], 3);
    }
    drop(engine);

    // A replica so far behind that the log has wrapped cannot catch up:
    // the regions either wrote lately are compared instead, and only the
    // block that differs is copied; it is not rebuilt.
    let c1 = ReplicaClient::connect(&a.addr, &a.name).await.unwrap();
    let first = 4;
    let last = first + ballast_node::replica::LOG_ENTRIES + 10;
    for r in first..=last {
        c1.write(4096, &[r as u8; 512], r, false).await.unwrap();
    }
    drop(c1);
    let engine = engine_over(64 * BLOCK, &[a.clone(), b.clone()], None).await;
    let status = engine.status().await;
    assert_eq!(status[1].mode, ReplicaMode::Rw, "{status:?}");
    let equal = status[1].rebuild.clone().unwrap();
    assert_eq!(
        (equal.path.as_str(), equal.copied_bytes),
        ("recent-regions", BLOCK),
        "{equal:?}"
    );
    for at in [&a, &b] {
        let c = ReplicaClient::connect(&at.addr, &at.name).await.unwrap();
        assert_eq!(
            &c.read(4096, 512).await.unwrap()[..],
            &[last as u8; 512][..]
        );
        assert_eq!(&c.read(0, 512).await.unwrap()[..], &[2u8; 512][..]);
    }
    assert_eq!(engine.read(4096, 512).await.unwrap(), vec![last as u8; 512]);
}

/// Reads a replica through its server once its loan to an engine has
/// ended (the engine's connection closes on its own time after a drop).
async fn read_given_back(a: &ReplicaAddr, offset: u64, len: u32) -> Vec<u8> {
    let c = ReplicaClient::connect(&a.addr, &a.name).await.unwrap();
    for _ in 0..100 {
        match c.read(offset, len).await {
            Ok(b) => return b.to_vec(),
            Err(e) => assert!(e.to_string().contains("lent"), "{e}"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("{} was never given back", a.name);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_overlapping_writes_leave_every_replica_identical() {
    overlapping_writes(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_overlapping_writes_with_a_lent_local_replica_leave_every_replica_identical() {
    overlapping_writes(true).await;
}

/// Three replica servers of 64 blocks and an engine over them, on the
/// node of the first, which with `lend` is lent to it. The directories
/// live as long as what is returned.
async fn three_replicas(lend: bool) -> (Vec<tempfile::TempDir>, Vec<ReplicaAddr>, Arc<Engine>) {
    let (dirs, addrs) = three_servers(64).await;
    let engine = engine_over(64 * BLOCK, &addrs, Some("v-r0")).await;
    if lend {
        engine
            .lend_local(replica_dir(dirs[0].path(), "v-r0"), WRITEBACK_EVERY)
            .await
            .unwrap();
    }
    (dirs, addrs, engine)
}

async fn overlapping_writes(lend: bool) {
    let (_dirs, addrs, engine) = three_replicas(lend).await;
    // Many writes racing on the same blocks.
    let tasks: Vec<_> = (0..200u32)
        .map(|i| {
            let e = engine.clone();
            tokio::spawn(async move {
                let offset = u64::from(i % 8) * 512;
                e.write(offset, &vec![i as u8; 4096], false).await.unwrap();
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_identical(engine, &addrs, lend).await;
}

/// Flushes and snapshots `engine`, then checks that its replicas at
/// `addrs` (64 blocks) hold the same, and what the engine reads; returns
/// that.
async fn assert_identical(engine: Arc<Engine>, addrs: &[ReplicaAddr], lend: bool) -> bytes::Bytes {
    engine.flush().await.unwrap();
    let names = Arc::clone(&engine).snapshot(None).await.unwrap();
    assert_eq!(names.len(), 3, "one snapshot per replica at the same point");
    let seen = engine.read(0, 64 * BLOCK as u32).await.unwrap();
    assert_eq!(engine.direct_reads(), u64::from(lend));
    drop(engine);
    let mut images = Vec::new();
    for a in addrs {
        images.push(read_given_back(a, 0, 64 * BLOCK as u32).await);
    }
    assert!(
        images[0] == images[1] && images[1] == images[2],
        "replicas diverged"
    );
    assert!(images[0] == seen, "the engine read what the replicas hold");
    seen
}

/// Large and small writes and trims racing on the same blocks, through
/// both of the engine's write paths (NBD's, answered from whoever takes
/// the last replica's answer, and the awaited one), with FUA now and then:
/// every replica, the lent one too, applies them in one order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_and_small_writes_and_trims_racing_on_a_lent_replica_leave_every_replica_identical() {
    let (_dirs, addrs, engine) = three_replicas(true).await;
    let tasks: Vec<_> = (0..300u32)
        .map(|i| {
            let e = engine.clone();
            tokio::spawn(async move {
                let offset = u64::from(i % 8) * BLOCK + u64::from(i % 3) * 512;
                match i % 4 {
                    // As NBD writes: answered from the task that takes the
                    // last replica's answer.
                    0 | 1 => {
                        let (tx, rx) = tokio::sync::oneshot::channel();
                        let data = bytes::Bytes::from(vec![i as u8; 64 << 10]);
                        e.write_then(
                            offset,
                            data,
                            i % 16 == 0,
                            Box::new(move |r| {
                                let _ = tx.send(r);
                            }),
                        )
                        .await;
                        rx.await.unwrap().unwrap();
                    }
                    2 => e.write(offset, &vec![i as u8; 4096], false).await.unwrap(),
                    _ => e.trim(offset, 2 * BLOCK).await.unwrap(),
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let held = assert_identical(engine, &addrs, true).await;
    assert!(
        held.iter().any(|&b| b != 0),
        "the writes left data to compare"
    );
}

/// One replica server of `size` bytes in `dir` and an engine over it,
/// on its node, the replica lent to the engine.
async fn lent_alone(dir: &std::path::Path, size: u64) -> (ReplicaAddr, Arc<Engine>) {
    let a = replica_server(dir, "v-r0", size).await;
    let engine = engine_over(size, std::slice::from_ref(&a), Some("v-r0")).await;
    engine
        .lend_local(replica_dir(dir, "v-r0"), WRITEBACK_EVERY)
        .await
        .unwrap();
    (a, engine)
}

/// Writes to a lent replica made at once from several threads outside
/// the engine's runtime (as the block device's serving threads make
/// them), each answered through `write_then`: every write gets its own
/// answer, once. The lent replica holds one answer at a time, the turn's;
/// it was emptied after the turn was let go, so that the next writer's
/// answer could take the place of one not yet given (which was lost,
/// and its writer waited for ever), and the next writer found none.
#[test]
fn every_write_to_a_lent_replica_from_many_threads_gets_its_own_answer() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let d = tempfile::tempdir().unwrap();
    let size = 64 * BLOCK;
    let (_, engine) = rt.block_on(lent_alone(d.path(), size));
    const THREADS: u64 = 8;
    const WRITES: u64 = 1500;
    let (tx, rx) = std::sync::mpsc::channel::<(u64, bool)>();
    let writers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (engine, tx, rt) = (engine.clone(), tx.clone(), rt.handle().clone());
            std::thread::spawn(move || {
                for i in 0..WRITES {
                    let id = t * WRITES + i;
                    // Unaligned, within a block of the thread's own.
                    let offset = t * BLOCK + (i % 7) * 512;
                    let data = bytes::Bytes::from(vec![id as u8; 512]);
                    let tx = tx.clone();
                    let done = Box::new(move |r: Result<(), _>| {
                        let _ = tx.send((id, r.is_ok()));
                    });
                    rt.block_on(engine.write_then(offset, data, false, done));
                }
            })
        })
        .collect();
    drop(tx);
    let mut answers = vec![0u32; (THREADS * WRITES) as usize];
    for _ in 0..THREADS * WRITES {
        let (id, ok) = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("a write's answer never came");
        assert!(ok, "write {id} failed");
        answers[id as usize] += 1;
    }
    for w in writers {
        w.join().unwrap();
    }
    assert!(
        answers.iter().all(|&n| n == 1),
        "a write answered more than once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lent_local_replica_matches_a_model_through_writes_trims_and_snapshots() {
    let d = tempfile::tempdir().unwrap();
    let size = 256 * BLOCK;
    let (a, engine) = lent_alone(d.path(), size).await;
    let through_server = ReplicaClient::connect(&a.addr, &a.name).await.unwrap();
    let mut model = vec![0u8; size as usize];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    for step in 0..400u64 {
        let offset = next(size - 1);
        let len = (1 + next(5 * BLOCK)).min(size - offset);
        match next(10) {
            0 => {
                engine.trim(offset, len).await.unwrap();
                model[offset as usize..(offset + len) as usize].fill(0);
            }
            1 if step % 7 == 0 => {
                engine.snapshot(None).await.unwrap();
            }
            _ => {
                let data: Vec<u8> = (0..len).map(|i| (step as u8) ^ (i as u8)).collect();
                engine.write(offset, &data, false).await.unwrap();
                model[offset as usize..(offset + len) as usize].copy_from_slice(&data);
            }
        }
        let (ro, rl) = (next(size - 1), 1 + next(8 * BLOCK));
        let rl = rl.min(size - ro) as u32;
        let direct = engine.read(ro, rl).await.unwrap();
        let want = &model[ro as usize..ro as usize + rl as usize];
        assert!(
            direct == want,
            "direct read {ro}+{rl} differs at step {step}"
        );
        if step % 50 == 0 {
            // While lent, the server serves no data of it.
            let refused = through_server.read(ro, rl).await.unwrap_err();
            assert!(refused.to_string().contains("lent"), "{refused}");
        }
    }
    assert!(
        engine.read(0, size as u32).await.unwrap() == model,
        "whole volume differs"
    );
    // Every read went straight to the files.
    assert_eq!(engine.direct_reads(), 401);
    // Given back, the server opens the files afresh and serves the same.
    drop(engine);
    assert!(
        read_given_back(&a, 0, size as u32).await == model,
        "the replica's files differ from the model"
    );
}

/// Replica `name` as the engine reports it.
async fn member(engine: &Engine, name: &str) -> ballast_node::engine::MemberStatus {
    engine
        .status()
        .await
        .into_iter()
        .find(|m| m.name == name)
        .unwrap()
}

async fn mode_of(engine: &Engine, name: &str) -> ReplicaMode {
    member(engine, name).await.mode
}

/// Why the engine failed replica `name`, if it did.
async fn error_of(engine: &Engine, name: &str) -> Option<String> {
    member(engine, name).await.error
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lent_replica_is_lent_again_after_its_server_restarts_and_fails_with_its_disk() {
    let (d0, d1) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let size = 64 * BLOCK;
    let dir0 = replica_dir(d0.path(), "v-r0");
    Replica::create(&dir0, size).unwrap();
    let n0 = NodeProcess::start(d0.path(), "127.0.0.1:0").await;
    let a = ReplicaAddr {
        name: "v-r0".into(),
        addr: n0.addr.clone(),
    };
    let b = replica_server(d1.path(), "v-r1", size).await;
    let engine = engine_over(size, &[a.clone(), b], Some("v-r0")).await;
    engine
        .lend_local(dir0.clone(), WRITEBACK_EVERY)
        .await
        .unwrap();
    assert!(n0.server.replicas().is_lent("v-r0"));
    let block = |i: u8| vec![i; BLOCK as usize];
    engine.write(0, &block(1), false).await.unwrap();
    // The node plugin restarts: the loan's connection drops, and I/O goes
    // on, the local replica's too.
    drop(n0);
    engine.write(BLOCK, &block(2), false).await.unwrap();
    assert_eq!(mode_of(&engine, "v-r0").await, ReplicaMode::Rw);
    let n0 = NodeProcess::start(d0.path(), &a.addr).await;
    for _ in 0..100 {
        if n0.server.replicas().is_lent("v-r0") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(
        n0.server.replicas().is_lent("v-r0"),
        "lent again to the engine"
    );
    engine.write(2 * BLOCK, &block(3), false).await.unwrap();
    assert_eq!(mode_of(&engine, "v-r0").await, ReplicaMode::Rw);
    assert_eq!(engine.direct_reads(), 0);
    assert_eq!(engine.read(BLOCK, BLOCK as u32).await.unwrap(), block(2));
    assert_eq!(engine.direct_reads(), 1, "read from the lent replica");
    // Its disk is lost: the loan ends, asking again is refused, and the
    // engine drops the replica while I/O goes on.
    n0.server.replicas().fail_disk(d0.path(), "test");
    for _ in 0..100 {
        if mode_of(&engine, "v-r0").await == ReplicaMode::Err {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(mode_of(&engine, "v-r0").await, ReplicaMode::Err);
    engine.write(3 * BLOCK, &block(4), false).await.unwrap();
    let all = engine.read(0, 4 * BLOCK as u32).await.unwrap();
    assert!(all == [block(1), block(2), block(3), block(4)].concat());
    // What the engine wrote while it held the replica is in its files.
    drop(engine);
    let files = Replica::open(&dir0).unwrap();
    let mut got = vec![0u8; 3 * BLOCK as usize];
    files.read(0, &mut got).unwrap();
    assert!(got == [block(1), block(2), block(3)].concat());
}

/// A recorder that holds every record until the test lets it go, and
/// answers with the next generation (or refuses, as a store whose
/// generation moved on does).
struct HeldRecorder {
    calls: std::sync::Mutex<Vec<(u64, Vec<String>)>>,
    entered: tokio::sync::Notify,
    release: tokio::sync::Semaphore,
    refuse: std::sync::atomic::AtomicBool,
}

#[tonic::async_trait]
impl ballast_node::engine::Recorder for HeldRecorder {
    async fn record(
        &self,
        generation: u64,
        replicas: &[String],
        _reason: &str,
    ) -> Result<u64, ballast_node::engine::RecordError> {
        self.calls
            .lock()
            .unwrap()
            .push((generation, replicas.to_vec()));
        self.entered.notify_one();
        self.release.acquire().await.unwrap().forget();
        if self.refuse.load(std::sync::atomic::Ordering::SeqCst) {
            Err(ballast_node::engine::RecordError::Refused(
                "the store is at another generation".into(),
            ))
        } else {
            Ok(generation + 1)
        }
    }
}

impl Default for HeldRecorder {
    fn default() -> Self {
        HeldRecorder {
            calls: Default::default(),
            entered: Default::default(),
            release: tokio::sync::Semaphore::new(0),
            refuse: Default::default(),
        }
    }
}

fn recorded(generation: u64, names: &[&str]) -> ReplicaSet {
    ReplicaSet {
        generation,
        replicas: names.iter().map(|n| n.to_string()).collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_a_dropped_replica_lacks_is_acknowledged_only_once_the_drop_is_recorded() {
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = replica_server(d1.path(), "v-r1", 64 * BLOCK).await;
    Replica::create(&replica_dir(d2.path(), "v-r2"), 64 * BLOCK).unwrap();
    let server_b = ReplicaServer::new(vec![d2.path().to_path_buf()]);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let b = ReplicaAddr {
        name: "v-r2".into(),
        addr: listener.local_addr().unwrap().to_string(),
    };
    tokio::spawn(server_b.clone().serve(listener));
    let recorder = Arc::new(HeldRecorder::default());
    let engine = Engine::start(
        "v",
        64 * BLOCK,
        &[a.clone(), b],
        None,
        recorded(5, &["v-r1", "v-r2"]),
        Some(recorder.clone()),
        Default::default(),
    )
    .await
    .unwrap();
    // Both replicas have it: acknowledged with no record to make.
    engine.write(0, &[1u8; 4096], false).await.unwrap();
    assert!(recorder.calls.lock().unwrap().is_empty());

    // r2's disk fails: the next write reaches r1 only.
    server_b.replicas().fail_disk(d2.path(), "disk pulled");
    let e = engine.clone();
    let write = tokio::spawn(async move { e.write(4096, &[2u8; 4096], true).await });
    recorder.entered.notified().await;
    assert_eq!(
        recorder.calls.lock().unwrap().clone(),
        [(5, vec!["v-r1".to_string()])],
        "the set without r2 is recorded against generation 5"
    );
    // The record is held: the write must not be acknowledged yet.
    tokio::task::yield_now().await;
    assert!(!write.is_finished(), "acknowledged before the record");
    recorder.release.add_permits(1);
    write.await.unwrap().unwrap();
    assert_eq!(engine.record(), (recorded(6, &["v-r1"]), None));
    assert_eq!(engine.read(4096, 4096).await.unwrap(), vec![2u8; 4096]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_whose_record_is_refused_is_fenced_and_fails_io() {
    let (d1, _d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = replica_server(d1.path(), "v-r1", 64 * BLOCK).await;
    let recorder = Arc::new(HeldRecorder::default());
    recorder
        .refuse
        .store(true, std::sync::atomic::Ordering::SeqCst);
    recorder.release.add_permits(1);
    // The store says r1 and r2 hold the data; only r1 is given (r2's node
    // is down), so the engine must record {r1} before acknowledging.
    let engine = Engine::start(
        "v",
        64 * BLOCK,
        std::slice::from_ref(&a),
        None,
        recorded(3, &["v-r1", "v-r2"]),
        Some(recorder.clone()),
        Default::default(),
    )
    .await
    .unwrap();
    let err = engine.write(0, &[7u8; 4096], true).await.unwrap_err();
    assert!(err.to_string().contains("fenced"), "{err}");
    assert!(engine.record().1.is_some(), "fenced");
    assert!(
        engine.read(0, 4096).await.is_err(),
        "a fenced engine serves nothing"
    );
}

/// Flips every byte of the 4 KiB block at `offset` in a replica's head file.
fn flip_head_block(dir: &std::path::Path, offset: u64) {
    flip_block(&head_file(dir), offset);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_corrupt_in_every_replica_fails_its_read_only_and_every_replica_keeps_serving() {
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = replica_server(d1.path(), "v-r1", 64 * BLOCK).await;
    let b = replica_server(d2.path(), "v-r2", 64 * BLOCK).await;
    let engine = engine_over(64 * BLOCK, &[a.clone(), b.clone()], None).await;
    engine.write(0, &[7u8; 8192], false).await.unwrap();
    engine.flush().await.unwrap();
    for (d, at) in [(&d1, &a), (&d2, &b)] {
        flip_head_block(&replica_dir(d.path(), &at.name), 0);
    }
    // No replica holds the block sound: the read fails, never with data,
    // and neither is dropped (each holds the rest of the volume).
    let e = engine.read(0, 4096).await.unwrap_err();
    assert!(e.to_string().contains("no other replica"), "{e}");
    let status = engine.status().await;
    assert!(
        status.iter().all(|s| s.mode == ReplicaMode::Rw),
        "{status:?}"
    );
    // The rest of the volume is served, and a write over the bad block
    // mends it.
    assert_eq!(engine.read(4096, 4096).await.unwrap(), vec![7u8; 4096]);
    engine.write(0, &[9u8; 4096], false).await.unwrap();
    assert_eq!(engine.read(0, 4096).await.unwrap(), vec![9u8; 4096]);
    for at in [&a, &b] {
        assert_eq!(read_given_back(at, 0, 8192).await[..4096], [9u8; 4096]);
    }
}

/// The volume's content, `blocks` long, as replica `at` alone serves it
/// (its server checks every block's checksum).
async fn content_of(at: &ReplicaAddr, blocks: u64) -> Result<Vec<u8>, String> {
    let c = ReplicaClient::connect(&at.addr, &at.name).await.unwrap();
    c.read(0, (blocks * BLOCK) as u32)
        .await
        .map(|b| b.to_vec())
        .map_err(|e| e.to_string())
}

/// A block that fails its checksum in one replica is served from another
/// and written back to it: the replica stays in the volume, and serves
/// the block sound itself afterwards. Through its server and lent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_corrupt_in_one_replica_is_repaired_from_another_and_the_replica_kept() {
    for lend in [false, true] {
        let (dirs, addrs, engine) = three_replicas(lend).await;
        let data: Vec<u8> = (0..8 * BLOCK).map(|i| (i % 251) as u8).collect();
        engine.write(0, &data, false).await.unwrap();
        engine.flush().await.unwrap();
        // v-r0, read first, has block 2 bad; the read asks for 1½ blocks
        // across it, unaligned.
        flip_head_block(&replica_dir(dirs[0].path(), "v-r0"), 2 * BLOCK);
        let got = engine.read(2 * BLOCK + 512, 6144).await.unwrap();
        assert!(
            got[..] == data[(2 * BLOCK + 512) as usize..(2 * BLOCK) as usize + 512 + 6144],
            "lend {lend}: served sound"
        );
        let status = engine.status().await;
        assert!(
            status.iter().all(|s| s.mode == ReplicaMode::Rw),
            "lend {lend}: kept: {status:?}"
        );
        drop(engine);
        for at in &addrs {
            let got = read_given_back(at, 0, (8 * BLOCK) as u32).await;
            assert!(got == data, "lend {lend}: {} holds it all sound", at.name);
        }
    }
}

/// What a fault schedule found (seed 20261204, schedule 17): another
/// block bad in each replica. Each is repaired from the others where it
/// is found — by a read, or by the freeze of a snapshot — so no replica
/// is dropped, and every replica alone serves the whole volume after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_block_corrupt_in_each_replica_is_repaired_and_no_replica_is_dropped() {
    let (dirs, addrs, engine) = three_replicas(false).await;
    let data: Vec<u8> = (0..8 * BLOCK).map(|i| (i % 239) as u8).collect();
    engine.write(0, &data, false).await.unwrap();
    engine.flush().await.unwrap();
    for (i, d) in dirs.iter().enumerate() {
        flip_head_block(&replica_dir(d.path(), &format!("v-r{i}")), i as u64 * BLOCK);
    }
    for at in &addrs {
        assert!(
            content_of(at, 8).await.is_err(),
            "{} has a bad block",
            at.name
        );
    }
    // v-r0's bad block is found by a read; the others' by the freeze.
    assert_eq!(engine.read(0, 4096).await.unwrap(), data[..4096]);
    engine.snapshot(Some("s1")).await.unwrap();
    let status = engine.status().await;
    assert!(
        status.iter().all(|s| s.mode == ReplicaMode::Rw),
        "{status:?}"
    );
    for at in &addrs {
        let got = content_of(at, 8).await.unwrap();
        assert!(got == data, "{} serves the volume sound", at.name);
    }
    assert!(engine.read(0, (8 * BLOCK) as u32).await.unwrap() == data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_the_record_leaves_out_is_never_served_whatever_revision_it_claims() {
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = replica_server(d1.path(), "v-r1", 64 * BLOCK).await;
    let b = replica_server(d2.path(), "v-r2", 64 * BLOCK).await;
    let ca = ReplicaClient::connect(&a.addr, &a.name).await.unwrap();
    ca.write(0, &[1u8; 4096], 1, true).await.unwrap();
    // r2 claims far more writes than r1 holds, but the record (generation
    // 4) names r1 alone.
    let cb = ReplicaClient::connect(&b.addr, &b.name).await.unwrap();
    cb.write(0, &[9u8; 4096], 1_000, true).await.unwrap();
    drop((ca, cb));
    let recorder = Arc::new(HeldRecorder::default());
    recorder.release.add_permits(1);
    let engine = Engine::start(
        "v",
        64 * BLOCK,
        &[a, b],
        None,
        recorded(4, &["v-r1"]),
        Some(recorder),
        Default::default(),
    )
    .await
    .unwrap();
    let status = engine.status().await;
    assert_eq!(status[0].mode, ReplicaMode::Rw);
    assert_eq!(status[1].mode, ReplicaMode::Err, "{status:?}");
    assert!(
        status[1]
            .error
            .as_deref()
            .unwrap()
            .contains("not in the replica set recorded at generation 4"),
        "{status:?}"
    );
    assert_eq!(engine.read(0, 4096).await.unwrap(), vec![1u8; 4096]);
}

/// Between the engine and `to`: sets `field` of each INFO answer's body to
/// `value`, as a server gone wrong might claim.
async fn claiming_proxy(
    to: &ReplicaAddr,
    field: &'static str,
    value: serde_json::Value,
) -> ReplicaAddr {
    use ballast_node::wire::protocol::Op;
    proxy(to, move || {
        let asked = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
        let infos = asked.clone();
        let value = value.clone();
        (
            Box::new(move |req, _| {
                if req.op == Op::Info {
                    asked.lock().unwrap().insert(req.id);
                }
            }),
            Box::new(move |resp, body| {
                if infos.lock().unwrap().remove(&resp.id) {
                    let mut info: serde_json::Value = serde_json::from_slice(body).unwrap();
                    info[field] = value.clone();
                    *body = serde_json::to_vec(&info).unwrap();
                }
            }),
        )
    })
    .await
}

/// A replica whose server claims what no replica holds (a revision past
/// 2^63, which the next write's would overflow, or a suspect block past
/// the volume's end) is left out, failed, and the volume served from the
/// others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_claiming_what_no_replica_holds_is_left_out() {
    let claims = [
        ("revision", serde_json::json!(u64::MAX)),
        ("suspect", serde_json::json!([3, 64])),
    ];
    for (field, value) in claims {
        let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let sound = replica_server(d1.path(), "v-r1", 64 * BLOCK).await;
        let wrong = replica_server(d2.path(), "v-r2", 64 * BLOCK).await;
        let wrong = claiming_proxy(&wrong, field, value.clone()).await;
        let engine = engine_over(64 * BLOCK, &[sound, wrong], None).await;
        let status = engine.status().await;
        assert_eq!(status[0].mode, ReplicaMode::Rw, "{field}: {status:?}");
        assert_eq!(status[1].mode, ReplicaMode::Err, "{field}: {status:?}");
        let why = status[1].error.clone().unwrap_or_default();
        assert!(why.contains("past any a replica"), "{field}: {why}");
        engine.write(0, &[7u8; 4096], true).await.unwrap();
        assert_eq!(engine.read(0, 4096).await.unwrap(), vec![7u8; 4096]);
    }
}

/// Between the engine and `to`: flips the first byte of each WRITE's
/// data, as a fault on the way would.
async fn corrupting_proxy(to: &ReplicaAddr) -> ReplicaAddr {
    use ballast_node::wire::protocol::Op;
    proxy(to, || {
        (
            Box::new(|req, payload| {
                if req.op == Op::Write && req.len > 0 {
                    payload[0] ^= 0xff;
                }
            }),
            Box::new(|_, _| {}),
        )
    })
    .await
}

/// A block changed on its way to a replica is never served: the engine
/// takes a write's checksums before the bytes leave it and sends them
/// along, so the changed block fails its check at the replica when read,
/// the replica is dropped, and the read is served from another. Both
/// write paths: the awaited one (the block device's) and NBD's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_changed_on_its_way_to_a_replica_is_never_served() {
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let sound = replica_server(d1.path(), "v-r1", 64 * BLOCK).await;
    let hurt = replica_server(d2.path(), "v-r2", 64 * BLOCK).await;
    let hurt = corrupting_proxy(&hurt).await;
    // The hurt one is read first.
    let engine = engine_over(64 * BLOCK, &[sound, hurt], Some("v-r2")).await;

    let awaited: Vec<u8> = (0..2 * BLOCK).map(|i| (i % 253) as u8).collect();
    engine.write(0, &awaited, false).await.unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let nbd: Vec<u8> = (0..2 * BLOCK).map(|i| (i % 241) as u8).collect();
    engine
        .write_then(
            8 * BLOCK,
            bytes::Bytes::from(nbd.clone()),
            false,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        )
        .await;
    rx.await.unwrap().unwrap();

    let got = engine.read(0, 2 * BLOCK as u32).await.unwrap();
    assert!(
        got == awaited,
        "the awaited write's block was served changed"
    );
    let got = engine.read(8 * BLOCK, 2 * BLOCK as u32).await.unwrap();
    assert!(got == nbd, "the NBD write's block was served changed");
    let status = engine.status().await;
    let hurt = status.iter().find(|s| s.name == "v-r2").unwrap();
    assert_eq!(hurt.mode, ReplicaMode::Err, "{status:?}");
}

/// One bad block in a frozen layer of the last replica fails the reads of
/// that block only: every other block of the layer is still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_block_in_a_frozen_layer_of_the_last_replica_fails_only_its_own_reads() {
    let d = tempfile::tempdir().unwrap();
    let a = replica_server(d.path(), "v-r1", 64 * BLOCK).await;
    let engine = engine_over(64 * BLOCK, std::slice::from_ref(&a), None).await;
    let data: Vec<u8> = (0..8 * BLOCK).map(|i| (i % 233) as u8).collect();
    engine.write(0, &data, false).await.unwrap();
    engine.snapshot(Some("s1")).await.unwrap();
    let dir = replica_dir(d.path(), "v-r1");
    flip_block(&dir.join(&chain_of(&dir)[0]), 2 * BLOCK);
    assert!(engine.read(2 * BLOCK, 4096).await.is_err());
    for b in [0u64, 1, 3, 7] {
        let got = engine.read(b * BLOCK, 4096).await;
        assert!(
            got.as_deref().ok() == Some(&data[(b * BLOCK) as usize..((b + 1) * BLOCK) as usize]),
            "block {b}: {got:?}"
        );
    }
}

/// A write of part of a block bad in every replica fails alone (EIO): no
/// replica is dropped, none makes the bad bytes pass, and the rest of the
/// volume is served. Bad in one replica only, that replica refuses the
/// write and is dropped (it lacks it), and the others serve it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_write_into_a_block_bad_everywhere_fails_alone_and_the_block_stays_bad() {
    for lend in [false, true] {
        partial_write_into_a_bad_block(lend).await;
    }
}

/// The test above, with v-r0 reached through its server or lent.
async fn partial_write_into_a_bad_block(lend: bool) {
    let (dirs, addrs, engine) = three_replicas(lend).await;
    let data: Vec<u8> = (0..4 * BLOCK).map(|i| (i % 241) as u8).collect();
    engine.write(0, &data, false).await.unwrap();
    engine.flush().await.unwrap();
    for (i, d) in dirs.iter().enumerate() {
        flip_head_block(&replica_dir(d.path(), &format!("v-r{i}")), 0);
    }
    let e = engine.write(100, &[9u8; 512], false).await.unwrap_err();
    assert!(e.to_string().contains("corrupt"), "lend {lend}: {e}");
    let status = engine.status().await;
    assert!(
        status.iter().all(|s| s.mode == ReplicaMode::Rw),
        "{status:?}"
    );
    assert!(engine.read(0, 4096).await.is_err(), "still bad everywhere");
    assert_eq!(
        engine.read(BLOCK, (3 * BLOCK) as u32).await.unwrap(),
        data[BLOCK as usize..]
    );

    // Block 2 bad in v-r0 alone: v-r0 refuses the write and goes; the
    // others hold it.
    flip_head_block(&replica_dir(dirs[0].path(), "v-r0"), 2 * BLOCK);
    engine
        .write(2 * BLOCK + 10, &[8u8; 20], false)
        .await
        .unwrap();
    let mut want = data[2 * BLOCK as usize..3 * BLOCK as usize].to_vec();
    want[10..30].fill(8);
    assert_eq!(engine.read(2 * BLOCK, 4096).await.unwrap(), want);
    let status = engine.status().await;
    assert_eq!(status[0].mode, ReplicaMode::Err, "lend {lend}: {status:?}");
    for at in &addrs[1..] {
        let c = ReplicaClient::connect(&at.addr, &at.name).await.unwrap();
        assert_eq!(c.read(2 * BLOCK, 4096).await.unwrap().to_vec(), want);
    }
}

/// A block bad in the head of every replica, at a snapshot: no replica
/// holds it sound, so each freezes it as lost, and none is dropped (before,
/// each failed repair dropped a replica until one was left). The block
/// fails its reads, every other block is served from every replica, and
/// written again it is sound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_bad_in_every_replica_at_a_snapshot_is_lost_in_each_and_none_is_dropped() {
    for lend in [false, true] {
        bad_everywhere_at_a_snapshot(lend).await;
    }
}

/// The test above, with v-r0 reached through its server or lent.
async fn bad_everywhere_at_a_snapshot(lend: bool) {
    let (dirs, addrs, engine) = three_replicas(lend).await;
    let data: Vec<u8> = (0..8 * BLOCK).map(|i| (i % 241) as u8).collect();
    engine.write(0, &data, false).await.unwrap();
    engine.flush().await.unwrap();
    for (i, d) in dirs.iter().enumerate() {
        flip_head_block(&replica_dir(d.path(), &format!("v-r{i}")), 3 * BLOCK);
    }
    engine.snapshot(None).await.unwrap();
    let status = engine.status().await;
    assert!(
        status.iter().all(|s| s.mode == ReplicaMode::Rw),
        "lend {lend}: {status:?}"
    );
    assert_eq!(engine.io().lost_blocks, 3, "lend {lend}");
    let failures = engine.io().checksum_failures;
    let e = engine.read(3 * BLOCK, 4096).await.unwrap_err();
    assert!(e.to_string().contains("lost"), "lend {lend}: {e}");
    // Passed over in the first two, failed in the last: no repair tried.
    assert_eq!(engine.io().checksum_failures, failures + 1, "lend {lend}");
    let (below, above) = (3 * BLOCK as usize, 4 * BLOCK as usize);
    for at in &addrs[1..] {
        let c = ReplicaClient::connect(&at.addr, &at.name).await.unwrap();
        let e = c.read(3 * BLOCK, 4096).await.unwrap_err();
        assert!(e.to_string().contains("lost"), "lend {lend}: {e}");
        assert_eq!(c.read(0, below as u32).await.unwrap(), data[..below]);
        let rest = c.read(4 * BLOCK, 4 * BLOCK as u32).await.unwrap();
        assert_eq!(rest, data[above..], "lend {lend}: {}", at.name);
    }
    engine
        .write(3 * BLOCK, &[7u8; BLOCK as usize], false)
        .await
        .unwrap();
    let mut want = data.clone();
    want[below..above].fill(7);
    assert_eq!(engine.read(0, 8 * BLOCK as u32).await.unwrap(), want);
}

/// Three replicas, the last behind a gate that holds its answers back;
/// the engine gives up on a replica after `timeout`.
async fn one_behind_a_gate(
    timeout: std::time::Duration,
) -> (
    Vec<tempfile::TempDir>,
    Vec<ReplicaAddr>,
    Arc<Engine>,
    tokio::sync::watch::Sender<bool>,
) {
    let (dirs, mut addrs) = three_servers(64).await;
    let (open, gate) = tokio::sync::watch::channel(true);
    addrs[2] = gated_proxy(&addrs[2], gate, || {
        (Box::new(|_, _| {}), Box::new(|_, _| {}))
    })
    .await;
    let engine = engine_over(64 * BLOCK, &addrs, Some("v-r0")).await;
    engine.watch_stalls(timeout);
    (dirs, addrs, engine, open)
}

/// A write through NBD's path (`write_then`), waited for at most a minute.
async fn nbd_write(engine: &Arc<Engine>, offset: u64, data: Vec<u8>) -> Result<(), String> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    engine
        .write_then(
            offset,
            bytes::Bytes::from(data),
            false,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        )
        .await;
    match tokio::time::timeout(std::time::Duration::from_secs(60), rx).await {
        Ok(answer) => answer.unwrap().map_err(|e| e.to_string()),
        Err(_) => Err("no answer within a minute".into()),
    }
}

/// A replica that stops answering (its server takes the requests and
/// answers none, as a frozen process or a network that drops packets
/// leaves it) is given up after the replica timeout: the writes waiting
/// for it are acknowledged from the others, both write paths, and every
/// acknowledged write reads back from them. Without it the writes would
/// wait for the frozen replica for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_stops_answering_is_given_up_and_the_writes_go_on() {
    let (_dirs, addrs, engine, open) = one_behind_a_gate(std::time::Duration::from_secs(1)).await;
    let before: Vec<u8> = (0..4 * BLOCK).map(|i| (i % 251) as u8).collect();
    engine.write(0, &before, true).await.unwrap();

    open.send(false).unwrap();
    let awaited: Vec<u8> = (0..4 * BLOCK).map(|i| (i % 241) as u8).collect();
    let nbd: Vec<u8> = (0..4 * BLOCK).map(|i| (i % 239) as u8).collect();
    let (a, b) = tokio::join!(
        tokio::time::timeout(
            std::time::Duration::from_secs(60),
            engine.write(8 * BLOCK, &awaited, false)
        ),
        nbd_write(&engine, 16 * BLOCK, nbd.clone()),
    );
    a.expect("the awaited write waited a minute").unwrap();
    b.unwrap();
    engine.flush().await.unwrap();

    let status = engine.status().await;
    let gone = status.iter().find(|s| s.name == "v-r2").unwrap();
    assert_eq!(gone.mode, ReplicaMode::Err, "{status:?}");
    let why = gone.error.clone().unwrap_or_default();
    assert!(why.contains("no answer for"), "{why}");
    for name in ["v-r0", "v-r1"] {
        assert_eq!(mode_of(&engine, name).await, ReplicaMode::Rw, "{status:?}");
    }
    for (offset, data) in [(0, &before), (8 * BLOCK, &awaited), (16 * BLOCK, &nbd)] {
        let len = data.len() as u32;
        assert!(
            engine.read(offset, len).await.unwrap() == *data,
            "at {offset}"
        );
        for a in &addrs[..2] {
            assert!(
                read_given_back(a, offset, len).await == *data,
                "{} at {offset}",
                a.name
            );
        }
    }
}

/// Waits three replica timeouts and more (1 s each: long past the point
/// where one replica of two would have been given up), then checks that
/// the I/O under way (`task`) still waits and that every replica of
/// `addrs` is still rw.
async fn still_waiting<T>(
    engine: &Engine,
    addrs: &[ReplicaAddr],
    task: &tokio::task::JoinHandle<T>,
    what: &str,
) {
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    assert!(
        !task.is_finished(),
        "the {what} was answered with no replica answering"
    );
    for a in addrs {
        assert_eq!(mode_of(engine, &a.name).await, ReplicaMode::Rw, "{what}");
    }
}

/// When every replica stops answering, none is given up: a read waits
/// (the replica it is not asked of proves nothing by its silence: it is
/// asked for its INFO, and answers none), so do the writes (dropping them
/// all would fail the volume), and once the replicas answer again the read
/// and the writes are answered and every replica is still rw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_every_replica_stops_answering_none_is_given_up_and_the_io_waits() {
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let (open, gate) = tokio::sync::watch::channel(true);
    let mut addrs = Vec::new();
    for (i, d) in dirs.iter().enumerate() {
        let a = replica_server(d.path(), &format!("v-r{i}"), 64 * BLOCK).await;
        let gated = gated_proxy(&a, gate.clone(), || {
            (Box::new(|_, _| {}), Box::new(|_, _| {}))
        })
        .await;
        addrs.push(gated);
    }
    let engine = engine_over(64 * BLOCK, &addrs, None).await;
    engine.watch_stalls(std::time::Duration::from_secs(1));
    open.send(false).unwrap();
    // A read asks one replica only.
    let read = {
        let engine = engine.clone();
        tokio::spawn(async move { engine.read(0, 4096).await })
    };
    still_waiting(&engine, &addrs, &read, "read").await;
    let data: Vec<u8> = (0..4 * BLOCK).map(|i| (i % 233) as u8).collect();
    let write = {
        let (engine, data) = (engine.clone(), data.clone());
        tokio::spawn(async move { nbd_write(&engine, 0, data).await })
    };
    still_waiting(&engine, &addrs, &write, "write").await;
    open.send(true).unwrap();
    write.await.unwrap().unwrap();
    // The read and the write over it were in flight together: the read
    // holds the block as it was before the write or as the write made it
    // (a replica's server may apply the write first), nothing else.
    let got = read.await.unwrap().unwrap();
    assert!(
        got == vec![0u8; 4096] || got == data[..4096],
        "the read holds neither the block before the write nor after it"
    );
    for a in &addrs {
        assert_eq!(mode_of(&engine, &a.name).await, ReplicaMode::Rw);
        assert!(
            read_given_back(a, 0, data.len() as u32).await == data,
            "{}",
            a.name
        );
    }
}

/// A replica that stops answering on an idle volume (no I/O waits on it)
/// is given up after the replica timeout all the same: the engine pings a
/// replica with nothing asked of it at each look. Before, it stayed rw
/// for as long as its node stayed frozen, until a write came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_volumes_replica_that_stops_answering_is_given_up() {
    let (_dirs, addrs, engine, open) = one_behind_a_gate(std::time::Duration::from_secs(1)).await;
    let data: Vec<u8> = (0..8 * BLOCK).map(|i| (i % 239) as u8).collect();
    engine.write(0, &data, true).await.unwrap();
    open.send(false).unwrap();
    wait_mode(&engine, "v-r2", ReplicaMode::Err, "v-r2 given up").await;
    let why = error_of(&engine, "v-r2").await;
    assert!(
        why.as_deref().is_some_and(|w| w.contains("no answer for")),
        "{why:?}"
    );
    all_read_back(&engine, &addrs[..2], &[(0, &data)]).await;
}

/// A replica server from before PING (its OPEN reply does not say it
/// answers one; it would close the connection on one) is sent none: an
/// idle engine leaves it be, and it stays rw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_does_not_say_it_answers_pings_is_sent_none() {
    use ballast_node::wire::protocol::Op;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let (_dirs, mut addrs) = three_servers(64).await;
    let pings = Arc::new(AtomicUsize::new(0));
    let seen = pings.clone();
    addrs[2] = proxy(&addrs[2], move || {
        let opens = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
        let (asked, seen) = (opens.clone(), seen.clone());
        (
            Box::new(move |req, _| match req.op {
                Op::Open => {
                    asked.lock().unwrap().insert(req.id);
                }
                Op::Ping => {
                    seen.fetch_add(1, Ordering::SeqCst);
                }
                _ => {}
            }),
            Box::new(move |resp, body| {
                if opens.lock().unwrap().remove(&resp.id) {
                    let mut said: serde_json::Value = serde_json::from_slice(body).unwrap();
                    said.as_object_mut().unwrap().remove("ping");
                    *body = serde_json::to_vec(&said).unwrap();
                }
            }),
        )
    })
    .await;
    let engine = engine_over(64 * BLOCK, &addrs, Some("v-r0")).await;
    engine.watch_stalls(std::time::Duration::from_secs(1));
    // A dozen looks of the watch, which pings the two others.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_eq!(pings.load(Ordering::SeqCst), 0);
    assert_eq!(mode_of(&engine, "v-r2").await, ReplicaMode::Rw);
    let data: Vec<u8> = (0..4 * BLOCK).map(|i| (i % 233) as u8).collect();
    engine.write(0, &data, true).await.unwrap();
    all_read_back(&engine, &addrs, &[(0, &data)]).await;
}

/// A rebuild asked for while a rw replica's node is frozen, on an idle
/// volume (no I/O of its own to show the silence): the engine asks every
/// rw replica for its layers to choose the source, and the frozen one
/// is given up once it leaves that unanswered for the replica timeout
/// while another answers; the rebuild copies from another and completes.
/// Before, the choice waited for as long as the node stayed frozen,
/// holding the volume's one rebuild at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_asked_while_a_replica_stopped_answering_gives_it_up_and_completes() {
    let limit = std::time::Duration::from_secs(60);
    let (_dirs, addrs, engine, open) = one_behind_a_gate(std::time::Duration::from_secs(1)).await;
    let data: Vec<u8> = (0..8 * BLOCK).map(|i| (i % 241) as u8).collect();
    engine.write(0, &data, true).await.unwrap();
    engine.remove_replica("v-r1").await.unwrap();
    open.send(false).unwrap();

    tokio::time::timeout(limit, engine.add_replica(addrs[1].clone(), None, 0))
        .await
        .expect("the rebuild waited a minute")
        .unwrap();
    wait_mode(&engine, "v-r1", ReplicaMode::Rw, "v-r1 rebuilt").await;
    assert_eq!(mode_of(&engine, "v-r2").await, ReplicaMode::Err);
    all_read_back(&engine, &addrs[..2], &[(0, &data)]).await;
}

/// A snapshot (and a growth) pauses the volume's I/O while each replica
/// answers, with no timeout on the answer (a freeze reads the whole head).
/// A replica that stopped answering on an idle volume, with no I/O of its
/// own waiting to show it, is given up before the pause: the snapshot is
/// taken on the others and the volume goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_stopped_answering_is_given_up_before_a_snapshot_pauses_the_io() {
    let limit = std::time::Duration::from_secs(60);
    let (_dirs, addrs, engine, open) = one_behind_a_gate(std::time::Duration::from_secs(1)).await;
    let before: Vec<u8> = (0..4 * BLOCK).map(|i| (i % 251) as u8).collect();
    engine.write(0, &before, true).await.unwrap();
    open.send(false).unwrap();

    let frozen = tokio::time::timeout(limit, engine.snapshot(Some("s1")))
        .await
        .expect("the snapshot waited a minute")
        .unwrap();
    assert_eq!(frozen.len(), 2, "{frozen:?}");
    assert_eq!(mode_of(&engine, "v-r2").await, ReplicaMode::Err);
    tokio::time::timeout(limit, engine.grow(128 * BLOCK))
        .await
        .expect("the growth waited a minute")
        .unwrap();
    let after: Vec<u8> = (0..4 * BLOCK).map(|i| (i % 239) as u8).collect();
    nbd_write(&engine, 100 * BLOCK, after.clone())
        .await
        .unwrap();
    assert!(engine.read(0, 4 * BLOCK as u32).await.unwrap() == before);
    assert!(engine.read(100 * BLOCK, 4 * BLOCK as u32).await.unwrap() == after);
    for a in &addrs[..2] {
        assert!(
            read_given_back(a, 0, 4 * BLOCK as u32).await == before,
            "{}",
            a.name
        );
    }
}

/// Waits (a minute at most: `what` otherwise) until replica `name` of
/// `engine` is in `mode`.
async fn wait_mode(engine: &Engine, name: &str, mode: ReplicaMode, what: &str) {
    tokio::time::timeout(std::time::Duration::from_secs(60), async {
        while mode_of(engine, name).await != mode {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await
    .expect(what);
}

/// Three replica servers of `blocks` blocks each, v-r0 to v-r2.
async fn three_servers(blocks: u64) -> (Vec<tempfile::TempDir>, Vec<ReplicaAddr>) {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut addrs = Vec::new();
    for (i, d) in dirs.iter().enumerate() {
        addrs.push(replica_server(d.path(), &format!("v-r{i}"), blocks * BLOCK).await);
    }
    (dirs, addrs)
}

/// A rebuild's target that stops answering during its join (its node
/// frozen right after it answered its INFO) is given up after the replica
/// timeout: the join holds the volume's I/O paused, and before 2026-12-06
/// a write waited for as long as the target's node stayed frozen (soak
/// seed 20261265, freezes 3). The rebuild fails naming the timeout, the
/// writes go on, and once the target answers again it is rebuilt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_target_that_stops_answering_its_join_is_given_up_and_the_io_goes_on() {
    rebuild_target_frozen_at(ballast_node::wire::protocol::Op::Join).await;
}

/// The same, its node frozen right after its dial: its INFO, asked before
/// the pause, held the volume's one rebuild at a time as long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_target_that_stops_answering_its_info_is_given_up_and_the_io_goes_on() {
    rebuild_target_frozen_at(ballast_node::wire::protocol::Op::Info).await;
}

async fn rebuild_target_frozen_at(op: ballast_node::wire::protocol::Op) {
    let limit = std::time::Duration::from_secs(60);
    let (_dirs, addrs) = three_servers(64).await;
    let (target, open) = frozen_at_first(&addrs[2], op).await;
    let engine = engine_over(64 * BLOCK, &addrs[..2], Some("v-r0")).await;
    engine.watch_stalls(std::time::Duration::from_secs(1));
    let before: Vec<u8> = (0..4 * BLOCK).map(|i| (i % 251) as u8).collect();
    engine.write(0, &before, true).await.unwrap();

    let adding = {
        let (engine, target) = (engine.clone(), target.clone());
        tokio::spawn(async move { engine.add_replica(target, None, 0).await })
    };
    let mut frozen = open.subscribe();
    frozen.wait_for(|open| !*open).await.unwrap();
    let during: Vec<u8> = (0..4 * BLOCK).map(|i| (i % 241) as u8).collect();
    tokio::time::timeout(limit, nbd_write(&engine, 8 * BLOCK, during.clone()))
        .await
        .expect("a write waited a minute behind the frozen target's join")
        .unwrap();
    let e = tokio::time::timeout(limit, adding)
        .await
        .expect("the rebuild waited a minute for its frozen target")
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(e.contains("engine-replica-timeout"), "{e}");
    for name in ["v-r0", "v-r1"] {
        assert_eq!(mode_of(&engine, name).await, ReplicaMode::Rw, "{name}");
    }

    open.send_replace(true);
    engine.add_replica(target, None, 0).await.unwrap();
    let what = "the target was not rebuilt within a minute";
    wait_mode(&engine, "v-r2", ReplicaMode::Rw, what).await;
    all_read_back(&engine, &addrs, &[(0, &before), (8 * BLOCK, &during)]).await;
}

/// Each of `written` (offset, data) reads back through `engine` and from
/// each replica of `addrs`.
async fn all_read_back(engine: &Engine, addrs: &[ReplicaAddr], written: &[(u64, &Vec<u8>)]) {
    for &(offset, data) in written {
        let len = data.len() as u32;
        assert!(engine.read(offset, len).await.unwrap() == *data);
        for a in addrs {
            assert!(
                read_given_back(a, offset, len).await == *data,
                "{} at {offset}",
                a.name
            );
        }
    }
}

/// A rebuild whose source stops answering mid-copy (its node frozen at the
/// fill's first read) ends once the engine gives the source up: the target
/// fails, its node calls the fill off, and the next rebuild copies from
/// the other replica. Before 2026-12-06 the fill waited for the frozen
/// source, and every later rebuild of the volume was refused as busy, for
/// as long as the source's node stayed frozen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_whose_source_stops_answering_ends_and_the_next_copies_from_another() {
    use ballast_node::wire::protocol::Op;
    let limit = std::time::Duration::from_secs(60);
    let (_dirs, mut addrs) = three_servers(1024).await;
    // v-r0, first by name, is the source.
    let (source, open) = frozen_at_first(&addrs[0], Op::LayerRead).await;
    addrs[0] = source;
    let engine = engine_over(1024 * BLOCK, &addrs[..2], None).await;
    engine.watch_stalls(std::time::Duration::from_secs(1));
    let before: Vec<u8> = (0..256 * BLOCK).map(|i| (i % 251) as u8).collect();
    engine.write(0, &before, true).await.unwrap();

    engine.add_replica(addrs[2].clone(), None, 0).await.unwrap();
    let mut frozen = open.subscribe();
    tokio::time::timeout(limit, frozen.wait_for(|open| !*open))
        .await
        .expect("the fill never read its source")
        .unwrap();
    // A write the frozen source leaves unanswered: it is given up.
    let during: Vec<u8> = (0..4 * BLOCK).map(|i| (i % 241) as u8).collect();
    tokio::time::timeout(limit, nbd_write(&engine, 512 * BLOCK, during.clone()))
        .await
        .expect("a write waited a minute for the frozen source")
        .unwrap();
    assert_eq!(mode_of(&engine, "v-r0").await, ReplicaMode::Err);
    let what = "the rebuild from the frozen source never ended";
    wait_mode(&engine, "v-r2", ReplicaMode::Err, what).await;
    let why = error_of(&engine, "v-r2").await;
    assert!(
        why.as_deref()
            .is_some_and(|w| w.contains("its rebuild's source v-r0 was given up")),
        "{why:?}"
    );
    // The next rebuild copies from v-r1 (the fill on v-r2's node was called
    // off, so it may join again).
    tokio::time::timeout(limit, async {
        loop {
            match engine.add_replica(addrs[2].clone(), None, 0).await {
                Ok(()) => return,
                Err(e) => {
                    let e = e.to_string();
                    assert!(
                        e.contains("still writing") || e.contains("already running"),
                        "{e}"
                    );
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
    })
    .await
    .expect("no rebuild could start again");
    let what = "the second rebuild did not end within a minute";
    wait_mode(&engine, "v-r2", ReplicaMode::Rw, what).await;
    let rebuilt = engine.status().await;
    let r2 = rebuilt.iter().find(|s| s.name == "v-r2").unwrap();
    assert_eq!(r2.rebuild.as_ref().unwrap().source, "v-r1", "{rebuilt:?}");
    open.send_replace(true);
    all_read_back(
        &engine,
        &addrs[1..],
        &[(0, &before), (512 * BLOCK, &during)],
    )
    .await;
}

/// A growth that no replica can take changes none: every replica stays
/// rw and serves. Before 2026-12-05 the engine failed each replica that
/// refused it but the last one asked, so that the volume lost all its
/// other replicas to a growth that did not happen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_growth_no_replica_can_take_fails_and_drops_none() {
    let (_dirs, _addrs, engine) = three_replicas(false).await;
    let data: Vec<u8> = (0..4 * BLOCK).map(|i| (i % 251) as u8).collect();
    engine.write(0, &data, true).await.unwrap();
    let past = ballast_node::replica::MAX_SIZE + BLOCK;
    let e = engine.grow(past).await.unwrap_err().to_string();
    assert!(e.contains("no replica could grow"), "{e}");
    for r in ["v-r0", "v-r1", "v-r2"] {
        assert_eq!(mode_of(&engine, r).await, ReplicaMode::Rw, "{r}");
    }
    assert!(engine.read(0, 4 * BLOCK as u32).await.unwrap() == data);
}

/// A merge of the engine's own replica that meets a block gone bad ends
/// with the block marked (see `replica::merge`) and fails as corrupt, a
/// kind of its own on the control socket, which the node agent answers
/// DATA_LOSS: the controller then fails the replica, as after a scrub.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merge_of_the_engines_replica_that_meets_a_bad_block_fails_as_corrupt() {
    use ballast_node::engine::EngineError;
    use ballast_node::frontend::control::{ControlError, FailureKind};
    let d = tempfile::tempdir().unwrap();
    let (_, engine) = lent_alone(d.path(), 64 * BLOCK).await;
    engine.write(0, &[0x71; 8 * 4096], false).await.unwrap();
    engine.snapshot(None).await.unwrap();
    engine
        .write(16 * BLOCK, &[0x72; 4096], false)
        .await
        .unwrap();
    engine.snapshot(None).await.unwrap();
    let dir = replica_dir(d.path(), "v-r0");
    flip_block(&dir.join(&chain_of(&dir)[0]), 2 * BLOCK);
    let e = engine.merge("v-r0", vec![], 64 << 20).await.unwrap_err();
    assert!(matches!(e, EngineError::FoundCorrupt { .. }), "{e}");
    assert!(e.to_string().contains("block 2 "), "{e}");
    assert_eq!(ControlError::from(e).kind, FailureKind::Corrupt);
    // The merge ended: the replica holds two layers, and the block fails.
    assert_eq!(chain_of(&dir).len(), 2, "{:?}", chain_of(&dir));
    assert!(engine.read(2 * BLOCK, 4096).await.is_err());
    let rest = engine.read(3 * BLOCK, 5 * 4096).await.unwrap();
    assert!(rest.iter().all(|&b| b == 0x71));
}

/// A snapshot has each replica read its head ahead, with the I/O
/// running, and the freeze, with it paused, read only what was written
/// since (`replica::warm`; the replicas' INFO says what their last freeze
/// took).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_reads_each_head_ahead_and_its_freeze_reads_only_what_was_written_since() {
    const MIB: u64 = 1 << 20;
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let addrs = [
        replica_server(d1.path(), "v-r1", 8 * MIB).await,
        replica_server(d2.path(), "v-r2", 8 * MIB).await,
    ];
    let engine = engine_over(8 * MIB, &addrs, None).await;
    let data: Vec<u8> = (0..4 * MIB).map(|i| (i % 251) as u8).collect();
    engine.write(0, &data, false).await.unwrap();
    engine.flush().await.unwrap();
    Arc::clone(&engine).snapshot(None).await.unwrap();
    for (a, d) in addrs.iter().zip([&d1, &d2]) {
        let c = ReplicaClient::connect(&a.addr, &a.name).await.unwrap();
        let info = c.info().await.unwrap();
        assert_eq!(info["last_freeze"]["read_ahead"], 4, "{info}");
        assert_eq!(info["last_freeze"]["read"], 0, "{info}");
        // The layer frozen checks whole against the checksum recorded.
        let view = Replica::open_view(&replica_dir(d.path(), &a.name)).unwrap();
        view.verify().unwrap();
    }
    assert_eq!(
        &engine.read(0, 4 * MIB as u32).await.unwrap()[..],
        &data[..]
    );
}
