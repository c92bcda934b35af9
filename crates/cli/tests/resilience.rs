//! `kvgate serve` resilience and operations against real `kvgate engine` processes: mid-stream
//! failures, client disconnects, the circuit breaker, the admin API and configuration reload.

mod support;

use std::time::Duration;
use support::{
    chat, client, config_file, engine, gateway, gateway_with_config, get_text, metric, sse_data,
    user, wait_for,
};

async fn running(engine_url: &str) -> Option<f64> {
    let text = client()
        .get(format!("{engine_url}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    metric(&text, "vllm:num_requests_running")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_after_the_first_token_ends_the_stream_with_an_error_event_and_no_retry() {
    let e0 = engine("e0", "0", &["--fault", "disconnect_mid:after=3"]);
    let e1 = engine("e1", "0", &["--fault", "disconnect_mid:after=3"]);
    let g = gateway(&[&e0, &e1], &["--policy", "round_robin"]).await;
    let http = client();
    let r = http
        .post(format!("{}/v1/chat/completions", g.url))
        .json(&chat(user("go"), 20, true))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let events = sse_data(&r.text().await.unwrap());
    let last: serde_json::Value = serde_json::from_str(events.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "upstream_stream_error", "{events:?}");
    assert!(events.len() >= 3, "tokens before the error: {events:?}");
    let metrics = get_text(&http, &g.url, "/metrics").await;
    assert_eq!(metric(&metrics, "kvgate_retries_total"), None, "{metrics}");
    assert!(metrics.contains("outcome=\"stream_error\""), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_disconnect_cancels_the_upstream_request() {
    let e = engine("e0", "1", &[]);
    let g = gateway(&[&e], &[]).await;
    let mut r = client()
        .post(format!("{}/v1/chat/completions", g.url))
        .json(&chat(user("long"), 3000, true))
        .send()
        .await
        .unwrap();
    assert!(!r.chunk().await.unwrap().unwrap().is_empty());
    wait_for(
        &format!("{}/metrics", e.url),
        "the engine to run the request",
        |m| metric(m, "vllm:num_requests_running").unwrap_or(0.0) >= 1.0,
    )
    .await;
    drop(r);
    wait_for(
        &format!("{}/metrics", e.url),
        "the engine to drop the request",
        |m| metric(m, "vllm:num_requests_running") == Some(0.0),
    )
    .await;
    assert_eq!(running(&e.url).await, Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_opens_on_a_failing_engine_and_traffic_stops_going_there() {
    let failing = engine("failing", "0", &["--fault", "500"]);
    let healthy = engine("healthy", "0", &[]);
    let g = gateway_with_config(
        &[&failing, &healthy],
        "breaker",
        "policy: {name: round_robin}\nbreaker: {failure_ratio: 0.5, min_requests: 3, window_ms: 10000, open_ms: 60000}\n",
    )
    .await;
    let http = client();
    for i in 0..20 {
        let r = http
            .post(format!("{}/v1/chat/completions", g.url))
            .json(&chat(user(&format!("b{i}")), 2, false))
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            200,
            "request {i}: the retry goes to the healthy engine"
        );
        // Spread over 3 s: each failure cools the engine down (0.5 s, then 1 s, ...), so only
        // requests that come after a cool-down reach it and feed its breaker.
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let metrics = get_text(&http, &g.url, "/metrics").await;
    let name = failing.url.trim_start_matches("http://");
    assert_eq!(
        metric(
            &metrics,
            &format!("kvgate_breaker_state{{endpoint=\"{name}\"}}")
        ),
        Some(2.0),
        "{metrics}"
    );
    assert_eq!(
        metric(&metrics, "kvgate_retries_total{reason=\"5xx\"}"),
        Some(3.0),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_api_adds_drains_and_removes_endpoints_with_a_token() {
    let (e0, e1) = (engine("e0", "0", &[]), engine("e1", "0", &[]));
    let g = gateway(
        &[&e0],
        &["--admin-token", "s3cret", "--policy", "round_robin"],
    )
    .await;
    let http = client();
    let admin = format!("{}/admin/endpoints", g.url);
    assert_eq!(http.get(&admin).send().await.unwrap().status(), 401);
    assert_eq!(
        http.get(&admin)
            .bearer_auth("wrong")
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    let added = http
        .post(&admin)
        .bearer_auth("s3cret")
        .json(&serde_json::json!({"url": e1.url, "name": "added"}))
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 201);
    let list: serde_json::Value = http
        .get(&admin)
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["endpoints"].as_array().unwrap().len(), 2, "{list}");
    let drain = http
        .post(format!("{admin}/0/drain"))
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(drain.status(), 204);
    for i in 0..4 {
        let r = http
            .post(format!("{}/v1/chat/completions", g.url))
            .json(&chat(user(&format!("a{i}")), 2, false))
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.headers()["x-kvgate-engine"],
            "e1",
            "drained e0 got traffic"
        );
    }
    assert_eq!(
        http.delete(format!("{admin}/0"))
            .bearer_auth("s3cret")
            .send()
            .await
            .unwrap()
            .status(),
        204
    );
    assert_eq!(
        http.delete(format!("{admin}/0"))
            .bearer_auth("s3cret")
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_config_file_is_applied_without_dropping_traffic() {
    let (e0, e1) = (engine("e0", "0", &[]), engine("e1", "0", &[]));
    let config = config_file(
        "reload",
        &format!(
            "policy: {{name: round_robin}}\nendpoints:\n  - url: {}\n",
            e0.url
        ),
    );
    let g = gateway(&[], &["--config", config.to_str().unwrap()]).await;
    let url = format!("{}/v1/chat/completions", g.url);
    // Traffic keeps flowing while the file changes to the other engine.
    let traffic = tokio::spawn({
        let url = url.clone();
        async move {
            let http = client();
            let mut served = Vec::new();
            for i in 0..300 {
                let r = http
                    .post(&url)
                    .json(&chat(user(&format!("r{i}")), 2, false))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200, "request {i} failed during reload");
                served.push(r.headers()["x-kvgate-engine"].to_str().unwrap().to_string());
                if served.len() > 20 && served.iter().rev().take(20).all(|s| s == "e1") {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            served
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    std::fs::write(
        &config,
        format!(
            "policy: {{name: least_outstanding}}\nendpoints:\n  - url: {}\n",
            e1.url
        ),
    )
    .unwrap();
    let served = traffic.await.unwrap();
    assert_eq!(served.first().map(String::as_str), Some("e0"));
    assert_eq!(served.last().map(String::as_str), Some("e1"), "{served:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_token_timeout_retries_a_stalled_attempt_elsewhere() {
    let stalled = engine("stalled", "0", &["--fault", "stall_first"]);
    let healthy = engine("healthy", "0", &[]);
    let g = gateway_with_config(
        &[&stalled, &healthy],
        "ttft-timeout",
        "policy: {name: round_robin}\nretry: {first_token_timeout_ms: 1000}\n",
    )
    .await;
    let http = client();
    for i in 0..2 {
        let r = http
            .post(format!("{}/v1/chat/completions", g.url))
            .json(&chat(user(&format!("t{i}")), 2, true))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-kvgate-engine"], "healthy");
        assert!(r.text().await.unwrap().contains("[DONE]"));
    }
    // Round robin offers the first request to the stalled engine; its timeout cools the engine
    // down, so the second usually goes straight to the healthy one. The exact count is checked
    // on paused time in kvgate-gateway's `tests/outcomes.rs`.
    let metrics = get_text(&http, &g.url, "/metrics").await;
    assert!(!metrics.contains("outcome=\"cancelled\""), "{metrics}");
    assert!(
        metric(&metrics, "kvgate_retries_total{reason=\"timeout\"}").is_some_and(|n| n >= 1.0),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_gateway_answers_429_and_a_queued_request_past_its_deadline_504() {
    let e = engine("e0", "1", &[]);
    let g = gateway(&[&e], &["--max-concurrency", "1", "--max-queue", "1"]).await;
    let url = format!("{}/v1/chat/completions", g.url);
    let mut holder = client()
        .post(&url)
        .json(&chat(user("hold"), 3000, true))
        .send()
        .await
        .unwrap();
    assert!(!holder.chunk().await.unwrap().unwrap().is_empty());
    let queued = tokio::spawn({
        let url = url.clone();
        async move {
            client()
                .post(&url)
                .header("x-kvgate-deadline-ms", "300")
                .json(&chat(user("late"), 2, false))
                .send()
                .await
                .unwrap()
        }
    });
    wait_for(&format!("{}/metrics", g.url), "a queued request", |m| {
        metric(m, "kvgate_queue_depth") == Some(1.0)
    })
    .await;
    let full = client()
        .post(&url)
        .json(&chat(user("full"), 2, false))
        .send()
        .await
        .unwrap();
    assert_eq!(full.status(), 429);
    assert_eq!(full.headers()["retry-after"], "1");
    let queued = queued.await.unwrap();
    assert_eq!(queued.status(), 504);
    let v: serde_json::Value = queued.json().await.unwrap();
    assert_eq!(v["error"]["code"], "deadline_exceeded");
    drop(holder.chunk().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_whose_health_check_fails_gets_no_traffic() {
    let draining = engine("draining", "0", &["--fault", "drain"]);
    let healthy = engine("healthy", "0", &[]);
    let g = gateway(&[&draining, &healthy], &["--policy", "round_robin"]).await;
    let name = draining.url.trim_start_matches("http://").to_string();
    wait_for(
        &format!("{}/metrics", g.url),
        "the draining engine to leave routing",
        |m| metric(m, &format!("kvgate_endpoint_up{{endpoint=\"{name}\"}}")) == Some(0.0),
    )
    .await;
    let http = client();
    for i in 0..6 {
        let r = http
            .post(format!("{}/v1/chat/completions", g.url))
            .json(&chat(user(&format!("d{i}")), 2, false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.headers()["x-kvgate-engine"], "healthy");
    }
    let metrics = get_text(&http, &g.url, "/metrics").await;
    assert!(!metrics.contains("kvgate_retries_total{"), "{metrics}");
}
