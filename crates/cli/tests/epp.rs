//! `kvgate epp` against a gRPC client speaking ext_proc as Envoy does (the Gateway API
//! Inference Extension's endpoint-picker protocol) and real `kvgate engine` processes: the
//! pick comes back in the header and the `envoy.lb` metadata, the client sends the request
//! where it was told, and the response streamed back through the picker reaches its pool.

// Each test walks one scenario end to end; splitting it would scatter the story.
#![allow(clippy::too_many_lines)]

mod support;

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue, Metadata};
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation::Mutation, processing_request::Request, processing_response::Response, HttpBody,
    HttpHeaders, ProcessingRequest, ProcessingResponse, ProtocolConfiguration,
};
use envoy_types::pb::google::protobuf::{value::Kind, ListValue, Struct, Value};
use support::{client, engine, get_text, metric, spawn, Proc};
use tokio::sync::mpsc;

const BUFFERED: i32 = 2;
const FULL_DUPLEX_STREAMED: i32 = 4;

/// One ext_proc stream, as Envoy holds it.
struct Stream {
    tx: mpsc::Sender<ProcessingRequest>,
    rx: tonic::Streaming<ProcessingResponse>,
}

impl Stream {
    async fn open(url: &str) -> Stream {
        let mut grpc = ExternalProcessorClient::connect(url.to_string())
            .await
            .unwrap();
        let (tx, requests) = mpsc::channel(8);
        let outbound = futures_util::stream::unfold(requests, |mut r| async move {
            r.recv().await.map(|m| (m, r))
        });
        let rx = grpc.process(outbound).await.unwrap().into_inner();
        Stream { tx, rx }
    }

    async fn send(&self, request: Request, first: Option<(i32, Option<Metadata>)>) {
        let (mode, metadata) = first.unwrap_or((0, None));
        let message = ProcessingRequest {
            request: Some(request),
            protocol_config: (mode != 0).then(|| ProtocolConfiguration {
                request_body_mode: mode,
                response_body_mode: mode,
                ..ProtocolConfiguration::default()
            }),
            metadata_context: metadata,
            ..ProcessingRequest::default()
        };
        self.tx.send(message).await.unwrap();
    }

    async fn next(&mut self) -> ProcessingResponse {
        self.rx.message().await.unwrap().unwrap()
    }
}

fn headers(pairs: &[(&str, &str)], end_of_stream: bool, response: bool) -> Request {
    let headers = pairs
        .iter()
        .map(|(k, v)| HeaderValue {
            key: k.to_string(),
            raw_value: v.as_bytes().to_vec(),
            ..HeaderValue::default()
        })
        .collect();
    let h = HttpHeaders {
        headers: Some(HeaderMap { headers }),
        end_of_stream,
        ..HttpHeaders::default()
    };
    if response {
        Request::ResponseHeaders(h)
    } else {
        Request::RequestHeaders(h)
    }
}

fn body(bytes: &[u8], end_of_stream: bool, response: bool) -> Request {
    let b = HttpBody {
        body: bytes.to_vec(),
        end_of_stream,
        ..HttpBody::default()
    };
    if response {
        Request::ResponseBody(b)
    } else {
        Request::RequestBody(b)
    }
}

const CHAT: &[(&str, &str)] = &[
    (":method", "POST"),
    (":path", "/v1/chat/completions"),
    ("content-type", "application/json"),
];

/// The endpoint a pick sets in the request header, checked against the `envoy.lb` metadata.
fn destination(r: &ProcessingResponse) -> String {
    let common = match r.response.as_ref().unwrap() {
        Response::RequestHeaders(h) => h.response.as_ref().unwrap(),
        Response::RequestBody(b) => b.response.as_ref().unwrap(),
        other => panic!("no pick: {other:?}"),
    };
    assert!(common.clear_route_cache);
    let set = &common.header_mutation.as_ref().unwrap().set_headers;
    let header = set[0].header.as_ref().unwrap();
    assert_eq!(header.key, "x-gateway-destination-endpoint");
    let picked = String::from_utf8(header.raw_value.clone()).unwrap();
    let lb = &r.dynamic_metadata.as_ref().unwrap().fields["envoy.lb"];
    let Some(Kind::StructValue(inner)) = &lb.kind else {
        panic!("{lb:?}")
    };
    let Some(Kind::StringValue(meta)) = &inner.fields["x-gateway-destination-endpoint"].kind else {
        panic!("{inner:?}")
    };
    assert_eq!(*meta, picked, "header and metadata must agree");
    picked
}

/// The immediate answer's status and body.
fn immediate(r: &ProcessingResponse) -> (i32, String) {
    match r.response.as_ref().unwrap() {
        Response::ImmediateResponse(i) => (
            i.status.as_ref().unwrap().code,
            String::from_utf8(i.body.clone()).unwrap(),
        ),
        other => panic!("not an immediate response: {other:?}"),
    }
}

fn picker(engines: &[&Proc]) -> (Proc, String) {
    picker_with(engines, &[])
}

fn picker_with(engines: &[&Proc], extra: &[&str]) -> (Proc, String) {
    let mut args = vec![
        "epp",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--admin-token",
        "t",
        "--scrape-interval-ms",
        "100",
    ];
    for e in engines {
        args.push("--endpoint");
        args.push(&e.url);
    }
    args.extend_from_slice(extra);
    let p = spawn(&args, "kvgate epp listening on");
    let metrics = p
        .line
        .split_whitespace()
        .filter(|w| w.starts_with("http://"))
        .nth(1)
        .unwrap()
        .trim_end_matches(')')
        .to_string();
    (p, metrics)
}

fn host_port(url: &str) -> String {
    url.trim_start_matches("http://").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_chat_is_picked_sent_and_its_response_reaches_the_pool() {
    let (e0, e1) = (engine("e0", "0", &[]), engine("e1", "0", &[]));
    let (epp, metrics_url) = picker(&[&e0, &e1]);
    let channel = tonic::transport::Endpoint::from_shared(epp.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    for service in [
        "liveness",
        "readiness",
        "envoy.service.ext_proc.v3.ExternalProcessor",
    ] {
        let status = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status;
        assert_eq!(
            status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32
        );
    }

    // Full duplex, as the extension configures Envoy: headers and a body in two pieces.
    let payload = serde_json::to_vec(&serde_json::json!({
        "model": "test-model", "messages": [{"role": "user", "content": "pick me a replica"}],
        "max_tokens": 6, "ignore_eos": true, "stream": true,
        "stream_options": {"include_usage": true},
    }))
    .unwrap();
    let mut s = Stream::open(&epp.url).await;
    s.send(
        headers(CHAT, false, false),
        Some((FULL_DUPLEX_STREAMED, None)),
    )
    .await;
    let (head, tail) = payload.split_at(payload.len() / 2);
    s.send(body(head, false, false), None).await;
    s.send(body(tail, true, false), None).await;
    let picked = destination(&s.next().await);
    let engines = [host_port(&e0.url), host_port(&e1.url)];
    assert!(
        engines.contains(&picked),
        "{picked} is not one of {engines:?}"
    );
    let Some(Response::RequestBody(b)) = s.next().await.response else {
        panic!("the body must come back")
    };
    let Some(Mutation::StreamedResponse(sent)) =
        b.response.unwrap().body_mutation.unwrap().mutation
    else {
        panic!("a streamed body")
    };
    assert!(sent.end_of_stream);
    assert_eq!(sent.body, payload, "the body goes on unchanged");

    // Envoy sends it to the pick and streams the answer back through the picker.
    let answer = client()
        .post(format!("http://{picked}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(payload.clone())
        .send()
        .await
        .unwrap();
    s.send(
        headers(
            &[(":status", "200"), ("content-type", "text/event-stream")],
            false,
            true,
        ),
        None,
    )
    .await;
    assert!(matches!(
        s.next().await.response,
        Some(Response::ResponseHeaders(_))
    ));
    let text = answer.bytes().await.unwrap();
    for (i, piece) in text.chunks(text.len() / 3 + 1).enumerate() {
        let last = (i + 1) * (text.len() / 3 + 1) >= text.len();
        s.send(body(piece, last, true), None).await;
        let Some(Response::ResponseBody(b)) = s.next().await.response else {
            panic!("the response body must come back")
        };
        let Some(Mutation::StreamedResponse(echo)) =
            b.response.unwrap().body_mutation.unwrap().mutation
        else {
            panic!("a streamed body")
        };
        assert_eq!((&echo.body[..], echo.end_of_stream), (piece, last));
        // Envoy passes each piece on as the engine's iterations produce it.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let name = if picked == engines[0] {
        &e0.url
    } else {
        &e1.url
    };
    let endpoint = name.trim_start_matches("http://");
    let sample = format!("kvgate_output_tokens_total{{endpoint=\"{endpoint}\"}}");
    let mut seen = None;
    for _ in 0..100 {
        let m = get_text(&client(), &metrics_url, "/metrics").await;
        seen = metric(&m, &sample);
        if seen.is_some() {
            assert_eq!(
                metric(&m, "kvgate_epp_picks_total{reason=\"picked\"}"),
                Some(1.0),
                "{m}"
            );
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(seen, Some(6.0), "the usage of the answer reached the pool");
    // The pieces after the first ticked the endpoint's iteration clock, as a relayed stream's
    // chunks do, so `predicted_ttft` sees the phase of its iterations in EPP mode too.
    let iteration = format!("kvgate_endpoint_iteration_seconds{{endpoint=\"{endpoint}\"}}");
    let mut seconds = None;
    for _ in 0..100 {
        seconds = metric(
            &get_text(&client(), &metrics_url, "/metrics").await,
            &iteration,
        );
        if seconds.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let seconds = seconds.unwrap_or_else(|| panic!("no {iteration}"));
    assert!(seconds >= 0.015, "{seconds}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffered_bodies_bad_bodies_and_an_empty_subset_get_what_the_protocol_defines() {
    let e0 = engine("e0", "0", &[]);
    let (epp, _) = picker(&[&e0]);
    let payload =
        br#"{"model":"test-model","messages":[{"role":"user","content":"hi"}],"max_tokens":2}"#;

    // Buffered (older Envoy): the headers pass at once, the pick rides on the body's answer.
    let mut s = Stream::open(&epp.url).await;
    s.send(headers(CHAT, false, false), Some((BUFFERED, None)))
        .await;
    assert!(matches!(
        s.next().await.response,
        Some(Response::RequestHeaders(_))
    ));
    s.send(body(payload, true, false), None).await;
    let pick = s.next().await;
    assert!(matches!(pick.response, Some(Response::RequestBody(_))));
    assert_eq!(destination(&pick), host_port(&e0.url));

    // A body the gateway would refuse: 400 with the gateway's error, from the proxy itself.
    let mut s = Stream::open(&epp.url).await;
    s.send(
        headers(CHAT, false, false),
        Some((FULL_DUPLEX_STREAMED, None)),
    )
    .await;
    s.send(body(b"{not json", true, false), None).await;
    let (status, error) = immediate(&s.next().await);
    assert_eq!(status, 400);
    assert!(error.contains("invalid_json"), "{error}");

    // A subset hint naming no endpoint of the pool: 503.
    let hint = Metadata {
        filter_metadata: [(
            "envoy.lb.subset_hint".to_string(),
            Struct {
                fields: [(
                    "x-gateway-destination-endpoint-subset".to_string(),
                    Value {
                        kind: Some(Kind::ListValue(ListValue {
                            values: vec![Value {
                                kind: Some(Kind::StringValue("10.9.9.9:8000".into())),
                            }],
                        })),
                    },
                )]
                .into(),
            },
        )]
        .into(),
        ..Metadata::default()
    };
    let mut s = Stream::open(&epp.url).await;
    s.send(
        headers(CHAT, false, false),
        Some((FULL_DUPLEX_STREAMED, Some(hint))),
    )
    .await;
    s.send(body(payload, true, false), None).await;
    assert_eq!(immediate(&s.next().await).0, 503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_pool_and_liveness_stays() {
    let dead = format!("http://127.0.0.1:{}", support::free_port());
    let p = spawn(
        &[
            "epp",
            "--listen",
            "127.0.0.1:0",
            "--scrape-interval-ms",
            "100",
            "--endpoint",
            &dead,
        ],
        "kvgate epp listening on",
    );
    let channel = tonic::transport::Endpoint::from_shared(p.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let health = tonic_health::pb::health_client::HealthClient::new(channel);
    let not_serving = tonic_health::pb::health_check_response::ServingStatus::NotServing as i32;
    let status = |service: &'static str| {
        let mut health = health.clone();
        async move {
            let request = tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            };
            health.check(request).await.unwrap().into_inner().status
        }
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while status("readiness").await != not_serving {
        assert!(
            std::time::Instant::now() < deadline,
            "readiness never dropped"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let serving = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
    assert_eq!(status("liveness").await, serving);
    let service = "envoy.service.ext_proc.v3.ExternalProcessor";
    assert_eq!(status(service).await, not_serving);
}

/// The access log's lines once it has `n`.
fn access_lines(path: &std::path::Path, n: usize) -> Vec<serde_json::Value> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        if lines.len() >= n {
            return lines
                .iter()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
        }
        assert!(std::time::Instant::now() < deadline, "{text}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_picker_applies_keys_and_rate_limits_and_writes_the_access_log() {
    let e0 = engine("e0", "0", &[]);
    let dir = std::env::temp_dir().join(format!("kvgate-epp-tenancy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("access.log");
    let _ = std::fs::remove_file(&log);
    let yaml = format!(
        "tenancy:\n  keys:\n    - {{name: alpha, key_sha256: \"{}\", tenant: team-a, limits: {{rpm: 1}}}}\n",
        support::sha256("kvg-alpha")
    );
    let config = support::config_file("epp-tenancy", &yaml);
    let (epp, _) = picker_with(
        &[&e0],
        &[
            "--config",
            config.to_str().unwrap(),
            "--access-log",
            log.to_str().unwrap(),
        ],
    );
    let payload =
        br#"{"model":"test-model","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream":true}"#;
    let keyed = |key: &'static str| {
        let mut h = CHAT.to_vec();
        h.push(("authorization", key));
        h
    };

    // No key: refused before the body is parsed, as `kvgate serve` refuses it.
    let mut s = Stream::open(&epp.url).await;
    s.send(
        headers(CHAT, false, false),
        Some((FULL_DUPLEX_STREAMED, None)),
    )
    .await;
    s.send(body(payload, true, false), None).await;
    let (status, error) = immediate(&s.next().await);
    assert_eq!(status, 401, "{error}");

    // The key: picked; the answer streams back through the picker and settles the request.
    let mut s = Stream::open(&epp.url).await;
    s.send(
        headers(&keyed("Bearer kvg-alpha"), false, false),
        Some((FULL_DUPLEX_STREAMED, None)),
    )
    .await;
    s.send(body(payload, true, false), None).await;
    assert_eq!(destination(&s.next().await), host_port(&e0.url));
    let _body = s.next().await;
    s.send(headers(&[(":status", "200")], false, true), None)
        .await;
    let _ = s.next().await;
    let sse = b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}\n\ndata: [DONE]\n\n";
    s.send(body(sse, true, true), None).await;
    let _ = s.next().await;

    // The key's limit of one request a minute is spent: 429 from the picker.
    let mut s = Stream::open(&epp.url).await;
    s.send(
        headers(&keyed("Bearer kvg-alpha"), false, false),
        Some((FULL_DUPLEX_STREAMED, None)),
    )
    .await;
    s.send(body(payload, true, false), None).await;
    let (status, error) = immediate(&s.next().await);
    assert_eq!(status, 429, "{error}");

    let lines = access_lines(&log, 3);
    let by_status = |code: u64| {
        lines
            .iter()
            .find(|l| l["status"] == code)
            .unwrap_or_else(|| panic!("no {code} in {lines:?}"))
    };
    assert_eq!(by_status(401)["outcome"], "refused");
    assert_eq!(by_status(429)["outcome"], "refused");
    let ok = by_status(200);
    assert_eq!(ok["outcome"], "ok", "{ok}");
    assert_eq!(ok["tenant"], "team-a", "{ok}");
    assert_eq!(ok["endpoint"], host_port(&e0.url).as_str(), "{ok}");
    assert_eq!(ok["prompt_tokens"], 9, "{ok}");
    assert_eq!(ok["output_tokens"], 2, "{ok}");
    assert_eq!(ok["attempts"], 1, "{ok}");
    let _ = std::fs::remove_dir_all(&dir);
}
