//! The prefill side's held KV: what each finished prefill leg keeps for its decode engine,
//! until read or until its lease runs out (vLLM's NIXL connector frees a prefill's blocks when
//! the decode side has read them or after a timeout; newer versions lease them for 30 s).

use crate::error::ApiError;
use crate::state::Shared;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// A decode engine's read of held KV.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ReadRequest {
    pub(crate) key: String,
    /// [`digest`] of the decode leg's prompt: the KV must be of the same prompt.
    pub(crate) digest: u64,
    /// How long to wait for the prefill to finish (SGLang sends both legs at once).
    pub(crate) wait_ms: u64,
}

/// What a read returns: the prompt tokens whose KV it carries.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ReadAnswer {
    pub(crate) tokens: u32,
}

/// A hash of a prompt's tokens.
pub(crate) fn digest(prompt: &[u32]) -> u64 {
    let bytes: Vec<u8> = prompt.iter().flat_map(|t| t.to_le_bytes()).collect();
    xxhash_rust::xxh3::xxh3_64(&bytes)
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    tokens: u32,
    digest: u64,
    expires: Instant,
}

/// Why a read found nothing to take.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Miss {
    /// Nothing under the key (never held, read already, or expired) within the wait.
    Absent,
    /// Held for another prompt.
    OtherPrompt,
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Held {
    lease: Duration,
    entries: Mutex<HashMap<String, Entry>>,
    arrived: Notify,
}

impl Held {
    pub(crate) fn new(lease: Duration) -> Self {
        Held {
            lease,
            entries: Mutex::new(HashMap::new()),
            arrived: Notify::new(),
        }
    }

    /// Holds `prompt`'s KV under `key` from `now`; returns how many leases had expired.
    pub(crate) fn put(&self, key: String, prompt: &[u32], now: Instant) -> u64 {
        let entry = Entry {
            tokens: prompt.len() as u32,
            digest: digest(prompt),
            expires: now + self.lease,
        };
        let expired = {
            let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            let before = entries.len();
            entries.retain(|_, e| e.expires > now);
            let expired = (before - entries.len()) as u64;
            entries.insert(key, entry);
            expired
        };
        self.arrived.notify_waiters();
        expired
    }

    fn try_take(&self, key: &str, digest: u64, now: Instant) -> Option<Result<u32, Miss>> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let entry = *entries.get(key)?;
        if entry.expires <= now {
            return None;
        }
        if entry.digest != digest {
            return Some(Err(Miss::OtherPrompt));
        }
        entries.remove(key);
        Some(Ok(entry.tokens))
    }

    /// Takes the KV under `key`, waiting up to `wait` for it to be held.
    pub(crate) async fn take(&self, key: &str, digest: u64, wait: Duration) -> Result<u32, Miss> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.arrived.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(found) = self.try_take(key, digest, Instant::now()) {
                return found;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(Miss::Absent);
            }
        }
    }
}

/// `POST /kv_transfer/read`: a decode engine claims a prefill's KV.
pub(crate) async fn read(State(shared): State<Arc<Shared>>, body: axum::body::Bytes) -> Response {
    let Ok(ask) = serde_json::from_slice::<ReadRequest>(&body) else {
        return ApiError::bad_request("expected {key, digest, wait_ms}").into_response();
    };
    if shared.faults.fail_transfer() {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "KV transfer failed (injected fault).",
        )
        .into_response();
    }
    let wait = Duration::from_millis(ask.wait_ms.min(600_000));
    match shared.pd.held.take(&ask.key, ask.digest, wait).await {
        Ok(tokens) => Json(ReadAnswer { tokens }).into_response(),
        Err(Miss::Absent) => ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "no KV held under `{}` (never, read already, or expired)",
                ask.key
            ),
        )
        .into_response(),
        Err(Miss::OtherPrompt) => ApiError::new(
            StatusCode::CONFLICT,
            format!("the KV held under `{}` is of another prompt", ask.key),
        )
        .into_response(),
    }
}
