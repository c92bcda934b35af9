//! `kvgate serve` in front of real `kvgate engine` processes.

mod support;

use std::time::{Duration, Instant};
use support::{
    chat, client, engine, gateway, gateway_with_config, get_text, metric, sse_data, user, wait_for,
};

fn strip_volatile(event: &str) -> serde_json::Value {
    let mut v: serde_json::Value = serde_json::from_str(event).unwrap_or(serde_json::json!(event));
    if let Some(o) = v.as_object_mut() {
        o.remove("id");
        o.remove("created");
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_chunks_pass_through_unchanged() {
    let e = engine("e0", "1", &[]);
    let g = gateway(&[&e], &["--policy", "round_robin"]).await;
    let http = client();
    let body = chat(user("tell me a story"), 24, true);
    let direct = http
        .post(format!("{}/v1/chat/completions", e.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    let direct = direct.text().await.unwrap();
    let mut via = http
        .post(format!("{}/v1/chat/completions", g.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(via.status(), 200);
    assert!(via.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    // Chunks arrive as the engine produces them (about 12 ms apart at time scale 1), not at once.
    let started = Instant::now();
    let mut arrivals = Vec::new();
    let mut text = String::new();
    while let Some(chunk) = via.chunk().await.unwrap() {
        arrivals.push(started.elapsed());
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    assert!(arrivals.len() >= 10, "{} chunks", arrivals.len());
    assert!(
        arrivals.last().unwrap().saturating_sub(arrivals[0]) > Duration::from_millis(100),
        "{arrivals:?}"
    );
    let (a, b) = (sse_data(&direct), sse_data(&text));
    assert_eq!(a.len(), b.len(), "{direct}\n---\n{text}");
    assert_eq!(b.last().unwrap(), "[DONE]");
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(strip_volatile(x), strip_volatile(y));
    }
}

/// Runs `conversations` conversations of `turns` turns one after another; returns per
/// conversation the endpoints that served it and the cached tokens of each turn.
async fn converse(
    url: &str,
    tag: &str,
    conversations: usize,
    turns: usize,
) -> Vec<(Vec<String>, Vec<u64>)> {
    let http = client();
    let mut out = Vec::new();
    for c in 0..conversations {
        let system = format!("{tag} conversation {c}: ")
            + &"you are a careful assistant who answers briefly. ".repeat(30);
        let mut messages = vec![serde_json::json!({"role": "system", "content": system})];
        let (mut served, mut cached) = (Vec::new(), Vec::new());
        for t in 0..turns {
            messages.push(serde_json::json!({"role": "user", "content": format!("question {t} of conversation {c}")}));
            let r = http
                .post(format!("{url}/v1/chat/completions"))
                .json(&chat(serde_json::Value::Array(messages.clone()), 8, false))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            served.push(
                r.headers()[kvgate_gateway::ENDPOINT_HEADER]
                    .to_str()
                    .unwrap()
                    .to_string(),
            );
            let v: serde_json::Value = r.json().await.unwrap();
            cached.push(
                v["usage"]["prompt_tokens_details"]["cached_tokens"]
                    .as_u64()
                    .unwrap_or(0),
            );
            let answer = v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_string();
            messages.push(serde_json::json!({"role": "assistant", "content": answer}));
        }
        out.push((served, cached));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_aware_keeps_conversations_on_their_replica_while_round_robin_spreads_them() {
    let (e0, e1) = (engine("e0", "0", &[]), engine("e1", "0", &[]));
    let aware = gateway(
        &[&e0, &e1],
        &["--policy", "cache_aware", "--cache-threshold", "0.3"],
    )
    .await;
    for (served, cached) in converse(&aware.url, "aware", 4, 4).await {
        assert!(
            served.iter().all(|s| *s == served[0]),
            "cache_aware moved a conversation: {served:?}"
        );
        assert!(
            cached[1..].iter().all(|&c| c > 0),
            "no prefix-cache hits on later turns: {cached:?}"
        );
    }
    let rr = gateway(&[&e0, &e1], &["--policy", "round_robin"]).await;
    let mut misses = 0;
    for (served, cached) in converse(&rr.url, "rr", 4, 4).await {
        assert!(
            served.iter().any(|s| *s != served[0]),
            "round_robin kept a conversation on one replica: {served:?}"
        );
        misses += cached[1..].iter().filter(|&&c| c == 0).count();
    }
    // Turn 2 of each conversation lands on the replica that has not seen it yet.
    assert_eq!(misses, 4, "round_robin misses");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_429_moves_traffic_away() {
    let limited = engine("limited", "0", &["--fault", "429:retry_after=30"]);
    let healthy = engine("healthy", "0", &[]);
    let g = gateway(&[&limited, &healthy], &["--policy", "round_robin"]).await;
    let http = client();
    for i in 0..10 {
        let r = http
            .post(format!("{}/v1/chat/completions", g.url))
            .json(&chat(user(&format!("q{i}")), 4, false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "request {i}");
        assert_eq!(r.headers()["x-kvgate-engine"], "healthy");
    }
    let metrics = get_text(&http, &g.url, "/metrics").await;
    assert_eq!(
        metric(&metrics, "kvgate_retries_total{reason=\"429\"}"),
        Some(1.0),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_inputs_get_4xx_and_the_next_valid_request_succeeds() {
    let e = engine("e0", "0", &[]);
    let g = gateway(&[&e], &["--max-body-bytes", "4096"]).await;
    let http = client();
    let url = format!("{}/v1/chat/completions", g.url);
    let big = format!(
        "{{\"messages\":[{{\"role\":\"user\",\"content\":\"{}\"}}]}}",
        "x".repeat(5000)
    );
    let cases: Vec<(Vec<u8>, u16)> = vec![
        (b"{\"messages\": [".to_vec(), 400),
        (
            b"{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}".to_vec(),
            400,
        ),
        (
            b"{\"messages\":[{\"role\":\"user\",\"content\":1.5}]}".to_vec(),
            400,
        ),
        (b"{\"model\":\"test-model\"}".to_vec(), 400),
        (
            b"{\"model\":\"gpt-9\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}".to_vec(),
            404,
        ),
        (
            b"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":99999999999}"
                .to_vec(),
            400,
        ),
        (
            b"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":\"yes\"}".to_vec(),
            400,
        ),
        (big.into_bytes(), 413),
    ];
    for (body, status) in cases {
        let r = http
            .post(&url)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status().as_u16(),
            status,
            "{}",
            String::from_utf8_lossy(&body)
        );
        let v: serde_json::Value = r.json().await.unwrap();
        assert!(
            v["error"]["message"].is_string() && v["error"]["type"].is_string(),
            "{v}"
        );
        let ok = http
            .post(&url)
            .json(&chat(user("fine"), 4, false))
            .send()
            .await
            .unwrap();
        assert_eq!(ok.status(), 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_engine_triggers_the_hedge_and_the_loser_is_cancelled() {
    let stalled = engine("stalled", "0", &["--fault", "stall_first"]);
    let healthy = engine("healthy", "0", &[]);
    let g = gateway_with_config(
        &[&stalled, &healthy],
        "hedge",
        "policy: {name: round_robin}\nhedge: {enabled: true, percentile: 95, min_samples: 1000, initial_delay_ms: 150}\n",
    )
    .await;
    let http = client();
    for i in 0..4 {
        let started = Instant::now();
        let r = http
            .post(format!("{}/v1/chat/completions", g.url))
            .json(&chat(user(&format!("h{i}")), 4, true))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-kvgate-engine"], "healthy");
        let body = r.text().await.unwrap();
        assert_eq!(sse_data(&body).last().map(String::as_str), Some("[DONE]"));
        assert!(started.elapsed() < Duration::from_secs(5));
    }
    let metrics = get_text(&http, &g.url, "/metrics").await;
    assert!(
        metric(&metrics, "kvgate_hedges_total{reason=\"won\"}").unwrap_or(0.0) >= 2.0,
        "{metrics}"
    );
    // The stalled engine sees its requests cancelled once the hedge wins.
    wait_for(
        &format!("{}/metrics", stalled.url),
        "stalled engine to drop the losers",
        |m| {
            m.lines().any(|l| {
                l.starts_with("vllm:num_requests_running") && l.ends_with(" 0.0")
                    || l.starts_with("vllm:num_requests_running") && l.ends_with(" 0")
            })
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_an_engine_loses_no_request_that_had_no_token_yet() {
    let mut doomed = engine("doomed", "1", &[]);
    let survivor = engine("survivor", "1", &[]);
    let g = gateway(
        &[&doomed, &survivor],
        &["--policy", "round_robin", "--max-attempts", "3"],
    )
    .await;
    let url = format!("{}/v1/chat/completions", g.url);
    let mut tasks = Vec::new();
    for i in 0..40u64 {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(15 * i)).await;
            let http = client();
            let r = http
                .post(&url)
                .json(&chat(user(&format!("k{i}")), 20, true))
                .send()
                .await;
            let Ok(mut r) = r else { return (false, false) };
            if r.status() != 200 {
                return (false, false);
            }
            let mut text = String::new();
            let mut got_token = false;
            while let Ok(Some(chunk)) = r.chunk().await {
                text.push_str(&String::from_utf8_lossy(&chunk));
                got_token |= text.contains("\"content\"");
            }
            (got_token, text.trim_end().ends_with("data: [DONE]"))
        }));
    }
    tokio::time::sleep(Duration::from_millis(250)).await;
    doomed.child.kill().unwrap();
    doomed.child.wait().unwrap();
    let mut completed = 0;
    for t in tasks {
        let (got_token, done) = t.await.unwrap();
        // Only a request that already streamed tokens from the killed engine may fail.
        assert!(done || got_token, "a request without a token was lost");
        completed += usize::from(done);
    }
    // At most the requests streaming from the killed engine at that moment may fail.
    assert!(completed >= 24, "completed {completed} of 40");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_streams() {
    let e = engine("e0", "1", &[]);
    let mut g = gateway(&[&e], &["--shutdown-grace-secs", "20"]).await;
    let url = format!("{}/v1/chat/completions", g.url);
    let mut streams = Vec::new();
    for i in 0..3 {
        let mut r = client()
            .post(&url)
            .json(&chat(user(&format!("s{i}")), 80, true))
            .send()
            .await
            .unwrap();
        let first = r.chunk().await.unwrap().unwrap();
        assert!(!first.is_empty());
        streams.push(r);
    }
    g.terminate();
    // New connections are refused once the listener closes.
    let deadline = Instant::now() + Duration::from_secs(10);
    while client()
        .get(format!("{}/health", g.url))
        .send()
        .await
        .is_ok()
    {
        assert!(Instant::now() < deadline, "still accepting after SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for mut r in streams {
        let mut text = String::new();
        while let Some(chunk) = r.chunk().await.unwrap() {
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
        assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    }
    assert!(g.wait_exit(Duration::from_secs(10)).success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_default_serves_without_endpoints() {
    let g = support::spawn(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--embedded-time-scale",
            "0",
        ],
        "kvgate serve listening on",
    );
    let http = client();
    let models: serde_json::Value = http
        .get(format!("{}/v1/models", g.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], "kvgate-emulated");
    let r = http
        .post(format!("{}/v1/chat/completions", g.url))
        .json(&serde_json::json!({"model": "kvgate-emulated", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// `kvgate bench --records` through the gateway names each request's session and the endpoint
/// the gateway says served it, so a run can be cut by both (docs/routing.md, A lost replica).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_records_name_each_session_and_the_endpoint_that_served_it() {
    let a = engine("a", "0", &[]);
    let b = engine("b", "0", &[]);
    let g = gateway(&[&a, &b], &[]).await;
    let records = std::env::temp_dir().join(format!("kvgate-records-{}.jsonl", std::process::id()));
    let url = g.url.clone();
    let path = records.clone();
    let status = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_kvgate"))
            .args([
                "bench",
                "--url",
                &url,
                "--model",
                "test-model",
                "--workload",
                "agentic",
            ])
            .args([
                "--rate",
                "20",
                "--num-requests",
                "24",
                "--agentic-max-context",
                "2000",
            ])
            .args(["--no-progress", "--quiet", "--seed", "3", "--records"])
            .arg(&path)
            .status()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(status.success());
    let text = std::fs::read_to_string(&records).unwrap();
    let _ = std::fs::remove_file(&records);
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 24, "{text}");
    let names = [&a.url, &b.url].map(|u| u.trim_start_matches("http://").to_string());
    let mut sessions = std::collections::HashSet::new();
    for line in &lines {
        assert!(line["error"].is_null(), "{line}");
        let session = line["session"].as_str().unwrap();
        assert!(session.starts_with("session-"), "{line}");
        sessions.insert(session.to_string());
        let endpoint = line["endpoint"].as_str().unwrap();
        assert!(
            names.iter().any(|n| n == endpoint),
            "{endpoint} not in {names:?}"
        );
    }
    // Sessions of several turns each.
    assert!(sessions.len() > 1 && sessions.len() < 24, "{sessions:?}");
}
