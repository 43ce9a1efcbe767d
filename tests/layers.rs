//! The import rules of ARCHITECTURE.md ("Layers"), checked on the source:
//!
//! 1. In every crate of the workspace, the top-level modules (each file or folder directly
//!    under `src/`) import each other without a circle.
//! 2. In the server crate, every import goes down the layer list below, or sideways within a
//!    layer: never up.
//! 3. The state machine crate depends on serde, serde_bytes, thiserror, bytes and the record
//!    batch codec (raftq-batch) only, so apply can do no I/O and know no SDK; the codec depends
//!    on no crate of the workspace, the SDK on the codec alone, and the CLI on the SDK alone.
//!
//! An import is a `crate::module` path in code (`use crate::{a, b}` counts each). Test code
//! (files named `tests.rs` or `*_tests.rs`, folders named `tests`, and a trailing
//! `#[cfg(test)] mod tests { .. }`) and comments are left out: tests may reach anywhere.
//!
//! Run alone: `scripts/check-layers.sh`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The server crate's layers, bottom first. A module may import modules of its own layer or
/// of layers before it.
const SERVER_LAYERS: &[&[&str]] = &[
    // Leaves: the binary codec, the entry clock, TLS, API tokens (and `state`, the crate).
    &["codec", "clock", "tls", "tokens"],
    // openraft's types, the Raft settings and the node-to-node client.
    &["raft"],
    // RocksDB: the log, the state machine store, snapshots, the data directory.
    &["store"],
    // Group commit.
    &["proposer"],
    // `raftq serve`'s settings.
    &["config"],
    // The replica facade: propose and wait, read, status, cluster changes.
    &["node"],
    // A node that lost data comes back.
    &["rejoin"],
    // The public HTTP API.
    &["api"],
    // The other adapters on the same server: node-to-node RPC, metrics, the dashboard.
    &["peer", "metrics", "dashboard"],
    // The process: start-up, tasks, shutdown; and the offline commands.
    &["server", "admin"],
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir` that is not test code.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if path.is_dir() {
            if name != "tests" {
                sources(&path, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" && !name.ends_with("_tests.rs") {
            out.push(path);
        }
    }
}

/// The code of a file without comments and without a trailing `#[cfg(test)] mod tests {..}`.
fn code(text: &str) -> String {
    let mut text = text;
    if let Some(at) = text.find("#[cfg(test)]\nmod tests {") {
        text = &text[..at];
    }
    text.lines()
        .map(|line| match line.find("//") {
            // A `//` inside a string (a URL) is rare in imports; cutting there only drops code
            // after it on that line, never adds an import.
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first path segment after `crate::` of every import in `code`.
fn imported(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let bytes = code.as_bytes();
    let mut at = 0;
    while let Some(i) = code[at..].find("crate::") {
        let start = at + i + "crate::".len();
        at = start;
        // `raftq_crate::x` or `some_crate::x` is not this crate.
        if start > "crate::".len() {
            let before = bytes[start - "crate::".len() - 1];
            if before.is_ascii_alphanumeric() || before == b'_' {
                continue;
            }
        }
        if bytes.get(start) == Some(&b'{') {
            // A group: the first segment of each item at depth 0.
            let mut depth = 0;
            let mut item = String::new();
            for &b in &bytes[start + 1..] {
                match b {
                    b'{' => depth += 1,
                    b'}' if depth == 0 => break,
                    b'}' => depth -= 1,
                    b',' if depth == 0 => {
                        found.insert(first_segment(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(b as char);
            }
            found.insert(first_segment(&item));
        } else {
            found.insert(first_segment(&code[start..]));
        }
    }
    found.remove("");
    found
}

fn first_segment(text: &str) -> String {
    text.trim_start()
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// The top-level modules of the crate whose sources are in `src`, and which of them each
/// imports.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut modules = BTreeSet::new();
    for entry in std::fs::read_dir(src).expect("src") {
        let path = entry.expect("an entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if path.is_dir() && name != "tests" {
            modules.insert(name.to_string());
        } else if let Some(stem) = name.strip_suffix(".rs") {
            if !["lib", "main", "tests"].contains(&stem) && !stem.ends_with("_tests") {
                modules.insert(stem.to_string());
            }
        }
    }
    let mut graph: BTreeMap<String, BTreeSet<String>> = modules
        .iter()
        .map(|m| (m.clone(), BTreeSet::new()))
        .collect();
    let mut files = Vec::new();
    sources(src, &mut files);
    for file in files {
        let rel = file.strip_prefix(src).expect("under src");
        let first = rel.components().next().expect("a path");
        let first = first.as_os_str().to_str().expect("UTF-8");
        let module = first.strip_suffix(".rs").unwrap_or(first).to_string();
        if !modules.contains(&module) {
            continue; // lib.rs, main.rs
        }
        let text = std::fs::read_to_string(&file).expect("a source file");
        let mut uses = imported(&code(&text));
        // In a top-level file, `super::x` is the crate's `x`.
        if rel.components().count() == 1 {
            let code = code(&text);
            let mut rest = code.as_str();
            while let Some(i) = rest.find("super::") {
                rest = &rest[i + "super::".len()..];
                uses.insert(first_segment(rest));
            }
        }
        for used in uses {
            if used != module && modules.contains(&used) {
                graph.get_mut(&module).expect("a module").insert(used);
            }
        }
    }
    graph
}

/// A circle in `graph`, if there is one, as the path around it.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        graph: &BTreeMap<String, BTreeSet<String>>,
        node: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut found = path[at..].to_vec();
            found.push(node.to_string());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(graph, next, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|start| visit(graph, start, &mut Vec::new(), &mut done))
}

const CRATES: &[&str] = &[
    "src",
    "batch/src",
    "state/src",
    "client/src",
    "cli/src",
    "jepsen/src",
    "jepsen/faultfs/src",
];

#[test]
fn no_crate_has_an_import_circle_between_its_modules() {
    for krate in CRATES {
        let graph = module_graph(&root().join(krate));
        assert!(graph.len() > 1, "{krate}: no modules found");
        if let Some(found) = circle(&graph) {
            panic!("{krate}: the modules import each other in a circle: {found:?}");
        }
    }
}

#[test]
fn the_server_imports_only_down_its_layers() {
    let rank: BTreeMap<&str, usize> = SERVER_LAYERS
        .iter()
        .enumerate()
        .flat_map(|(i, layer)| layer.iter().map(move |m| (*m, i)))
        .collect();
    let graph = module_graph(&root().join("src"));
    let unplaced: Vec<&String> = graph
        .keys()
        .filter(|m| !rank.contains_key(m.as_str()))
        .collect();
    assert!(
        unplaced.is_empty(),
        "modules with no layer in SERVER_LAYERS (tests/layers.rs and ARCHITECTURE.md): \
         {unplaced:?}"
    );
    let mut upward = Vec::new();
    for (module, uses) in &graph {
        let Some(from) = rank.get(module.as_str()) else {
            continue;
        };
        for used in uses {
            if rank.get(used.as_str()).is_some_and(|to| to > from) {
                upward.push(format!("{module} -> {used}"));
            }
        }
    }
    assert!(upward.is_empty(), "imports that go up a layer: {upward:?}");
}

/// The `[dependencies]` of a crate's Cargo.toml (names only; dev-dependencies are tests').
fn dependencies(manifest: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(root().join(manifest)).expect("Cargo.toml");
    let mut deps = BTreeSet::new();
    let mut inside = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            inside = line == "[dependencies]" || line.ends_with(".dependencies]");
            inside &= !line.contains("dev-dependencies");
            continue;
        }
        if inside && !line.is_empty() && !line.starts_with('#') {
            if let Some((name, _)) = line.split_once('=') {
                deps.insert(name.trim().to_string());
            }
        }
    }
    deps
}

#[test]
fn the_state_machine_crate_can_do_no_io_and_know_no_sdk() {
    let deps = dependencies("state/Cargo.toml");
    let allowed: BTreeSet<String> = ["serde", "serde_bytes", "thiserror", "bytes", "raftq-batch"]
        .map(String::from)
        .into();
    assert!(
        deps.is_subset(&allowed),
        "raftq-state depends on {:?}; only {allowed:?} are allowed",
        deps.difference(&allowed).collect::<Vec<_>>()
    );
    assert!(deps.contains("serde"), "the dependency list was not read");
}

#[test]
fn the_sdk_and_the_cli_stand_on_their_own() {
    let ours = [
        "raftq",
        "raftq-state",
        "raftq-client",
        "raftq-cli",
        "raftq-batch",
    ];
    let codec = dependencies("batch/Cargo.toml");
    assert!(codec.contains("crc32c"), "the dependency list was not read");
    for krate in ours {
        assert!(
            !codec.contains(krate),
            "the record batch codec depends on {krate}"
        );
    }
    let sdk = dependencies("client/Cargo.toml");
    assert!(sdk.contains("reqwest"), "the dependency list was not read");
    for krate in ours.into_iter().filter(|k| *k != "raftq-batch") {
        assert!(!sdk.contains(krate), "the SDK depends on {krate}");
    }
    let cli = dependencies("cli/Cargo.toml");
    for krate in ours.into_iter().filter(|k| *k != "raftq-client") {
        assert!(!cli.contains(krate), "the CLI depends on {krate}");
    }
    assert!(cli.contains("raftq-client"), "the CLI is built on the SDK");
}

#[test]
fn the_import_reader_reads_groups_paths_and_nothing_else() {
    let code = code(
        "use crate::a::X;\nuse crate::{b, c::{D, E}, d as _};\nlet x = crate::e::f();\n\
         // use crate::commented;\nuse raftq_crate::g;\nuse super::h;",
    );
    let got: Vec<String> = imported(&code).into_iter().collect();
    assert_eq!(got, ["a", "b", "c", "d", "e"]);
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(m, uses)| (m.to_string(), uses.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(
        circle(&graph),
        Some(
            vec!["a", "b", "c", "a"]
                .into_iter()
                .map(String::from)
                .collect()
        )
    );
    let mut acyclic = graph.clone();
    acyclic.get_mut("c").expect("c").clear();
    assert_eq!(circle(&acyclic), None);
}
