//! What the LoRA gate knows of an endpoint, for pricing a request for an adapter there
//! ([`Outlook`]; `predicted_ttft`'s adapter term adds it to its prediction).

use super::gate::{running, Book, LoraGate, Report};
use crate::{EndpointId, Nanos};
use serde::{Deserialize, Serialize};

/// What sending a request for an adapter to one endpoint would meet, for pricing it: the
/// policy adds these to its prediction (`predicted_ttft`'s adapter term). The gate's own
/// account is fresher than the engine's last report: it sees each of its requests' first token
/// and end as they happen.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Outlook {
    /// The gate would hold it here: another adapter waits behind the batch this one runs.
    pub held: bool,
    /// The adapter runs here: the request joins its batch.
    pub runs: bool,
    /// It does not run here and every slot is taken by running or queued adapters (as llm-d
    /// counts them): the request waits for a turn.
    pub full: bool,
    /// Until the adapter's own requests here finish by the learned run (the hold's length).
    pub own_drain: Option<Nanos>,
    /// Until the other running adapters' requests here finish by the learned run; zero when no
    /// other adapter runs, `None` when one runs that none of this gateway's requests show.
    pub others_drain: Option<Nanos>,
    /// Other adapters queued here and not running, each of which runs a turn first.
    pub ahead: u32,
    /// One request's run from first token to end, learned here.
    pub turn: Option<Nanos>,
    /// The traffic of the adapter whose slot the request would take (running here, else
    /// queued to run, else the last to run on an idle engine) over this adapter's: that many of
    /// its requests wait a turn per request of this one, so a busy adapter keeps its engine and
    /// a rare one does not take it. 0 when no slot would be taken from another adapter.
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
        let mut queued: Vec<&str> = book
            .entries
            .values()
            .filter(|e| e.first.is_none())
            .map(|e| e.adapter.as_str())
            .filter(|a| !running.contains(a))
            .collect();
        queued.sort_unstable();
        queued.dedup();
        let others_run = running.iter().any(|r| *r != adapter);
        // Who holds the slots: the running adapters, else those queued to run, else the last to
        // run here (by this gateway's account, else the engine's report).
        let holders: Vec<&str> = if !running.is_empty() {
            running.clone()
        } else if !queued.is_empty() {
            queued.clone()
        } else if let Some((last, _)) = book.last_end.iter().max_by_key(|(_, at)| **at) {
            vec![last.as_str()]
        } else {
            state
                .running
                .iter()
                .chain(&state.recent)
                .map(String::as_str)
                .collect()
        };
        let runs = running.contains(&adapter);
        let mut active = running.clone();
        active.extend(&queued);
        active.sort_unstable();
        active.dedup();
        Some(Outlook {
            held: self.config().hold && self.blocker(endpoint, adapter, report).is_some(),
            runs,
            full: !runs && active.iter().filter(|a| **a != adapter).count() >= max,
            own_drain: drain(true),
            others_drain: if others_run {
                drain(false)
            } else {
                Some(Nanos::ZERO)
            },
            ahead: queued.iter().filter(|a| **a != adapter).count() as u32,
            turn,
            displaces: self.displaces(adapter, &holders, max, now),
        })
    }

    /// [`Outlook::displaces`] for a request for `adapter` where `holders` hold the slots.
    fn displaces(&self, adapter: &str, holders: &[&str], max: usize, now: Nanos) -> f64 {
        if holders.contains(&adapter) || holders.len() < max {
            return 0.0;
        }
        let mine = self.rate(adapter, now).max(1.0);
        let theirs = holders
            .iter()
            .map(|h| self.rate(h, now))
            .fold(0.0, f64::max);
        theirs / mine
    }
}
