//! `ballast`: the controller and node daemons, and `ballast local`.

use std::process::ExitCode;

use ballast_cli::args::{Cli, Command, LogFormat};
use clap::Parser;

/// mimalloc, not glibc's allocator: the controller builds the planner's
/// view from its copy of the records on every pass, millions of small
/// strings at 100k volumes, and glibc spent most of that time merging
/// freed chunks (`malloc_consolidate`): 175 – 300 ms per view at 100k
/// volumes against 34 – 37 ms with mimalloc (docs/planner.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    if let Command::Crds = &cli.command {
        return match ballast::crd::crds_yaml() {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    ballast::logging::init(cli.log_format == LogFormat::Json);
    // Every daemon: the soft limit of open files a container is given is
    // too low for a node's replicas (see `ballast::limits`).
    match ballast::limits::raise_open_files() {
        Ok((before, after)) if after > before => {
            tracing::info!(
                before,
                after,
                "soft limit of open files raised to the hard limit"
            )
        }
        Ok((before, _)) => tracing::info!(limit = before, "soft limit of open files kept"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the soft limit of open files"),
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    // An engine runs as many async workers as asked (0: one per core, at
    // most a few; see `engine::workers`); the daemons one per core.
    if let Command::Engine(a) = &cli.command {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        builder.worker_threads(ballast_cli::engine::workers(a.workers, cores));
    }
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The exit status, with the message for stderr.
    let result: Result<(), (u8, String)> = runtime.block_on(async {
        let failed = |e: String| (1, e);
        match cli.command {
            Command::Controller(a) => ballast_controller::run(a.into())
                .await
                .map_err(|e| failed(e.to_string())),
            Command::Node(a) => match a.config() {
                Ok(config) => ballast_node::run(config)
                    .await
                    .map_err(|e| failed(e.to_string())),
                Err(e) => Err((2, e)),
            },
            Command::Local(a) => ballast_cli::local::run(a).await.map_err(failed),
            Command::Sim { .. } | Command::Crds => Ok(()),
            Command::EngineHost { socket } => {
                let socket = ballast::grpc::unix_path(&socket).map_err(|e| (2, e.to_string()))?;
                let exe = std::env::current_exe().map_err(|e| failed(e.to_string()))?;
                let host = ballast_node::engine_host::Host::new(exe, socket);
                host.serve().map_err(|e| failed(e.to_string()))?;
                // Told to stop, it ends once its engines are handed over to
                // the host that took its socket (or have ended).
                ballast::grpc::shutdown_signal().await;
                host.until_empty().await;
                Ok(())
            }
            Command::Guard => {
                ballast::grpc::shutdown_signal().await;
                Ok(())
            }
            // The node agent reads the engine's exit status.
            Command::Engine(a) => ballast_cli::engine::run(a)
                .await
                .map_err(|e| (e.code(), e.to_string())),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, e)) => {
            eprintln!("error: {e}");
            ExitCode::from(code)
        }
    }
}
