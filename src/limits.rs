//! The limits a daemon asks of the kernel for itself as it starts. It
//! keeps nothing: it reads the process's limits and sets them.
//!
//! **Open files.** A node keeps every replica it has served open (two
//! files per layer, its meta and regions besides) and a connection per
//! engine and per fill; a controller a connection per node plugin and
//! engine that calls it. A container gets the soft limit its runtime
//! leaves it, 1,024 under containerd 2 and systemd's defaults, with a
//! hard limit far above it (524,288), and a program that needs more is
//! to raise its own soft limit. Go's runtime does so for the sidecars; a
//! Rust program does not. A node failed to open its 146th replica of
//! three layers (seven files each): "too many open files".
//! Every daemon raises its soft limit to its hard limit as it starts, to
//! `OPEN_FILES` at most: a hard limit set to "infinity" is about a
//! billion, and its children (mkfs, mount) inherit the soft limit.

use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// The most a daemon raises its soft limit of open files to.
pub const OPEN_FILES: u64 = 1 << 20;

/// Raises this process's soft limit of open files to its hard limit, or
/// to `OPEN_FILES` if the hard limit is above that; never lowers it.
/// Returns the soft limit before and after.
pub fn raise_open_files() -> std::io::Result<(u64, u64)> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    let want = hard.min(OPEN_FILES).max(soft);
    if want > soft {
        setrlimit(Resource::RLIMIT_NOFILE, want, hard)?;
    }
    Ok((soft, want))
}
