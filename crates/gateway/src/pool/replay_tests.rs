//! The differential test of the dispatch core's two drivers: a trace the simulator's fleet
//! recorded (`test-data/dispatch/trace.json`, kept current by the simulator's own test) is
//! replayed through the gateway's pool on a manual clock, and every pick must land where the
//! simulated router's did, for the same reason.

use super::{Clock, Pool, PoolMetrics, Target};
use crate::config::{Config, EndpointConfig};
use kvgate_core::dispatch::trace::{attempt_of, Trace, TraceEvent};
use kvgate_core::dispatch::End;
use kvgate_core::index::Prediction;
use kvgate_core::{EndpointId, Nanos};
use std::collections::HashMap;
use std::time::Duration;

fn recorded() -> Trace {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../test-data/dispatch/trace.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn pool_for(trace: &Trace) -> Pool {
    let mut config = Config {
        policy: trace.policy.clone(),
        ..Config::default()
    };
    if let Some(n) = trace.engine_event_entries {
        config.kv_events.max_entries_per_endpoint = n;
    }
    Pool::new(
        &config.pool_settings(),
        Clock::manual(),
        PoolMetrics::register(&mut Default::default()),
        trace.seed,
    )
}

/// What the replay keeps between events: each open dispatch's target, each peer dispatch's
/// prediction.
#[derive(Default)]
struct Open {
    own: HashMap<(u64, EndpointId), Target>,
    peers: HashMap<(u64, EndpointId), Option<Prediction>>,
}

/// Feeds one event to the pool; a pick's decision comes back.
fn feed(pool: &Pool, open: &mut Open, at: Nanos, event: &TraceEvent) -> Option<String> {
    match event {
        TraceEvent::Join { endpoint, weight } => {
            let mut e = EndpointConfig::from_url(format!("http://127.0.0.1:{}", 9000 + endpoint.0));
            e.weight = *weight;
            assert_eq!(pool.add(e), *endpoint);
        }
        TraceEvent::Leave { endpoint } => assert!(pool.remove(*endpoint)),
        TraceEvent::Scrape {
            endpoint,
            observation,
        } => {
            pool.observed(*endpoint, Some(*observation), at);
        }
        TraceEvent::Tokens { endpoint } => {
            // A stream may deliver its last tokens after its endpoint left the pool.
            if let Some(cadence) = pool.cadence_of(*endpoint) {
                cadence.tick(at);
            }
        }
        TraceEvent::Pick {
            request,
            tried,
            attempt,
            decision,
        } => {
            let picked = pool.pick(request, tried, attempt_of(attempt).unwrap());
            let got = picked.as_ref().ok().map(|t| (t.id, t.reason.to_owned()));
            if let Ok(target) = picked {
                open.own.insert((request.id, target.id), target);
            }
            return (got != *decision).then(|| {
                format!(
                    "request {}: pool {got:?}, simulator {decision:?}",
                    request.id
                )
            });
        }
        TraceEvent::FirstToken {
            request,
            endpoint,
            ttft,
        } => {
            let Some(target) = open.own.get(&(*request, *endpoint)) else {
                return Some(format!(
                    "request {request}: a first token at {endpoint} it was not sent to"
                ));
            };
            let ticket = target.ticket;
            pool.first_token(*request, *endpoint, ticket, *ttft, true);
        }
        TraceEvent::Completed {
            request,
            endpoint,
            latency,
            output_tokens,
            usage,
        } => {
            let Some(target) = open.own.remove(&(*request, *endpoint)) else {
                return Some(format!("request {request}: completed at {endpoint} unsent"));
            };
            let ended = (*usage, target.prediction);
            pool.completed(*request, *endpoint, *latency, *output_tokens, ended);
        }
        TraceEvent::Failed {
            request,
            endpoint,
            kind,
        } => {
            let Some(target) = open.own.remove(&(*request, *endpoint)) else {
                return Some(format!("request {request}: failed at {endpoint} unsent"));
            };
            pool.failed(*request, *endpoint, target.ticket, *kind, None);
        }
        TraceEvent::KvBatch {
            endpoint,
            seq,
            events,
        } => {
            pool.kv_batch(*endpoint, *seq, events);
        }
        TraceEvent::Maintain => pool.maintain(),
        TraceEvent::PeerDispatched { request, endpoint } => {
            let prediction = pool.peer_dispatched(request, *endpoint);
            open.peers.insert((request.id, *endpoint), prediction);
        }
        TraceEvent::PeerFirstToken {
            request,
            endpoint,
            ttft,
        } => pool.peer_first_token(*request, *endpoint, *ttft, true),
        TraceEvent::PeerCompleted {
            request,
            endpoint,
            latency,
            output_tokens,
            usage,
        } => {
            let end = End::Completed {
                latency: *latency,
                output_tokens: *output_tokens,
                usage: *usage,
            };
            let prediction = open.peers.remove(&(*request, *endpoint)).flatten();
            pool.peer_ended(*request, *endpoint, end, prediction);
        }
        TraceEvent::PeerFailed {
            request,
            endpoint,
            kind,
        } => {
            let prediction = open.peers.remove(&(*request, *endpoint)).flatten();
            pool.peer_ended(*request, *endpoint, End::Failed(*kind), prediction);
        }
    }
    None
}

#[test]
fn the_pool_decides_as_the_simulated_router_did_on_a_recorded_trace() {
    let trace = recorded();
    let pool = pool_for(&trace);
    let mut open = Open::default();
    let mut picks = 0;
    let mut differences = Vec::new();
    for stamped in &trace.events {
        let now = pool.clock().now();
        assert!(stamped.at >= now, "the trace runs forward in time");
        pool.clock()
            .advance(Duration::from_nanos(stamped.at.0 - now.0));
        picks += usize::from(matches!(stamped.event, TraceEvent::Pick { .. }));
        differences.extend(feed(&pool, &mut open, stamped.at, &stamped.event));
        if !differences.is_empty() {
            break;
        }
    }
    assert!(
        differences.is_empty(),
        "the pool departs from the simulated router after {picks} picks: {differences:#?}"
    );
    assert!(picks >= 50, "{picks} picks");
}
