//! `k8s-up DIR`: starts the test bench's control plane with its files in
//! DIR, prints the kubeconfig to use, and stops everything on Ctrl-C or
//! SIGTERM. For trying Ballast against a real API server by hand
//! (`tools/k8s/up DIR` runs it).

use std::path::PathBuf;

use clap::Parser;

#[derive(Parser)]
#[command(about = "Start etcd, kube-apiserver and kube-controller-manager from KUBEBUILDER_ASSETS")]
struct Args {
    /// Where the certificates, etcd's data, the kubeconfig and the logs go.
    dir: PathBuf,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let cp = match ballast_k8s_harness::ControlPlane::start_in(&args.dir).await {
        Ok(cp) => cp,
        Err(e) => {
            eprintln!("k8s-up: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    println!("API server: {}", cp.server);
    println!("export KUBECONFIG={}", cp.kubeconfig.display());
    println!(
        "logs: {}/*.log; Ctrl-C stops everything",
        cp.dir().display()
    );
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("k8s-up: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    drop(cp);
    std::process::ExitCode::SUCCESS
}
