//! `ballast`: the controller and node daemons, and `ballast local`.

use std::process::ExitCode;

use ballast_cli::args::{Cli, Command, LogFormat};
use clap::Parser;

fn main() -> ExitCode {
    let cli = Cli::parse();
    ballast::logging::init(cli.log_format == LogFormat::Json);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Controller(a) => ballast_controller::run(a.into())
                .await
                .map_err(|e| e.to_string()),
            Command::Node(a) => ballast_node::run(a.into()).await.map_err(|e| e.to_string()),
            Command::Local(a) => ballast_cli::local::run(a).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
