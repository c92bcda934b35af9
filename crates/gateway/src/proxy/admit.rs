//! The admission stage: the request's model must be served somewhere, then tenancy admits it
//! (key, rate limits, budgets: its lease), the agent controls hold it (its session's cap, a
//! fan-out's leader), and it waits for a slot in the admission queue. A refusal sets the
//! request's outcome and is the answer.

use crate::admission::{Claim, Permit};
use crate::ending::Ending;
use crate::error::ApiError;
use crate::parse::Inference;
use crate::state::Shared;
use crate::tenancy::{Held, KeyConfig};
use kvgate_core::resilience::Outcome;
use kvgate_core::Nanos;
use std::sync::Arc;
use std::time::Duration;

/// What an admitted request holds until its answer starts.
#[derive(Debug)]
pub(crate) struct Admitted {
    /// Its slot in the admission queue's concurrency.
    pub(crate) permit: Permit,
    /// Its session slot, and the leadership of its fan-out.
    pub(crate) held: Held,
    /// `x-ratelimit-*` for the response.
    pub(crate) ratelimit_headers: Box<[(&'static str, String)]>,
    /// Whether the client presented a key of the gateway's (never forwarded upstream).
    pub(crate) keyed: bool,
}

/// What tenancy granted a request: the response's `x-ratelimit-*`, and what the queue needs.
#[derive(Debug)]
pub(crate) struct Leased {
    /// `x-ratelimit-*` for the response.
    pub(crate) ratelimit_headers: Box<[(&'static str, String)]>,
    tenant: String,
    weight: f64,
    cost: f64,
    /// Whether the client presented a key of the gateway's.
    pub(crate) keyed: bool,
}

/// The part of admission that never waits, the endpoint picker's whole: the model must be
/// served somewhere and tenancy must grant a lease (key, rate limits, budgets), which goes to
/// `ending` to be settled when the request ends.
pub(crate) fn lease(
    shared: &Shared,
    key: Option<Arc<KeyConfig>>,
    inference: &mut Inference,
    arrived: Nanos,
    ending: &mut Ending,
) -> Result<Leased, ApiError> {
    if let Some(model) = &inference.request.model {
        if !shared.pool.serves(model) {
            ending.set(Outcome::ClientError);
            return Err(ApiError::unknown_model(model, &shared.pool.models()));
        }
        inference.request.adapter = shared.pool.adapter_named(model);
    }
    let mut lease = shared
        .tenancy
        .admit(key, &mut inference.request, arrived)
        .inspect_err(|_| ending.set(Outcome::Refused))?;
    let leased = Leased {
        ratelimit_headers: std::mem::take(&mut lease.ratelimit_headers),
        tenant: lease.tenant.clone(),
        weight: lease.weight,
        cost: lease.admission_cost(&shared.tenancy),
        keyed: lease.keyed,
    };
    ending.lease(lease);
    Ok(leased)
}

/// Admits `inference` of the client with `key`, arrived at `arrived`: its [`lease`], then the
/// agent controls' hold and the queue.
pub(crate) async fn admit(
    shared: &Shared,
    key: Option<Arc<KeyConfig>>,
    inference: &mut Inference,
    arrived: Nanos,
    ending: &mut Ending,
) -> Result<Admitted, ApiError> {
    if let Some(model) = inference.request.model.as_deref() {
        shared
            .lora
            .ensure(&shared.pool, model)
            .await
            .inspect_err(|e| {
                ending.set(match e.status.as_u16() {
                    404 => Outcome::ClientError,
                    502 => Outcome::UpstreamError,
                    _ => Outcome::NoEndpoint,
                })
            })?;
    }
    let Leased {
        ratelimit_headers,
        tenant,
        weight,
        cost,
        keyed,
    } = lease(shared, key, inference, arrived, ending)?;
    // Before the queue: a held call takes no slot while it waits.
    let queue_timeout = Duration::from_millis(shared.config.admission.queue_timeout_ms);
    let held = shared
        .tenancy
        .hold(inference, &tenant, queue_timeout)
        .await
        .inspect_err(|_| ending.set(Outcome::Refused))?;
    let claim = Claim {
        tenant: &tenant,
        weight,
        cost,
        priority: inference.request.priority,
    };
    // The deadline counts from arrival: time held for a session slot or a fan-out leader is
    // already spent.
    let left = inference
        .deadline
        .map(|d| d.saturating_sub(ending.arrived().elapsed()));
    let admitted = shared.admission.admit(claim, left).await;
    ending.facts().queued = Some(ending.arrived().elapsed());
    match admitted {
        Ok(permit) => {
            ending.admitted();
            Ok(Admitted {
                permit,
                held,
                ratelimit_headers,
                keyed,
            })
        }
        Err(e) => {
            ending.set(if e.status.as_u16() == 429 {
                Outcome::QueueFull
            } else {
                Outcome::Deadline
            });
            Err(e)
        }
    }
}
