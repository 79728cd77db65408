//! Log set-up for every binary: tracing, human-readable or JSON.

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. `RUST_LOG` overrides the default level
/// (info). Calling it twice is harmless.
pub fn init(json: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
