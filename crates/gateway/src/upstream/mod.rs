//! One attempt upstream: send the body, wait for the response head and then for the first body
//! bytes. The retry window closes with those first bytes (before the first token a request can
//! move; after it, never: docs/background.md#the-commit-point), so an attempt succeeds only once
//! data has arrived.

use crate::parse::Api;
use axum::http::{header, HeaderMap, HeaderValue, Method, Request, StatusCode};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use kvgate_core::decision::FailureKind;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::RootCertStore;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

mod trouble;

pub(crate) use trouble::Trouble;

/// The pooled keep-alive client shared by every request and scrape: plain HTTP/1.1 to `http://`
/// upstreams, TLS to `https://` ones with HTTP/2 when the server offers it (ALPN), else
/// HTTP/1.1.
pub(crate) type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A small `GET`-style exchange off the request path (scrapes, the Kubernetes API): sends
/// `request` and reads at most `limit` bytes of the answer, all within `timeout`.
pub(crate) async fn fetch(
    client: &HttpClient,
    request: Request<Full<Bytes>>,
    limit: usize,
    timeout: Duration,
) -> Result<(StatusCode, Bytes), Trouble> {
    let url = request.uri().to_string();
    let exchange = async {
        let response = client
            .request(request)
            .await
            .map_err(|e| Trouble::of(&e, &url))?;
        let status = response.status();
        let body = http_body_util::Limited::new(response.into_body(), limit)
            .collect()
            .await
            .map_err(|e| Trouble::Other {
                detail: e.to_string(),
            })?
            .to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| Trouble::timeout(timeout))?
}

/// Why the upstream client could not be built.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {why}")]
pub(crate) struct UpstreamTlsError {
    path: String,
    why: String,
}

/// The certificates `https://` upstreams are checked against: the system's roots (none on a
/// machine without a CA bundle) plus every endpoint's `ca_file` (for self-signed or private CAs).
fn roots(ca_files: &[&Path]) -> Result<RootCertStore, UpstreamTlsError> {
    let mut roots = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    let (added, _ignored) = roots.add_parsable_certificates(native.certs);
    if added == 0 {
        tracing::debug!("no system CA certificates found; https upstreams need a ca_file");
    }
    for path in ca_files {
        let error = |why: String| UpstreamTlsError {
            path: path.display().to_string(),
            why,
        };
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| error(e.to_string()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| error(e.to_string()))?;
        if certs.is_empty() {
            return Err(error("no certificate in the file".into()));
        }
        for cert in certs {
            roots.add(cert).map_err(|e| error(e.to_string()))?;
        }
    }
    Ok(roots)
}

/// Builds the client: TCP_NODELAY, 5 s connect timeout, 90 s idle keep-alive, up to 1,024 idle
/// connections per host, TLS (rustls, ring) trusting [`roots`].
pub(crate) fn client(ca_files: &[&Path]) -> Result<HttpClient, UpstreamTlsError> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(Duration::from_secs(5)));
    connector.enforce_http(false);
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| UpstreamTlsError {
        path: String::new(),
        why: e.to_string(),
    })?
    .with_root_certificates(roots(ca_files)?)
    .with_no_client_auth();
    let https = HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(connector);
    Ok(Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(1024)
        .build(https))
}

/// The client headers an engine may need: its API key, the accepted encodings of the answer,
/// and trace context (W3C `traceparent`/`tracestate`, `x-request-id`).
const FORWARDED: [&str; 5] = [
    "authorization",
    "accept",
    "traceparent",
    "tracestate",
    "x-request-id",
];

/// The subset of `headers` forwarded upstream.
pub(crate) fn forwarded_headers(headers: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::new();
    for name in FORWARDED {
        if let Some(v) = headers.get(name) {
            out.insert(name, v.clone());
        }
    }
    out
}

/// An upstream response whose first body bytes (or end) have arrived.
#[derive(Debug)]
pub(crate) struct Ready {
    /// Status and headers.
    pub(crate) head: axum::http::response::Parts,
    /// The first data frame, if the body was not empty.
    pub(crate) first: Option<Bytes>,
    /// The rest of the body; `None` when it already ended.
    pub(crate) rest: Option<Incoming>,
}

/// Why an attempt failed before its first bytes.
#[derive(Debug)]
pub(crate) enum AttemptError {
    /// No connection, or it broke before the response head.
    Connect(String),
    /// A 5xx or 429, with its Retry-After and body.
    Status {
        /// The status.
        status: StatusCode,
        /// Parsed Retry-After.
        retry_after: Option<Duration>,
        /// The response headers.
        headers: HeaderMap,
        /// The (bounded) body.
        body: Bytes,
    },
    /// The connection broke after the head but before any body bytes.
    Dropped(String),
    /// No first bytes within `retry.first_token_timeout_ms`.
    Timeout(std::time::Duration),
}

impl AttemptError {
    /// The failure as kvgate-core names it.
    pub(crate) fn kind(&self) -> FailureKind {
        match self {
            AttemptError::Connect(_) | AttemptError::Dropped(_) => FailureKind::Connect,
            AttemptError::Timeout(_) => FailureKind::Timeout,
            AttemptError::Status { status, .. } if *status == StatusCode::TOO_MANY_REQUESTS => {
                FailureKind::Overloaded
            }
            AttemptError::Status { .. } => FailureKind::ServerError,
        }
    }

    /// A short metric label.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            AttemptError::Connect(_) => "connect",
            AttemptError::Dropped(_) => "dropped",
            AttemptError::Timeout(_) => "timeout",
            AttemptError::Status { status, .. } if *status == StatusCode::TOO_MANY_REQUESTS => {
                "429"
            }
            AttemptError::Status { .. } => "5xx",
        }
    }

    /// The Retry-After the endpoint asked for.
    pub(crate) fn retry_after(&self) -> Option<Duration> {
        match self {
            AttemptError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

impl std::fmt::Display for AttemptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AttemptError::Connect(e) => write!(f, "connection failed: {e}"),
            AttemptError::Status { status, .. } => write!(f, "upstream answered {status}"),
            AttemptError::Dropped(e) => write!(f, "connection lost before the first token: {e}"),
            AttemptError::Timeout(d) => write!(f, "no first token within {d:?}"),
        }
    }
}

/// `body` (a JSON object the parser accepted) as one deployment receives it: `model` replaced
/// (an alias becomes the deployment's own name), and `prompt_cache_key` set when the client set
/// none. Field order is kept; the body is untouched when neither applies.
pub(crate) fn rewritten(body: &Bytes, model: Option<&str>, cache_key: Option<&str>) -> Bytes {
    if model.is_none() && cache_key.is_none() {
        return body.clone();
    }
    let Ok(mut fields) = serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(body)
    else {
        return body.clone();
    };
    if let Some(model) = model {
        fields.insert("model".into(), serde_json::Value::String(model.to_owned()));
    }
    if let Some(key) = cache_key {
        fields
            .entry("prompt_cache_key")
            .or_insert_with(|| serde_json::Value::String(key.to_owned()));
    }
    serde_json::to_vec(&fields).map_or_else(|_| body.clone(), Bytes::from)
}

/// What an attempt sends besides the body: the client's forwarded headers, the endpoint's key
/// and its configured headers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Headers<'a> {
    pub(crate) forwarded: &'a HeaderMap,
    pub(crate) authorization: Option<&'a HeaderValue>,
    pub(crate) configured: &'a HeaderMap,
}

/// Sends one attempt and waits for its first body bytes.
pub(crate) async fn attempt(
    client: &HttpClient,
    base: &str,
    api: Api,
    body: Bytes,
    headers: Headers<'_>,
    max_retry_after: Duration,
) -> Result<Ready, AttemptError> {
    let Headers {
        forwarded,
        authorization,
        configured,
    } = headers;
    let uri = format!("{base}{}", api.path());
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(body))
        .map_err(|e| AttemptError::Connect(e.to_string()))?;
    for (name, value) in forwarded.iter().chain(configured) {
        request.headers_mut().insert(name, value.clone());
    }
    if let Some(auth) = authorization {
        request
            .headers_mut()
            .insert(header::AUTHORIZATION, auth.clone());
    }
    let response = client
        .request(request)
        .await
        .map_err(|e| AttemptError::Connect(Trouble::of(&e, base).to_string()))?;
    let (head, mut incoming) = response.into_parts();
    if head.status.is_server_error() || head.status == StatusCode::TOO_MANY_REQUESTS {
        let retry_after = head
            .headers
            .get(header::RETRY_AFTER)
            .and_then(|v| parse_retry_after(v, max_retry_after, SystemTime::now()));
        let body = http_body_util::Limited::new(incoming, 64 * 1024)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        return Err(AttemptError::Status {
            status: head.status,
            retry_after,
            headers: head.headers,
            body,
        });
    }
    loop {
        match incoming.frame().await {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) if data.is_empty() => continue,
                Ok(data) => {
                    return Ok(Ready {
                        head,
                        first: Some(data),
                        rest: Some(incoming),
                    })
                }
                Err(_trailers) => continue,
            },
            Some(Err(e)) => return Err(AttemptError::Dropped(error_chain(&e))),
            None => {
                return Ok(Ready {
                    head,
                    first: None,
                    rest: None,
                })
            }
        }
    }
}

/// A `Retry-After` capped at `max`, in either form RFC 9110 §10.2.3 allows: delay seconds, or an
/// HTTP-date (the wait is the date minus `now`, zero when it has passed). Negative, NaN and
/// unparsable values are ignored; a huge value (say `1e20`, beyond what a [`Duration`] holds) is
/// clamped to `max` before conversion, since `Duration::from_secs_f64` panics on overflow.
pub(crate) fn parse_retry_after(
    value: &HeaderValue,
    max: Duration,
    now: SystemTime,
) -> Option<Duration> {
    let text = value.to_str().ok()?.trim();
    if let Ok(date) = httpdate::parse_http_date(text) {
        return Some(date.duration_since(now).unwrap_or(Duration::ZERO).min(max));
    }
    let secs = text.parse::<f64>().ok()?;
    if secs.is_nan() || secs < 0.0 {
        return None;
    }
    // `try_from` as well as the clamp: a `max` near `u64::MAX` seconds rounds up as an f64.
    Some(Duration::try_from_secs_f64(secs.min(max.as_secs_f64())).map_or(max, |d| d.min(max)))
}

/// An error and its causes on one line.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// What every attempt of one request sends besides its body: first attempt, retries, hedges
/// and mid-stream continuations alike.
#[derive(Clone, Debug)]
pub(crate) struct Sending {
    pub(crate) client: HttpClient,
    pub(crate) api: Api,
    /// The client's headers that go upstream (trace context replaced per attempt).
    pub(crate) forwarded: Arc<HeaderMap>,
    pub(crate) first_token_timeout: Option<Duration>,
    pub(crate) max_retry_after: Duration,
    pub(crate) session: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_clamped_before_conversion_and_junk_is_ignored() {
        let max = Duration::from_secs(60);
        let now = SystemTime::UNIX_EPOCH;
        let parse = |v: &'static str| parse_retry_after(&HeaderValue::from_static(v), max, now);
        assert_eq!(parse("1e20"), Some(max), "must not panic on overflow");
        assert_eq!(parse("inf"), Some(max));
        assert_eq!(parse(" 2.5 "), Some(Duration::from_millis(2_500)));
        assert_eq!(parse("-1"), None);
        assert_eq!(parse("NaN"), None);
        assert_eq!(parse("soon"), None);
        let huge = Duration::from_secs(u64::MAX);
        let value = HeaderValue::from_static("1e30");
        assert_eq!(parse_retry_after(&value, huge, now), Some(huge));
    }

    #[test]
    fn retry_after_accepts_an_http_date() {
        let max = Duration::from_secs(60);
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        let parse = |v: &'static str| parse_retry_after(&HeaderValue::from_static(v), max, now);
        assert_eq!(
            parse("Sun, 06 Nov 1994 08:50:07 GMT"),
            Some(Duration::from_secs(30))
        );
        assert_eq!(parse("Sun, 06 Nov 1994 08:49:00 GMT"), Some(Duration::ZERO));
        assert_eq!(parse("Mon, 07 Nov 1994 08:49:37 GMT"), Some(max));
        assert_eq!(
            parse("Sunday, 06-Nov-94 08:49:47 GMT"),
            Some(Duration::from_secs(10))
        );
    }

    #[test]
    fn forwards_the_api_key_and_trace_context_only() {
        let mut h = HeaderMap::new();
        h.insert("authorization", HeaderValue::from_static("Bearer k"));
        h.insert("traceparent", HeaderValue::from_static("00-abc-def-01"));
        h.insert("cookie", HeaderValue::from_static("secret"));
        h.insert("x-kvgate-tenant", HeaderValue::from_static("t"));
        let out = forwarded_headers(&h);
        assert_eq!(out.len(), 2);
        assert_eq!(out["authorization"], "Bearer k");
        assert!(out.get("cookie").is_none());
    }

    #[tokio::test]
    async fn an_attempt_sends_the_key_the_configured_headers_and_the_renamed_model() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            // Head and the small body arrive together or in a few reads.
            while !String::from_utf8_lossy(&seen).contains("}") {
                let n = socket.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                seen.extend_from_slice(&buf[..n]);
            }
            socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
                .await
                .unwrap();
            String::from_utf8_lossy(&seen).to_lowercase()
        });
        let client = client(&[]).unwrap();
        let mut configured = HeaderMap::new();
        configured.insert("x-project", HeaderValue::from_static("p1"));
        let key = HeaderValue::from_static("Bearer sk-up");
        let original = Bytes::from_static(br#"{"model":"chat","stream":false}"#);
        assert_eq!(rewritten(&original, None, None), original);
        let keyed = rewritten(&original, None, Some("s1"));
        assert_eq!(
            &keyed[..],
            br#"{"model":"chat","stream":false,"prompt_cache_key":"s1"}"#
        );
        assert_eq!(
            rewritten(&keyed, None, Some("s2")),
            keyed,
            "the client's key stays"
        );
        let body = rewritten(&original, Some("m-7b"), None);
        assert_eq!(&body[..], br#"{"model":"m-7b","stream":false}"#);
        let headers = Headers {
            forwarded: &HeaderMap::new(),
            authorization: Some(&key),
            configured: &configured,
        };
        let ready = attempt(
            &client,
            &base,
            Api::Chat,
            body,
            headers,
            Duration::from_secs(1),
        )
        .await
        .unwrap();
        assert_eq!(ready.head.status, StatusCode::OK);
        let seen = server.await.unwrap();
        assert!(seen.contains("x-project: p1"), "{seen}");
        assert!(seen.contains("authorization: bearer sk-up"), "{seen}");
        assert!(seen.contains(r#""model":"m-7b""#), "{seen}");
    }
}
