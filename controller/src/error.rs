//! The controller's error table. HTTP codes are chosen in `api::error`,
//! gRPC codes in the `From<Error> for Status` below; never at a call site.

use ballast::model::Kind;
use ballast::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad input; names the field.
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    #[error("{kind} {name:?} not found")]
    NotFound { kind: String, name: String },
    /// A node does not hold what was asked of it (an engine that is not
    /// running there, a replica's data it lacks); says what, and where.
    #[error("{0}")]
    NotOnNode(String),
    #[error("{0}")]
    AlreadyExists(String),
    /// Someone else changed the object, or it is busy.
    #[error("{0}")]
    Conflict(String),
    /// Valid, but not possible now.
    #[error("{0}")]
    Unprocessable(String),
    /// Not enough room in the cluster (where the replicas could go).
    #[error("{0}")]
    NoRoom(String),
    /// A value outside what Ballast can serve (a size range); names the field.
    #[error("{field}: {message}")]
    OutOfRange { field: String, message: String },
    /// A node or a replica could not be reached: it may come back.
    #[error("{0}")]
    Unavailable(String),
    /// A REST change that did not say it is JSON.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// A change without the API's token.
    #[error("{0}")]
    Unauthenticated(String),
    /// A member asked for what is not its to have (a node, a reader's
    /// certificate for a replica that is not its own).
    #[error("{0}")]
    Forbidden(String),
    /// A replica's data failed its checksums (a rebuild's source).
    #[error("{0}")]
    DataLoss(String),
    #[error("{0}")]
    Internal(String),
}

impl Error {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }

    pub fn not_found(kind: Kind, name: impl Into<String>) -> Self {
        Error::NotFound {
            kind: kind.singular().to_string(),
            name: name.into(),
        }
    }
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound { kind, name } => Error::not_found(kind, name),
            e @ StoreError::AlreadyExists { .. } => Error::AlreadyExists(e.to_string()),
            e @ StoreError::Conflict { .. } => Error::Conflict(e.to_string()),
            StoreError::Invalid { kind, name, reason } => Error::Invalid {
                field: format!("{kind} {name}"),
                message: reason,
            },
            e => Error::Internal(e.to_string()),
        }
    }
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        let msg = e.to_string();
        match e {
            Error::Invalid { .. } => tonic::Status::invalid_argument(msg),
            Error::NotFound { .. } | Error::NotOnNode(_) => tonic::Status::not_found(msg),
            Error::AlreadyExists(_) => tonic::Status::already_exists(msg),
            Error::Conflict(_) => tonic::Status::aborted(msg),
            Error::Unprocessable(_) => tonic::Status::failed_precondition(msg),
            Error::NoRoom(_) => tonic::Status::resource_exhausted(msg),
            Error::OutOfRange { .. } => tonic::Status::out_of_range(msg),
            Error::Unavailable(_) => tonic::Status::unavailable(msg),
            Error::UnsupportedMediaType(_) => tonic::Status::invalid_argument(msg),
            Error::Unauthenticated(_) => tonic::Status::unauthenticated(msg),
            Error::Forbidden(_) => tonic::Status::permission_denied(msg),
            Error::DataLoss(_) => tonic::Status::data_loss(msg),
            Error::Internal(_) => tonic::Status::internal(msg),
        }
    }
}
