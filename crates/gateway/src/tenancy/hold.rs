//! The agent controls a request passes before the admission queue: its session's cap, then
//! fan-out serialisation (see [`super::fanout`]).

use super::fanout::{Leader, Role};
use super::sessions::SessionSlot;
use super::Tenancy;
use crate::error::ApiError;
use crate::metrics::reason;
use crate::parse::Inference;
use std::time::{Duration, Instant};

/// What a request holds while it runs: its session slot, and the leadership of its fan-out.
#[derive(Debug, Default)]
pub(crate) struct Held {
    /// The session slot, released when the request ends.
    pub(crate) _session: Option<SessionSlot>,
    /// Set when this call leads a fan-out: release it at the first token.
    pub(crate) leader: Option<Leader>,
}

impl Tenancy {
    /// Waits for a session slot (within `timeout`, the admission queue's; 429 when none
    /// frees), then, for a call sharing a new prefix with calls already on their way, for the
    /// first of them to reach its first token.
    pub(crate) async fn hold(
        &self,
        inference: &Inference,
        tenant: &str,
        timeout: Duration,
    ) -> Result<Held, ApiError> {
        let tenancy = self;
        let mut held = Held::default();
        if let (Some(caps), Some(session)) = (tenancy.sessions(), &inference.request.session) {
            let wait = inference.deadline.map_or(timeout, |d| d.min(timeout));
            held._session = Some(caps.acquire(session, wait).await.ok_or_else(|| {
                let mut e = ApiError::rate_limited(format!(
                    "session `{session}` has reached its limit of calls in flight and none ended in time"
                ));
                e.retry_after_secs = Some(1);
                e
            })?);
        }
        let request = &inference.request;
        let head = inference
            .shared_head
            .zip(request.prompt.text.as_deref())
            .and_then(|(len, text)| text.get(..len));
        let (Some(gate), Some(head)) = (tenancy.fanout(), head) else {
            return Ok(held);
        };
        if kvgate_core::request::estimate_tokens(head) < tenancy.fanout_min_tokens() {
            return Ok(held);
        }
        // Scoped like the prefix cache: per tenant and model, so no call waits for another tenant's.
        let mut key = xxhash_rust::xxh3::Xxh3::new();
        for part in [tenant, request.model.as_deref().unwrap_or(""), head] {
            key.update(part.as_bytes());
            key.update(&[0]);
        }
        let key = key.digest();
        let m = &tenancy.metrics;
        let role = match gate.enter(key) {
            Role::Lead(l) => match gate.contest(l).await {
                Role::Follow(rx) => {
                    m.fanout.get_or_create(&reason("stepped_down")).inc();
                    Role::Follow(rx)
                }
                other => other,
            },
            other => other,
        };
        match role {
            Role::Pass => {}
            Role::Lead(l) => {
                m.fanout.get_or_create(&reason("led")).inc();
                held.leader = Some(l);
            }
            Role::Follow(rx) => {
                let started = Instant::now();
                let released = gate.follow(rx).await;
                if let Some(jitter) = gate.release_jitter().filter(|_| released) {
                    tokio::time::sleep(jitter).await;
                }
                m.fanout_wait.observe(started.elapsed().as_secs_f64());
                let why = if released { "released" } else { "timeout" };
                m.fanout.get_or_create(&reason(why)).inc();
            }
        }
        Ok(held)
    }
}
