//! The admin API, mounted only when `admin_token` is set and requiring it as a bearer token:
//! - `GET /admin/endpoints`: every endpoint's status;
//! - `POST /admin/endpoints` with an endpoint config (`{"url": ..., "weight": ..., ...}`): add;
//! - `POST /admin/endpoints/{id}/drain` and `/undrain`: stop or resume new requests;
//! - `DELETE /admin/endpoints/{id}`: remove (requests already sent there finish);
//! - `GET /admin/decisions?limit=N&request=ID`: the most recent decision records, newest first
//!   (at most `limit`, default 50; only those of request `ID` when given);
//! - `GET /admin/config`: the watched configuration file, reloads applied and rejected, and
//!   the last one's result (with the reason a rejected file was not applied);
//! - `DELETE /admin/cache?tenant=T` (or `?key=K` with `scope: key`): drop this replica's
//!   semantic-cache entries of that tenant or key (every entry without either); answers
//!   `{"flushed": N}`;
//! - `/admin/status` and `/admin/keys`: see [`tenancy`].

mod tenancy;

use crate::endpoint_config::EndpointConfig;
use crate::error::ApiError;
use crate::state::Shared;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use kvgate_core::EndpointId;
use std::sync::Arc;

pub(crate) fn authorize(shared: &Shared, headers: &HeaderMap) -> Result<(), ApiError> {
    let expected = shared
        .config
        .admin_token
        .as_deref()
        .ok_or_else(ApiError::unauthorized)?;
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    // Compare every byte so the time taken does not reveal the matching prefix length.
    let same = given.len() == expected.len()
        && given
            .bytes()
            .zip(expected.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0;
    if same {
        Ok(())
    } else {
        Err(ApiError::unauthorized())
    }
}

/// An admin request's JSON body, or a 400 naming `what` did not parse.
pub(crate) fn json_body<T: serde::de::DeserializeOwned>(
    body: &[u8],
    what: &str,
) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid("invalid_json", format!("{what}: {e}")))
}

async fn list(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Result<Json<serde_json::Value>, ApiError> {
    authorize(&s, &headers)?;
    Ok(Json(serde_json::json!({ "endpoints": s.pool.status() })))
}

async fn config(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Result<Json<serde_json::Value>, ApiError> {
    authorize(&s, &headers)?;
    Ok(Json(serde_json::json!({ "reloads": &*s.reloads() })))
}

#[derive(Debug, serde::Deserialize)]
struct DecisionQuery {
    limit: Option<usize>,
    request: Option<u64>,
}

async fn decisions(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    query: Result<Query<DecisionQuery>, QueryRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    authorize(&s, &headers)?;
    let Query(q) = query.map_err(|e| ApiError::invalid("invalid_query", e.body_text()))?;
    let records = s.pool.decisions(q.limit.unwrap_or(50), q.request);
    Ok(Json(serde_json::json!({
        "policy": s.pool.policy_name(),
        "decisions": records,
    })))
}

async fn add(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<serde_json::Value>), ApiError> {
    authorize(&s, &headers)?;
    let config: EndpointConfig = json_body(&body, "endpoint config")?;
    let mut check = crate::Config::default();
    check.endpoints.push(config.clone());
    check
        .validate()
        .map_err(|e| ApiError::invalid("invalid_value", e.to_string()))?;
    let id = s.pool.add(config);
    s.watch.start(id);
    Ok((StatusCode::CREATED, Json(serde_json::json!({ "id": id }))))
}

fn set_draining(
    s: &Shared,
    headers: &HeaderMap,
    id: u32,
    draining: bool,
) -> Result<StatusCode, ApiError> {
    authorize(s, headers)?;
    if s.pool.set_draining(EndpointId(id), draining) {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(missing(id))
    }
}

fn missing(id: u32) -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        ..ApiError::invalid("endpoint_not_found", format!("no endpoint with id {id}"))
    }
}

async fn drain(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<u32>,
) -> Result<StatusCode, ApiError> {
    set_draining(&s, &headers, id, true)
}

async fn undrain(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<u32>,
) -> Result<StatusCode, ApiError> {
    set_draining(&s, &headers, id, false)
}

async fn remove(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<u32>,
) -> Result<StatusCode, ApiError> {
    authorize(&s, &headers)?;
    if s.pool.remove(EndpointId(id)) {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(missing(id))
    }
}

#[derive(serde::Deserialize)]
struct FlushQuery {
    tenant: Option<String>,
    key: Option<String>,
}

async fn flush_cache(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    query: Result<Query<FlushQuery>, QueryRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    authorize(&s, &headers)?;
    let Query(query) = query.map_err(|e| ApiError::invalid("invalid_query", e.body_text()))?;
    let scope = match (query.tenant, query.key) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "invalid_query",
                "give tenant or key, not both".to_string(),
            ))
        }
        (Some(t), None) => Some(crate::semcache::tenant_scope(&t)),
        (None, Some(k)) => Some(crate::semcache::key_scope(&k)),
        (None, None) => None,
    };
    let flushed = s.semcache.flush(scope.as_deref());
    Ok(Json(serde_json::json!({ "flushed": flushed })))
}

pub(crate) fn router() -> Router<Arc<Shared>> {
    Router::new()
        .route("/admin/endpoints", get(list).post(add))
        .route("/admin/decisions", get(decisions))
        .route("/admin/config", get(config))
        .route("/admin/endpoints/{id}", axum::routing::delete(remove))
        .route("/admin/endpoints/{id}/drain", post(drain))
        .route("/admin/endpoints/{id}/undrain", post(undrain))
        .route("/admin/cache", axum::routing::delete(flush_cache))
        .merge(tenancy::router())
}
