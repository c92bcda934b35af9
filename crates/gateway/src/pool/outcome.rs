//! What the pool learns from each attempt's outcome: first token, refusal, completion or
//! failure reach the router (and through it the policy), the breaker, the hedging delay, the
//! prefix cache and the endpoint's gauges, each under one acquisition of the pool's lock.

use super::Pool;
use crate::metrics;
use kvgate_core::decision::FailureKind;
use kvgate_core::index::blocks::KvEvent;
use kvgate_core::index::events::{BatchOutcome, StreamStatus};
use kvgate_core::index::{as_reported, Prediction, PrefixCache};
use kvgate_core::resilience::Ticket;
use kvgate_core::router::PREDICTION_SLACK_TOKENS;
use kvgate_core::{EndpointId, Nanos, Usage};
use std::time::Duration;

impl Pool {
    /// The first bytes of a 2xx answer to `request` arrived from `endpoint` after `ttft`.
    ///
    /// Only a stream's first bytes are a first token: a non-streaming answer's first bytes come
    /// when generation ends, so its `ttft` is the end-to-end time, and a policy learning from it
    /// (peak EWMA) would learn output lengths rather than endpoint speed. For those the policy
    /// hears only `Completed`/`Failed`, and the hedging delay gets no sample; both kinds count
    /// as a breaker success and as proof of life.
    pub fn first_token(
        &self,
        request: u64,
        endpoint: EndpointId,
        ticket: Ticket,
        ttft: Nanos,
        stream: bool,
    ) {
        let now = self.clock.now();
        let mut core = self.lock();
        // Answering traffic is proof of life (passive health checking).
        let mut changed = core.set_checks(endpoint, |e| e.healthy = true);
        if let Some(e) = core.endpoint(endpoint) {
            e.served_since_scrape = true;
            e.scrape_failures = 0;
            e.failure_streak = 0;
            e.breaker.record(ticket, true, now);
            changed |= e.sync_breaker();
        }
        if stream {
            core.hedge.record(ttft);
            core.router.first_token(request, endpoint, now, ttft);
        }
        if changed {
            self.publish(&core);
        }
        drop(core);
        self.share_about(endpoint, |base| crate::cluster::Local::FirstToken {
            id: request,
            endpoint: base,
            ttft,
            stream,
        });
        self.cache_mut().first_token(request, endpoint, now);
    }

    /// `endpoint` answered with a status other than 2xx, 5xx or 429 (those are attempt
    /// failures): the answer goes to the client as it is, but it is neither a first token nor
    /// proof of life. 401, 403, 404 and 408 say the endpoint cannot serve (a wrong key, a model
    /// or route it lacks, a request it gave up on) and count as breaker failures, as LiteLLM
    /// cools such deployments down; any other status (400, 413, 422) is the client's own fault
    /// and only frees a half-open probe slot.
    pub fn refused(&self, endpoint: EndpointId, ticket: Ticket, status: u16) {
        let now = self.clock.now();
        let mut core = self.lock();
        if let Some(e) = core.endpoint(endpoint) {
            if matches!(status, 401 | 403 | 404 | 408) {
                e.breaker.record(ticket, false, now);
            } else {
                e.breaker.release(ticket);
            }
            if e.sync_breaker() {
                self.publish(&core);
            }
        }
    }

    /// `request` finished normally on `endpoint`; `usage` is the engine's account of it, when
    /// the answer carried one, which scores and corrects the cache's `prediction`.
    pub fn completed(
        &self,
        request: u64,
        endpoint: EndpointId,
        latency: Nanos,
        output_tokens: u32,
        (usage, prediction): (Option<Usage>, Option<Prediction>),
    ) {
        let now = self.clock.now();
        self.share_about(endpoint, |base| crate::cluster::Local::Ended {
            id: request,
            endpoint: base,
            end: super::PeerEnd::Completed {
                latency,
                output_tokens,
                usage,
            },
        });
        {
            let mut core = self.lock();
            if let Some(usage) = usage {
                core.router.usage(request, endpoint, now, usage);
            }
            core.router
                .completed(request, endpoint, now, latency, output_tokens);
            core.sync_inflight(endpoint);
            if let Some(limits) = core.endpoint(endpoint).and_then(|e| e.limits.as_mut()) {
                limits.ended(request, now, usage.as_ref());
            }
        }
        let mut cache = self.cache_mut();
        cache.finished(request, endpoint);
        let (Some(usage), Some(p)) = (usage, prediction) else {
            return;
        };
        if let Some(result) = self.correct(&mut cache, endpoint, usage, &p) {
            self.metrics
                .cache_prediction
                .get_or_create(&metrics::ResultLabel { result })
                .inc();
        }
    }

    /// The cached tokens `prediction` says its endpoint will report for a prompt of
    /// `prompt_tokens`: the index's figure in whole blocks once the engine reports its block
    /// size, as engines count cache hits and as `predicted_ttft` prices them
    /// ([`as_reported`]). A prediction from a trusted KV-event stream counts to the token
    /// already. The access log and `kvgate_cache_prediction_total` both use this figure, so the
    /// log's `predicted_cached_tokens` compares with its `cached_tokens` directly.
    pub fn reported_cached(&self, prediction: &Prediction, prompt_tokens: u32) -> u32 {
        reported(
            prediction,
            prompt_tokens,
            self.block_size(prediction.endpoint),
        )
    }

    /// Tokens per KV block `endpoint` last reported (vLLM's `cache_config_info`).
    fn block_size(&self, endpoint: EndpointId) -> Option<u32> {
        self.snapshot
            .load()
            .get(endpoint)
            .and_then(|e| e.observation?.block_size)
    }

    /// Corrects the cache from `usage` when it reports cached tokens, and says how
    /// `prediction` compared: `exact` (a prediction from a complete event stream to the token,
    /// others to a block), `over` or `under`.
    pub(super) fn correct(
        &self,
        cache: &mut PrefixCache,
        endpoint: EndpointId,
        usage: Usage,
        prediction: &Prediction,
    ) -> Option<&'static str> {
        let cached = usage.cached_tokens?;
        let reported_block = self.block_size(endpoint);
        let block = reported_block.unwrap_or(PREDICTION_SLACK_TOKENS);
        cache.correct(prediction, (usage.prompt_tokens, cached), block);
        let predicted = reported(prediction, usage.prompt_tokens, reported_block);
        let slack = if prediction.is_exact() { 0 } else { block };
        Some(if predicted.abs_diff(cached) <= slack {
            "exact"
        } else if predicted > cached {
            "over"
        } else {
            "under"
        })
    }

    /// Batch `seq` of `endpoint`'s KV events arrived; returns what it did to the stream and
    /// the stream's state after it.
    pub fn kv_batch(
        &self,
        endpoint: EndpointId,
        seq: u64,
        events: &[KvEvent],
    ) -> Option<(BatchOutcome, StreamStatus)> {
        let now = self.clock.now();
        let mut cache = self.cache_mut();
        let outcome = cache.kv_batch(endpoint, seq, events, now)?;
        Some((outcome, cache.engine_status(endpoint)?))
    }

    /// `request` failed on `endpoint`. Connection errors, 5xx and timeouts count against the
    /// breaker; a Retry-After keeps the endpoint out of routing for its duration.
    pub fn failed(
        &self,
        request: u64,
        endpoint: EndpointId,
        ticket: Ticket,
        kind: FailureKind,
        retry_after: Option<Duration>,
    ) {
        let now = self.clock.now();
        self.share_about(endpoint, |base| crate::cluster::Local::Ended {
            id: request,
            endpoint: base,
            end: super::PeerEnd::Failed(kind),
        });
        self.cache_mut().finished(request, endpoint);
        let mut core = self.lock();
        core.router.failed(request, endpoint, now, kind);
        core.sync_inflight(endpoint);
        let Some(e) = core.endpoint(endpoint) else {
            return;
        };
        if let Some(limits) = &mut e.limits {
            limits.ended(request, now, None);
        }
        let mut changed = false;
        if let Some(wait) = retry_after {
            let until = now + Nanos(u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX));
            changed |= until > e.info.avoid_until;
            e.info.avoid_until = e.info.avoid_until.max(until);
        }
        if kind == FailureKind::Overloaded {
            // A 429 is no fault of health (the breaker does not count it) but says "not now":
            // the endpoint cools down at once, so a lower tier or a peer takes the next request
            // (LiteLLM cools a deployment down on its first 429).
            e.breaker.release(ticket);
            e.cool_down(now);
            changed = true;
        } else if kind == FailureKind::Cancelled {
            e.breaker.release(ticket);
        } else {
            e.breaker.record(ticket, false, now);
            e.cool_down(now);
            changed = true;
        }
        changed |= e.sync_breaker();
        if changed {
            self.publish(&core);
        }
    }
}

/// [`Pool::reported_cached`] with the endpoint's block size, when it reported one.
fn reported(prediction: &Prediction, prompt_tokens: u32, block: Option<u32>) -> u32 {
    let predicted = prediction.cached_tokens(prompt_tokens);
    if prediction.is_exact() || prompt_tokens == 0 {
        return predicted;
    }
    as_reported(f64::from(predicted), f64::from(prompt_tokens), block) as u32
}
