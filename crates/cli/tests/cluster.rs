//! Gateway replicas sharing state over a real `nats-server` (Debian's; `scripts/test.sh`
//! installs it): one replica's in-flight requests count at the other, a conversation started
//! on one continues on the same engine through another, a replica that joins late warms up from
//! its peers, and killing the NATS server loses no request while the replicas route on; once it
//! is back, sharing resumes.

// Each test walks one scenario end to end; splitting it would scatter the story.
#![allow(clippy::too_many_lines)]

mod support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::{chat, client, engine, free_port, gateway, get_text, metric, user, Proc};

/// A `nats-server` on a loopback port, killed on drop.
struct Nats {
    child: Child,
    port: u16,
}

impl Nats {
    fn start(port: u16) -> Nats {
        let binary = ["nats-server", "/usr/sbin/nats-server"]
            .into_iter()
            .find(|b| Command::new(b).arg("--version").output().is_ok())
            .expect("nats-server is not installed (scripts/test.sh installs Debian's)");
        let child = Command::new(binary)
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "nats-server did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        Nats { child, port }
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn replica(engines: &[&Proc], nats: &str, name: &str) -> Proc {
    gateway(
        engines,
        &[
            "--cluster",
            nats,
            "--cluster-name",
            name,
            "--access-log",
            "off",
        ],
    )
    .await
}

/// Polls `base`'s metric `sample` until `check` holds, failing after `secs`.
async fn wait_metric(base: &str, sample: &str, secs: u64, check: impl Fn(f64) -> bool) {
    let http = client();
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let text = get_text(&http, base, "/metrics").await;
        if metric(&text, sample).is_some_and(&check) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{base}: {sample} never held; last {:?}",
            metric(&text, sample)
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Sends a chat turn through `base`; the endpoint that served it and the engine's cached
/// tokens.
async fn turn(base: &str, text: &str, max_tokens: u32) -> (String, u64) {
    let r = client()
        .post(format!("{base}/v1/chat/completions"))
        .json(&chat(user(text), max_tokens, false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let endpoint = support::header(&r, "x-kvgate-endpoint");
    let body: serde_json::Value = r.json().await.unwrap();
    let cached = body["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    (endpoint, cached)
}

/// A long prompt unique to `n`, so that where it is cached matters.
fn conversation(n: usize) -> String {
    format!("conversation {n}: ")
        + &format!("context line {n} with enough words to weigh. ").repeat(120)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_share_inflight_and_prefixes_and_ride_out_a_nats_restart() {
    let mut nats = Nats::start(free_port());
    let name = format!("t{}", std::process::id());
    let engines: Vec<Proc> = (0..3).map(|i| engine(&format!("e{i}"), "1", &[])).collect();
    let refs: Vec<&Proc> = engines.iter().collect();
    let a = replica(&refs, &nats.url(), &name).await;
    let b = replica(&refs, &nats.url(), &name).await;
    for r in [&a, &b] {
        wait_metric(&r.url, "kvgate_cluster_peers ", 10, |v| v == 1.0).await;
    }

    // A long stream through A counts in flight at B, and stops counting when it ends.
    let long = tokio::spawn({
        let url = a.url.clone();
        async move { turn(&url, "a long answer please", 150).await }
    });
    wait_metric(&b.url, "kvgate_cluster_peer_inflight ", 10, |v| v == 1.0).await;
    long.await.unwrap();
    wait_metric(&b.url, "kvgate_cluster_peer_inflight ", 10, |v| v == 0.0).await;

    // Conversations started on A continue on the same engine through B, from its cache.
    for n in 0..3 {
        let first = conversation(n);
        let (there, _) = turn(&a.url, &first, 4).await;
        let (here, cached) = turn(&b.url, &format!("{first} and a follow-up"), 4).await;
        assert_eq!(
            here, there,
            "conversation {n} lost its engine across replicas"
        );
        assert!(cached > 100, "conversation {n}: {cached} cached tokens");
    }

    // A replica joining late takes its peers' recent dispatches.
    let c = replica(&refs, &nats.url(), &name).await;
    wait_metric(&c.url, "kvgate_cluster_warm_entries_total ", 10, |v| {
        v >= 3.0
    })
    .await;
    let first = conversation(1);
    let (there, _) = turn(&a.url, &first, 1).await;
    let (here, _) = turn(&c.url, &format!("{first} and a third turn"), 4).await;
    assert_eq!(
        here, there,
        "the late replica did not learn the conversation"
    );

    // NATS dies under traffic: no request fails, the replicas say they are alone, and keep
    // routing.
    let traffic = tokio::spawn({
        let urls = [a.url.clone(), b.url.clone(), c.url.clone()];
        async move {
            let mut handles = Vec::new();
            for i in 0..60 {
                let url = urls[i % 3].clone();
                handles.push(tokio::spawn(async move {
                    turn(&url, &format!("request {i} during the outage"), 8).await
                }));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            for h in handles {
                h.await.unwrap();
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    nats.kill();
    for r in [&a, &b, &c] {
        wait_metric(&r.url, "kvgate_cluster_connected ", 10, |v| v == 0.0).await;
    }
    traffic.await.unwrap();
    for r in [&a, &b, &c] {
        let text = get_text(&client(), &r.url, "/metrics").await;
        assert!(
            !text.contains("outcome=\"upstream_error\"")
                && !text.contains("outcome=\"no_endpoint\""),
            "a request failed during the outage"
        );
    }

    // Back on the same port: sharing resumes within seconds.
    let restarted = Instant::now();
    let _nats = Nats::start(nats.port);
    for r in [&a, &b, &c] {
        wait_metric(&r.url, "kvgate_cluster_connected ", 15, |v| v == 1.0).await;
        wait_metric(&r.url, "kvgate_cluster_peers ", 15, |v| v == 2.0).await;
    }
    let long = tokio::spawn({
        let url = b.url.clone();
        async move { turn(&url, "another long answer", 150).await }
    });
    wait_metric(&a.url, "kvgate_cluster_peer_inflight ", 10, |v| v == 1.0).await;
    eprintln!(
        "sharing restored {:?} after NATS restarted",
        restarted.elapsed()
    );
    long.await.unwrap();
}

#[test]
fn bad_cluster_settings_are_refused_with_a_clear_error() {
    let err = support::serve_refuses("cluster-url", "cluster:\n  url: \"http://[nope\"\n");
    assert!(err.contains("cluster.url"), "{err}");
    let err = support::serve_refuses(
        "cluster-name",
        "cluster:\n  url: nats://127.0.0.1:4222\n  name: a.b\n",
    );
    assert!(err.contains("cluster.name"), "{err}");
    let err = support::serve_refuses(
        "cluster-timeout",
        "cluster:\n  heartbeat_ms: 1000\n  peer_timeout_ms: 1500\n",
    );
    assert!(err.contains("peer_timeout_ms"), "{err}");
}

/// Sends a short chat through `base` with `key`; its status and whether it said when to retry.
async fn keyed(base: &str, key: &str, max_tokens: u32) -> (u16, bool) {
    let r = client()
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(key)
        .json(&chat(user("hello there"), max_tokens, false))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.headers().contains_key("retry-after"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rate_limits_and_budgets_hold_across_replicas() {
    let nats = Nats::start(free_port());
    let engine = engine("e0", "0", &[]);
    let dir = std::env::temp_dir().join(format!("kvgate-cluster-limits-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let yaml = |replica: &str| {
        format!(
            r#"
cluster: {{url: "{url}", name: "l{pid}"}}
admin_token: tok
tenancy:
  store: {store}
  flush_ms: 50
  keys:
    - {{name: limited, key_sha256: "{limited}", limits: {{rpm: 60, burst_secs: 10}}}}
    - {{name: budgeted, key_sha256: "{budgeted}", budget: {{tokens: 600}}}}
"#,
            url = nats.url(),
            pid = std::process::id(),
            store = dir.join(format!("{replica}.redb")).display(),
            limited = support::sha256("kvg-limited"),
            budgeted = support::sha256("kvg-budgeted"),
        )
    };
    let a = support::gateway_with_config(&[&engine], "cluster-limits-a", &yaml("a")).await;
    let b = support::gateway_with_config(&[&engine], "cluster-limits-b", &yaml("b")).await;
    for r in [&a, &b] {
        wait_metric(&r.url, "kvgate_cluster_peers ", 10, |v| v == 1.0).await;
    }
    // A bucket of 10 requests (refilling one a second), drawn from both replicas in turn: alone,
    // each replica would accept 10.
    let started = Instant::now();
    let mut accepted = 0;
    for i in 0..20 {
        let url = if i % 2 == 0 { &a.url } else { &b.url };
        match keyed(url, "kvg-limited", 1).await {
            (200, _) => accepted += 1,
            (429, true) => {}
            s => panic!("{s:?}: a rate limit answers 200 or 429 with Retry-After"),
        }
    }
    // The bucket refills one request a second while the loop runs.
    let refilled = started.elapsed().as_secs_f64().ceil() as usize;
    assert!(refilled < 8, "the loop took {refilled} s: too slow to tell");
    assert!(
        (10..=11 + refilled).contains(&accepted),
        "{accepted} of 20 accepted against a shared bucket of 10 (+{refilled} refilled)"
    );
    // A budget of 600 tokens spent through A is refused at B too.
    let mut spent_at_a = 0;
    while keyed(&a.url, "kvg-budgeted", 100).await.0 == 200 {
        spent_at_a += 1;
        assert!(spent_at_a < 10, "the budget never ran out");
    }
    let spent = |status: serde_json::Value| {
        status["tenancy"]["budgets"]
            .as_array()
            .and_then(|a| a.iter().find(|b| b["account"] == "key:budgeted"))
            .and_then(|b| b["spent"].as_f64())
            .unwrap_or(0.0)
    };
    let at_a = spent(support::admin_json(&a.url, "/admin/status", "tok").await);
    assert!(at_a > 0.0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while spent(support::admin_json(&b.url, "/admin/status", "tok").await) < at_a {
        assert!(Instant::now() < deadline, "B never learned A's spend");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        keyed(&b.url, "kvg-budgeted", 100).await.0,
        429,
        "B accepted a request over the budget A spent"
    );
}
