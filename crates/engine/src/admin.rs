//! The admin API: change faults at runtime.
//!
//! - `GET /admin/faults` -> `{"faults": ["429:retry_after=2", ...]}`
//! - `POST /admin/faults` with `{"faults": [SPEC, ...]}` replaces the active set (an empty list
//!   clears it) and answers with the new set; a bad spec is a 400 and changes nothing.
//! - `DELETE /admin/faults` clears every fault.
//!
//! With `--admin-token T` every call needs `Authorization: Bearer T` (401 otherwise); without a
//! token only clients connecting from a loopback address may call it (403 otherwise).

use crate::error::ApiError;
use crate::faults::Fault;
use crate::server::Connection;
use crate::state::Shared;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use std::sync::Arc;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FaultsBody {
    faults: Vec<String>,
}

fn authorize(shared: &Shared, conn: &Connection, headers: &HeaderMap) -> Result<(), ApiError> {
    match &shared.config.admin_token {
        Some(token) => {
            let given = headers
                .get(axum::http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "));
            if given == Some(token.as_str()) {
                Ok(())
            } else {
                Err(ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "admin API needs `Authorization: Bearer <token>`",
                ))
            }
        }
        None if conn.peer.ip().is_loopback() => Ok(()),
        None => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "admin API is loopback-only unless the engine runs with --admin-token",
        )),
    }
}

fn listing(shared: &Shared) -> Response {
    let faults: Vec<String> = shared.faults.list().iter().map(Fault::to_string).collect();
    Json(serde_json::json!({ "faults": faults })).into_response()
}

pub(crate) async fn get_faults(
    State(shared): State<Arc<Shared>>,
    Extension(conn): Extension<Connection>,
    headers: HeaderMap,
) -> Response {
    match authorize(&shared, &conn, &headers) {
        Ok(()) => listing(&shared),
        Err(e) => e.into_response(),
    }
}

pub(crate) async fn set_faults(
    State(shared): State<Arc<Shared>>,
    Extension(conn): Extension<Connection>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if let Err(e) = authorize(&shared, &conn, &headers) {
        return e.into_response();
    }
    let parsed: FaultsBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => {
            return ApiError::bad_request(format!("expected {{\"faults\": [SPEC, ...]}}: {e}"))
                .into_response()
        }
    };
    let faults: Result<Vec<Fault>, _> = parsed.faults.iter().map(|s| s.parse::<Fault>()).collect();
    match faults {
        Ok(faults) => {
            shared.faults.set(faults);
            listing(&shared)
        }
        Err(e) => ApiError::bad_param("faults", e.to_string()).into_response(),
    }
}

pub(crate) async fn clear_faults(
    State(shared): State<Arc<Shared>>,
    Extension(conn): Extension<Connection>,
    headers: HeaderMap,
) -> Response {
    if let Err(e) = authorize(&shared, &conn, &headers) {
        return e.into_response();
    }
    shared.faults.set(Vec::new());
    listing(&shared)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EngineConfig;
    use crate::faults::FaultState;
    use crate::metrics::MetricsState;
    use std::sync::Mutex;

    fn shared(admin_token: Option<&str>) -> Shared {
        let config = EngineConfig {
            admin_token: admin_token.map(str::to_owned),
            ..EngineConfig::default()
        };
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let metrics = Arc::new(Mutex::new(MetricsState::default()));
        Shared::new(
            config,
            tx,
            metrics,
            Arc::new(FaultState::new(Vec::new(), 0)),
            (0.0, ([127, 0, 0, 1], 0).into()),
        )
    }

    #[test]
    fn without_a_token_only_loopback_peers_are_admitted() {
        let shared = shared(None);
        let headers = HeaderMap::new();
        let local = Connection::for_test("127.0.0.1:5000".parse().unwrap());
        let local6 = Connection::for_test("[::1]:5000".parse().unwrap());
        let remote = Connection::for_test("10.1.2.3:5000".parse().unwrap());
        assert!(authorize(&shared, &local, &headers).is_ok());
        assert!(authorize(&shared, &local6, &headers).is_ok());
        let err = authorize(&shared, &remote, &headers).unwrap_err();
        assert_eq!(err.status, StatusCode::FORBIDDEN);
    }

    #[test]
    fn with_a_token_every_peer_needs_it() {
        let shared = shared(Some("t0k"));
        let local = Connection::for_test("127.0.0.1:5000".parse().unwrap());
        let remote = Connection::for_test("10.1.2.3:5000".parse().unwrap());
        let mut headers = HeaderMap::new();
        assert_eq!(
            authorize(&shared, &local, &headers).unwrap_err().status,
            StatusCode::UNAUTHORIZED
        );
        headers.insert(
            axum::http::header::AUTHORIZATION,
            "Bearer t0k".parse().unwrap(),
        );
        assert!(authorize(&shared, &remote, &headers).is_ok());
    }
}
