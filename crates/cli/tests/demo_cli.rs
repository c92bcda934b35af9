//! `kvgate demo` end to end: real in-process engines and gateway, one row per policy, every
//! request answered, and the JSON report of each policy written.

use std::process::Command;

#[test]
fn demo_compares_policies_on_the_same_traffic() {
    let dir = std::env::temp_dir().join(format!("kvgate-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("demo.json");
    let out = Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args([
            "demo",
            "--policies",
            "round_robin,cache_aware",
            "--engines",
            "2",
            "--duration",
            "3",
            "--rate",
            "4",
            "--time-scale",
            "0.05",
            "--json",
        ])
        .arg(&json)
        .output()
        .expect("kvgate demo runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("round_robin ") || l.starts_with("cache_aware "))
        .collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rr = &report["round_robin"];
    let ca = &report["cache_aware"];
    // Sessions start at the same times; later turns follow each policy's own answers.
    assert!(rr["requests"].as_u64().unwrap() > 12, "{rr}");
    for r in [rr, ca] {
        assert_eq!(r["failed"], 0, "{r}");
        assert_eq!(r["completed"], r["requests"]);
        assert!(
            r["cached_tokens"].as_u64().unwrap() > 0,
            "agentic turns reuse prefixes"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}
