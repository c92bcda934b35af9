//! Replica loss and the oracle router: the two ways the fleet departs from "every router runs
//! its policy on healthy replicas".

use super::Sim;
use crate::workload::Workload;
use kvgate_core::decision::FailureKind;
use kvgate_core::{EndpointId, Nanos};
use rand_chacha::ChaCha8Rng;

/// The queue model's TTFT beyond which the oracle does not run a copy of the engine forward.
const FORWARD_LIMIT: Nanos = Nanos(10_000_000_000);

impl Sim<'_> {
    /// Replica `i` dies now: every router forgets it, requests without a first token are sent
    /// again through their router, and those mid-stream are continued elsewhere
    /// ([`super::resume`]) or, with `resume` off, fail (and their sessions go on, as an agent
    /// whose call errored does).
    pub(super) fn fail(&mut self, i: usize, workload: &mut dyn Workload, rng: &mut ChaCha8Rng) {
        let now = self.now;
        let endpoint = EndpointId(i as u32);
        let replica = &mut self.replicas[i];
        if !replica.alive {
            return;
        }
        replica.alive = false;
        replica.pending = None;
        replica.stepping = false;
        let lost = replica.engine.fail();
        for (id, _, _, _) in &lost {
            let router = self.out.records[*id as usize].router as usize;
            self.routers[router].failed(*id, endpoint, now, FailureKind::Connect);
        }
        self.gate.clear(endpoint);
        for r in &mut self.routers {
            r.remove(endpoint, now);
        }
        for (id, prompt, max_output, output) in lost {
            self.out.in_flight -= 1;
            if self.is_warmup(id) {
                self.out.records[id as usize].failed = true;
                continue;
            }
            let rec = &mut self.out.records[id as usize];
            if output == 0 && rec.resumed.is_some_and(|r| r.first_token.is_none()) {
                rec.retries += 1;
                let until = rec.resumed.map(|r| r.broken + self.config.resume_yield);
                self.hold(id, prompt, max_output, until, None);
            } else if output == 0 {
                rec.retries += 1;
                self.route(id, prompt, max_output);
            } else if self.config.resume.is_some() {
                self.resume(id, prompt, max_output, output);
            } else {
                rec.failed = true;
                rec.finished = Some(now);
                rec.output_tokens = output;
                let tag = rec.tag;
                self.admission_ended(id);
                self.follow_up(tag, workload, rng);
            }
        }
        match self.config.rehome_delay {
            Nanos::ZERO => self.rehome(i as u32),
            delay => self.push(now + delay, super::Kind::Rehome, i as u64),
        }
        self.release();
    }

    /// The oracle's pick: the live replica where the true queue, the true cache and the true
    /// speed put the first token earliest (the iteration in progress included); ties go to the
    /// lowest index. The prediction recorded is the chosen replica's engine run forward
    /// ([`crate::model::EngineModel::forward_ttft`]), the best any router could predict. The
    /// pick keeps the queue model, so the oracle routes (and its capacities read) as before the
    /// forward copy existed, with one copy per request rather than one per replica.
    /// Past [`FORWARD_LIMIT`] the queue model's figure stands: an overloaded replica's queue
    /// would take the copy thousands of iterations per request, and the run's SLO is lost
    /// anyway.
    pub(super) fn oracle_pick(
        &self,
        prompt: &[u32],
        closed: &dyn Fn(usize) -> bool,
    ) -> (usize, Nanos) {
        let now = self.now;
        let residual = |r: &super::Replica| r.busy_until.saturating_since(now).0;
        let scaled = |r: &super::Replica, t: Nanos| (t.0 as f64 / r.speed) as u64;
        let mut best: Option<(usize, u64)> = None;
        for (i, r) in self.replicas.iter().enumerate() {
            if !r.alive || closed(i) {
                continue;
            }
            let ttft = residual(r) + scaled(r, r.engine.oracle_ttft(prompt));
            if best.is_none_or(|(_, b)| ttft < b) {
                best = Some((i, ttft));
            }
        }
        let Some((i, queue_model)) = best else {
            return (0, Nanos::ZERO);
        };
        let r = &self.replicas[i];
        let forward = (queue_model < FORWARD_LIMIT.0)
            .then(|| r.engine.forward_ttft(prompt))
            .flatten()
            .map(|t| residual(r) + scaled(r, t));
        (i, Nanos(forward.unwrap_or(queue_model)))
    }
}
