//! Picks per second of `kvgate epp`: `--concurrency` ext_proc streams at a time, each one
//! request as Envoy sends it in full-duplex mode (headers, a chat body, the pick read back,
//! then a short SSE answer streamed through), for `--secs`; prints completed exchanges per
//! second and the median and p99 time from the body's end to the pick.
//!
//! ```text
//! kvgate engine --listen 127.0.0.1:8001 --time-scale 0 &   # (and more)
//! kvgate epp --listen 127.0.0.1:9002 --endpoint http://127.0.0.1:8001 &
//! cargo run --release -p kvgate-gateway --example epp_load -- --target http://127.0.0.1:9002
//! ```

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    processing_request::Request, HttpBody, HttpHeaders, ProcessingRequest, ProtocolConfiguration,
};
use std::time::{Duration, Instant};
use tonic::transport::Channel;

const FULL_DUPLEX_STREAMED: i32 = 4;
const ANSWER: &[u8] = b"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" ok\"},\"finish_reason\":\"length\"}]}\n\ndata: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":1,\"total_tokens\":13}}\n\ndata: [DONE]\n\n";

fn headers(pairs: &[(&str, &str)], response: bool) -> Request {
    let h = HttpHeaders {
        headers: Some(HeaderMap {
            headers: pairs
                .iter()
                .map(|(k, v)| HeaderValue {
                    key: (*k).into(),
                    raw_value: v.as_bytes().to_vec(),
                    ..HeaderValue::default()
                })
                .collect(),
        }),
        ..HttpHeaders::default()
    };
    if response {
        Request::ResponseHeaders(h)
    } else {
        Request::RequestHeaders(h)
    }
}

fn body(bytes: Vec<u8>, response: bool) -> Request {
    let b = HttpBody {
        body: bytes,
        end_of_stream: true,
        ..HttpBody::default()
    };
    if response {
        Request::ResponseBody(b)
    } else {
        Request::RequestBody(b)
    }
}

/// One request's exchange; returns the time from the body's end to the pick.
async fn exchange(channel: Channel, n: u64) -> Result<Duration, tonic::Status> {
    let mut client = ExternalProcessorClient::new(channel);
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let outbound =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let mut answers = client.process(outbound).await?.into_inner();
    let send = |request: Request, first: bool| ProcessingRequest {
        request: Some(request),
        protocol_config: first.then(|| ProtocolConfiguration {
            request_body_mode: FULL_DUPLEX_STREAMED,
            response_body_mode: FULL_DUPLEX_STREAMED,
            ..ProtocolConfiguration::default()
        }),
        ..ProcessingRequest::default()
    };
    let chat = [(":method", "POST"), (":path", "/v1/chat/completions")];
    let payload = format!(
        r#"{{"model":"kvgate-emulated","messages":[{{"role":"system","content":"You are terse."}},{{"role":"user","content":"question {n}"}}],"max_tokens":1,"stream":true}}"#
    );
    let closed = || tonic::Status::aborted("the picker closed the stream");
    tx.send(send(headers(&chat, false), true))
        .await
        .map_err(|_| closed())?;
    tx.send(send(body(payload.into_bytes(), false), false))
        .await
        .map_err(|_| closed())?;
    let sent = Instant::now();
    answers.message().await?.ok_or_else(closed)?;
    let picked = sent.elapsed();
    answers.message().await?.ok_or_else(closed)?;
    tx.send(send(headers(&[(":status", "200")], true), false))
        .await
        .map_err(|_| closed())?;
    answers.message().await?.ok_or_else(closed)?;
    tx.send(send(body(ANSWER.to_vec(), true), false))
        .await
        .map_err(|_| closed())?;
    answers.message().await?.ok_or_else(closed)?;
    Ok(picked)
}

#[tokio::main]
async fn main() {
    let mut target = "http://127.0.0.1:9002".to_string();
    let (mut concurrency, mut secs) = (32usize, 10.0f64);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().expect("flag value");
        match flag.as_str() {
            "--target" => target = value(),
            "--concurrency" => concurrency = value().parse().expect("--concurrency"),
            "--secs" => secs = value().parse().expect("--secs"),
            other => panic!("unknown flag {other}"),
        }
    }
    // A connection per worker, as Envoy opens several: one HTTP/2 connection is one task on
    // each side.
    let mut channels = Vec::new();
    for _ in 0..concurrency {
        let endpoint = Channel::from_shared(target.clone()).expect("URL");
        channels.push(endpoint.connect().await.expect("connect"));
    }
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let started = Instant::now();
    let workers = channels
        .into_iter()
        .enumerate()
        .map(|(w, channel)| {
            tokio::spawn(async move {
                let (mut picks, mut errors, mut n) = (Vec::new(), 0u64, w as u64 * 1_000_000);
                while Instant::now() < until {
                    n += 1;
                    match exchange(channel.clone(), n).await {
                        Ok(d) => picks.push(d),
                        Err(_) => errors += 1,
                    }
                }
                (picks, errors)
            })
        })
        .collect::<Vec<_>>();
    let mut all = Vec::new();
    let mut errors = 0;
    for w in workers {
        let (picks, e) = w.await.expect("worker");
        all.extend(picks);
        errors += e;
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort();
    let at = |q: f64| {
        all.get(((all.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or_default()
    };
    println!(
        "{} exchanges in {elapsed:.1} s: {:.0}/s ({errors} errors); body end to pick p50 {:.3} ms, p99 {:.3} ms",
        all.len(),
        all.len() as f64 / elapsed,
        at(0.5).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3
    );
}
