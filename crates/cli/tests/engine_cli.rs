//! `kvgate engine` as a process: flags, the printed address, HTTP, faults from the command line.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running `kvgate engine`; killed on drop.
struct Engine {
    child: Child,
    base: String,
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_engine(extra: &[&str]) -> Engine {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args([
            "engine",
            "--listen",
            "127.0.0.1:0",
            "--time-scale",
            "0",
            "--model",
            "m1",
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // The first stdout line names the bound address; reading it blocks until the engine is up.
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let base = line.trim().rsplit(' ').next().unwrap().to_owned();
    assert!(base.starts_with("http://127.0.0.1:"), "{line}");
    Engine { child, base }
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
            .get(format!("{}/health", engine.base))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let body = serde_json::json!({"model": "m1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "ignore_eos": true, "stream": true});
    let limited = client
        .post(format!("{}/v1/chat/completions", engine.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(limited.status(), 429);
    assert_eq!(limited.headers()["retry-after"], "4");

    let cleared = client
        .delete(format!("{}/admin/faults", engine.base))
        .send()
        .await
        .unwrap();
    assert_eq!(cleared.status(), 200);
    let ok = client
        .post(format!("{}/v1/chat/completions", engine.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(ok.headers()["x-kvgate-engine"], "e7");
    let text = ok.text().await.unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let metrics = client
        .get(format!("{}/metrics", engine.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
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
