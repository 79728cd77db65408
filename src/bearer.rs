//! Bearer tokens that may change while they are in use: one token per
//! line of a file (or of a Secret's text), the first the one a member
//! sends, each one accepted, and read again while in use, so that a token
//! changes without a restart and without a window (docs/security.md,
//! "Secrets"). The cluster token (`cluster_token`) and the REST API's
//! token (the controller's `api::gate`) are both kept this way. It owns
//! the tokens and their rules; it knows nothing of gRPC or HTTP beyond an
//! `Authorization` header's value.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

/// How often tokens read from a file are read again (`keep_reading`).
pub const READ_AGAIN_EVERY: Duration = Duration::from_secs(5);

/// What a kind of token is called, and what a line of its file must be.
#[derive(Debug)]
pub struct Rule {
    /// Its name in errors and logs ("cluster token").
    pub what: &'static str,
    /// Its shortest length.
    pub min_len: usize,
    /// Printable characters only, no spaces.
    pub graphic: bool,
}

impl Rule {
    fn refusal(&self) -> String {
        if self.graphic {
            format!(
                "{}s are at least {} printable characters without spaces",
                self.what, self.min_len
            )
        } else {
            format!("{}s are lines that are not blank", self.what)
        }
    }
}

/// Tokens, or none (nothing sent, nothing required). Clones share them, so
/// a change read again (`reload`, `replace`) reaches every holder.
#[derive(Clone, Default)]
pub struct Tokens(Option<Arc<Live>>);

struct Live {
    rule: &'static Rule,
    /// Never empty: the first is sent.
    tokens: RwLock<Arc<[Arc<str>]>>,
    /// The file they were read from, read again by `reload`.
    file: Option<PathBuf>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(l) => write!(f, "Tokens({}, set)", l.rule.what),
            None => f.write_str("Tokens(none)"),
        }
    }
}

/// The tokens of `text` by `rule`, one per non-blank line (surrounding
/// whitespace dropped), read from `origin`, which an error names with the
/// line.
fn tokens_of(rule: &Rule, text: &str, origin: &str) -> Result<Arc<[Arc<str>]>, String> {
    let mut tokens = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let token = line.trim();
        if token.is_empty() {
            continue;
        }
        if token.len() < rule.min_len
            || (rule.graphic && !token.bytes().all(|b| b.is_ascii_graphic()))
        {
            return Err(format!("{origin}, line {}: {}", i + 1, rule.refusal()));
        }
        tokens.push(Arc::from(token));
    }
    if tokens.is_empty() {
        return Err(format!(
            "{origin}: no {} (one per line; {})",
            rule.what,
            rule.refusal()
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

impl Tokens {
    /// The tokens in `path` by `rule` (see `tokens_of`); the error says
    /// what is wrong with the file, naming it. `reload` reads it again.
    pub fn read(path: &Path, rule: &'static Rule) -> Result<Tokens, String> {
        let (text, origin) = read_file(path)?;
        let tokens = tokens_of(rule, &text, &origin)?;
        Ok(Tokens::live(rule, tokens, Some(path.to_path_buf())))
    }

    /// The tokens in `text` by `rule`, read from `origin`, which the error
    /// names.
    pub fn parse(text: &str, origin: &str, rule: &'static Rule) -> Result<Tokens, String> {
        Ok(Tokens::live(rule, tokens_of(rule, text, origin)?, None))
    }

    /// One token, as it is (tests, and what makes its own).
    pub fn from_text(token: &str, rule: &'static Rule) -> Tokens {
        Tokens::live(rule, Arc::from([Arc::from(token)]), None)
    }

    fn live(rule: &'static Rule, tokens: Arc<[Arc<str>]>, file: Option<PathBuf>) -> Tokens {
        Tokens(Some(Arc::new(Live {
            rule,
            tokens: RwLock::new(tokens),
            file,
        })))
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

    /// The token to send, if any.
    pub fn first(&self) -> Option<Arc<str>> {
        self.tokens().and_then(|t| t.first().cloned())
    }

    /// Whether an `Authorization` header value carries one of the tokens
    /// (each compared, whichever matches); always, with none.
    pub fn accepts(&self, header: Option<&str>) -> bool {
        self.tokens().is_none_or(|tokens| {
            tokens
                .iter()
                .fold(false, |any, t| bearer_is(header, t) | any)
        })
    }

    /// Takes the tokens of `text` (from `origin`, which an error names)
    /// in place of the ones held, for every clone; whether they changed.
    /// On an error the tokens held stay. Tokens of none stay none.
    pub fn replace(&self, text: &str, origin: &str) -> Result<bool, String> {
        let Some(live) = &self.0 else {
            return Ok(false);
        };
        let new = tokens_of(live.rule, text, origin)?;
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
    /// read from a file. The daemons read it again through `keep_reading`
    /// (the same `read_file` and `replace`); the tests call it directly.
    #[cfg(test)]
    pub fn reload(&self) -> Result<bool, String> {
        let Some(path) = self.0.as_ref().and_then(|l| l.file.clone()) else {
            return Ok(false);
        };
        let (text, origin) = read_file(&path)?;
        self.replace(&text, &origin)
    }

    /// Reads the token file again every `READ_AGAIN_EVERY` (see
    /// `keep_replacing`); each change is logged as `the <what> file
    /// changed`. Nothing for tokens not read from a file.
    pub fn keep_reading(&self) {
        let Some(live) = &self.0 else {
            return;
        };
        let Some(path) = live.file.clone() else {
            return;
        };
        let source = format!("the {} file", live.rule.what);
        self.keep_replacing(source, READ_AGAIN_EVERY, move || {
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
    pub fn keep_replacing<F, R>(&self, source: String, every: Duration, read: F)
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
                let tokens = Tokens(Some(live));
                match read.and_then(|(text, origin)| tokens.replace(&text, &origin)) {
                    Ok(true) => tracing::info!(
                        tokens = tokens.tokens().map_or(0, |t| t.len()),
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
}

/// Whether an `Authorization` header value is `Bearer <token>`, compared
/// in a time that does not depend on where it differs.
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

    static API: Rule = Rule {
        what: "API token",
        min_len: 1,
        graphic: false,
    };

    #[test]
    fn a_rule_decides_what_a_line_may_be_and_a_blank_file_holds_none() {
        let t = Tokens::parse("\n a token with spaces \nx\n", "f", &API).unwrap();
        assert_eq!(t.first().as_deref(), Some("a token with spaces"));
        assert!(t.accepts(Some("Bearer x")) && t.accepts(Some("Bearer a token with spaces")));
        assert!(!t.accepts(Some("Bearer y")) && !t.accepts(None));
        let e = Tokens::parse(" \n\n", "f", &API).unwrap_err();
        assert!(e.starts_with("f: no API token"), "{e}");
        // None: nothing sent, everything accepted.
        let none = Tokens::default();
        assert!(none.first().is_none() && none.accepts(None));
        assert!(!none.replace("x", "f").unwrap(), "none stays none");
    }
}
