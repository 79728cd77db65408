//! The cluster token: a secret the controllers, node plugins and engines of
//! one cluster share. Every call of the agent and controlplane gRPC carries
//! it (`authorization: Bearer …`), and their servers, when given one,
//! refuse a call without it (UNAUTHENTICATED) before the call is read.
//! It proves the caller belongs to the cluster; it neither says which member
//! it is nor hides the traffic (docs/security.md). While it changes, a
//! member holds two: it sends the first and accepts either (`bearer`). It
//! owns the cluster token's rule and the two interceptors; the daemons
//! decide where they apply.

use std::path::Path;

use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Request, Status};

use crate::bearer::{Rule, Tokens};

pub use crate::bearer::READ_AGAIN_EVERY;

/// The shortest token accepted: guessing it must be out of reach.
pub const MIN_LEN: usize = 16;

/// What a line of a cluster token file must be.
pub static RULE: Rule = Rule {
    what: "cluster token",
    min_len: MIN_LEN,
    graphic: true,
};

/// The cluster's tokens, or none (nothing sent, nothing required).
///
/// A token file (or Secret) holds one token per line: the first is the one
/// this member sends, and every one is accepted. That is how the token
/// changes without a window in which members refuse each other: add the
/// new token as a second line everywhere, then make it the first, then
/// drop the old one, letting every member pick up each step before the
/// next (docs/security.md). Clones share the tokens, so a change read
/// again (`reload`, `replace`) reaches every channel and gate made from
/// them.
#[derive(Clone, Default, Debug)]
pub struct ClusterToken(Tokens);

impl std::ops::Deref for ClusterToken {
    type Target = Tokens;

    fn deref(&self) -> &Tokens {
        &self.0
    }
}

impl ClusterToken {
    /// The tokens in `path`; the error says what is wrong with the file,
    /// naming it and the line.
    pub fn read(path: &Path) -> Result<ClusterToken, String> {
        Tokens::read(path, &RULE).map(ClusterToken)
    }

    /// The tokens in `text`, read from `origin`, which the error names.
    pub fn parse(text: &str, origin: &str) -> Result<ClusterToken, String> {
        Tokens::parse(text, origin, &RULE).map(ClusterToken)
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
        ClusterToken(Tokens::from_text(token, &RULE))
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
        if let Some(t) = self.0.first() {
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
        let header = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        if self.0.accepts(header) {
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

    const OLD: &str = "0123456789abcdef-old-token";
    const NEW: &str = "0123456789abcdef-new-token";

    fn sent(t: &ClusterToken) -> String {
        let r = t.sender().call(Request::new(())).unwrap();
        r.metadata()
            .get("authorization")
            .unwrap()
            .to_str()
            .unwrap()
            .to_string()
    }

    fn passes(gate: &mut RequireToken, token: &str) -> bool {
        gate.call(with(Some(&format!("Bearer {token}")))).is_ok()
    }

    #[test]
    fn a_file_of_two_tokens_sends_the_first_and_accepts_either() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("token");
        std::fs::write(&p, format!("{OLD}\n\n  {NEW}  \n")).unwrap();
        let t = ClusterToken::read(&p).unwrap();
        assert_eq!(sent(&t), format!("Bearer {OLD}"));
        let mut gate = t.gate();
        assert!(passes(&mut gate, OLD) && passes(&mut gate, NEW));
        assert!(!passes(&mut gate, "0123456789abcdef-other-token"));
        assert!(gate.call(with(None)).is_err());
    }

    #[test]
    fn a_bad_line_or_no_token_is_refused_naming_the_line() {
        let e = ClusterToken::parse(&format!("{OLD}\nshort\n"), "the file").unwrap_err();
        assert!(
            e.contains("the file, line 2") && e.contains("at least 16"),
            "{e}"
        );
        let e = ClusterToken::parse("\n  \n", "the file").unwrap_err();
        assert!(e.contains("the file: no cluster token"), "{e}");
    }

    #[test]
    fn a_token_file_read_again_changes_every_clone_and_a_bad_one_changes_nothing() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("token");
        std::fs::write(&p, format!("{OLD}\n")).unwrap();
        let t = ClusterToken::read(&p).unwrap();
        // Made before the change: they see it.
        let (sender, mut gate) = (t.clone(), t.gate());
        assert!(!t.reload().unwrap(), "the same file is no change");
        std::fs::write(&p, format!("{NEW}\n{OLD}\n")).unwrap();
        assert!(t.reload().unwrap());
        assert_eq!(sent(&sender), format!("Bearer {NEW}"));
        assert!(passes(&mut gate, NEW) && passes(&mut gate, OLD));
        std::fs::write(&p, format!("{NEW}\n")).unwrap();
        assert!(t.reload().unwrap());
        assert!(passes(&mut gate, NEW) && !passes(&mut gate, OLD));
        // A broken file, or none: the tokens held stay.
        std::fs::write(&p, "short\n").unwrap();
        assert!(t.reload().is_err());
        std::fs::remove_file(&p).unwrap();
        assert!(t.reload().is_err());
        assert!(passes(&mut gate, NEW));
        assert_eq!(sent(&sender), format!("Bearer {NEW}"));
        // Tokens not read from a file have nothing to read again.
        assert!(!ClusterToken::from_text(OLD).reload().unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn a_token_file_is_read_again_while_the_tokens_are_in_use() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("token");
        std::fs::write(&p, format!("{OLD}\n")).unwrap();
        let t = ClusterToken::read(&p).unwrap();
        t.keep_reading();
        std::fs::write(&p, format!("{NEW}\n")).unwrap();
        tokio::time::sleep(READ_AGAIN_EVERY * 3).await;
        assert_eq!(sent(&t), format!("Bearer {NEW}"));
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
