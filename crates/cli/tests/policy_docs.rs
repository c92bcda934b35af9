//! docs/routing.md against `kvgate policies --json`, both ways: every policy and every parameter
//! the binary offers is named in the reference, and every policy the reference gives a section
//! to exists.

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
