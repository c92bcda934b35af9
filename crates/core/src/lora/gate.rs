//! Gated admission of LoRA adapters: the gateway's answer to the engine's exhaustive service.
//!
//! With every adapter slot of an engine taken (vLLM `--max-loras`), vLLM's scheduler skips a
//! waiting request whose adapter is not in the batch and admits the running adapters' new
//! requests past it (vLLM `v1/core/sched/scheduler.py`, the `max_loras` check), so the waiting
//! adapter gets its turn only once the running ones stop getting work: exhaustive service,
//! whose waits grow with the running adapter's traffic. The gate turns it into gated service
//! (each adapter's turn ends with the batch it had when another started waiting): while a
//! request this gateway sent for adapter X waits at an engine behind the running batch, a new
//! request for a running adapter Y is not sent there. The policy may send it to another
//! endpoint (its price there says whether that is better), or it is held at the gateway until
//! X's turn starts (X's first token, a scrape that shows X running, X's requests gone) or
//! `max_hold_ms` passes, whichever comes first, and held requests go in arrival order.
//!
//! A request is held once: after its hold it passes wherever it goes, and a hold that reached
//! its bound keeps away from the endpoint it was held for when another can take it, so the
//! batch that made X wait drains however long its requests run and X's turn comes.
//!
//! Only this gateway's own requests count as waiting: they are the ones whose first token it
//! sees, so every hold it makes ends on an event it will observe (or on the bound).

use super::AdapterState;
use crate::{EndpointId, Nanos};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Adapter arrival rates decay with this time constant: long enough that a few requests a
/// second make a steady ratio between adapters (placement follows it), short enough to follow
/// a shift in the mix within a minute.
const RATE_TAU_SECS: f64 = 30.0;
/// Weight of a new sample in the learned run of one request (an exponential moving average).
const TURN_ALPHA: f64 = 0.2;

/// The `lora.gate` settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GateConfig {
    /// Hold a running adapter's new requests while another adapter waits behind its batch.
    pub enabled: bool,
    /// The longest a request is held.
    pub max_hold_ms: u64,
    /// Hold requests; off, the gate only prices what each endpoint would make a request wait
    /// (its outlook) and every request goes where the policy sends it.
    pub hold: bool,
}

impl Default for GateConfig {
    fn default() -> Self {
        GateConfig {
            enabled: true,
            // Twice `predicted_ttft`'s `lora_stall_ms` default (one request's decode on the
            // default engine model): a hold normally ends when the running batch drains, within
            // one request's run.
            max_hold_ms: 3_000,
            hold: true,
        }
    }
}

/// Why the gate let a request through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pass {
    /// No adapter waits behind this one at the endpoint.
    Open,
    /// It was held, and the adapter it waited for got its turn (or went).
    Released,
    /// It was held for `max_hold_ms`.
    Bound,
}

impl Pass {
    /// `open`, `released` or `bound`.
    pub fn label(self) -> &'static str {
        match self {
            Pass::Open => "open",
            Pass::Released => "released",
            Pass::Bound => "bound",
        }
    }
}

/// A request held at the gateway.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Hold {
    /// The endpoint it would have gone to.
    pub endpoint: EndpointId,
    /// The adapter waiting there behind the batch this request's adapter runs.
    pub behind: String,
    /// When it was first held.
    pub since: Nanos,
    /// When the bound releases it.
    pub until: Nanos,
}

/// The gate's answer for a request about to go to an endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Send it; `held` says where and behind which adapter it was held before, if it was.
    Send {
        /// Why it may go.
        pass: Pass,
        /// Its earlier hold.
        held: Option<Hold>,
    },
    /// Hold it.
    Hold(Hold),
}

#[derive(Clone, Debug)]
pub(super) struct Entry {
    pub(super) adapter: String,
    sent: Nanos,
    pub(super) first: Option<Nanos>,
}

/// This gateway's adapter requests at one endpoint.
#[derive(Clone, Debug, Default)]
pub(super) struct Book {
    pub(super) entries: BTreeMap<u64, Entry>,
    /// When each adapter's last request here ended: a report older than that is stale about it.
    pub(super) last_end: BTreeMap<String, Nanos>,
    /// Learned first-token-to-end seconds.
    pub(super) turn: Option<f64>,
}

#[derive(Clone, Debug)]
struct Held {
    hold: Hold,
    released: bool,
}

/// The gate's state: each endpoint's adapter requests, the held requests, adapter rates.
#[derive(Clone, Debug, Default)]
pub struct LoraGate {
    config: GateConfig,
    pub(super) books: BTreeMap<EndpointId, Book>,
    held: BTreeMap<u64, Held>,
    /// Each adapter's decayed arrival count and when it was last updated.
    rates: BTreeMap<String, (f64, Nanos)>,
}

/// An engine's last report with the time it was taken.
pub type Report<'a> = Option<(&'a AdapterState, Nanos)>;

impl LoraGate {
    /// A gate with `config`.
    pub fn new(config: GateConfig) -> Self {
        LoraGate {
            config,
            ..LoraGate::default()
        }
    }

    /// Its settings.
    pub fn config(&self) -> &GateConfig {
        &self.config
    }

    /// Whether it holds requests.
    pub fn enabled(&self) -> bool {
        self.config.enabled
    }

    /// New settings; turned off, every held request is released.
    pub fn set_config(&mut self, config: GateConfig) -> Vec<u64> {
        self.config = config;
        if self.config.enabled {
            return Vec::new();
        }
        self.release_where(|_| true)
    }

    fn bound(&self) -> Nanos {
        Nanos::from_millis(self.config.max_hold_ms)
    }

    /// Whether `request` has been held (it counts once towards anything counted per request).
    pub fn seen(&self, request: u64) -> bool {
        self.held.contains_key(&request)
    }

    /// Where a request held to its bound must not go when another endpoint can take it.
    pub fn avoid(&self, request: u64, now: Nanos) -> Option<EndpointId> {
        let h = self.held.get(&request)?;
        (!h.released && now >= h.hold.until).then_some(h.hold.endpoint)
    }

    /// The gate's answer for `request`, naming `adapter`, about to go to `endpoint` whose
    /// engine last reported `report`.
    pub fn check(
        &mut self,
        request: u64,
        adapter: &str,
        endpoint: EndpointId,
        report: Report<'_>,
        now: Nanos,
    ) -> Verdict {
        if let Some(h) = self.held.get(&request) {
            let pass = if h.released {
                Some(Pass::Released)
            } else if now >= h.hold.until {
                Some(Pass::Bound)
            } else {
                None
            };
            if let Some(pass) = pass {
                let held = self.held.remove(&request).map(|h| h.hold);
                return Verdict::Send { pass, held };
            }
        }
        let behind = (self.config.hold && self.config.enabled)
            .then(|| self.blocker(endpoint, adapter, report));
        match behind.flatten() {
            Some(behind) => {
                let since = self.held.get(&request).map_or(now, |h| h.hold.since);
                let hold = Hold {
                    endpoint,
                    behind,
                    since,
                    until: since + self.bound(),
                };
                self.held.insert(
                    request,
                    Held {
                        hold: hold.clone(),
                        released: false,
                    },
                );
                Verdict::Hold(hold)
            }
            None => {
                let held = self.held.remove(&request).map(|h| h.hold);
                let pass = if held.is_some() {
                    Pass::Released
                } else {
                    Pass::Open
                };
                Verdict::Send { pass, held }
            }
        }
    }

    /// The oldest adapter waiting at `endpoint` behind a batch in which `adapter` runs, if any:
    /// every slot is taken, `adapter` is among the running, and a request of ours for another
    /// adapter awaits its first token while that adapter does not run.
    pub(super) fn blocker(
        &self,
        endpoint: EndpointId,
        adapter: &str,
        report: Report<'_>,
    ) -> Option<String> {
        let (state, _) = report?;
        let max = state.max_loras? as usize;
        let book = self.books.get(&endpoint)?;
        let running = running(book, report);
        if running.len() < max || !running.contains(&adapter) {
            return None;
        }
        book.entries
            .values()
            .filter(|e| e.first.is_none() && e.adapter != adapter)
            .filter(|e| !running.contains(&e.adapter.as_str()))
            .min_by_key(|e| e.sent)
            .map(|e| e.adapter.clone())
    }

    /// A request for `adapter` went to `endpoint` at `now`.
    pub fn dispatched(&mut self, request: u64, adapter: &str, endpoint: EndpointId, now: Nanos) {
        self.books.entry(endpoint).or_default().entries.insert(
            request,
            Entry {
                adapter: adapter.to_owned(),
                sent: now,
                first: None,
            },
        );
    }

    /// A stream's first token for `request` arrived from `endpoint`: its adapter's turn there
    /// has started. The held requests this releases, in arrival order.
    pub fn first_token(
        &mut self,
        request: u64,
        endpoint: EndpointId,
        report: Report<'_>,
        now: Nanos,
    ) -> Vec<u64> {
        let Some(e) = self
            .books
            .get_mut(&endpoint)
            .and_then(|b| b.entries.get_mut(&request))
        else {
            return Vec::new();
        };
        e.first = Some(now);
        self.releases(endpoint, report)
    }

    /// `request` ended at `endpoint` (`completed` normally, else failed or cancelled). The held
    /// requests this releases, in arrival order.
    pub fn ended(
        &mut self,
        request: u64,
        endpoint: EndpointId,
        (completed, report): (bool, Report<'_>),
        now: Nanos,
    ) -> Vec<u64> {
        let Some(book) = self.books.get_mut(&endpoint) else {
            return Vec::new();
        };
        let Some(e) = book.entries.remove(&request) else {
            return Vec::new();
        };
        if let (true, Some(first)) = (completed, e.first) {
            let run = (now - first).as_secs_f64();
            book.turn = Some(book.turn.map_or(run, |t| t + TURN_ALPHA * (run - t)));
        }
        book.last_end.insert(e.adapter, now);
        self.releases(endpoint, report)
    }

    /// `endpoint`'s engine reported its adapters. The held requests this releases.
    pub fn observed(&mut self, endpoint: EndpointId, report: Report<'_>) -> Vec<u64> {
        self.releases(endpoint, report)
    }

    /// The endpoint left the pool: what was held for it is released.
    pub fn remove(&mut self, endpoint: EndpointId) -> Vec<u64> {
        self.books.remove(&endpoint);
        self.release_where(|h| h.endpoint == endpoint)
    }

    /// A held request's client went away.
    pub fn forget(&mut self, request: u64) {
        self.held.remove(&request);
    }

    /// Requests held now.
    pub fn held(&self) -> usize {
        self.held.values().filter(|h| !h.released).count()
    }

    /// Marks the requests held for `endpoint` whose reason went as released, and names them in
    /// arrival order.
    fn releases(&mut self, endpoint: EndpointId, report: Report<'_>) -> Vec<u64> {
        let mut gone: Vec<(Nanos, u64)> = Vec::new();
        for (&id, h) in &self.held {
            if h.released || h.hold.endpoint != endpoint {
                continue;
            }
            let waits = self.book_waits(endpoint, &h.hold.behind, report);
            if !waits {
                gone.push((h.hold.since, id));
            }
        }
        gone.sort_unstable();
        for (_, id) in &gone {
            if let Some(h) = self.held.get_mut(id) {
                h.released = true;
            }
        }
        gone.into_iter().map(|(_, id)| id).collect()
    }

    /// Whether `behind` still waits at `endpoint`: a request of ours for it awaits its first
    /// token there and it does not run.
    fn book_waits(&self, endpoint: EndpointId, behind: &str, report: Report<'_>) -> bool {
        let Some(book) = self.books.get(&endpoint) else {
            return false;
        };
        let queued = book
            .entries
            .values()
            .any(|e| e.adapter == behind && e.first.is_none());
        queued && !running(book, report).contains(&behind)
    }

    fn release_where(&mut self, pick: impl Fn(&Hold) -> bool) -> Vec<u64> {
        let mut gone: Vec<(Nanos, u64)> = self
            .held
            .iter()
            .filter(|(_, h)| !h.released && pick(&h.hold))
            .map(|(&id, h)| (h.hold.since, id))
            .collect();
        gone.sort_unstable();
        for (_, id) in &gone {
            if let Some(h) = self.held.get_mut(id) {
                h.released = true;
            }
        }
        gone.into_iter().map(|(_, id)| id).collect()
    }

    /// A request for `adapter` arrived (counted once: a held request picking again is not new).
    pub fn arrived(&mut self, request: u64, adapter: &str, now: Nanos) {
        if self.held.contains_key(&request) {
            return;
        }
        let decayed = self.rate(adapter, now);
        self.rates.insert(adapter.to_owned(), (decayed + 1.0, now));
    }

    /// `adapter`'s arrivals, each weighted by how long ago it came (decay [`RATE_TAU_SECS`]).
    pub(super) fn rate(&self, adapter: &str, now: Nanos) -> f64 {
        self.rates.get(adapter).map_or(0.0, |&(count, at)| {
            count * (-(now - at).as_secs_f64() / RATE_TAU_SECS).exp()
        })
    }
}

/// The adapters running at an endpoint: those of our requests past their first token, and
/// those its engine reported running unless one of ours for it ended after the report.
pub(super) fn running<'a>(book: &'a Book, report: Report<'a>) -> Vec<&'a str> {
    let mut out: Vec<&str> = book
        .entries
        .values()
        .filter(|e| e.first.is_some())
        .map(|e| e.adapter.as_str())
        .collect();
    if let Some((state, at)) = report {
        for a in &state.running {
            let stale = book.last_end.get(a).is_some_and(|&end| end >= at);
            if !stale {
                out.push(a.as_str());
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

#[cfg(test)]
#[path = "gate_tests.rs"]
mod tests;
