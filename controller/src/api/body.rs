//! A JSON body extractor whose errors name the field that was wrong.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use serde::de::DeserializeOwned;

use crate::error::Error;

/// Like `axum::Json`, but a bad body is a 400 naming the field.
pub struct Body<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Body<T> {
    type Rejection = Error;

    async fn from_request(req: Request, state: &S) -> Result<Self, Error> {
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|e| Error::invalid("body", e.to_string()))?;
        parse(&bytes).map(Body)
    }
}

/// Parses a JSON object (every body the API takes is one), turning
/// serde's error into one that names the field. Anything else (an array,
/// a string, no JSON at all) is "body: expected a JSON object"; a syntax
/// error inside the object keeps its place (line and column).
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => {}
        None => return Err(Error::invalid("body", "empty: expected a JSON object")),
        Some(_) => return Err(Error::invalid("body", "expected a JSON object")),
    }
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = inner.to_string();
        if inner.is_syntax() || inner.is_eof() {
            return Error::invalid("body", format!("not valid JSON: {message}"));
        }
        // An unknown or missing field is reported at its parent; name it.
        let field = if path == "." {
            field_in_message(&message).unwrap_or_else(|| "body".to_string())
        } else {
            path
        };
        Error::invalid(field, strip_position(&message))
    })
}

/// serde names unknown and missing fields in backquotes.
fn field_in_message(message: &str) -> Option<String> {
    let start = message.find('`')? + 1;
    let len = message[start..].find('`')?;
    Some(message[start..start + len].to_string())
}

/// Drops serde_json's " at line 1 column 12" suffix.
fn strip_position(message: &str) -> String {
    match message.find(" at line ") {
        Some(i) => message[..i].to_string(),
        None => message.to_string(),
    }
}

/// Like `axum::extract::Query`, but a bad query string is a JSON 400.
pub struct QueryArgs<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> axum::extract::FromRequestParts<S> for QueryArgs<T> {
    type Rejection = Error;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Error> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| QueryArgs(q.0))
            .map_err(|e| Error::invalid("query", e.body_text()))
    }
}
