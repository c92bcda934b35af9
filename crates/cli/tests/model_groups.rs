//! A self-hosted tier and a "hosted" tier against real processes: the hosted provider is an
//! emulated engine behind a kvgate speaking TLS with a private CA and requiring an API key. The
//! front gateway serves an alias, renames it per deployment, sends the provider its key and
//! configured headers over HTTPS, fails over to the hosted tier when the self-hosted one answers
//! 429 or dies (no request fails), and returns once it is back.

mod support;

use std::time::{Duration, Instant};
use support::*;

struct Fleet {
    _hosted_engine: Proc,
    _hosted: Proc,
    front: Proc,
    self_hosted_addr: String,
}

/// (the answer's serving endpoint, its spillover tier header, its status)
async fn ask(front: &str) -> (String, Option<String>, u16) {
    let r = client()
        .post(format!("{front}/v1/chat/completions"))
        .header("x-kvgate-session", "conversation-1")
        .json(&serde_json::json!({
            "model": "chat",
            "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": 4
        }))
        .send()
        .await
        .unwrap();
    let endpoint = r
        .headers()
        .get("x-kvgate-endpoint")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let tier = r
        .headers()
        .get("x-kvgate-spillover-tier")
        .map(|v| v.to_str().unwrap().to_owned());
    (endpoint, tier, r.status().as_u16())
}

fn self_hosted(addr: &str) -> Proc {
    spawn(
        &[
            "engine",
            "--listen",
            addr,
            "--id",
            "local",
            "--model",
            "test-model",
            "--time-scale",
            "0",
            "--seed",
            "1",
        ],
        "listening on",
    )
}

async fn fleet(name: &str) -> (Fleet, Proc) {
    let pki = Pki::new();
    let dir = std::env::temp_dir().join(format!("kvgate-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key, _) = pki.issue(&["127.0.0.1"], false);
    let (cert_path, key_path, ca_path) = (
        dir.join("hosted.pem"),
        dir.join("hosted.key"),
        dir.join("ca.pem"),
    );
    std::fs::write(&cert_path, cert).unwrap();
    std::fs::write(&key_path, key).unwrap();
    std::fs::write(&ca_path, pki.ca.pem()).unwrap();

    // The hosted provider: TLS, and only the key "sk-hosted" gets in.
    let hosted_engine = engine("hosted", "0", &[]);
    let hosted_config = config_file(
        &format!("{name}-hosted"),
        &format!(
            "tenancy:\n  keys:\n    - {{name: front, key_sha256: \"{}\"}}\n",
            sha256("sk-hosted")
        ),
    );
    let hosted = spawn(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--endpoint",
            &hosted_engine.url,
            "--config",
            hosted_config.to_str().unwrap(),
            "--tls-cert",
            cert_path.to_str().unwrap(),
            "--tls-key",
            key_path.to_str().unwrap(),
        ],
        "kvgate serve listening on",
    );
    assert!(hosted.url.starts_with("https://"), "{}", hosted.line);

    let addr = format!("127.0.0.1:{}", free_port());
    let local = self_hosted(&addr);
    let yaml = format!(
        r#"
scrape: {{interval_ms: 100}}
endpoints:
  - {{url: "http://{addr}", name: local, model: test-model, served_as: [chat]}}
  - url: "{hosted}"
    name: hosted
    tier: 1
    model: test-model
    served_as: [chat]
    api_key: sk-hosted
    ca_file: "{ca}"
    headers: {{x-provider-project: kvgate-tests}}
    price: {{input_per_mtok: 1.0, output_per_mtok: 2.0}}
    prompt_cache_key: true
"#,
        hosted = hosted.url,
        ca = ca_path.display(),
    );
    let front = gateway_with_config(&[], name, &yaml).await;
    (
        Fleet {
            _hosted_engine: hosted_engine,
            _hosted: hosted,
            front,
            self_hosted_addr: addr,
        },
        local,
    )
}

async fn until_served_by(front: &str, endpoint: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (served, _, status) = ask(front).await;
        assert_eq!(status, 200);
        if served == endpoint {
            return;
        }
        assert!(Instant::now() < deadline, "never served by {endpoint}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_to_a_hosted_tier_over_tls_and_back() {
    let (fleet, local) = fleet("groups").await;
    let front = fleet.front.url.clone();
    // The alias is served by the first tier, renamed to the engine's own model name (the
    // engine answers 404 to any other).
    for _ in 0..5 {
        assert_eq!(ask(&front).await, ("local".to_owned(), None, 200));
    }
    let models = get_text(&client(), &front, "/v1/models").await;
    assert!(
        models.contains("\"chat\"") && models.contains("\"test-model\""),
        "{models}"
    );

    // A 429 cools the first tier down at once: the hosted tier answers, over TLS, with its key.
    let faults = format!("http://{}/admin/faults", fleet.self_hosted_addr);
    let set = |body: serde_json::Value| {
        let faults = faults.clone();
        async move {
            let r = client().post(faults).json(&body).send().await.unwrap();
            assert!(r.status().is_success());
        }
    };
    set(serde_json::json!({"faults": ["429:retry_after=0"]})).await;
    let (served, tier, status) = ask(&front).await;
    assert_eq!(
        (served.as_str(), tier.as_deref(), status),
        ("hosted", Some("1"), 200)
    );
    let (served, _, _) = ask(&front).await;
    assert_eq!(served, "hosted", "the 429 cooled the first tier down");
    set(serde_json::json!({"faults": []})).await;
    until_served_by(&front, "local").await;

    // The first tier dies: nothing fails, the hosted tier serves.
    drop(local);
    for _ in 0..20 {
        let (served, tier, status) = ask(&front).await;
        assert_eq!(status, 200);
        assert_eq!((served.as_str(), tier.as_deref()), ("hosted", Some("1")));
    }
    // Back: traffic returns to the first tier.
    let _local = self_hosted(&fleet.self_hosted_addr);
    until_served_by(&front, "local").await;
    for _ in 0..5 {
        assert_eq!(ask(&front).await, ("local".to_owned(), None, 200));
    }
    let metrics = get_text(&client(), &front, "/metrics").await;
    let failed: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("kvgate_requests_total{") && !l.contains("outcome=\"ok\""))
        .collect();
    assert!(failed.is_empty(), "{failed:?}");
    // The hosted deployment's answers were priced; the unpriced self-hosted ones were not.
    let cost = metric(&metrics, "kvgate_cost_usd_total{endpoint=\"hosted\"}").unwrap();
    assert!(cost > 0.0, "{cost}");
    assert!(metric(&metrics, "kvgate_cost_usd_total{endpoint=\"local\"}").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misconfigured_groups_fail_at_load_and_a_bad_reload_keeps_the_running_groups() {
    let bad = [
        (
            "endpoints:\n  - {url: \"http://a:1\", model: x, served_as: [y]}\n  - {url: \"http://b:1\", model: y, served_as: [x]}\n",
            "cycle (x -> y -> x)",
        ),
        (
            "endpoints:\n  - {url: \"http://a:1\", model: m, served_as: [chat]}\ntenancy: {prices: {caht: {input_per_mtok: 1, output_per_mtok: 1}}}\n",
            "tenancy.prices.caht",
        ),
        ("endpoints:\n  - {url: \"ftp://a:1\"}\n", "endpoints[0].url"),
        ("endpoints:\n  - {url: \"http://\"}\n", "endpoints[0].url"),
    ];
    for (yaml, says) in bad {
        let err = serve_refuses("groups-bad", yaml);
        assert!(err.contains(says), "{yaml}: {err}");
    }

    let e = engine("e0", "0", &[]);
    let good = format!(
        "admin_token: t\nendpoints:\n  - {{url: \"{}\", model: test-model, served_as: [chat]}}\n",
        e.url
    );
    let config = config_file("groups-reload", &good);
    let g = gateway(&[], &["--config", config.to_str().unwrap()]).await;
    let ask = |model: &'static str| {
        let url = format!("{}/v1/chat/completions", g.url);
        async move {
            let mut body = chat(user("hi"), 2, false);
            body["model"] = model.into();
            client()
                .post(url)
                .json(&body)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(ask("chat").await, 200);
    // A cycle written over the running file: rejected, with the reason, and `chat` still works.
    std::fs::write(
        &config,
        format!(
            "admin_token: t\nendpoints:\n  - {{url: \"{}\", model: test-model, served_as: [chat]}}\n  - {{url: \"http://127.0.0.1:9\", model: chat, served_as: [test-model]}}\n",
            e.url
        ),
    )
    .unwrap();
    let mut status = serde_json::Value::Null;
    for _ in 0..150 {
        status = support::admin_json(&g.url, "/admin/config", "t").await;
        if status["reloads"]["rejected"] == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let last = &status["reloads"]["last"];
    assert_eq!(last["result"], "rejected", "{status}");
    assert!(
        last["error"].as_str().unwrap().contains("cycle"),
        "{status}"
    );
    assert_eq!(ask("chat").await, 200);
    let endpoints = support::admin_json(&g.url, "/admin/endpoints", "t").await;
    assert_eq!(
        endpoints["endpoints"].as_array().unwrap().len(),
        1,
        "{endpoints}"
    );
    let metrics = get_text(&client(), &g.url, "/metrics").await;
    assert_eq!(
        metric(&metrics, "kvgate_config_reloads_total{reason=\"rejected\"}"),
        Some(1.0),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dollar_budget_is_charged_at_the_price_of_the_deployment_that_answered() {
    let e = engine("e0", "0", &[]);
    let store = config_file("groups-budget-store", "").with_file_name("budgets.db");
    let yaml = format!(
        r#"
endpoints:
  - {{url: "{}", model: test-model, price: {{input_per_mtok: 1000, output_per_mtok: 2000}}}}
tenancy:
  store: "{}"
  prices: {{test-model: {{input_per_mtok: 1, output_per_mtok: 1}}}}
  tenants: {{t: {{budget: {{usd: 100}}}}}}
"#,
        e.url,
        store.display()
    );
    let g = gateway_with_config(&[], "groups-budget", &yaml).await;
    let usage: serde_json::Value = client()
        .post(format!("{}/v1/chat/completions", g.url))
        .header("x-kvgate-tenant", "t")
        .json(&chat(user("price me"), 5, false))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let usage = &usage["usage"];
    let (prompt, output) = (
        usage["prompt_tokens"].as_f64().unwrap(),
        usage["completion_tokens"].as_f64().unwrap(),
    );
    assert_eq!(
        usage["prompt_tokens_details"]["cached_tokens"], 0,
        "{usage}"
    );
    let expected = (prompt * 1000.0 + output * 2000.0) / 1e6;
    // Spend is published as it is persisted (every `tenancy.flush_ms`).
    let sample = "kvgate_budget_spend{account=\"tenant:t\",unit=\"usd\"}";
    let mut spent = 0.0;
    for _ in 0..100 {
        let metrics = get_text(&client(), &g.url, "/metrics").await;
        spent = metric(&metrics, sample).unwrap_or(0.0);
        if spent > 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        (spent - expected).abs() < 1e-9,
        "spent {spent}, expected {expected}"
    );
}
