use super::*;
use crate::config::EngineConfig;
use crate::faults::FaultState;
use crate::metrics::MetricsState;
use axum::http::Request;
use std::sync::Mutex;
use tower::ServiceExt;

/// The router without a socket or a scheduler (for routes that do not generate).
fn app(faults: &[&str]) -> Router {
    let (tx, _rx) = mpsc::unbounded_channel();
    let faults = faults.iter().map(|f| f.parse().unwrap()).collect();
    let shared = Shared::new(
        EngineConfig {
            model: "m".to_owned(),
            ..EngineConfig::default()
        },
        tx,
        Arc::new(Mutex::new(MetricsState::default())),
        Arc::new(FaultState::new(faults, 0)),
        (0.0, ([127, 0, 0, 1], 0).into()),
    );
    router(Arc::new(shared))
}

async fn call(app: Router, method: &str, uri: &str, body: &str) -> (StatusCode, String) {
    let mut request = Request::builder()
        .method(method)
        .uri(uri)
        .body(Body::from(body.to_owned()))
        .unwrap();
    request
        .extensions_mut()
        .insert(Connection::for_test("127.0.0.1:1".parse().unwrap()));
    let response = app.oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

#[tokio::test]
async fn routes_answer_without_a_socket() {
    let (status, body) = call(app(&[]), "GET", "/v1/models", "").await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("\"id\":\"m\""));
    assert_eq!(call(app(&[]), "GET", "/health", "").await.0, StatusCode::OK);
    assert_eq!(
        call(app(&["drain"]), "GET", "/health", "").await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let (status, body) = call(app(&[]), "GET", "/metrics", "").await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 0.0"));
    assert_eq!(
        call(app(&[]), "GET", "/nope", "").await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        call(app(&[]), "PUT", "/v1/completions", "").await.0,
        StatusCode::METHOD_NOT_ALLOWED
    );
}

#[tokio::test]
async fn refusals_happen_before_the_engine_is_involved() {
    let (status, body) = call(app(&[]), "POST", "/v1/completions", "{").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("\"type\":\"Bad Request\""), "{body}");
    let (status, _) = call(
        app(&[]),
        "POST",
        "/v1/completions",
        r#"{"model":"x","prompt":"a"}"#,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = call(
        app(&["500"]),
        "POST",
        "/v1/completions",
        r#"{"prompt":"a"}"#,
    )
    .await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    let (status, body) = call(app(&["drain"]), "POST", "/v1/chat/completions", "{}").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("draining"));
}

fn parsed(ignore_eos: bool, min_tokens: u32) -> Parsed {
    Parsed {
        model: None,
        prompt: vec![1, 2, 3],
        max_tokens: Some(50),
        min_tokens,
        ignore_eos,
        stream: false,
        include_usage: false,
        logprobs: None,
    }
}

#[test]
fn ignore_eos_gives_exactly_the_limit() {
    for seed in 0..100 {
        assert_eq!(output_length(&parsed(true, 0), 50, 8, seed), 50);
    }
}

#[test]
fn sampled_lengths_are_seeded_bounded_and_near_the_mean() {
    let lengths: Vec<u32> = (0..2000)
        .map(|seed| output_length(&parsed(false, 3), 10_000, 40, seed))
        .collect();
    assert!(lengths.iter().all(|&n| (3..=10_000).contains(&n)));
    let mean = lengths.iter().map(|&n| f64::from(n)).sum::<f64>() / lengths.len() as f64;
    assert!((36.0..44.0).contains(&mean), "{mean}");
    let again: Vec<u32> = (0..2000)
        .map(|seed| output_length(&parsed(false, 3), 10_000, 40, seed))
        .collect();
    assert_eq!(lengths, again);
    assert!((0..100).all(|seed| output_length(&parsed(false, 0), 5, 40, seed) <= 5));
}
