//! The shape of the code, checked: inside every crate of the workspace,
//! dependencies between files run one way (no cycles of `crate::` and
//! `super::` references, a module's own children aside), and so do those
//! between a crate's top-level modules. The controller and the node never
//! depend on each other.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const CRATES: [&str; 6] = [
    "src",
    "controller/src",
    "node/src",
    "cli/src",
    "tests/sanity/src",
    "tests/k8s-harness/src",
];

/// Module path (`engine::rebuild`) of every `.rs` file under `src`.
fn modules(src: &Path) -> BTreeMap<String, PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(src, &mut files);
    files
        .into_iter()
        .map(|p| {
            let rel = p.strip_prefix(src).unwrap().with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(
                parts.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                parts.pop();
            }
            (parts.join("::"), p)
        })
        .collect()
}

/// The source without the test module that closes many files (tests may
/// reach anywhere).
fn production(text: &str) -> &str {
    match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    }
}

/// Paths a file names: `crate::a::b` and `super::x` (resolved against the
/// file's module), as module paths.
fn references(module: &str, text: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    for start in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(i) = text[from..].find(start).map(|i| i + from) {
            from = i + start.len();
            if i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_') {
                continue;
            }
            let rest: String = text[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let mut segs: Vec<&str> = rest.split("::").filter(|s| !s.is_empty()).collect();
            let mut base: Vec<String> = if module.is_empty() {
                Vec::new()
            } else {
                module.split("::").map(str::to_string).collect()
            };
            if segs.first() == Some(&"crate") {
                base.clear();
                segs.remove(0);
            } else {
                // `super` is the parent module, for `a/b.rs` (`a::b`) as
                // for `a/mod.rs` (`a`).
                while segs.first() == Some(&"super") {
                    base.pop();
                    segs.remove(0);
                }
            }
            base.extend(segs.into_iter().map(str::to_string));
            out.push(base);
        }
    }
    out
}

/// The longest prefix of `path` that is a module of the crate.
fn resolve(path: &[String], modules: &BTreeMap<String, PathBuf>) -> Option<String> {
    (1..=path.len())
        .rev()
        .map(|k| path[..k].join("::"))
        .find(|m| modules.contains_key(m))
}

fn related(a: &str, b: &str) -> bool {
    a == b || a.starts_with(&format!("{b}::")) || b.starts_with(&format!("{a}::"))
}

/// The strongly connected components with more than one member.
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let n = t.index.len();
        t.index.insert(v, n);
        t.low.insert(v, n);
        t.stack.push(v);
        t.on.insert(v);
        let edges = t.edges;
        for w in edges.get(v).into_iter().flatten() {
            if !t.index.contains_key(w.as_str()) {
                visit(t, w);
                let lw = t.low[w.as_str()];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(w.as_str()) {
                let iw = t.index[w.as_str()];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.found.push(comp);
            }
        }
    }
    let mut t = T {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.found
}

/// File-level and top-level-module edges of one crate.
fn graphs(
    src: &Path,
) -> (
    BTreeMap<String, BTreeSet<String>>,
    BTreeMap<String, BTreeSet<String>>,
) {
    let mods = modules(src);
    let mut files: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut tops: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, p) in &mods {
        let text = std::fs::read_to_string(p).unwrap();
        files.entry(m.clone()).or_default();
        for r in references(m, production(&text)) {
            let Some(t) = resolve(&r, &mods) else {
                continue;
            };
            if !related(m, &t) {
                files.entry(m.clone()).or_default().insert(t.clone());
            }
            let (a, b) = (
                m.split("::").next().unwrap_or_default(),
                t.split("::").next().unwrap_or_default(),
            );
            if !a.is_empty() && !b.is_empty() && a != b {
                tops.entry(a.to_string()).or_default().insert(b.to_string());
            }
        }
    }
    (files, tops)
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

#[test]
fn no_file_depends_on_itself_through_others() {
    for krate in CRATES {
        let (files, _) = graphs(&root().join(krate));
        let found = cycles(&files);
        assert!(found.is_empty(), "{krate}: file import cycles: {found:?}");
    }
}

#[test]
fn the_top_level_modules_of_every_crate_depend_one_way() {
    for krate in CRATES {
        let (_, tops) = graphs(&root().join(krate));
        let found = cycles(&tops);
        assert!(found.is_empty(), "{krate}: module cycles: {found:?}");
    }
}

#[test]
fn the_node_data_plane_layers_depend_only_downwards() {
    let (_, tops) = graphs(&root().join("node/src"));
    let layers = ["replica", "wire", "sync", "server"];
    for (i, lower) in layers.iter().enumerate() {
        for upper in &layers[i + 1..] {
            assert!(
                !tops.get(*lower).is_some_and(|d| d.contains(*upper)),
                "node: {lower} reaches up into {upper}: {tops:?}"
            );
        }
    }
    // The engine uses the wire, never the server or sync; its frontends
    // sit on it.
    let engine = tops.get("engine").cloned().unwrap_or_default();
    for above in ["server", "sync", "frontend", "engines", "agent", "context"] {
        assert!(!engine.contains(above), "node: engine reaches into {above}");
    }
}

#[test]
fn the_controller_and_the_node_never_depend_on_each_other() {
    let manifest = |p: &str| std::fs::read_to_string(root().join(p)).unwrap();
    assert!(!manifest("node/Cargo.toml").contains("ballast-controller"));
    assert!(!manifest("controller/Cargo.toml").contains("ballast-node"));
}

#[test]
fn the_checker_finds_a_cycle() {
    // The check itself can fail: two files naming each other are found.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("lib.rs"), "mod a;\nmod b;\n").unwrap();
    std::fs::write(dir.path().join("a.rs"), "use crate::b::X;\n").unwrap();
    std::fs::write(dir.path().join("b.rs"), "use super::a::Y;\n").unwrap();
    let (files, tops) = graphs(dir.path());
    assert_eq!(cycles(&files), vec![vec!["a".to_string(), "b".to_string()]]);
    assert_eq!(cycles(&tops).len(), 1);
}
