//! Replays every input of `corpus/<target>/` through its target, on the
//! stable toolchain: what once was found (or seeded) stays fixed. An empty
//! or missing corpus directory fails: each target has a seed corpus.

use std::path::Path;

#[test]
fn every_corpus_input_passes_its_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for (name, target) in ballast_fuzz::TARGETS {
        let dir = root.join(name);
        let inputs: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        assert!(!inputs.is_empty(), "{}: no seed inputs", dir.display());
        for input in inputs {
            let data = std::fs::read(&input).unwrap();
            let run = std::panic::catch_unwind(|| target(&data));
            assert!(run.is_ok(), "{} fails on {}", name, input.display());
        }
    }
}
