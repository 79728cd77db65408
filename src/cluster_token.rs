//! The cluster token: a secret the controllers, node plugins and engines of
//! one cluster share. Every call of the agent and controlplane gRPC carries
//! it (`authorization: Bearer …`), and their servers, when given one,
//! refuse a call without it (UNAUTHENTICATED) before the call is read.
//! It proves the caller belongs to the cluster; it neither says which member
//! it is nor hides the traffic (docs/security.md). While it changes, a
//! member holds two: it sends the first and accepts either. It owns the
//! tokens, reading their file again, and the two interceptors; the
//! daemons decide where they apply.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Request, Status};

/// The shortest token accepted: guessing it must be out of reach.
pub const MIN_LEN: usize = 16;

/// How often a token read from a file is read again (`keep_reading`).
pub const READ_AGAIN_EVERY: Duration = Duration::from_secs(5);

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
#[derive(Clone, Default)]
pub struct ClusterToken(Option<Arc<Live>>);

struct Live {
    /// Never empty: the first is sent.
    tokens: RwLock<Arc<[Arc<str>]>>,
    /// The file they were read from, read again by `reload`.
    file: Option<PathBuf>,
}

impl std::fmt::Debug for ClusterToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "ClusterToken(set)"
        } else {
            "ClusterToken(none)"
        })
    }
}

/// The tokens of `text`, one per non-blank line (surrounding whitespace
/// dropped), read from `origin`, which an error names with the line.
fn tokens_of(text: &str, origin: &str) -> Result<Arc<[Arc<str>]>, String> {
    let mut tokens = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let token = line.trim();
        if token.is_empty() {
            continue;
        }
        if token.len() < MIN_LEN || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!(
                "{origin}, line {}: a cluster token is at least {MIN_LEN} printable characters without spaces",
                i + 1
            ));
        }
        tokens.push(Arc::from(token));
    }
    if tokens.is_empty() {
        return Err(format!(
            "{origin}: no cluster token (one per line, at least {MIN_LEN} printable characters without spaces)"
        ));
    }
    Ok(tokens.into())
}

/// The text of the token file at `path`, and its name for errors.
fn read_file(path: &Path) -> Result<(String, String), String> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| format!("{origin}: {e}"))?;
    Ok((text, origin))
}

impl ClusterToken {
    /// The tokens in `path` (see `tokens_of`); the error says what is
    /// wrong with the file, naming it. `reload` reads it again.
    pub fn read(path: &Path) -> Result<ClusterToken, String> {
        let (text, origin) = read_file(path)?;
        let tokens = tokens_of(&text, &origin)?;
        Ok(ClusterToken::live(tokens, Some(path.to_path_buf())))
    }

    /// The tokens in `text`, read from `origin`, which the error names.
    pub fn parse(text: &str, origin: &str) -> Result<ClusterToken, String> {
        Ok(ClusterToken::live(tokens_of(text, origin)?, None))
    }

    fn live(tokens: Arc<[Arc<str>]>, file: Option<PathBuf>) -> ClusterToken {
        ClusterToken(Some(Arc::new(Live {
            tokens: RwLock::new(tokens),
            file,
        })))
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
        ClusterToken::live(Arc::from([Arc::from(token)]), None)
    }

    pub fn is_set(&self) -> bool {
        self.0.is_some()
    }

    /// The tokens now, the one sent first.
    fn tokens(&self) -> Option<Arc<[Arc<str>]>> {
        let live = self.0.as_ref()?;
        Some(match live.tokens.read() {
            Ok(t) => t.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        })
    }

    /// Takes the tokens of `text` (from `origin`, which an error names)
    /// in place of the ones held, for every clone; whether they changed.
    /// On an error the tokens held stay. A member with no token stays
    /// without.
    pub fn replace(&self, text: &str, origin: &str) -> Result<bool, String> {
        let Some(live) = &self.0 else {
            return Ok(false);
        };
        let new = tokens_of(text, origin)?;
        let mut held = match live.tokens.write() {
            Ok(t) => t,
            Err(poisoned) => poisoned.into_inner(),
        };
        if *held == new {
            return Ok(false);
        }
        *held = new;
        Ok(true)
    }

    /// Reads the token file again (see `replace`); nothing for tokens not
    /// read from a file.
    pub fn reload(&self) -> Result<bool, String> {
        let Some(path) = self.0.as_ref().and_then(|l| l.file.clone()) else {
            return Ok(false);
        };
        let (text, origin) = read_file(&path)?;
        self.replace(&text, &origin)
    }

    /// Reads the token file again every `READ_AGAIN_EVERY` (see
    /// `keep_replacing`). Nothing for tokens not read from a file.
    pub fn keep_reading(&self) {
        let Some(path) = self.0.as_ref().and_then(|l| l.file.clone()) else {
            return;
        };
        self.keep_replacing("the cluster token file", READ_AGAIN_EVERY, move || {
            std::future::ready(read_file(&path))
        });
    }

    /// Every `every`, on the current tokio runtime, takes the tokens of
    /// what `read` gives (their text, and where it was read, for errors;
    /// see `replace`), for as long as a clone of these tokens is in use.
    /// `source` names where they are read in the log: each change is
    /// logged, and so is a source that cannot be read or holds no valid
    /// token, whose tokens held then stay. Members started together read
    /// at different moments (an offset per process): a change reaches
    /// them one after the other, as it would across a cluster.
    pub fn keep_replacing<F, R>(&self, source: &'static str, every: Duration, read: F)
    where
        F: Fn() -> R + Send + 'static,
        R: std::future::Future<Output = Result<(String, String), String>> + Send,
    {
        let Some(live) = &self.0 else {
            return;
        };
        let weak: Weak<Live> = Arc::downgrade(live);
        let offset =
            u64::from(std::process::id()).wrapping_mul(7919) % (every.as_millis().max(1) as u64);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(offset)).await;
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let read = read().await;
                let Some(live) = weak.upgrade() else {
                    return;
                };
                let token = ClusterToken(Some(live));
                match read.and_then(|(text, origin)| token.replace(&text, &origin)) {
                    Ok(true) => tracing::info!(
                        tokens = token.tokens().map_or(0, |t| t.len()),
                        "{source} changed: sending its first token, accepting each of them"
                    ),
                    Ok(false) => {}
                    Err(e) => tracing::warn!(
                        error = %e,
                        "{source} could not be read again; the tokens held stay"
                    ),
                }
            }
        });
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
        if let Some(t) = self.0.tokens().as_ref().and_then(|t| t.first().cloned()) {
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
        let Some(tokens) = self.0.tokens() else {
            return Ok(request);
        };
        let header = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        // Each one compared, whichever matches.
        let matched = tokens
            .iter()
            .fold(false, |any, t| bearer_is(header, t) | any);
        if matched {
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
