//! Sending one request and measuring it on the client.
//!
//! Streaming responses are OpenAI server-sent events: `data: {json}` lines, a final usage chunk
//! when `stream_options.include_usage` is set, and `data: [DONE]`. As vLLM's benchmark measures
//! them (docs/background.md#latency-metrics), measured from the moment the request left (actual
//! send time; the lag behind the schedule is recorded apart): TTFT is the time to the first chunk
//! carrying content (or reasoning content), ITL the gap between consecutive content chunks as they
//! arrive, E2E the time to the end of the stream, and TPOT `(E2E - TTFT) / (output tokens - 1)` for
//! requests with at least two output tokens. Output tokens and cached tokens come from the usage
//! chunk when present (`completion_tokens`, `prompt_tokens_details.cached_tokens`); without usage
//! the output count is the number of content chunks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use kvgate_sse::{Chunk, Event, Reader};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::args::Api;
use crate::workload::{Message, RequestSpec};

/// Why a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The connection could not be established.
    Connect,
    /// The request did not finish within the timeout.
    Timeout,
    /// The server answered 4xx.
    #[serde(rename = "http_4xx")]
    Http4xx,
    /// The server answered 5xx.
    #[serde(rename = "http_5xx")]
    Http5xx,
    /// Any other non-success status.
    HttpOther,
    /// The body broke off, carried an error event, or ended without `[DONE]`.
    Stream,
    /// Any other client-side failure.
    Request,
}

impl ErrorKind {
    /// Every kind, in report order.
    pub const ALL: [ErrorKind; 7] = [
        ErrorKind::Connect,
        ErrorKind::Timeout,
        ErrorKind::Http4xx,
        ErrorKind::Http5xx,
        ErrorKind::HttpOther,
        ErrorKind::Stream,
        ErrorKind::Request,
    ];

    /// The JSON key of the kind.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Connect => "connect",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Http4xx => "http_4xx",
            ErrorKind::Http5xx => "http_5xx",
            ErrorKind::HttpOther => "http_other",
            ErrorKind::Stream => "stream",
            ErrorKind::Request => "request",
        }
    }

    fn of(e: &reqwest::Error) -> Self {
        if e.is_timeout() {
            ErrorKind::Timeout
        } else if e.is_connect() {
            ErrorKind::Connect
        } else if e.is_body() || e.is_decode() {
            ErrorKind::Stream
        } else {
            ErrorKind::Request
        }
    }
}

/// What the client saw of one request. Times are milliseconds; offsets are seconds since the
/// start of the run.
#[derive(Debug, Clone, Default)]
pub struct Record {
    /// Scheduled send offset.
    pub scheduled_s: f64,
    /// Actual send offset.
    pub sent_s: f64,
    /// Actual minus scheduled send time.
    pub lag_ms: f64,
    /// Time to first content token, if one arrived.
    pub ttft_ms: Option<f64>,
    /// Time to the end of the response (or to the failure).
    pub e2e_ms: f64,
    /// Inter-chunk gaps after the first token.
    pub itl_ms: Vec<f32>,
    /// Output tokens (usage, else content chunks).
    pub output_tokens: u64,
    /// Prompt tokens from usage (0 when absent).
    pub prompt_tokens: u64,
    /// Cached prompt tokens from usage; `None` when the server did not report them (vLLM omits
    /// `prompt_tokens_details` without prefix caching): unknown, not 0.
    pub cached_tokens: Option<u64>,
    /// The failure, if any.
    pub error: Option<ErrorKind>,
    /// The request's session (the body's `user`), if it had one.
    pub session: Option<String>,
    /// The endpoint a kvgate gateway says served it (`x-kvgate-endpoint`), when it says.
    pub endpoint: Option<String>,
}

impl Record {
    /// `(E2E - TTFT) / (output tokens - 1)`, defined for successful requests with at least two
    /// output tokens.
    pub fn tpot_ms(&self) -> Option<f64> {
        match (self.error, self.ttft_ms) {
            (None, Some(ttft)) if self.output_tokens > 1 => {
                Some((self.e2e_ms - ttft) / (self.output_tokens - 1) as f64)
            }
            _ => None,
        }
    }
}

/// One benchmark target: a resolved endpoint URL, or several replicas of one gateway that
/// share the target's requests (each request to one of them at random).
#[derive(Debug, Clone)]
pub struct Target {
    /// The target as given on the command line, or its label (the report's name for it).
    pub name: String,
    /// The completions endpoints requests are posted to, one per replica.
    pub endpoints: Vec<String>,
    /// The models listing URL (of the first replica).
    pub models: String,
    /// Requests sent so far, which with the name seeds the choice of replica.
    sent: std::sync::Arc<AtomicU64>,
}

impl Target {
    /// Resolves `spec` for `api`: `[LABEL=]URL[,URL...]`, each URL a base URL, a `/v1` URL or
    /// a full endpoint URL; several URLs are replicas of one gateway.
    pub fn new(spec: &str, api: Api) -> Self {
        let (name, urls) = match spec.split_once('=') {
            Some((label, urls)) if !label.contains([':', '/']) => (label, urls),
            _ => (spec, spec),
        };
        let resolved: Vec<(String, String)> = urls.split(',').map(|u| resolve(u, api)).collect();
        Self {
            name: name.to_owned(),
            models: format!("{}/models", resolved[0].0),
            endpoints: resolved.into_iter().map(|(_, e)| e).collect(),
            sent: Default::default(),
        }
    }

    /// The endpoint the next request goes to: a replica drawn uniformly (a seeded mix of the
    /// request's number, so a run is repeatable), as a round-robin DNS or L4 balancer in front
    /// of gateway replicas would spread requests without regard to their content.
    pub fn endpoint(&self) -> &str {
        let n = self.sent.fetch_add(1, Ordering::Relaxed);
        let k = if self.endpoints.len() == 1 {
            0
        } else {
            // SplitMix64's finaliser: consecutive numbers map to independent-looking draws.
            let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((z ^ (z >> 31)) % self.endpoints.len() as u64) as usize
        };
        &self.endpoints[k]
    }
}

/// The `/v1` base and the completions endpoint of `url`.
fn resolve(url: &str, api: Api) -> (String, String) {
    let trimmed = url.trim().trim_end_matches('/');
    let path = match api {
        Api::Chat => "/chat/completions",
        Api::Completions => "/completions",
    };
    if let Some(b) = trimmed.strip_suffix("/chat/completions") {
        (b.to_owned(), trimmed.to_owned())
    } else if let Some(b) = trimmed.strip_suffix("/completions") {
        (b.to_owned(), trimmed.to_owned())
    } else if trimmed.ends_with("/v1") {
        (trimmed.to_owned(), format!("{trimmed}{path}"))
    } else {
        (format!("{trimmed}/v1"), format!("{trimmed}/v1{path}"))
    }
}

/// Asks `GET /v1/models` for the first model id.
pub async fn first_model(
    client: &reqwest::Client,
    target: &Target,
    key: Option<&str>,
) -> Option<String> {
    #[derive(Deserialize)]
    struct Models {
        data: Vec<Model>,
    }
    #[derive(Deserialize)]
    struct Model {
        id: String,
    }
    let mut req = client.get(&target.models).timeout(Duration::from_secs(10));
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    let resp = req.send().await.ok()?.error_for_status().ok()?;
    let models: Models = serde_json::from_slice(&resp.bytes().await.ok()?).ok()?;
    models.data.into_iter().next().map(|m| m.id)
}

/// Request options shared by every request of a run.
#[derive(Debug, Clone)]
pub struct BodyOptions {
    /// Model name.
    pub model: String,
    /// API flavour.
    pub api: Api,
    /// Stream the response.
    pub stream: bool,
    /// Send `ignore_eos: true`.
    pub ignore_eos: bool,
}

#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    messages: Option<&'a [Message]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt: Option<String>,
    max_tokens: u32,
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    ignore_eos: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<&'a str>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

/// Serialises `spec` as an OpenAI request body.
pub fn body(spec: &RequestSpec, opts: &BodyOptions) -> Bytes {
    let (messages, prompt) = match opts.api {
        Api::Chat => (Some(spec.messages.as_slice()), None),
        Api::Completions => (None, Some(spec.prompt_text())),
    };
    let body = Body {
        model: spec.model.as_deref().unwrap_or(&opts.model),
        messages,
        prompt,
        max_tokens: spec.max_tokens,
        stream: opts.stream,
        stream_options: opts.stream.then_some(StreamOptions {
            include_usage: true,
        }),
        ignore_eos: opts.ignore_eos,
        user: spec.user.as_deref(),
    };
    // Serialising plain strings and integers cannot fail.
    Bytes::from(serde_json::to_vec(&body).unwrap_or_default())
}

/// Accumulates what the stream says.
#[derive(Default)]
struct Meter {
    reader: Reader,
    first: Option<Instant>,
    last: Option<Instant>,
    chunks: u64,
    itl_ms: Vec<f32>,
    usage_output: Option<u64>,
    prompt_tokens: u64,
    cached_tokens: Option<u64>,
    done: bool,
    failed: bool,
    endpoint: Option<String>,
}

impl Meter {
    /// Reads one chunk: a stream event's data, or a whole non-streamed answer.
    fn event(&mut self, payload: &[u8], now: Instant) {
        let Ok(chunk) = Chunk::parse(payload) else {
            self.failed = true;
            return;
        };
        if chunk.error.is_some() {
            self.failed = true;
        }
        if chunk.has_content {
            if let Some(last) = self.last {
                self.itl_ms.push((now - last).as_secs_f32() * 1e3);
            } else {
                self.first = Some(now);
            }
            self.last = Some(now);
            self.chunks += 1;
        }
        if let Some(u) = chunk.usage {
            self.prompt_tokens = u.prompt_tokens.unwrap_or(0);
            self.usage_output = u.completion_tokens.or(self.usage_output);
            self.cached_tokens = u.cached_tokens;
        }
    }

    /// Reads the next bytes of a stream; `None` ends it (an event it ended inside counts).
    fn feed(&mut self, bytes: Option<&[u8]>, now: Instant) {
        let mut reader = std::mem::take(&mut self.reader);
        match bytes {
            Some(bytes) => {
                let mut feed = reader.feed(bytes);
                while let Some(event) = feed.next_event() {
                    self.read(event, now);
                }
            }
            None => {
                if let Some(event) = reader.finish() {
                    self.read(Ok(event), now);
                }
            }
        }
        self.reader = reader;
    }

    fn read(&mut self, event: Result<Event<'_>, kvgate_sse::Error>, now: Instant) {
        match event {
            Ok(Event::Done(_)) => self.done = true,
            Ok(Event::Data(d)) => self.event(d.data(), now),
            Err(_) => self.failed = true,
        }
    }
}

/// Everything a request needs besides its target and body.
#[derive(Debug, Clone)]
pub struct Sender {
    /// The pooled client (keep-alive).
    pub client: reqwest::Client,
    /// Stream responses.
    pub stream: bool,
    /// Bearer token.
    pub key: Option<String>,
    /// Anchor of all offsets.
    pub run_start: Instant,
    /// Per-request timeout.
    pub timeout: Duration,
}

impl Sender {
    /// Sends one request and measures it; `scheduled` is when the schedule wanted it to leave.
    pub async fn measure(&self, target: &Target, body: Bytes, scheduled: Instant) -> Record {
        let sent = Instant::now();
        let mut rec = Record {
            scheduled_s: (scheduled - self.run_start).as_secs_f64(),
            sent_s: (sent - self.run_start).as_secs_f64(),
            lag_ms: sent.saturating_duration_since(scheduled).as_secs_f64() * 1e3,
            ..Record::default()
        };
        let mut meter = Meter::default();
        let exchange = exchange(
            &self.client,
            target,
            body,
            self.stream,
            self.key.as_deref(),
            &mut meter,
        );
        let outcome = tokio::time::timeout(self.timeout, exchange).await;
        let end = Instant::now();
        rec.e2e_ms = (end - sent).as_secs_f64() * 1e3;
        rec.error = match outcome {
            Err(_) => Some(ErrorKind::Timeout),
            Ok(Err(kind)) => Some(kind),
            Ok(Ok(())) if meter.failed || (self.stream && !meter.done) => Some(ErrorKind::Stream),
            Ok(Ok(())) => None,
        };
        rec.ttft_ms = if self.stream {
            meter.first.map(|f| (f - sent).as_secs_f64() * 1e3)
        } else if rec.error.is_none() {
            Some(rec.e2e_ms)
        } else {
            None
        };
        rec.output_tokens = meter.usage_output.unwrap_or(meter.chunks);
        rec.prompt_tokens = meter.prompt_tokens;
        rec.cached_tokens = meter.cached_tokens;
        rec.itl_ms = meter.itl_ms;
        rec.endpoint = meter.endpoint;
        rec
    }
}

async fn exchange(
    client: &reqwest::Client,
    target: &Target,
    body: Bytes,
    stream: bool,
    key: Option<&str>,
    meter: &mut Meter,
) -> Result<(), ErrorKind> {
    let mut req = client
        .post(target.endpoint())
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body);
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    let mut resp = req.send().await.map_err(|e| ErrorKind::of(&e))?;
    meter.endpoint = resp
        .headers()
        .get("x-kvgate-endpoint")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let status = resp.status();
    if !status.is_success() {
        return Err(if status.is_client_error() {
            ErrorKind::Http4xx
        } else if status.is_server_error() {
            ErrorKind::Http5xx
        } else {
            ErrorKind::HttpOther
        });
    }
    if !stream {
        let bytes = resp.bytes().await.map_err(|e| ErrorKind::of(&e))?;
        let now = Instant::now();
        meter.event(&bytes, now);
        return Ok(());
    }
    while let Some(bytes) = resp.chunk().await.map_err(|e| ErrorKind::of(&e))? {
        meter.feed(Some(&bytes), Instant::now());
        if meter.done {
            return Ok(());
        }
    }
    meter.feed(None, Instant::now());
    Ok(())
}

#[cfg(test)]
mod tests;
