//! The semantic cache's place among the stages: looked up after the parse and before
//! admission (a hit is answered here: no queue slot, no upstream call), and a miss's answer
//! recorded on its way to the client (`crate::semcache`).

use crate::ending::Ending;
use crate::parse::Inference;
use crate::semcache::{Answer, Controls, Lookup, Miss, Recording};
use crate::semcache::{CACHE_HEADER, SIMILARITY_HEADER};
use crate::state::Shared;
use crate::tenancy::KeyConfig;
use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use kvgate_core::resilience::Outcome;
use std::sync::Arc;

/// What the cache made of a request.
pub(super) enum Cached {
    /// Answered from the cache.
    Hit(Response<Body>),
    /// On to admission.
    Go(Through),
}

/// How a request that goes upstream passed the cache.
pub(super) enum Through {
    /// The cache is off, or the request would be refused anyway.
    Off,
    /// The cache let it by (`x-kvgate-cache: bypass`).
    Bypass,
    /// Missed: the answer is recorded to be stored.
    Miss(Box<Miss>),
}

/// Looks `inference` of the client with `key` up, unless the cache is off or the request
/// would be refused anyway (a model nobody serves, or one its key may not use: admission
/// says so).
pub(super) async fn look(
    shared: &Shared,
    key: Option<&KeyConfig>,
    inference: &Inference,
    headers: &HeaderMap,
    ending: &mut Ending,
) -> Cached {
    let cache = &shared.semcache;
    if !cache.enabled() {
        return Cached::Go(Through::Off);
    }
    let model = inference.request.model.as_deref();
    let refused = model.is_some_and(|m| {
        !shared.pool.serves(m)
            || key.is_some_and(|k| {
                k.models
                    .as_ref()
                    .is_some_and(|ms| !ms.iter().any(|x| x == m))
            })
    });
    if refused {
        return Cached::Go(Through::Off);
    }
    let tenant = key
        .map(|k| k.tenant.clone().unwrap_or_else(|| k.name.clone()))
        .or_else(|| inference.request.tenant.clone())
        .unwrap_or_default();
    let scope = match (shared.config.semantic_cache.scope, key) {
        (crate::semcache::CacheScope::Key, Some(k)) => crate::semcache::key_scope(&k.name),
        _ => crate::semcache::tenant_scope(&tenant),
    };
    let lookup = cache
        .lookup(
            (inference.api, &inference.body, inference.strip_usage),
            scope,
            Controls::of(headers),
        )
        .await;
    match lookup {
        Lookup::Hit { answer, similarity } => {
            ending.set(Outcome::Ok);
            ending.facts().cache = Some(if similarity.is_some() {
                "hit_semantic"
            } else {
                "hit_exact"
            });
            Cached::Hit(replay(&answer, similarity))
        }
        Lookup::Miss(miss) => {
            ending.facts().cache = Some("miss");
            Cached::Go(Through::Miss(Box::new(miss)))
        }
        Lookup::Bypass(_) => {
            ending.facts().cache = Some("bypass");
            Cached::Go(Through::Bypass)
        }
    }
}

/// A stored answer as the response to a hit.
fn replay(answer: &Arc<Answer>, similarity: Option<f32>) -> Response<Body> {
    let mut response = Response::new(Body::from(answer.body.clone()));
    *response.status_mut() = StatusCode::OK;
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(answer.content_type()),
    );
    h.insert(CACHE_HEADER, HeaderValue::from_static("hit"));
    if let Some(s) = similarity {
        if let Ok(v) = HeaderValue::from_str(&format!("{s:.4}")) {
            h.insert(SIMILARITY_HEADER, v);
        }
    }
    response
}

/// The upstream's answer to a request that went `through` the cache: named so, and a
/// successful answer to a miss recorded to be stored.
pub(super) fn answered(
    mut response: Response<Body>,
    stream: bool,
    through: Through,
) -> Response<Body> {
    let miss = match through {
        Through::Off => return response,
        Through::Bypass => {
            response
                .headers_mut()
                .insert(CACHE_HEADER, HeaderValue::from_static("bypass"));
            return response;
        }
        Through::Miss(miss) => miss,
    };
    response
        .headers_mut()
        .insert(CACHE_HEADER, HeaderValue::from_static("miss"));
    if !(miss.stores() && response.status() == StatusCode::OK) {
        return response;
    }
    let sse = stream
        || response
            .headers()
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    let (parts, body) = response.into_parts();
    Response::from_parts(parts, Body::new(Recording::new(body, sse, *miss)))
}
