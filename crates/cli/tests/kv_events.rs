//! Precise prefix state against real processes: emulated engines with the test tokenizer
//! (`test-data/tokenizer`) and small KV pools publish KV events to a gateway that tokenizes
//! prompts with the same files; its predicted cached tokens must equal the engines' reported
//! `cached_tokens`, through evictions, lost batches and an engine restart.

// Each test walks one scenario end to end; splitting it would scatter the story.
#![allow(clippy::too_many_lines)]

mod support;

use serde_json::json;
use support::*;

fn tokenizer_dir() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../test-data/tokenizer").to_owned()
}

/// An engine with 64 blocks of 16 tokens that publishes KV events to `kv_port`.
fn small_engine(id: &str, listen: &str, kv_port: u16) -> Proc {
    let kv = format!("tcp://127.0.0.1:{kv_port}");
    let dir = tokenizer_dir();
    let extra = [
        "--kv-blocks",
        "64",
        "--block-size",
        "16",
        "--max-model-len",
        "1024",
        "--tokenizer",
        &dir,
        "--kv-events",
        &kv,
    ];
    engine_at(listen, id, "0", &extra)
}

async fn fleet(name: &str, engines: &[(&Proc, u16)]) -> Proc {
    let mut yaml = format!(
        "tokenizers: {{'*': '{}'}}\nadmin_token: t\npolicy: {{name: consistent_hash}}\nendpoints:\n",
        tokenizer_dir()
    );
    for (e, port) in engines {
        yaml.push_str(&format!(
            "  - {{url: '{}', kv_events: 'bind:tcp://127.0.0.1:{port}'}}\n",
            e.url
        ));
    }
    let config = config_file(name, &yaml);
    let gw = gateway(&[], &["--config", config.to_str().unwrap()]).await;
    // Engines connect on their own schedule; batches published before are lost.
    for (e, _) in engines {
        connected(&gw, e, 1.0).await;
    }
    gw
}

/// Waits until `engine` has connected to the gateway's KV-event socket `times` times.
async fn connected(gw: &Proc, engine: &Proc, times: f64) {
    let name = engine.url.trim_start_matches("http://").to_owned();
    let sample = format!("kvgate_kv_event_connections_total{{endpoint=\"{name}\"}}");
    wait_for(
        &format!("{}/metrics", gw.url),
        "the engine's KV-event connection",
        |m| metric(m, &sample).is_some_and(|n| n >= times),
    )
    .await;
}

const WORDS: [&str; 12] = [
    "cache", "router", "replica", "prefix", "token", "engine", "queue", "latency", "block",
    "request", "weather", "answer",
];

fn text(session: usize, turn: usize, words: usize) -> String {
    (0..words)
        .map(|i| WORDS[(session * 7 + turn * 3 + i * (session + 1)) % WORDS.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

/// One turn of `session`: its history grows by the user's message and the engine's answer.
async fn turn(
    url: &str,
    history: &mut Vec<serde_json::Value>,
    session: usize,
    n: usize,
) -> serde_json::Value {
    history.push(json!({"role": "user", "content": text(session, n, 24 + 8 * (n % 3))}));
    let body = json!({"model": "test-model", "messages": history, "max_tokens": 12});
    let r = client()
        .post(format!("{url}/v1/chat/completions"))
        .header("x-session-id", format!("s{session}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(status, 200, "turn {n} of session {session}: {v}");
    let answer = v["choices"][0]["message"]["content"].as_str().unwrap();
    history.push(json!({"role": "assistant", "content": answer}));
    v
}

fn predictions(metrics: &str) -> (f64, f64) {
    let of = |r: &str| {
        metric(
            metrics,
            &format!("kvgate_cache_prediction_total{{result=\"{r}\"}}"),
        )
    };
    let exact = of("exact").unwrap_or(0.0);
    let all = exact + of("over").unwrap_or(0.0) + of("under").unwrap_or(0.0);
    (exact, all)
}

#[tokio::test]
async fn predicted_cached_tokens_match_the_engines_through_evictions() {
    let (p0, p1) = (free_port(), free_port());
    let e0 = small_engine("e0", "127.0.0.1:0", p0);
    let e1 = small_engine("e1", "127.0.0.1:0", p1);
    let gw = fleet("kv-exact", &[(&e0, p0), (&e1, p1)]).await;
    let sessions = 8;
    let mut histories = vec![Vec::new(); sessions];
    let (mut prompt, mut cached) = (0u64, 0u64);
    for n in 0..6 {
        for (s, history) in histories.iter_mut().enumerate() {
            let v = turn(&gw.url, history, s, n).await;
            prompt += v["usage"]["prompt_tokens"].as_u64().unwrap();
            cached += v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap();
        }
    }
    let metrics = get_text(&client(), &gw.url, "/metrics").await;
    let (exact, all) = predictions(&metrics);
    assert_eq!(all, 48.0, "every answer is scored");
    assert!(exact / all >= 0.95, "exact {exact} of {all}\n{metrics}");
    // The engines served a real share from their caches, and the pools were too small to keep
    // every conversation: the index had to follow evictions.
    let hit = cached as f64 / prompt as f64;
    assert!(hit > 0.3, "hit ratio {hit}");
    eprintln!("exact {exact} of {all}, hit ratio {hit:.3}, {prompt} prompt tokens");
    assert!(prompt > 4 * 2 * 64 * 16, "{prompt} prompt tokens");
    assert_eq!(
        metric(&metrics, "kvgate_tokenized_prompts_total{reason=\"ok\"}"),
        Some(48.0)
    );
    assert!(metric(&metrics, "kvgate_kv_events_trusted{").is_some());
    assert!(
        !metrics.contains("kvgate_kv_event_incidents_total{"),
        "{metrics}"
    );
}

#[tokio::test]
async fn lost_batches_and_a_restart_are_noticed_at_the_next_message() {
    let (p0, p1) = (free_port(), free_port());
    let e0 = small_engine("e0", "127.0.0.1:0", p0);
    let e1 = small_engine("e1", "127.0.0.1:0", p1);
    let gw = fleet("kv-gap", &[(&e0, p0), (&e1, p1)]).await;
    let name0 = e0.url.trim_start_matches("http://").to_owned();
    let trusted = |m: &str| {
        metric(
            m,
            &format!("kvgate_kv_events_trusted{{endpoint=\"{name0}\"}}"),
        )
    };
    let incidents = |m: &str, kind: &str| {
        metric(
            m,
            &format!("kvgate_kv_event_incidents_total{{endpoint=\"{name0}\",kind=\"{kind}\"}}"),
        )
    };
    // Talk to e0 directly until its stream is known to the gateway.
    let mut history = Vec::new();
    turn(&gw.url, &mut history, 0, 0).await;
    let direct =
        |h: &Vec<serde_json::Value>| json!({"model": "test-model", "messages": h, "max_tokens": 4});
    let e0_url = e0.url.clone();
    let engine_chat = |body: serde_json::Value| engine_chat_to(&e0_url, body);
    engine_chat(direct(&vec![
        json!({"role": "user", "content": text(1, 1, 30)}),
    ]))
    .await;
    wait_for(&format!("{}/metrics", gw.url), "e0's stream trusted", |m| {
        trusted(m) == Some(1.0)
    })
    .await;
    // One batch lost: the next one shows the gap.
    let faults = format!("{}/admin/faults", e0.url);
    let set = |spec: serde_json::Value| {
        let faults = faults.clone();
        async move {
            let r = client()
                .post(faults)
                .json(&json!({ "faults": spec }))
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success());
        }
    };
    set(json!(["kv_drop"])).await;
    engine_chat(direct(&vec![
        json!({"role": "user", "content": text(2, 2, 30)}),
    ]))
    .await;
    set(json!([])).await;
    engine_chat(direct(&vec![
        json!({"role": "user", "content": text(3, 3, 30)}),
    ]))
    .await;
    wait_for(&format!("{}/metrics", gw.url), "the gap noticed", |m| {
        incidents(m, "gap").is_some() && trusted(m) == Some(0.0)
    })
    .await;
    // Requests through the gateway keep working meanwhile.
    for n in 1..4 {
        turn(&gw.url, &mut history, 0, n).await;
    }
    // Restart e0 on the same addresses: its stream starts at 0 again, so its (empty) cache is
    // known exactly once more.
    let listen = name0.clone();
    drop(e0);
    let e0 = small_engine("e0", &listen, p0);
    connected(&gw, &e0, 2.0).await;
    for n in 4..10 {
        turn(&gw.url, &mut history, 0, n).await;
    }
    engine_chat_to(
        &e0.url,
        direct(&vec![json!({"role": "user", "content": text(4, 4, 30)})]),
    )
    .await;
    wait_for(&format!("{}/metrics", gw.url), "the restart noticed", |m| {
        incidents(m, "restart").is_some() && trusted(m) == Some(1.0)
    })
    .await;
    let status = admin_json(&gw.url, "/admin/endpoints", "t").await;
    let e0_status = status["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name0.as_str())
        .unwrap()
        .clone();
    assert_eq!(e0_status["kv_events"]["trust"], "live", "{e0_status}");
    // Every turn above got a 200; the gateway counted no other outcome either.
    let metrics = get_text(&client(), &gw.url, "/metrics").await;
    let failed: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("kvgate_requests_total{") && !l.contains("outcome=\"ok\""))
        .collect();
    assert!(failed.is_empty(), "{failed:?}");
    assert!(metrics.contains("kvgate_requests_total{outcome=\"ok\""));
}

fn engine_chat_to(url: &str, body: serde_json::Value) -> impl std::future::Future<Output = ()> {
    let url = format!("{url}/v1/chat/completions");
    async move {
        let r = client().post(url).json(&body).send().await.unwrap();
        assert_eq!(r.status(), 200);
    }
}
