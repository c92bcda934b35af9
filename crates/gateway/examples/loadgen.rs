//! Added-latency benchmark: the same short non-streaming chat requests, open loop at a fixed
//! rate, first straight to an engine and then through a gateway in front of it; prints p50 /
//! p99 / p99.9 of both and the difference. `--max` instead runs closed loop with `--concurrency`
//! connections as fast as the target answers and prints the throughput. `--stream N` makes
//! every request a stream of N tokens (`ignore_eos`), read to its end, to weigh the per-chunk
//! work of the streaming path.
//!
//! ```text
//! cargo run --release -p kvgate-gateway --example loadgen -- \
//!     --direct http://127.0.0.1:8001 --via http://127.0.0.1:8080 --rate 1000 --secs 10
//! ```

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

const BODY: &str =
    r#"{"model":"kvgate-emulated","messages":[{"role":"user","content":"ping"}],"max_tokens":1}"#;

/// The request every call sends: [`BODY`], or a stream of `--stream` tokens.
static REQUEST: std::sync::OnceLock<Bytes> = std::sync::OnceLock::new();

#[derive(Debug)]
struct Args {
    direct: Option<String>,
    via: Option<String>,
    rate: f64,
    secs: f64,
    max: bool,
    concurrency: usize,
    stream: Option<u32>,
}

fn args() -> Args {
    let mut a = Args {
        direct: None,
        via: None,
        rate: 1000.0,
        secs: 10.0,
        max: false,
        concurrency: 64,
        stream: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().expect("flag value");
        match flag.as_str() {
            "--direct" => a.direct = Some(value()),
            "--via" => a.via = Some(value()),
            "--rate" => a.rate = value().parse().expect("--rate"),
            "--secs" => a.secs = value().parse().expect("--secs"),
            "--concurrency" => a.concurrency = value().parse().expect("--concurrency"),
            "--max" => a.max = true,
            "--stream" => a.stream = Some(value().parse().expect("--stream")),
            other => panic!("unknown flag {other}"),
        }
    }
    a
}

async fn one(client: &HttpClient, url: &str) -> Result<(), String> {
    let request = hyper::Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(
            REQUEST
                .get_or_init(|| Bytes::from_static(BODY.as_bytes()))
                .clone(),
        ))
        .map_err(|e| e.to_string())?;
    let response = client.request(request).await.map_err(|e| e.to_string())?;
    let ok = response.status().is_success();
    response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?;
    if ok {
        Ok(())
    } else {
        Err("status".into())
    }
}

fn client() -> HttpClient {
    let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(4096)
        .build(connector)
}

/// Open loop at `rate` for `secs`: latencies in microseconds, sorted, and the error count.
async fn open_loop(base: &str, rate: f64, secs: f64) -> (Vec<u64>, usize) {
    let client = client();
    let url = format!("{base}/v1/chat/completions");
    // Warm the connection pool.
    for _ in 0..200 {
        let _ = one(&client, &url).await;
    }
    let lat = Arc::new(Mutex::new(Vec::with_capacity((rate * secs) as usize)));
    let errors = Arc::new(Mutex::new(0usize));
    let total = (rate * secs) as u64;
    let period = Duration::from_secs_f64(1.0 / rate);
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(total as usize);
    for i in 0..total {
        tokio::time::sleep_until(start + period * i as u32).await;
        let (client, url, lat, errors) = (client.clone(), url.clone(), lat.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            match one(&client, &url).await {
                Ok(()) => lat.lock().unwrap().push(t.elapsed().as_micros() as u64),
                Err(_) => *errors.lock().unwrap() += 1,
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let mut v = std::mem::take(&mut *lat.lock().unwrap());
    v.sort_unstable();
    let e = *errors.lock().unwrap();
    (v, e)
}

/// Percentile `p` in milliseconds of sorted microsecond latencies, by the one definition the
/// sim and the bench use (NumPy's linear interpolation).
fn pct(v: &[u64], p: f64) -> f64 {
    let ms: Vec<f64> = v.iter().map(|&us| us as f64 / 1000.0).collect();
    kvgate_core::stats::percentile(&ms, p).unwrap_or(f64::NAN)
}

async fn closed_loop(base: &str, concurrency: usize, secs: f64) -> (u64, usize) {
    let client = client();
    let url = format!("{base}/v1/chat/completions");
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (client, url) = (client.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let (mut ok, mut err) = (0u64, 0usize);
            while Instant::now() < deadline {
                match one(&client, &url).await {
                    Ok(()) => ok += 1,
                    Err(_) => err += 1,
                }
            }
            (ok, err)
        }));
    }
    let (mut ok, mut err) = (0, 0);
    for t in tasks {
        let (o, e) = t.await.unwrap();
        ok += o;
        err += e;
    }
    (ok, err)
}

#[tokio::main]
async fn main() {
    let a = args();
    if let Some(tokens) = a.stream {
        let body = format!(
            r#"{{"model":"kvgate-emulated","messages":[{{"role":"user","content":"ping"}}],"max_tokens":{tokens},"ignore_eos":true,"stream":true}}"#
        );
        REQUEST.set(Bytes::from(body)).expect("set once");
    }
    if a.max {
        for (name, url) in [("direct", &a.direct), ("via gateway", &a.via)] {
            if let Some(url) = url {
                let (ok, err) = closed_loop(url, a.concurrency, a.secs).await;
                println!(
                    "{name:12} closed loop, {} connections: {:.0} req/s ({err} errors)",
                    a.concurrency,
                    ok as f64 / a.secs
                );
            }
        }
        return;
    }
    let mut p50 = Vec::new();
    for (name, url) in [("direct", &a.direct), ("via gateway", &a.via)] {
        let Some(url) = url else { continue };
        let (v, errors) = open_loop(url, a.rate, a.secs).await;
        println!(
            "{name:12} {:>6.0} req/s offered, {} ok, {errors} errors: p50 {:.3} ms  p99 {:.3} ms  p99.9 {:.3} ms",
            a.rate, v.len(), pct(&v, 0.5), pct(&v, 0.99), pct(&v, 0.999)
        );
        p50.push((pct(&v, 0.5), pct(&v, 0.99)));
    }
    if let [d, g] = p50[..] {
        println!(
            "added by the gateway: p50 {:.3} ms, p99 {:.3} ms",
            g.0 - d.0,
            g.1 - d.1
        );
    }
}
