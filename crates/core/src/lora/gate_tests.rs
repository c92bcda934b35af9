use super::*;
use proptest::prelude::*;

const E: EndpointId = EndpointId(0);

fn report(max: u32, running: &[&str]) -> AdapterState {
    AdapterState {
        max_loras: Some(max),
        running: running.iter().map(|s| (*s).to_owned()).collect(),
        ..AdapterState::default()
    }
}

fn ms(n: u64) -> Nanos {
    Nanos::from_millis(n)
}

fn gate() -> LoraGate {
    LoraGate::new(GateConfig {
        enabled: true,
        max_hold_ms: 1_000,
        hold: true,
    })
}

#[test]
fn a_running_adapter_is_held_while_another_waits_behind_it() {
    let mut g = gate();
    let r = report(1, &[]);
    // `a` runs (its first token is in), then `b` is sent and waits behind it.
    assert!(matches!(
        g.check(1, "a", E, Some((&r, ms(0))), ms(1)),
        Verdict::Send {
            pass: Pass::Open,
            ..
        }
    ));
    g.dispatched(1, "a", E, ms(1));
    assert!(g.first_token(1, E, Some((&r, ms(0))), ms(5)).is_empty());
    g.dispatched(2, "b", E, ms(6));
    let Verdict::Hold(hold) = g.check(3, "a", E, Some((&r, ms(0))), ms(7)) else {
        panic!("a jumps the queue")
    };
    assert_eq!((hold.behind.as_str(), hold.until), ("b", ms(1_007)));
    assert_eq!(g.held(), 1);
    // A request for `b` itself, or for a third adapter, queues as usual: it jumps nobody.
    assert!(matches!(
        g.check(4, "b", E, Some((&r, ms(0))), ms(8)),
        Verdict::Send { .. }
    ));
    assert!(matches!(
        g.check(5, "c", E, Some((&r, ms(0))), ms(8)),
        Verdict::Send { .. }
    ));
    // `a`'s batch drains, `b` starts: the held request is released and passes.
    assert!(g.ended(1, E, (true, Some((&r, ms(0)))), ms(800)).is_empty());
    assert_eq!(g.first_token(2, E, Some((&r, ms(0))), ms(810)), vec![3]);
    assert_eq!(
        g.check(3, "a", E, Some((&r, ms(0))), ms(811)),
        Verdict::Send {
            pass: Pass::Released,
            held: Some(hold)
        }
    );
    assert_eq!(g.held(), 0);
}

#[test]
fn the_bound_releases_and_keeps_the_request_away() {
    let mut g = gate();
    let r = report(1, &["a"]);
    g.dispatched(2, "b", E, ms(0));
    assert!(matches!(
        g.check(3, "a", E, Some((&r, ms(0))), ms(10)),
        Verdict::Hold(_)
    ));
    assert_eq!(g.avoid(3, ms(500)), None);
    assert_eq!(g.avoid(3, ms(1_010)), Some(E));
    assert!(matches!(
        g.check(3, "a", E, Some((&r, ms(0))), ms(1_010)),
        Verdict::Send {
            pass: Pass::Bound,
            ..
        }
    ));
}

#[test]
fn a_report_that_shows_the_waiting_adapter_running_releases() {
    let mut g = gate();
    g.dispatched(2, "b", E, ms(0));
    let stalled = report(1, &["a"]);
    assert!(matches!(
        g.check(3, "a", E, Some((&stalled, ms(0))), ms(10)),
        Verdict::Hold(_)
    ));
    let turned = report(1, &["b"]);
    assert_eq!(g.observed(E, Some((&turned, ms(20)))), vec![3]);
    // A non-streaming request for `b` has no first token: its end releases too.
    let mut g = gate();
    g.dispatched(2, "b", E, ms(0));
    assert!(matches!(
        g.check(3, "a", E, Some((&stalled, ms(0))), ms(10)),
        Verdict::Hold(_)
    ));
    assert_eq!(
        g.ended(2, E, (false, Some((&stalled, ms(0)))), ms(30)),
        vec![3]
    );
    // Off, nothing is held.
    let mut off = LoraGate::new(GateConfig {
        enabled: false,
        max_hold_ms: 1_000,
        hold: true,
    });
    off.dispatched(2, "b", E, ms(0));
    assert!(matches!(
        off.check(3, "a", E, Some((&stalled, ms(0))), ms(10)),
        Verdict::Send { .. }
    ));
    assert_eq!(off.outlook("a", E, Some((&stalled, ms(0))), ms(10)), None);
}

#[test]
fn the_outlook_prices_the_hold_and_keeps_the_busier_adapter_home() {
    let mut g = gate();
    let idle = AdapterState {
        recent: vec!["a".into()],
        ..report(1, &[])
    };
    for i in 0..5 {
        g.arrived(i, "a", ms(i));
    }
    g.arrived(9, "b", ms(9));
    let o = g.outlook("b", E, Some((&idle, ms(0))), ms(10)).unwrap();
    assert!(
        o.displaces > 4.9 && o.displaces < 5.0,
        "a gets 5 times b's traffic"
    );
    assert_eq!(
        g.outlook("a", E, Some((&idle, ms(0))), ms(10))
            .unwrap()
            .displaces,
        0.0
    );
    // `a` runs with a learned run of 800 ms; `b` waits.
    let r = report(1, &[]);
    g.dispatched(1, "a", E, ms(0));
    g.first_token(1, E, Some((&r, ms(0))), ms(0));
    g.ended(1, E, (true, Some((&r, ms(0)))), ms(800));
    g.dispatched(2, "a", E, ms(900));
    g.first_token(2, E, Some((&r, ms(0))), ms(1_000));
    g.dispatched(3, "b", E, ms(1_100));
    let o = g.outlook("a", E, Some((&r, ms(0))), ms(1_200)).unwrap();
    assert!(o.held);
    assert_eq!(
        (o.own_drain, o.ahead, o.turn),
        (Some(ms(600)), 1, Some(ms(800)))
    );
    let o = g.outlook("c", E, Some((&r, ms(0))), ms(1_200)).unwrap();
    assert_eq!((o.held, o.others_drain, o.ahead), (false, Some(ms(600)), 1));
}

/// A one-slot engine as vLLM schedules it: a waiting request joins when its adapter runs or the
/// batch is empty, first come first served, and runs `run` ms from its first token.
#[derive(Default)]
struct Engine {
    waiting: Vec<(u64, String)>,
    running: Vec<(u64, String, u64)>,
}

impl Engine {
    /// Admits what may join at `now`; the ids admitted.
    fn admit(&mut self, now: u64, run: u64) -> Vec<u64> {
        let mut admitted = Vec::new();
        let mut i = 0;
        while i < self.waiting.len() {
            let a = &self.waiting[i].1;
            if self.running.is_empty() || self.running.iter().any(|r| &r.1 == a) {
                let (id, a) = self.waiting.remove(i);
                self.running.push((id, a, now + run));
                admitted.push(id);
            } else {
                i += 1;
            }
        }
        admitted
    }
}

/// Requests for adapters `a`, `b`, `c` arrive at one engine with one slot at the given times,
/// each running `run` ms; the gate holds and releases them, ticking every millisecond. Each
/// request's wait for its first token (held plus queued) is returned.
fn simulate(arrivals: &[(u64, usize)], run: u64, gated: bool) -> Vec<u64> {
    let names = ["a", "b", "c"];
    let mut g = LoraGate::new(GateConfig {
        enabled: gated,
        max_hold_ms: 1_000,
        hold: true,
    });
    let st = report(1, &[]);
    let rep = Some((&st, Nanos::ZERO));
    let mut engine = Engine::default();
    let mut held: Vec<(u64, Nanos)> = Vec::new();
    let mut waits = vec![u64::MAX; arrivals.len()];
    let mut next = 0;
    for t in 0..1_000_000u64 {
        let now = ms(t);
        let mut ready: Vec<u64> = Vec::new();
        while next < arrivals.len() && arrivals[next].0 <= t {
            ready.push(next as u64);
            next += 1;
        }
        let (done, running): (Vec<_>, Vec<_>) = std::mem::take(&mut engine.running)
            .into_iter()
            .partition(|r| r.2 <= t);
        engine.running = running;
        let mut released: Vec<u64> = Vec::new();
        for (id, _, _) in done {
            released.extend(g.ended(id, E, (true, rep), now));
        }
        held.retain(|&(id, until)| {
            let go = until <= now || released.contains(&id);
            if go {
                ready.push(id);
            }
            !go
        });
        loop {
            ready.sort_unstable();
            for id in ready.drain(..) {
                let a = names[arrivals[id as usize].1];
                match g.check(id, a, E, rep, now) {
                    Verdict::Hold(h) => {
                        assert!(h.until <= h.since + ms(1_000), "held past the bound");
                        assert!(h.until > now);
                        held.push((id, h.until));
                    }
                    Verdict::Send { .. } => {
                        g.dispatched(id, a, E, now);
                        engine.waiting.push((id, a.to_owned()));
                    }
                }
            }
            for id in engine.admit(t, run) {
                waits[id as usize] = t - arrivals[id as usize].0;
                for r in g.first_token(id, E, rep, now) {
                    let i = held
                        .iter()
                        .position(|h| h.0 == r)
                        .expect("released a held one");
                    held.remove(i);
                    ready.push(r);
                }
            }
            if ready.is_empty() {
                break;
            }
        }
        let idle = engine.running.is_empty() && engine.waiting.is_empty();
        if next == arrivals.len() && held.is_empty() && idle {
            return waits;
        }
    }
    panic!("the simulation did not end")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// No request is held past the bound, and every adapter's turn comes: with requests that
    /// run no longer than the bound, a request waits at most its hold plus one turn per adapter.
    #[test]
    fn holds_are_bounded_and_every_turn_comes(
        gaps in prop::collection::vec((0u64..200, 0usize..3), 1..120),
        run in 50u64..900,
    ) {
        let mut at = 0;
        let arrivals: Vec<(u64, usize)> = gaps.iter().map(|&(gap, a)| { at += gap; (at, a) }).collect();
        let waits = simulate(&arrivals, run, true);
        for w in &waits {
            prop_assert!(*w <= 1_000 + 3 * (run + 1), "waited {w} ms (run {run})");
        }
    }
}

#[test]
fn without_the_gate_a_waiting_adapter_starves() {
    // `a` every 100 ms, each running 500 ms, and one `b` after the first `a`: exhaustive
    // service keeps `a` running as long as it arrives.
    let mut arrivals: Vec<(u64, usize)> = (0..100).map(|i| (i * 100, 0)).collect();
    arrivals.insert(1, (50, 1));
    let open = simulate(&arrivals, 500, false);
    assert!(open[1] > 9_000, "b waited {} ms", open[1]);
    let gated = simulate(&arrivals, 500, true);
    assert!(gated[1] <= 500, "b waited {} ms", gated[1]);
    assert!(gated.iter().all(|&w| w <= 1_000 + 1_000), "{gated:?}");
}
