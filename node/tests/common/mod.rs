//! What the engine and rebuild tests share.

use std::sync::Arc;

use ballast_node::engine::{Engine, ReplicaAddr, ReplicaSet};
use ballast_node::replica::{Replica, replica_dir};
use ballast_node::server::ReplicaServer;

/// An engine of volume "v" over `replicas` that keeps no record of its
/// replica set (`local`: the replica on its node, lent to it).
pub async fn engine_over(size: u64, replicas: &[ReplicaAddr], local: Option<&str>) -> Arc<Engine> {
    Engine::start(
        "v",
        size,
        replicas,
        local.map(str::to_string),
        ReplicaSet::default(),
        None,
        Default::default(),
    )
    .await
    .unwrap()
}

/// The layers of the replica in `dir`, oldest first, as its `meta.json`
/// names them (read behind its server's back).
pub fn chain_of(dir: &std::path::Path) -> Vec<String> {
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("meta.json")).unwrap()).unwrap();
    meta["chain"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap().to_string())
        .collect()
}

/// The head layer file of the replica in `dir`.
pub fn head_file(dir: &std::path::Path) -> std::path::PathBuf {
    dir.join(chain_of(dir).last().unwrap())
}

/// A replica server over `disk`, on loopback, holding a new replica
/// `name` of `size` bytes.
pub async fn replica_server(disk: &std::path::Path, name: &str, size: u64) -> ReplicaAddr {
    Replica::create(&replica_dir(disk, name), size).unwrap();
    serve(disk, name).await
}

/// A replica server over `disk`, on loopback, for the replica `name`
/// already there.
pub async fn serve(disk: &std::path::Path, name: &str) -> ReplicaAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(ReplicaServer::new(vec![disk.to_path_buf()]).serve(listener));
    ReplicaAddr {
        name: name.into(),
        addr,
    }
}

/// Flips every byte of the 4 KiB block at `offset` of layer file `file`.
pub fn flip_block(file: &std::path::Path, offset: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)
        .unwrap();
    let mut b = vec![0u8; 4096];
    f.read_exact_at(&mut b, offset).unwrap();
    b.iter_mut().for_each(|x| *x = !*x);
    f.write_all_at(&b, offset).unwrap();
}

/// A replica server in a runtime of its own, standing in for a node
/// process: dropping it ends every connection, as a restart of the node
/// plugin does.
pub struct NodeProcess {
    rt: Option<tokio::runtime::Runtime>,
    pub server: Arc<ReplicaServer>,
    pub addr: String,
}

impl NodeProcess {
    pub async fn start(disk: &std::path::Path, addr: &str) -> NodeProcess {
        let mut bound = None;
        for _ in 0..100 {
            match std::net::TcpListener::bind(addr) {
                Ok(l) => {
                    bound = Some(l);
                    break;
                }
                // The last one's listener may not be closed yet.
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
            }
        }
        let listener = bound.expect("the address is free again");
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let server = ReplicaServer::new(vec![disk.to_path_buf()]);
        let s = server.clone();
        rt.spawn(async move {
            s.serve(tokio::net::TcpListener::from_std(listener).unwrap())
                .await
        });
        NodeProcess {
            rt: Some(rt),
            server,
            addr,
        }
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}
