//! What the LoRA gate knows of an endpoint, for pricing a request for an adapter there
//! ([`Outlook`]; `predicted_ttft`'s adapter term adds it to its prediction).

use super::gate::{running, Book, LoraGate, Report};
use crate::{EndpointId, Nanos};
use serde::{Deserialize, Serialize};

/// What sending a request for an adapter to one endpoint would meet, for pricing it: the
/// policy adds these to its prediction (`predicted_ttft`'s adapter term).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Outlook {
    /// The gate would hold it here: another adapter waits behind the batch this one runs.
    pub held: bool,
    /// Until the adapter's own requests here finish by the learned run (the hold's length).
    pub own_drain: Option<Nanos>,
    /// Until the other running adapters' requests here finish by the learned run.
    pub others_drain: Option<Nanos>,
    /// Other adapters waiting here, each of which runs a turn first.
    pub ahead: u32,
    /// One request's run from first token to end, learned here.
    pub turn: Option<Nanos>,
    /// How many times this adapter's traffic the adapter whose slot the request would take
    /// gets (running here, or the last to run on an idle engine), when that is more than one:
    /// that many of its requests would wait a turn per request of this one, so the busiest
    /// adapter keeps its engine. 0 when no busier adapter is displaced.
    pub displaces: f64,
}

impl LoraGate {
    /// What a request for `adapter` would meet at `endpoint` (see [`Outlook`]); `None` when
    /// the gate is off or the engine reports no adapter slots.
    pub fn outlook(
        &self,
        adapter: &str,
        endpoint: EndpointId,
        report: Report<'_>,
        now: Nanos,
    ) -> Option<Outlook> {
        let (state, _) = report?;
        let max = state.max_loras? as usize;
        if !self.enabled() {
            return None;
        }
        let empty = Book::default();
        let book = self.books.get(&endpoint).unwrap_or(&empty);
        let running = running(book, report);
        let turn = book.turn.map(Nanos::from_secs_f64);
        let drain = |own: bool| {
            let run = turn?;
            book.entries
                .values()
                .filter(|e| (e.adapter == adapter) == own)
                .filter_map(|e| e.first)
                .map(|first| (first + run) - now)
                .max()
        };
        let mut waiting: Vec<&str> = book
            .entries
            .values()
            .filter(|e| e.first.is_none() && e.adapter != adapter)
            .map(|e| e.adapter.as_str())
            .filter(|a| !running.contains(a))
            .collect();
        waiting.sort_unstable();
        waiting.dedup();
        let holders: Vec<&str> = if running.is_empty() && waiting.is_empty() {
            state.recent.iter().map(String::as_str).collect()
        } else {
            running.clone()
        };
        let mine = self.rate(adapter, now).max(1.0);
        let displaces = if holders.contains(&adapter) || holders.len() < max {
            0.0
        } else {
            let busiest = holders
                .iter()
                .map(|h| self.rate(h, now))
                .fold(0.0, f64::max);
            if busiest > mine {
                busiest / mine
            } else {
                0.0
            }
        };
        Some(Outlook {
            held: self.blocker(endpoint, adapter, report).is_some(),
            own_drain: drain(true),
            others_drain: drain(false),
            ahead: waiting.len() as u32,
            turn,
            displaces,
        })
    }
}
