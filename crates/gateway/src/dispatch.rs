//! One attempt's bookkeeping from pick to end: the in-flight ledger entry, the policy's events
//! and the request's metrics. Dropping an unfinished [`Dispatch`] (a hedge that lost, a client
//! that went away) reports it as cancelled, so no path can leak a ledger entry.

use crate::metrics::PolicyLabel;
use crate::pool::Target;
use crate::state::Shared;
use kvgate_core::decision::FailureKind;
use kvgate_core::Nanos;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// An attempt in flight.
#[derive(Debug)]
pub(crate) struct Dispatch {
    shared: Arc<Shared>,
    /// The request's id.
    pub(crate) request: u64,
    /// Where it went.
    pub(crate) target: Target,
    /// Whether the client asked for a stream (only streams feed TTFT and the hedge delay).
    stream: bool,
    /// Whether this attempt's end is the request's end (it won).
    pub(crate) final_attempt: bool,
    sent: Instant,
    first: Option<Instant>,
    done: bool,
}

impl Dispatch {
    /// Starts tracking an attempt that the pool already recorded as dispatched.
    pub(crate) fn new(shared: Arc<Shared>, request: u64, target: Target, stream: bool) -> Self {
        Dispatch {
            shared,
            request,
            target,
            stream,
            final_attempt: false,
            sent: Instant::now(),
            first: None,
            done: false,
        }
    }

    fn nanos(d: Duration) -> Nanos {
        Nanos(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }

    /// The first bytes arrived.
    pub(crate) fn first_token(&mut self) {
        let now = Instant::now();
        self.first = Some(now);
        let ttft = now.duration_since(self.sent);
        // A non-streaming response's first bytes are its end: not a first token (see
        // `Pool::first_token`).
        self.shared.pool.first_token(
            self.request,
            self.target.id,
            self.target.ticket,
            Self::nanos(ttft),
            self.stream,
        );
    }

    /// The endpoint answered with a non-2xx status that is passed to the client as it is
    /// (see [`crate::pool::Pool::refused`]).
    pub(crate) fn refused(&self, status: u16) {
        self.shared
            .pool
            .refused(self.target.id, self.target.ticket, status);
    }

    /// The stream ended normally with `output_tokens` tokens (`0` when unknown).
    pub(crate) fn complete(mut self, ok: bool, output_tokens: u32) {
        self.done = true;
        let now = Instant::now();
        let e2e = now.duration_since(self.sent);
        self.shared.pool.completed(
            self.request,
            self.target.id,
            Self::nanos(e2e),
            output_tokens,
        );
        let policy = self.shared.pool.policy_name();
        let m = &self.shared.metrics;
        m.request(
            if ok { "ok" } else { "upstream_error" },
            policy,
            &self.target.name,
        );
        let label = PolicyLabel { policy };
        m.e2e.get_or_create(&label).observe(e2e.as_secs_f64());
        if let (true, Some(first)) = (self.stream, self.first) {
            let ttft = first.duration_since(self.sent);
            m.ttft.get_or_create(&label).observe(ttft.as_secs_f64());
            if output_tokens > 1 {
                let tpot = now.duration_since(first).as_secs_f64() / f64::from(output_tokens - 1);
                m.tpot.get_or_create(&label).observe(tpot);
            }
        }
    }

    /// The attempt failed.
    pub(crate) fn fail(
        mut self,
        kind: FailureKind,
        retry_after: Option<Duration>,
        outcome: &'static str,
    ) {
        self.done = true;
        self.shared.pool.failed(
            self.request,
            self.target.id,
            self.target.ticket,
            kind,
            retry_after,
        );
        if self.final_attempt {
            let policy = self.shared.pool.policy_name();
            self.shared
                .metrics
                .request(outcome, policy, &self.target.name);
        }
    }
}

impl Drop for Dispatch {
    fn drop(&mut self) {
        if !self.done {
            self.shared.pool.failed(
                self.request,
                self.target.id,
                self.target.ticket,
                FailureKind::Cancelled,
                None,
            );
            if self.final_attempt {
                let policy = self.shared.pool.policy_name();
                self.shared
                    .metrics
                    .request("cancelled", policy, &self.target.name);
            }
        }
    }
}
