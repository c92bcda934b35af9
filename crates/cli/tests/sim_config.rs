//! `kvgate sim --config FILE` end to end: the real binary on the README's example
//! configuration runs and prints capacity per policy.

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

const README_CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/readme-config.yaml");

/// A short sweep: 400 requests at four session rates, a 500 ms TTFT SLO that two replicas at
/// full speed meet at every rate (seed 1).
const SHORT: [&str; 6] = [
    "--set",
    "requests=400",
    "--set",
    "rates=0.125,0.25,0.5,1",
    "--set",
    "slo_ttft_ms=500",
];

fn kvgate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args(args)
        .output()
        .expect("kvgate runs")
}

fn sim_json(extra: &[&str]) -> Value {
    let mut args = vec!["sim", "--config", README_CONFIG, "--format", "json"];
    args.extend(SHORT);
    args.extend(extra);
    let out = kvgate(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A configuration file in this test's scratch directory.
fn scratch(name: &str, yaml: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&path, yaml).unwrap();
    path
}

#[test]
fn the_fixture_is_the_readmes_example_configuration() {
    let readme = include_str!("../../../README.md");
    let after = readme
        .split_once("## Configuration")
        .expect("README has a Configuration section")
        .1;
    let block = after
        .split_once("```yaml\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("a yaml block")
        .0;
    assert_eq!(
        std::fs::read_to_string(README_CONFIG).unwrap(),
        block,
        "copy the README's block to tests/data/readme-config.yaml"
    );
}

#[test]
fn the_readme_config_prints_capacity_per_policy_configured_first() {
    let v = sim_json(&[]);
    assert_eq!(v["scenario"], "configured");
    let results = v["results"].as_array().unwrap();
    let policies: Vec<&str> = results
        .iter()
        .map(|r| r["policy"].as_str().unwrap())
        .collect();
    // cache_aware's defaults are the README's parameters: one row for both.
    assert_eq!(
        policies,
        [
            "cache_aware",
            "predicted_ttft",
            "prefix_hash",
            "consistent_hash",
            "least_outstanding",
            "round_robin",
            "oracle"
        ]
    );
    for r in results {
        assert!(r["capacity"].is_number() || r["capacity"].is_null(), "{r}");
        assert_eq!(r["configured"], r["policy"] == "cache_aware");
    }
    assert_eq!(results[0]["row"], "cache_aware (configured)");
    assert_eq!(results[6]["row"], "oracle (perfect information)");
    let notes = v["notes"].to_string();
    for unsimulated in ["tenancy", "tokenizers", "KV events: 1 of 2"] {
        assert!(notes.contains(unsimulated), "{unsimulated}: {notes}");
    }
    assert_eq!(v["params"]["requests"], 400);
    assert_eq!(v["params"]["slo_ttft_ms"], 500.0);
    assert_eq!(v["params"]["deployment"]["scrape_ms"], 500.0);
    assert_eq!(v["params"]["deployment"]["admission"]["max_queue"], 4096);
}

#[test]
fn a_slower_replica_lowers_capacity_and_is_named_by_name_or_url() {
    let capacity = |v: &Value| v["results"][0]["capacity"].as_f64();
    let fast = sim_json(&[]);
    let by_name = sim_json(&["--speed", "10.0.0.2:8000=0.25"]);
    let by_url = sim_json(&["--speed", "http://10.0.0.2:8000=0.25"]);
    assert_eq!(by_name, by_url);
    let (fast, slow) = (capacity(&fast).unwrap(), capacity(&by_name).unwrap());
    assert!(slow < fast, "{slow} < {fast}");
    assert_eq!(
        by_name["params"]["deployment"]["endpoints"][1]["speed"],
        0.25
    );
}

#[test]
fn an_unknown_speed_name_fails_naming_it() {
    let out = kvgate(&["sim", "--config", README_CONFIG, "--speed", "gpu-9=0.5"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("gpu-9") && err.contains("10.0.0.1:8000"),
        "{err}"
    );
}

#[test]
fn scenario_and_config_are_one_or_the_other() {
    let both = kvgate(&["sim", "--scenario", "batching", "--config", README_CONFIG]);
    assert!(!both.status.success());
    assert!(
        stderr(&both).contains("cannot be used with"),
        "{}",
        stderr(&both)
    );
    let neither = kvgate(&["sim"]);
    assert!(!neither.status.success());
    let speed_alone = kvgate(&["sim", "--scenario", "batching", "--speed", "a=1"]);
    assert!(!speed_alone.status.success());
    assert!(
        stderr(&speed_alone).contains("--speed"),
        "{}",
        stderr(&speed_alone)
    );
    let unknown_key = kvgate(&["sim", "--config", README_CONFIG, "--set", "rat=1"]);
    assert!(!unknown_key.status.success());
    assert!(
        stderr(&unknown_key).contains("rat"),
        "{}",
        stderr(&unknown_key)
    );
}

#[test]
fn a_config_without_endpoints_needs_replicas() {
    let discovered = scratch(
        "sim-config-discovered.yaml",
        "discovery: { inference_pool: { name: vllm-pool } }\n",
    );
    let out = kvgate(&["sim", "--config", discovered.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("no endpoints to simulate")
            && err.contains("vllm-pool")
            && err.contains("--replicas N"),
        "{err}"
    );

    let empty = scratch("sim-config-empty.yaml", "policy: { name: round_robin }\n");
    let path = empty.to_str().unwrap();
    let out = kvgate(&["sim", "--config", path]);
    assert!(
        stderr(&out).contains("the config lists none"),
        "{}",
        stderr(&out)
    );
    let mut args = vec![
        "sim",
        "--config",
        path,
        "--replicas",
        "3",
        "--format",
        "json",
    ];
    args.extend(SHORT);
    args.extend(["--policy", "least_outstanding", "--set", "oracle=false"]);
    let out = kvgate(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let endpoints = v["params"]["deployment"]["endpoints"].as_array().unwrap();
    assert_eq!(endpoints.len(), 3);
    assert_eq!(endpoints[2]["name"], "replica-2");
    let rows: Vec<&str> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["row"].as_str().unwrap())
        .collect();
    assert_eq!(rows, ["round_robin (configured)", "least_outstanding"]);
}
