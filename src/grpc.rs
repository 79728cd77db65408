//! gRPC plumbing shared by the daemons and the test tools: CSI endpoints
//! on unix sockets (server and client side), and the members' servers and
//! channels over TCP, plain or TLS (with the settings `tls` makes).

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::error::ServeError;

/// The path of a `unix:///path` (or `unix:/path`, or a bare absolute path)
/// endpoint.
pub fn unix_path(endpoint: &str) -> Result<PathBuf, ServeError> {
    let path = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
        .unwrap_or(endpoint);
    if !path.starts_with('/') {
        return Err(ServeError::Endpoint {
            endpoint: endpoint.to_string(),
            reason: "expected unix:///absolute/path".into(),
        });
    }
    Ok(PathBuf::from(path))
}

/// A TCP listener on `addr`, or an error naming `what` it was for.
pub async fn bind_tcp(
    what: &'static str,
    addr: std::net::SocketAddr,
) -> Result<tokio::net::TcpListener, ServeError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind {
            what,
            addr: addr.to_string(),
            source,
        })
}

/// Logs how a server task ended, when it ended with an error.
pub fn ended<E: std::fmt::Display>(
    what: &str,
    result: Result<Result<(), E>, tokio::task::JoinError>,
) {
    if let Ok(Err(e)) = result {
        tracing::warn!(error = %e, "{what} ended with an error");
    }
}

/// Binds a unix socket for a gRPC server. A stale socket file left by a
/// previous run is removed first; a path that is not a socket is refused.
pub fn bind_unix(path: &Path) -> Result<UnixListenerStream, ServeError> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(ServeError::Config(format!(
                "{} exists and is not a socket; refusing to remove it",
                path.display()
            )));
        }
        std::fs::remove_file(path).map_err(|source| ServeError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| ServeError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    let listener = UnixListener::bind(path).map_err(|source| ServeError::Bind {
        what: "unix socket",
        addr: path.display().to_string(),
        source,
    })?;
    Ok(UnixListenerStream::new(listener))
}

/// A lazily connecting channel to a gRPC server on a unix socket.
pub fn unix_channel(path: &Path) -> Result<Channel, ServeError> {
    let path = path.to_path_buf();
    // The URI is required by the API but unused: the connector dials the socket.
    let endpoint = Endpoint::try_from("http://[::]:50051")?;
    Ok(
        endpoint.connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        })),
    )
}

/// A lazily connecting channel to `http://host:port`, or to a
/// comma-separated list of them: then each call goes to one of those that
/// answer (the controllers of a cluster, any of which takes every call).
pub fn tcp_channel(url: &str) -> Result<Channel, ServeError> {
    tcp_channel_with(url, None)
}

/// How long a channel's calls may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Calls {
    /// At most [`CALL_TIMEOUT`] each.
    Bounded,
    /// As long as the work they ask for (a merge copies a layer at its
    /// pace, a rebuild or a restore copies a replica): the caller bounds
    /// them, and a peer that stops answering pings ends them.
    Long,
}

/// As [`tcp_channel`], over TLS with `tls` when given (an `http://` URL is
/// then reached as `https://`).
pub fn tcp_channel_with(
    url: &str,
    tls: Option<tonic::transport::ClientTlsConfig>,
) -> Result<Channel, ServeError> {
    tcp_channel_calls(url, tls, Calls::Bounded)
}

/// As [`tcp_channel_with`], its calls bounded as `calls` says.
pub fn tcp_channel_calls(
    url: &str,
    tls: Option<tonic::transport::ClientTlsConfig>,
    calls: Calls,
) -> Result<Channel, ServeError> {
    let endpoints = url
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(|u| tcp_endpoint(u, tls.clone(), calls))
        .collect::<Result<Vec<_>, _>>()?;
    match endpoints.len() {
        0 => Err(ServeError::Endpoint {
            endpoint: url.to_string(),
            reason: "no address given".into(),
        }),
        1 => Ok(endpoints[0].connect_lazy()),
        _ => Ok(Channel::balance_list(endpoints.into_iter())),
    }
}

fn tcp_endpoint(
    url: &str,
    tls: Option<tonic::transport::ClientTlsConfig>,
    calls: Calls,
) -> Result<Endpoint, ServeError> {
    let bad = |reason: String| ServeError::Endpoint {
        endpoint: url.to_string(),
        reason,
    };
    let shared = match (&tls, url.strip_prefix("http://")) {
        (Some(_), Some(rest)) => format!("https://{rest}"),
        _ => url.to_string(),
    };
    let mut endpoint = Endpoint::from_shared(shared).map_err(|e| bad(e.to_string()))?;
    if let Some(tls) = tls {
        endpoint = endpoint.tls_config(tls).map_err(|e| bad(e.to_string()))?;
    }
    Ok(bounded(endpoint.connect_timeout(CONNECT_TIMEOUT), calls))
}

/// `endpoint` with its calls bounded as `calls` says. A long call's peer
/// is still asked every [`CALL_TIMEOUT`] whether it is there (an HTTP/2
/// ping): one that does not answer within as long (a node stopped or cut
/// off) ends the call.
fn bounded(endpoint: Endpoint, calls: Calls) -> Endpoint {
    match calls {
        Calls::Bounded => endpoint.timeout(CALL_TIMEOUT),
        Calls::Long => endpoint
            .http2_keep_alive_interval(CALL_TIMEOUT)
            .keep_alive_timeout(CALL_TIMEOUT)
            .keep_alive_while_idle(true),
    }
}

/// How long a member's server keeps a connection before it asks the
/// client to make a new one (HTTP/2 GOAWAY; calls under way finish): a
/// renewed certificate, either side's, is in every connection within it.
pub const CONNECTION_AGE: std::time::Duration = std::time::Duration::from_secs(3600);
/// How long a TCP connection, then a TLS handshake, may take, per address.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);
/// How long a call may take.
pub const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A member's gRPC server (the agent endpoints): connections last at most
/// [`CONNECTION_AGE`].
pub fn server() -> tonic::transport::Server {
    tonic::transport::Server::builder().max_connection_age(CONNECTION_AGE)
}

/// Serves `router` on `listener` until `signal`: over TLS with `tls` when
/// given, each handshake made apart from the others and given
/// [`CONNECT_TIMEOUT`] (one that fails is dropped, and logged); plain TCP
/// otherwise.
pub async fn serve_tcp(
    router: tonic::transport::server::Router,
    listener: tokio::net::TcpListener,
    tls: Option<std::sync::Arc<rustls::ServerConfig>>,
    signal: impl std::future::Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let Some(config) = tls else {
        return router
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                signal,
            )
            .await;
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let accepting = tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting a connection failed");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                },
                () = tx.closed() => return,
            };
            let _ = tcp.set_nodelay(true);
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(CONNECT_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(Ok::<_, std::io::Error>(tls)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    let served = router
        .serve_with_incoming_shutdown(tokio_stream::wrappers::ReceiverStream::new(rx), signal)
        .await;
    accepting.abort();
    served
}

/// A lazily connecting channel over TLS with `tls` to `http://host:port`
/// (or `https://`), or to a comma-separated list of them, whose server
/// must hold the name `peer`. Each connection is made with the
/// certificate `tls` shows at that moment. With several addresses, a new
/// connection tries them in turn, from the one after the last tried, and
/// takes the first that answers: calls go to one of those that answer
/// (the controllers of a cluster, any of which takes every call) until
/// that connection ends.
pub fn tls_channel(
    url: &str,
    tls: std::sync::Arc<rustls::ClientConfig>,
    peer: &str,
    calls: Calls,
) -> Result<Channel, ServeError> {
    let bad = |reason: String| ServeError::Endpoint {
        endpoint: url.to_string(),
        reason,
    };
    let addrs = url
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(|u| {
            let uri: Uri = u.parse().map_err(|e| bad(format!("{u}: {e}")))?;
            match (uri.scheme_str(), uri.authority()) {
                (Some("http" | "https"), Some(a)) if uri.port().is_some() => Ok(a.to_string()),
                _ => Err(bad(format!("{u}: expected http://host:port"))),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let Some(first) = addrs.first().cloned() else {
        return Err(bad("no address given".into()));
    };
    let name = rustls::pki_types::ServerName::try_from(peer.to_string())
        .map_err(|e| bad(format!("the peer's name {peer}: {e}")))?;
    let dialer = std::sync::Arc::new(Dialer {
        addrs,
        next: Default::default(),
        tls: tokio_rustls::TlsConnector::from(tls),
        name,
    });
    // The URI names the first address; the dialer picks the one it dials.
    let endpoint =
        Endpoint::from_shared(format!("http://{first}")).map_err(|e| bad(e.to_string()))?;
    let endpoint = bounded(endpoint, calls);
    Ok(
        endpoint.connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
            let dialer = dialer.clone();
            async move { dialer.dial().await }
        })),
    )
}

/// Makes a TLS channel's connections (see [`tls_channel`]).
struct Dialer {
    addrs: Vec<String>,
    /// Where the next connection starts trying.
    next: std::sync::atomic::AtomicUsize,
    tls: tokio_rustls::TlsConnector,
    name: rustls::pki_types::ServerName<'static>,
}

type TlsIo = TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;

impl Dialer {
    async fn dial(&self) -> Result<TlsIo, std::io::Error> {
        let start = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut failed = Vec::new();
        for i in 0..self.addrs.len() {
            let addr = &self.addrs[(start + i) % self.addrs.len()];
            match tokio::time::timeout(CONNECT_TIMEOUT, self.dial_one(addr)).await {
                Ok(Ok(io)) => return Ok(io),
                Ok(Err(e)) => failed.push(format!("{addr}: {e}")),
                Err(_) => failed.push(format!("{addr}: no answer in {CONNECT_TIMEOUT:?}")),
            }
        }
        Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            failed.join("; "),
        ))
    }

    async fn dial_one(&self, addr: &str) -> Result<TlsIo, std::io::Error> {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let tls = self.tls.connect(self.name.clone(), tcp).await?;
        Ok(TokioIo::new(tls))
    }
}

/// Resolves when the process gets SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM received, shutting down"),
                _ = int.recv() => tracing::info!("SIGINT received, shutting down"),
            }
        }
        _ => {
            tracing::warn!("cannot install signal handlers; waiting for ctrl-c");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::hash::{Hash, Hasher};
    use tonic::codegen::http;

    fn digest(der: &[u8]) -> String {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        der.hash(&mut h);
        format!("{:016x}", h.finish())
    }

    /// A gRPC service that answers every call with a digest of the
    /// client's certificate (`x-peer`), as the server's handshake saw it.
    #[derive(Clone)]
    struct Who;

    impl tonic::server::NamedService for Who {
        const NAME: &'static str = "test.Who";
    }

    impl tower::Service<http::Request<tonic::body::Body>> for Who {
        type Response = http::Response<tonic::body::Body>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

        fn poll_ready(
            &mut self,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), Self::Error>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
            use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
            let peer = req
                .extensions()
                .get::<TlsConnectInfo<TcpConnectInfo>>()
                .and_then(|i| i.peer_certs())
                .and_then(|c| c.first().map(|c| digest(c)))
                .unwrap_or_else(|| "none".into());
            let response = http::Response::builder()
                .header("content-type", "application/grpc")
                .header("grpc-status", "0")
                .header("x-peer", peer)
                .body(tonic::body::Body::empty())
                .unwrap();
            std::future::ready(Ok(response))
        }
    }

    /// What the server at the other end of `channel` says the client
    /// showed.
    async fn who(channel: &mut Channel) -> String {
        use tower::{Service, ServiceExt};
        let req = http::Request::builder()
            .method("POST")
            .uri("http://ballast/test.Who/Peer")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(tonic::body::Body::empty())
            .unwrap();
        let ready = channel.ready().await.unwrap();
        let response = ready.call(req).await.unwrap();
        response.headers()["x-peer"].to_str().unwrap().to_string()
    }

    /// The certificate the server at `addr` shows.
    async fn served(addr: &str, tls: &crate::tls::Tls) -> Vec<u8> {
        let config = tls.credentials().unwrap().rustls_client().unwrap();
        let name =
            rustls::pki_types::ServerName::try_from(crate::tls::Role::Controller.name()).unwrap();
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let s = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .unwrap();
        s.get_ref().1.peer_certificates().unwrap()[0].to_vec()
    }

    fn leaf(pem: &str) -> Vec<u8> {
        use rustls::pki_types::pem::PemObject;
        rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
            .unwrap()
            .to_vec()
    }

    /// Over TLS, a channel reaches the first of its addresses that
    /// answers, and each side shows the certificate it holds when a
    /// connection is made: after a renewal, a connection already made
    /// keeps the old one, a new one shows the new one.
    #[tokio::test]
    async fn tls_connections_show_the_certificate_held_when_they_are_made() {
        use crate::tls::{Ca, Role, Tls};
        let ca = Ca::generate().unwrap();
        let server = Tls::on(ca.issue(&Role::Controller).unwrap()).unwrap();
        let client = Tls::on(ca.issue(&Role::Controller).unwrap()).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let live = listener.local_addr().unwrap().to_string();
        let dead = {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            l.local_addr().unwrap().to_string()
        };
        let router = super::server().add_service(Who);
        let serving = {
            let server = server.clone();
            tokio::spawn(
                async move { server.serve(router, listener, std::future::pending()).await },
            )
        };
        let url = format!("http://{dead},http://{live}");
        let first = digest(&leaf(&client.credentials().unwrap().cert_pem));
        let mut old = client.channel(&url, &Role::Controller).unwrap();
        assert_eq!(who(&mut old).await, first, "past the dead address");

        client.renew(ca.issue(&Role::Controller).unwrap()).unwrap();
        let second = digest(&leaf(&client.credentials().unwrap().cert_pem));
        assert_ne!(second, first);
        assert_eq!(who(&mut old).await, first, "the connection made before");
        let mut new = client.channel(&url, &Role::Controller).unwrap();
        assert_eq!(who(&mut new).await, second, "a connection made after");

        let before = served(&live, &client).await;
        assert_eq!(before, leaf(&server.credentials().unwrap().cert_pem));
        server.renew(ca.issue(&Role::Controller).unwrap()).unwrap();
        let after = served(&live, &client).await;
        assert_ne!(after, before);
        assert_eq!(after, leaf(&server.credentials().unwrap().cert_pem));
        // A channel that must reach another name fails its handshake.
        let mut wrong = client.channel(&url, &Role::AnyNode).unwrap();
        let req = http::Request::builder()
            .method("POST")
            .uri("http://ballast/test.Who/Peer")
            .body(tonic::body::Body::empty())
            .unwrap();
        let answered = async {
            use tower::{Service, ServiceExt};
            wrong.ready().await?.call(req).await
        }
        .await;
        assert!(answered.is_err(), "a server of another name answered");
        serving.abort();
    }

    #[test]
    fn parses_unix_endpoints() {
        assert_eq!(
            unix_path("unix:///a/b.sock").unwrap(),
            PathBuf::from("/a/b.sock")
        );
        assert_eq!(unix_path("/a/b.sock").unwrap(), PathBuf::from("/a/b.sock"));
        assert!(unix_path("unix://relative.sock").is_err());
        assert!(unix_path("tcp://1.2.3.4:5").is_err());
    }

    #[tokio::test]
    async fn a_stale_socket_is_replaced_but_a_file_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("x.sock");
        drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
        assert!(sock.exists(), "stale socket left behind");
        bind_unix(&sock).expect("stale socket is removed and rebound");

        let file = dir.path().join("plain");
        std::fs::write(&file, b"data").unwrap();
        let err = bind_unix(&file).unwrap_err().to_string();
        assert!(err.contains("not a socket"), "{err}");
        assert_eq!(std::fs::read(&file).unwrap(), b"data");
    }
}
