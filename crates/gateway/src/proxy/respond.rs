//! The answer's head once an attempt answered or every attempt failed: hop-by-hop headers
//! removed, the endpoint and tier named, the body handed to the relay.

use super::{ENDPOINT_HEADER, EXPLAIN_HEADER, SPILLOVER_REASON_HEADER, SPILLOVER_TIER_HEADER};
use crate::admission::Permit;
use crate::dispatch::Dispatch;
use crate::ending::Ending;
use crate::error::ApiError;
use crate::relay::{Resume, Tracked};
use crate::upstream::{AttemptError, Ready};
use axum::body::Body;
use axum::http::{header, HeaderName, HeaderValue, Response};

const HOP_BY_HOP: [HeaderName; 5] = [
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
];

pub(super) fn add_explanation(response: &mut Response<Body>, summary: Option<String>) {
    if let Some(v) = summary.and_then(|s| HeaderValue::from_str(&s).ok()) {
        response.headers_mut().insert(EXPLAIN_HEADER, v);
    }
}

pub(super) fn respond(
    ready: Ready,
    dispatch: Dispatch,
    (permit, mut ending): (Permit, Ending),
    (stream, strip_usage): (bool, bool),
    resume: Result<Box<Resume>, &'static str>,
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
    if dispatch.target.tier > 0 {
        // Served below the first tier: a higher tier was out (down, cooling down, in a
        // Retry-After window) or spilled the request over (`spillover`).
        let reason = dispatch.target.spilled.unwrap_or("unavailable");
        head.headers.insert(
            SPILLOVER_TIER_HEADER,
            HeaderValue::from(dispatch.target.tier),
        );
        head.headers
            .insert(SPILLOVER_REASON_HEADER, HeaderValue::from_static(reason));
    }
    let ok = head.status.is_success();
    let facts = ending.facts();
    facts.status = Some(head.status.as_u16());
    facts.first_token = (ok && stream).then(std::time::Instant::now);
    let owners = (permit, ending);
    let body = Tracked::new(
        first,
        rest,
        dispatch,
        owners,
        (sse, ok, strip_usage),
        resume,
    );
    Response::from_parts(head, Body::new(body))
}

/// The answer once every attempt failed: the last upstream error response as it was (so a
/// client sees the engine's own 429 and Retry-After), or a 502 for connection failures.
pub(super) fn upstream_failure(error: AttemptError, endpoint: &str) -> Response<Body> {
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
