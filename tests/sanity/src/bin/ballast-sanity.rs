//! `ballast-sanity --endpoint unix:///path.sock --target controller|node`:
//! runs Ballast's own CSI checks (what csi-sanity does not check) against a
//! live socket: Identity on either, the Controller checks on a controller.

use std::process::ExitCode;

use ballast_sanity::{Expectations, Target, controller_checks, identity_checks};
use clap::{Parser, ValueEnum};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum TargetArg {
    Controller,
    Node,
}

#[derive(Debug, Parser)]
#[command(
    name = "ballast-sanity",
    version,
    about = "CSI conformance checks for Ballast"
)]
struct Cli {
    /// The CSI endpoint, unix:///path.sock
    #[arg(long)]
    endpoint: String,
    /// Which daemon serves it.
    #[arg(long, value_enum)]
    target: TargetArg,
    /// Expected driver name.
    #[arg(long, default_value = ballast::DRIVER_NAME)]
    driver_name: String,
    /// A ready node to publish test volumes at (controller target); the
    /// publish checks run only with one. The controller checks create and
    /// delete small volumes named sanity-*.
    #[arg(long)]
    node_id: Option<String>,
    /// Only the Identity checks (no volume is created).
    #[arg(long)]
    identity_only: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async {
        let path = match ballast::grpc::unix_path(&cli.endpoint) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        };
        let ch = match ballast::grpc::unix_channel(&path) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        };
        let exp = Expectations {
            target: match cli.target {
                TargetArg::Controller => Target::Controller,
                TargetArg::Node => Target::Node,
            },
            driver_name: cli.driver_name,
            ready: Some(true),
            node_id: cli.node_id,
        };
        let mut outcomes = identity_checks(&ch, &exp).await;
        if !cli.identity_only && exp.target == Target::Controller {
            outcomes.extend(controller_checks(&ch, &exp).await);
        }
        let failed = outcomes.iter().filter(|o| o.failure.is_some()).count();
        for o in &outcomes {
            match &o.failure {
                None => println!("PASS {}", o.name),
                Some(why) => println!("FAIL {}: {why}", o.name),
            }
        }
        println!("{} passed, {failed} failed", outcomes.len() - failed);
        if failed == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    })
}
