//! The gateway's admission gate at each router (crates/gateway/src/admission.rs, taken in
//! crates/gateway/src/proxy/admit.rs): at most `max_concurrency` requests sent and not ended,
//! the rest waiting at their router, at most `max_queue` of them. A request that finds the
//! queue full fails at once (the gateway's 429); one still waiting after `queue_timeout` fails
//! then (its 504). Either way its session goes on, as an agent's does after an error.
//!
//! A request holds its slot from its send to its end, through retries and continuations, as the
//! gateway's permit lives as long as the response body. Warm-ups (re-homing, staged heads) take
//! none: the gateway sends them itself, not through `admit`.
//!
//! Modelled as first come, first served (`order: fifo`). Not modelled: the gateway's fair order
//! by tenant (`order: fair`, its default), the headroom it gives underserved tenants
//! (`fair_headroom`), `max_prefills`, and batch priority. With every request of one kind and
//! the limits far above what the fleet holds, as the defaults (4,096) are, the gate never
//! queues, and the order does not matter.
//!
//! A waiting request's time to first token counts from its arrival; what its router learns
//! (the TTFT and end-to-end time its policy calibrates on) counts from its send, as the gateway
//! measures an attempt from its dispatch.
//!
//! Every waiter of a router waits the same timeout, so they expire in the order they arrived:
//! one whose expiry comes while it still waits is at the head of its router's queue.

use super::{Kind, Sim};
use crate::workload::Workload;
use kvgate_core::Nanos;
use rand_chacha::ChaCha8Rng;
use std::collections::VecDeque;

/// One router's gate.
#[derive(Debug, Default)]
pub(super) struct Gate {
    /// Requests sent (or being sent) and not ended.
    in_flight: usize,
    /// Requests waiting, oldest first: id, prompt, output tokens.
    waiting: VecDeque<(u64, Vec<u32>, u32)>,
}

impl Sim<'_> {
    /// Request `id` (its record written) arrives at its router's gate: sent now, queued, or
    /// failed on a full queue. Without a gate it is sent at once.
    pub(super) fn admit(
        &mut self,
        id: u64,
        prompt: Vec<u32>,
        output: u32,
        workload: &mut dyn Workload,
        rng: &mut ChaCha8Rng,
    ) {
        let Some(limits) = self.config.admission else {
            self.route(id, prompt, output);
            return;
        };
        let router = self.out.records[id as usize].router as usize;
        let gate = &mut self.gates[router];
        if gate.in_flight < limits.max_concurrency && gate.waiting.is_empty() {
            gate.in_flight += 1;
            self.route(id, prompt, output);
        } else if gate.waiting.len() < limits.max_queue {
            gate.waiting.push_back((id, prompt, output));
            self.out.admission_queued += 1;
            self.push(self.now + limits.queue_timeout, Kind::Expire, id);
        } else {
            self.out.admission_rejected += 1;
            self.refuse(id, workload, rng);
        }
    }

    /// Request `id` ended (finished, or failed after it was sent): its slot goes to the
    /// oldest waiter. Warm-ups hold no slot.
    pub(super) fn admission_ended(&mut self, id: u64) {
        if self.config.admission.is_none() || self.is_warmup(id) {
            return;
        }
        let router = self.out.records[id as usize].router as usize;
        self.gates[router].in_flight -= 1;
        self.grant(router);
    }

    /// Sends router `router`'s waiters while it has free slots. A send that fails at once
    /// frees its slot within the loop ([`Self::admission_ended`] finds the loop running).
    fn grant(&mut self, router: usize) {
        if self.granting {
            return;
        }
        self.granting = true;
        let max = self.config.admission.map_or(0, |l| l.max_concurrency);
        while self.gates[router].in_flight < max {
            let Some((id, prompt, output)) = self.gates[router].waiting.pop_front() else {
                break;
            };
            self.gates[router].in_flight += 1;
            self.sent.insert(id, self.now);
            self.route(id, prompt, output);
        }
        self.granting = false;
    }

    /// Request `id`'s wait is over: if it still waits, it fails.
    pub(super) fn expire(&mut self, id: u64, workload: &mut dyn Workload, rng: &mut ChaCha8Rng) {
        let router = self.out.records[id as usize].router as usize;
        let waiting = &mut self.gates[router].waiting;
        if waiting.front().is_some_and(|w| w.0 == id) {
            waiting.pop_front();
            self.out.admission_expired += 1;
            self.refuse(id, workload, rng);
        }
    }

    /// Request `id` fails without being sent; its session goes on.
    fn refuse(&mut self, id: u64, workload: &mut dyn Workload, rng: &mut ChaCha8Rng) {
        let rec = &mut self.out.records[id as usize];
        rec.failed = true;
        rec.finished = Some(self.now);
        let tag = rec.tag;
        self.follow_up(tag, workload, rng);
    }

    /// When request `id` was sent: its arrival, unless it waited at the gate.
    pub(super) fn sent_at(&self, id: u64) -> Nanos {
        self.sent
            .get(&id)
            .copied()
            .unwrap_or(self.out.records[id as usize].arrival)
    }
}

#[cfg(test)]
mod tests;
