//! What `predicted_ttft` knows of the work it has queued at one endpoint: the backlog still to
//! prefill, and how busy the endpoint has been, which prices what more work there costs.

use super::slots::Slots;
use crate::Nanos;

/// What this router has queued at one endpoint.
///
/// The queued work ahead of a new request is a backlog that drains at the endpoint's predicted
/// prefill rate: counting every dispatch without a first token whole would charge a request for
/// the part of a long prompt computed already, which is most of it when that prompt is about to
/// finish, and make the prediction wrong by up to a whole prompt's prefill time. The drain uses
/// the rate the calibration is learning, so an error in the rate shows up as a residual the fit
/// corrects (too fast a drain under-predicts and raises the per-token time, which slows the
/// drain); the backlog never exceeds the work without a first token, and a first token resets it
/// to at most the work sent after that request.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Queue {
    /// Predicted uncached tokens of dispatches without a first token.
    pub(super) pending: f64,
    /// Of `pending`, the tokens predicted not computed at `backlog_at`.
    pub(super) backlog: f64,
    pub(super) backlog_at: Nanos,
    /// Uncached tokens ever sent, to tell what was sent after a given dispatch.
    pub(super) sent: f64,
    /// Dispatches without a first token.
    pub(super) waiting: u32,
    /// Dispatches past their first token, not finished.
    pub(super) decoding: u32,
    /// Decoding sequences as the last prediction counted them (own, or scraped when more).
    pub(super) decodes: f64,
    /// Prefill utilisation.
    pub(super) busy: Busy,
    /// Tokens per KV block, from the endpoint's last observation that reported it.
    pub(super) block_size: Option<u32>,
    /// Its batch slots.
    pub(super) slots: Slots,
}

impl Queue {
    /// The backlog predicted still to compute at `now`, draining at `seconds_per_token`.
    pub(super) fn ahead(&self, now: Nanos, seconds_per_token: f64) -> f64 {
        let drained = now.saturating_since(self.backlog_at).as_secs_f64() / seconds_per_token;
        (self.backlog - drained).clamp(0.0, self.pending)
    }

    /// What one more uncached token at this endpoint costs the requests that come after it
    /// there, in units of its own prefill time: with prefill utilisation `rho`, work added now
    /// delays the queue it joins by `rho / (1 - rho)` of its length on average (the M/M/1
    /// busy-period factor; `rho` capped at 0.9). Greedy TTFT alone would recompute a hot prefix
    /// on a second replica whenever queueing behind it at home costs as much as the recompute,
    /// and on a loaded fleet that duplicated prefill is what runs it out of capacity; on an idle
    /// one it costs nothing and the recompute is free to win.
    ///
    /// `rho` is the busy share of the window from [`Busy::TAU_SECS`] ago to the end of the
    /// `backlog_secs` of prefill already sent there: the decayed past share, with the backlog
    /// counted as busy time ahead. Work just sent raises it at once rather than over τ, so a run
    /// of large requests does not all go to the endpoint whose lagging share was lowest (in the
    /// sim's sweeps, 5 seeds: long-context fan-out 13.1 -> 13.8 req/s, the rest within ±1%).
    pub(super) fn externality(&self, now: Nanos, backlog_secs: f64) -> f64 {
        let tau = Busy::TAU_SECS;
        let backlog = backlog_secs.max(0.0);
        let rho = ((self.busy.at(now) * tau + backlog) / (tau + backlog)).clamp(0.0, 0.9);
        rho / (1.0 - rho)
    }
}

/// The share of recent time an endpoint had prefill queued (some dispatch of this router
/// without its first token), exponentially decayed over `TAU_SECS`: its prefill utilisation as
/// the router can measure it, whatever slows it (decodes, other routers, a slow GPU).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Busy {
    share: f64,
    at: Nanos,
    busy: bool,
}

impl Busy {
    const TAU_SECS: f64 = 10.0;

    fn at(&self, now: Nanos) -> f64 {
        let k = (-now.saturating_since(self.at).as_secs_f64() / Self::TAU_SECS).exp();
        let target = if self.busy { 1.0 } else { 0.0 };
        target + (self.share - target) * k
    }

    pub(super) fn set(&mut self, busy: bool, now: Nanos) {
        self.share = self.at(now);
        self.at = self.at.max(now);
        self.busy = busy;
    }
}
