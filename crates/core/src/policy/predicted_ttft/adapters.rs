//! The LoRA term of the prediction: what a request for an adapter waits on each endpoint beyond
//! its queue ([`crate::lora::wait_seconds`]: the adapter's load, the drain of another adapter's
//! batch). Taking an engine's last free slot for an adapter that already runs elsewhere also
//! carries half a stall: the next request for another adapter there would wait behind it, so
//! an adapter spreads to a second engine only when its own engine is that far behind (without
//! it, an adapter whose engine had a short queue took over every idle engine and left the other
//! adapters stalling behind it: `scripts/lora-bench.sh`, docs/lora.md). The engines' reports are a scrape old, so the adapters this router sent each endpoint
//! since its last scrape count as queued there: two requests for new adapters in one scrape
//! interval do not both see the same free slot.

use super::PredictedTtft;
use crate::fasthash::IntMap;
use crate::lora::{wait_seconds, AdapterState, Affinity, Outlook};
use crate::policy::Query;
use crate::LoadView;
use crate::{EndpointId, EndpointView, Nanos};

/// Adapters sent to each endpoint, with when, since its last scrape.
#[derive(Debug, Default)]
pub(super) struct SentAdapters {
    sent: IntMap<EndpointId, Vec<(String, Nanos)>>,
}

impl SentAdapters {
    /// A request for `adapter` went to `endpoint` at `at`.
    pub(super) fn dispatched(&mut self, endpoint: EndpointId, adapter: &str, at: Nanos) {
        self.sent
            .entry(endpoint)
            .or_default()
            .push((adapter.to_owned(), at));
    }

    /// The endpoint left the pool.
    pub(super) fn remove(&mut self, endpoint: EndpointId) {
        self.sent.remove(&endpoint);
    }

    /// `view`'s adapters as reported, plus those sent there after the report; `None` when its
    /// engine reports none. Entries the report already covers are dropped.
    pub(super) fn state(&mut self, view: &EndpointView) -> Option<AdapterState> {
        let reported = view.adapters.as_ref()?;
        let Some(sent) = self.sent.get_mut(&view.id) else {
            return Some(reported.clone());
        };
        sent.retain(|(_, at)| *at > view.observed_at);
        let mut state = reported.clone();
        for (adapter, _) in sent.iter() {
            if !state.running.contains(adapter) && !state.waiting.contains(adapter) {
                state.waiting.push(adapter.clone());
            }
        }
        Some(state)
    }
}

impl PredictedTtft {
    /// Seconds a LoRA request waits at `e` for its adapter ([`adapters`]); 0 for a base-model
    /// request or when `lora_aware` is off.
    pub(super) fn adapter_wait(
        &mut self,
        query: &Query<'_>,
        e: &crate::EndpointView,
        running_at: &[EndpointId],
    ) -> f64 {
        let Some(adapter) = query.request.adapter.as_deref() else {
            return 0.0;
        };
        if !self.config.lora_aware {
            return 0.0;
        }
        let state = self.adapters.state(e);
        let costs = (
            self.config.lora_load_ms / 1e3,
            self.config.lora_stall_ms / 1e3,
        );
        let elsewhere = running_at.iter().any(|&id| id != e.id);
        let (wait, affinity) = wait(state.as_ref(), adapter, elsewhere, costs);
        match &e.lora_outlook {
            Some(o) if affinity != Affinity::Unknown => gated_wait(o, costs),
            _ => wait,
        }
    }

    /// The routable endpoints where the request's adapter runs (none for a base-model request
    /// or when `lora_aware` is off).
    pub(super) fn running_at(&mut self, query: &Query<'_>, view: &LoadView<'_>) -> Vec<EndpointId> {
        let Some(adapter) = query.request.adapter.as_deref() else {
            return Vec::new();
        };
        if !self.config.lora_aware {
            return Vec::new();
        }
        view.routable()
            .map(|i| &query.fleet.views()[i])
            .filter(|e| {
                self.adapters
                    .state(e)
                    .is_some_and(|s| s.affinity(adapter) == Affinity::Running)
            })
            .map(|e| e.id)
            .collect()
    }
}

/// Seconds a request for `adapter` is predicted to wait at an endpoint in `state` beyond its
/// queue, plus the slot externality when the adapter `runs_elsewhere`, and its standing there
/// (`Unknown` where the engine reports nothing).
pub(super) fn wait(
    state: Option<&AdapterState>,
    adapter: &str,
    runs_elsewhere: bool,
    (load, stall): (f64, f64),
) -> (f64, Affinity) {
    let Some(state) = state else {
        return (0.0, Affinity::Unknown);
    };
    let affinity = state.affinity(adapter);
    let mut wait = wait_seconds(affinity, state.stalled(), load, stall);
    if affinity == Affinity::FreeSlot && runs_elsewhere && state.last_slot() {
        wait += stall / 2.0;
    }
    (wait, affinity)
}

/// Seconds a request for an adapter waits at an endpoint where the LoRA gate serves adapters
/// in turns ([`crate::lora::LoraGate`]), by the gate's account there, fresher than the engine's
/// report: the batches in the way drain by the run learned there (`lora_stall` until one is
/// learned), each adapter queued ahead takes a turn, and a held request first waits for its
/// own adapter's batch to drain. Taking the slot of another adapter costs a turn for each of
/// its requests per request of this one (their ratio of traffic): the externality that keeps
/// a busy adapter on its engine.
pub(super) fn gated_wait(o: &Outlook, (load, stall): (f64, f64)) -> f64 {
    let turn = o.turn.map_or(stall, Nanos::as_secs_f64);
    let ahead = f64::from(o.ahead) * turn;
    let displace = turn * o.displaces;
    if o.held {
        let own = o.own_drain.map_or(turn / 2.0, Nanos::as_secs_f64);
        return own + ahead.max(turn) + load;
    }
    if o.runs {
        return 0.0;
    }
    if !o.full {
        return load + displace;
    }
    o.others_drain.map_or(stall, Nanos::as_secs_f64) + ahead + load + displace
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dispatch_since_the_scrape_takes_the_free_slot() {
        let mut view = EndpointView::new(EndpointId(0));
        view.observed_at = Nanos(10);
        view.adapters = Some(AdapterState {
            max_loras: Some(1),
            ..AdapterState::default()
        });
        let mut sent = SentAdapters::default();
        let free = sent.state(&view).unwrap();
        let costs = (0.2, 1.0);
        assert_eq!(
            wait(Some(&free), "b", false, costs),
            (0.2, Affinity::FreeSlot)
        );
        assert_eq!(
            wait(Some(&free), "b", true, costs),
            (0.7, Affinity::FreeSlot),
            "b runs elsewhere: taking the last slot here costs others half a stall"
        );
        sent.dispatched(view.id, "a", Nanos(20));
        let taken = sent.state(&view).unwrap();
        assert_eq!(wait(Some(&taken), "b", false, costs), (1.2, Affinity::Full));
        assert_eq!(wait(Some(&taken), "a", false, costs).1, Affinity::Waiting);
        view.observed_at = Nanos(30);
        assert!(
            sent.state(&view).unwrap().waiting.is_empty(),
            "the scrape covers it"
        );
        assert_eq!(wait(None, "a", false, costs), (0.0, Affinity::Unknown));
    }
}

#[cfg(test)]
mod gated_tests {
    use super::*;

    #[test]
    fn the_gate_s_outlook_prices_holds_drains_and_displacement() {
        let costs = (0.1, 1.5);
        let ms = Nanos::from_millis;
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        let held = Outlook {
            held: true,
            runs: true,
            own_drain: Some(ms(300)),
            ahead: 1,
            turn: Some(ms(800)),
            ..Outlook::default()
        };
        // Its own batch drains, `b` takes a turn, then the adapter loads again.
        assert!(close(gated_wait(&held, costs), 1.2));
        let full = Outlook {
            full: true,
            others_drain: Some(ms(200)),
            turn: Some(ms(800)),
            displaces: 2.0,
            ..Outlook::default()
        };
        // The running batch drains, the adapter loads, and the busier one loses two turns.
        assert!(close(gated_wait(&full, costs), 1.9));
        let free = Outlook::default();
        assert!(close(gated_wait(&free, costs), 0.1));
        let runs = Outlook {
            runs: true,
            ..Outlook::default()
        };
        assert!(close(gated_wait(&runs, costs), 0.0));
        // Nothing learned yet: the configured stall stands in for the drain.
        let unknown = Outlook {
            full: true,
            ..Outlook::default()
        };
        assert!(close(gated_wait(&unknown, costs), 1.6));
    }
}

#[cfg(test)]
mod policy_tests {
    use crate::lora::AdapterState;
    use crate::policy::predicted_ttft::Config;
    use crate::router::accept_all;
    use crate::{EndpointId, EndpointView, Nanos, Observation, PolicyConfig, Request, Routing};

    fn routing(aware: bool) -> Routing {
        let config = Config {
            lora_aware: aware,
            ..Config::default()
        };
        let mut r = Routing::new(&PolicyConfig::PredictedTtft(config), 1);
        for i in 0..2 {
            r.router_mut().add(EndpointView::new(EndpointId(i)));
        }
        // Endpoint 0 runs adapter `a` and has two more requests of ours to prefill; endpoint 1
        // runs `b` alone.
        for (i, adapter) in ["a", "b"].into_iter().enumerate() {
            let id = EndpointId(i as u32);
            let observation = Observation {
                running: 1,
                ..Observation::default()
            };
            r.observed(id, observation, Nanos(1));
            r.router_mut().set_adapters(
                id,
                Some(AdapterState {
                    max_loras: Some(1),
                    running: vec![adapter.to_owned()],
                    ..AdapterState::default()
                }),
            );
        }
        let only_0 = |v: &EndpointView| v.id == EndpointId(0);
        for id in 100..102 {
            let base = Request::from_tokens(id, (0..512).map(|t| t + id as u32 * 1_000).collect());
            r.route(&base, Nanos(2), &only_0);
        }
        r
    }

    fn for_adapter(id: u64, adapter: &str) -> Request {
        Request {
            adapter: Some(adapter.to_owned()),
            ..Request::from_tokens(id, (0..512).map(|t| t + id as u32 * 1_000).collect())
        }
    }

    #[test]
    fn a_request_goes_where_its_adapter_runs_unless_blind() {
        let mut aware = routing(true);
        let d = aware.route(&for_adapter(1, "a"), Nanos(2), &accept_all);
        assert_eq!(d.endpoint(), Some(EndpointId(0)), "a runs on 0, busier");
        let d = aware.route(&for_adapter(2, "b"), Nanos(2), &accept_all);
        assert_eq!(d.endpoint(), Some(EndpointId(1)));
        let mut blind = routing(false);
        let d = blind.route(&for_adapter(1, "a"), Nanos(2), &accept_all);
        assert_eq!(
            d.endpoint(),
            Some(EndpointId(1)),
            "blind: the less loaded one"
        );
    }
}
