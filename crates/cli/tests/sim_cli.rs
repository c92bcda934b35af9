//! `kvgate sim` end to end: the real binary, its table and its JSON.

use std::process::Command;

fn kvgate(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args(args)
        .output()
        .expect("kvgate runs")
}

#[test]
fn json_is_byte_identical_for_a_seed_and_names_the_scenario() {
    let args = [
        "sim",
        "--scenario",
        "routing-lab",
        "--seed",
        "3",
        "--format",
        "json",
        "--set",
        "requests=200",
        "--policy",
        "least_outstanding",
        "--policy",
        "cache_aware",
    ];
    let a = kvgate(&args);
    let b = kvgate(&args);
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    assert_eq!(a.stdout, b.stdout);
    let v: serde_json::Value = serde_json::from_slice(&a.stdout).unwrap();
    assert_eq!(v["scenario"], "routing-lab");
    let policies: Vec<&str> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["policy"].as_str().unwrap())
        .collect();
    assert_eq!(policies, ["least_outstanding", "cache_aware"]);
}

#[test]
fn the_table_is_the_default_and_bad_input_fails_cleanly() {
    let out = kvgate(&["sim", "--scenario", "batching"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("chunked") && text.contains("zero-output ticks"),
        "{text}"
    );

    let bad = kvgate(&["sim", "--scenario", "batching", "--set", "nonsense"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("KEY=VALUE"));
    let unknown = kvgate(&["sim", "--scenario", "routing-lab", "--set", "rat=1"]);
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("rat"));
}
