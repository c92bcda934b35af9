//! The gateway's routes without a socket (`Router::oneshot`), and over loopback against a
//! minimal upstream written here, whose every chunk the test releases by hand.

mod common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use kvgate_gateway::{Config, EndpointConfig, Gateway};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tower::ServiceExt;

fn gateway_with(endpoints: Vec<EndpointConfig>, edit: impl FnOnce(&mut Config)) -> Gateway {
    let mut config = Config {
        endpoints,
        ..Config::default()
    };
    edit(&mut config);
    Gateway::with_seed(config, 1).unwrap()
}

async fn call(
    gateway: &Gateway,
    request: Request<Body>,
) -> (StatusCode, axum::http::HeaderMap, String) {
    let response = gateway.router().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

fn post(path: &str, body: impl Into<Body>) -> Request<Body> {
    Request::post(path)
        .header("content-type", "application/json")
        .body(body.into())
        .unwrap()
}

fn error_code(body: &str) -> String {
    let v: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {body}"));
    assert!(
        v["error"]["message"].is_string() && v["error"]["type"].is_string(),
        "{v}"
    );
    v["error"]["code"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn probes_models_and_metrics() {
    let model = EndpointConfig {
        model: Some("m1".into()),
        ..EndpointConfig::from_url("http://127.0.0.1:9")
    };
    let g = gateway_with(vec![model], |_| {});
    assert_eq!(
        call(&g, Request::get("/health").body(Body::empty()).unwrap())
            .await
            .0,
        StatusCode::OK
    );
    assert_eq!(
        call(&g, Request::get("/ready").body(Body::empty()).unwrap())
            .await
            .0,
        StatusCode::OK
    );
    let (_, _, models) = call(&g, Request::get("/v1/models").body(Body::empty()).unwrap()).await;
    let v: serde_json::Value = serde_json::from_str(&models).unwrap();
    assert_eq!(v["data"][0]["id"], "m1");
    let (status, headers, text) =
        call(&g, Request::get("/metrics").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/openmetrics-text"));
    assert!(
        text.contains("kvgate_endpoint_up{endpoint=\"127.0.0.1:9\"} 1"),
        "{text}"
    );
    let empty = gateway_with(vec![], |_| {});
    assert_eq!(
        call(&empty, Request::get("/ready").body(Body::empty()).unwrap())
            .await
            .0,
        StatusCode::SERVICE_UNAVAILABLE
    );
}

#[tokio::test]
async fn bad_requests_get_openai_errors() {
    let model = EndpointConfig {
        model: Some("m1".into()),
        ..EndpointConfig::from_url("http://127.0.0.1:9")
    };
    let g = gateway_with(vec![model], |c| c.requests.max_body_bytes = 64);
    let cases: Vec<(Request<Body>, StatusCode, &str)> = vec![
        (
            post("/v1/chat/completions", "{"),
            StatusCode::BAD_REQUEST,
            "invalid_json",
        ),
        (
            post("/v1/chat/completions", r#"{"model":"m1"}"#),
            StatusCode::BAD_REQUEST,
            "missing_required_parameter",
        ),
        (
            post(
                "/v1/chat/completions",
                r#"{"model":"zz","messages":[{"role":"user","content":"x"}]}"#,
            ),
            StatusCode::NOT_FOUND,
            "model_not_found",
        ),
        (
            post("/v1/completions", r#"{"model":"m1","prompt":{}}"#),
            StatusCode::BAD_REQUEST,
            "invalid_type",
        ),
        (
            post("/v1/chat/completions", "x".repeat(65)),
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
        ),
        (
            Request::get("/v2/nothing").body(Body::empty()).unwrap(),
            StatusCode::NOT_FOUND,
            "unknown_url",
        ),
    ];
    for (request, status, code) in cases {
        let (got, _, body) = call(&g, request).await;
        assert_eq!((got, error_code(&body).as_str()), (status, code), "{body}");
    }
    // A body streamed without content-length is cut at the limit too.
    let chunks = futures_util::stream::iter(
        (0..10).map(|_| Ok::<_, std::io::Error>(Bytes::from_static(b"0123456789"))),
    );
    let (got, _, body) = call(&g, post("/v1/chat/completions", Body::from_stream(chunks))).await;
    assert_eq!(
        (got, error_code(&body).as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, "request_too_large")
    );
}

#[tokio::test]
async fn no_endpoint_is_503_and_connection_refused_is_502() {
    let empty = gateway_with(vec![], |_| {});
    let chat = r#"{"messages":[{"role":"user","content":"x"}]}"#;
    let (status, headers, body) = call(&empty, post("/v1/chat/completions", chat)).await;
    assert_eq!(
        (status, error_code(&body).as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "no_endpoint")
    );
    // No endpoint says when it is back: the next health check is the earliest.
    assert_eq!(headers["retry-after"], "1");
    // Nothing listens on port 9 of loopback: every attempt fails to connect.
    let dead = gateway_with(vec![EndpointConfig::from_url("http://127.0.0.1:9")], |c| {
        c.retry.backoff.base_ms = 1
    });
    let (status, _, body) = call(&dead, post("/v1/chat/completions", chat)).await;
    assert_eq!(
        (status, error_code(&body).as_str()),
        (StatusCode::BAD_GATEWAY, "upstream_error")
    );
    assert!(
        dead.metrics_text()
            .contains("kvgate_retries_total{reason=\"connect\"} 2"),
        "{}",
        dead.metrics_text()
    );
    let text = dead.metrics_text();
    assert!(
        text.contains("kvgate_retries_denied_total{reason=\"attempts\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("kvgate_requests_total{outcome=\"upstream_error\",policy=\"predicted_ttft\",endpoint=\"127.0.0.1:9\"} 1"),
        "{text}"
    );
}

#[tokio::test]
async fn admin_routes_exist_only_with_a_token_and_require_it() {
    let off = gateway_with(vec![], |_| {});
    assert_eq!(
        call(
            &off,
            Request::get("/admin/endpoints")
                .body(Body::empty())
                .unwrap()
        )
        .await
        .0,
        StatusCode::NOT_FOUND
    );
    let on = gateway_with(vec![], |c| c.admin_token = Some("t".into()));
    let (status, _, body) = call(
        &on,
        Request::get("/admin/endpoints")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(
        (status, error_code(&body).as_str()),
        (StatusCode::UNAUTHORIZED, "invalid_token")
    );
    let authed = Request::get("/admin/endpoints")
        .header("authorization", "Bearer t")
        .body(Body::empty())
        .unwrap();
    assert_eq!(call(&on, authed).await.0, StatusCode::OK);
}

/// An upstream whose SSE chunks are released one at a time by the test.
async fn scripted_upstream(rx: mpsc::Receiver<Bytes>) -> String {
    let rx = Arc::new(Mutex::new(Some(rx)));
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move || {
            let rx = rx.lock().unwrap().take().expect("one request");
            async move {
                let stream = futures_util::stream::unfold(rx, |mut rx| async move {
                    rx.recv()
                        .await
                        .map(|chunk| (Ok::<_, std::io::Error>(chunk), rx))
                });
                axum::response::Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(Body::from_stream(stream))
                    .unwrap()
            }
        }),
    );
    let url = common::serve(app).await;
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_chunk_reaches_the_client_before_the_next_is_produced() {
    let (tx, rx) = mpsc::channel(1);
    let upstream = scripted_upstream(rx).await;
    let g = gateway_with(vec![EndpointConfig::from_url(upstream)], |_| {});
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(g.serve(listener, async move {
        let _ = stop_rx.await;
    }));
    let chunks: Vec<Bytes> = (0..5)
        .map(|i| {
            Bytes::from(format!(
                "data: {{\"choices\":[{{\"delta\":{{\"content\":\"tok{i}\"}}}}]}}\n\n"
            ))
        })
        .collect();
    tx.send(chunks[0].clone()).await.unwrap();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let request = Request::post(format!("http://{addr}/v1/chat/completions"))
        .body(Full::new(Bytes::from_static(
            br#"{"stream":true,"messages":[{"role":"user","content":"x"}]}"#,
        )))
        .unwrap();
    let mut body = client.request(request).await.unwrap().into_body();
    for (i, chunk) in chunks.iter().enumerate() {
        if i > 0 {
            tx.send(chunk.clone()).await.unwrap();
        }
        let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .expect("chunk held back by the gateway")
            .unwrap()
            .unwrap();
        assert_eq!(frame.into_data().unwrap(), *chunk, "chunk {i} changed");
    }
    drop(tx);
    assert!(body.frame().await.is_none());
    let _ = stop_tx.send(());
    server.await.unwrap().unwrap();
}

/// An upstream answering with the `authorization` header it received.
async fn echo_upstream() -> String {
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(|headers: axum::http::HeaderMap| async move {
            let auth = headers
                .get("authorization")
                .map_or("none", |v| v.to_str().unwrap())
                .to_string();
            axum::Json(serde_json::json!({ "auth": auth }))
        }),
    );
    let url = common::serve(app).await;
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_api_key_replaces_the_clients_and_is_never_reported() {
    let upstream = echo_upstream().await;
    let keyed = EndpointConfig {
        api_key: Some("upstream-key".into()),
        ..EndpointConfig::from_url(upstream.clone())
    };
    let chat = r#"{"messages":[{"role":"user","content":"x"}]}"#;
    let with_key = |g: &Gateway| {
        let g = g.clone();
        async move {
            let request = Request::post("/v1/chat/completions")
                .header("authorization", "Bearer client-key")
                .body(Body::from(chat))
                .unwrap();
            let (status, _, body) = call(&g, request).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            serde_json::from_str::<serde_json::Value>(&body).unwrap()["auth"]
                .as_str()
                .unwrap()
                .to_string()
        }
    };
    let g = gateway_with(vec![keyed], |c| c.admin_token = Some("t".into()));
    assert_eq!(with_key(&g).await, "Bearer upstream-key");
    let admin = Request::get("/admin/endpoints")
        .header("authorization", "Bearer t")
        .body(Body::empty())
        .unwrap();
    assert!(!call(&g, admin).await.2.contains("upstream-key"));
    let plain = gateway_with(vec![EndpointConfig::from_url(upstream)], |_| {});
    assert_eq!(with_key(&plain).await, "Bearer client-key");
}
