//! The semantic cache against real processes: `kvgate serve` with `semantic_cache` on in front
//! of `kvgate engine`, whose `/v1/embeddings` is the embedder. Exact and semantic hits, misses
//! on every fingerprint change and on a guard, tenants kept apart, a streamed replay that is
//! valid SSE, an embedder stall that fails open within its deadline, fifty identical
//! concurrent misses making one upstream call, the client's `no-cache` and `no-store`, and
//! misses held to the admission cap while hits pass it.

// Each test walks one scenario end to end; splitting it would scatter the story.
#![allow(clippy::too_many_lines)]

mod support;

use serde_json::{json, Value};
use std::time::{Duration, Instant};
use support::*;

fn config(engine: &Proc, extra: &str) -> String {
    format!(
        r#"
semantic_cache:
  enabled: true
  threshold: 0.9
  embed_deadline_ms: 300
  embedder: {{type: openai, url: "{url}", model: test-model}}
{extra}
"#,
        url = engine.url
    )
}

fn ask(question: &str) -> Value {
    json!({"model": "test-model", "max_tokens": 4, "messages": [{"role": "user", "content": question}]})
}

async fn post(
    gateway: &Proc,
    body: &Value,
    headers: &[(&str, &str)],
) -> (String, Option<String>, String) {
    let mut request = client()
        .post(format!("{}/v1/chat/completions", gateway.url))
        .json(body);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), 200);
    let cache = header(&response, "x-kvgate-cache");
    let similarity = response
        .headers()
        .get("x-kvgate-cache-similarity")
        .map(|v| v.to_str().unwrap().to_owned());
    (cache, similarity, response.text().await.unwrap())
}

/// Requests the engine completed, from its own metrics.
async fn engine_requests(engine: &Proc) -> f64 {
    let text = get_text(&client(), &engine.url, "/metrics").await;
    text.lines()
        .filter(|l| l.starts_with("vllm:request_success_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_and_semantic_hits_and_misses_on_any_other_difference() {
    let engine = engine("e0", "0", &[]);
    let gw = gateway_with_config(&[&engine], "semcache-hits", &config(&engine, "")).await;
    let q = ask("What is the capital of France?");
    let (cache, _, first) = post(&gw, &q, &[]).await;
    assert_eq!(cache, "miss");
    let (cache, similarity, again) = post(&gw, &q, &[]).await;
    assert_eq!((cache.as_str(), similarity), ("hit", None));
    assert_eq!(again, first, "the stored answer, byte for byte");

    // A paraphrase sharing most words embeds close (the engine's bag of words: 0.93).
    let (cache, similarity, answer) =
        post(&gw, &ask("What is the capital city of France?"), &[]).await;
    assert_eq!(cache, "hit");
    let similarity: f32 = similarity
        .expect("a semantic hit names its similarity")
        .parse()
        .unwrap();
    assert!((0.9..1.0).contains(&similarity), "{similarity}");
    assert_eq!(answer, first);

    // The same words in another order embed identically: the order guard stops it. A changed
    // number leaves 11 of 12 words (0.92): the numbers guard stops it, against both entries.
    let plan = |s: &str| {
        ask(&format!(
            "Please convert {s} for my weekly running training plan"
        ))
    };
    assert_eq!(post(&gw, &plan("5 km to miles"), &[]).await.0, "miss");
    assert_eq!(post(&gw, &plan("5 miles to km"), &[]).await.0, "miss");
    assert_eq!(post(&gw, &plan("6 km to miles"), &[]).await.0, "miss");
    let metrics = get_text(&client(), &gw.url, "/metrics").await;
    assert_eq!(
        metric(
            &metrics,
            "kvgate_semantic_cache_guard_stops_total{reason=\"order\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &metrics,
            "kvgate_semantic_cache_guard_stops_total{reason=\"numbers\"}"
        ),
        Some(2.0)
    );

    // Everything but the last user message must match exactly.
    let changes = [
        ("temperature", json!(0.5)),
        ("top_p", json!(0.5)),
        ("seed", json!(3)),
        ("max_tokens", json!(5)),
        ("stop", json!(["x"])),
        (
            "tools",
            json!([{"type": "function", "function": {"name": "f"}}]),
        ),
        ("response_format", json!({"type": "json_object"})),
        ("user", json!("someone")),
    ];
    for (field, value) in changes {
        let mut body = q.clone();
        body[field] = value;
        assert_eq!(post(&gw, &body, &[]).await.0, "miss", "{field}");
    }
    let mut system = q.clone();
    system["messages"] = json!([
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "What is the capital of France?"}
    ]);
    assert_eq!(post(&gw, &system, &[]).await.0, "miss", "system prompt");
    let mut streamed = q.clone();
    streamed["stream"] = json!(true);
    assert_eq!(post(&gw, &streamed, &[]).await.0, "miss", "stream flag");
    let metrics = get_text(&client(), &gw.url, "/metrics").await;
    assert_eq!(
        metric(
            &metrics,
            "kvgate_semantic_cache_lookups_total{result=\"hit_semantic\"}"
        ),
        Some(1.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_never_see_each_others_answers() {
    let engine = engine("e0", "0", &[]);
    let keys = format!(
        r#"admin_token: adm
tenancy:
  keys:
    - {{name: a, key_sha256: "{a}", tenant: team-a}}
    - {{name: a2, key_sha256: "{a2}", tenant: team-a}}
    - {{name: b, key_sha256: "{b}", tenant: team-b}}"#,
        a = sha256("kvg-a"),
        a2 = sha256("kvg-a2"),
        b = sha256("kvg-b"),
    );
    let gw = gateway_with_config(&[&engine], "semcache-tenants", &config(&engine, &keys)).await;
    let q = ask("Summarise our internal product roadmap for next year");
    let with = |k: &'static str| [("authorization", k)];
    assert_eq!(post(&gw, &q, &with("Bearer kvg-a")).await.0, "miss");
    assert_eq!(post(&gw, &q, &with("Bearer kvg-a")).await.0, "hit");
    assert_eq!(
        post(&gw, &q, &with("Bearer kvg-a2")).await.0,
        "hit",
        "same tenant"
    );
    assert_eq!(
        post(&gw, &q, &with("Bearer kvg-b")).await.0,
        "miss",
        "other tenant"
    );
    // 8 of 9 words shared (0.94): each tenant's similar question finds its own entry.
    let similar = ask("Summarise our internal product roadmap for the next year");
    assert_eq!(
        post(&gw, &similar, &with("Bearer kvg-b")).await.0,
        "hit",
        "b's own"
    );
    assert_eq!(
        post(&gw, &similar, &with("Bearer kvg-a2")).await.0,
        "hit",
        "a's own"
    );
    // An operator's flush of one tenant leaves the other's entries.
    let flush = |query: &'static str| {
        client()
            .delete(format!("{}/admin/cache{query}", gw.url))
            .bearer_auth("adm")
            .send()
    };
    let flushed: Value = flush("?tenant=team-a").await.unwrap().json().await.unwrap();
    assert_eq!(flushed["flushed"], 1, "{flushed}");
    assert_eq!(post(&gw, &q, &with("Bearer kvg-a")).await.0, "miss");
    assert_eq!(post(&gw, &q, &with("Bearer kvg-b")).await.0, "hit");
    let both = flush("?tenant=team-a&key=a").await.unwrap();
    assert_eq!(both.status(), 400);
    let flushed: Value = flush("").await.unwrap().json().await.unwrap();
    assert_eq!(flushed["flushed"], 2, "{flushed}");
    assert_eq!(post(&gw, &q, &with("Bearer kvg-b")).await.0, "miss");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_answer_replays_as_valid_sse() {
    let engine = engine("e0", "0", &[]);
    let gw = gateway_with_config(&[&engine], "semcache-sse", &config(&engine, "")).await;
    for usage in [false, true] {
        let mut q = ask(&format!("Tell me a short story (usage {usage})"));
        q["stream"] = json!(true);
        if usage {
            q["stream_options"] = json!({"include_usage": true});
        }
        let (cache, _, first) = post(&gw, &q, &[]).await;
        assert_eq!(cache, "miss");
        let (cache, _, replay) = post(&gw, &q, &[]).await;
        assert_eq!(cache, "hit");
        assert_eq!(replay, first);
        let mut reader = kvgate_sse::Reader::new();
        let mut feed = reader.feed(replay.as_bytes());
        let (mut chunks, mut done, mut usages) = (0, false, 0);
        while let Some(event) = feed.next_event() {
            match event.expect("a well-formed event") {
                kvgate_sse::Event::Data(d) => {
                    let chunk = d.chunk().expect("a chunk");
                    assert!(!done, "nothing after [DONE]");
                    chunks += 1;
                    usages += usize::from(chunk.usage.is_some());
                    let v: Value = serde_json::from_slice(d.data()).unwrap();
                    assert_eq!(v["object"], "chat.completion.chunk");
                }
                kvgate_sse::Event::Done(_) => done = true,
            }
        }
        assert!(done && chunks >= 2, "{replay}");
        assert_eq!(
            usages,
            usize::from(usage),
            "usage only when asked: {replay}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedder_stall_fails_open_within_the_deadline() {
    let engine = engine("e0", "0", &["--fault", "stall_embed"]);
    let gw = gateway_with_config(&[&engine], "semcache-stall", &config(&engine, "")).await;
    let started = Instant::now();
    let (cache, _, body) = post(&gw, &ask("Is the embedder up?"), &[]).await;
    assert_eq!(cache, "miss");
    assert!(body.contains("chat.completion"), "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    // Stored without an embedding: the same request still hits exactly.
    assert_eq!(post(&gw, &ask("Is the embedder up?"), &[]).await.0, "hit");
    let metrics = get_text(&client(), &gw.url, "/metrics").await;
    assert_eq!(
        metric(
            &metrics,
            "kvgate_semantic_cache_embed_failures_total{reason=\"timeout\"}"
        ),
        Some(1.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_identical_misses_make_one_upstream_call() {
    let engine = engine("e0", "1", &[]);
    let gw = gateway_with_config(&[&engine], "semcache-flight", &config(&engine, "")).await;
    let mut q = ask("Write a haiku about caches");
    q["max_tokens"] = json!(32);
    q["ignore_eos"] = json!(true);
    let before = engine_requests(&engine).await;
    let calls = (0..50).map(|_| {
        let (url, q) = (gw.url.clone(), q.clone());
        tokio::spawn(async move {
            let r = client()
                .post(format!("{url}/v1/chat/completions"))
                .json(&q)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            (header(&r, "x-kvgate-cache"), r.text().await.unwrap())
        })
    });
    let answers: Vec<(String, String)> = futures_util::future::join_all(calls)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let misses = answers.iter().filter(|(c, _)| c == "miss").count();
    assert_eq!(misses, 1, "one leader");
    assert!(answers.iter().all(|(_, body)| body == &answers[0].1));
    assert_eq!(engine_requests(&engine).await - before, 1.0);
    let metrics = get_text(&client(), &gw.url, "/metrics").await;
    assert_eq!(
        metric(
            &metrics,
            "kvgate_semantic_cache_lookups_total{result=\"hit_exact\"}"
        ),
        Some(49.0)
    );
    // Most arrive while the leader's answer is generated (about a second) and wait for it.
    let waited = metric(
        &metrics,
        "kvgate_semantic_cache_singleflight_total{reason=\"answered\"}",
    );
    assert!(waited.is_some_and(|n| n >= 1.0), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_cache_and_no_store_are_honoured() {
    let engine = engine("e0", "0", &[]);
    let gw = gateway_with_config(&[&engine], "semcache-controls", &config(&engine, "")).await;
    let q = ask("How long do caches keep answers?");
    let no_store = [("cache-control", "no-store")];
    assert_eq!(post(&gw, &q, &no_store).await.0, "miss");
    assert_eq!(post(&gw, &q, &[]).await.0, "miss", "not stored before");
    assert_eq!(post(&gw, &q, &[]).await.0, "hit");
    let no_cache = [("x-kvgate-cache-control", "no-cache")];
    assert_eq!(post(&gw, &q, &no_cache).await.0, "miss", "not read");
    let both = [("cache-control", "no-cache, no-store")];
    assert_eq!(post(&gw, &q, &both).await.0, "bypass");
    let mut hot = q.clone();
    hot["temperature"] = json!(1.8);
    assert_eq!(
        post(&gw, &hot, &[]).await.0,
        "bypass",
        "above max_temperature"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misses_wait_for_admission_and_hits_do_not() {
    let engine = engine("e0", "1", &[]);
    let admission = "admission: {max_concurrency: 1, max_queue: 0, fair_headroom: 0}";
    let gw = gateway_with_config(
        &[&engine],
        "semcache-admission",
        &config(&engine, admission),
    )
    .await;
    let cached = ask("A question asked before");
    assert_eq!(post(&gw, &cached, &[]).await.0, "miss");
    // One slow miss holds the only slot.
    let mut slow = ask("A long answer, please");
    slow["max_tokens"] = json!(400);
    slow["ignore_eos"] = json!(true);
    let url = gw.url.clone();
    let holder = tokio::spawn(async move {
        client()
            .post(format!("{url}/v1/chat/completions"))
            .json(&slow)
            .send()
            .await
            .unwrap()
            .status()
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while engine_running(&engine).await < 1.0 {
        assert!(Instant::now() < deadline, "the slow request never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Distinct misses (a cache whose hits dried up) are refused by admission, not sent.
    for i in 0..5 {
        let r = client()
            .post(format!("{}/v1/chat/completions", gw.url))
            .json(&ask(&format!("fresh question number {i}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 429, "queue full");
    }
    assert!(engine_running(&engine).await <= 1.0);
    // A hit needs no slot.
    assert_eq!(post(&gw, &cached, &[]).await.0, "hit");
    assert_eq!(holder.await.unwrap(), 200);
}

async fn engine_running(engine: &Proc) -> f64 {
    let text = get_text(&client(), &engine.url, "/metrics").await;
    metric(&text, "vllm:num_requests_running").unwrap_or(0.0)
}

/// A `nats-server` on a loopback port (Debian's, as `cluster.rs` uses), killed on drop.
struct Nats(std::process::Child);

impl Drop for Nats {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `base`'s metric `sample` until it reads `want`, failing after ten seconds.
async fn wait_metric(base: &str, sample: &str, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = get_text(&client(), base, "/metrics").await;
        if metric(&text, sample) == Some(want) {
            return;
        }
        assert!(Instant::now() < deadline, "{sample} never reached {want}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_stored_answers_over_nats() {
    let port = free_port();
    let child = std::process::Command::new("/usr/sbin/nats-server")
        .args(["-a", "127.0.0.1", "-p", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("nats-server is not installed (scripts/test.sh installs Debian's)");
    let _nats = Nats(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nats-server did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    let engine = engine("e0", "0", &[]);
    let yaml = format!(
        "{}cluster: {{url: \"nats://127.0.0.1:{port}\", name: semcache}}\n",
        config(&engine, "")
    );
    let a = gateway_with_config(&[&engine], "semcache-nats-a", &yaml).await;
    let b = gateway_with_config(&[&engine], "semcache-nats-b", &yaml).await;
    for r in [&a, &b] {
        wait_metric(&r.url, "kvgate_cluster_peers ", 1.0).await;
    }
    let q = ask("Which gateway replica answered this question for me?");
    let (cache, _, first) = post(&a, &q, &[]).await;
    assert_eq!(cache, "miss");
    wait_metric(
        &b.url,
        "kvgate_semantic_cache_peer_entries_total{reason=\"applied\"}",
        1.0,
    )
    .await;
    let before = engine_requests(&engine).await;
    let (cache, _, answer) = post(&b, &q, &[]).await;
    assert_eq!((cache.as_str(), answer), ("hit", first));
    // The peer's embedding came along: a similar question (8 of 9 words, 0.94) hits there too.
    let similar = ask("Which gateway replica answered this question for me today?");
    assert_eq!(post(&b, &similar, &[]).await.0, "hit");
    // Another tenant still misses there.
    let other = [("x-kvgate-tenant", "someone-else")];
    assert_eq!(post(&b, &q, &other).await.0, "miss");
    assert_eq!(engine_requests(&engine).await - before, 1.0);
}
