//! kvgate's own rule: send each request where its first token is predicted to come soonest.
//!
//! For every eligible endpoint:
//!
//! ```text
//! cached   = what the prefix index believes it holds of this prompt (in-flight dispatches
//!            included: a fan-out's siblings see the first call's prefix as soon-cached)
//! own      = prompt tokens - cached
//! queued   = uncached prefill work this router sent there that has not produced a first token,
//!            drained at the endpoint's learned rate since it was sent
//! ttft     = fixed + (queued + own) * (per_token + interference * decodes)
//! ```
//! and the minimum wins (ties at random). `fixed`, `per_token` and `interference` are learned
//! per endpoint from every first token and the engine's usage ([`calibration`]), starting from
//! the fleet's pooled fit. There is no balance threshold: a hot prefix spreads to a second
//! replica exactly when recomputing it there is predicted faster than queueing at home, and a
//! slower replica gets work only while its shorter queue makes up for its speed.
//!
//! The index it consults mirrors each engine's cache (`mirror_engines`): bounded by the KV
//! capacity the engine reports, and corrected when usage shows a predicted hit missed. Prompt
//! token estimates (four bytes per token from text) are scaled by the ratio the engine's usage
//! reports. Load signals go through [`LoadView`]: blackout and slow start apply as to every
//! load-reading policy (a slow-starting endpoint's prediction is divided by its factor).

pub mod calibration;

use super::{check, no_route, Params, Policy, PolicyDoc, Query};
use crate::index::{IndexSpec, TreeKey};
use crate::{Decision, EndpointId, Event, LoadConfig, LoadView, Nanos, Reason, Route};
use calibration::{Calibration, Coefficients};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

const DOC: PolicyDoc = PolicyDoc {
    name: "predicted_ttft",
    summary:
        "earliest predicted first token: queued + uncached prefill at a learned per-replica speed",
    params: &[
        (
            "prior_prefill_tokens_per_second",
            "prefill speed assumed before any sample",
        ),
        (
            "prior_fixed_ms",
            "fixed time to first token assumed before any sample",
        ),
        ("calibration_secs", "time constant over which samples fade"),
        (
            "prior_strength",
            "pseudo-samples pulling each endpoint towards the fleet's fit",
        ),
        (
            "key",
            "text, tokens or auto (tokens when the request has them)",
        ),
        (
            "max_tree_size",
            "index bound per endpoint until the engine reports its KV capacity",
        ),
        (
            "mirror_engines",
            "bound the index by engine KV capacity and correct it from usage",
        ),
        ("share_across_tenants", "let tenants share cache affinity"),
        ("load", "stale-signal handling"),
    ],
};

/// `predicted_ttft` parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Prefill speed assumed before any sample (an ~8B model on one H100 does about 8,000).
    pub prior_prefill_tokens_per_second: f64,
    /// Fixed time to first token assumed before any sample.
    pub prior_fixed_ms: f64,
    /// Time constant over which calibration samples fade.
    pub calibration_secs: f64,
    /// Pseudo-samples pulling each endpoint's fit towards the fleet's.
    pub prior_strength: f64,
    /// Text or token keys for the index.
    pub key: TreeKey,
    /// Index bound per endpoint (symbols) until the engine reports its KV capacity.
    pub max_tree_size: usize,
    /// Bound the index by each engine's KV capacity and correct it from usage.
    pub mirror_engines: bool,
    /// Let tenants share cache affinity.
    pub share_across_tenants: bool,
    /// Stale-signal handling.
    pub load: LoadConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            prior_prefill_tokens_per_second: 8_000.0,
            prior_fixed_ms: 20.0,
            calibration_secs: 60.0,
            prior_strength: 4.0,
            key: TreeKey::Auto,
            max_tree_size: 67_108_864,
            mirror_engines: true,
            share_across_tenants: false,
            load: LoadConfig::default(),
        }
    }
}

impl Params for Config {
    const DOC: PolicyDoc = DOC;
    fn build(&self) -> Box<dyn Policy> {
        Box::new(PredictedTtft::new(self.clone()))
    }
    fn load(&self) -> Option<&LoadConfig> {
        Some(&self.load)
    }
    fn validate(&self) -> Result<(), (&'static str, &'static str)> {
        check(
            self.prior_prefill_tokens_per_second > 0.0,
            "prior_prefill_tokens_per_second",
            "must be positive",
        )?;
        check(
            self.prior_fixed_ms >= 0.0,
            "prior_fixed_ms",
            "must not be negative",
        )?;
        check(
            self.calibration_secs > 0.0,
            "calibration_secs",
            "must be positive",
        )?;
        check(
            self.prior_strength > 0.0,
            "prior_strength",
            "must be positive",
        )?;
        check(
            self.max_tree_size >= 1,
            "max_tree_size",
            "must be at least 1",
        )
    }
    fn index(&self) -> Option<IndexSpec> {
        Some(IndexSpec::Radix {
            key: self.key,
            max_size: self.max_tree_size,
            eviction_interval: Nanos::from_secs(60),
            share_across_tenants: self.share_across_tenants,
            mirror_engines: self.mirror_engines,
        })
    }
}

/// One dispatch awaiting its first token and usage.
#[derive(Clone, Copy, Debug)]
struct Pending {
    /// Prefill tokens queued ahead of it when it was sent.
    ahead: f64,
    /// Its own predicted uncached tokens.
    own: f64,
    /// Decoding sequences beside it when it was sent.
    decodes: f64,
    /// Its estimated prompt tokens before scaling.
    estimate: u32,
    /// Time to first token, once it came.
    ttft: Option<Nanos>,
    /// Whether the calibration has seen it.
    calibrated: bool,
}

/// What this router has queued at one endpoint.
#[derive(Clone, Copy, Debug, Default)]
struct Queue {
    /// Predicted uncached tokens of dispatches without a first token.
    pending: f64,
    /// Dispatches without a first token.
    waiting: u32,
    /// Dispatches past their first token, not finished.
    decoding: u32,
    /// The fluid estimate of what is still to prefill, at most `pending`.
    backlog: f64,
    as_of: Nanos,
    /// Decoding sequences as the last prediction counted them (own, or scraped when more).
    decodes: f64,
}

impl Queue {
    /// Drains the backlog at `seconds_per_token` up to `now`.
    fn advance(&mut self, now: Nanos, seconds_per_token: f64) {
        let dt = now.saturating_since(self.as_of).as_secs_f64();
        self.as_of = self.as_of.max(now);
        self.backlog =
            (self.backlog - dt / seconds_per_token.max(1e-12)).clamp(0.0, self.pending.max(0.0));
    }
}

/// The predicted-TTFT policy. See the module documentation.
#[derive(Debug)]
pub struct PredictedTtft {
    config: Config,
    calibration: Calibration,
    queues: HashMap<EndpointId, Queue>,
    pending: HashMap<(u64, EndpointId), Pending>,
    /// Engine prompt tokens per estimated token, learned from usage.
    token_ratio: f64,
    scores: Vec<f64>,
}

impl PredictedTtft {
    /// A new instance.
    pub fn new(config: Config) -> Self {
        let prior = Coefficients {
            fixed: config.prior_fixed_ms / 1e3,
            per_token: 1.0 / config.prior_prefill_tokens_per_second,
            interference: 0.0,
        };
        PredictedTtft {
            calibration: Calibration::new(
                prior,
                Nanos::from_secs_f64(config.calibration_secs),
                config.prior_strength,
            ),
            config,
            queues: HashMap::new(),
            pending: HashMap::new(),
            token_ratio: 1.0,
            scores: Vec::new(),
        }
    }

    fn prompt_tokens(&self, estimate: u32) -> f64 {
        (f64::from(estimate) * self.token_ratio).max(1.0)
    }

    /// The prediction for one endpoint: (ttft seconds, own uncached tokens, backlog, decodes).
    fn predict(
        &mut self,
        endpoint: EndpointId,
        cached: f64,
        prompt: f64,
        observed_running: Option<u32>,
        now: Nanos,
    ) -> (f64, f64, f64, f64) {
        let c = self.calibration.coefficients(endpoint.0, now);
        let q = self.queues.entry(endpoint).or_default();
        let decodes = match observed_running {
            Some(running) => f64::from(q.decoding.max(running)),
            None => q.decodes.max(f64::from(q.decoding)),
        };
        q.decodes = decodes;
        q.advance(now, c.per_token + c.interference * decodes);
        let own = (prompt - cached).max(1.0);
        (c.predict(q.backlog + own, decodes), own, q.backlog, decodes)
    }

    /// Teaches the calibration one first token, once: with the engine's cached tokens when
    /// usage reported them, else with the predicted ones.
    fn settle(&mut self, request: u64, endpoint: EndpointId, at: Nanos, cached: Option<u32>) {
        let Some(p) = self.pending.get(&(request, endpoint)).copied() else {
            return;
        };
        let (Some(ttft), false) = (p.ttft, p.calibrated) else {
            return;
        };
        let own = cached.map_or(p.own, |c| {
            (self.prompt_tokens(p.estimate) - f64::from(c)).max(1.0)
        });
        self.calibration
            .observe(endpoint.0, at, p.ahead + own, p.decodes, ttft.as_secs_f64());
        if let Some(p) = self.pending.get_mut(&(request, endpoint)) {
            p.calibrated = true;
        }
    }

    /// The dispatch without a first token ended: its work leaves the queue.
    fn unqueue(&mut self, endpoint: EndpointId, own: f64) {
        if let Some(q) = self.queues.get_mut(&endpoint) {
            q.pending = (q.pending - own).max(0.0);
            q.waiting = q.waiting.saturating_sub(1);
            q.backlog = q.backlog.min(q.pending);
        }
    }

    fn finish(&mut self, request: u64, endpoint: EndpointId) {
        if let Some(p) = self.pending.remove(&(request, endpoint)) {
            if p.ttft.is_none() {
                self.unqueue(endpoint, p.own);
            } else if let Some(q) = self.queues.get_mut(&endpoint) {
                q.decoding = q.decoding.saturating_sub(1);
            }
        }
    }
}

impl Policy for PredictedTtft {
    fn name(&self) -> &'static str {
        DOC.name
    }

    fn select(&mut self, query: &Query<'_>, rng: &mut dyn RngCore) -> Decision {
        let (fleet, now) = (query.fleet, query.now);
        let load = self.config.load.clone();
        let view = LoadView::new(fleet, &load, now);
        let prompt = self.prompt_tokens(query.request.prompt_tokens);
        self.scores.clear();
        self.scores.resize(fleet.len(), f64::INFINITY);
        for i in view.routable().collect::<Vec<_>>() {
            let e = &fleet.views()[i];
            let cached = f64::from(query.overlaps.cached_tokens(e.id, prompt as u32));
            let running = view
                .is_fresh(i)
                .then(|| e.observation.map_or(0, |o| o.running));
            let (ttft, ..) = self.predict(e.id, cached, prompt, running, now);
            self.scores[i] = ttft / view.slow_start_factor(i);
        }
        let scores = std::mem::take(&mut self.scores);
        let picked = view.argmin_by(rng, |i| scores[i]);
        self.scores = scores;
        match picked {
            Some((i, ttft)) => {
                let id = fleet.views()[i].id;
                Decision::Route(Route {
                    endpoint: id,
                    reason: Reason::PredictedTtft {
                        ttft_ms: ttft * 1e3,
                        cached_tokens: query.overlaps.cached_tokens(id, prompt as u32),
                    },
                })
            }
            None => no_route(fleet),
        }
    }

    fn observe(&mut self, event: &Event<'_>) {
        match *event {
            Event::Dispatched {
                request,
                endpoint,
                at,
                overlaps,
            } => {
                let prompt = self.prompt_tokens(request.prompt_tokens);
                let cached = f64::from(overlaps.cached_tokens(endpoint, prompt as u32));
                let (_, own, ahead, decodes) = self.predict(endpoint, cached, prompt, None, at);
                self.finish(request.id, endpoint);
                let q = self.queues.entry(endpoint).or_default();
                q.pending += own;
                q.backlog += own;
                q.waiting += 1;
                self.pending.insert(
                    (request.id, endpoint),
                    Pending {
                        ahead,
                        own,
                        decodes,
                        estimate: request.prompt_tokens,
                        ttft: None,
                        calibrated: false,
                    },
                );
            }
            Event::FirstToken {
                request,
                endpoint,
                ttft,
                ..
            } => {
                let Some(p) = self.pending.get_mut(&(request, endpoint)) else {
                    return;
                };
                if p.ttft.is_some() {
                    return;
                }
                p.ttft = Some(ttft);
                let own = p.own;
                self.unqueue(endpoint, own);
                self.queues.entry(endpoint).or_default().decoding += 1;
            }
            Event::Usage {
                request,
                endpoint,
                at,
                usage,
            } => {
                if let Some(p) = self.pending.get(&(request, endpoint)) {
                    if p.estimate > 0 && usage.prompt_tokens > 0 {
                        let ratio = f64::from(usage.prompt_tokens) / f64::from(p.estimate);
                        self.token_ratio += (ratio - self.token_ratio) * 0.05;
                    }
                }
                self.settle(request, endpoint, at, usage.cached_tokens);
            }
            Event::Completed {
                request,
                endpoint,
                at,
                ..
            } => {
                self.settle(request, endpoint, at, None);
                self.finish(request, endpoint);
            }
            Event::Failed {
                request, endpoint, ..
            } => self.finish(request, endpoint),
            Event::EndpointRemoved { endpoint } => {
                self.queues.remove(&endpoint);
                self.calibration.remove(endpoint.0);
                self.pending.retain(|&(_, e), _| e != endpoint);
            }
            Event::Kv { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests;
