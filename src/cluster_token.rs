//! The cluster token: a secret the controllers, node plugins and engines of
//! one cluster share. Every call of the agent and controlplane gRPC carries
//! it (`authorization: Bearer …`), and their servers, when given one,
//! refuse a call without it (UNAUTHENTICATED) before the call is read.
//! It proves the caller belongs to the cluster; it neither says which member
//! it is nor hides the traffic (docs/security.md). It owns the token and
//! the two interceptors; the daemons decide where they apply.

use std::path::Path;
use std::sync::Arc;

use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Request, Status};

/// The shortest token accepted: guessing it must be out of reach.
pub const MIN_LEN: usize = 16;

/// The cluster's token, or none (nothing sent, nothing required).
#[derive(Clone, Default)]
pub struct ClusterToken(Option<Arc<str>>);

impl std::fmt::Debug for ClusterToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "ClusterToken(set)"
        } else {
            "ClusterToken(none)"
        })
    }
}

impl ClusterToken {
    /// The token in `path` (surrounding whitespace dropped); the error says
    /// what is wrong with the file, naming it.
    pub fn read(path: &Path) -> Result<ClusterToken, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        ClusterToken::parse(&text, &path.display().to_string())
    }

    /// The token in `text` (surrounding whitespace dropped), read from
    /// `origin`, which the error names.
    pub fn parse(text: &str, origin: &str) -> Result<ClusterToken, String> {
        let token = text.trim();
        if token.len() < MIN_LEN || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!(
                "{origin}: a cluster token is at least {MIN_LEN} printable characters without spaces"
            ));
        }
        Ok(ClusterToken(Some(token.into())))
    }

    /// A new token: 48 hex digits from the kernel's random source.
    pub fn random_text() -> std::io::Result<String> {
        use std::io::Read;
        let mut bytes = [0u8; 24];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
        Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
    }

    /// A token from its text (tests, and `ballast local`, which makes one).
    pub fn from_text(token: &str) -> ClusterToken {
        ClusterToken(Some(token.into()))
    }

    pub fn is_set(&self) -> bool {
        self.0.is_some()
    }

    /// The interceptor a client adds to send it.
    pub fn sender(&self) -> SendToken {
        SendToken(self.clone())
    }

    /// The interceptor a server adds to require it.
    pub fn gate(&self) -> RequireToken {
        RequireToken(self.clone())
    }
}

/// A channel whose calls carry the cluster token.
pub type Authed = InterceptedService<Channel, SendToken>;

/// Adds the token to every call.
#[derive(Clone, Debug)]
pub struct SendToken(ClusterToken);

impl Interceptor for SendToken {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(t) = &self.0.0 {
            let value = MetadataValue::try_from(format!("Bearer {t}"))
                .map_err(|_| Status::internal("the cluster token is not a header value"))?;
            request.metadata_mut().insert("authorization", value);
        }
        Ok(request)
    }
}

/// Refuses a call that does not carry the token (when there is one).
#[derive(Clone, Debug)]
pub struct RequireToken(ClusterToken);

impl Interceptor for RequireToken {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(token) = &self.0.0 else {
            return Ok(request);
        };
        let header = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        if bearer_is(header, token) {
            Ok(request)
        } else {
            Err(Status::unauthenticated(
                "this cluster's token is required (--cluster-token-file)",
            ))
        }
    }
}

impl RequireToken {
    /// This gate, then `next` (a call passes both or neither).
    pub fn and<I: Interceptor>(self, next: I) -> Both<I> {
        Both(self, next)
    }
}

/// The token's gate followed by another.
#[derive(Clone, Debug)]
pub struct Both<I>(RequireToken, I);

impl<I: Interceptor> Interceptor for Both<I> {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let request = self.0.call(request)?;
        self.1.call(request)
    }
}

/// Whether an `Authorization` header value is `Bearer <token>`, compared
/// in a time that does not depend on where it differs. (The REST API's
/// token is checked with it too.)
pub fn bearer_is(header: Option<&str>, token: &str) -> bool {
    let given = header.and_then(|v| v.strip_prefix("Bearer "));
    given.is_some_and(|g| {
        let (a, b) = (g.as_bytes(), token.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(header: Option<&str>) -> Request<()> {
        let mut r = Request::new(());
        if let Some(h) = header {
            r.metadata_mut()
                .insert("authorization", MetadataValue::try_from(h).unwrap());
        }
        r
    }

    #[test]
    fn a_gate_lets_through_only_its_token_and_a_sender_sends_it() {
        let t = ClusterToken::from_text("0123456789abcdef-cluster");
        let mut gate = t.gate();
        let sent = t.sender().call(Request::new(())).unwrap();
        assert!(gate.call(sent).is_ok());
        for bad in [None, Some("Bearer wrong"), Some("0123456789abcdef-cluster")] {
            let e = gate.call(with(bad)).unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated, "{bad:?}");
        }
        // No token: nothing required, nothing sent.
        let none = ClusterToken::default();
        assert!(none.gate().call(with(None)).is_ok());
        let sent = none.sender().call(Request::new(())).unwrap();
        assert!(sent.metadata().get("authorization").is_none());
    }

    #[test]
    fn a_short_or_spaced_token_file_is_refused_naming_it() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("token");
        std::fs::write(&p, "short\n").unwrap();
        let e = ClusterToken::read(&p).unwrap_err();
        assert!(e.contains("token") && e.contains("at least 16"), "{e}");
        std::fs::write(&p, "a token with spaces in it\n").unwrap();
        assert!(ClusterToken::read(&p).is_err());
        std::fs::write(&p, "0123456789abcdef0123\n").unwrap();
        assert!(ClusterToken::read(&p).unwrap().is_set());
    }
}
