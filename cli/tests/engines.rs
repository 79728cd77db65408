//! The node plugin's table of engines (`ballast_node::engines::Engines`)
//! with real `ballast engine` processes: what a start that waits holds up.

mod common;

use std::sync::Arc;

use ballast::proto::agent::v1::StartEngineRequest;
use ballast_node::engines::{Engines, RecordAt, Tuning};
use common::BALLAST;

/// A start whose engine waits for its replica's answer (a server that
/// accepted the connection and says nothing: a node frozen, say) holds up
/// neither the list of the node's engines, which its heartbeats send,
/// nor a change of another volume's engine: both answer while the start
/// waits, and the list does not show the volume being started. When the
/// replica's server fails, the start ends and says why.
#[test]
fn a_start_that_waits_for_its_replica_holds_up_no_heartbeat_and_no_other_volume() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = silent.local_addr().unwrap();
        let engines = Arc::new(Engines::new(
            dir.path(),
            BALLAST.into(),
            Vec::new(),
            Tuning {
                writeback_every: 0,
                workers: 1,
            },
            RecordAt {
                controller: "http://127.0.0.1:1".into(),
                node_id: "node-1".into(),
                token_file: None,
                tls_dir: None,
            },
            None,
        ));
        let spec = StartEngineRequest {
            volume: "a".into(),
            size: 1 << 20,
            replicas: vec![format!("a-r0@{addr}")],
            generation: 1,
            current: vec!["a-r0".into()],
            epoch: 1,
            ..Default::default()
        };
        let mut start = tokio::spawn({
            let engines = engines.clone();
            async move { engines.start(spec).await }
        });
        // The engine dialled its replica, and waits for its answer.
        let (conn, _) = silent.accept().await.unwrap();
        tokio::select! {
            biased;
            listed = engines.list() => {
                assert!(listed.iter().all(|e| e.volume != "a"), "{listed:?}");
            }
            ended = &mut start => panic!("the list waited for the start: {ended:?}"),
        }
        tokio::select! {
            biased;
            stopped = engines.stop("b") => assert!(!stopped.unwrap(), "no engine of b ran"),
            ended = &mut start => panic!("another volume's stop waited for the start: {ended:?}"),
        }
        // Both answered while the engine still waited: its connection to
        // the replica is open (what it sent read, no end of it).
        let mut sent = vec![0u8; 1 << 16];
        loop {
            match conn.try_read(&mut sent) {
                Ok(0) => panic!("the engine gave up on its replica before they answered"),
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        // The replica's server goes: the engine has no replica to serve
        // from, and the start says so.
        drop((conn, silent));
        let e = start.await.unwrap().unwrap_err().to_string();
        assert!(e.contains("the engine of a exited"), "{e}");
        assert!(engines.list().await.is_empty());
    });
}
