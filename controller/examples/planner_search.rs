//! A bounded random search of the planner: settles N random clusters (the
//! property test's generator, seeded), each with its perturbations, and
//! reports how many did not converge, oscillated, or broke an invariant,
//! with the first few failing clusters in full.
//!
//! ```text
//! cargo run --release -p ballast-controller --example planner-search -- [--clusters 10000] [--seed 1]
//! ```
//! The same seed searches the same clusters. It exits 1 when any failed.

#[path = "../tests/random/mod.rs"]
mod random;

use std::time::Instant;

use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

fn arg(name: &str, default: u64) -> Result<u64, String> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name) {
        None => Ok(default),
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("{name} needs a number")),
    }
}

/// The 32-byte RNG seed of cluster `i` of a search seeded with `seed`.
fn seed_of(seed: u64, i: u64) -> [u8; 32] {
    let mut out = [0u8; 32];
    out[..8].copy_from_slice(&seed.to_le_bytes());
    out[8..16].copy_from_slice(&i.to_le_bytes());
    out
}

fn main() -> std::process::ExitCode {
    let (clusters, seed) = match (arg("--clusters", 10_000), arg("--seed", 1)) {
        (Ok(c), Ok(s)) => (c, s),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("planner-search: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let strategy = random::cluster();
    let start = Instant::now();
    let (mut not_converged, mut oscillated, mut invariant) = (0u64, 0u64, 0u64);
    let mut shown = 0;
    for i in 0..clusters {
        let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed_of(seed, i));
        let mut runner = TestRunner::new_with_rng(Config::default(), rng);
        let c = match strategy.new_tree(&mut runner) {
            Ok(tree) => tree.current(),
            Err(e) => {
                eprintln!("planner-search: cluster {i}: {e}");
                return std::process::ExitCode::from(2);
            }
        };
        if let Err(e) = random::check_cluster(&c) {
            let why = e.to_string();
            if why.contains("did not converge") || why.contains("did not settle") {
                not_converged += 1;
            } else if why.contains("oscillation") {
                oscillated += 1;
            } else {
                invariant += 1;
            }
            if shown < 3 {
                shown += 1;
                println!(
                    "cluster {i} (seed {seed}): {why}\nperturbations: {:?}\n{}",
                    c.perturbations, c.yaml
                );
            }
        }
        if (i + 1) % 1000 == 0 {
            eprintln!(
                "  {} clusters, {:.0}s",
                i + 1,
                start.elapsed().as_secs_f64()
            );
        }
    }
    let failed = not_converged + oscillated + invariant;
    println!(
        "planner search, seed {seed}: {clusters} random clusters, {not_converged} did not converge, \
         {oscillated} oscillated, {invariant} broke an invariant ({:.0}s)",
        start.elapsed().as_secs_f64()
    );
    if failed == 0 {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}
