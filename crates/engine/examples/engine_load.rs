//! A minimal closed-loop load generator for measuring the emulated engine's request rate.
//!
//! Each of `--connections` tasks keeps one keep-alive HTTP/1.1 connection and sends streamed
//! completions back to back, reading each SSE response to its end (the chunked-encoding
//! terminator after `data: [DONE]`). It writes requests by hand and reads events without
//! parsing their JSON, so that on a shared 2-core machine most CPU goes to the server under test.
//! It reports completed requests per second and latency percentiles, and fails on any non-200
//! or truncated response.
//!
//! ```text
//! cargo build --release -p kvgate && cargo build --release -p kvgate-engine --example engine_load
//! ./target/release/kvgate engine --listen 127.0.0.1:8000 --time-scale 0 &
//! ./target/release/examples/engine_load --addr 127.0.0.1:8000 --connections 64 --seconds 5 --max-tokens 8
//! ```

use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Options {
    addr: String,
    connections: usize,
    seconds: f64,
    max_tokens: u32,
    model: String,
}

fn options() -> Options {
    let mut o = Options {
        addr: "127.0.0.1:8000".to_owned(),
        connections: 64,
        seconds: 10.0,
        max_tokens: 8,
        model: "kvgate-emulated".to_owned(),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let value = pair.get(1).cloned().unwrap_or_default();
        match pair[0].as_str() {
            "--addr" => o.addr = value,
            "--connections" => o.connections = value.parse().expect("--connections N"),
            "--seconds" => o.seconds = value.parse().expect("--seconds S"),
            "--max-tokens" => o.max_tokens = value.parse().expect("--max-tokens N"),
            "--model" => o.model = value,
            other => panic!("unknown flag {other}"),
        }
    }
    o
}

/// Runs requests on one connection until `deadline`; returns per-request latencies.
async fn worker(o: &Options, index: usize, deadline: Instant) -> Vec<Duration> {
    // Wait for the server to listen (it may still be starting).
    let give_up = Instant::now() + Duration::from_secs(10);
    let mut stream = loop {
        match TcpStream::connect(&o.addr).await {
            Ok(s) => break s,
            Err(e) if Instant::now() > give_up => panic!("connect {}: {e}", o.addr),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    stream.set_nodelay(true).expect("nodelay");
    let mut latencies = Vec::new();
    let mut buffer = Vec::with_capacity(16 * 1024);
    let mut n = 0u64;
    while Instant::now() < deadline {
        // A short prompt, varied per request, with a shared head (like a system prompt).
        let body = format!(
            "{{\"model\":\"{}\",\"prompt\":\"You are a helpful assistant. Question {index} {n}: what is a cache?\",\
             \"max_tokens\":{},\"ignore_eos\":true,\"stream\":true,\"stream_options\":{{\"include_usage\":true}}}}",
            o.model, o.max_tokens
        );
        let request = format!(
            "POST /v1/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            o.addr,
            body.len()
        );
        let started = Instant::now();
        stream.write_all(request.as_bytes()).await.expect("write");
        buffer.clear();
        loop {
            let read = stream.read_buf(&mut buffer).await.expect("read");
            assert!(read > 0, "connection closed mid-response");
            if buffer.ends_with(b"\r\n0\r\n\r\n") {
                break;
            }
        }
        assert!(
            buffer.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&buffer)
        );
        assert!(has_done(&buffer), "stream without [DONE]");
        latencies.push(started.elapsed());
        n += 1;
    }
    latencies
}

/// The response's events include `[DONE]`. The body is read as it came, chunked: each size
/// line reads as an unknown field and each chunk's CRLF as a blank line, so with one event per
/// chunk (as the engine writes them) no de-chunking is needed.
fn has_done(response: &[u8]) -> bool {
    let body = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(&[][..], |head| &response[head + 4..]);
    let mut reader = kvgate_sse::Reader::new();
    let mut events = reader.feed(body);
    let mut done = false;
    while let Some(event) = events.next_event() {
        done |= matches!(event, Ok(kvgate_sse::Event::Done(_)));
    }
    done
}

/// Percentile `q` in milliseconds of sorted latencies, by kvgate's one definition
/// ([`kvgate_core::stats::percentile`]: NumPy's linear interpolation); NaN without samples.
fn percentile_ms(sorted: &[Duration], q: f64) -> f64 {
    let ms: Vec<f64> = sorted.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    kvgate_core::stats::percentile(&ms, q).unwrap_or(f64::NAN)
}

#[tokio::main]
async fn main() {
    let o = std::sync::Arc::new(options());
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(o.seconds);
    let tasks: Vec<_> = (0..o.connections)
        .map(|i| {
            let o = o.clone();
            tokio::spawn(async move { worker(&o, i, deadline).await })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("worker"));
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    println!(
        "{} streamed requests in {:.2} s: {:.0} req/s over {} connections, {} output tokens each; \
         latency p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        latencies.len(),
        elapsed,
        latencies.len() as f64 / elapsed,
        o.connections,
        o.max_tokens,
        percentile_ms(&latencies, 0.5),
        percentile_ms(&latencies, 0.99),
        latencies.last().map_or(f64::NAN, |d| d.as_secs_f64() * 1e3),
    );
}
