//! `kvgate engine` as a process: flags, the printed address, HTTP, faults from the command line.

mod support;

use std::process::Command;
use std::time::Duration;
use support::{get_text, spawn, Proc};

fn spawn_engine(extra: &[&str]) -> Proc {
    let mut args = vec![
        "engine",
        "--listen",
        "127.0.0.1:0",
        "--time-scale",
        "0",
        "--model",
        "m1",
    ];
    args.extend_from_slice(extra);
    spawn(&args, "listening on")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_and_applies_fault_flags() {
    let engine = spawn_engine(&["--fault", "429:retry_after=4", "--id", "e7"]);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    assert_eq!(
        client
            .get(format!("{}/health", engine.url))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let body = serde_json::json!({"model": "m1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "ignore_eos": true, "stream": true});
    let limited = client
        .post(format!("{}/v1/chat/completions", engine.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(limited.status(), 429);
    assert_eq!(limited.headers()["retry-after"], "4");

    let cleared = client
        .delete(format!("{}/admin/faults", engine.url))
        .send()
        .await
        .unwrap();
    assert_eq!(cleared.status(), 200);
    let ok = client
        .post(format!("{}/v1/chat/completions", engine.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(ok.headers()["x-kvgate-engine"], "e7");
    let text = ok.text().await.unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let metrics = get_text(&client, &engine.url, "/metrics").await;
    assert!(metrics.contains("vllm:num_requests_running{engine=\"0\",model_name=\"m1\"} 0.0"));
}

#[test]
fn bad_flags_exit_with_an_error() {
    for args in [
        &["--fault", "teapot"][..],
        &["--time-scale", "-1"],
        &["--batching", "sideways"],
        &["--kv-blocks", "4", "--max-model-len", "1000"],
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_kvgate"))
            .args(["engine", "--listen", "127.0.0.1:0"])
            .args(args)
            .output()
            .unwrap();
        assert!(!output.status.success(), "{args:?}");
        assert!(!output.stderr.is_empty(), "{args:?}");
    }
}
