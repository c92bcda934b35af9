//! How each router event moves an endpoint's queue, its pending dispatches and the calibration.

use super::prediction::{Observed, Pending, Prediction};
use super::sessions::Sessions;
use super::PredictedTtft;
use crate::index::{Overlap, Overlaps};
use crate::{EndpointId, Nanos, Request, Usage};

impl PredictedTtft {
    /// The request went to `endpoint`: its predicted prefill joins that endpoint's queue, and
    /// its prediction waits for the first token to calibrate against.
    pub(super) fn dispatched(
        &mut self,
        request: &Request,
        endpoint: EndpointId,
        at: Nanos,
        overlaps: &Overlaps,
    ) {
        let prompt = self.prompt_tokens(request.prompt_tokens);
        let Prediction {
            own,
            ahead,
            decodes,
            remaining,
            ..
        } = {
            // A peer's dispatch was not picked here: its phase is unknown.
            let phase = self
                .chosen
                .filter(|&(r, e, _)| r == request.id && e == endpoint)
                .map_or(0.0, |(_, _, phase)| phase);
            self.predict(endpoint, overlaps, prompt, Observed::default(), phase, at)
        };
        self.finish(request.id, endpoint, at);
        // Both rules read a session's home.
        let homes = self.config.replicate_shared_prefixes || self.config.second_copies;
        let key = Sessions::key(request).filter(|_| homes);
        if let Some(key) = key {
            self.sessions.record(key, endpoint, at, || {
                let tokens = |o: &Overlap| f64::from(overlaps.tokens(o.total(), prompt as u32));
                overlaps.endpoints.iter().map(tokens).fold(0.0, f64::max)
            });
        }
        let q = self.queues.entry(endpoint).or_default();
        q.pending += own;
        q.backlog = ahead + own;
        q.backlog_at = q.backlog_at.max(at);
        let sent_before = q.sent;
        q.sent += own;
        q.waiting += 1;
        q.busy.set(true, at);
        self.pending.insert(
            (request.id, endpoint),
            Pending {
                ahead,
                own,
                decodes,
                sent_before,
                estimate: request.prompt_tokens,
                remaining,
                ttft: None,
                calibrated: false,
            },
        );
    }

    /// The request's first token came after `ttft`: it and everything sent there before it
    /// has been prefilled, and it starts decoding.
    pub(super) fn first_token(
        &mut self,
        request: u64,
        endpoint: EndpointId,
        ttft: Nanos,
        at: Nanos,
    ) {
        let Some(p) = self.pending.get_mut(&(request, endpoint)) else {
            return;
        };
        if p.ttft.is_some() {
            return;
        }
        p.ttft = Some(ttft);
        let (own, sent_before) = (p.own, p.sent_before);
        let c = self.calibration.coefficients(endpoint.0, at);
        if let Some(q) = self.queues.get_mut(&endpoint) {
            // First come, first served: what was sent before it is computed too.
            let after = q.sent - sent_before - own;
            q.backlog = q
                .ahead(at, c.seconds_per_token(q.decodes))
                .min(after.max(0.0));
            q.backlog_at = at;
        }
        self.unqueue(endpoint, own, at);
        self.queues.entry(endpoint).or_default().decoding += 1;
    }

    /// The engine's usage arrived: it teaches the ratio of engine tokens to estimated tokens,
    /// and calibrates with the engine's own cached count.
    pub(super) fn usage_reported(
        &mut self,
        request: u64,
        endpoint: EndpointId,
        at: Nanos,
        usage: &Usage,
    ) {
        if let Some(p) = self.pending.get(&(request, endpoint)) {
            if p.estimate > 0 && usage.prompt_tokens > 0 {
                let ratio = f64::from(usage.prompt_tokens) / f64::from(p.estimate);
                self.token_ratio += (ratio - self.token_ratio) * 0.05;
            }
        }
        self.settle(request, endpoint, at, Some(usage));
    }

    /// The request finished after `latency`: its decode time teaches the batch slots.
    pub(super) fn completed(
        &mut self,
        request: u64,
        endpoint: EndpointId,
        at: Nanos,
        latency: Nanos,
    ) {
        let ttft = self.pending.get(&(request, endpoint)).and_then(|p| p.ttft);
        if let (Some(ttft), Some(q)) = (ttft, self.queues.get_mut(&endpoint)) {
            q.slots
                .finished(latency.saturating_since(ttft).as_secs_f64());
        }
        self.settle(request, endpoint, at, None);
        self.finish(request, endpoint, at);
    }
}
