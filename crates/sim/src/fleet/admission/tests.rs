use crate::fleet::tests::{fleet, go};
use crate::fleet::{AdmissionLimits, FleetConfig, Outcome};
use kvgate_core::Nanos;

/// Two replicas of four slots each, serving requests of ~12 ticks (200 prompt tokens, 10
/// output), behind one router whose gate has `limits`.
fn gated(limits: Option<AdmissionLimits>) -> FleetConfig {
    FleetConfig {
        admission: limits,
        ..fleet("least_outstanding", 2, &[])
    }
}

fn limits(max_concurrency: usize, max_queue: usize, timeout_ms: u64) -> AdmissionLimits {
    AdmissionLimits {
        max_concurrency,
        max_queue,
        queue_timeout: Nanos::from_millis(timeout_ms),
    }
}

/// The most requests between their first token and their end at once: a lower bound on the
/// requests in flight upstream.
fn most_streaming(out: &Outcome) -> usize {
    let mut edges: Vec<(Nanos, i32)> = out
        .records
        .iter()
        .filter_map(|r| Some([(r.first_token?, 1), (r.finished?, -1)]))
        .flatten()
        .collect();
    // An end and a first token at the same instant: the end first.
    edges.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    most as usize
}

#[test]
fn the_gateways_default_limits_change_nothing_on_a_fleet_far_below_them() {
    let defaults = limits(4096, 4096, 30_000);
    let plain = go(&gated(None), 400, 0.4, 7);
    let gate = go(&gated(Some(defaults)), 400, 0.4, 7);
    assert_eq!(plain.records, gate.records);
    assert_eq!(plain.end, gate.end);
    // Loaded enough that a cap of two (below) binds.
    assert!(most_streaming(&plain) > 2, "{}", most_streaming(&plain));
    assert_eq!(
        (
            gate.admission_queued,
            gate.admission_rejected,
            gate.admission_expired
        ),
        (0, 0, 0)
    );
}

#[test]
fn a_small_cap_queues_in_arrival_order_and_a_full_queue_refuses() {
    // Eight slots of engine, but two requests upstream at once: about 2 / 12 per tick get
    // through at 0.4 arriving, so the queue of five fills and the rest are refused.
    let out = go(&gated(Some(limits(2, 5, 60_000))), 300, 0.4, 3);
    assert!(most_streaming(&out) <= 2, "{}", most_streaming(&out));
    assert!(out.admission_queued > 0 && out.admission_rejected > 0);
    assert_eq!(out.admission_expired, 0);
    let failed = out.records.iter().filter(|r| r.failed).count() as u64;
    assert_eq!(failed, out.admission_rejected);
    for r in &out.records {
        assert!(r.failed || r.first_token.is_some_and(|f| f > r.arrival));
        assert!(r.finished.is_some(), "every request ends: {r:?}");
    }
    // Served first come, first served: first tokens in arrival order.
    let served: Vec<_> = out
        .records
        .iter()
        .filter(|r| !r.failed)
        .map(|r| (r.arrival, r.first_token.unwrap()))
        .collect();
    assert!(served.windows(2).all(|w| w[0].1 <= w[1].1), "FIFO");
    // The same run again is the same run.
    let again = go(&gated(Some(limits(2, 5, 60_000))), 300, 0.4, 3);
    assert_eq!(out.records, again.records);
}

#[test]
fn a_request_waiting_past_the_timeout_fails_then() {
    let out = go(&gated(Some(limits(1, 1_000, 20))), 200, 0.4, 5);
    assert!(out.admission_expired > 0);
    assert_eq!(out.admission_rejected, 0);
    let timed_out: Vec<_> = out.records.iter().filter(|r| r.failed).collect();
    assert_eq!(timed_out.len() as u64, out.admission_expired);
    for r in timed_out {
        assert_eq!(r.finished, Some(r.arrival + Nanos::from_millis(20)));
        assert_eq!(r.first_token, None);
    }
    let served = out.records.iter().filter(|r| !r.failed);
    assert!(served.clone().count() > 0);
    // Served ones waited less than the timeout before going out (TTFT here is the wait plus
    // a couple of ticks of prefill).
    assert!(served
        .filter(|r| r.first_token.is_some())
        .all(|r| r.first_token.unwrap() - r.arrival < Nanos::from_millis(20 + 15)));
}
