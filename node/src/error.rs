//! The node plugin's error table; gRPC codes are chosen here only.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("disk {path}: {message}")]
    Disk { path: PathBuf, message: String },
    #[error("invalid {field}: {message}")]
    Invalid { field: String, message: String },
    #[error("{0}")]
    AlreadyExists(String),
    /// The object is busy with another operation; try again later.
    #[error("{0}")]
    Busy(String),
    #[error("{0}")]
    NotFound(String),
    /// Valid, but refused in the current state (e.g. the last rw replica).
    #[error("{0}")]
    Refused(String),
    /// Something this node needs could not be reached.
    #[error("{0}")]
    Unavailable(String),
    /// A replica's data failed its checksums: a rebuild's source, or a
    /// replica a merge read (the block marked, the merge ended).
    #[error("{0}")]
    SourceCorrupt(String),
    /// A failure of this node (its files, its processes).
    #[error("{0}")]
    Internal(String),
}

impl Error {
    pub fn disk(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Error::Disk {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        let msg = e.to_string();
        match e {
            Error::Invalid { .. } => tonic::Status::invalid_argument(msg),
            Error::Disk { .. } => tonic::Status::failed_precondition(msg),
            Error::AlreadyExists(_) => tonic::Status::already_exists(msg),
            Error::Busy(_) => tonic::Status::aborted(msg),
            Error::NotFound(_) => tonic::Status::not_found(msg),
            Error::Unavailable(_) => tonic::Status::unavailable(msg),
            Error::Refused(_) => tonic::Status::failed_precondition(msg),
            Error::SourceCorrupt(_) => tonic::Status::data_loss(msg),
            Error::Internal(_) => tonic::Status::internal(msg),
        }
    }
}
