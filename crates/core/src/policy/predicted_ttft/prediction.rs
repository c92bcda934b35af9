//! One endpoint's prediction for one request, and the per-dispatch bookkeeping that keeps the
//! queue model and the calibration in step with what each dispatch turned out to cost.

use super::sessions::Held;
use super::PredictedTtft;
use crate::index::{as_reported, Overlaps};
use crate::{EndpointId, Nanos, Usage};

/// One dispatch awaiting its first token and usage.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pending {
    /// Prefill tokens queued ahead of it when it was sent.
    pub(super) ahead: f64,
    /// Its own predicted uncached tokens.
    pub(super) own: f64,
    /// Decoding sequences beside it when it was sent.
    pub(super) decodes: f64,
    /// The endpoint's [`Queue::sent`](super::queue::Queue::sent) before it.
    pub(super) sent_before: f64,
    /// Its estimated prompt tokens before scaling.
    pub(super) estimate: u32,
    /// Seconds left of the iteration in progress when it was sent ([`Cadence`](crate::Cadence)), plus its
    /// predicted wait for a batch slot.
    pub(super) remaining: f64,
    /// Time to first token, once it came.
    pub(super) ttft: Option<Nanos>,
    /// Whether the calibration has seen it.
    pub(super) calibrated: bool,
}

/// What the endpoint's view at a pick says: the engine's fresh scrape, its KV block size when
/// reported. A dispatch has no view.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Observed {
    pub(super) scrape: Option<Scrape>,
    pub(super) block_size: Option<u32>,
}

/// A fresh scrape of the engine, and this router's dispatches there since it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Scrape {
    pub(super) running: u32,
    pub(super) waiting: u32,
    pub(super) at: Nanos,
    pub(super) own_since: u32,
}

/// One endpoint's prediction for one request.
#[derive(Clone, Copy, Debug)]
pub(super) struct Prediction {
    /// Seconds to the first token.
    pub(super) ttft: f64,
    /// The request's own uncached tokens there.
    pub(super) own: f64,
    /// Uncached tokens queued ahead of it.
    pub(super) ahead: f64,
    /// Sequences decoding beside it.
    pub(super) decodes: f64,
    /// Seconds left of the iteration in progress there, plus the wait for a batch slot.
    pub(super) remaining: f64,
    /// [`Queue::externality`](super::queue::Queue::externality) there now.
    pub(super) externality: f64,
    /// What it holds of the prompt.
    pub(super) held: Held,
}

impl PredictedTtft {
    /// Prompt tokens `endpoint` will have cached for this prompt when it is admitted: what the
    /// index knows is cached, plus the prefix an earlier dispatch there is still prefilling.
    /// First come, first served puts that dispatch's chunks ahead of this one, and the engine
    /// finds them cached as they are scheduled (vLLM v1 caches a block when it allocates its
    /// slots; `kvgate sim`'s engine model does the same), even in the iteration that admits
    /// this one.
    ///
    /// The count is what the engine will report ([`as_reported`]), in whole blocks once it
    /// reports its block size (vLLM's `cache_config_info`): an append of a few dozen tokens
    /// to a long context is then predicted with the up-to-a-block it recomputes.
    pub(super) fn cached(
        overlaps: &Overlaps,
        endpoint: EndpointId,
        prompt: f64,
        block_size: Option<u32>,
    ) -> (f64, Held) {
        let o = overlaps.of(endpoint);
        let tokens = |units| f64::from(overlaps.tokens(units, prompt as u32));
        let known = tokens(o.total());
        let in_flight = (tokens(o.pending) - known).max(0.0);
        let held = Held {
            endpoint,
            computed: known,
            prefilling: if in_flight > 0.0 {
                known + in_flight
            } else {
                0.0
            },
        };
        (as_reported(known + in_flight, prompt, block_size), held)
    }

    /// The prediction for one endpoint, `remaining` seconds of its iteration in progress
    /// ahead (a dispatch passes its pick's phase and slot wait); a fresh scrape adds the wait
    /// for a batch slot.
    pub(super) fn predict(
        &mut self,
        endpoint: EndpointId,
        overlaps: &Overlaps,
        prompt: f64,
        observed: Observed,
        remaining: f64,
        now: Nanos,
    ) -> Prediction {
        let c = self.calibration.coefficients(endpoint.0, now);
        let q = self.queues.entry(endpoint).or_default();
        let decodes = match observed.scrape {
            Some(s) => f64::from(q.decoding.max(s.running)),
            None => q.decodes.max(f64::from(q.decoding)),
        };
        q.decodes = decodes;
        let slot = observed.scrape.map_or(0.0, |s| {
            q.slots.observe(s.running, s.waiting, s.at);
            let occupancy = s.running.saturating_add(s.waiting);
            q.slots.wait(occupancy.saturating_add(s.own_since))
        });
        let remaining = remaining + slot;
        // A dispatch, which has no view, uses the size its pick saw.
        q.block_size = observed.block_size.or(q.block_size);
        let ahead = q.ahead(now, c.seconds_per_token(decodes));
        let (cached, held) = Self::cached(overlaps, endpoint, prompt, q.block_size);
        let own = (prompt - cached).max(1.0);
        Prediction {
            ttft: remaining + c.predict(ahead + own, decodes),
            own,
            ahead,
            decodes,
            remaining,
            externality: q.externality(now, ahead * c.seconds_per_token(decodes)),
            held,
        }
    }

    /// Teaches the calibration one first token, once: with the engine's own count of the
    /// request's uncached tokens when usage reported its cached tokens, else with the predicted
    /// count. The engine's prompt count is taken with its cached count, not the router's
    /// estimate: on a long prompt that is mostly cached, the uncached tokens are a small
    /// difference of two large numbers, and a 3% error in a 3,000-token estimate is most of a
    /// 150-token remainder.
    pub(super) fn settle(
        &mut self,
        request: u64,
        endpoint: EndpointId,
        at: Nanos,
        usage: Option<&Usage>,
    ) {
        let Some(p) = self.pending.get(&(request, endpoint)).copied() else {
            return;
        };
        let (Some(ttft), false) = (p.ttft, p.calibrated) else {
            return;
        };
        let own = usage
            .and_then(|u| Some((u.prompt_tokens, u.cached_tokens?)))
            .map_or(p.own, |(prompt, cached)| {
                let prompt = if prompt > 0 {
                    f64::from(prompt)
                } else {
                    self.prompt_tokens(p.estimate)
                };
                (prompt - f64::from(cached)).max(1.0)
            });
        let ttft = (ttft.as_secs_f64() - p.remaining).max(0.0);
        self.calibration
            .observe(endpoint.0, at, p.ahead + own, p.decodes, ttft);
        if let Some(p) = self.pending.get_mut(&(request, endpoint)) {
            p.calibrated = true;
        }
    }

    /// The dispatch without a first token ended at `now`: its work leaves the queue.
    pub(super) fn unqueue(&mut self, endpoint: EndpointId, own: f64, now: Nanos) {
        if let Some(q) = self.queues.get_mut(&endpoint) {
            q.pending = (q.pending - own).max(0.0);
            q.backlog = q.backlog.min(q.pending);
            q.waiting = q.waiting.saturating_sub(1);
            if q.waiting == 0 {
                q.busy.set(false, now);
            }
        }
    }

    pub(super) fn finish(&mut self, request: u64, endpoint: EndpointId, now: Nanos) {
        if let Some(p) = self.pending.remove(&(request, endpoint)) {
            if p.ttft.is_none() {
                self.unqueue(endpoint, p.own, now);
            } else if let Some(q) = self.queues.get_mut(&endpoint) {
                q.decoding = q.decoding.saturating_sub(1);
            }
        }
    }
}
