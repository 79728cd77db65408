//! Who may change what over REST. Reads stay open. A mutation (POST, PUT,
//! PATCH, DELETE) must carry the controller's API token when it has one
//! (`Authorization: Bearer …`, `--api-token-file`). A POST, PUT or PATCH
//! must also say its body is JSON (`Content-Type: application/json`). A web
//! page cannot send that without a CORS preflight, which nothing here
//! answers, so a page a user opens cannot drive the API with a form or a
//! `text/plain` request. No CORS header is ever sent.

use axum::extract::{Request, State};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use ballast::bearer::{Rule, Tokens};

use crate::error::Error;

/// What a line of the API token's file must be: any line that is not
/// blank (a token, read as it is).
pub static API_TOKEN: Rule = Rule {
    what: "API token",
    min_len: 1,
    graphic: false,
};

/// What a mutation must carry.
#[derive(Clone, Debug, Default)]
pub struct Gate {
    /// The bearer tokens a mutation may carry (one per line of
    /// `--api-token-file`, read again while the controller runs, so that
    /// the token changes without a restart); none: no token is asked.
    pub token: Tokens,
}

/// Why the request may not go on, if it may not.
fn refusal(gate: &Gate, req: &Request) -> Option<Error> {
    let method = req.method();
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return None;
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if !gate.token.accepts(given) {
        return Some(Error::Unauthenticated(
            "Authorization: a change needs the API's bearer token (ballastctl --token or BALLAST_API_TOKEN)".into(),
        ));
    }
    if matches!(*method, Method::POST | Method::PUT | Method::PATCH) {
        let json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"));
        if !json {
            return Some(Error::UnsupportedMediaType(
                "Content-Type: a change is sent as application/json".into(),
            ));
        }
    }
    None
}

/// The middleware: refuses what [`refusal`] says, passes the rest on.
pub async fn mutations(State(gate): State<Gate>, req: Request, next: Next) -> Response {
    match refusal(&gate, &req) {
        Some(e) => e.into_response(),
        None => next.run(req).await,
    }
}
