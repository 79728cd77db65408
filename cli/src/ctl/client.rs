//! `ballastctl`'s REST client: one request, its errors as the API names
//! them, and the exit codes they map to.

use serde_json::Value;

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error(
        "cannot reach the Ballast API at {url}: {reason} (is the controller running? see --api)"
    )]
    Unreachable { url: String, reason: String },
    /// The API answered with an error; its message is shown as is.
    #[error("{message}")]
    Api { status: u16, message: String },
    #[error("{0}")]
    Usage(String),
}

/// A thin JSON client of the REST API.
pub struct Client {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl Client {
    pub fn new(base: &str, token: Option<String>) -> Self {
        Client {
            base: base.trim_end_matches('/').to_string(),
            token,
            http: reqwest::Client::new(),
        }
    }

    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, CtlError> {
        let url = format!("{}{path}", self.base);
        let change = method != reqwest::Method::GET;
        let mut req = self.http.request(method, &url);
        if change {
            // Every change is JSON, with or without a body; and carries the
            // token, when there is one.
            req = req.header(reqwest::header::CONTENT_TYPE, "application/json");
            if let Some(t) = &self.token {
                req = req.bearer_auth(t);
            }
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.map_err(|e| CtlError::Unreachable {
            url: self.base.clone(),
            reason: e.to_string(),
        })?;
        let status = resp.status();
        let text = resp.text().await.map_err(|e| CtlError::Unreachable {
            url: self.base.clone(),
            reason: e.to_string(),
        })?;
        let v: Value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        if status.is_success() {
            Ok(v)
        } else {
            let message = v["error"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| format!("HTTP {status}: {v}"));
            Err(CtlError::Api {
                status: status.as_u16(),
                message,
            })
        }
    }

    pub async fn get(&self, path: &str) -> Result<Value, CtlError> {
        self.call(reqwest::Method::GET, path, None).await
    }
}
