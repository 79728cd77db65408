//! The engine over real replica servers on loopback.

use std::sync::Arc;

use ballast::model::ReplicaMode;
use ballast_node::engine::{Engine, ReplicaAddr};
use ballast_node::replica::client::ReplicaClient;
use ballast_node::replica::server::{ReplicaServer, replica_dir};
use ballast_node::replica::{BLOCK, Replica};
use tokio::net::TcpListener;

async fn replica_server(disk: &std::path::Path, name: &str, size: u64) -> ReplicaAddr {
    Replica::create(&replica_dir(disk, name), size).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(ReplicaServer::new(vec![disk.to_path_buf()]).serve(listener));
    ReplicaAddr {
        name: name.into(),
        addr,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_unclean_stop_only_the_replicas_with_the_highest_revision_are_rw() {
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
    let engine = Engine::start("v", 64 * BLOCK, &[a.clone(), b.clone()], None)
        .await
        .unwrap();
    let status = engine.status().await;
    assert_eq!(status[0].mode, ReplicaMode::Rw);
    assert_eq!(status[1].mode, ReplicaMode::Err);
    assert!(
        status[1].error.as_deref().unwrap().contains("behind"),
        "{status:?}"
    );
    // Reads come from the up-to-date replica.
    assert_eq!(engine.read(0, 512).await.unwrap(), vec![2u8; 512]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_overlapping_writes_leave_every_replica_identical() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut addrs = Vec::new();
    for (i, d) in dirs.iter().enumerate() {
        addrs.push(replica_server(d.path(), &format!("v-r{i}"), 64 * BLOCK).await);
    }
    let engine = Engine::start("v", 64 * BLOCK, &addrs, Some("v-r0".into()))
        .await
        .unwrap();
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
    engine.flush().await.unwrap();
    let mut images = Vec::new();
    for a in &addrs {
        let c = ReplicaClient::connect(&a.addr, &a.name).await.unwrap();
        images.push(c.read(0, 64 * BLOCK as u32).await.unwrap());
    }
    assert!(
        images[0] == images[1] && images[1] == images[2],
        "replicas diverged"
    );
    let engine2 = Arc::clone(&engine);
    let names = engine2.snapshot().await.unwrap();
    assert_eq!(names.len(), 3, "one snapshot per replica at the same point");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_reads_of_the_local_replica_match_a_model_through_writes_trims_and_snapshots() {
    let d = tempfile::tempdir().unwrap();
    let size = 256 * BLOCK;
    let a = replica_server(d.path(), "v-r0", size).await;
    let engine = Engine::start("v", size, std::slice::from_ref(&a), Some("v-r0".into()))
        .await
        .unwrap();
    engine.set_local_dir(replica_dir(d.path(), "v-r0"));
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
                engine.snapshot().await.unwrap();
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
        let served = through_server.read(ro, rl).await.unwrap();
        assert!(
            served == want,
            "served read {ro}+{rl} differs at step {step}"
        );
    }
    assert!(
        engine.read(0, size as u32).await.unwrap() == model,
        "whole volume differs"
    );
    // Every read went straight to the files (none fell back to the server).
    assert_eq!(engine.direct_reads(), 401);
}
