//! Streams continued after their replica died mid-answer, as the gateway's `resume` does
//! (crates/gateway/src/resume): the router sends the prompt and the text generated so far
//! elsewhere and asks for the rest, so the client sees a pause, not an error.
//!
//! A continuation is a full prefill (the lost replica's cache died with it), and a replica
//! admits waiting prompts first come first served, so the continuations of every stream the
//! lost replica held, sent at once, hold up every first token behind them on the survivors.
//! So at most `resume` (`per_endpoint` in the gateway) continuations await their first token on
//! a replica at once. The others wait at the router, in the order their streams broke, and
//! each is routed when it leaves, among the replicas with room. For `resume_yield` after the
//! break a continuation also yields to new requests: it leaves only for a replica where none
//! awaits its first token.

use super::Sim;

/// The first id of the text a broken stream had generated. The workloads' unique ids count
/// up from 0 and shared ones live at or above 2^30, so these stay distinct from both in any
/// run shorter than 2^29 unique tokens.
pub(super) const GENERATED_IDS: u32 = 0x2000_0000;

/// A continuation waiting at its router.
#[derive(Debug)]
pub(super) struct Held {
    id: u64,
    prompt: Vec<u32>,
    output: u32,
}

impl Held {
    /// The request it continues (or warms up).
    pub(super) fn id(&self) -> u64 {
        self.id
    }
}

impl Sim<'_> {
    /// Request `id`'s stream broke after `output` of `max_output` tokens of a prompt `prompt`:
    /// its router continues it with that prompt and the text so far.
    pub(super) fn resume(&mut self, id: u64, prompt: Vec<u32>, max_output: u32, output: u32) {
        let now = self.now;
        let rec = &mut self.out.records[id as usize];
        let before = rec.resumed.map_or(0, |r| r.output_before);
        rec.resumed = Some(super::Resumption {
            broken: now,
            sent: None,
            first_token: None,
            output_before: before + output,
            prompt_tokens: 0,
            cached_tokens: 0,
        });
        let mut tokens = prompt;
        self.generated.extend(&mut tokens, output);
        self.hold(id, tokens, max_output.saturating_sub(output).max(1));
    }

    /// Queues continuation `id` at its router; [`Self::release`] sends it.
    pub(super) fn hold(&mut self, id: u64, prompt: Vec<u32>, output: u32) {
        self.held.push_back(Held { id, prompt, output });
    }

    /// Routes the waiting continuations, oldest first, while some live replica has room. One
    /// still yielding (`resume_yield` since its stream broke) skips the replicas where a request
    /// its router sent awaits its first token: sent there, its full prefill would hold that
    /// request up.
    pub(super) fn release(&mut self) {
        let limit = self.config.resume.unwrap_or(0);
        while let Some(next) = self.held.front() {
            let rec = &self.out.records[next.id as usize];
            let broken = rec.resumed.map_or(self.now, |r| r.broken);
            let yielding = self.now.saturating_since(broken) < self.config.resume_yield;
            let router = self.routers[rec.router as usize].router();
            let closed: Vec<bool> = (0..self.replicas.len())
                .map(|i| {
                    let awaiting = router.awaiting_first_token(kvgate_core::EndpointId(i as u32));
                    !self.replicas[i].alive
                        || (limit > 0 && self.open[i] >= limit)
                        || (yielding && awaiting > 0)
                })
                .collect();
            if closed.iter().all(|&c| c) {
                return;
            }
            let Some(next) = self.held.pop_front() else {
                return;
            };
            self.route_among(next.id, next.prompt, next.output, &closed);
        }
    }

    /// A continuation's first token on replica `i`: the client's stream flows again, and the
    /// replica has room for the next continuation.
    pub(super) fn continued(&mut self, i: usize, id: u64, cached_tokens: u32) {
        let now = self.now;
        let endpoint = kvgate_core::EndpointId(i as u32);
        let rec = &mut self.out.records[id as usize];
        let router = rec.router as usize;
        let Some(r) = rec.resumed.as_mut() else {
            return;
        };
        r.first_token = Some(now);
        r.cached_tokens = cached_tokens;
        let ttft = now - r.sent.unwrap_or(now);
        self.replicas[i].streams[router] += 1;
        self.routers[router].first_token(id, endpoint, now, ttft);
        self.share(
            router,
            super::share::News::FirstToken { id, endpoint, ttft },
        );
        self.open[i] = self.open[i].saturating_sub(1);
        self.release();
    }
}
