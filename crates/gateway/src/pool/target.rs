//! What a pick hands the request path: the endpoint and everything an attempt there needs,
//! built from the dispatch core's [`Picked`] with the record of why it went there.

use super::Core;
use crate::metrics::{self, PickLabels};
use crate::observe::decisions::{DecisionRecord, GateNote, PickScene};
use axum::http::HeaderValue;
use kvgate_core::dispatch::Picked;
use kvgate_core::index::Overlaps;
use kvgate_core::index::Prediction;
use kvgate_core::resilience::Ticket;
use kvgate_core::EndpointId;
use kvgate_core::{Reason, Rejection, Request};
use std::sync::Arc;
use std::time::Duration;

/// Where the policy sent an attempt.
#[derive(Clone, Debug)]
pub struct Target {
    /// The endpoint.
    pub id: EndpointId,
    /// Its display name.
    pub name: Arc<str>,
    /// Its base URL.
    pub base: Arc<str>,
    /// Its iteration clock, which the attempt's stream ticks.
    pub cadence: Arc<super::CadenceCell>,
    /// [`kvgate_core::Reason::label`] of the pick.
    pub reason: &'static str,
    /// Why it went there, with the candidates as the pick saw them.
    pub decision: Arc<DecisionRecord>,
    /// The endpoint's own `Authorization` value, if it has an API key.
    pub authorization: Option<HeaderValue>,
    /// The breaker's permission for this dispatch (a half-open probe or not), handed back
    /// with its outcome.
    pub ticket: Ticket,
    /// For a request's first attempt: how long to wait before hedging, if hedging is on.
    pub hedge_after: Option<Duration>,
    /// What the prefix cache predicted this endpoint held of the request.
    pub prediction: Option<Prediction>,
    /// The policy's predicted time to first token, seconds, when it predicts one.
    pub predicted_ttft: Option<f64>,
    /// Headers configured for this endpoint, sent with the attempt.
    pub headers: Arc<axum::http::HeaderMap>,
    /// The model name to send in place of the request's (the request named an alias).
    pub send_model: Option<Arc<str>>,
    /// The endpoint's priority tier.
    pub tier: u32,
    /// Why a higher tier was passed over although it could take the request (`ttft`,
    /// `queue`, `session`); `None` when it could not.
    pub spilled: Option<&'static str>,
    /// The endpoint's own token price, if configured.
    pub price: Option<kvgate_core::tenancy::Price>,
    /// Send the session as `prompt_cache_key` (the endpoint asks for it).
    pub prompt_cache_key: bool,
}

pub use kvgate_core::dispatch::Attempt;

impl super::Pool {
    /// What an attempt needs of its pick, with the record of why it went there.
    pub(super) fn target(
        &self,
        core: &Core,
        request: &Request,
        attempt: Attempt,
        overlaps: &Overlaps,
        picked: &Picked,
    ) -> Result<Target, Rejection> {
        let route = &picked.route;
        let router = core.dispatch.router();
        let scene = PickScene {
            request,
            attempt: attempt.label(),
            policy: router.policy_name(),
            views: router.views(),
            overlaps,
            scores: router.last_scores(),
        };
        let mut record = DecisionRecord::new(
            &scene,
            (route.endpoint, &route.reason),
            |v| picked.eligible.binary_search(&v.id).is_ok(),
            |id| {
                core.endpoint(id)
                    .map_or_else(|| Arc::from("?"), |e| e.about.name.clone())
            },
        );
        record.lora_hold = picked.held.as_ref().map(|(pass, hold)| GateNote {
            endpoint: core
                .endpoint(hold.endpoint)
                .map_or_else(|| Arc::from("?"), |e| e.about.name.clone()),
            behind: hold.behind.clone(),
            held_ms: (self.clock.now() - hold.since).as_millis_f64(),
            released: pass.label(),
        });
        let record = Arc::new(record);
        let e = core
            .endpoint(route.endpoint)
            .ok_or(Rejection::NoRoutableEndpoint)?;
        let about = &e.about;
        Ok(Target {
            ticket: picked.ticket,
            id: route.endpoint,
            name: about.name.clone(),
            base: about.base.clone(),
            cadence: e.cadence.clone(),
            reason: route.reason.label(),
            decision: record,
            authorization: about.authorization.clone(),
            hedge_after: picked.hedge_after.map(|n| Duration::from_nanos(n.0)),
            prediction: None,
            predicted_ttft: match route.reason {
                Reason::PredictedTtft { ttft_ms, .. } => Some(ttft_ms / 1e3),
                _ => None,
            },
            headers: about.headers.clone(),
            send_model: about.rename(request.model.as_deref()),
            tier: picked.tier,
            spilled: picked.spilled,
            price: about.config.price,
            prompt_cache_key: about.config.prompt_cache_key,
        })
    }

    /// Counts a pick by policy and reason, and a spill by its reason.
    pub(super) fn count_pick(&self, policy: &'static str, target: &Target) {
        self.metrics
            .picks
            .get_or_create(&PickLabels {
                policy,
                reason: target.reason,
            })
            .inc();
        if target.tier > 0 {
            let reason = target.spilled.unwrap_or("unavailable");
            self.metrics
                .spillover
                .get_or_create(&metrics::ReasonLabel { reason })
                .inc();
        }
    }
}
