//! The replica server and client over real TCP on loopback.

#[allow(dead_code)] // shared with the engine tests; this one flips a block
mod common;

use std::sync::Arc;

use ballast_node::replica::replica_dir;
use ballast_node::replica::{BLOCK, Replica};
use ballast_node::server::ReplicaServer;
use ballast_node::wire::client::{ClientError, ReplicaClient};
use ballast_node::wire::protocol::{Op, RESPONSE_HEADER, Request, Response, status};
use ballast_node::wire::tls::WireTls;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

async fn serve(disk: &std::path::Path) -> (String, Arc<ReplicaServer>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = ReplicaServer::new(vec![disk.to_path_buf()]);
    tokio::spawn(server.clone().serve(listener));
    (addr, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_writes_and_reads_round_trip() {
    let disk = tempfile::tempdir().unwrap();
    Replica::create(&replica_dir(disk.path(), "v1-r1"), 1024 * BLOCK).unwrap();
    let (addr, _s) = serve(disk.path()).await;
    let c = Arc::new(ReplicaClient::connect(&addr, "v1-r1").await.unwrap());
    // 64 writes in flight at once, each its own block and pattern.
    let writes: Vec<_> = (0..64u64)
        .map(|i| {
            let c = c.clone();
            tokio::spawn(async move {
                c.write(i * BLOCK, &vec![i as u8; BLOCK as usize], i + 1, false)
                    .await
            })
        })
        .collect();
    for w in writes {
        w.await.unwrap().unwrap();
    }
    c.flush().await.unwrap();
    let reads: Vec<_> = (0..64u64)
        .map(|i| {
            let c = c.clone();
            tokio::spawn(async move { (i, c.read(i * BLOCK, BLOCK as u32).await) })
        })
        .collect();
    for r in reads {
        let (i, data) = r.await.unwrap();
        assert!(data.unwrap().iter().all(|&b| b == i as u8), "block {i}");
    }
    assert_eq!(c.info().await.unwrap()["revision"], 64);
    let frozen = c.snapshot(None).await.unwrap();
    let layers = c.layers().await.unwrap();
    assert_eq!(layers[0].name, frozen);
    assert_eq!(layers[0].allocated, 64 * BLOCK);
    assert!(layers[0].checksum.is_some() && layers[1].checksum.is_none());
    c.trim(0, BLOCK as u32, 65).await.unwrap();
    assert!(c.read(0, 512).await.unwrap().iter().all(|&b| b == 0));
}

#[tokio::test]
async fn errors_come_back_as_replies_and_the_connection_lives_on() {
    let disk = tempfile::tempdir().unwrap();
    Replica::create(&replica_dir(disk.path(), "v1-r1"), 16 * BLOCK).unwrap();
    let (addr, _s) = serve(disk.path()).await;
    let e = ReplicaClient::connect(&addr, "nope").await.err().unwrap();
    assert!(
        matches!(
            e,
            ClientError::Failed {
                status: status::NOT_FOUND,
                ..
            }
        ),
        "{e}"
    );
    let e = ReplicaClient::connect(&addr, "../etc").await.err().unwrap();
    assert!(e.to_string().contains("not a replica name"), "{e}");
    let c = ReplicaClient::connect(&addr, "v1-r1").await.unwrap();
    let e = c.read(15 * BLOCK, 2 * BLOCK as u32).await.unwrap_err();
    assert!(
        matches!(
            e,
            ClientError::Failed {
                status: status::INVALID,
                ..
            }
        ),
        "{e}"
    );
    c.write(0, b"still works", 1, true).await.unwrap();
    assert_eq!(&c.read(0, 11).await.unwrap()[..], b"still works");
}

async fn raw(addr: &str, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), s.read_to_end(&mut out)).await;
    out
}

fn response(bytes: &[u8]) -> Response {
    let head: [u8; RESPONSE_HEADER] = bytes[..RESPONSE_HEADER].try_into().unwrap();
    Response::decode(&head).unwrap()
}

#[tokio::test]
async fn bad_frames_get_an_error_reply_or_a_closed_connection_and_the_server_stays_up() {
    let disk = tempfile::tempdir().unwrap();
    Replica::create(&replica_dir(disk.path(), "v1-r1"), 16 * BLOCK).unwrap();
    let (addr, _s) = serve(disk.path()).await;

    // Garbage: closed without a reply.
    assert!(raw(&addr, &[0xAB; 64]).await.is_empty());

    // Unknown op: an INVALID reply, then the connection closes.
    let mut head = Request {
        op: Op::Read,
        flags: 0,
        id: 42,
        offset: 0,
        len: 0,
        revision: 0,
    }
    .encode();
    head[4] = 99;
    let r = response(&raw(&addr, &head).await);
    assert_eq!((r.id, r.status), (42, status::INVALID));

    // An oversize length is refused before anything is allocated.
    let head = Request {
        op: Op::Write,
        flags: 0,
        id: 7,
        offset: 0,
        len: u32::MAX,
        revision: 0,
    }
    .encode();
    let r = response(&raw(&addr, &head).await);
    assert_eq!((r.id, r.status), (7, status::INVALID));

    // A request before OPEN: NOT_FOUND, and the connection goes on.
    let mut two = Request {
        op: Op::Flush,
        flags: 0,
        id: 1,
        offset: 0,
        len: 0,
        revision: 0,
    }
    .encode()
    .to_vec();
    two.extend_from_slice(
        &Request {
            op: Op::Info,
            flags: 0,
            id: 2,
            offset: 0,
            len: 0,
            revision: 0,
        }
        .encode(),
    );
    let mut s = TcpStream::connect(&addr).await.unwrap();
    s.write_all(&two).await.unwrap();
    let mut buf = vec![0u8; RESPONSE_HEADER];
    s.read_exact(&mut buf).await.unwrap();
    let r1 = response(&buf);
    assert_eq!((r1.id, r1.status), (1, status::NOT_FOUND));
    let mut msg = vec![0u8; r1.len as usize];
    s.read_exact(&mut msg).await.unwrap();
    s.read_exact(&mut buf).await.unwrap();
    assert_eq!(response(&buf).id, 2);

    // And the server still serves.
    let c = ReplicaClient::connect(&addr, "v1-r1").await.unwrap();
    c.write(0, &[1u8; 512], 1, false).await.unwrap();
}

#[tokio::test]
async fn calls_after_the_connection_dies_fail_at_once_and_never_hang() {
    // A server that answers OPEN, then closes the connection.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut head = [0u8; ballast_node::wire::protocol::REQUEST_HEADER];
        s.read_exact(&mut head).await.unwrap();
        let req = Request::decode(&head).unwrap();
        let mut name = vec![0u8; req.len as usize];
        s.read_exact(&mut name).await.unwrap();
        s.write_all(
            &Response {
                status: status::OK,
                id: req.id,
                len: 0,
            }
            .encode(),
        )
        .await
        .unwrap();
        drop(s);
    });
    let c = ReplicaClient::connect(&addr, "x").await.unwrap();
    for _ in 0..5 {
        let r = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            c.write(0, &[0u8; 512], 1, false),
        )
        .await;
        assert!(matches!(r, Ok(Err(ClientError::Closed { .. }))), "{r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_disk_fails_its_replicas_until_it_is_restored() {
    use ballast_node::replica::Replica;
    use ballast_node::replica::replica_dir;
    use ballast_node::server::ReplicaServer;
    use ballast_node::wire::client::ReplicaClient;
    let d = tempfile::tempdir().unwrap();
    Replica::create(&replica_dir(d.path(), "v-r1"), 1 << 20).unwrap();
    let server = ReplicaServer::new(vec![d.path().to_path_buf()]);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(server.clone().serve(l));
    let c = ReplicaClient::connect(&addr, "v-r1").await.unwrap();
    c.write(0, &[7u8; 4096], 1, false).await.unwrap();
    server
        .replicas()
        .fail_disk(d.path(), "ballast-disk.json is missing");
    let err = c.write(0, &[8u8; 4096], 2, false).await.unwrap_err();
    assert!(err.to_string().contains("not ready"), "{err}");
    assert!(ReplicaClient::connect(&addr, "v-r1").await.is_err());
    server.replicas().restore_disk(d.path());
    let again = ReplicaClient::connect(&addr, "v-r1").await.unwrap();
    assert_eq!(again.read(0, 4096).await.unwrap(), vec![7u8; 4096]);
}

/// Polls `f` until it holds (5 s at most).
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..100 {
        if f() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("never: {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lent_replica_serves_no_data_and_takes_no_mutation_until_given_back() {
    let disk = tempfile::tempdir().unwrap();
    Replica::create(&replica_dir(disk.path(), "v-r1"), 64 * BLOCK).unwrap();
    let (addr, server) = serve(disk.path()).await;
    let engine = ReplicaClient::connect(&addr, "v-r1").await.unwrap();
    engine.write(0, &[7u8; 4096], 1, false).await.unwrap();
    engine.lend().await.unwrap();
    assert!(server.replicas().is_lent("v-r1"));
    // Lending again on the same connection is a no-op; on another, refused.
    engine.lend().await.unwrap();
    let other = ReplicaClient::connect(&addr, "v-r1").await.unwrap();
    let busy = |r: Result<(), ClientError>, what: &str| match r {
        Err(ClientError::Failed { status: s, .. }) if s == status::BUSY => {}
        other => panic!("{what}: expected BUSY, got {other:?}"),
    };
    busy(other.lend().await, "second loan");
    busy(other.write(0, &[1u8; 4096], 2, false).await, "write");
    busy(other.trim(0, 4096, 2).await, "trim");
    busy(other.snapshot(None).await.map(drop), "snapshot");
    busy(other.read(0, 4096).await.map(drop), "read");
    // What a rebuild needs of it is still served, from the files.
    assert_eq!(other.info().await.unwrap()["size"], 64 * BLOCK);
    assert_eq!(other.layers().await.unwrap().len(), 1);
    engine.give_back().await.unwrap();
    assert!(!server.replicas().is_lent("v-r1"));
    assert_eq!(other.read(0, 4096).await.unwrap(), vec![7u8; 4096]);
    other.write(0, &[8u8; 4096], 2, false).await.unwrap();
    // The end of the borrowing connection ends a loan too.
    other.lend().await.unwrap();
    drop(other);
    eventually("the loan ends with its connection", || {
        !server.replicas().is_lent("v-r1")
    })
    .await;
    assert_eq!(engine.read(0, 4096).await.unwrap(), vec![8u8; 4096]);
}

/// A loan ends with one copy of the replica in the server, whichever
/// connections were opened before or during it. Found by the fault suite
/// (a power cut, then an engine that gave back a loan its files' revision
/// did not match, 2026-12-06): the connection that lent kept the copy the
/// loan had taken out of the server's table, the next opening made
/// another, and a freeze through the first was never seen by the second,
/// so a rebuild's fill found the source's frozen layer "not complete" at
/// every attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_loan_every_connection_sees_one_copy_of_the_replica() {
    let disk = tempfile::tempdir().unwrap();
    Replica::create(&replica_dir(disk.path(), "v-r1"), 64 * BLOCK).unwrap();
    let (addr, _server) = serve(disk.path()).await;
    let engine = ReplicaClient::connect(&addr, "v-r1").await.unwrap();
    engine.write(0, &[7u8; 4096], 1, false).await.unwrap();
    engine.lend().await.unwrap();
    // Opened while the replica is lent.
    let during = ReplicaClient::connect(&addr, "v-r1").await.unwrap();
    engine.give_back().await.unwrap();
    // Opened after.
    let after = ReplicaClient::connect(&addr, "v-r1").await.unwrap();
    let frozen = |layers: Vec<ballast_node::replica::LayerInfo>| -> Vec<(String, bool)> {
        layers
            .into_iter()
            .map(|l| (l.name, l.checksum.is_some()))
            .collect()
    };
    // A freeze through the lending connection is seen through the others.
    engine.snapshot(None).await.unwrap();
    let want = frozen(engine.layers().await.unwrap());
    assert_eq!(want.len(), 2, "{want:?}");
    assert_eq!(frozen(after.layers().await.unwrap()), want, "opened after");
    assert_eq!(
        frozen(during.layers().await.unwrap()),
        want,
        "opened during"
    );
    // And one through a connection opened during the loan, by the others.
    during.snapshot(None).await.unwrap();
    let want = frozen(during.layers().await.unwrap());
    assert_eq!(want.len(), 3, "{want:?}");
    assert_eq!(frozen(engine.layers().await.unwrap()), want, "the lender");
    assert_eq!(frozen(after.layers().await.unwrap()), want, "opened after");
    // Writes through each read back through every other.
    for (i, c) in [&engine, &during, &after].into_iter().enumerate() {
        let bytes = vec![i as u8 + 1; 4096];
        c.write(0, &bytes, 10 + i as u64, false).await.unwrap();
        for other in [&engine, &during, &after] {
            assert_eq!(other.read(0, 4096).await.unwrap(), bytes);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_disk_ends_the_loan_and_closes_the_borrowing_connection() {
    let disk = tempfile::tempdir().unwrap();
    Replica::create(&replica_dir(disk.path(), "v-r1"), 64 * BLOCK).unwrap();
    let (addr, server) = serve(disk.path()).await;
    let engine = ReplicaClient::connect(&addr, "v-r1").await.unwrap();
    engine.lend().await.unwrap();
    server.replicas().fail_disk(disk.path(), "test");
    assert!(!server.replicas().is_lent("v-r1"));
    tokio::time::timeout(std::time::Duration::from_secs(5), engine.closed())
        .await
        .expect("the borrowing connection is closed");
    // Asking again is refused: the replica is on a lost disk.
    let again = ReplicaClient::connect(&addr, "v-r1").await;
    assert!(
        matches!(again, Err(ClientError::Failed { .. })),
        "{:?}",
        again.map(drop)
    );
}

/// A write sent on a connection that has ended is answered, once, with
/// the reason. Before 2026-12-05 its callback was dropped unrun and the
/// caller answered for it; when the connection's end took the write first
/// it was answered twice, which counted one replica's answer twice in the
/// engine's fan-in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_sent_on_an_ended_connection_is_answered_once_with_the_reason() {
    use ballast_node::wire::client::Waiter;
    let disk = tempfile::tempdir().unwrap();
    Replica::create(&replica_dir(disk.path(), "v-r1"), 64 * BLOCK).unwrap();
    let (addr, server) = serve(disk.path()).await;
    let c = ReplicaClient::connect(&addr, "v-r1").await.unwrap();
    c.lend().await.unwrap();
    server.replicas().fail_disk(disk.path(), "test");
    tokio::time::timeout(std::time::Duration::from_secs(5), c.closed())
        .await
        .expect("the borrowing connection is closed");
    let (answered, answers) = std::sync::mpsc::channel();
    let waiter = Waiter::Callback(Box::new(move |r| {
        let _ = answered.send(r.map(drop));
    }));
    c.send_write(0, vec![7u8; 4096].into(), None, (1, false), waiter);
    let answers: Vec<_> = answers.iter().collect();
    assert_eq!(answers.len(), 1, "{answers:?}");
    let e = answers[0].as_ref().unwrap_err().to_string();
    assert!(e.contains("connection closed"), "{e}");
}

#[tokio::test(start_paused = true)]
async fn a_client_gives_up_on_a_server_that_never_answers_its_open() {
    // It takes the connection, reads, and never answers.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink).await;
    });
    let e = ReplicaClient::connect(&addr, "v-r1").await.err().unwrap();
    assert!(e.to_string().contains("no answer to OPEN"), "{e}");
}

/// A client dropped while its server has stopped reading (the socket
/// full, 64 MiB of writes queued) sends nothing more: the connection ends
/// without the rest of its frames, which must not reach a replica that
/// may be opened again on a new connection, and nothing of it is left
/// waiting for the server to read again. Every write still waiting for
/// its reply is answered, with an error: before 2026-12-05 a dropped
/// client's waiting writes were never answered, so that an engine's write
/// fanned out to a replica it had just dropped (a rebuild that failed as
/// it began: the fault soak's moves-3, seed 20261258) waited for ever,
/// holding the engine's I/O.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_dropped_while_its_server_stops_reading_sends_nothing_more_and_answers_what_waits()
{
    dropped_client_sends_nothing_more(WireTls::default()).await;
}

/// The same over mutual TLS, whose frames leave through the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_client_dropped_while_its_server_stops_reading_sends_nothing_more_and_answers_what_waits()
 {
    let ca = ballast::tls::Ca::generate().unwrap();
    let node = ca.issue(&ballast::tls::Role::Node("n1".into())).unwrap();
    dropped_client_sends_nothing_more(WireTls::new(&node, "n1").unwrap()).await;
}

async fn dropped_client_sends_nothing_more(tls: WireTls) {
    use ballast_node::wire::client::Waiter;
    use ballast_node::wire::protocol::REQUEST_HEADER;
    use std::time::Duration;
    const QUEUED: u64 = 64 << 20;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (drain, drained) = tokio::sync::oneshot::channel::<()>();
    let server_tls = tls.clone();
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let (mut rd, mut wr, _) = server_tls.accept(tcp).await.unwrap();
        let mut head = [0u8; REQUEST_HEADER];
        rd.read_exact(&mut head).await.unwrap();
        let open = Request::decode(&head).unwrap();
        let mut name = vec![0u8; open.len as usize];
        rd.read_exact(&mut name).await.unwrap();
        let body = br#"{"sums":false}"#;
        let reply = Response {
            status: status::OK,
            id: open.id,
            len: body.len() as u32,
        };
        wr.write_all(&reply.encode()).await.unwrap();
        wr.write_all(body).await.unwrap();
        wr.flush().await.unwrap();
        // It stops reading until told to read to the connection's end
        // (over TLS, a session cut mid-record ends in an error: what was
        // read before it counts).
        drained.await.unwrap();
        let mut got = 0u64;
        let mut buf = vec![0u8; 1 << 20];
        let all = async {
            while let Ok(n @ 1..) = rd.read(&mut buf).await {
                got += n as u64;
            }
        };
        tokio::time::timeout(Duration::from_secs(60), all)
            .await
            .expect("the connection ends once the client is dropped");
        got
    });
    let c = ReplicaClient::dial(&tls, &addr, "v-r1").await.unwrap();
    let (answered, answers) = std::sync::mpsc::channel();
    for i in 0..QUEUED >> 20 {
        let answered = answered.clone();
        // Answered where the engine's writes are: a callback that may
        // start a task of the runtime.
        let waiter = Waiter::Callback(Box::new(move |r| {
            tokio::spawn(async {});
            let _ = answered.send(r.map(drop));
        }));
        c.send_write(
            i << 20,
            vec![7u8; 1 << 20].into(),
            None,
            (i + 1, false),
            waiter,
        );
    }
    // Let the sending side fill the socket and wait on it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(c);
    drop(answered);
    // Every write is answered, with an error, without the server reading
    // on (the channel ends once every callback was run or dropped; a
    // dropped one is a write never answered).
    let answers = tokio::task::spawn_blocking(move || answers.iter().collect::<Vec<_>>());
    let answers = tokio::time::timeout(Duration::from_secs(30), answers)
        .await
        .expect("the waiting writes are let go")
        .unwrap();
    assert_eq!(
        answers.len() as u64,
        QUEUED >> 20,
        "writes waiting on the dropped client were never answered"
    );
    assert!(
        answers
            .iter()
            .all(|a| matches!(a, Err(ClientError::Closed { .. }))),
        "{answers:?}"
    );
    drain.send(()).unwrap();
    let got = server.await.unwrap();
    assert!(
        got < QUEUED,
        "the dropped client's frames went on: {got} bytes of {QUEUED} queued"
    );
}

/// A write's block checksums, taken once by the engine, travel with it
/// (FLAG_SUMS) to a replica that said at OPEN that it keeps them; the
/// replica records them as sent. A block that reached it other than the
/// engine sent it (here: a checksum that does not match the bytes, as a
/// corruption on the way would leave) then fails its check when read and
/// is never served. A replica without checksums is sent none; a write
/// with checksums that is not whole blocks is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_checksums_sent_with_a_write_are_recorded_as_sent_and_checked_on_read() {
    use ballast_node::replica::block_sums;
    use ballast_node::wire::client::Waiter;
    use ballast_node::wire::protocol::FLAG_SUMS;

    let disk = tempfile::tempdir().unwrap();
    Replica::create(&replica_dir(disk.path(), "v1-r1"), 64 * BLOCK).unwrap();
    Replica::create_without_block_sums(&replica_dir(disk.path(), "v1-r2"), 64 * BLOCK).unwrap();
    let (addr, _s) = serve(disk.path()).await;
    let c = ReplicaClient::connect(&addr, "v1-r1").await.unwrap();
    assert!(c.takes_sums());
    let old = ReplicaClient::connect(&addr, "v1-r2").await.unwrap();
    assert!(!old.takes_sums(), "a replica without checksums takes none");

    let write = |c: &ReplicaClient, offset: u64, data: Vec<u8>, sums: Vec<u8>, rev: u64| {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let sums = bytes::Bytes::from(sums);
        c.send_write(
            offset,
            bytes::Bytes::from(data),
            Some(&sums),
            (rev, false),
            Waiter::Task(tx),
        );
        async move { rx.await.unwrap() }
    };

    // Right checksums: read back whole.
    let data: Vec<u8> = (0..4 * BLOCK).map(|i| (i % 251) as u8).collect();
    write(&c, 0, data.clone(), block_sums(&data), 1)
        .await
        .unwrap();
    assert_eq!(c.read(0, 4 * BLOCK as u32).await.unwrap(), data);

    // A checksum that does not match its block: taken as sent, so the
    // block is found corrupt when read, and never served.
    let mut sums = block_sums(&data);
    sums[4] ^= 0xff; // the second block's
    write(&c, 8 * BLOCK, data.clone(), sums, 2).await.unwrap();
    assert_eq!(
        c.read(8 * BLOCK, BLOCK as u32).await.unwrap(),
        data[..BLOCK as usize]
    );
    let e = c.read(9 * BLOCK, BLOCK as u32).await.unwrap_err();
    assert!(e.is_corrupt(), "{e}");
    // The reply says where, beside its message: the block, in the head.
    let at = e.corruption().expect("a CORRUPT reply says where");
    assert_eq!(at.at, Some(9 * BLOCK), "{e}");
    assert!(at.layer.is_some() && !at.lost, "{at:?}");
    assert!(e.to_string().contains("does not match its checksum"), "{e}");

    // To a replica without checksums the same write goes without them.
    write(&old, 0, data.clone(), block_sums(&data), 1)
        .await
        .unwrap();
    assert_eq!(old.read(0, 4 * BLOCK as u32).await.unwrap(), data);

    // FLAG_SUMS on a write that is not whole blocks: refused, with the
    // reason, before its payload is read.
    let mut frame = Request {
        op: Op::Open,
        flags: 0,
        id: 1,
        offset: 0,
        len: 5,
        revision: 0,
    }
    .encode()
    .to_vec();
    frame.extend_from_slice(b"v1-r1");
    frame.extend_from_slice(
        &Request {
            op: Op::Write,
            flags: FLAG_SUMS,
            id: 2,
            offset: 512,
            len: BLOCK as u32,
            revision: 3,
        }
        .encode(),
    );
    let out = raw(&addr, &frame).await;
    let opened = response(&out);
    assert_eq!((opened.id, opened.status), (1, status::OK));
    let rest = &out[RESPONSE_HEADER + opened.len as usize..];
    let refused = response(rest);
    assert_eq!((refused.id, refused.status), (2, status::INVALID));
    let why = String::from_utf8_lossy(&rest[RESPONSE_HEADER..]);
    assert!(why.contains("whole blocks"), "{why}");
}

/// A connection that lists a replica's layers for a copy (LAYERS with
/// `FLAG_COPY`, as a fill asks its source), or reads a frozen layer, holds
/// off the replica's merge until it ends: the merge would change the
/// layers it copies. A plain LAYERS, as an engine asks, holds off nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_of_a_replicas_layers_holds_off_its_merge_until_its_connection_ends() {
    let disk = tempfile::tempdir().unwrap();
    Replica::create(&replica_dir(disk.path(), "v-r1"), 64 * BLOCK).unwrap();
    let (addr, server) = serve(disk.path()).await;
    let table = server.replicas().clone();
    let engine = ReplicaClient::connect(&addr, "v-r1").await.unwrap();
    // Three frozen layers, the lower two of which no snapshot needs.
    for (k, byte) in [(1u64, 1u8), (2, 2), (3, 3)] {
        engine.write(0, &[byte; 4096], k, false).await.unwrap();
        engine.snapshot(None).await.unwrap();
    }
    let want = engine.read(0, 4096).await.unwrap();
    assert_eq!(engine.layers().await.unwrap().len(), 4);
    assert!(
        table.copied_from("v-r1").is_none(),
        "a plain LAYERS held it"
    );
    let busy = |e: ballast_node::replica::ReplicaError| {
        assert!(
            matches!(e, ballast_node::replica::ReplicaError::Busy(_)),
            "{e}"
        );
    };
    // Listed for a copy.
    let copy = ReplicaClient::connect(&addr, "v-r1").await.unwrap();
    copy.layers_to_copy().await.unwrap();
    busy(table.merge("v-r1", vec![], 64 << 20).await.unwrap_err());
    assert_eq!(engine.layers().await.unwrap().len(), 4, "merged meanwhile");
    drop(copy);
    eventually("the copy ends with its connection", || {
        table.copied_from("v-r1").is_none()
    })
    .await;
    // A frozen layer read.
    let copy = ReplicaClient::connect(&addr, "v-r1").await.unwrap();
    copy.call(Op::LayerRead, 0, 4096, 0, 0, &[]).await.unwrap();
    busy(table.merge("v-r1", vec![], 64 << 20).await.unwrap_err());
    drop(copy);
    eventually("the copy ends with its connection", || {
        table.copied_from("v-r1").is_none()
    })
    .await;
    let merged = table.merge("v-r1", vec![], 64 << 20).await.unwrap();
    assert!(merged.merged > 0, "{merged:?}");
    assert!(engine.layers().await.unwrap().len() < 4);
    assert_eq!(engine.read(0, 4096).await.unwrap(), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_read_ahead_while_writes_run_freezes_with_the_checksum_of_what_it_holds() {
    const MIB: u64 = 1 << 20;
    let disk = tempfile::tempdir().unwrap();
    let dir = replica_dir(disk.path(), "v1-r1");
    Replica::create(&dir, 8 * MIB).unwrap();
    let (addr, _s) = serve(disk.path()).await;
    let c = Arc::new(ReplicaClient::connect(&addr, "v1-r1").await.unwrap());
    for i in 0..64u64 {
        c.write(i * (128 << 10), &vec![i as u8; 128 << 10], i + 1, false)
            .await
            .unwrap();
    }
    // Writes over the head while it is read ahead: each chunk they touch
    // is read again by the freeze.
    let writer = {
        let c = c.clone();
        tokio::spawn(async move {
            for i in 0..200u64 {
                let at = (i * 7919 % 2048) * BLOCK;
                c.write(at, &vec![(i % 251) as u8; BLOCK as usize], 65 + i, false)
                    .await
                    .unwrap();
            }
        })
    };
    c.warm().await.unwrap();
    writer.await.unwrap();
    let frozen = c.snapshot(None).await.unwrap();
    // Read whole again, the layer matches the checksum recorded.
    let view = Replica::open_view(&dir).unwrap();
    view.verify().unwrap();
    let layers = c.layers().await.unwrap();
    assert_eq!(layers[0].name, frozen);
    assert!(layers[0].checksum.as_deref().unwrap().starts_with("c1:"));

    // A chunk read ahead is not read again by the freeze: a byte flipped
    // in it after WARM passes the freeze, and the layer's check finds it.
    c.write(2 * MIB, &vec![9u8; MIB as usize], 300, false)
        .await
        .unwrap();
    c.flush().await.unwrap();
    c.warm().await.unwrap();
    let head = c.layers().await.unwrap().last().unwrap().name.clone();
    common::flip_block(&dir.join(&head), 2 * MIB);
    let second = c.snapshot(None).await.unwrap();
    assert_eq!(second, head);
    let e = Replica::open_view(&dir).unwrap().verify().unwrap_err();
    assert!(e.to_string().contains(&second), "{e}");
}
