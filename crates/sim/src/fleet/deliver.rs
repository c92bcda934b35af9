//! Handing a finished iteration's output to the routers, the records and the workload.

use super::{share, Sim};
use crate::model::{Iteration, SeqEvent};
use crate::workload::Workload;
use kvgate_core::{EndpointId, Usage};
use rand_chacha::ChaCha8Rng;

impl Sim<'_> {
    /// Delivers replica `i`'s iteration `it` at its end: its KV events, its tokens, its first
    /// tokens and its finished requests.
    pub(super) fn deliver(
        &mut self,
        i: usize,
        it: Iteration,
        workload: &mut dyn Workload,
        rng: &mut ChaCha8Rng,
    ) {
        let now = self.now;
        let endpoint = EndpointId(i as u32);
        self.out.output_tokens += u64::from(it.output_tokens);
        self.out.replicas[i].output_tokens += u64::from(it.output_tokens);
        if self.config.kv_events && !it.kv_events.is_empty() {
            let seq = self.replicas[i].kv_seq;
            self.replicas[i].kv_seq += 1;
            for r in &mut self.routers {
                r.kv_batch(endpoint, seq, &it.kv_events, now);
            }
        }
        if it.output_tokens > 0 {
            self.tokens_seen(i, &it);
        }
        for event in it.events {
            match event {
                SeqEvent::FirstToken { id, cached_tokens }
                    if self.out.records[id as usize].first_token.is_some() =>
                {
                    self.continued(i, id, cached_tokens);
                }
                SeqEvent::FirstToken { id, cached_tokens } => {
                    self.first_token(i, id, cached_tokens);
                }
                SeqEvent::Finished { id, output_tokens } => {
                    self.finished(i, id, output_tokens, workload, rng);
                }
                SeqEvent::Token { .. } | SeqEvent::Preempted { .. } => {}
            }
        }
        // A first token may have ended the wait of a continuation yielding to new requests,
        // and time has passed for one whose yield is over.
        if !self.held.is_empty() {
            self.release();
        }
    }

    /// Tells every router relaying a stream from replica `i` (or getting its first token in
    /// `it`) that the replica produced tokens now.
    fn tokens_seen(&mut self, i: usize, it: &Iteration) {
        let now = self.now;
        let endpoint = EndpointId(i as u32);
        for r in 0..self.routers.len() {
            let first = |e: &SeqEvent| match *e {
                SeqEvent::FirstToken { id, .. } => {
                    self.out.records[id as usize].router as usize == r
                }
                _ => false,
            };
            if self.replicas[i].streams[r] > 0 || it.events.iter().any(first) {
                self.routers[r].tokens(endpoint, now);
            }
        }
    }

    /// Request `id`'s first token on replica `i`.
    fn first_token(&mut self, i: usize, id: u64, cached_tokens: u32) {
        let now = self.now;
        let endpoint = EndpointId(i as u32);
        let dispatched = self.sent_at(id);
        let rec = &mut self.out.records[id as usize];
        rec.first_token = Some(now);
        rec.cached_tokens = cached_tokens;
        let router = rec.router as usize;
        self.replicas[i].streams[router] += 1;
        let ttft = now - dispatched;
        self.routers[router].first_token(id, endpoint, now, ttft);
        let news = share::News::FirstToken { id, endpoint, ttft };
        self.share(router, news);
        if self.is_warmup(id) {
            self.gate.leave(endpoint);
        }
    }

    /// Request `id` finished on replica `i` after `output_tokens` tokens (of its last
    /// continuation, if it was resumed).
    fn finished(
        &mut self,
        i: usize,
        id: u64,
        output_tokens: u32,
        workload: &mut dyn Workload,
        rng: &mut ChaCha8Rng,
    ) {
        let now = self.now;
        let endpoint = EndpointId(i as u32);
        let sent = self.sent_at(id);
        let rec = &mut self.out.records[id as usize];
        rec.finished = Some(now);
        let tag = rec.tag;
        if !self.warmups.contains_key(&id) {
            self.last_turn.ended(id, endpoint, now);
        }
        let (dispatched, usage) = match rec.resumed {
            Some(r) => (
                r.sent.unwrap_or(rec.arrival),
                Usage {
                    prompt_tokens: r.prompt_tokens,
                    cached_tokens: Some(r.cached_tokens),
                    output_tokens,
                },
            ),
            None => (
                sent,
                Usage {
                    prompt_tokens: rec.prompt_tokens,
                    cached_tokens: Some(rec.cached_tokens),
                    output_tokens,
                },
            ),
        };
        rec.output_tokens = output_tokens + rec.resumed.map_or(0, |r| r.output_before);
        let from = rec.router as usize;
        let streams = &mut self.replicas[i].streams[from];
        *streams = streams.saturating_sub(1);
        let router = &mut self.routers[from];
        let e2e = now - dispatched;
        router.completed((id, endpoint), now, (e2e, output_tokens), Some(usage));
        let output = output_tokens;
        let news = share::News::Done {
            id,
            endpoint,
            usage,
            e2e,
            output,
        };
        self.share(from, news);
        self.out.in_flight -= 1;
        self.admission_ended(id);
        if !self.is_warmup(id) {
            self.follow_up(tag, workload, rng);
        }
    }
}
