//! A small in-process OpenAI-compatible server for tests and the throughput example: streams
//! chat/completions SSE chunks (a role chunk, one content chunk per token, a usage chunk,
//! `[DONE]`) with configurable delays, cached tokens, status and a concurrency limit that
//! queues requests (a server with a known capacity).

// The server's handler plays one response from start to finish; it reads best in one piece.
#![allow(clippy::too_many_lines)]
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::Router;
use tokio::sync::Semaphore;
use tokio::time::Instant;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Delay before the first content chunk (after the role chunk, which is sent at once).
    pub ttft: Duration,
    /// Delay between content chunks.
    pub itl: Duration,
    /// Output tokens; default: the request's max_tokens.
    pub tokens: Option<u32>,
    /// cached_tokens reported (capped at prompt tokens); `None` sends
    /// `"prompt_tokens_details": null`, as vLLM does without prefix caching.
    pub cached_tokens: Option<u64>,
    /// Status to answer with (200 = normal).
    pub status: u16,
    /// Requests served at once; the rest wait (None = unlimited).
    pub concurrency: Option<usize>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            ttft: Duration::ZERO,
            itl: Duration::ZERO,
            tokens: None,
            cached_tokens: Some(0),
            status: 200,
            concurrency: None,
        }
    }
}

#[derive(Debug)]
pub struct ServerState {
    pub config: ServerConfig,
    pub start: Instant,
    pub received: AtomicU64,
    pub in_flight: AtomicU64,
    pub max_in_flight: AtomicU64,
    pub arrivals: Mutex<Vec<Duration>>,
    pub record_arrivals: bool,
    slots: Option<Arc<Semaphore>>,
}

#[derive(Debug)]
pub struct TestServer {
    pub addr: SocketAddr,
    pub state: Arc<ServerState>,
}

impl TestServer {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

pub async fn spawn(config: ServerConfig) -> TestServer {
    spawn_on("127.0.0.1:0", config, true).await
}

pub async fn spawn_on(addr: &str, config: ServerConfig, record_arrivals: bool) -> TestServer {
    let slots = config.concurrency.map(|n| Arc::new(Semaphore::new(n)));
    let state = Arc::new(ServerState {
        config,
        start: Instant::now(),
        received: AtomicU64::new(0),
        in_flight: AtomicU64::new(0),
        max_in_flight: AtomicU64::new(0),
        arrivals: Mutex::new(Vec::new()),
        record_arrivals,
        slots,
    });
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    // Without TCP_NODELAY, Nagle plus the client's delayed ACK holds small SSE chunks ~40 ms.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    TestServer { addr, state }
}

async fn models() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        r#"{"object":"list","data":[{"id":"test-model","object":"model"}]}"#,
    )
}

async fn chat(state: State<Arc<ServerState>>, body: axum::body::Bytes) -> Response {
    serve(state.0, body, true).await
}

async fn completions(state: State<Arc<ServerState>>, body: axum::body::Bytes) -> Response {
    serve(state.0, body, false).await
}

struct InFlight(Arc<ServerState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

fn chunk(chat: bool, text: &str) -> String {
    if chat {
        format!("data: {{\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n")
    } else {
        format!("data: {{\"object\":\"text_completion\",\"choices\":[{{\"index\":0,\"text\":\"{text}\"}}]}}\n\n")
    }
}

/// The usage's `prompt_tokens_details` value.
fn details(cached: Option<u64>) -> String {
    cached.map_or("null".into(), |c| format!("{{\"cached_tokens\":{c}}}"))
}

fn usage(prompt: u64, completion: u32, cached: Option<u64>) -> String {
    format!(
        "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":{prompt},\"completion_tokens\":{completion},\"total_tokens\":{},\"prompt_tokens_details\":{}}}}}\n\n",
        prompt + u64::from(completion),
        details(cached)
    )
}

async fn serve(state: Arc<ServerState>, body: axum::body::Bytes, chat: bool) -> Response {
    let arrived = Instant::now();
    state.received.fetch_add(1, Ordering::Relaxed);
    if state.record_arrivals {
        state.arrivals.lock().unwrap().push(arrived - state.start);
    }
    let now = state.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
    state.max_in_flight.fetch_max(now, Ordering::Relaxed);
    let guard = InFlight(state.clone());
    if state.config.status != 200 {
        return StatusCode::from_u16(state.config.status)
            .unwrap()
            .into_response();
    }
    let req: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(_) => return StatusCode::BAD_REQUEST.into_response(),
    };
    let max_tokens = req["max_tokens"].as_u64().unwrap_or(16) as u32;
    let tokens = state.config.tokens.unwrap_or(max_tokens).max(1);
    let stream = req["stream"].as_bool().unwrap_or(false);
    let prompt_tokens: u64 = if chat {
        req["messages"]
            .as_array()
            .map(|ms| {
                ms.iter()
                    .map(|m| {
                        m["content"]
                            .as_str()
                            .unwrap_or("")
                            .split_whitespace()
                            .count() as u64
                    })
                    .sum()
            })
            .unwrap_or(0)
    } else {
        req["prompt"]
            .as_str()
            .unwrap_or("")
            .split_whitespace()
            .count() as u64
    };
    let cached = state.config.cached_tokens.map(|c| c.min(prompt_tokens));
    let cfg = state.config.clone();
    let slots = state.slots.clone();
    if !stream {
        let _permit = match &slots {
            Some(s) => Some(s.clone().acquire_owned().await.unwrap()),
            None => None,
        };
        tokio::time::sleep(cfg.ttft + cfg.itl * (tokens - 1)).await;
        let text = "x ".repeat(tokens as usize);
        let body = format!(
            "{{\"choices\":[{{\"index\":0,\"message\":{{\"role\":\"assistant\",\"content\":\"{text}\"}},\"text\":\"{text}\"}}],\"usage\":{{\"prompt_tokens\":{prompt_tokens},\"completion_tokens\":{tokens},\"prompt_tokens_details\":{}}}}}",
            details(cached)
        );
        drop(guard);
        return ([(header::CONTENT_TYPE, "application/json")], body).into_response();
    }
    let role = if chat {
        "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n"
    } else {
        ""
    };
    let sse = [
        (header::CONTENT_TYPE, "text/event-stream"),
        (header::CACHE_CONTROL, "no-cache"),
    ];
    if cfg.ttft.is_zero() && cfg.itl.is_zero() && slots.is_none() {
        // Fast path: the whole stream in one body.
        let mut s = String::with_capacity(128 * tokens as usize + 256);
        s.push_str(role);
        for i in 0..tokens {
            s.push_str(&chunk(chat, &format!("t{i} ")));
        }
        s.push_str(&usage(prompt_tokens, tokens, cached));
        s.push_str("data: [DONE]\n\n");
        drop(guard);
        return (sse, s).into_response();
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<String, std::io::Error>>(16);
    tokio::spawn(async move {
        let _guard = guard;
        let _permit = match &slots {
            Some(s) => Some(s.clone().acquire_owned().await.unwrap()),
            None => None,
        };
        if !role.is_empty() && tx.send(Ok(role.to_owned())).await.is_err() {
            return;
        }
        tokio::time::sleep(cfg.ttft).await;
        for i in 0..tokens {
            if i > 0 {
                tokio::time::sleep(cfg.itl).await;
            }
            if tx.send(Ok(chunk(chat, &format!("t{i} ")))).await.is_err() {
                return;
            }
        }
        let _ = tx.send(Ok(usage(prompt_tokens, tokens, cached))).await;
        let _ = tx.send(Ok("data: [DONE]\n\n".to_owned())).await;
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    (sse, Body::from_stream(stream)).into_response()
}
