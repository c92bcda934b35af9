//! Streams continued after their replica died mid-answer, as the gateway's relay does
//! (crates/gateway/src/relay), by the same rules (`kvgate_core::dispatch::ContinuationGate`,
//! `head_held`): the router sends the prompt and the text generated so far
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

use super::rehome::Warmup;
use super::Sim;

/// The first id of the text a broken stream had generated. The workloads' unique ids count
/// up from 0 and shared ones live at or above 2^30, so these stay distinct from both in any
/// run shorter than 2^29 unique tokens.
pub(super) const GENERATED_IDS: u32 = 0x2000_0000;

/// A continuation (or a warm-up) waiting at its router.
#[derive(Debug)]
pub(super) struct Held {
    id: u64,
    prompt: Vec<u32>,
    output: u32,
    /// Until when it yields to new requests; `None`: for as long as it waits.
    yield_until: Option<kvgate_core::Nanos>,
    /// A warm-up of this prompt's head that must have its first token before this one leaves,
    /// and whose replica this one goes to (a staged continuation).
    after: Option<u64>,
    /// It is a head of a staged continuation, not the first: it gives way to the next when
    /// its router's index says the replica of the head before already holds it ([`cached`]).
    staged: bool,
    /// It may also give way to the next where none of its router's requests awaits a first
    /// token (`resume_stage_grow`): a staged head that did not take over from another.
    skippable: bool,
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
        let yield_until = Some(now + self.config.resume_yield);
        let after = self.stage(id, &tokens, yield_until, Warmup::ContinuationHead);
        self.hold(
            id,
            tokens,
            max_output.saturating_sub(output).max(1),
            yield_until,
            after,
        );
    }

    /// Staged (`resume_stage`): queues the heads of `tokens`, each a piece longer than the one
    /// before, as one-token warm-ups on behalf of request `source`, each to leave after the one
    /// before and for its replica, so a request arriving there waits behind one piece's prefill, not
    /// the whole prompt's. Returns the last head, which the whole prompt must follow (`None`:
    /// not staged, or too short to stage).
    pub(super) fn stage(
        &mut self,
        source: u64,
        tokens: &[u32],
        yield_until: Option<kvgate_core::Nanos>,
        kind: Warmup,
    ) -> Option<u64> {
        let piece = self.config.resume_stage.filter(|&p| p > 0)? as usize;
        let mut after = None;
        let mut head = piece;
        while head < tokens.len() {
            let w = self.new_warmup(source, tokens[..head].to_vec(), kind);
            self.held.push_back(Held {
                id: w,
                prompt: tokens[..head].to_vec(),
                output: 1,
                yield_until,
                after,
                staged: after.is_some(),
                skippable: self.config.resume_stage_grow && after.is_some(),
            });
            after = Some(w);
            head += piece;
        }
        after
    }

    /// Queues request `id` at its router, yielding until `yield_until` (`None`: always), and
    /// after the staged head `after` (then to that head's replica); [`Self::release`] sends it.
    pub(super) fn hold(
        &mut self,
        id: u64,
        prompt: Vec<u32>,
        output: u32,
        yield_until: Option<kvgate_core::Nanos>,
        after: Option<u64>,
    ) {
        self.held.push_back(Held {
            id,
            prompt,
            output,
            yield_until,
            after,
            staged: false,
            skippable: false,
        });
    }

    /// Routes the waiting continuations, oldest first, while some live replica has room. One
    /// still yielding skips the replicas where a request its router sent awaits its first
    /// token: sent there, its full prefill would hold that request up. A piece of a staged
    /// continuation waits for the piece before it and goes to the same replica; leaving where
    /// no request awaits its first token, it gives way to the piece after it
    /// (`resume_stage_grow`), so the head grows by two pieces; and so does one the router's
    /// index says that replica holds already ([`cached`]), which would warm nothing.
    pub(super) fn release(&mut self) {
        let mut k = 0;
        while k < self.held.len() {
            let next = &self.held[k];
            let rec = &self.out.records[next.id as usize];
            let yielding = next.yield_until.is_none_or(|t| self.now < t);
            let pinned = match next.after.map(|a| &self.out.records[a as usize]) {
                Some(a) if a.failed => None,
                Some(a) if a.first_token.is_none() => {
                    k += 1;
                    continue;
                }
                Some(a) => Some(a.replica as usize),
                None => None,
            };
            let router = self.routers[rec.router as usize].core().router();
            let pinned_to = pinned.map(|p| kvgate_core::EndpointId(p as u32));
            let closed: Vec<bool> = (0..self.replicas.len())
                .map(|i| {
                    let endpoint = kvgate_core::EndpointId(i as u32);
                    let awaiting = router.awaiting_first_token(endpoint);
                    !self.replicas[i].alive
                        || !self.gate.admits(endpoint, pinned_to, yielding, awaiting)
                })
                .collect();
            if closed.iter().all(|&c| c) {
                k += 1;
                continue;
            }
            let Some(next) = self.held.remove(k) else {
                return;
            };
            if let Some(p) = pinned.filter(|_| next.staged) {
                let endpoint = kvgate_core::EndpointId(p as u32);
                let quiet = next.skippable && router.awaiting_first_token(endpoint) == 0;
                let held = !quiet && {
                    let head = super::request_of(
                        rec,
                        next.id,
                        next.prompt.clone(),
                        self.config.session_names,
                    );
                    let piece = self.config.resume_stage.unwrap_or(0);
                    cached(
                        &self.routers[rec.router as usize],
                        &head,
                        p,
                        self.now,
                        piece,
                    )
                };
                let warmups = &self.warmups;
                let follower = self
                    .held
                    .iter_mut()
                    .find(|h| h.after == Some(next.id) && warmups.contains_key(&h.id));
                if let (true, Some(follower)) = (quiet || held, follower) {
                    // The next head takes this one's place: it leaves now, as this would have.
                    // Grown, it computes two pieces and grows no further; past a held head it
                    // still computes one, and may grow.
                    follower.after = next.after;
                    follower.skippable &= held;
                    match held {
                        true => self.out.heads_held += 1,
                        false => self.out.heads_grown += 1,
                    }
                    continue;
                }
            }

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
        self.gate.leave(endpoint);
        self.release();
    }
}

/// Whether the router's index says replica `replica` holds all of `head` but under a quarter of
/// a piece (`resume_stage_tokens`): sent, it would cost the continuation an iteration and
/// warm nothing. The first head of a continuation goes wherever it is routed, so the heads
/// after it lie within what the replica already held (another session's system prompt, a
/// shared document) until the first that reaches past it.
fn cached(
    routing: &kvgate_core::dispatch::Dispatcher,
    head: &kvgate_core::Request,
    replica: usize,
    now: kvgate_core::Nanos,
    piece: u32,
) -> bool {
    let Some(cache) = routing.cache() else {
        return false;
    };
    let overlaps = cache.overlaps(head, now);
    let endpoint = kvgate_core::EndpointId(replica as u32);
    let tokens = head.prompt_tokens;
    let held = cache
        .prediction(head, endpoint, &overlaps)
        .cached_tokens(tokens);
    kvgate_core::dispatch::head_held(tokens.saturating_sub(held) as usize, piece as usize)
}
