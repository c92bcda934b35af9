//! OpenTelemetry traces: an in-process OTLP/HTTP receiver stands in for the collector; a streamed
//! request and a failed-over one must arrive as a server span per request with a client span per
//! attempt, carrying the GenAI semantic conventions' attributes, under the client's `traceparent`,
//! with each attempt's context sent upstream.

#![allow(clippy::too_many_lines)]

use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use kvgate_gateway::{Config, EndpointConfig, Gateway};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tower::ServiceExt;

type Spans = Arc<Mutex<Vec<Span>>>;

/// The collector stand-in: decodes every OTLP/HTTP protobuf export it receives.
async fn collector() -> (String, Spans) {
    let spans: Spans = Arc::default();
    let store = spans.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let store = store.clone();
            async move {
                let export = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                let mut s = store.lock().unwrap();
                for rs in export.resource_spans {
                    for ss in rs.scope_spans {
                        s.extend(ss.spans);
                    }
                }
                StatusCode::OK
            }
        }),
    );
    let url = format!("{}/v1/traces", serve(app).await);
    (url, spans)
}

/// An engine stand-in: streams three tokens and usage, or answers 503 when `broken`; records
/// the `traceparent` of every request.
async fn upstream(broken: bool) -> (String, Arc<Mutex<Vec<String>>>) {
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let record = seen.clone();
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move |headers: HeaderMap| {
            let record = record.clone();
            async move {
                if let Some(tp) = headers.get("traceparent") {
                    record.lock().unwrap().push(tp.to_str().unwrap().to_owned());
                }
                if broken {
                    return axum::response::Response::builder()
                        .status(503)
                        .body(Body::from("down"))
                        .unwrap();
                }
                let chunks = ["a", "b", "c"]
                    .iter()
                    .map(|t| format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{t}\"}}}}]}}\n\n"))
                    .chain(std::iter::once(
                        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\ndata: [DONE]\n\n".to_owned(),
                    ));
                let stream = futures_util::stream::iter(chunks).then(|c| async move {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    Ok::<_, std::io::Error>(c)
                });
                axum::response::Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(Body::from_stream(stream))
                    .unwrap()
            }
        }),
    );
    let url = serve(app).await;
    (url, seen)
}

use futures_util::StreamExt;

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a Any> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

fn int(span: &Span, key: &str) -> Option<i64> {
    match attr(span, key)? {
        Any::IntValue(v) => Some(*v),
        _ => None,
    }
}

fn double(span: &Span, key: &str) -> Option<f64> {
    match attr(span, key)? {
        Any::DoubleValue(v) => Some(*v),
        _ => None,
    }
}

fn text<'a>(span: &'a Span, key: &str) -> Option<&'a str> {
    match attr(span, key)? {
        Any::StringValue(v) => Some(v),
        _ => None,
    }
}

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

async fn stream_request(g: &Gateway) -> String {
    let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hello"}]}"#;
    let request = Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .header("x-kvgate-session", "conversation-7")
        .header("traceparent", format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"))
        .body(Body::from(body))
        .unwrap();
    let response = g.router().oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let id = response.headers()["x-kvgate-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    response.into_body().collect().await.unwrap();
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_carry_genai_attributes_for_a_stream_and_a_failover() {
    let (otlp, spans) = collector().await;
    let (bad, bad_seen) = upstream(true).await;
    let (good, good_seen) = upstream(false).await;
    let mut config = Config {
        endpoints: vec![
            EndpointConfig::from_url(&bad),
            EndpointConfig::from_url(&good),
        ],
        ..Config::default()
    };
    config.set_policy("round_robin").unwrap();
    config.retry.backoff.base_ms = 1;
    config.retry.backoff.cap_ms = 1;
    config.observability.otlp_traces_endpoint = Some(otlp);
    let g = Gateway::with_seed(config, 1).unwrap();
    // Round robin: one of the two requests meets the broken endpoint first and fails over.
    let ids = [stream_request(&g).await, stream_request(&g).await];
    let flusher = g.clone();
    let deadline = Instant::now() + Duration::from_secs(20);
    let spans = loop {
        let f = flusher.clone();
        tokio::task::spawn_blocking(move || f.flush_traces())
            .await
            .unwrap();
        let got = spans.lock().unwrap().clone();
        if got.len() >= 5 || Instant::now() > deadline {
            break got;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let requests: Vec<&Span> = spans.iter().filter(|s| s.kind == 2).collect(); // SERVER
    let attempts: Vec<&Span> = spans.iter().filter(|s| s.kind == 3).collect(); // CLIENT
    assert_eq!((requests.len(), attempts.len()), (2, 3), "{spans:#?}");
    for r in &requests {
        assert_eq!(r.name, "chat m");
        assert_eq!(hex(&r.trace_id), CLIENT_TRACE, "under the client's trace");
        assert_eq!(hex(&r.parent_span_id), CLIENT_SPAN);
        assert_eq!(text(r, "gen_ai.operation.name"), Some("chat"));
        assert_eq!(text(r, "gen_ai.request.model"), Some("m"));
        assert_eq!(text(r, "gen_ai.conversation.id"), Some("conversation-7"));
        assert_eq!(int(r, "gen_ai.usage.input_tokens"), Some(12));
        assert_eq!(int(r, "gen_ai.usage.output_tokens"), Some(3));
        assert_eq!(int(r, "kvgate.usage.cached_tokens"), Some(8));
        assert_eq!(int(r, "http.response.status_code"), Some(200));
        assert_eq!(text(r, "kvgate.outcome"), Some("ok"));
        let ttft = double(r, "gen_ai.server.time_to_first_token").unwrap();
        let tpot = double(r, "gen_ai.server.time_per_output_token").unwrap();
        assert!(ttft > 0.0 && tpot > 0.0 && ttft < 5.0, "{ttft} {tpot}");
        let id = int(r, "kvgate.request_id").unwrap().to_string();
        assert!(ids.contains(&id));
        let children: Vec<&&Span> = attempts
            .iter()
            .filter(|a| a.parent_span_id == r.span_id && a.trace_id == r.trace_id)
            .collect();
        let n = int(r, "kvgate.attempts").unwrap();
        assert_eq!(children.len() as i64, n, "one client span per attempt");
        // The answering attempt: a stream with its own TTFT and usage; a failed one says why.
        let ok: Vec<_> = children
            .iter()
            .filter(|a| attr(a, "error.type").is_none())
            .collect();
        assert_eq!(ok.len(), 1);
        let a = ok[0];
        assert_eq!(a.name, "chat m");
        assert_eq!(text(a, "server.address"), Some("127.0.0.1"));
        assert!(int(a, "server.port").is_some());
        assert!(double(a, "gen_ai.server.time_to_first_token").unwrap() <= ttft);
        assert_eq!(int(a, "gen_ai.usage.output_tokens"), Some(3));
        assert_eq!(text(a, "kvgate.reason"), Some("turn"));
        if n == 2 {
            let failed = children
                .iter()
                .find(|a| attr(a, "error.type").is_some())
                .unwrap();
            assert_eq!(text(failed, "error.type"), Some("server_error"));
            assert_eq!(failed.status.as_ref().unwrap().code, 2, "status ERROR");
            assert_eq!(text(failed, "kvgate.attempt"), Some("first"));
            assert_eq!(text(a, "kvgate.attempt"), Some("retry"));
        }
    }
    assert_eq!(
        requests
            .iter()
            .map(|r| int(r, "kvgate.attempts").unwrap())
            .sum::<i64>(),
        3,
        "one request failed over"
    );
    // Upstream saw each attempt's own span as the parent, in the client's trace.
    let sent: Vec<String> = bad_seen
        .lock()
        .unwrap()
        .iter()
        .chain(good_seen.lock().unwrap().iter())
        .cloned()
        .collect();
    assert_eq!(sent.len(), 3);
    for tp in sent {
        let parts: Vec<&str> = tp.split('-').collect();
        assert_eq!(parts[1], CLIENT_TRACE, "{tp}");
        assert!(attempts.iter().any(|a| hex(&a.span_id) == parts[2]), "{tp}");
    }
}

/// Serves `app` on a free loopback port in the background; returns its `http://` base URL.
async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}
