//! An endpoint that cannot serve says why, in the three places an operator looks: one warning
//! in the log when it turns unhealthy, its `reason` in `/admin/endpoints` (and `/ui/state`),
//! and the message of the 503 a request gets when nothing can take it. One test per cause, each
//! against a real upstream failing that way: nothing listening, a listener that never answers,
//! a certificate rustls refuses (a CA used as a leaf; an unknown issuer), an engine whose
//! `/health` says it is draining; then the other reasons a 503 gives (cooling down after a
//! Retry-After, at the endpoint's limits) and the 404 of a model served nowhere.

mod support;

use serde_json::{json, Value};
use std::time::{Duration, Instant};
use support::*;

/// `kvgate serve` with `endpoints` (YAML list items) and fast health checks, its log kept.
fn front(name: &str, endpoints: &str) -> (Proc, Log) {
    front_with_timeout(name, endpoints, 300)
}

/// [`front`] with scrapes that time out after `timeout_ms`.
fn front_with_timeout(name: &str, endpoints: &str, timeout_ms: u64) -> (Proc, Log) {
    let yaml = format!(
        "admin_token: t\nscrape: {{interval_ms: 100, timeout_ms: {timeout_ms}, unhealthy_after: 2}}\n\
         retry: {{max_attempts: 1}}\nendpoints:\n{endpoints}"
    );
    let path = config_file(name, &yaml);
    spawn_logged(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--access-log",
            "off",
            "--config",
            path.to_str().unwrap(),
        ],
        "kvgate serve listening on",
    )
}

/// The first endpoint's `field` in `/admin/endpoints`, once it has one (20 s at most); the
/// live page's state must carry the same.
async fn endpoint_field(base: &str, field: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let listed = admin_json(base, "/admin/endpoints", "t").await;
        if let Some(text) = listed["endpoints"][0][field].as_str() {
            let ui = admin_json(base, "/ui/state", "t").await;
            assert_eq!(ui["endpoints"][0][field].as_str(), Some(text), "{ui}");
            return text.to_owned();
        }
        assert!(Instant::now() < deadline, "no {field} in time: {listed}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A chat request: its status, error message and Retry-After.
async fn ask(base: &str, model: &str) -> (u16, String, Option<String>) {
    let mut body = chat(user("hello"), 4, false);
    body["model"] = json!(model);
    let r = client()
        .post(format!("{base}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let retry_after = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let body: Value = r.json().await.unwrap_or_default();
    let message = body["error"]["message"]
        .as_str()
        .map_or_else(|| body.to_string(), str::to_owned);
    (status, message, retry_after)
}

/// The three places agree on an endpoint down for `cause`, whose text contains `says`.
async fn down_for(name: &str, endpoint: &str, cause: &str, says: &str) {
    down_after(front(name, endpoint), cause, says).await;
}

/// [`down_for`] on a front already started.
async fn down_after((front, log): (Proc, Log), cause: &str, says: &str) {
    let line = log.wait_for(&["WARN", "endpoint unhealthy", says]);
    assert!(line.contains(&format!("cause={cause}")), "{line}");
    let reason = endpoint_field(&front.url, "reason").await;
    assert!(
        reason.starts_with("down: ") && reason.contains(says),
        "{reason}"
    );
    let (status, message, retry_after) = ask(&front.url, "test-model").await;
    assert_eq!(status, 503, "{message}");
    assert!(
        message.contains("the only endpoint serving `test-model`, up, is down: ")
            && message.contains(says),
        "{message}"
    );
    assert!(retry_after.is_some(), "a 503 says when to come back");
    assert_eq!(log.count("endpoint unhealthy"), 1, "warned once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_listening_is_a_refused_connection() {
    let at = format!("127.0.0.1:{}", free_port());
    let endpoint = format!("  - {{url: \"http://{at}\", name: up, model: test-model}}\n");
    let says = format!("connection refused at {at}: is the engine running");
    down_for("refused", &endpoint, "refused", &says).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_name_that_does_not_resolve_is_named() {
    // `.invalid` never resolves (RFC 6761); the long timeout keeps a slow resolver's failure
    // from reading as a timeout.
    let endpoint = "  - {url: \"http://no-such-host.invalid:8000\", name: up, model: test-model}\n";
    let front = front_with_timeout("dns", endpoint, 5_000);
    let says = "cannot resolve the host name no-such-host.invalid";
    down_after(front, "dns", says).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_that_never_answers_is_a_timeout() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let at = listener.local_addr().unwrap();
    // Accepts, reads nothing, answers nothing; holds every connection open.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            held.push(stream);
        }
    });
    let endpoint = format!("  - {{url: \"http://{at}\", name: up, model: test-model}}\n");
    down_for("timeout", &endpoint, "timeout", "no answer within 300 ms").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_whose_health_says_draining_is_down_for_that() {
    let engine = engine("drained", "0", &["--fault", "drain"]);
    let endpoint = format!(
        "  - {{url: \"{}\", name: up, model: test-model}}\n",
        engine.url
    );
    down_for("drained", &endpoint, "reports", "its /health answered 503").await;
}

/// A `kvgate serve` over TLS in front of an engine: its URL and the path of its certificate,
/// which is either self-signed with `basicConstraints CA:TRUE` (what `openssl req -x509`
/// makes, `self_signed_ca`) or a leaf signed by a private CA.
fn tls_upstream(name: &str, engine: &Proc, self_signed_ca: bool) -> (Proc, std::path::PathBuf) {
    let (cert, key) = if self_signed_ca {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        (params.self_signed(&key).unwrap().pem(), key.serialize_pem())
    } else {
        let (cert, key, _) = Pki::new().issue(&["127.0.0.1"], false);
        (cert, key)
    };
    let dir = config_file(&format!("{name}-tls"), "")
        .parent()
        .unwrap()
        .to_path_buf();
    let (cert_path, key_path) = (dir.join("server.pem"), dir.join("server.key"));
    std::fs::write(&cert_path, cert).unwrap();
    std::fs::write(&key_path, key).unwrap();
    let upstream = spawn(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--access-log",
            "off",
            "--endpoint",
            &engine.url,
            "--tls-cert",
            cert_path.to_str().unwrap(),
            "--tls-key",
            key_path.to_str().unwrap(),
        ],
        "kvgate serve listening on",
    );
    (upstream, cert_path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_self_signed_ca_certificate_is_refused_with_the_fix() {
    let engine = engine("behind-tls", "0", &[]);
    let (upstream, cert) = tls_upstream("ca-leaf", &engine, true);
    let endpoint = format!(
        "  - {{url: \"{}\", name: up, model: test-model, ca_file: \"{}\"}}\n",
        upstream.url,
        cert.display()
    );
    down_for(
        "ca-leaf",
        &endpoint,
        "tls",
        "TLS: the server's certificate is a CA certificate used as a leaf: issue a leaf \
         certificate from your CA for the server, and set the endpoint's ca_file to the CA",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_from_an_unknown_ca_names_ca_file() {
    let engine = engine("behind-tls", "0", &[]);
    let (upstream, _) = tls_upstream("unknown-ca", &engine, false);
    let endpoint = format!(
        "  - {{url: \"{}\", name: up, model: test-model}}\n",
        upstream.url
    );
    down_for(
        "unknown-ca",
        &endpoint,
        "tls",
        "signed by a CA this gateway does not trust: set the endpoint's ca_file",
    )
    .await;
}

/// An OpenAI-compatible server with `/health` and chat completions but no `/metrics` (404),
/// as a hosted API or an engine behind a path prefix looks: its base URL.
async fn engine_without_metrics() -> String {
    let answer = json!({
        "id": "x", "object": "chat.completion", "created": 0, "model": "test-model",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "hi"}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    });
    let app = axum::Router::new()
        .route("/health", axum::routing::get(|| async { "ok" }))
        .route(
            "/v1/chat/completions",
            axum::routing::post(move || async move { axum::Json(answer) }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let at = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{at}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_404_on_metrics_is_warned_and_the_endpoint_still_serves() {
    let url = engine_without_metrics().await;
    let (front, log) = front(
        "no-metrics",
        &format!("  - {{url: \"{url}\", name: up, model: test-model}}\n"),
    );
    let says =
        format!("GET {url}/metrics answered 404 Not Found: routing it without its load signals");
    log.wait_for(&["WARN", &says]);
    let warning = endpoint_field(&front.url, "warning").await;
    assert!(
        warning.starts_with("GET /metrics answered 404: routed without its load signals"),
        "{warning}"
    );
    let listed = admin_json(&front.url, "/admin/endpoints", "t").await;
    assert_eq!(listed["endpoints"][0]["health"], "healthy", "{listed}");
    assert!(listed["endpoints"][0].get("reason").is_none(), "{listed}");
    let (status, message, _) = ask(&front.url, "test-model").await;
    assert_eq!(status, 200, "{message}");
    assert_eq!(log.count("/metrics answered"), 1, "warned once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_cools_the_endpoint_down_and_the_503_says_for_how_long() {
    let engine = engine("busy", "0", &["--fault", "429:retry_after=30"]);
    let (front, _log) = front(
        "cooling",
        &format!(
            "  - {{url: \"{}\", name: up, model: test-model}}\n",
            engine.url
        ),
    );
    let (status, _, _) = ask(&front.url, "test-model").await;
    assert_eq!(status, 429, "the engine's own answer");
    let (status, message, retry_after) = ask(&front.url, "test-model").await;
    assert_eq!(status, 503, "{message}");
    assert!(
        message.contains("up, is cooling down: it answered Retry-After; takes traffic again in"),
        "{message}"
    );
    let wait: u64 = retry_after.unwrap().parse().unwrap();
    assert!((25..=30).contains(&wait), "{wait}");
    let reason = endpoint_field(&front.url, "reason").await;
    assert!(
        reason.starts_with("cooling down: it answered Retry-After"),
        "{reason}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_at_their_limits_and_unknown_models_say_so() {
    let a = engine("a", "1", &[]);
    let b = engine("b", "1", &[]);
    let (front, _log) = front(
        "limits",
        &format!(
            "  - {{url: \"{}\", name: a, model: test-model, limits: {{max_concurrent: 1}}}}\n  \
             - {{url: \"{}\", name: b, model: test-model, limits: {{max_concurrent: 1}}}}\n",
            a.url, b.url
        ),
    );
    // Two long streams hold both endpoints' one place each.
    let mut held = Vec::new();
    for _ in 0..2 {
        let r = client()
            .post(format!("{}/v1/chat/completions", front.url))
            .json(&chat(user("a long answer"), 4000, true))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        held.push(r);
    }
    let (status, message, _) = ask(&front.url, "test-model").await;
    assert_eq!(status, 503, "{message}");
    assert!(
        message.contains(
            "2 endpoints serving `test-model`, all are at their limits: a is at its \
             limits (requests or tokens per minute, or requests in flight); b is at its limits"
        ),
        "{message}"
    );
    drop(held);
    let (status, message, _) = ask(&front.url, "no-such-model").await;
    assert_eq!(status, 404, "{message}");
    assert_eq!(
        message,
        "the model `no-such-model` does not exist in this pool (models served: `test-model`)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drained_endpoints_are_named_as_draining() {
    let a = engine("a", "0", &[]);
    let b = engine("b", "0", &[]);
    let (front, _log) = front(
        "drained-all",
        &format!(
            "  - {{url: \"{}\", name: a, model: test-model}}\n  - {{url: \"{}\", name: b, model: \
             test-model}}\n",
            a.url, b.url
        ),
    );
    for id in 0..2 {
        let r = client()
            .post(format!("{}/admin/endpoints/{id}/drain", front.url))
            .bearer_auth("t")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 204);
    }
    let (status, message, _) = ask(&front.url, "test-model").await;
    assert_eq!(status, 503, "{message}");
    assert!(
        message.contains(
            "2 endpoints serving `test-model`, all are draining: a is draining: taken out of \
             routing; b is draining"
        ),
        "{message}"
    );
    assert_eq!(
        endpoint_field(&front.url, "reason").await,
        "draining: taken out of routing"
    );
}
