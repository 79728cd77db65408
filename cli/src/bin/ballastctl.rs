//! `ballastctl`: the command-line client of the REST API.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // A reader that goes away (`ballastctl ... | head`) ends the program
    // quietly, as it ends any Unix filter, instead of a panic on the next
    // print. Rust ignores SIGPIPE by default; take the default back.
    // SAFETY: no other thread runs yet, and SIG_DFL installs no handler.
    unsafe {
        let _ = nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGPIPE,
            nix::sys::signal::SigHandler::SigDfl,
        );
    }
    let cli = ballast_cli::ctl::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(ballast_cli::ctl::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
