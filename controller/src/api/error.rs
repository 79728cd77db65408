//! The one place where controller errors become HTTP answers:
//! `{"error": "...", "code": "..."}` with 400, 401, 404, 409, 415, 422,
//! 500 or 503.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::error::Error;

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let (status, code) = match &self {
            Error::Invalid { .. } => (StatusCode::BAD_REQUEST, "invalid_argument"),
            Error::NotFound { .. } | Error::NotOnNode(_) => (StatusCode::NOT_FOUND, "not_found"),
            Error::AlreadyExists(_) => (StatusCode::CONFLICT, "already_exists"),
            Error::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            Error::Unprocessable(_) => (StatusCode::UNPROCESSABLE_ENTITY, "unprocessable"),
            Error::NoRoom(_) => (StatusCode::UNPROCESSABLE_ENTITY, "no_room"),
            Error::OutOfRange { .. } => (StatusCode::BAD_REQUEST, "out_of_range"),
            Error::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            Error::UnsupportedMediaType(_) => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            Error::Unauthenticated(_) => (StatusCode::UNAUTHORIZED, "unauthenticated"),
            Error::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            Error::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
            Error::DataLoss(_) => (StatusCode::INTERNAL_SERVER_ERROR, "data_loss"),
        };
        if status.is_server_error() {
            tracing::error!(error = %self, "request failed");
        }
        let body = serde_json::json!({ "error": self.to_string(), "code": code });
        (status, Json(body)).into_response()
    }
}
