//! The command-line front ends: `ballast` (the daemons and the local
//! cluster) and `ballastctl` (a client of the REST API). Flags are parsed
//! here and turned into the daemons' typed configs; nothing else lives here.

pub mod args;
pub mod ctl;
pub mod engine;
pub mod local;

/// A duration flag such as `5s`, `500ms`, `2m`.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not a duration like 5s or 500ms: {e}"))
}
