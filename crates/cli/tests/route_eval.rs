//! `kvgate route-eval` against the RouteLLM-derived labelled data in `test-data/routellm/`.

/// `kvgate route-eval` on the RouteLLM-derived data: the held-out split's size, random routing
/// near its expected APGR of 0.5, and every calibrated strong share within 3 points of its
/// target on the held-out rows.
#[test]
fn route_eval_reports_routellm_figures_and_holds_calibrated_shares() {
    let data = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../test-data/routellm/routing-eval.jsonl"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args(["route-eval", "--data", data, "--split-seed", "1", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["split"]["rows"], 4134);
    assert_eq!(report["split"]["test"], 1240);
    let results = report["results"].as_array().unwrap();
    let apgr = |subset: &str, scorer: &str| {
        results
            .iter()
            .find(|r| r["subset"] == subset && r["scorer"] == scorer)
            .and_then(|r| r["apgr"].as_f64())
            .unwrap()
    };
    assert!((apgr("all", "random") - 0.5).abs() < 0.05, "{report}");
    assert!(
        apgr("all", "rules") > 0.0 && apgr("all", "knn") > 0.0,
        "{report}"
    );
    for c in report["calibration"].as_array().unwrap() {
        let (target, realised) = (
            c["target"].as_f64().unwrap(),
            c["realised"].as_f64().unwrap(),
        );
        assert!((target - realised).abs() <= 0.03, "{c}");
    }
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args(["route-eval", "--data", data, "--test-share", "1.5"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--test-share"));
}
