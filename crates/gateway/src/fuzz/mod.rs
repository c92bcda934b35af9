//! Fuzzing of every parser that reads bytes from outside the gateway: request bodies and their
//! headers, engine answers (SSE streams, usage, Prometheus text, `/v1/models`), `Retry-After`,
//! the YAML configuration and the admin API's endpoint JSON.
//!
//! Every property holds for any input: the parser returns without panicking, and what it
//! accepts or produces keeps the invariants the rest of the gateway relies on. Inputs are
//! mutants of inputs captured from a real vLLM (`test-data/vllm/`) and of realistic requests
//! ([`mutate`]). `scripts/fuzz.sh` runs ten million cases in release; a plain `cargo test` runs
//! [`DEFAULT_CASES`] of each property. A failure prints its shrunk input, and
//! `PROPTEST_RNG_SEED` replays a run.

mod mutate;

use crate::config::{EndpointConfig, RequestConfig};
use crate::engine_state::exposition as scrape;
use crate::listener::ConnectionMetrics;
use crate::listener::Listening;
use crate::parse::{self, Api, Inference};
use crate::usage::{self, UsageStripper, UsageTail};
use crate::{upstream, Config, Gateway};
use axum::http::{HeaderMap, HeaderValue};
use bytes::Bytes;
use kvgate_core::policy::PolicyConfig;
use kvgate_core::request::estimate_tokens;
use kvgate_core::{Observation, Priority};
use mutate::{cuts, input, pieces, seeds, text};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config as RunConfig, TestCaseResult, TestRunner};
use serde_json::Value;
use std::sync::LazyLock;
use std::time::{Duration, SystemTime};

/// Cases per property in a plain `cargo test`: about fifteen seconds for all of them in a debug
/// build on two busy cores.
const DEFAULT_CASES: u32 = 2_000;

/// Each property's share of `KVGATE_FUZZ_CASES`, inversely to what its cases cost in release.
const WEIGHTS: &[(&str, u64)] = &[
    ("requests", 4),
    ("usage_tail", 4),
    ("stream_filter", 4),
    ("metrics", 2),
    ("models", 2),
    ("retry_after", 4),
    ("config", 1),
    ("admin_endpoint", 2),
];

/// [`DEFAULT_CASES`], or this property's share of `KVGATE_FUZZ_CASES` (a total over all
/// properties, as `scripts/fuzz.sh` sets it), rounded up.
fn cases(name: &str) -> u32 {
    let weight = WEIGHTS
        .iter()
        .find_map(|(n, w)| (*n == name).then_some(*w))
        .unwrap_or_else(|| panic!("property {name} has no weight"));
    let Ok(total) = std::env::var("KVGATE_FUZZ_CASES") else {
        return DEFAULT_CASES;
    };
    let total: u64 = total
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("KVGATE_FUZZ_CASES={total:?} is not a whole number"));
    let all: u64 = WEIGHTS.iter().map(|(_, w)| w).sum();
    u32::try_from(total.saturating_mul(weight).div_ceil(all)).unwrap_or(u32::MAX)
}

/// Runs one property. Failures are not persisted: each finding becomes a named regression test
/// beside its parser instead.
fn run<S: Strategy>(name: &str, strategy: S, test: impl Fn(S::Value) -> TestCaseResult) {
    let cases = cases(name);
    let start = std::time::Instant::now();
    let mut runner = TestRunner::new(RunConfig {
        cases,
        failure_persistence: None,
        ..RunConfig::default()
    });
    if let Err(e) = runner.run(&strategy, test) {
        panic!("fuzz {name}: {e}");
    }
    println!(
        "fuzz {name}: {cases} cases in {:.1} s",
        start.elapsed().as_secs_f64()
    );
}

const VLLM_CHAT: &[u8] = include_bytes!("../../../../test-data/vllm/chat-completion.json");
const VLLM_COMPLETION: &[u8] = include_bytes!("../../../../test-data/vllm/completion.json");
const VLLM_CHAT_STREAM: &[u8] =
    include_bytes!("../../../../test-data/vllm/chat-completion-stream.txt");
const VLLM_COMPLETION_STREAM: &[u8] =
    include_bytes!("../../../../test-data/vllm/completion-stream.txt");
const VLLM_METRICS: &str = include_str!("../../../../test-data/vllm/metrics.txt");
const VLLM_MODELS: &[u8] = include_bytes!("../../../../test-data/vllm/models.json");
const VLLM_ERRORS: &[&[u8]] = &[
    include_bytes!("../../../../test-data/vllm/error-bad-json.json"),
    include_bytes!("../../../../test-data/vllm/error-bad-temperature.json"),
    include_bytes!("../../../../test-data/vllm/error-context-length.json"),
    include_bytes!("../../../../test-data/vllm/error-unknown-model.json"),
];
const README: &str = include_str!("../../README.md");

/// Request bodies as OpenAI SDKs send them, then vLLM's answers (which splice into them).
static REQUESTS: LazyLock<Vec<Vec<u8>>> = LazyLock::new(|| {
    let mut all = seeds(&[
        br#"{"model":"tiny","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}"#,
        br#"{"model":"tiny","messages":[{"role":"user","content":"weather in Paris?"},{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","tool_call_id":"call_1","name":"get_weather","content":"18C"}],"tools":[{"type":"function","function":{"name":"get_weather","description":"Current weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}],"tool_choice":"auto"}"#,
        br#"{"model":"tiny","messages":[{"role":"user","content":[{"type":"text","text":"describe"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}}]}],"max_completion_tokens":64,"temperature":0.2}"#,
        br#"{"model":"tiny","stream":true,"stream_options":{"include_usage":false},"messages":[{"role":"user","content":"count to 3"}],"max_tokens":16,"user":"u-42"}"#,
        br#"{"model":"tiny","stream":true,"stream_options":{"include_usage":true},"session_id":"s-7","messages":[{"role":"user","name":"ann","content":"again"}],"max_tokens":null}"#,
        br#"{"messages":[{"role":"user","name":"\u00fcn\u00ef","content":"\u65e5\u672c \ud83d\ude00 \"q\" \\ back"}],"stream":false,"n":1}"#,
        br#"{"model":"tiny","prompt":"Once upon a time","max_tokens":8,"stream":true}"#,
        br#"{"model":"tiny","prompt":[1,2,3,4096],"max_tokens":8,"logprobs":2}"#,
        br#"{"prompt":["a","b"],"echo":true,"user":"u-1","stream":true,"stream_options":null}"#,
    ]);
    all.extend(seeds(&[VLLM_CHAT, VLLM_COMPLETION]));
    all.extend(seeds(VLLM_ERRORS));
    all
});

/// Captured streams and bodies, the streams also with CRLF line ends, and a stream whose usage
/// chunk is the gateway's to strip.
static ENGINE_ANSWERS: LazyLock<Vec<Vec<u8>>> = LazyLock::new(|| {
    let mut all = seeds(&[
        VLLM_CHAT_STREAM,
        VLLM_COMPLETION_STREAM,
        VLLM_CHAT,
        VLLM_COMPLETION,
        b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\ndata: {\"id\":\"x\",\"choices\":[],\"usage\":{\"prompt_tokens\":332,\"completion_tokens\":8,\"prompt_tokens_details\":{\"cached_tokens\":320}}}\n\ndata: [DONE]\n\n",
        b"data: {\"error\":{\"message\":\"upstream connection lost\",\"type\":\"server_error\"}}\n\n",
        b": keep-alive\n\nevent: message\nid: 7\nretry: 100\ndata: {\"choices\":[]}\n\n",
    ]);
    for stream in [VLLM_CHAT_STREAM, VLLM_COMPLETION_STREAM] {
        let text = String::from_utf8_lossy(stream).replace('\n', "\r\n");
        all.push(text.into_bytes());
    }
    all.extend(seeds(VLLM_ERRORS));
    all
});

/// The whole captured exposition, and slices of it so most cases stay small.
static METRICS: LazyLock<Vec<Vec<u8>>> = LazyLock::new(|| {
    let lines: Vec<&str> = VLLM_METRICS.lines().collect();
    let mut all = vec![VLLM_METRICS.as_bytes().to_vec()];
    all.extend(lines.chunks(24).map(|c| c.join("\n").into_bytes()));
    all.extend(seeds(&[
        b"sglang:num_running_reqs{tp_rank=\"0\"} 4\nsglang:num_running_reqs{tp_rank=\"1\"} 1\nsglang:num_queue_reqs 7 1700000000\nsglang:token_usage 0.5\n",
        b"vllm:num_gpu_blocks 1000\nvllm:num_free_gpu_blocks{engine=\"0\"} 250\nvllm:gpu_cache_usage_perc 0.75\n",
    ]));
    all
});

static MODELS: LazyLock<Vec<Vec<u8>>> = LazyLock::new(|| {
    seeds(&[
        VLLM_MODELS,
        br#"{"object":"list","data":[{"id":"a"},{"id":"b","object":"model"}]}"#,
    ])
});

/// Both forms RFC 9110 allows (the three date formats) and numbers beyond a `Duration`.
static RETRY_AFTER: LazyLock<Vec<Vec<u8>>> = LazyLock::new(|| {
    seeds(&[
        b"120",
        b" 2.5 ",
        b"0",
        b"1e20",
        b"Sun, 06 Nov 1994 08:49:37 GMT",
        b"Sunday, 06-Nov-94 08:49:37 GMT",
        b"Sun Nov  6 08:49:37 1994",
        b"Fri, 31 Dec 9999 23:59:59 GMT",
        b"Thu, 01 Jan 1970 00:00:00 GMT",
    ])
});

static HEADER_VALUES: LazyLock<Vec<Vec<u8>>> = LazyLock::new(|| {
    seeds(&[
        b"Bearer sk-abc123",
        b"sk-abc123",
        b"acme",
        b"250",
        b" 1000 ",
        b"batch",
        b"interactive",
        b"s-1",
        b"",
    ])
});

/// The README's complete file, a default file for every policy, and anchors and merges.
static YAML: LazyLock<Vec<Vec<u8>>> = LazyLock::new(|| {
    let complete = README
        .split_once("A complete file")
        .and_then(|(_, rest)| rest.split("```yaml\n").nth(1))
        .and_then(|block| block.split("```").next())
        .expect("crates/gateway/README.md has a complete YAML file");
    let mut all = vec![complete.as_bytes().to_vec()];
    for name in PolicyConfig::NAMES {
        let config = Config {
            policy: PolicyConfig::default_for(name).expect("a listed policy"),
            endpoints: vec![EndpointConfig::from_url("http://127.0.0.1:9001/v1")],
            ..Config::default()
        };
        all.push(yaml_serde::to_string(&config).unwrap().into_bytes());
    }
    all.extend(seeds(&[
        b"endpoints:\n  - &e {url: 'http://a:1', weight: 2, labels: {zone: a}}\n  - <<: *e\n    url: http://b:2/v1/\npolicy: {name: round_robin}\n",
        b"listener: {header_read_timeout_secs: 0.5, idle_timeout_secs: 1e3, http2: false}\nhedge: {enabled: true, window: 16}\n",
    ]));
    all
});

static ENDPOINTS: LazyLock<Vec<Vec<u8>>> = LazyLock::new(|| {
    seeds(&[
        br#"{"url":"http://10.0.0.1:8000/v1","name":"gpu-a","weight":1.0,"model":"tiny","labels":{"zone":"a"},"api_key":"sk-x"}"#,
        br#"{"url":"http://127.0.0.1:9001"}"#,
    ])
});

const HEADER_NAMES: &[&str] = &[
    "authorization",
    "x-kvgate-tenant",
    "x-kvgate-session",
    "x-session-id",
    "session_id",
    "x-kvgate-deadline-ms",
    "x-kvgate-priority",
    "content-type",
];

fn headers() -> impl Strategy<Value = Vec<(Index, Vec<u8>)>> {
    prop::collection::vec((any::<Index>(), input(&HEADER_VALUES)), 0..6)
}

/// Values a header cannot carry (control characters) are left out, as hyper would refuse them.
fn header_map(headers: &[(Index, Vec<u8>)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        if let Ok(value) = HeaderValue::from_bytes(value) {
            map.append(HEADER_NAMES[name.index(HEADER_NAMES.len())], value);
        }
    }
    map
}

fn header_str<'a>(map: &'a HeaderMap, name: &str) -> Option<&'a str> {
    map.get(name)
        .and_then(|v| v.to_str().ok())
        .filter(|s| !s.is_empty())
}

fn limits() -> impl Strategy<Value = RequestConfig> {
    (
        prop_oneof![Just(8 << 20), 0usize..1024],
        prop_oneof![
            Just(1 << 20),
            Just(0),
            Just(1),
            Just(u64::MAX),
            any::<u64>()
        ],
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(max_body_bytes, max_tokens_limit, stream_usage, more)| {
            let mut limits = RequestConfig {
                max_body_bytes,
                max_tokens_limit,
                stream_usage,
                ..RequestConfig::default()
            };
            if more {
                limits.session_body_fields = vec!["session_id".into(), "user".into()];
            }
            limits
        })
}

fn object(bytes: &[u8]) -> Result<serde_json::Map<String, Value>, TestCaseError> {
    match serde_json::from_slice(bytes) {
        Ok(Value::Object(map)) => Ok(map),
        other => Err(TestCaseError::fail(format!("not a JSON object: {other:?}"))),
    }
}

/// What the gateway relies on in an accepted request.
fn check_accepted(
    api: Api,
    body: &[u8],
    map: &HeaderMap,
    limits: &RequestConfig,
    r: &Inference,
) -> TestCaseResult {
    prop_assert!(body.len() <= limits.max_body_bytes);
    prop_assert_eq!(r.api, api);
    if let Some(n) = r.request.max_output_tokens {
        prop_assert!(n >= 1 && u64::from(n) <= limits.max_tokens_limit);
    }
    let text = r.request.prompt.text.as_deref();
    prop_assert!(text.is_some());
    prop_assert_eq!(r.request.prompt_tokens, estimate_tokens(text.unwrap_or("")));
    if r.strip_usage {
        prop_assert!(r.stream && limits.stream_usage);
        let (mut sent, mut received) = (object(&r.body)?, object(body)?);
        prop_assert_eq!(&sent["stream_options"]["include_usage"], &Value::Bool(true));
        sent.remove("stream_options");
        received.remove("stream_options");
        prop_assert_eq!(sent, received, "only stream_options may change");
    } else {
        prop_assert_eq!(&r.body[..], body, "forwarded byte for byte");
    }
    match header_str(map, &limits.tenant_header) {
        Some(t) => prop_assert_eq!(r.request.tenant.as_deref(), Some(t)),
        None => prop_assert!(r
            .request
            .tenant
            .as_deref()
            .is_none_or(|t| t.starts_with("key:") && t.len() == 20)),
    }
    prop_assert_eq!(
        r.request.priority == Priority::Batch,
        header_str(map, &limits.priority_header) == Some("batch")
    );
    prop_assert_eq!(
        r.deadline.is_some(),
        header_str(map, &limits.deadline_header).is_some()
    );
    Ok(())
}

/// A request body and headers are accepted with the limits `parse` enforces, or refused with a
/// 4xx.
#[test]
fn requests() {
    let strategy = (any::<bool>(), input(&REQUESTS), headers(), limits());
    run("requests", strategy, |(chat, body, headers, limits)| {
        let api = if chat { Api::Chat } else { Api::Completions };
        let map = header_map(&headers);
        match parse::parse(api, &map, Bytes::from(body.clone()), &limits) {
            Ok(r) => check_accepted(api, &body, &map, &limits, &r),
            Err(e) => {
                prop_assert!(e.status.is_client_error(), "{e:?}");
                Ok(())
            }
        }
    });
}

/// The usage read from a body does not depend on how the body was framed.
#[test]
fn usage_tail() {
    run(
        "usage_tail",
        (input(&ENGINE_ANSWERS), cuts()),
        |(data, cuts)| {
            let mut framed = UsageTail::default();
            for piece in pieces(&data, &cuts) {
                framed.feed(piece);
            }
            let mut whole = UsageTail::default();
            whole.feed(&data);
            prop_assert_eq!(framed.usage(), whole.usage());
            // Far below the 16 KiB tail: the whole body is kept.
            if data.len() <= 4096 {
                prop_assert_eq!(whole.usage(), usage::parse(&data));
            }
            Ok(())
        },
    );
}

fn strip(pieces: &[&[u8]]) -> Vec<u8> {
    let mut stripper = UsageStripper::default();
    let mut out = Vec::new();
    for piece in pieces {
        out.extend_from_slice(&stripper.filter(piece));
    }
    out.extend_from_slice(&stripper.finish());
    out
}

fn is_subsequence(part: &[u8], of: &[u8]) -> bool {
    let mut rest = of.iter();
    part.iter().all(|b| rest.any(|c| c == b))
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// The stream filter only ever removes bytes, whatever the framing, and leaves nothing that a
/// second pass would remove.
#[test]
fn stream_filter() {
    run(
        "stream_filter",
        (input(&ENGINE_ANSWERS), cuts()),
        |(data, cuts)| {
            let whole = strip(&[&data]);
            prop_assert_eq!(
                &strip(&pieces(&data, &cuts)),
                &whole,
                "framing changed the output"
            );
            prop_assert!(is_subsequence(&whole, &data));
            if !contains(&data, b"\"choices\":[]") {
                prop_assert_eq!(&whole, &data);
            }
            prop_assert_eq!(&strip(&[&whole]), &whole, "a second pass removed more");
            Ok(())
        },
    );
}

/// Lines are independent: two expositions read together sum their counts and keep the larger
/// usage, which stays within 0..=1; what the pool derives from an observation is defined.
#[test]
fn metrics() {
    run("metrics", (text(&METRICS), text(&METRICS)), |(a, b)| {
        let (one, two) = (scrape::parse_metrics(&a), scrape::parse_metrics(&b));
        let both = scrape::parse_metrics(&format!("{a}\n{b}"));
        let get = |o: &Option<Observation>| {
            o.as_ref()
                .map_or((0, 0, 0.0), |o| (o.running, o.waiting, o.kv_usage))
        };
        let ((r1, w1, u1), (r2, w2, u2)) = (get(&one), get(&two));
        prop_assert_eq!(
            get(&both),
            (r1.saturating_add(r2), w1.saturating_add(w2), u1.max(u2))
        );
        prop_assert!((0.0..=1.0).contains(&u1));
        if let Some(o) = one {
            let _ = (o.outstanding(), o.capacity_tokens());
            prop_assert!(o.used_blocks() <= o.total_blocks);
        }
        Ok(())
    });
}

/// Each model id comes from its own object.
#[test]
fn models() {
    run("models", input(&MODELS), |body| {
        let ids = scrape::parse_models(&body);
        let objects = body.iter().filter(|b| **b == b'{').count();
        prop_assert!(ids.len() <= objects, "{ids:?}");
        Ok(())
    });
}

fn max_wait() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::from_secs(60)),
        Just(Duration::ZERO),
        Just(Duration::from_secs(u64::MAX)),
        Just(Duration::MAX),
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
    ]
}

fn now() -> impl Strategy<Value = SystemTime> {
    prop_oneof![
        Just(SystemTime::UNIX_EPOCH),
        Just(SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777)),
        (0u64..1 << 40).prop_map(|s| SystemTime::UNIX_EPOCH + Duration::from_secs(s)),
    ]
}

/// A Retry-After never asks for more than the configured maximum.
#[test]
fn retry_after() {
    let strategy = (input(&RETRY_AFTER), max_wait(), now());
    run("retry_after", strategy, |(value, max, now)| {
        if let Ok(value) = HeaderValue::from_bytes(&value) {
            if let Some(wait) = upstream::parse_retry_after(&value, max, now) {
                prop_assert!(wait <= max, "{wait:?} > {max:?}");
            }
        }
        Ok(())
    });
}

/// A configuration that loads can run: the gateway and its listener build from it, and it
/// writes back to YAML that loads to the same configuration.
#[test]
fn config() {
    run("config", text(&YAML), |yaml| config_round_trips(&yaml));
}

/// A configuration that loads writes back to YAML that loads to the same, and builds a gateway
/// (or fails to) without panicking.
fn config_round_trips(yaml: &str) -> TestCaseResult {
    let Ok(config) = Config::from_yaml(yaml) else {
        return Ok(());
    };
    let written = yaml_serde::to_string(&config).map_err(|e| TestCaseError::fail(e.to_string()))?;
    match Config::from_yaml(&written) {
        Ok(again) => prop_assert_eq!(yaml_serde::to_string(&again).ok(), Some(written)),
        Err(e) => prop_assert!(false, "{written}\ndoes not load back: {e}"),
    }
    let _ = Listening::new(&config.listener, ConnectionMetrics::default());
    // Building opens the access log, the trace exporter and the budget store: I/O, not
    // parsing, and a mutated path would create files wherever the fuzzer runs (a mutated
    // `store` once left 3.6 MB databases named `null...` in the crate's directory).
    let mut config = config;
    config.observability.access_log = None;
    config.observability.otlp_traces_endpoint = None;
    config.tenancy.store = None;
    let _ = Gateway::with_seed(config, 1);
    Ok(())
}

#[test]
fn a_fuzzed_config_creates_no_files() {
    let name = format!("kvgate-fuzz-store-{}.redb", std::process::id());
    let yaml = format!("tenancy:\n  store: {name}\n");
    assert!(Config::from_yaml(&yaml).is_ok_and(|c| c.tenancy.store.is_some()));
    config_round_trips(&yaml).unwrap();
    let created = std::path::Path::new(&name).exists();
    let _ = std::fs::remove_file(&name);
    assert!(!created, "{name} was created");
}

/// An endpoint the admin API accepts joins a gateway.
#[test]
fn admin_endpoint() {
    run("admin_endpoint", input(&ENDPOINTS), |body| {
        let Ok(endpoint) = serde_json::from_slice::<EndpointConfig>(&body) else {
            return Ok(());
        };
        let mut config = Config::default();
        config.endpoints.push(endpoint);
        if config.validate().is_ok() {
            let gateway =
                Gateway::with_seed(config, 1).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(gateway.status().len(), 1);
        }
        Ok(())
    });
}
