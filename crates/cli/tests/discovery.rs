//! `discovery.inference_pool` against a stand-in for the Kubernetes API (no cluster runs here):
//! it answers the two calls the gateway makes, as the API server does (an InferencePool in the
//! extension's v1 shape, then the pods its selector picks), and requires the bearer token. The
//! engines are real `kvgate engine`s on two loopback addresses at the pool's one target port,
//! as pods share a port on different IPs. Pods that become ready join, pods that stop being
//! ready leave, requests keep succeeding, and an API server that fails keeps the endpoints.

mod support;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{admin_json, chat, client, free_port, spawn, user};

#[derive(Clone, Default)]
struct Cluster {
    /// Pod IP and whether it is ready.
    pods: Arc<Mutex<Vec<(String, bool)>>>,
    port: u16,
    down: Arc<Mutex<bool>>,
}

fn authorized(headers: &HeaderMap) -> bool {
    headers.get("authorization").and_then(|v| v.to_str().ok()) == Some("Bearer sekret")
}

async fn pool(State(c): State<Cluster>, headers: HeaderMap) -> (StatusCode, Json<Value>) {
    if *c.down.lock().unwrap() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"kind": "Status"})),
        );
    }
    if !authorized(&headers) {
        return (StatusCode::UNAUTHORIZED, Json(json!({"kind": "Status"})));
    }
    let body = json!({
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "pool", "namespace": "ns"},
        "spec": {"selector": {"matchLabels": {"app": "engine"}},
                 "targetPorts": [{"number": c.port}],
                 "endpointPickerRef": {"name": "kvgate-epp"}}
    });
    (StatusCode::OK, Json(body))
}

async fn pods(
    State(c): State<Cluster>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> (StatusCode, Json<Value>) {
    if !authorized(&headers) || q.get("labelSelector").map(String::as_str) != Some("app=engine") {
        return (StatusCode::BAD_REQUEST, Json(json!({"kind": "Status"})));
    }
    let items: Vec<Value> = c
        .pods
        .lock()
        .unwrap()
        .iter()
        .map(|(ip, ready)| {
            json!({"metadata": {"name": format!("engine-{ip}"), "labels": {"app": "engine"}},
                   "status": {"phase": "Running", "podIP": ip,
                              "conditions": [{"type": "Ready", "status": if *ready { "True" } else { "False" }}]}})
        })
        .collect();
    (
        StatusCode::OK,
        Json(json!({"kind": "PodList", "items": items})),
    )
}

async fn endpoints(gateway: &str) -> Vec<String> {
    let mut urls: Vec<String> = admin_json(gateway, "/admin/endpoints", "tok").await["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["url"].as_str().unwrap().to_owned())
        .collect();
    urls.sort();
    urls
}

async fn wait_endpoints(gateway: &str, want: &[String]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let have = endpoints(gateway).await;
        if have == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "endpoints {have:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn ok(gateway: &str) {
    let r = client()
        .post(format!("{gateway}/v1/chat/completions"))
        .json(&chat(user("hello"), 4, false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_inference_pools_ready_pods_are_the_endpoints() {
    let port = free_port();
    let engine = |ip: &str| {
        let listen = format!("{ip}:{port}");
        spawn(
            &[
                "engine",
                "--listen",
                &listen,
                "--id",
                ip,
                "--model",
                "test-model",
                "--time-scale",
                "0",
            ],
            "listening on",
        )
    };
    let _a = engine("127.0.0.1");
    let _b = engine("127.0.0.2");
    let cluster = Cluster {
        port,
        ..Cluster::default()
    };
    cluster
        .pods
        .lock()
        .unwrap()
        .push(("127.0.0.1".into(), true));
    let app = axum::Router::new()
        .route(
            "/apis/inference.networking.k8s.io/v1/namespaces/ns/inferencepools/pool",
            axum::routing::get(pool),
        )
        .route("/api/v1/namespaces/ns/pods", axum::routing::get(pods))
        .with_state(cluster.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let token = support::config_file("discovery-token", "sekret\n");
    let yaml = format!(
        "admin_token: tok\ndiscovery:\n  inference_pool: {{name: pool, namespace: ns, api_server: \"{api}\", token_file: \"{}\", interval_ms: 100, model: test-model}}\n",
        token.display()
    );
    let gateway = support::gateway_with_config(&[], "discovery", &yaml).await;
    let url = |ip: &str| format!("http://{ip}:{port}");
    wait_endpoints(&gateway.url, &[url("127.0.0.1")]).await;
    ok(&gateway.url).await;

    // A second pod becomes ready: it joins.
    cluster
        .pods
        .lock()
        .unwrap()
        .push(("127.0.0.2".into(), true));
    wait_endpoints(&gateway.url, &[url("127.0.0.1"), url("127.0.0.2")]).await;

    // The API server fails for a while: the endpoints stay.
    *cluster.down.lock().unwrap() = true;
    let metrics = || async { support::get_text(&client(), &gateway.url, "/metrics").await };
    let deadline = Instant::now() + Duration::from_secs(10);
    while support::metric(
        &metrics().await,
        "kvgate_discovery_polls_total{reason=\"error\"}",
    )
    .is_none()
    {
        assert!(Instant::now() < deadline, "no failed poll counted");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(
        endpoints(&gateway.url).await,
        [url("127.0.0.1"), url("127.0.0.2")]
    );
    ok(&gateway.url).await;
    *cluster.down.lock().unwrap() = false;

    // The first stops being ready: it leaves, and requests go to the other.
    cluster.pods.lock().unwrap()[0].1 = false;
    wait_endpoints(&gateway.url, &[url("127.0.0.2")]).await;
    for _ in 0..3 {
        ok(&gateway.url).await;
    }
}
