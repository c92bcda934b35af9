//! What `kvgate serve` tells an operator about each request: the access log, the decision records
//! at `/admin/decisions` and the `x-kvgate-explain` header, against real `kvgate engine` processes.

mod support;

use futures_util::StreamExt;
use serde_json::Value;
use std::collections::HashSet;
use std::time::{Duration, Instant};
use support::{admin_json, chat, client, engine, gateway, gateway_with_config, header};

const TOKEN: &str = "observability-token";

/// A system prompt long enough that a repeat is matched far beyond `cache_aware`'s threshold.
fn system_prompt() -> String {
    (0..120)
        .map(|i| format!("Rule {i}: answer briefly and cite the handbook section."))
        .collect::<Vec<_>>()
        .join(" ")
}

async fn decisions(base: &str, request: &str) -> Value {
    admin_json(base, &format!("/admin/decisions?request={request}"), TOKEN).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_conversation_is_recorded_as_affinity_with_its_matched_tokens() {
    let (a, b) = (engine("a", "0", &[]), engine("b", "0", &[]));
    let g = gateway(
        &[&a, &b],
        &["--policy", "cache_aware", "--admin-token", TOKEN],
    )
    .await;
    let http = client();
    let system = system_prompt();
    let first = serde_json::json!([
        {"role": "system", "content": system},
        {"role": "user", "content": "What is rule 3?"},
    ]);
    let second = serde_json::json!([
        {"role": "system", "content": system},
        {"role": "user", "content": "What is rule 3?"},
        {"role": "assistant", "content": "Answer briefly."},
        {"role": "user", "content": "And rule 4?"},
    ]);
    let mut ids = Vec::new();
    let mut served = Vec::new();
    for messages in [first, second] {
        let r = http
            .post(format!("{}/v1/chat/completions", g.url))
            .header("x-kvgate-explain", "1")
            .json(&chat(messages, 4, false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        ids.push(header(&r, "x-kvgate-request-id"));
        served.push(header(&r, "x-kvgate-endpoint"));
        let explain = header(&r, "x-kvgate-explain");
        assert!(explain.contains("candidates:"), "{explain}");
        r.bytes().await.unwrap();
    }
    assert_eq!(served[0], served[1], "the repeat stays where its prefix is");
    let first = decisions(&g.url, &ids[0]).await;
    assert_eq!(first["policy"], "cache_aware");
    let d = &first["decisions"][0];
    assert_eq!(d["label"], "miss", "{d}");
    assert_eq!(d["candidates"].as_array().unwrap().len(), 2, "{d}");
    let second = decisions(&g.url, &ids[1]).await;
    let d = &second["decisions"][0];
    assert_eq!(d["label"], "affinity", "{d}");
    assert_eq!(d["endpoint"], served[1].as_str());
    let winner = &d["candidates"][0];
    assert_eq!(winner["chosen"], true);
    assert_eq!(winner["endpoint"], served[1].as_str());
    let matched = winner["matched_tokens"].as_u64().unwrap();
    let prompt = d["prompt_tokens"].as_u64().unwrap();
    assert!(
        matched * 10 >= prompt * 8 && matched <= prompt,
        "matched {matched} of {prompt}: {d}"
    );
    assert_eq!(d["candidates"][1]["matched_tokens"], 0, "{d}");
    assert!(d["why"].as_str().unwrap().starts_with("prefix affinity"));
    // Without a token the records are not served.
    let r = http
        .get(format!("{}/admin/decisions", g.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_imbalance_escape_is_recorded_as_an_escape() {
    // Real time, so the first stream is still running when the second request is picked;
    // thresholds that call any difference in load an imbalance.
    let (a, b) = (engine("a", "1", &[]), engine("b", "1", &[]));
    let yaml = format!(
        "policy:\n  name: cache_aware\n  balance_abs_threshold: 0\n  balance_rel_threshold: 1.0\nadmin_token: {TOKEN}\n"
    );
    let g = gateway_with_config(&[&a, &b], "escape", &yaml).await;
    let http = client();
    let system = system_prompt();
    let messages = serde_json::json!([
        {"role": "system", "content": system},
        {"role": "user", "content": "Summarise the rules."},
    ]);
    let long = http
        .post(format!("{}/v1/chat/completions", g.url))
        .json(&chat(messages.clone(), 400, true))
        .send()
        .await
        .unwrap();
    assert_eq!(long.status(), 200);
    let busy = header(&long, "x-kvgate-endpoint");
    let mut stream = long.bytes_stream();
    stream.next().await.unwrap().unwrap();
    // A scrape sent between the dispatch and the engine's admission of the request reads an
    // idle engine; wait until one sees it running, so the load the policy reads is settled.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = admin_json(&g.url, "/admin/endpoints", TOKEN).await;
        let running = status["endpoints"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == busy.as_str())
            .and_then(|e| e["observation"]["running"].as_u64());
        if running == Some(1) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the busy engine never reported running: {status}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The same prompt again: its prefix is on the busy endpoint, but the load differs.
    let r = http
        .post(format!("{}/v1/chat/completions", g.url))
        .json(&chat(messages, 2, false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let id = header(&r, "x-kvgate-request-id");
    let elsewhere = header(&r, "x-kvgate-endpoint");
    let d = &decisions(&g.url, &id).await["decisions"][0];
    assert_ne!(elsewhere, busy, "{d}");
    assert_eq!(d["label"], "escape", "{d}");
    assert_eq!(d["reason"]["max_load"], 1.0, "{d}");
    assert_eq!(d["reason"]["min_load"], 0.0, "{d}");
    let busy_candidate = d["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["endpoint"] == busy.as_str())
        .unwrap();
    assert_eq!(busy_candidate["in_flight"], 1, "{d}");
    assert!(
        busy_candidate["matched_tokens"].as_u64().unwrap() > 0,
        "{d}"
    );
    drop(stream);
}

/// Reads the access log until it has `n` lines, failing after 20 s.
fn read_lines(path: &std::path::Path, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let complete: Vec<&str> = text
            .split_inclusive('\n')
            .filter(|l| l.ends_with('\n'))
            .collect();
        if complete.len() >= n {
            return complete
                .iter()
                .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
                .collect();
        }
        assert!(
            Instant::now() < deadline,
            "{} of {n} access-log lines",
            complete.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_has_one_json_line_per_request_under_load() {
    let (a, b) = (engine("a", "0", &[]), engine("b", "0", &[]));
    let dir = std::env::temp_dir().join(format!("kvgate-access-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("access.log");
    let _ = std::fs::remove_file(&path);
    let g = gateway(&[&a, &b], &["--access-log", path.to_str().unwrap()]).await;
    let http = client();
    let url = format!("{}/v1/chat/completions", g.url);
    const N: usize = 1000;
    let results: Vec<(u16, String)> = futures_util::stream::iter(0..N)
        .map(|i| {
            let (http, url) = (http.clone(), url.clone());
            async move {
                let mut body = chat(support::user(&format!("question {i}")), 3, i % 2 == 0);
                if i % 100 == 99 {
                    body = serde_json::json!({"messages": "not a list"});
                }
                let r = http
                    .post(&url)
                    .header("x-request-id", format!("client-{i}"))
                    .header("x-session-id", format!("session-{}", i % 7))
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                let status = r.status().as_u16();
                let id = header(&r, "x-kvgate-request-id");
                r.bytes().await.unwrap();
                (status, id)
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let lines = read_lines(&path, N);
    assert_eq!(lines.len(), N, "one line per request, no more");
    let ids: HashSet<String> = lines.iter().map(|l| l["request_id"].to_string()).collect();
    let sent: HashSet<String> = results.iter().map(|(_, id)| id.clone()).collect();
    assert_eq!(ids, sent);
    for l in &lines {
        let i: usize = l["client_request_id"].as_str().unwrap()["client-".len()..]
            .parse()
            .unwrap();
        if i % 100 == 99 {
            assert_eq!(
                (l["outcome"].as_str(), l["status"].as_u64()),
                (Some("client_error"), Some(400)),
                "{l}"
            );
            assert!(
                l.get("endpoint").is_none() && l.get("ttft_ms").is_none(),
                "{l}"
            );
            continue;
        }
        assert_eq!(l["outcome"], "ok", "{l}");
        assert_eq!(l["status"], 200, "{l}");
        assert_eq!(l["attempts"], 1, "{l}");
        assert_eq!(l["session"], format!("session-{}", i % 7), "{l}");
        assert_eq!(l["model"], "test-model", "{l}");
        assert_eq!(l["output_tokens"], 3, "{l}");
        assert!(l["prompt_tokens"].as_u64().unwrap() > 0, "{l}");
        assert!(l["reason"].is_string() && l["why"].is_string(), "{l}");
        assert!(
            l["endpoint"].is_string() && l["queue_ms"].is_number(),
            "{l}"
        );
        let e2e = l["e2e_ms"].as_f64().unwrap();
        if i % 2 == 0 {
            let ttft = l["ttft_ms"].as_f64().unwrap();
            assert!(ttft <= e2e && l["tpot_ms"].is_number(), "{l}");
        } else {
            assert!(l.get("ttft_ms").is_none(), "no TTFT without a stream: {l}");
        }
    }
    drop(g);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The metric names a PromQL expression reads (`kvgate_...` words).
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("kvgate_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_is_grafana_json_over_metrics_the_gateway_exports() {
    let dashboard: Value =
        serde_json::from_str(include_str!("../../../docs/grafana-dashboard.json"))
            .expect("valid JSON");
    // The fields Grafana's dashboard model requires, and sane panels.
    assert!(dashboard["title"].is_string() && dashboard["uid"].is_string());
    assert!(dashboard["schemaVersion"].as_u64().unwrap() >= 36);
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 12);
    let mut ids = HashSet::new();
    let mut wanted = HashSet::new();
    for p in panels {
        assert!(
            ids.insert(p["id"].as_u64().unwrap()),
            "duplicate panel id: {p}"
        );
        assert!(["timeseries", "stat", "gauge", "table"].contains(&p["type"].as_str().unwrap()));
        let grid = &p["gridPos"];
        assert!(
            grid["w"].as_u64().unwrap() <= 24
                && grid["x"].as_u64().unwrap() + grid["w"].as_u64().unwrap() <= 24,
            "{p}"
        );
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{p}");
        for t in targets {
            let expr = t["expr"].as_str().unwrap();
            assert!(t["refId"].is_string(), "{t}");
            assert_eq!(
                expr.matches('(').count(),
                expr.matches(')').count(),
                "{expr}"
            );
            wanted.extend(metric_names(expr));
        }
    }
    // Every series it queries is exported, with the suffix its type gives it.
    let (a, b) = (engine("a", "0", &[]), engine("b", "0", &[]));
    let g = gateway(&[&a, &b], &["--access-log", "off"]).await;
    let http = client();
    for stream in [true, false] {
        let r = http
            .post(format!("{}/v1/chat/completions", g.url))
            .json(&chat(support::user("hello there"), 3, stream))
            .send()
            .await
            .unwrap();
        r.bytes().await.unwrap();
    }
    let text = support::get_text(&http, &g.url, "/metrics").await;
    let types: std::collections::HashMap<&str, &str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .collect();
    for name in &wanted {
        let (base, kind) = [("_total", "counter"), ("_bucket", "histogram")]
            .iter()
            .find_map(|(suffix, kind)| name.strip_suffix(suffix).map(|b| (b, *kind)))
            .unwrap_or((name.as_str(), "gauge"));
        assert_eq!(
            types.get(base),
            Some(&kind),
            "{name} is not exported as a {kind}"
        );
    }
    assert!(wanted.len() >= 20, "{wanted:?}");
}

/// The gateway reads each engine's iteration time off the chunks of the streams it relays (the
/// phase `predicted_ttft` adds to its predictions): what it reports matches the gaps a client
/// sees between the chunks of a stream, and the gauge exports it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_iteration_time_read_off_streams_matches_the_gaps_between_chunks() {
    let a = engine("a", "1", &[]);
    let g = gateway(&[&a], &["--admin-token", TOKEN]).await;
    let status = || async { admin_json(&g.url, "/admin/endpoints", TOKEN).await };
    assert!(
        status().await["endpoints"][0].get("iteration_ms").is_none(),
        "nothing streamed yet"
    );
    let r = client()
        .post(format!("{}/v1/chat/completions", g.url))
        .json(&chat(support::user("Count to forty, slowly."), 40, true))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut arrivals = Vec::new();
    let mut body = r.bytes_stream();
    while let Some(chunk) = body.next().await {
        chunk.unwrap();
        arrivals.push(Instant::now());
    }
    let mut gaps: Vec<f64> = arrivals
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64() * 1e3)
        .filter(|&ms| ms > 1.0)
        .collect();
    assert!(gaps.len() >= 20, "{} separate chunks", gaps.len());
    gaps.sort_by(f64::total_cmp);
    let median = gaps[gaps.len() / 2];
    let learned = status().await["endpoints"][0]["iteration_ms"]
        .as_f64()
        .expect("learned from the stream");
    assert!(
        learned > 0.6 * median && learned < 1.6 * median,
        "learned {learned:.2} ms against a median gap of {median:.2} ms"
    );
    let metrics = support::get_text(&client(), &g.url, "/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("kvgate_endpoint_iteration_seconds{")),
        "{metrics}"
    );
}
