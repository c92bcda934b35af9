//! What the pool learns from each attempt's outcome: first token, refusal, completion or
//! failure reach the dispatch core (and through it the policy, the breaker, the hedging delay
//! and the deployment limits) under one acquisition of the pool's lock, then the prefix cache
//! and, in a cluster, the peers.

use super::{Pool, Progress};
use crate::metrics;
use kvgate_core::decision::FailureKind;
use kvgate_core::dispatch::{self, End};
use kvgate_core::index::blocks::KvEvent;
use kvgate_core::index::events::{BatchOutcome, StreamStatus};
use kvgate_core::index::{Prediction, PrefixCache};
use kvgate_core::resilience::Ticket;
use kvgate_core::{EndpointId, Nanos, Usage};
use std::time::Duration;

impl Pool {
    /// The first bytes of a 2xx answer to `request` arrived from `endpoint` after `ttft`
    /// (a first token when `stream`; see [`dispatch::DispatchCore::first_token`]).
    pub fn first_token(
        &self,
        request: u64,
        endpoint: EndpointId,
        ticket: Ticket,
        ttft: Nanos,
        stream: bool,
    ) {
        let now = self.clock.now();
        {
            let mut core = self.lock();
            let changed =
                core.dispatch
                    .first_token((request, endpoint), ticket, (ttft, stream), now);
            self.wake_released(&mut core);
            self.publish_if(&core, changed);
        }
        self.share_about(endpoint, |base| Progress::FirstToken {
            id: request,
            endpoint: base,
            ttft,
            stream,
        });
        self.cache_mut().first_token(request, endpoint, now);
    }

    /// `endpoint` answered with a status other than 2xx, 5xx or 429 (see
    /// [`dispatch::DispatchCore::refused`]).
    pub fn refused(&self, endpoint: EndpointId, ticket: Ticket, status: u16) {
        let now = self.clock.now();
        let mut core = self.lock();
        let changed = core.dispatch.refused(endpoint, ticket, status, now);
        self.publish_if(&core, changed);
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
        let end = End::Completed {
            latency,
            output_tokens,
            usage,
        };
        self.share_about(endpoint, |base| Progress::Ended {
            id: request,
            endpoint: base,
            end,
        });
        {
            let mut core = self.lock();
            core.dispatch.ended((request, endpoint), end, now);
            core.sync_inflight(endpoint);
            self.wake_released(&mut core);
        }
        let mut cache = self.cache_mut();
        cache.finished(request, endpoint);
        let (Some(usage), Some(p)) = (usage, prediction) else {
            return;
        };
        if let Some(result) = self.correct(&mut cache, endpoint, usage, &p) {
            self.metrics
                .cache_prediction
                .get_or_create(&metrics::ResultLabel {
                    result: result.label(),
                })
                .inc();
        }
    }

    /// The cached tokens `prediction` says its endpoint will report for a prompt of
    /// `prompt_tokens` ([`dispatch::reported_cached`] with the block size the endpoint
    /// reported). The access log and `kvgate_cache_prediction_total` both use this figure, so
    /// the log's `predicted_cached_tokens` compares with its `cached_tokens` directly.
    pub fn reported_cached(&self, prediction: &Prediction, prompt_tokens: u32) -> u32 {
        dispatch::reported_cached(
            prediction,
            prompt_tokens,
            self.block_size(prediction.endpoint),
        )
    }

    /// Tokens per KV block `endpoint` last reported (vLLM's `cache_config_info`).
    fn block_size(&self, endpoint: EndpointId) -> Option<u32> {
        self.snapshot.load().get(endpoint)?.block_size()
    }

    /// [`dispatch::correct`] with the block size `endpoint` reported.
    pub(super) fn correct(
        &self,
        cache: &mut PrefixCache,
        endpoint: EndpointId,
        usage: Usage,
        prediction: &Prediction,
    ) -> Option<dispatch::PredictionResult> {
        dispatch::correct(cache, usage, prediction, self.block_size(endpoint))
    }

    /// Batch `seq` of `endpoint`'s KV events arrived: into the prefix cache, then the policy.
    /// Returns what it did to the stream and the stream's state after it.
    pub fn kv_batch(
        &self,
        endpoint: EndpointId,
        seq: u64,
        events: &[KvEvent],
    ) -> Option<(BatchOutcome, StreamStatus)> {
        let now = self.clock.now();
        let result = {
            let mut cache = self.cache_mut();
            let outcome = dispatch::record_kv_batch(&mut cache, endpoint, seq, events, now);
            outcome.zip(cache.engine_status(endpoint))
        };
        self.lock().dispatch.kv_events(endpoint, events, now);
        result
    }

    /// `request` failed on `endpoint` (see [`dispatch::DispatchCore::failed`]).
    pub fn failed(
        &self,
        request: u64,
        endpoint: EndpointId,
        ticket: Ticket,
        kind: FailureKind,
        retry_after: Option<Duration>,
    ) {
        let now = self.clock.now();
        self.share_about(endpoint, |base| Progress::Ended {
            id: request,
            endpoint: base,
            end: End::Failed(kind),
        });
        self.cache_mut().finished(request, endpoint);
        let retry_after =
            retry_after.map(|w| Nanos(u64::try_from(w.as_nanos()).unwrap_or(u64::MAX)));
        let mut core = self.lock();
        let changed = core
            .dispatch
            .failed((request, endpoint), ticket, (kind, retry_after), now);
        core.sync_inflight(endpoint);
        self.wake_released(&mut core);
        self.publish_if(&core, changed);
    }
}
