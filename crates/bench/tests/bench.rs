//! End-to-end tests of `kvgate_bench::run` against the in-process test server.

mod common;

use std::time::Duration;

use clap::Parser;
use common::{spawn, ServerConfig};
use kvgate_bench::{run, BenchArgs};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
}

fn args(extra: &[&str]) -> BenchArgs {
    let mut argv = vec!["bench", "--no-progress", "--seed", "7"];
    argv.extend_from_slice(extra);
    Cli::try_parse_from(argv).expect("flags parse").bench
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kvgate-bench-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttft_and_tpot_follow_the_definitions() {
    // Role chunk at once, first content after 150 ms, then 6 more tokens 25 ms apart.
    let server = spawn(ServerConfig {
        ttft: Duration::from_millis(150),
        itl: Duration::from_millis(25),
        tokens: Some(7),
        cached_tokens: Some(30),
        ..ServerConfig::default()
    })
    .await;
    let url = server.url();
    let a = args(&[
        "--url",
        &url,
        "--rate",
        "20",
        "--num-requests",
        "10",
        "--workload",
        "prefix-repetition",
        "--prefix-repetition-prefix-len",
        "40",
        "--prefix-repetition-suffix-len",
        "60",
    ]);
    let out = run(&a).await.unwrap();
    assert_eq!(out.model, "test-model", "model comes from /v1/models");
    let r = &out.results[0];
    assert_eq!((r.completed, r.failed), (10, 0));
    // TTFT counts to the first *content* chunk, not the role chunk.
    assert!(
        r.ttft_ms.p50 >= 150.0 && r.ttft_ms.max < 260.0,
        "ttft {:?}",
        r.ttft_ms
    );
    // TPOT = (E2E - TTFT) / (7 - 1): the 25 ms token gap.
    assert!(
        r.tpot_ms.p50 >= 24.0 && r.tpot_ms.p50 < 40.0,
        "tpot {:?}",
        r.tpot_ms
    );
    assert!(
        r.itl_ms.p50 >= 24.0 && r.itl_ms.count == 60,
        "itl {:?}",
        r.itl_ms
    );
    assert!(r.e2e_ms.p50 >= 300.0, "e2e {:?}", r.e2e_ms);
    assert_eq!(r.output_tokens, 70);
    // Prompt: "prefix i:" + 40 + 60 words = 102 tokens, 30 of them cached.
    assert_eq!(r.prompt_tokens, 1020);
    assert_eq!(r.cache_hit_ratio, Some(300.0 / 1020.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_server_does_not_lower_the_send_rate() {
    let server = spawn(ServerConfig {
        ttft: Duration::from_millis(1500),
        tokens: Some(2),
        ..ServerConfig::default()
    })
    .await;
    let url = server.url();
    // Near-regular arrivals (burstiness 100: CV 0.1) at 100 req/s for 200 requests.
    let a = args(&[
        "--url",
        &url,
        "--rate",
        "100",
        "--burstiness",
        "100",
        "--num-requests",
        "200",
        "--random-input-len",
        "8",
        "--model",
        "m",
    ]);
    let out = run(&a).await.unwrap();
    let r = &out.results[0];
    assert_eq!(r.completed, 200);
    assert!(
        (r.send_rate / 100.0 - 1.0).abs() < 0.1,
        "send rate {}",
        r.send_rate
    );
    // Open loop: far more requests were in flight than a closed loop would allow.
    let peak = server
        .state
        .max_in_flight
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(peak >= 100, "peak in flight {peak}");
    // The server saw them arrive at the offered rate, not at the completion rate.
    let arrivals = server.state.arrivals.lock().unwrap().clone();
    let span = (*arrivals.iter().max().unwrap() - *arrivals.iter().min().unwrap()).as_secs_f64();
    assert!(
        (199.0 / span / 100.0 - 1.0).abs() < 0.1,
        "server-side rate {}",
        199.0 / span
    );
    // Loose bound: the machine is shared; the rate assertions above are the point.
    assert!(r.send_lag_ms.p50 < 20.0, "lag {:?}", r.send_lag_ms);
    assert!(r.ttft_ms.p50 >= 1500.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_and_plots_are_written_for_two_targets() {
    let a_srv = spawn(ServerConfig {
        tokens: Some(3),
        cached_tokens: Some(5),
        ..ServerConfig::default()
    })
    .await;
    let b_srv = spawn(ServerConfig {
        ttft: Duration::from_millis(5),
        itl: Duration::from_millis(1),
        tokens: Some(3),
        ..ServerConfig::default()
    })
    .await;
    let dir = temp_dir("files");
    let (json, svg, png) = (dir.join("r.json"), dir.join("r.svg"), dir.join("r.png"));
    let (ua, ub) = (a_srv.url(), b_srv.url());
    let (js, ss) = (json.to_str().unwrap(), svg.to_str().unwrap());
    let a = args(&[
        "--url",
        &ua,
        "--url",
        &ub,
        "--rate",
        "200",
        "--num-requests",
        "40",
        "--random-input-len",
        "16",
        // SLOs no busy machine misses: this test is about the files, not the latencies.
        "--slo-ttft-ms",
        "30000",
        "--slo-tpot-ms",
        "10000",
        "--json",
        js,
        "--plot",
        ss,
        "--api",
        "completions",
    ]);
    let out = run(&a).await.unwrap();
    assert_eq!(out.results.len(), 2);
    // Both targets got the same 40 requests.
    for s in [&a_srv, &b_srv] {
        assert_eq!(
            s.state.received.load(std::sync::atomic::Ordering::Relaxed),
            40
        );
    }
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    for r in results {
        for key in ["ttft_ms", "tpot_ms", "e2e_ms", "send_lag_ms"] {
            for p in ["p50", "p90", "p95", "p99", "max"] {
                assert!(r[key][p].is_number(), "{key}.{p} in {r}");
            }
        }
        for key in ["goodput", "slo_attainment", "achieved_rate"] {
            assert!(r[key].is_number(), "{key}");
        }
        assert!(r["errors"].is_object() && r.get("cache_hit_ratio").is_some());
        assert_eq!(r["slo_attainment"], 1.0);
    }
    assert_eq!(results[0]["target"], ua.as_str());
    assert!(results[0]["cache_hit_ratio"].as_f64().unwrap() > 0.0);
    let svg_text = std::fs::read_to_string(&svg).unwrap();
    assert!(svg_text.starts_with("<svg") && svg_text.trim_end().ends_with("</svg>"));
    assert!(svg_text.contains("<polyline"), "CDF lines drawn");
    // The same run drawn as PNG.
    kvgate_bench::plot::draw(&png, &out.results, false).unwrap();
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_finds_the_capacity() {
    // Two slots, each request holds one for ~40 ms: capacity ~50 req/s; beyond it requests
    // queue and TTFT grows without bound. Tens of milliseconds per request keep the timer
    // delays of a busy machine small against the 200 ms SLO.
    let server = spawn(ServerConfig {
        ttft: Duration::from_millis(20),
        itl: Duration::from_millis(20),
        tokens: Some(2),
        concurrency: Some(2),
        ..ServerConfig::default()
    })
    .await;
    let dir = temp_dir("sweep");
    let (json, plot) = (dir.join("s.json"), dir.join("s.svg"));
    let url = server.url();
    let a = args(&[
        "--url",
        &url,
        "--sweep",
        "25:125:50",
        "--num-requests",
        "80",
        "--burstiness",
        "4",
        "--slo-ttft-ms",
        "200",
        "--random-input-len",
        "8",
        "--json",
        json.to_str().unwrap(),
        "--plot",
        plot.to_str().unwrap(),
    ]);
    let out = run(&a).await.unwrap();
    let rates: Vec<Option<f64>> = out.results.iter().map(|r| r.offered_rate).collect();
    assert_eq!(rates, [Some(25.0), Some(75.0), Some(125.0)]);
    let att: Vec<f64> = out
        .results
        .iter()
        .map(|r| r.slo_attainment.unwrap())
        .collect();
    assert!(
        att[0] >= 0.9 && att[1] < 0.9 && att[2] < 0.9,
        "attainment {att:?}"
    );
    assert_eq!(out.capacity[0].rate, Some(25.0));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["capacity"][0]["rate"], 25.0);
    assert_eq!(v["capacity"][0]["lowest_rate_tried"], 25.0);
    assert_eq!(v["capacity"][0]["highest_rate_tried"], 125.0);
    assert_eq!(v["results"].as_array().unwrap().len(), 3);
    assert!(std::fs::read_to_string(&plot)
        .unwrap()
        .contains("<polyline"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_counted_by_kind() {
    let server = spawn(ServerConfig {
        status: 503,
        ..ServerConfig::default()
    })
    .await;
    // A port nobody listens on: bind, read the address, drop the listener.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let url = server.url();
    let a = args(&[
        "--url",
        &url,
        "--url",
        &dead,
        "--rate",
        "100",
        "--num-requests",
        "5",
        "--model",
        "m",
    ]);
    let out = run(&a).await.unwrap();
    assert_eq!(out.results[0].errors["http_5xx"], 5);
    assert_eq!(out.results[1].errors["connect"], 5);
    assert_eq!(out.results[0].slo_attainment, Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreported_cached_tokens_stay_unknown() {
    let server = spawn(ServerConfig {
        tokens: Some(2),
        cached_tokens: None,
        ..ServerConfig::default()
    })
    .await;
    let dir = temp_dir("uncached");
    let (json, records) = (dir.join("out.json"), dir.join("r.jsonl"));
    let url = server.url();
    let a = args(&[
        "--url",
        &url,
        "--rate",
        "100",
        "--num-requests",
        "4",
        "--model",
        "m",
        "--json",
        json.to_str().unwrap(),
        "--records",
        records.to_str().unwrap(),
    ]);
    let out = run(&a).await.unwrap();
    let r = &out.results[0];
    assert_eq!(r.completed, 4);
    assert!(r.prompt_tokens > 0);
    assert_eq!((r.cached_tokens, r.cache_hit_ratio), (None, None));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let r = &v["results"][0];
    assert!(
        r["cached_tokens"].is_null() && r["cache_hit_ratio"].is_null(),
        "{r}"
    );
    for line in std::fs::read_to_string(&records).unwrap().lines() {
        let rec: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(rec["cached_tokens"].is_null(), "{rec}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agentic_workload_and_non_streaming_run() {
    let server = spawn(ServerConfig {
        tokens: Some(4),
        // Above any prompt the workload can build: every prompt token is reported cached,
        // whichever turns the closed-loop sessions reach in time.
        cached_tokens: Some(u64::MAX),
        ..ServerConfig::default()
    })
    .await;
    let url = server.url();
    let a = args(&[
        "--url",
        &url,
        "--workload",
        "agentic",
        "--rate",
        "50",
        "--num-requests",
        "24",
        "--agentic-turns",
        "3",
        "--agentic-fan-out",
        "2",
        "--agentic-think-time-ms",
        "20",
        "--agentic-system-len",
        "50",
        "--no-stream",
    ]);
    let out = run(&a).await.unwrap();
    let r = &out.results[0];
    assert_eq!((r.completed, r.failed), (24, 0));
    assert_eq!(r.output_tokens, 96);
    // Without streaming TTFT equals E2E.
    assert_eq!(r.ttft_ms.p50, r.e2e_ms.p50);
    // The non-streaming body's usage is parsed: cached tokens equal prompt tokens exactly.
    assert!(r.prompt_tokens > 0);
    assert_eq!(r.cached_tokens, Some(r.prompt_tokens));
    assert_eq!(r.cache_hit_ratio, Some(1.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warmup_requests_are_sent_but_not_reported() {
    let server = spawn(ServerConfig {
        tokens: Some(2),
        ..ServerConfig::default()
    })
    .await;
    let url = server.url();
    let a = args(&[
        "--url",
        &url,
        "--workload",
        "prefix-repetition",
        "--rate",
        "200",
        "--num-requests",
        "10",
        "--warmup-requests",
        "5",
        "--ramp-up-strategy",
        "linear",
        "--model",
        "m",
    ]);
    let out = run(&a).await.unwrap();
    assert_eq!(out.results[0].requests, 10);
    assert_eq!(
        server
            .state
            .received
            .load(std::sync::atomic::Ordering::Relaxed),
        15
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_bursts_run_closed_loop_against_each_target() {
    let a = spawn(ServerConfig {
        tokens: Some(3),
        ..ServerConfig::default()
    })
    .await;
    let b = spawn(ServerConfig {
        tokens: Some(3),
        ..ServerConfig::default()
    })
    .await;
    let (ua, ub) = (a.url(), b.url());
    let out = run(&args(&[
        "--url",
        &ua,
        "--url",
        &ub,
        "--workload",
        "fanout",
        "--rate",
        "20",
        "--num-requests",
        "32",
        "--fanout-calls",
        "8",
        "--fanout-prompt-len",
        "40",
        "--model",
        "m",
    ]))
    .await
    .unwrap();
    assert_eq!(out.results.len(), 2);
    for (r, server) in out.results.iter().zip([&a, &b]) {
        assert_eq!((r.requests, r.failed), (32, 0), "{}", r.target);
        let received = server
            .state
            .received
            .load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(received, 32, "each target runs its own copy");
    }
}
