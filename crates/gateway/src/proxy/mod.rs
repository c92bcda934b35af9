//! The proxy: an inference request's stages, in order, over one record of how it ends
//! ([`Ending`], written once when it drops: metrics, access log, span, tenancy settlement).
//!
//! 1. identify the client by its key ([`intake::identify`]);
//! 2. read and parse the body ([`intake::read`]);
//! 3. admit: model served, tenancy's lease, the agent controls' hold, the queue ([`admit`]);
//! 4. route and attempt: pick, send, retry or hedge until the first bytes ([`attempts`]);
//! 5. stream the answer, continuing it elsewhere if it breaks (`crate::relay`);
//! 6. settle: the [`Ending`] drops with the body.
//!
//! `kvgate epp` runs stages 1-3 and the first pick of 4 on the same code (`crate::epp`).
//!
//! ```text
//! admit -> pick -> attempt ─ first bytes ─────────────────────────────> stream to the client
//!                    │ connect error, 5xx, 429 (Retry-After steers away)
//!                    └─> core::resilience::Attempts: wait for a hedge still running, retry
//!                        after a full-jitter backoff (budget, attempts, deadline), or give up
//!          hedge timer (TTFT percentile) fires first -> second attempt elsewhere; the first
//!          attempt to produce bytes wins and the other is dropped (its connection closes, which
//!          cancels it upstream)
//! ```
//! The decisions are the pure state machine's; this module only drives it on real time.

pub(crate) mod admit;
mod attempts;
mod cache;
pub(crate) mod intake;
mod pd;
mod respond;

use crate::ending::Ending;
use crate::error::ApiError;
use crate::parse::Inference;
use crate::state::Shared;
use crate::tenancy::KeyConfig;
use attempts::Run;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, Response};
use axum::response::IntoResponse;
use kvgate_core::resilience::Outcome;
use kvgate_core::Nanos;
use std::sync::Arc;
use std::time::Duration;

/// The response header naming the endpoint that served the request.
pub const ENDPOINT_HEADER: &str = "x-kvgate-endpoint";
/// Response header naming the priority tier that served a request, when not the first.
pub const SPILLOVER_TIER_HEADER: &str = "x-kvgate-spillover-tier";
/// Why it was not the first tier: `unavailable`, `ttft`, `queue` or `session`.
pub const SPILLOVER_REASON_HEADER: &str = "x-kvgate-spillover-reason";

/// A request header: `1` asks for [`EXPLAIN_HEADER`] on the response, the pick's reason and
/// candidates in one line.
pub const EXPLAIN_HEADER: &str = "x-kvgate-explain";

/// The response header carrying the gateway's id of the request, which `/admin/decisions`
/// and the access log use.
pub const REQUEST_ID_HEADER: &str = "x-kvgate-request-id";

/// Serves one inference request through every stage.
pub(crate) async fn serve(
    shared: Arc<Shared>,
    api: crate::parse::Api,
    req: Request,
) -> axum::response::Response {
    let mut ending = Ending::new(shared.clone());
    ending.client_request_id(req.headers().get("x-request-id"));
    ending.facts().route = req
        .extensions()
        .get::<crate::difficulty::RouteNote>()
        .map(|n| n.0.clone());
    ending.trace(req.headers());
    let answer = match intake::identify(&shared, req.headers()) {
        Err(e) => {
            ending.set(Outcome::Refused);
            Err(e)
        }
        Ok(key) => {
            let (parts, body) = req.into_parts();
            match intake::read(&shared, api, &parts, body).await {
                Ok(inference) => {
                    ending.describe(&inference.request, inference.api, inference.stream);
                    handle(shared, inference, key, &parts.headers, &mut ending).await
                }
                Err(e) => {
                    ending.set(Outcome::ClientError);
                    Err(e)
                }
            }
        }
    };
    let mut response = answer.unwrap_or_else(IntoResponse::into_response);
    // A response whose body took the record over has set its status there already.
    ending
        .facts()
        .status
        .get_or_insert(response.status().as_u16());
    response
        .headers_mut()
        .insert(REQUEST_ID_HEADER, HeaderValue::from(ending.id()));
    response
}

/// Stages 3 and 4 of a parsed request of the client with `key`.
async fn handle(
    shared: Arc<Shared>,
    mut inference: Inference,
    key: Option<Arc<KeyConfig>>,
    headers: &HeaderMap,
    ending: &mut Ending,
) -> Result<Response<Body>, ApiError> {
    // The client's deadline counts from here, the request's arrival as the proxy sees it.
    let arrived = shared.pool.clock().now();
    let deadline = inference.deadline.map(|d| arrived + nanos(d));
    // Before admission: a hit takes no queue slot and makes no upstream call.
    let through = match cache::look(&shared, key.as_deref(), &inference, headers, ending).await {
        cache::Cached::Hit(response) => return Ok(response),
        cache::Cached::Go(through) => through,
    };
    let admitted = admit::admit(&shared, key, &mut inference, arrived, ending).await?;
    let explain = headers
        .get(EXPLAIN_HEADER)
        .is_some_and(|v| v.as_bytes() == b"1" || v.as_bytes().eq_ignore_ascii_case(b"true"));
    let stream = inference.stream;
    let mut run = Run::new(shared, inference, headers, ending.id());
    if admitted.keyed {
        // The client's key is the gateway's, not an engine's.
        Arc::make_mut(&mut run.sending.forwarded).remove(header::AUTHORIZATION);
    }
    run.trace = ending.span_context();
    run.explain = explain;
    let response = run.drive(admitted, deadline, ending).await?;
    Ok(cache::answered(response, stream, through))
}

fn nanos(d: Duration) -> Nanos {
    Nanos(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}
