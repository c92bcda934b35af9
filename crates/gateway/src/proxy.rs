//! The inference handler: admission, pick, attempts with retries and a hedge before the first
//! token, then the pass-through stream.
//!
//! ```text
//! admit -> pick -> attempt ─ first bytes ─────────────────────────────> stream to the client
//!                    │ connect error, 5xx, 429 (Retry-After steers away)
//!                    └─> retry budget? attempts left? -> full-jitter backoff -> pick another
//!          hedge timer (TTFT percentile) fires first -> second attempt elsewhere; the first
//!          attempt to produce bytes wins and the other is dropped (its connection closes, which
//!          cancels it upstream)
//! ```

use crate::body::Tracked;
use crate::dispatch::Dispatch;
use crate::error::ApiError;
use crate::metrics;
use crate::parse::Inference;
use crate::state::Shared;
use crate::upstream::{self, AttemptError, Ready};
use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Response};
use futures_util::stream::{FuturesUnordered, StreamExt};
use kvgate_core::{EndpointId, Rejection};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

type AttemptFuture = Pin<Box<dyn Future<Output = (Dispatch, Result<Ready, AttemptError>)> + Send>>;

/// The response header naming the endpoint that served the request.
pub const ENDPOINT_HEADER: &str = "x-kvgate-endpoint";

const HOP_BY_HOP: [HeaderName; 5] = [
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
];

/// Serves one validated inference request.
pub(crate) async fn handle(
    shared: Arc<Shared>,
    inference: Inference,
    headers: &HeaderMap,
) -> Result<Response<Body>, ApiError> {
    // The client's deadline counts from here, the request's arrival as the proxy sees it.
    let arrived = Instant::now();
    let expires = inference.deadline.map(|d| arrived + d);
    let expired = |extra: Duration| expires.is_some_and(|t| Instant::now() + extra >= t);
    let policy = shared.pool.policy_name();
    let reject = |e: ApiError, outcome| {
        shared.metrics.request(outcome, policy, "none");
        e
    };
    if let Some(model) = &inference.request.model {
        if !shared.pool.serves(model) {
            return Err(reject(ApiError::unknown_model(model), "client_error"));
        }
    }
    let permit = match shared
        .admission
        .admit(inference.deadline, inference.request.priority)
        .await
    {
        Ok(p) => p,
        Err(e) => {
            let outcome = if e.status.as_u16() == 429 {
                "queue_full"
            } else {
                "deadline"
            };
            return Err(reject(e, outcome));
        }
    };
    let mut request = inference.request;
    request.id = shared.next_request.fetch_add(1, Ordering::Relaxed);
    let request = Arc::new(request);
    let forwarded = Arc::new(upstream::forwarded_headers(headers));
    let retry = &shared.config.retry;
    let max_retry_after = Duration::from_secs(retry.max_retry_after_secs);
    // Streams only: a non-streaming response's first bytes come when generation ends, so a
    // first-token timeout would cut off every long answer (and retry it elsewhere).
    let first_token_timeout = (inference.stream && retry.first_token_timeout_ms > 0)
        .then(|| Duration::from_millis(retry.first_token_timeout_ms));

    // Picks among endpoints not yet tried; a retry (not a hedge) may fall back to one already
    // tried when nothing else is routable. A retry's backoff is slept before this pick, so the
    // ledger entry, the `Dispatched` event, a breaker probe slot and the TTFT clock all start
    // when the attempt is really sent.
    let launch = |exclude: &[EndpointId],
                  fallback: bool|
     -> Result<(EndpointId, AttemptFuture), Rejection> {
        let target = match shared.pool.pick(&request, exclude) {
            Ok(t) => t,
            Err(_) if fallback => shared.pool.pick(&request, &[])?,
            Err(r) => return Err(r),
        };
        let id = target.id;
        let mut dispatch = Dispatch::new(shared.clone(), request.id, target, inference.stream);
        let client = shared.client.clone();
        let body = inference.body.clone();
        let forwarded = forwarded.clone();
        let api = inference.api;
        Ok((
            id,
            Box::pin(async move {
                let base = dispatch.target.base.clone();
                let auth = dispatch.target.authorization.clone();
                let send = upstream::attempt(
                    &client,
                    &base,
                    api,
                    body,
                    &forwarded,
                    auth.as_ref(),
                    max_retry_after,
                );
                let result = match first_token_timeout {
                    Some(limit) => tokio::time::timeout(limit, send)
                        .await
                        .unwrap_or(Err(AttemptError::Timeout(limit))),
                    None => send.await,
                };
                // Only a 2xx answer carries tokens; other statuses go to the client unchanged.
                match &result {
                    Ok(ready) if ready.head.status.is_success() => dispatch.first_token(),
                    Ok(ready) => dispatch.refused(ready.head.status.as_u16()),
                    Err(_) => {}
                }
                (dispatch, result)
            }),
        ))
    };

    shared.pool.request_started();
    let mut tried = Vec::with_capacity(2);
    let mut attempts: FuturesUnordered<AttemptFuture> = FuturesUnordered::new();
    match launch(&tried, false) {
        Ok((id, fut)) => {
            tried.push(id);
            attempts.push(fut);
        }
        Err(r) => {
            // Every endpoint may be inside a Retry-After window or behind an open breaker: tell
            // the client when the first of them takes traffic again.
            let mut error = ApiError::no_endpoint(r);
            error.retry_after_secs = shared
                .pool
                .routable_again_in(request.model.as_deref())
                .map(|d| d.as_secs_f64().ceil().max(1.0) as u64);
            return Err(reject(error, "no_endpoint"));
        }
    }
    let hedge_delay = if inference.stream {
        shared.pool.hedge_delay()
    } else {
        None
    };
    // No timer at all when hedging is off: a timer per request costs a timer-wheel entry.
    let mut hedge_timer = hedge_delay.map(|d| Box::pin(tokio::time::sleep(d)));
    let mut hedged = hedge_delay.is_none();
    let mut retries = 0u32;
    let mut hedge_endpoint = None;

    loop {
        tokio::select! {
            Some((mut dispatch, result)) = attempts.next() => match result {
                Ok(ready) => {
                    if hedge_endpoint == Some(dispatch.target.id) {
                        shared.metrics.hedges.get_or_create(&metrics::reason("won")).inc();
                    }
                    dispatch.final_attempt = true;
                    drop(attempts); // cancels a losing hedge
                    return Ok(respond(ready, dispatch, permit, inference.stream));
                }
                Err(error) => {
                    let kind = error.kind();
                    let label = error.label();
                    let mut withdrawn = None;
                    let denied = if !attempts.is_empty() {
                        None
                    } else if expired(Duration::ZERO) {
                        Some("deadline")
                    } else if retries + 1 >= retry.max_attempts {
                        Some("attempts")
                    } else {
                        withdrawn = shared.pool.try_retry();
                        withdrawn.is_none().then_some("budget")
                    };
                    if let Some(why) = denied {
                        shared.metrics.retries_denied.get_or_create(&metrics::reason(why)).inc();
                    }
                    let last = denied.is_some();
                    if last {
                        dispatch.final_attempt = true;
                    }
                    let retry_after = error.retry_after();
                    let name = dispatch.target.name.clone();
                    let past_deadline = denied == Some("deadline");
                    dispatch.fail(
                        kind,
                        retry_after,
                        if past_deadline { "deadline" } else { "upstream_error" },
                    );
                    if !attempts.is_empty() {
                        continue; // a hedge is still running; it may yet succeed
                    }
                    if past_deadline {
                        return Err(ApiError::deadline_passed_upstream());
                    }
                    if last {
                        return Ok(upstream_failure(error, &name));
                    }
                    let delay = shared.pool.backoff(&retry.backoff, retries);
                    if expired(delay) {
                        // The backoff alone would outlast the client's deadline.
                        if let Some(at) = withdrawn {
                            shared.pool.refund_retry(at);
                        }
                        shared.metrics.retries_denied.get_or_create(&metrics::reason("deadline")).inc();
                        shared.metrics.request("deadline", policy, &name);
                        return Err(ApiError::deadline_passed_upstream());
                    }
                    retries += 1;
                    shared.metrics.retries.get_or_create(&metrics::reason(label)).inc();
                    if !delay.is_zero() {
                        tokio::time::sleep(delay).await;
                    }
                    match launch(&tried, true) {
                        Ok((id, fut)) => {
                            tried.push(id);
                            attempts.push(fut);
                        }
                        Err(_) => {
                            // Nothing was sent: the retry goes back into the budget.
                            if let Some(at) = withdrawn {
                                shared.pool.refund_retry(at);
                            }
                            shared.metrics.request("upstream_error", policy, &name);
                            return Ok(upstream_failure(error, &name));
                        }
                    }
                }
            },
            () = async { match hedge_timer.as_mut() { Some(t) => t.await, None => std::future::pending().await } }, if !hedged => {
                hedged = true;
                if expired(Duration::ZERO) {
                    continue; // nobody waits for a second attempt any more
                }
                // A hedge must go elsewhere: no fallback to an endpoint already tried.
                if let Ok((id, fut)) = launch(&tried, false) {
                    shared.metrics.hedges.get_or_create(&metrics::reason("launched")).inc();
                    hedge_endpoint = Some(id);
                    tried.push(id);
                    attempts.push(fut);
                }
            }
        }
    }
}

fn respond(
    ready: Ready,
    dispatch: Dispatch,
    permit: crate::admission::Permit,
    stream: bool,
) -> Response<Body> {
    let Ready {
        mut head,
        first,
        rest,
    } = ready;
    for h in &HOP_BY_HOP {
        head.headers.remove(h);
    }
    let sse = stream
        || head
            .headers
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if let Ok(v) = HeaderValue::from_str(&dispatch.target.name) {
        head.headers.insert(ENDPOINT_HEADER, v);
    }
    let ok = head.status.is_success();
    let body = Tracked::new(first, rest, dispatch, permit, sse, ok);
    Response::from_parts(head, Body::new(body))
}

/// The answer once every attempt failed: the last upstream error response as it was (so a
/// client sees the engine's own 429 and Retry-After), or a 502 for connection failures.
fn upstream_failure(error: AttemptError, endpoint: &str) -> Response<Body> {
    use axum::response::IntoResponse;
    match error {
        AttemptError::Status {
            status,
            mut headers,
            body,
            ..
        } => {
            for h in &HOP_BY_HOP {
                headers.remove(h);
            }
            headers.remove(header::CONTENT_LENGTH);
            if let Ok(v) = HeaderValue::from_str(endpoint) {
                headers.insert(ENDPOINT_HEADER, v);
            }
            let mut response = Response::new(Body::from(body));
            *response.status_mut() = status;
            *response.headers_mut() = headers;
            response
        }
        other => ApiError::upstream(format!("{endpoint}: {other}")).into_response(),
    }
}
