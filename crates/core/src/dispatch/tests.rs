use super::*;
use crate::decision::FailureKind;
use crate::router::accept_all;
use crate::{Decision, EndpointView, Rejection, Routing};
use std::sync::Arc;

fn ms(n: u64) -> Nanos {
    Nanos(n * 1_000_000)
}

fn dispatcher(policy: &str, members: &[(u32, u32)]) -> Dispatcher {
    let config = PolicyConfig::default_for(policy).unwrap();
    let mut d = Dispatcher::new(&DispatchConfig::default(), &config, 7);
    for &(id, tier) in members {
        let spec = MemberSpec {
            tier,
            ..MemberSpec::default()
        };
        d.add(EndpointId(id), &spec, Nanos::ZERO);
    }
    d
}

fn request(id: u64, text: &str) -> Request {
    Request::from_text(id, text)
}

#[test]
fn with_nothing_failing_it_decides_as_the_bare_router_does() {
    for policy in [
        "cache_aware",
        "predicted_ttft",
        "least_outstanding",
        "random",
    ] {
        let mut d = dispatcher(policy, &[(0, 0), (1, 0), (2, 0)]);
        let config = PolicyConfig::default_for(policy).unwrap();
        let mut r = Routing::new(&config, 7);
        for id in 0..3 {
            r.router_mut().add(EndpointView::new(EndpointId(id)));
        }
        for i in 0..60u64 {
            let req = request(i, &format!("system prompt {} user {i}", i % 4));
            let now = ms(i * 10);
            let a = d.pick(&req, &[], Attempt::First, now).unwrap();
            let b = r.route(&req, now, &accept_all);
            assert_eq!(Some(a.route.endpoint), b.endpoint(), "{policy} request {i}");
            if i % 3 == 0 {
                d.first_token(i, a.route.endpoint, now + ms(5), ms(5));
                r.first_token(i, a.route.endpoint, now + ms(5), ms(5));
            }
        }
    }
}

#[test]
fn a_failure_cools_a_member_down_and_a_retry_falls_back_to_what_it_tried() {
    let mut d = dispatcher("least_outstanding", &[(0, 0), (1, 0)]);
    let first = d
        .pick(&request(1, "a"), &[], Attempt::First, ms(0))
        .unwrap();
    let bad = first.route.endpoint;
    d.failed(1, bad, ms(1), FailureKind::ServerError);
    // Cooling down: the other member takes the next requests even when it is busier.
    for id in 2..5 {
        let p = d
            .pick(&request(id, "b"), &[], Attempt::First, ms(2))
            .unwrap();
        assert_ne!(p.route.endpoint, bad);
    }
    // A retry that tried the other one falls back to the cooling member rather than fail.
    let other = EndpointId(1 - bad.0);
    let retry = d
        .pick(&request(9, "c"), &[other], Attempt::Retry, ms(3))
        .unwrap();
    assert_eq!(retry.route.endpoint, bad);
    // A hedge never does.
    let hedge = d.pick(&request(10, "c"), &[other, bad], Attempt::Hedge, ms(3));
    assert!(hedge.is_err());
}

#[test]
fn a_lower_tier_takes_over_while_the_first_is_held_back_by_retry_after() {
    let mut d = dispatcher("least_outstanding", &[(0, 0), (1, 1)]);
    let p = d
        .pick(&request(1, "a"), &[], Attempt::First, ms(0))
        .unwrap();
    assert_eq!((p.route.endpoint, p.tier), (EndpointId(0), 0));
    d.core_mut().failed(
        (1, EndpointId(0)),
        p.ticket,
        (FailureKind::Overloaded, Some(ms(1_000))),
        ms(1),
    );
    let p = d
        .pick(&request(2, "a"), &[], Attempt::First, ms(2))
        .unwrap();
    assert_eq!((p.route.endpoint, p.tier), (EndpointId(1), 1));
    assert_eq!(p.eligible, vec![EndpointId(1)]);
    let status = d.core().member(EndpointId(0)).unwrap();
    assert_eq!(status.routable_again_at(ms(2)), Some(ms(1_001)));
}

#[test]
fn a_member_serves_only_its_models_and_a_deployment_at_its_limit_sits_out() {
    let config = PolicyConfig::default_for("round_robin").unwrap();
    let mut d = Dispatcher::new(&DispatchConfig::default(), &config, 1);
    let serving = |m: &str| {
        Arc::new(Serving {
            models: vec![m.to_owned()],
            aliases: vec![],
        })
    };
    let limited = MemberSpec {
        serving: serving("m"),
        limits: Some(crate::tenancy::LimitsConfig {
            rpm: Some(60.0),
            burst_secs: Some(1.0),
            ..Default::default()
        }),
        ..MemberSpec::default()
    };
    d.add(EndpointId(0), &limited, Nanos::ZERO);
    d.add(
        EndpointId(1),
        &MemberSpec {
            serving: serving("other"),
            ..MemberSpec::default()
        },
        Nanos::ZERO,
    );
    let mut req = request(1, "x");
    req.model = Some("m".into());
    assert_eq!(
        d.pick(&req, &[], Attempt::First, ms(0))
            .unwrap()
            .route
            .endpoint,
        EndpointId(0)
    );
    req.id = 2;
    assert_eq!(
        d.pick(&req, &[], Attempt::First, ms(1)),
        Err(Rejection::NoRoutableEndpoint),
        "its one request per second is spent and no other member serves m"
    );
}

#[test]
fn a_scrape_failure_counts_only_when_the_member_answered_nothing_since() {
    let mut d = dispatcher("round_robin", &[(0, 0)]);
    let core = d.core_mut();
    assert!(!core.scrape_failed(EndpointId(0), 2));
    assert!(core.scrape_failed(EndpointId(0), 2), "two in a row");
    core.observed(EndpointId(0), None, ms(5));
    assert!(core.member(EndpointId(0)).unwrap().healthy);
    let p = d
        .pick(&request(1, "a"), &[], Attempt::First, ms(6))
        .unwrap();
    d.core_mut()
        .first_token((1, EndpointId(0)), p.ticket, (ms(1), true), ms(7));
    assert!(!d.core_mut().scrape_failed(EndpointId(0), 1), "it answered");
    let _ = Decision::Reject(Rejection::NoRoutableEndpoint);
}

/// Two engines with one adapter slot each: `a` runs on 0, `b` waits behind it there (sent by
/// this core), `c` runs on 1. A new `a` is held for 0 (or goes elsewhere if the policy says
/// so), is released when `b`'s first token comes, and its pick then carries the hold.
#[test]
fn the_lora_gate_holds_a_running_adapter_behind_a_waiting_one() {
    use crate::lora::{AdapterState, Pass};
    let mut core = DispatchCore::new(
        &DispatchConfig::default(),
        &PolicyConfig::default_for("predicted_ttft").unwrap(),
        7,
    );
    for id in 0..2 {
        core.add(EndpointId(id), &MemberSpec::default(), Nanos::ZERO);
    }
    let for_adapter = |id: u64, adapter: &str| Request {
        adapter: Some(adapter.to_owned()),
        ..Request::from_text(id, format!("{adapter} request {id}"))
    };
    let overlaps = Overlaps::default();
    let only = |e: u32| {
        (0..2)
            .filter(move |&i| i != e)
            .map(EndpointId)
            .collect::<Vec<_>>()
    };
    let report = |running: &str| AdapterState {
        max_loras: Some(1),
        running: vec![running.to_owned()],
        ..AdapterState::default()
    };
    core.adapters_observed(EndpointId(0), Some(report("a")));
    core.adapters_observed(EndpointId(1), Some(report("c")));
    let sent = |core: &mut DispatchCore, id: u64, adapter: &str, to: u32, at: u64| {
        let r = for_adapter(id, adapter);
        match core.pick_gated(&r, &overlaps, &only(to), Attempt::First, ms(at)) {
            Ok(Gated::Picked(p)) => assert_eq!(p.route.endpoint, EndpointId(to)),
            other => panic!("{other:?}"),
        }
    };
    sent(&mut core, 1, "a", 0, 0);
    core.first_token((1, EndpointId(0)), Ticket::default(), (ms(5), true), ms(5));
    sent(&mut core, 2, "b", 0, 10);
    // A new `a` may not go to 0 now: held there, or sent to 1 if the policy prefers it.
    let r = for_adapter(3, "a");
    let hold = match core.pick_gated(&r, &overlaps, &only(0), Attempt::First, ms(20)) {
        Ok(Gated::Held(hold)) => hold,
        other => panic!("{other:?}"),
    };
    assert_eq!((hold.endpoint, hold.behind.as_str()), (EndpointId(0), "b"));
    assert_eq!(core.held(), 1);
    assert!(core.released().is_empty());
    // Base-model requests and retries are never held.
    let base = Request::from_text(4, "base");
    assert!(matches!(
        core.pick_gated(&base, &overlaps, &only(0), Attempt::First, ms(21)),
        Ok(Gated::Picked(_))
    ));
    let retry = for_adapter(5, "a");
    assert!(matches!(
        core.pick_gated(&retry, &overlaps, &only(0), Attempt::Retry, ms(21)),
        Ok(Gated::Picked(_))
    ));
    core.ended(
        (1, EndpointId(0)),
        End::Failed(FailureKind::Cancelled),
        ms(30),
    );
    core.ended(
        (5, EndpointId(0)),
        End::Failed(FailureKind::Cancelled),
        ms(30),
    );
    core.first_token(
        (2, EndpointId(0)),
        Ticket::default(),
        (ms(25), true),
        ms(35),
    );
    assert_eq!(core.released(), vec![3]);
    match core.pick_gated(&r, &overlaps, &only(0), Attempt::First, ms(36)) {
        Ok(Gated::Picked(p)) => {
            let (pass, held) = p.held.expect("the hold is carried");
            assert_eq!((pass, held.since), (Pass::Released, ms(20)));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(core.held(), 0);
}
