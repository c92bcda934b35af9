//! The admin API's tenancy routes (behind the admin token like the rest of `/admin/*`):
//! - `GET /admin/status`: admission (in flight, queued, each tenant's place and counter), keys,
//!   limits with what is left of each, budgets with spend;
//! - `GET /admin/keys`: the keys (names, tenants, limits; never a key or its digest);
//! - `POST /admin/keys` with a key config without `key_sha256`: creates a key and returns it,
//!   once; with `key_sha256`: registers a key the caller made;
//! - `DELETE /admin/keys/{name}`: revokes a key.
//!
//! Keys added here are kept in the tenancy store when there is one, so they survive restarts.

use super::authorize;
use crate::error::ApiError;
use crate::state::Shared;
use crate::tenancy::{keys, KeyConfig};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{delete, get};
use axum::{Json, Router};
use std::sync::Arc;

async fn status(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Result<Json<serde_json::Value>, ApiError> {
    authorize(&s, &headers)?;
    let (in_flight, prefilling, queued, tenants) = s.admission.status();
    let queue: Vec<_> = tenants
        .iter()
        .map(|t| {
            serde_json::json!({"tenant": t.tenant, "interactive": t.interactive, "batch": t.batch, "counter": t.counter})
        })
        .collect();
    let a = &s.config.admission;
    Ok(Json(serde_json::json!({
        "policy": s.pool.policy_name(),
        "admission": {
            "order": a.order,
            "max_concurrency": a.max_concurrency,
            "max_prefills": a.max_prefills,
            "max_queue": a.max_queue,
            "in_flight": in_flight,
            "prefilling": prefilling,
            "queued": queued,
            "tenants": queue,
        },
        "tenancy": s.tenancy.status(s.pool.clock().now()),
    })))
}

async fn list(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Result<Json<serde_json::Value>, ApiError> {
    authorize(&s, &headers)?;
    Ok(Json(serde_json::json!({ "keys": s.tenancy.keys_json() })))
}

async fn add(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<serde_json::Value>), ApiError> {
    authorize(&s, &headers)?;
    let mut key: KeyConfig = super::json_body(&body, "key config")?;
    let created = if key.key_sha256.is_empty() {
        let k = keys::generate().map_err(|_| ApiError::upstream("no system randomness"))?;
        key.key_sha256 = keys::hex(&keys::digest(&k));
        Some(k)
    } else {
        None
    };
    let name = key.name.clone();
    s.tenancy.add_key(key)?;
    Ok((
        StatusCode::CREATED,
        Json(
            serde_json::json!({ "name": name, "key": created, "persisted": s.tenancy.persists() }),
        ),
    ))
}

async fn remove(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    authorize(&s, &headers)?;
    if s.tenancy.remove_key(&name)? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError {
            status: StatusCode::NOT_FOUND,
            ..ApiError::invalid("key_not_found", format!("no key named {name:?}"))
        })
    }
}

pub(crate) fn router() -> Router<Arc<Shared>> {
    Router::new()
        .route("/admin/status", get(status))
        .route("/admin/keys", get(list).post(add))
        .route("/admin/keys/{name}", delete(remove))
}
