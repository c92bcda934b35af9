//! Mid-stream continuation against real `kvgate engine` processes: an engine that resets the
//! connection after a few streamed tokens, a second one that continues the answer, and the
//! client's stream checked event by event against what the second engine says when asked
//! directly.

mod support;

use serde_json::{json, Value};
use support::{
    client, engine, engine_at, gateway, gateway_with_config, get_text, header, metric, sse_data,
    user, wait_for, Proc,
};

/// Two engines with the same seed (so the same prompt gives the same text on either): `a`,
/// the first tier, answers at once and breaks every stream after `after` tokens; `b` is
/// healthy and runs at `b_time_scale`.
async fn fleet(name: &str, after: u32, b_time_scale: &str, extra: &str) -> (Proc, Proc, Proc) {
    let fault = format!("disconnect_mid:after={after}");
    let a = engine("a", "0", &["--fault", &fault]);
    let b = engine("b", b_time_scale, &[]);
    let yaml = format!(
        "scrape: {{interval_ms: 100}}\nendpoints:\n  - {{url: \"{}\", name: a}}\n  - {{url: \"{}\", name: b, tier: 1}}\n{extra}",
        a.url, b.url
    );
    let g = gateway_with_config(&[], name, &yaml).await;
    (a, b, g)
}

/// The stream's chunks (every `data:` but the final `[DONE]`, which must be there once).
fn chunks(body: &str) -> Vec<Value> {
    let data = sse_data(body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{body}");
    assert_eq!(data.iter().filter(|d| *d == "[DONE]").count(), 1, "{body}");
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
        .collect()
}

/// The text of a stream's chunks: chat deltas or completion text.
fn text(chunks: &[Value]) -> String {
    chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .filter_map(|c| c["delta"]["content"].as_str().or(c["text"].as_str()))
        .collect()
}

async fn post(url: &str, path: &str, body: &Value) -> reqwest::Response {
    let r = client()
        .post(format!("{url}{path}"))
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r
}

/// Streamed chats of six tokens, one per prompt, sent at once through the gateway at `url`:
/// their bodies, in the prompts' order.
async fn streamed_together(url: &str, prompts: impl Iterator<Item = String>) -> Vec<String> {
    let streams = prompts.map(|prompt| {
        let request = json!({
            "model": "test-model", "messages": user(&prompt),
            "max_tokens": 6, "ignore_eos": true, "stream": true,
        });
        async move {
            let body = post(url, "/v1/chat/completions", &request).await;
            body.text().await.unwrap()
        }
    });
    futures_util::future::join_all(streams).await
}

/// A stream that ended well: no error event, and its answer ran to its length.
fn assert_whole(body: &str) {
    assert!(!body.contains("\"error\""), "{body}");
    let finish = chunks(body)
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .any(|c| c["finish_reason"] == "length");
    assert!(finish, "{body}");
}

/// What `engine` answers to `body`, not streamed.
async fn answer(engine: &Proc, path: &str, mut body: Value) -> String {
    body["stream"] = json!(false);
    body.as_object_mut().unwrap().remove("stream_options");
    let v: Value = post(&engine.url, path, &body).await.json().await.unwrap();
    let choice = &v["choices"][0];
    choice["message"]["content"]
        .as_str()
        .or(choice["text"].as_str())
        .unwrap()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_stream_broken_after_five_tokens_is_continued_on_another_engine() {
    let (_a, b, g) = fleet("resume-chat", 5, "0", "").await;
    let mut request = json!({
        "model": "test-model", "messages": user("tell me about caches"), "max_tokens": 20,
        "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true},
    });
    let r = post(&g.url, "/v1/chat/completions", &request).await;
    assert_eq!(
        r.headers()["x-kvgate-endpoint"],
        "a",
        "the first tier answered first"
    );
    let body = r.text().await.unwrap();
    let chunks = chunks(&body);
    let got = text(&chunks);

    // The same seed gives the same text: `a`'s five tokens are the first five `b` would write.
    let whole = answer(&b, "/v1/chat/completions", request.clone()).await;
    let words: Vec<&str> = whole.split_inclusive(' ').collect();
    let before: String = whole
        .match_indices(' ')
        .nth(5)
        .map_or(whole.as_str(), |(i, _)| &whole[..i])
        .to_string();
    assert!(words.len() >= 5, "{whole}");
    assert!(
        got.starts_with(&before),
        "{got:?} does not start with {before:?}"
    );
    // ... and the rest is what `b` writes when asked to continue them.
    request["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "assistant", "content": before}));
    request["continue_final_message"] = json!(true);
    request["add_generation_prompt"] = json!(false);
    request["max_tokens"] = json!(15);
    let continued = answer(&b, "/v1/chat/completions", request).await;
    assert_eq!(got, format!("{before}{continued}"), "{body}");

    // One stream: the first chunk's identity throughout, one role delta, one finish, and
    // usage counting both engines' tokens.
    let id = &chunks[0]["id"];
    assert!(
        chunks
            .iter()
            .all(|c| &c["id"] == id && c["model"] == "test-model"),
        "{body}"
    );
    let roles = chunks
        .iter()
        .filter(|c| {
            c["choices"]
                .get(0)
                .is_some_and(|c| c["delta"].get("role").is_some())
        })
        .count();
    assert_eq!(roles, 1, "{body}");
    let finishes: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .map(|c| &c["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finishes, [&json!("length")], "{body}");
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], 20, "{body}");
    assert!(!body.contains("\"error\""), "{body}");

    let metrics = get_text(&client(), &g.url, "/metrics").await;
    assert_eq!(
        metric(&metrics, "kvgate_stream_resumes_total{reason=\"resumed\"}"),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(metric(&metrics, "kvgate_retries_total"), None, "{metrics}");
    assert!(metrics.contains("outcome=\"ok\",policy="), "{metrics}");
    // No session's turn ended on the engine that broke the stream: nothing to re-home, so it
    // is not probed either (re-homing is on by default).
    assert_eq!(
        metric(&metrics, "kvgate_rehome_probes_total"),
        None,
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_stream_is_continued_from_its_prompt_and_the_client_did_not_ask_for_usage() {
    let (_a, b, g) = fleet("resume-completion", 3, "0", "").await;
    let mut request = json!({
        "model": "test-model", "prompt": "Once upon a time", "max_tokens": 12,
        "ignore_eos": true, "stream": true,
    });
    let body = post(&g.url, "/v1/completions", &request)
        .await
        .text()
        .await
        .unwrap();
    let chunks = chunks(&body);
    assert!(
        chunks
            .iter()
            .all(|c| c.get("usage").is_none_or(Value::is_null)),
        "the usage the gateway asked for is stripped: {body}"
    );
    let got = text(&chunks);
    let whole = answer(&b, "/v1/completions", request.clone()).await;
    let before = &whole[..whole.match_indices(' ').nth(3).unwrap().0];
    request["prompt"] = json!(format!("Once upon a time{before}"));
    request["max_tokens"] = json!(9);
    let continued = answer(&b, "/v1/completions", request).await;
    assert_eq!(got, format!("{before}{continued}"), "{body}");
    assert_eq!(got.split(' ').count() - 1, 12, "{got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_that_cannot_be_continued_exactly_end_with_the_error_event() {
    let (_a, _b, g) = fleet("resume-refused", 3, "0", "").await;
    let request = json!({
        "model": "test-model", "messages": user("hi"), "max_tokens": 10,
        "ignore_eos": true, "stream": true, "logprobs": true,
    });
    let (_a2, _b2, off) = fleet("resume-off", 3, "0", "resume: {enabled: false}\n").await;
    let resumable = {
        let mut r = request.clone();
        r.as_object_mut().unwrap().remove("logprobs");
        r
    };
    for (gateway, body) in [(&g, &request), (&off, &resumable)] {
        let text = post(&gateway.url, "/v1/chat/completions", body)
            .await
            .text()
            .await
            .unwrap();
        let last: Value = serde_json::from_str(sse_data(&text).last().unwrap()).unwrap();
        assert_eq!(last["error"]["code"], "upstream_stream_error", "{text}");
    }
    for (gateway, reason) in [(&g, "logprobs"), (&off, "disabled")] {
        let metrics = get_text(&client(), &gateway.url, "/metrics").await;
        let sample = format!("kvgate_stream_resumes_total{{reason=\"{reason}\"}}");
        assert_eq!(metric(&metrics, &sample), Some(1.0), "{metrics}");
        assert!(metrics.contains("outcome=\"stream_error\""), "{metrics}");
    }
}

/// Three streams that break together: with the default gate their continuations reach the
/// healthy engine one at a time (each waits at the gateway for the previous one's first
/// token); with no limit per endpoint they still do while they yield to requests awaiting
/// their first token (another continuation among them), and with neither, all at once. Not
/// staged, so the waits are the gate's alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continuations_of_streams_broken_together_reach_an_engine_one_at_a_time() {
    // `b` runs in real time: a continuation's prefill of this ~2,000-token prompt takes a few
    // hundred milliseconds.
    let prompt = "cache ".repeat(2_000);
    for (name, extra, gated) in [
        ("resume-gate", "resume: {stage_tokens: 0}\n", true),
        (
            "resume-yield",
            "resume: {per_endpoint: 0, stage_tokens: 0}\n",
            true,
        ),
        (
            "resume-ungated",
            "resume: {per_endpoint: 0, yield_ms: 0, stage_tokens: 0}\n",
            false,
        ),
    ] {
        let (_a, _b, g) = fleet(name, 3, "1", extra).await;
        let prompts = (0..3).map(|i| format!("{i} {prompt}"));
        for body in streamed_together(&g.url, prompts).await {
            assert_whole(&body);
        }
        let metrics = get_text(&client(), &g.url, "/metrics").await;
        let resumed = "kvgate_stream_resumes_total{reason=\"resumed\"}";
        assert_eq!(metric(&metrics, resumed), Some(3.0), "{metrics}");
        let waits = metric(&metrics, "kvgate_stream_resume_wait_seconds_count");
        assert_eq!(waits, Some(3.0), "{metrics}");
        let waited = metric(&metrics, "kvgate_stream_resume_wait_seconds_sum").unwrap();
        if gated {
            // The second waited for the first's prefill, the third for two.
            assert!(waited > 0.2, "{waited} s waited: {metrics}");
        } else {
            assert!(waited < 0.05, "{waited} s waited without a gate: {metrics}");
        }
    }
}

/// A continuation is routed when an endpoint has room, among those: three streams sharing a
/// long prompt break together, and `cache_aware`, which sends a prompt where its prefix went
/// before, would put every continuation on the engine that took the first. With one
/// continuation per endpoint at a time, the second goes to the other healthy engine instead of
/// waiting behind the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continuation_goes_to_an_engine_with_room_not_where_the_first_one_went() {
    let prompt = "cache ".repeat(2_000);
    let a = engine("a", "0", &["--fault", "disconnect_mid:after=3"]);
    let b = engine("b", "1", &[]);
    let c = engine("c", "1", &[]);
    let yaml = format!(
        "policy: {{name: cache_aware}}\nscrape: {{interval_ms: 100}}\nendpoints:\n  - {{url: \"{}\", name: a}}\n  - {{url: \"{}\", name: b, tier: 1}}\n  - {{url: \"{}\", name: c, tier: 1}}\n",
        a.url, b.url, c.url
    );
    let g = gateway_with_config(&[], "resume-room", &yaml).await;
    let prompts = (0..3).map(|i| format!("{prompt} {i}"));
    for body in streamed_together(&g.url, prompts).await {
        assert!(!body.contains("\"error\""), "{body}");
    }
    let metrics = get_text(&client(), &g.url, "/metrics").await;
    let resumed = "kvgate_stream_resumes_total{reason=\"resumed\"}";
    assert_eq!(metric(&metrics, resumed), Some(3.0), "{metrics}");
    for engine in [&b, &c] {
        let text = get_text(&client(), &engine.url, "/metrics").await;
        let prefilled = metric(&text, "vllm:prompt_tokens_total").unwrap_or(0.0);
        assert!(
            prefilled >= 2_000.0,
            "{} took no continuation: {text}",
            engine.url
        );
    }
}

/// A staged continuation (`resume.stage_tokens`): the prompt's heads reach the healthy engine
/// first, one-token warm-ups sent one after another, each finding the one before cached, and
/// the continuation finds all but its last piece cached; the client's stream is whole. No
/// other request awaits a first token there, so every head after the first grows by two
/// pieces (one with `stage_grow: false`). Without staging the same break leaves the engine
/// nothing cached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_continuation_warms_its_prompt_head_by_head_on_one_engine() {
    // 12,000 bytes, ~4,000 emulated tokens; heads of ~500 tokens (2,000 bytes) end near
    // 2,000, 4,000, ... 10,000 bytes, none in the last piece: the first, third and fifth go.
    let prompt = "cache ".repeat(2_000);
    for (name, extra, heads) in [
        ("resume-stage", "resume: {stage_tokens: 500}\n", 3.0),
        (
            "resume-stage-fixed",
            "resume: {stage_tokens: 500, stage_grow: false}\n",
            5.0,
        ),
        ("resume-unstaged", "resume: {stage_tokens: 0}\n", 0.0),
    ] {
        let (_a, b, g) = fleet(name, 3, "0", extra).await;
        for body in streamed_together(&g.url, std::iter::once(prompt.clone())).await {
            assert_whole(&body);
        }
        let metrics = get_text(&client(), &g.url, "/metrics").await;
        let resumed = "kvgate_stream_resumes_total{reason=\"resumed\"}";
        assert_eq!(metric(&metrics, resumed), Some(1.0), "{metrics}");
        let warmed = metric(&metrics, "kvgate_stream_resume_heads_total");
        assert_eq!(warmed, Some(heads), "{metrics}");
        // Grown, the second and fourth heads gave way to the third and fifth.
        let skipped = metric(&metrics, "kvgate_stream_resume_heads_skipped_total");
        assert_eq!(
            skipped,
            Some(if heads == 3.0 { 2.0 } else { 0.0 }),
            "{metrics}"
        );
        let engine = get_text(&client(), &b.url, "/metrics").await;
        let hits = metric(&engine, "vllm:prefix_cache_hits_total").unwrap_or(0.0);
        let prompted = metric(&engine, "vllm:prompt_tokens_total").unwrap_or(0.0);
        if heads > 0.0 {
            // Grown, the third head finds the first cached, the fifth the third (1+3 pieces);
            // fixed, head k finds heads 1..k-1 (1+2+3+4). The continuation finds 5 of its ~6;
            // each piece ~667 tokens.
            let pieces = if heads == 3.0 { 9.0 } else { 15.0 };
            assert!(hits > pieces * 600.0, "{hits} hits of {prompted}: {engine}");
        } else {
            assert!(hits < 100.0, "{hits} hits of {prompted}: {engine}");
        }
    }
}

/// A staged continuation sends no head the endpoint is predicted to hold already: the same
/// prompt breaks twice on the same engine, and the second continuation, on the engine the
/// first one warmed, sends only its last head; the client's stream is whole both times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_continuation_sends_no_head_the_endpoint_already_holds() {
    // Heads end near 2,000, 4,000, ... 10,000 bytes of the ~12,000 (as above).
    let prompt = "cache ".repeat(2_000);
    let extra = "resume: {stage_tokens: 500, stage_grow: false}\n";
    let (_a, b, g) = fleet("resume-stage-held", 3, "0", extra).await;
    let mut seen = Vec::new();
    for _ in 0..2 {
        for body in streamed_together(&g.url, std::iter::once(prompt.clone())).await {
            assert_whole(&body);
        }
        let metrics = get_text(&client(), &g.url, "/metrics").await;
        let count = |name: &str| metric(&metrics, name).unwrap_or(f64::NAN);
        seen.push([
            count("kvgate_stream_resumes_total{reason=\"resumed\"}"),
            count("kvgate_stream_resume_heads_total"),
            count("kvgate_stream_resume_heads_held_total"),
        ]);
        // Engine a cools down for 0.5 s after a failure (the first stream's break), and the
        // second must go there first again.
        tokio::time::sleep(std::time::Duration::from_millis(1_000)).await;
    }
    // Resumed, heads sent, heads held back: five heads the first time; the second time the
    // index says engine b holds the whole prompt, so only the last head goes.
    assert_eq!(seen, [[1.0, 5.0, 0.0], [2.0, 6.0, 4.0]]);
    let engine = get_text(&client(), &b.url, "/metrics").await;
    let hits = metric(&engine, "vllm:prefix_cache_hits_total").unwrap_or(0.0);
    // The first time heads 2-5 found 1+2+3+4 pieces (~667 tokens each) cached and the
    // continuation 5; the second time the last head and the continuation find ~5 each.
    assert!(hits > 20.0 * 600.0, "{hits} hits: {engine}");
}

/// Heads go only to endpoints whose engine metrics the gateway reads: engine b behind a
/// gateway of its own (an OpenAI-compatible endpoint with no vLLM metrics, as a hosted API
/// is) takes the continuation unstaged, and the client's stream is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continuation_to_an_endpoint_without_engine_metrics_is_not_staged() {
    let prompt = "cache ".repeat(2_000);
    let a = engine("a", "0", &["--fault", "disconnect_mid:after=3"]);
    let b = engine("b", "0", &[]);
    let hosted = gateway(&[&b], &[]).await;
    let yaml = format!(
        "scrape: {{interval_ms: 100}}\nendpoints:\n  - {{url: \"{}\", name: a}}\n  - {{url: \"{}\", name: hosted, tier: 1}}\nresume: {{stage_tokens: 500}}\n",
        a.url, hosted.url
    );
    let g = gateway_with_config(&[], "resume-hosted", &yaml).await;
    for body in streamed_together(&g.url, std::iter::once(prompt)).await {
        assert_whole(&body);
    }
    let metrics = get_text(&client(), &g.url, "/metrics").await;
    let resumed = "kvgate_stream_resumes_total{reason=\"resumed\"}";
    assert_eq!(metric(&metrics, resumed), Some(1.0), "{metrics}");
    let warmed = metric(&metrics, "kvgate_stream_resume_heads_total");
    assert_eq!(warmed, Some(0.0), "{metrics}");
    // The engine behind gave one first token: the continuation's, not a head's.
    let engine = get_text(&client(), &b.url, "/metrics").await;
    let first_tokens = metric(&engine, "vllm:time_to_first_token_seconds_count");
    assert_eq!(first_tokens, Some(1.0), "{engine}");
}

/// A chat turn of `session` through the gateway at `url`: the endpoint that answered, and the
/// answer.
async fn session_turn(url: &str, session: &str, body: &Value) -> (String, Value) {
    let r = client()
        .post(format!("{url}/v1/chat/completions"))
        .header("x-session-id", session)
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let endpoint = header(&r, "x-kvgate-endpoint");
    (endpoint, r.json().await.unwrap())
}

/// A session whose last turn ended on an engine that then broke a stream: while that engine
/// still answers (a flaky link), nothing is re-homed; once it is gone, the session is warmed on
/// the other engine (`resume.rehome_s`): the turn's prompt is sent there again for one token,
/// in heads, and asked again there the prompt is almost all cached. Off, nothing warms it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_engine_broke_a_stream_is_warmed_on_another_once_it_is_gone() {
    // ~4,000 emulated tokens: heads of 512 tokens (~2,000 bytes) go first.
    let prompt = "cache ".repeat(2_000);
    for (name, extra) in [
        ("rehome", "resume: {rehome_s: 30}\n"),
        ("rehome-off", "resume: {rehome_s: 0}\n"),
    ] {
        let on = !extra.contains("rehome_s: 0");
        // Engine a resets every answer after 3 tokens; one of 2 tokens ends whole.
        let (mut a, b, g) = fleet(name, 3, "0", extra).await;
        let turn = json!({
            "model": "test-model", "messages": user(&prompt), "max_tokens": 2, "ignore_eos": true,
        });
        let (endpoint, _) = session_turn(&g.url, "s1", &turn).await;
        assert_eq!(endpoint, "a");
        // Another session's stream breaks on a and is continued on b; a still answers.
        for body in streamed_together(&g.url, std::iter::once("another".to_string())).await {
            assert_whole(&body);
        }
        let url = format!("{}/metrics", g.url);
        let answered = "kvgate_rehome_probes_total{reason=\"answered\"}";
        let sent = "kvgate_rehome_warmups_total{reason=\"sent\"}";
        if on {
            wait_for(&url, "the probe", |m| metric(m, answered) == Some(1.0)).await;
        }
        let metrics = get_text(&client(), &g.url, "/metrics").await;
        assert_eq!(metric(&metrics, sent), None, "{metrics}");
        // Now a dies between requests: its scrapes fail.
        a.child.kill().unwrap();
        a.child.wait().unwrap();
        if on {
            wait_for(&url, "the warm-up", |m| metric(m, sent) == Some(1.0)).await;
        } else {
            wait_for(&url, "a's eviction", |m| {
                metric(m, "kvgate_endpoint_up{endpoint=\"a\"}") == Some(0.0)
            })
            .await;
        }
        let metrics = get_text(&client(), &g.url, "/metrics").await;
        let heads = metric(&metrics, "kvgate_rehome_heads_total").unwrap_or(0.0);
        assert_eq!(heads >= 1.0, on, "{metrics}");
        if !on {
            assert_eq!(metric(&metrics, sent), None, "{metrics}");
            assert_eq!(metric(&metrics, answered), None, "{metrics}");
        }
        // The session's prompt, asked of b directly: cached there only if it was warmed.
        let v: Value = post(&b.url, "/v1/chat/completions", &turn)
            .await
            .json()
            .await
            .unwrap();
        let usage = &v["usage"];
        let prompt_tokens = usage["prompt_tokens"].as_f64().unwrap();
        let cached = usage["prompt_tokens_details"]["cached_tokens"]
            .as_f64()
            .unwrap_or(0.0);
        assert_eq!(
            cached > 0.9 * prompt_tokens,
            on,
            "{cached} of {prompt_tokens} cached: {v}"
        );
    }
}

/// An engine restarted between two turns of a session without breaking any request: only its
/// scrape tells (a new process start). The gateway forgets what the index held there, so the
/// session's next turn is not predicted a hit on the cold engine; with re-homing on, the
/// session is warmed on the other engine first and its next turn finds its prompt there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_restart_seen_in_its_scrape_forgets_its_cache_and_re_homes_its_sessions() {
    let prompt = "cache ".repeat(2_000);
    let turn = json!({
        "model": "test-model", "messages": user(&prompt), "max_tokens": 2, "ignore_eos": true,
    });
    for (name, extra) in [
        ("restart-rehome", "resume: {rehome_s: 30}\n"),
        ("restart", "resume: {rehome_s: 0}\n"),
    ] {
        let on = !extra.contains("rehome_s: 0");
        let mut engines = [engine("a", "0", &[]), engine("b", "0", &[])];
        let yaml = format!(
            "scrape: {{interval_ms: 100}}\nendpoints:\n  - {{url: \"{}\", name: a}}\n  - {{url: \"{}\", name: b}}\n{extra}",
            engines[0].url, engines[1].url
        );
        let g = gateway_with_config(&[], name, &yaml).await;
        let (home, _) = session_turn(&g.url, "s1", &turn).await;
        let (i, other) = if home == "a" { (0, "b") } else { (1, "a") };
        // The same engine again, at the same address, with an empty cache.
        let listen = engines[i].url.trim_start_matches("http://").to_string();
        engines[i].child.kill().unwrap();
        engines[i].child.wait().unwrap();
        engines[i] = engine_at(&listen, &home, "0", &[]);
        let url = format!("{}/metrics", g.url);
        let restarts = format!("kvgate_endpoint_restarts_total{{endpoint=\"{home}\"}}");
        wait_for(&url, "the restart", |m| metric(m, &restarts) == Some(1.0)).await;
        let sent = "kvgate_rehome_warmups_total{reason=\"sent\"}";
        if on {
            wait_for(&url, "the warm-up", |m| metric(m, sent) == Some(1.0)).await;
        }
        // The session's next turn.
        let (went, v) = session_turn(&g.url, "s1", &turn).await;
        let prompt_tokens = v["usage"]["prompt_tokens"].as_f64().unwrap();
        let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_f64()
            .unwrap_or(0.0);
        if on {
            assert_eq!(went, other, "{v}");
            assert!(cached > 0.9 * prompt_tokens, "{cached} of {prompt_tokens}");
        } else {
            assert_eq!(cached, 0.0, "nothing holds the prompt: {v}");
        }
        // Whichever engine took it, no hit was predicted on the restarted one.
        let metrics = get_text(&client(), &g.url, "/metrics").await;
        let over = "kvgate_cache_prediction_total{result=\"over\"}";
        assert_eq!(metric(&metrics, over), None, "{metrics}");
    }
}
