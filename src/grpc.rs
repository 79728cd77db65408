//! gRPC plumbing shared by the daemons and the test tools: CSI endpoints
//! on unix sockets (server and client side) and plain TCP channels.

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

/// As [`tcp_channel`], over TLS with `tls` when given (an `http://` URL is
/// then reached as `https://`).
pub fn tcp_channel_with(
    url: &str,
    tls: Option<tonic::transport::ClientTlsConfig>,
) -> Result<Channel, ServeError> {
    let endpoints = url
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(|u| tcp_endpoint(u, tls.clone()))
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
    Ok(endpoint
        .connect_timeout(std::time::Duration::from_secs(3))
        .timeout(std::time::Duration::from_secs(10)))
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
