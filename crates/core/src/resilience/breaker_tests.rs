use super::*;
use proptest::prelude::*;

fn ms(v: u64) -> Nanos {
    Nanos::from_millis(v)
}

fn breaker() -> Breaker {
    Breaker::new(BreakerConfig {
        failure_ratio: 0.5,
        min_requests: 4,
        window_ms: 1_000,
        open_ms: 500,
        half_open_probes: 1,
    })
}

const PLAIN: Ticket = Ticket { probe: None };

fn tripped() -> Breaker {
    let mut b = breaker();
    for t in 0..4 {
        b.record(PLAIN, false, ms(t));
    }
    assert_eq!(b.state(ms(4)), BreakerState::Open);
    b
}

#[test]
fn opens_on_the_ratio_then_probes_then_closes() {
    let mut b = breaker();
    b.record(PLAIN, true, ms(0));
    b.record(PLAIN, false, ms(1));
    b.record(PLAIN, true, ms(2));
    assert_eq!(b.state(ms(3)), BreakerState::Closed, "below min_requests");
    b.record(PLAIN, false, ms(3));
    assert_eq!(b.state(ms(4)), BreakerState::Open, "2 of 4 failed");
    assert!(b.acquire(ms(100)).is_none());
    assert_eq!(b.open_until(ms(100)), Some(ms(503)));
    assert_eq!(b.state(ms(503)), BreakerState::HalfOpen);
    assert_eq!(b.open_until(ms(503)), None);
    let probe = b.acquire(ms(503)).expect("one probe");
    assert!(probe.is_probe());
    assert!(b.acquire(ms(504)).is_none(), "only one probe at a time");
    b.record(probe, true, ms(510));
    assert_eq!(b.state(ms(511)), BreakerState::Closed);
    assert!(!b.acquire(ms(511)).unwrap().is_probe());
}

#[test]
fn a_failed_probe_reopens() {
    let mut b = tripped();
    let probe = b.acquire(ms(600)).unwrap();
    b.record(probe, false, ms(601));
    assert_eq!(b.state(ms(602)), BreakerState::Open);
    assert_eq!(b.state(ms(1101)), BreakerState::HalfOpen);
}

#[test]
fn a_probe_without_a_verdict_frees_its_slot() {
    let mut b = tripped();
    let probe = b.acquire(ms(600)).unwrap();
    assert!(!b.is_available(ms(601)));
    b.release(probe);
    assert_eq!(b.state(ms(602)), BreakerState::HalfOpen);
    assert!(b.acquire(ms(602)).is_some(), "a new probe may go");
}

#[test]
fn old_failures_leave_the_window() {
    let mut b = breaker();
    for t in 0..3 {
        b.record(PLAIN, false, ms(t));
    }
    for t in 0..4 {
        b.record(PLAIN, true, ms(2_000 + t));
    }
    b.record(PLAIN, false, ms(2_010));
    assert_eq!(b.state(ms(2_011)), BreakerState::Closed, "1 of 5 in window");
}

#[test]
fn stragglers_from_before_the_trip_do_not_decide_half_open() {
    let mut b = breaker();
    let stragglers: Vec<Ticket> = (0..3).map(|_| b.acquire(ms(0)).unwrap()).collect();
    for t in 0..4 {
        b.record(PLAIN, false, ms(t));
    }
    let probe = b.acquire(ms(600)).unwrap();
    b.release(stragglers[0]);
    assert!(
        !b.is_available(ms(601)),
        "a straggler's cancel frees no probe slot"
    );
    b.record(stragglers[1], false, ms(602));
    assert_eq!(
        b.state(ms(603)),
        BreakerState::HalfOpen,
        "its failure does not re-trip"
    );
    b.record(stragglers[2], true, ms(604));
    assert_eq!(
        b.state(ms(605)),
        BreakerState::HalfOpen,
        "its success does not close"
    );
    b.record(probe, true, ms(606));
    assert_eq!(b.state(ms(607)), BreakerState::Closed);
}

#[test]
fn a_probe_of_an_earlier_round_is_a_straggler_too() {
    let mut b = Breaker::new(BreakerConfig {
        half_open_probes: 2,
        ..breaker().config
    });
    for t in 0..4 {
        b.record(PLAIN, false, ms(t));
    }
    let (first, second) = (b.acquire(ms(600)).unwrap(), b.acquire(ms(600)).unwrap());
    b.record(first, false, ms(601)); // reopens: round two starts at 1101
    let probe = b.acquire(ms(1_101)).unwrap();
    b.record(second, true, ms(1_102));
    assert_eq!(
        b.state(ms(1_103)),
        BreakerState::HalfOpen,
        "round one's late success"
    );
    b.release(second);
    b.release(probe);
    assert!(b.acquire(ms(1_104)).is_some());
}

proptest! {
    /// Whatever mix of stragglers, probes, cancels and time steps: probe slots in use never
    /// exceed the limit, and an outcome that is not a probe of the current round never changes
    /// a breaker that is not closed.
    #[test]
    fn only_current_probes_move_a_breaker_out_of_half_open(
        ops in proptest::collection::vec((0u8..4, any::<bool>(), 0usize..64, 0u64..300), 1..200),
    ) {
        let mut b = Breaker::new(BreakerConfig {
            failure_ratio: 0.5,
            min_requests: 3,
            window_ms: 1_000,
            open_ms: 200,
            half_open_probes: 2,
        });
        let mut now = 0u64;
        let mut out: Vec<Ticket> = Vec::new();
        for (op, success, pick, step) in ops {
            now += step;
            let at = ms(now);
            match op {
                0 | 1 => {
                    if let Some(t) = b.acquire(at) {
                        out.push(t);
                    }
                }
                _ if out.is_empty() => {}
                _ => {
                    let ticket = out.swap_remove(pick % out.len());
                    let current = b.is_current_probe(ticket);
                    let before = (b.open_until, b.half_open, b.probes_out, b.generation);
                    let closed = b.is_closed();
                    if op == 2 {
                        b.record(ticket, success, at);
                    } else {
                        b.release(ticket);
                    }
                    let after = (b.open_until, b.half_open, b.probes_out, b.generation);
                    if !current && !closed {
                        prop_assert_eq!(before, after, "a straggler moved the breaker");
                    }
                }
            }
            prop_assert!(b.probes_out <= 2);
        }
    }
}
