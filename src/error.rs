//! Errors shared by both daemons' start-up: bad configuration and I/O.

use std::path::PathBuf;

/// Why a daemon could not start or serve.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("invalid endpoint {endpoint:?}: {reason}")]
    Endpoint { endpoint: String, reason: String },
    #[error("cannot bind {what} at {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: String,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("{0}")]
    Config(String),
}
