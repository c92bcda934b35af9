//! How upstream outcomes (slow answers, client errors, Retry-After, deadlines) reach the client,
//! against a loopback upstream whose every answer the test scripts.

mod common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use kvgate_gateway::{Config, EndpointConfig, Gateway};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt;

/// One scripted answer.
#[derive(Clone, Debug)]
struct Answer {
    status: u16,
    delay: Duration,
    retry_after: Option<&'static str>,
    body: &'static str,
}

impl Answer {
    fn ok(delay: Duration) -> Self {
        Answer {
            status: 200,
            delay,
            retry_after: None,
            body: r#"{"choices":[{"message":{"content":"hi"}}]}"#,
        }
    }
}

/// An upstream answering its n-th request (0-based) with `script(n)`; returns its URL and a
/// counter of the requests it received.
async fn upstream(
    script: impl Fn(usize) -> Answer + Send + Sync + 'static,
) -> (String, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    let script = Arc::new(script);
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move || {
            let n = counter.fetch_add(1, Ordering::SeqCst);
            let answer = script(n);
            async move {
                tokio::time::sleep(answer.delay).await;
                let mut response = axum::response::Response::builder()
                    .status(answer.status)
                    .header("content-type", "application/json");
                if let Some(v) = answer.retry_after {
                    response = response.header("retry-after", v);
                }
                response.body(Body::from(answer.body)).unwrap()
            }
        }),
    );
    let url = common::serve(app).await;
    (url, hits)
}

fn gateway(urls: &[&str], edit: impl FnOnce(&mut Config)) -> Gateway {
    let mut config = Config {
        endpoints: urls.iter().map(|u| EndpointConfig::from_url(*u)).collect(),
        ..Config::default()
    };
    config.retry.backoff.base_ms = 1;
    config.retry.backoff.cap_ms = 1;
    edit(&mut config);
    Gateway::with_seed(config, 1).unwrap()
}

async fn chat(gateway: &Gateway, stream: bool) -> (StatusCode, axum::http::HeaderMap, String) {
    chat_with(gateway, stream, &[]).await
}

async fn chat_with(
    gateway: &Gateway,
    stream: bool,
    headers: &[(&str, &str)],
) -> (StatusCode, axum::http::HeaderMap, String) {
    let body = format!(r#"{{"stream":{stream},"messages":[{{"role":"user","content":"x"}}]}}"#);
    let mut request =
        Request::post("/v1/chat/completions").header("content-type", "application/json");
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let response = gateway
        .router()
        .oneshot(request.body(Body::from(body)).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_token_timeout_spares_non_streaming_requests() {
    let (url, hits) = upstream(|_| Answer::ok(Duration::from_millis(300))).await;
    let g = gateway(&[&url], |c| {
        c.retry.first_token_timeout_ms = 100;
        c.retry.max_attempts = 1;
    });
    let (status, _, body) = chat(&g, false).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a whole answer takes as long as it takes: {body}"
    );
    let (status, _, _) = chat(&g, true).await;
    assert_ne!(
        status,
        StatusCode::OK,
        "a stream without first bytes in time fails"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_retry_once_the_clients_deadline_has_passed() {
    let (url, hits) = upstream(|_| Answer {
        status: 500,
        delay: Duration::from_millis(150),
        retry_after: None,
        body: "{}",
    })
    .await;
    let g = gateway(&[&url], |c| c.retry.max_attempts = 3);
    let (status, _, body) = chat_with(&g, false, &[("x-kvgate-deadline-ms", "100")]).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
    assert!(body.contains("deadline_exceeded"), "{body}");
    assert_eq!(
        hits.load(Ordering::SeqCst),
        1,
        "no retry after the deadline"
    );
    let (status, _, _) = chat(&g, false).await;
    assert_eq!(
        status.as_u16(),
        500,
        "without a deadline every attempt is made"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 4);
}

/// Sends requests until the upstream has seen `n` in all (an endpoint inside a Retry-After window
/// is not asked), within five seconds.
async fn until_upstream_saw(g: &Gateway, hits: &AtomicUsize, n: usize) {
    let give_up = tokio::time::Instant::now() + Duration::from_secs(5);
    while hits.load(Ordering::SeqCst) < n {
        assert!(
            tokio::time::Instant::now() < give_up,
            "the upstream was never asked again"
        );
        let _ = chat(g, false).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_that_found_no_endpoint_goes_back_into_the_budget() {
    let (url, hits) = upstream(|_| Answer {
        status: 503,
        delay: Duration::ZERO,
        retry_after: Some("0.2"),
        body: "{}",
    })
    .await;
    let g = gateway(&[&url], |c| {
        // Exactly one retry in the budget's window.
        c.retry.budget.ratio = 0.0;
        c.retry.budget.min_per_sec = 0.1;
        c.retry.budget.window_ms = 10_000;
    });
    // Each request: a 503 with Retry-After takes the only endpoint out, so its retry finds none.
    until_upstream_saw(&g, &hits, 1).await;
    until_upstream_saw(&g, &hits, 2).await;
    let text = g.metrics_text();
    assert!(
        text.contains("kvgate_retries_total{reason=\"5xx\"} 2"),
        "both requests withdrew their retry from the budget (the second only because the first \
         was refunded): {text}"
    );
    assert!(
        !text.contains("kvgate_retries_denied_total{reason=\"budget\"}"),
        "the unsent retry was not refunded: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_refusing_with_404_trips_its_breaker_but_a_bad_request_does_not() {
    let (missing, _) = upstream(|_| Answer {
        status: 404,
        delay: Duration::ZERO,
        retry_after: None,
        body: r#"{"error":{"message":"no such model","type":"x","code":"x"}}"#,
    })
    .await;
    let (picky, _) = upstream(|_| Answer {
        status: 400,
        delay: Duration::ZERO,
        retry_after: None,
        body: r#"{"error":{"message":"bad","type":"x","code":"x"}}"#,
    })
    .await;
    for (url, status) in [(missing, 404), (picky, 400)] {
        let g = gateway(&[&url], |c| c.breaker.min_requests = 2);
        for _ in 0..2 {
            let (got, _, body) = chat(&g, true).await;
            assert_eq!(got.as_u16(), status, "passed through unchanged: {body}");
            assert!(body.contains("\"error\""), "{body}");
        }
        let (got, _, body) = chat(&g, true).await;
        let expected = if status == 404 { 503 } else { 400 };
        assert_eq!(got.as_u16(), expected, "after two {status}s: {body}");
        let text = g.metrics_text();
        assert!(!text.contains("kvgate_ttft_seconds_count"), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inside_a_retry_after_window_the_503_says_when_and_the_gateway_stays_ready() {
    let (url, hits) = upstream(|_| Answer {
        status: 503,
        delay: Duration::ZERO,
        retry_after: Some("30"),
        body: "{}",
    })
    .await;
    let g = gateway(&[&url], |_| {});
    let (status, headers, _) = chat(&g, false).await;
    assert_eq!(status.as_u16(), 503);
    assert_eq!(headers["retry-after"], "30", "the engine's own answer");
    let (status, headers, body) = chat(&g, false).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("no_endpoint"), "{body}");
    let secs: u64 = headers
        .get("retry-after")
        .expect("a 503 for an endpoint in a Retry-After window says when to come back")
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((29..=30).contains(&secs), "{secs}");
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    let ready = g
        .router()
        .oneshot(Request::get("/ready").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(
        ready.status(),
        StatusCode::OK,
        "a Retry-After window is no reason to be unready"
    );
}

/// The `kvgate_ttft_seconds_sum` of the metrics text.
fn ttft_sum(text: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with("kvgate_ttft_seconds_sum"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no TTFT in {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retrys_ttft_starts_after_its_backoff() {
    let arrivals = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = arrivals.clone();
    let (url, _) = upstream(move |n| {
        seen.lock().unwrap().push(std::time::Instant::now());
        if n == 0 {
            Answer {
                status: 500,
                delay: Duration::ZERO,
                retry_after: None,
                body: "{}",
            }
        } else {
            Answer::ok(Duration::ZERO)
        }
    })
    .await;
    let g = gateway(&[&url], |c| {
        c.retry.backoff.base_ms = 400;
        c.retry.backoff.cap_ms = 400;
    });
    let (status, _, body) = chat(&g, true).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let arrivals = arrivals.lock().unwrap().clone();
    let backoff = arrivals[1].duration_since(arrivals[0]).as_secs_f64();
    // The seeded draw; the check below means nothing when the backoff is too short to see.
    assert!(backoff > 0.1, "backoff {backoff}");
    let ttft = ttft_sum(&g.metrics_text());
    assert!(
        ttft < backoff / 2.0,
        "TTFT {ttft} s includes the {backoff} s backoff"
    );
}

/// On paused tokio time (every timer fires exactly when the timeline says, however busy the
/// machine), a stalled first attempt times out and is retried on the other endpoint.
#[tokio::test(start_paused = true)]
async fn a_first_token_timeout_retries_a_stalled_attempt_elsewhere() {
    let (stalled, stalled_hits) = upstream(|_| Answer::ok(Duration::from_secs(3_600))).await;
    let (healthy, healthy_hits) = upstream(|_| Answer::ok(Duration::ZERO)).await;
    let g = gateway(&[&stalled, &healthy], |c| {
        c.set_policy("round_robin").unwrap();
        c.retry.first_token_timeout_ms = 200;
    });
    let healthy_name = healthy.trim_start_matches("http://");
    for _ in 0..2 {
        let (status, headers, body) = chat(&g, true).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(headers["x-kvgate-endpoint"], healthy_name);
    }
    // Round robin offers the first request to the stalled endpoint; its timeout cools the
    // endpoint down, so the second goes straight to the healthy one.
    assert_eq!(stalled_hits.load(Ordering::SeqCst), 1);
    assert_eq!(healthy_hits.load(Ordering::SeqCst), 2);
    let text = g.metrics_text();
    assert!(
        text.contains("kvgate_retries_total{reason=\"timeout\"} 1"),
        "{text}"
    );
    assert!(!text.contains("outcome=\"cancelled\""), "{text}");
}

/// A streaming request takes the pool's lock three times (pick, first token, end): readers
/// (metrics labels, model check, readiness) use the lock-free snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_request_takes_the_pool_lock_at_most_three_times() {
    let (url, _) = upstream(|_| Answer::ok(Duration::ZERO)).await;
    for policy in ["round_robin", "cache_aware", "kv_cost"] {
        let g = gateway(&[&url], |c| c.set_policy(policy).unwrap());
        let (status, _, _) = chat(&g, true).await; // warm the upstream connection
        assert_eq!(status, StatusCode::OK);
        let before = g.pool_lock_acquisitions();
        let (status, _, body) = chat(&g, true).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let taken = g.pool_lock_acquisitions() - before;
        assert!(
            taken <= 3,
            "{policy}: the pool lock was taken {taken} times"
        );
    }
}

/// An upstream that streams a whole answer, `[DONE]` included, and then keeps the body open (as
/// a server may before its end of body), answering every request so.
async fn lingering_stream() -> String {
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(|| async {
            let events = [
                "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n",
                "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":1,\"total_tokens\":8,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\n",
                "data: [DONE]\n\n",
            ];
            let whole = futures_util::stream::iter(
                events.map(|e| Ok::<_, std::io::Error>(bytes::Bytes::from(e))),
            );
            let stream = futures_util::StreamExt::chain(whole, futures_util::stream::pending());
            axum::response::Response::builder()
                .header("content-type", "text/event-stream")
                .body(Body::from_stream(stream))
                .unwrap()
        }),
    );
    common::serve(app).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_at_done_had_a_whole_answer_not_a_cancelled_one() {
    let url = lingering_stream().await;
    let g = gateway(&[&url], |_| {});
    let body = r#"{"stream":true,"messages":[{"role":"user","content":"x"}]}"#;
    let response = g
        .router()
        .oneshot(
            Request::post("/v1/chat/completions")
                .header("content-type", "application/json")
                .body(Body::from(body))
                .unwrap(),
        )
        .await
        .unwrap();
    let mut body = response.into_body();
    let mut seen = String::new();
    while !seen.contains("[DONE]") {
        let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .expect("the answer arrives")
            .unwrap()
            .unwrap();
        if let Ok(data) = frame.into_data() {
            seen.push_str(&String::from_utf8_lossy(&data));
        }
    }
    // The client leaves as the OpenAI SDK does once it read `[DONE]`.
    drop(body);
    let metrics = g.metrics_text();
    let outcome = |o: &str| {
        metrics.lines().any(|l| {
            l.starts_with("kvgate_requests_total{") && l.contains(&format!("outcome=\"{o}\""))
        })
    };
    assert!(outcome("ok") && !outcome("cancelled"), "{metrics}");
    assert!(
        metrics.contains("kvgate_cache_prediction_total{result=\"exact\"} 1"),
        "the usage reached the cache's scoring: {metrics}"
    );
}
