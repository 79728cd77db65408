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

/// What a proxy does to a request (its header decoded, its payload) before
/// passing it on.
pub type EditRequest = Box<dyn FnMut(&ballast_node::wire::protocol::Request, &mut Vec<u8>) + Send>;
/// What a proxy does to an answer (its header decoded, its body) before
/// passing it on; a body it changes takes its new length into the header.
pub type EditAnswer =
    Box<dyn FnMut(&mut ballast_node::wire::protocol::Response, &mut Vec<u8>) + Send>;

/// Between the engine and `to`: every request and every answer, a frame
/// at a time, through the pair of edits `edits` makes for each connection.
pub async fn proxy(
    to: &ReplicaAddr,
    edits: impl Fn() -> (EditRequest, EditAnswer) + Send + 'static,
) -> ReplicaAddr {
    let (_open, gate) = tokio::sync::watch::channel(true);
    gated_proxy(to, gate, edits).await
}

/// `proxy`, whose answers wait while `gate` holds false: a replica whose
/// server takes requests and answers none, as a frozen process or a
/// network that drops packets leaves it.
pub async fn gated_proxy(
    to: &ReplicaAddr,
    gate: tokio::sync::watch::Receiver<bool>,
    edits: impl Fn() -> (EditRequest, EditAnswer) + Send + 'static,
) -> ReplicaAddr {
    use ballast_node::wire::protocol::{REQUEST_HEADER, RESPONSE_HEADER, Request, Response};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let upstream = to.addr.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = tokio::net::TcpStream::connect(&upstream).await.unwrap();
            let (mut cr, mut cw) = client.into_split();
            let (mut sr, mut sw) = server.into_split();
            let (mut edit_request, mut edit_answer) = edits();
            let mut gate = gate.clone();
            tokio::spawn(async move {
                let mut head = [0u8; REQUEST_HEADER];
                while cr.read_exact(&mut head).await.is_ok() {
                    let req = Request::decode(&head).unwrap();
                    let mut payload = vec![0u8; req.payload_len()];
                    if cr.read_exact(&mut payload).await.is_err() {
                        return;
                    }
                    edit_request(&req, &mut payload);
                    if sw.write_all(&head).await.is_err() || sw.write_all(&payload).await.is_err() {
                        return;
                    }
                }
            });
            tokio::spawn(async move {
                let mut head = [0u8; RESPONSE_HEADER];
                while sr.read_exact(&mut head).await.is_ok() {
                    let mut resp = Response::decode(&head).unwrap();
                    let mut body = vec![0u8; resp.len as usize];
                    if sr.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    edit_answer(&mut resp, &mut body);
                    resp.len = body.len() as u32;
                    if gate.wait_for(|open| *open).await.is_err() {
                        return;
                    }
                    if cw.write_all(&resp.encode()).await.is_err()
                        || cw.write_all(&body).await.is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    ReplicaAddr {
        name: to.name.clone(),
        addr,
    }
}

/// `to` behind a proxy whose answers stop at the first `op` request (as
/// if its node froze right then), and the gate's sender, to open it again.
pub async fn frozen_at_first(
    to: &ReplicaAddr,
    op: ballast_node::wire::protocol::Op,
) -> (ReplicaAddr, Arc<tokio::sync::watch::Sender<bool>>) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let (open, gate) = tokio::sync::watch::channel(true);
    let open = Arc::new(open);
    let first = Arc::new(AtomicBool::new(true));
    let freeze = open.clone();
    let proxied = gated_proxy(to, gate, move || {
        let (freeze, first) = (freeze.clone(), first.clone());
        (
            Box::new(move |req, _| {
                if req.op == op && first.swap(false, Ordering::SeqCst) {
                    freeze.send_replace(false);
                }
            }),
            Box::new(|_, _| {}),
        )
    })
    .await;
    (proxied, open)
}
