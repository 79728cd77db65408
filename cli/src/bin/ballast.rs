//! `ballast`: the controller and node daemons, and `ballast local`.

use std::process::ExitCode;

use ballast_cli::args::{Cli, Command, LogFormat};
use clap::Parser;

/// `ballast sim FILE`: JSON lines on stdout; a malformed scenario exits 2.
fn sim(path: &std::path::Path) -> ExitCode {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {}: {e}", path.display());
            return ExitCode::from(2);
        }
    };
    match ballast_controller::sim::run_text(&text) {
        Ok(reports) => {
            for r in reports {
                match serde_json::to_string(&r) {
                    Ok(line) => println!("{line}"),
                    Err(e) => {
                        eprintln!("error: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {}: {e}", path.display());
            ExitCode::from(2)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Sim { scenario } = &cli.command {
        return sim(scenario);
    }
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
            Command::Sim { .. } => Ok(()),
            Command::Engine(a) => ballast_cli::engine::run(a).await,
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
