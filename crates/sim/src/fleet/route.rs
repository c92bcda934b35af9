//! Sending a request through its router (the dispatch core, or the oracle) and onto a replica.

use super::{align, share, Kind, RequestRecord, Sim};
use crate::model::SeqRequest;
use kvgate_core::dispatch::Attempt;
use kvgate_core::{EndpointId, Nanos, Reason, Request};

impl Sim<'_> {
    /// Sends request `id` (its record already written) through its router, or the oracle.
    pub(super) fn route(&mut self, id: u64, prompt: Vec<u32>, output: u32) {
        self.route_among(id, prompt, output, &[]);
    }

    /// [`Self::route`] to a replica not `closed` (indexed by replica; missing: open).
    pub(super) fn route_among(&mut self, id: u64, prompt: Vec<u32>, output: u32, closed: &[bool]) {
        let now = self.now;
        let is_closed = |i: usize| closed.get(i).copied().unwrap_or(false);
        let rec = self.out.records[id as usize];
        // A continuation's prediction is not the request's: its first token came long ago.
        let first_dispatch = rec.first_token.is_none();
        let (endpoint, label, prompt) = if self.config.oracle {
            let (i, ttft) = self.oracle_pick(&prompt, &is_closed);
            if first_dispatch {
                self.out.records[id as usize].predicted_ttft_ms = Some(ttft.as_millis_f64() as f32);
            }
            (EndpointId(i as u32), "predicted", prompt)
        } else {
            let Some(picked) = self.core_pick(id, &rec, prompt, closed, first_dispatch) else {
                return;
            };
            picked
        };
        self.out.reasons.add(label);
        let i = endpoint.0 as usize;
        self.out.records[id as usize].replica = endpoint.0;
        self.out.in_flight += 1;
        self.out.replicas[i].assigned += 1;
        if let Some(r) = &mut self.out.records[id as usize].resumed {
            if r.first_token.is_none() {
                r.sent = Some(now);
                r.prompt_tokens = prompt.len() as u32;
                self.gate.enter(endpoint);
            }
        } else if self.is_warmup(id) {
            // Its TTFT, which calibrates the router, runs from here, not from the loss.
            self.out.records[id as usize].arrival = now;
            self.gate.enter(endpoint);
            if self.warmups.get(&id).is_some_and(|w| w.is_whole_turn()) {
                self.out.warmups_sent += 1;
            }
        }
        let replica = &mut self.replicas[i];
        replica.engine.submit(SeqRequest {
            id,
            prompt,
            max_output_tokens: output,
        });
        if !replica.stepping {
            replica.stepping = true;
            let at = align(now, replica.quantum);
            self.push(at, Kind::Step, i as u64);
        }
    }
    /// Request `id`'s pick by its router's dispatch core, among replicas not `closed`: the
    /// replica, the reason's label and the prompt back; `None` (counted as rejected) when no
    /// replica would take it.
    fn core_pick(
        &mut self,
        id: u64,
        rec: &RequestRecord,
        prompt: Vec<u32>,
        closed: &[bool],
        first_dispatch: bool,
    ) -> Option<(EndpointId, &'static str, Vec<u32>)> {
        let now = self.now;
        let is_closed = |i: usize| closed.get(i).copied().unwrap_or(false);
        let router_index = rec.router as usize;
        if self.config.scrape_interval == Nanos::ZERO {
            self.scrape(router_index);
        }
        let mut request = request_of(rec, id, prompt, self.config.session_names);
        // Replicas this request already broke on are tried ones: a continuation goes
        // elsewhere, as the gateway's resume does.
        let tried: Vec<EndpointId> = (0..closed.len())
            .filter(|&i| is_closed(i))
            .map(|i| EndpointId(i as u32))
            .collect();
        let attempt = if tried.is_empty() {
            Attempt::First
        } else {
            Attempt::Resume
        };
        let picked = self.routers[router_index].pick(&request, &tried, attempt, now);
        let route = match picked {
            Ok(picked) => picked.route,
            Err(_) => {
                self.out.rejected += 1;
                self.out.records[id as usize].failed = true;
                self.admission_ended(id);
                return None;
            }
        };
        if let (
            Reason::PredictedTtft {
                ttft_ms,
                cached_tokens,
            },
            true,
        ) = (&route.reason, first_dispatch)
        {
            let rec = &mut self.out.records[id as usize];
            rec.predicted_ttft_ms = Some(*ttft_ms as f32);
            rec.predicted_cached = Some(*cached_tokens);
        }
        if self.config.share.is_some() {
            let news = share::News::Dispatched(Box::new(request.clone()), route.endpoint);
            self.share(router_index, news);
        }
        let prompt = request.prompt.tokens.take().unwrap_or_default();
        Some((route.endpoint, route.reason.label(), prompt))
    }
}

/// The request its router sees for record `rec`'s prompt `prompt`: its tenant and, when the
/// clients name sessions (`named`), its session keyed as every router keys them.
pub(in crate::fleet) fn request_of(
    rec: &RequestRecord,
    id: u64,
    prompt: Vec<u32>,
    named: bool,
) -> Request {
    let mut request = Request::from_tokens(id, prompt);
    if let Some(t) = rec.tenant {
        request = request.with_tenant(format!("tenant-{t}"));
    }
    if let Some(s) = rec.session.filter(|_| named) {
        request = request.with_session(format!("session-{s}"));
    }
    request
}
