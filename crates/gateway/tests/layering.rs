//! The gateway's modules import only downward: every top-level module sits in one layer of the
//! table under "Layers of the gateway" in docs/architecture.md, may import modules of its own
//! layer or lower ones, and no set of modules imports itself round a cycle. Non-test code only:
//! `#[cfg(test)]` items, `tests.rs` and `*_tests.rs` files may reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The top-level module a source file belongs to, and its module path (`["pool", "target"]`).
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_owned());
    }
    parts
}

fn is_test_file(path: &[String]) -> bool {
    path.last()
        .is_some_and(|l| l == "tests" || l.ends_with("_tests"))
}

/// The source without comments and without `#[cfg(test)]` items.
fn non_test_code(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(|l| l.find("//").map_or(l, |at| &l[..at]))
        .collect();
    let mut out = String::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() != "#[cfg(test)]" {
            out.push_str(lines[i]);
            out.push('\n');
            i += 1;
            continue;
        }
        // Skip the item the attribute applies to: to its `;`, or to its braces' end.
        let (mut depth, mut opened) = (0i32, false);
        i += 1;
        while i < lines.len() {
            let l = lines[i];
            depth += l.matches('{').count() as i32 - l.matches('}').count() as i32;
            opened |= l.contains('{');
            i += 1;
            if (opened && depth <= 0) || (!opened && l.trim_end().ends_with(';')) {
                break;
            }
        }
    }
    out
}

/// The first segment of every path a `crate::`/`super::` reference names from `module`.
fn referenced(code: &str, module: &[String]) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `kvgate_crate::`, not ours
        }
        heads(&code[at + "crate::".len()..], &mut found);
    }
    // `super::x` from a top-level module's own files names a sibling top-level module.
    for (at, _) in code.match_indices("super::") {
        let mut depth = module.len();
        let mut rest = &code[at..];
        while let Some(r) = rest.strip_prefix("super::") {
            depth = depth.saturating_sub(1);
            rest = r;
        }
        if depth == 0 {
            heads(rest, &mut found);
        }
    }
    found
}

/// Adds the first segment of the path at the start of `rest` (each one, for a `{a, b::c}`
/// group).
fn heads(rest: &str, found: &mut BTreeSet<String>) {
    if let Some(group) = rest.strip_prefix('{') {
        let mut depth = 0;
        let mut item = String::new();
        for c in group.chars() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    heads(item.trim_start(), found);
                    item.clear();
                    continue;
                }
                _ => {}
            }
            item.push(c);
        }
        heads(item.trim_start(), found);
        return;
    }
    let name: String = rest
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    if !name.is_empty() && name != "self" {
        found.insert(name);
    }
}

/// Root re-exports (`pub use config::{Config, ...}` in lib.rs): the module each name comes from.
fn root_exports(lib: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for stmt in lib.split(';') {
        let Some(rest) = stmt.trim().strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, items)) = rest.split_once("::") else {
            continue;
        };
        let items = items.trim_start_matches('{').trim_end_matches('}');
        for item in items.split(',') {
            let name = item.rsplit("::").next().unwrap_or("").trim();
            if !name.is_empty() {
                names.insert(name.to_owned(), module.trim().to_owned());
            }
        }
    }
    names
}

/// Layer of every module, from the table under `## Layers of the gateway`: rows of
/// `| n. name | `a`, `b` | what |`.
fn layers(doc: &str) -> BTreeMap<String, usize> {
    let section = doc
        .split("\n## ")
        .find(|s| s.starts_with("Layers of the gateway"))
        .expect("docs/architecture.md has a section `## Layers of the gateway`");
    let mut layers = BTreeMap::new();
    for row in section.lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let Some(n) = cells
            .get(1)
            .and_then(|c| c.split('.').next())
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        for module in cells[2].split(',') {
            let module = module.trim().trim_matches('`');
            let before = layers.insert(module.to_owned(), n);
            assert!(before.is_none(), "{module} is in two layers");
        }
    }
    layers
}

/// Top-level module -> the top-level modules its non-test code imports.
type Graph = BTreeMap<String, BTreeSet<String>>;

fn graph(files: &[(Vec<String>, String)], exports: &BTreeMap<String, String>) -> Graph {
    let modules: BTreeSet<String> = files
        .iter()
        .map(|(p, _)| p.first().cloned().unwrap_or_else(|| "lib".into()))
        .collect();
    let mut graph = Graph::new();
    for (path, text) in files {
        if is_test_file(path) {
            continue;
        }
        let me = path.first().cloned().unwrap_or_else(|| "lib".into());
        let edges = graph.entry(me.clone()).or_default();
        for name in referenced(&non_test_code(text), path) {
            let target = exports.get(&name).cloned().unwrap_or(name);
            if target != me && modules.contains(&target) {
                edges.insert(target);
            }
        }
    }
    graph
}

/// One cycle of `graph`, if it has any.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &Graph,
        done: &mut BTreeSet<String>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, done, path) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut done, &mut Vec::new()))
}

/// Imports that go up a layer, and modules the table does not place.
fn violations(graph: &Graph, layers: &BTreeMap<String, usize>) -> Vec<String> {
    let mut out = Vec::new();
    for (from, targets) in graph {
        let Some(&own) = layers.get(from) else {
            out.push(format!(
                "module `{from}` is in no layer of docs/architecture.md"
            ));
            continue;
        };
        for to in targets {
            match layers.get(to) {
                Some(&l) if l > own => {
                    out.push(format!("`{from}` (layer {own}) imports `{to}` (layer {l})"));
                }
                _ => {}
            }
        }
    }
    out
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn the_gateway_imports_only_downward_and_has_no_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let mut paths = Vec::new();
    sources(&src, &mut paths);
    let files: Vec<(Vec<String>, String)> = paths
        .iter()
        .map(|p| (module_path(&src, p), std::fs::read_to_string(p).unwrap()))
        .filter(|(path, _)| path.first().is_none_or(|m| m != "fuzz"))
        .collect();
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let graph = graph(&files, &root_exports(&lib));
    assert!(graph.len() > 20, "{graph:?}");
    if let Some(cycle) = find_cycle(&graph) {
        panic!("import cycle: {}", cycle.join(" -> "));
    }
    let doc = std::fs::read_to_string(root.join("../../docs/architecture.md")).unwrap();
    let layers = layers(&doc);
    let wrong = violations(&graph, &layers);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    let gone: Vec<_> = layers.keys().filter(|m| !graph.contains_key(*m)).collect();
    assert!(
        gone.is_empty(),
        "docs/architecture.md places modules that do not exist: {gone:?}"
    );
}

fn file(path: &str, text: &str) -> (Vec<String>, String) {
    let path = path.split('/').map(str::to_owned).collect();
    (path, text.to_owned())
}

#[test]
fn the_check_sees_cycles_upward_imports_and_skips_tests_and_comments() {
    let exports = root_exports("pub use config::{Config, ConfigError};\npub use pool::Pool;");
    let files = [
        file("lib", "mod pool;\nuse crate::Config;"),
        file(
            "pool",
            "use crate::{metrics, clock::Clock};\n// crate::proxy in a comment",
        ),
        file("pool/target", "use super::super::state::Shared;"),
        file(
            "metrics",
            "#[cfg(test)]\nmod tests {\n    use crate::proxy;\n}\n",
        ),
        file("metrics/tests", "use crate::proxy;"),
        file("clock", ""),
        file("state", "fn f(p: &crate::Pool) {}"),
        file("config", ""),
        file("proxy", ""),
    ];
    let graph = graph(&files, &exports);
    assert_eq!(
        graph["pool"],
        BTreeSet::from(["clock".into(), "metrics".into(), "state".into()])
    );
    assert_eq!(graph["lib"], BTreeSet::from(["config".into()]));
    assert!(graph["metrics"].is_empty(), "{graph:?}");
    let cycle = find_cycle(&graph).unwrap();
    assert_eq!(cycle.first(), cycle.last());
    assert!(cycle.contains(&"state".to_owned()) && cycle.contains(&"pool".to_owned()));

    let doc = "# x\n\n## Layers of the gateway\n| layer | modules | what |\n|---|---|---|\n\
               | 1. base | `clock`, `metrics`, `pool` | x |\n| 2. state | `state`, `config` | x |\n\n## next\n| 9. no | `proxy` | |";
    let layers = layers(doc);
    assert_eq!(layers.get("proxy"), None);
    let wrong = violations(&graph, &layers);
    assert!(
        wrong
            .iter()
            .any(|w| w.contains("`pool` (layer 1) imports `state` (layer 2)")),
        "{wrong:?}"
    );
    assert!(
        wrong
            .iter()
            .any(|w| w.contains("module `lib` is in no layer")),
        "{wrong:?}"
    );
}
