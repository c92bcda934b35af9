//! docs/routing.md against `kvgate policies --json`, both ways: every policy and every parameter
//! the binary offers is named in the reference; every policy the reference gives a section to
//! exists, and every parameter it documents (in a parameter table, or as "`name` (default)" in
//! prose) exists with the default it is documented with.

use std::collections::BTreeSet;
use std::process::Command;

fn offered() -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args(["policies", "--json"])
        .output()
        .expect("kvgate runs");
    assert!(out.status.success());
    serde_json::from_slice(&out.stdout).expect("JSON")
}

fn reference() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/routing.md");
    std::fs::read_to_string(path).expect("docs/routing.md")
}

#[test]
fn every_policy_and_parameter_is_in_the_reference_and_every_documented_policy_exists() {
    let offered = offered();
    let doc = reference();
    let policies = offered["policies"].as_array().expect("a list");
    assert!(policies.len() >= 13, "{offered}");
    let mut names = BTreeSet::new();
    let mut missing = Vec::new();
    for p in policies {
        let name = p["name"].as_str().expect("a name");
        names.insert(name.to_owned());
        if !doc.contains(&format!("`{name}`")) {
            missing.push(name.to_owned());
        }
        for param in p["parameters"].as_array().expect("a list") {
            let param = param["name"].as_str().expect("a name");
            if !doc.contains(&format!("`{param}`")) {
                missing.push(format!("{name}.{param}"));
            }
        }
    }
    assert!(missing.is_empty(), "not in docs/routing.md: {missing:?}");
    // Every policy a section heading names, as `name`, is one the binary offers.
    let documented: BTreeSet<String> = doc
        .lines()
        .filter(|l| l.starts_with("### "))
        .flat_map(|l| l.split('`').skip(1).step_by(2).map(str::to_owned))
        .collect();
    let unknown: Vec<_> = documented.difference(&names).collect();
    assert!(
        !documented.is_empty() && unknown.is_empty(),
        "documented, not offered: {unknown:?}"
    );
}

/// Every parameter a policy offers, by name (a `load.` parameter by its own name too), with
/// the defaults it has in the policies that offer it.
fn defaults(
    offered: &serde_json::Value,
) -> std::collections::BTreeMap<String, Vec<serde_json::Value>> {
    let mut out: std::collections::BTreeMap<String, Vec<serde_json::Value>> = Default::default();
    for p in offered["policies"].as_array().expect("a list") {
        for param in p["parameters"].as_array().expect("a list") {
            let name = param["name"].as_str().expect("a name");
            let default = param["default"].clone();
            let mut add = |name: &str, value: &serde_json::Value| {
                let known = out.entry(name.to_owned()).or_default();
                if !known.contains(value) {
                    known.push(value.clone());
                }
            };
            for (k, v) in default.as_object().into_iter().flatten() {
                add(k, v);
            }
            add(name, &default);
        }
    }
    out
}

/// Whether `written` (a table cell or a number in prose) states `default`.
fn states(written: &str, default: &serde_json::Value) -> bool {
    let word = written
        .split(|c: char| c.is_whitespace() || c == ';' || c == ')')
        .next()
        .unwrap_or("")
        .trim_end_matches(',')
        .replace(',', "");
    match default {
        serde_json::Value::Number(n) => word.parse::<f64>().ok() == n.as_f64(),
        serde_json::Value::Bool(b) => word == b.to_string(),
        serde_json::Value::String(s) => word == *s,
        _ => true,
    }
}

#[test]
fn every_documented_parameter_exists_with_the_default_it_is_documented_with() {
    let offered = defaults(&offered());
    let doc = reference();
    let mut wrong = Vec::new();
    // Tables whose first column is headed `parameter`: `| `name` | default | meaning |`.
    let mut in_table = false;
    let mut rows = 0;
    for line in doc.lines() {
        if !line.starts_with('|') {
            in_table = false;
            continue;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.get(1).is_some_and(|c| c.ends_with("parameter")) {
            in_table = true;
            continue;
        }
        let Some(name) = cells
            .get(1)
            .and_then(|c| c.strip_prefix('`')?.strip_suffix('`'))
        else {
            continue;
        };
        if !in_table {
            continue;
        }
        rows += 1;
        match offered.get(name) {
            None => wrong.push(format!("{name}: documented, not offered")),
            Some(defaults) => {
                let cell = cells.get(2).copied().unwrap_or("");
                if !cell.is_empty() && !defaults.iter().any(|d| states(cell, d)) {
                    wrong.push(format!(
                        "{name}: documented default {cell:?}, offered {defaults:?}"
                    ));
                }
            }
        }
    }
    // Prose: "`name` (default ...)" for a parameter some policy offers.
    let mut stated = 0;
    for (at, _) in doc.match_indices("` (") {
        let before = &doc[..at];
        let Some(start) = before.rfind('`') else {
            continue;
        };
        let name = &before[start + 1..];
        let Some(defaults) = offered.get(name) else {
            continue;
        };
        let after = &doc[at + 3..];
        if !after.starts_with(|c: char| c.is_ascii_digit()) {
            continue;
        }
        stated += 1;
        if !defaults.iter().any(|d| states(after, d)) {
            let said: String = after.chars().take(12).collect();
            wrong.push(format!("{name}: documented ({said}, offered {defaults:?}"));
        }
    }
    assert!(
        rows >= 15 && stated >= 8,
        "{rows} table rows, {stated} in prose"
    );
    assert!(wrong.is_empty(), "docs/routing.md: {wrong:#?}");
}
