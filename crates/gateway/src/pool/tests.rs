use super::*;
use crate::Config;
use kvgate_core::decision::FailureKind;
use kvgate_core::resilience::Ticket;
use kvgate_core::{Observation, Usage};

fn pool(policy: &str, endpoints: &[(&str, Option<&str>)]) -> (Pool, Vec<EndpointId>) {
    pool_with(policy, endpoints, 2)
}

/// Cached-token predictions the pool scored exact.
fn exact_predictions(pool: &Pool) -> u64 {
    let exact = crate::metrics::ResultLabel { result: "exact" };
    pool.metrics.cache_prediction.get_or_create(&exact).get()
}

fn pool_with(
    policy: &str,
    endpoints: &[(&str, Option<&str>)],
    breaker_min_requests: u64,
) -> (Pool, Vec<EndpointId>) {
    let mut config = Config::default();
    config.set_policy(policy).unwrap();
    config.breaker.min_requests = breaker_min_requests;
    let pool = Pool::new(
        &config.pool_settings(),
        Clock::manual(),
        PoolMetrics::register(&mut Default::default()),
        7,
    );
    let ids = endpoints
        .iter()
        .map(|(url, model)| {
            pool.add(EndpointConfig {
                model: model.map(str::to_string),
                ..EndpointConfig::from_url(*url)
            })
        })
        .collect();
    (pool, ids)
}

fn request(id: u64, model: Option<&str>) -> Request {
    Request {
        model: model.map(str::to_string),
        ..Request::from_text(id, "hello")
    }
}

#[test]
fn exclusions_drain_and_models_filter_before_the_policy() {
    let (pool, ids) = pool(
        "round_robin",
        &[
            ("http://a:1", Some("m")),
            ("http://b:1", Some("m")),
            ("http://c:1", Some("other")),
        ],
    );
    for i in 0..6 {
        let t = pool
            .pick(&request(i, Some("m")), &[ids[0]], Attempt::Hedge)
            .unwrap();
        assert_eq!(t.id, ids[1], "a is excluded, c serves another model");
    }
    assert!(pool.set_draining(ids[1], true));
    assert_eq!(
        pool.pick(&request(9, Some("m")), &[ids[0]], Attempt::Hedge)
            .unwrap_err(),
        Rejection::NoRoutableEndpoint
    );
    assert!(pool.serves("other") && !pool.serves("nope"));
    assert_eq!(pool.models(), vec!["m".to_string(), "other".to_string()]);
}

#[test]
fn a_failing_endpoint_cools_down_longer_per_failure_in_a_row_and_an_answer_ends_it() {
    // A breaker that would not trip on these few failures.
    let (pool, ids) = pool_with(
        "least_outstanding",
        &[("http://a:1", None), ("http://b:1", None)],
        100,
    );
    let pick = |i| pool.pick(&request(i, None), &[], Attempt::First).unwrap();
    // b is busier, but a just failed fast: a failing endpoint must not look idle.
    let busy = pool
        .pick(&request(0, None), &[ids[0]], Attempt::Hedge)
        .unwrap();
    assert_eq!(busy.id, ids[1]);
    pool.failed(1, ids[0], Ticket::default(), FailureKind::ServerError, None);
    assert_eq!(pick(2).id, ids[1], "cooling down for 0.5 s");
    pool.completed(2, ids[1], Nanos(1), 1, (None, None));
    pool.clock().advance(Duration::from_millis(500));
    let t = pick(3);
    assert_eq!(t.id, ids[0], "back after 0.5 s");
    pool.failed(3, ids[0], Ticket::default(), FailureKind::Connect, None);
    pool.clock().advance(Duration::from_millis(900));
    assert_eq!(pick(4).id, ids[1], "a second failure in a row: 1 s");
    pool.completed(4, ids[1], Nanos(1), 1, (None, None));
    // Soft: with b out of the picture, a still takes the request.
    let only_a = pool
        .pick(&request(5, None), &[ids[1]], Attempt::Hedge)
        .unwrap();
    assert_eq!(only_a.id, ids[0]);
    pool.first_token(5, ids[0], only_a.ticket, Nanos(1), true);
    pool.completed(5, ids[0], Nanos(1), 1, (None, None));
    pool.clock().advance(Duration::from_millis(200));
    pool.failed(6, ids[0], Ticket::default(), FailureKind::ServerError, None);
    pool.clock().advance(Duration::from_millis(500));
    assert_eq!(
        pick(7).id,
        ids[0],
        "the answer reset the streak: 0.5 s again"
    );
}

#[test]
fn dispatches_are_in_flight_until_they_end() {
    let (pool, ids) = pool("least_outstanding", &[("http://a:1", None)]);
    let t = pool.pick(&request(1, None), &[], Attempt::First).unwrap();
    pool.pick(&request(2, None), &[], Attempt::First).unwrap();
    assert_eq!(pool.status()[0].inflight, 2);
    pool.completed(1, t.id, Nanos(1), 3, (None, None));
    pool.failed(2, ids[0], Ticket::default(), FailureKind::Cancelled, None);
    assert_eq!(pool.status()[0].inflight, 0);
}

#[test]
fn retry_after_and_an_open_breaker_steer_traffic_away() {
    let (pool, ids) = pool("round_robin", &[("http://a:1", None), ("http://b:1", None)]);
    pool.failed(
        0,
        ids[0],
        Ticket::default(),
        FailureKind::Overloaded,
        Some(Duration::from_secs(60)),
    );
    for i in 1..5 {
        assert_eq!(
            pool.pick(&request(i, None), &[], Attempt::First)
                .unwrap()
                .id,
            ids[1]
        );
    }
    for i in 10..12 {
        pool.failed(i, ids[1], Ticket::default(), FailureKind::ServerError, None);
    }
    assert_eq!(
        pool.status()[1].breaker,
        kvgate_core::resilience::BreakerState::Open
    );
    assert!(pool.pick(&request(20, None), &[], Attempt::First).is_err());
    assert!(
        pool.any_healthy(),
        "Retry-After and breakers do not touch readiness"
    );
    // b's breaker opens for `open_ms` (5 s), a's Retry-After lasts 60 s: b comes back first.
    let wait = pool.routable_again_in(None).unwrap();
    assert!(
        wait > Duration::from_secs(4) && wait <= Duration::from_secs(5),
        "{wait:?}"
    );
    assert!(pool.set_draining(ids[1], true));
    let wait = pool.routable_again_in(None).unwrap();
    assert!(
        wait > Duration::from_secs(59),
        "a draining endpoint does not come back: {wait:?}"
    );
}

#[test]
fn removal_forgets_the_endpoint() {
    let (pool, ids) = pool("cache_aware", &[("http://a:1", None), ("http://b:1", None)]);
    pool.pick(&request(1, None), &[], Attempt::First).unwrap();
    assert!(pool.remove(ids[0]));
    assert!(!pool.remove(ids[0]));
    for i in 2..5 {
        assert_eq!(
            pool.pick(&request(i, None), &[], Attempt::First)
                .unwrap()
                .id,
            ids[1]
        );
    }
}

#[test]
fn failed_scrapes_count_only_without_traffic_in_between() {
    let (pool, ids) = pool("round_robin", &[("http://a:1", None)]);
    let refused = || crate::upstream::Trouble::Refused {
        address: "a:1".into(),
    };
    assert!(!pool.scrape_failed(ids[0], 2, refused()));
    pool.first_token(1, ids[0], Ticket::default(), Nanos(1), false);
    pool.scrape_failed(ids[0], 2, refused());
    assert!(
        pool.any_healthy(),
        "it answered a request since the last scrape"
    );
    assert_eq!(
        pool.status()[0].reason,
        None,
        "a failure that keeps nothing out"
    );
    pool.scrape_failed(ids[0], 2, refused());
    assert!(
        pool.scrape_failed(ids[0], 2, refused()),
        "this one took it out"
    );
    assert!(!pool.any_healthy());
    let reason = pool.status()[0].reason.clone().unwrap();
    assert!(
        reason.starts_with("down: connection refused at a:1"),
        "{reason}"
    );
    let why = pool.why_unroutable(None);
    assert!(
        why.starts_with("the only endpoint, a:1, is down: connection refused at a:1"),
        "{why}"
    );
    assert_eq!(
        pool.routable_again_in(None),
        None,
        "only a health check brings it back"
    );
    let ended = pool.observed(ids[0], None, Nanos(2));
    assert_eq!(
        ended.as_deref(),
        Some(&refused()),
        "the recovery names what ended"
    );
    assert!(pool.any_healthy());
    assert_eq!(pool.status()[0].reason, None);
}

#[test]
fn an_engine_reporting_itself_down_gets_no_traffic_even_while_it_answers() {
    let (pool, ids) = pool("round_robin", &[("http://a:1", None), ("http://b:1", None)]);
    assert!(pool.reported_health(ids[0], 503));
    let reason = pool.status()[0].reason.clone().unwrap();
    assert!(reason.contains("its /health answered 503"), "{reason}");
    pool.first_token(1, ids[0], Ticket::default(), Nanos(1), false);
    for i in 2..6 {
        assert_eq!(
            pool.pick(&request(i, None), &[], Attempt::First)
                .unwrap()
                .id,
            ids[1]
        );
    }
    assert!(!pool.reported_health(ids[0], 200));
    assert_eq!(pool.status()[0].reason, None);
    let picked: Vec<_> = (6..8)
        .map(|i| {
            pool.pick(&request(i, None), &[], Attempt::First)
                .unwrap()
                .id
        })
        .collect();
    assert!(picked.contains(&ids[0]));
}

#[test]
fn a_straggler_from_before_the_trip_is_not_the_half_open_probe() {
    let mut config = Config::default();
    config.set_policy("round_robin").unwrap();
    config.breaker.min_requests = 2;
    config.breaker.open_ms = 1;
    let pool = Pool::new(
        &config.pool_settings(),
        Clock::manual(),
        PoolMetrics::register(&mut Default::default()),
        7,
    );
    let id = pool.add(EndpointConfig::from_url("http://a:1"));
    let straggler = pool.pick(&request(1, None), &[], Attempt::First).unwrap();
    for i in 2..4 {
        let t = pool.pick(&request(i, None), &[], Attempt::First).unwrap();
        pool.failed(i, id, t.ticket, FailureKind::ServerError, None);
    }
    assert!(
        pool.pick(&request(8, None), &[], Attempt::First).is_err(),
        "open"
    );
    pool.clock().advance(Duration::from_millis(1));
    let probe = pool
        .pick(&request(9, None), &[], Attempt::First)
        .expect("half-open after open_ms");
    assert!(probe.ticket.is_probe() && !straggler.ticket.is_probe());
    let breaker = |pool: &Pool| pool.status()[0].breaker;
    pool.failed(1, id, straggler.ticket, FailureKind::ServerError, None);
    assert_eq!(
        breaker(&pool),
        kvgate_core::resilience::BreakerState::HalfOpen
    );
    assert!(
        pool.pick(&request(10, None), &[], Attempt::First).is_err(),
        "the probe slot is still taken"
    );
    pool.first_token(9, id, probe.ticket, Nanos(1), true);
    assert_eq!(
        breaker(&pool),
        kvgate_core::resilience::BreakerState::Closed
    );
}

#[test]
fn a_non_streaming_answer_teaches_the_policy_no_ttft() {
    let (pool, ids) = pool("peak_ewma", &[("http://a:1", None), ("http://b:1", None)]);
    // `a` took a minute to return a whole (long) answer; `b` streamed its first token in 1 s.
    pool.first_token(1, ids[0], Ticket::default(), Nanos::from_secs(60), false);
    pool.first_token(2, ids[1], Ticket::default(), Nanos::from_secs(1), true);
    for i in 10..14 {
        let t = pool.pick(&request(i, None), &[], Attempt::First).unwrap();
        assert_eq!(t.id, ids[0], "a has no TTFT estimate, b's is 1 s");
        pool.completed(i, t.id, Nanos(1), 1, (None, None));
    }
}

#[test]
fn a_retry_takes_the_next_candidate_of_the_same_ranking_and_falls_back_when_all_were_tried() {
    let (pool, ids) = pool(
        "consistent_hash",
        &[
            ("http://a:1", None),
            ("http://b:1", None),
            ("http://c:1", None),
        ],
    );
    let mut r = request(1, None);
    r.session = Some("conversation-7".into());
    // Each attempt ends before the next, so the bounded load never moves the walk.
    let pick = |r: &Request, tried: &[EndpointId], attempt| {
        let id = pool.pick(r, tried, attempt).unwrap().id;
        pool.completed(r.id, id, Nanos(1), 1, (None, None));
        id
    };
    let home = pick(&r, &[], Attempt::First);
    let second = pick(&r, &[home], Attempt::Retry);
    let third = pick(&r, &[home, second], Attempt::Retry);
    assert_eq!(
        [home, second, third]
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        3
    );
    for k in 0..5 {
        let mut again = request(10 + k, None);
        again.session = r.session.clone();
        assert_eq!(
            pick(&again, &[home], Attempt::Retry),
            second,
            "the ring walk is the ranking: the same next candidate every time"
        );
    }
    assert!(
        pool.pick(&r, &ids, Attempt::Hedge).is_err(),
        "a hedge never goes back to an endpoint already tried"
    );
    assert!(
        ids.contains(&pool.pick(&r, &ids, Attempt::Retry).unwrap().id),
        "a retry falls back to one"
    );
}

#[test]
fn readers_see_the_published_snapshot_without_the_lock() {
    let (pool, ids) = pool("round_robin", &[("http://a:1", Some("m"))]);
    let before = pool.lock_acquisitions();
    assert_eq!(pool.policy_name(), "round_robin");
    assert!(pool.serves("m") && pool.any_healthy());
    assert_eq!(pool.models(), vec!["m".to_string()]);
    assert_eq!(pool.status()[0].inflight, 0);
    assert_eq!(pool.base_of(ids[0]).as_deref(), Some("http://a:1"));
    assert_eq!(pool.lock_acquisitions(), before, "no reader took the lock");
    let t = pool
        .pick(&request(1, Some("m")), &[], Attempt::First)
        .unwrap();
    assert_eq!(pool.status()[0].inflight, 1);
    pool.completed(1, t.id, Nanos(1), 1, (None, None));
    assert_eq!(pool.status()[0].inflight, 0);
    pool.set_draining(ids[0], true);
    assert!(!pool.any_healthy(), "a draining endpoint fails readiness");
}

#[test]
fn cache_predictions_are_scored_against_usage_whatever_the_policy() {
    let (pool, _) = pool("round_robin", &[("http://a:1", None)]);
    let text = "You are a helpful agent. ".repeat(40);
    let usage = |cached| Usage {
        prompt_tokens: 250,
        cached_tokens: Some(cached),
        output_tokens: 4,
    };
    let first = Request::from_text(1, text.clone());
    let t = pool.pick(&first, &[], Attempt::First).unwrap();
    assert_eq!(t.prediction.unwrap().units, 0, "nothing cached yet");
    pool.first_token(1, t.id, t.ticket, Nanos(1), true);
    pool.completed(1, t.id, Nanos(2), 4, (Some(usage(0)), t.prediction));
    // The same prompt again: the index, fed at the first token, predicts it all cached.
    let again = Request::from_text(2, text);
    let t = pool.pick(&again, &[], Attempt::First).unwrap();
    let p = t.prediction.unwrap();
    assert_eq!(p.cached_tokens(250), 250);
    pool.completed(2, t.id, Nanos(3), 4, (Some(usage(240)), t.prediction));
    assert_eq!(exact_predictions(&pool), 2);
}

#[test]
fn the_logged_cache_prediction_is_in_the_blocks_the_engine_reports() {
    let (pool, ids) = pool("round_robin", &[("http://a:1", None)]);
    let text = "You are a helpful agent. ".repeat(40);
    let first = Request::from_text(1, text.clone());
    let t = pool.pick(&first, &[], Attempt::First).unwrap();
    pool.first_token(1, t.id, t.ticket, Nanos(1), true);
    pool.completed(1, t.id, Nanos(2), 4, (None, t.prediction));
    let t = pool
        .pick(&Request::from_text(2, text), &[], Attempt::First)
        .unwrap();
    let p = t.prediction.unwrap();
    // Before the engine reports its block size, the index's own count (all but the last
    // token, which an engine always computes, of a 250-token prompt).
    assert_eq!(pool.reported_cached(&p, 250), 249);
    let observation = Observation {
        block_size: Some(16),
        ..Observation::default()
    };
    pool.observed(ids[0], Some(observation), Nanos(3));
    // vLLM counts whole blocks: 15 of 16 tokens.
    assert_eq!(pool.reported_cached(&p, 250), 240);
    pool.completed(
        2,
        t.id,
        Nanos(4),
        4,
        (
            Some(Usage {
                prompt_tokens: 250,
                cached_tokens: Some(240),
                output_tokens: 4,
            }),
            t.prediction,
        ),
    );
    assert_eq!(exact_predictions(&pool), 1);
}

#[test]
fn tiers_fail_over_and_spill_over_on_a_queue_and_only_the_final_choice_is_dispatched() {
    let mut config = Config::default();
    config.set_policy("least_outstanding").unwrap();
    config.spillover.queue = Some(4);
    let pool = Pool::new(
        &config.pool_settings(),
        Clock::manual(),
        PoolMetrics::register(&mut Default::default()),
        7,
    );
    let local = pool.add(EndpointConfig {
        model: Some("m".into()),
        served_as: vec!["chat".into()],
        ..EndpointConfig::from_url("http://local:1")
    });
    let hosted = pool.add(EndpointConfig {
        model: Some("m-hosted".into()),
        served_as: vec!["chat".into()],
        tier: 1,
        ..EndpointConfig::from_url("https://hosted:443")
    });
    let waiting = |n: u32| Observation {
        waiting: n,
        ..Observation::default()
    };
    pool.observed(local, Some(waiting(1)), Nanos(0));
    let t = pool
        .pick(&request(1, Some("chat")), &[], Attempt::First)
        .unwrap();
    assert_eq!((t.id, t.tier, t.spilled), (local, 0, None));
    assert_eq!(t.send_model.as_deref(), Some("m"), "the alias is renamed");
    // A long queue at the first tier spills the next request over.
    pool.observed(local, Some(waiting(4)), Nanos(0));
    let t = pool
        .pick(&request(2, Some("chat")), &[], Attempt::First)
        .unwrap();
    assert_eq!((t.id, t.tier, t.spilled), (hosted, 1, Some("queue")));
    assert_eq!(t.send_model.as_deref(), Some("m-hosted"));
    // Only the hosted dispatch was recorded: the first tier still has one request in flight.
    assert_eq!(
        pool.status()
            .iter()
            .find(|s| s.id == local)
            .unwrap()
            .inflight,
        1
    );
    // With the last tier out, the spilled choice stands.
    assert!(pool.set_draining(hosted, true));
    let t = pool
        .pick(&request(3, Some("chat")), &[], Attempt::First)
        .unwrap();
    assert_eq!((t.id, t.spilled), (local, None));
    // A model only the first tier serves by name never spills (it has no next tier).
    assert!(pool.set_draining(hosted, false));
    let t = pool
        .pick(&request(4, Some("m")), &[], Attempt::First)
        .unwrap();
    assert_eq!(t.id, local);
}

#[test]
fn a_deployment_at_its_own_rate_limit_yields_to_the_next_tier_until_it_refills() {
    let config = Config::default();
    let pool = Pool::new(
        &config.pool_settings(),
        Clock::manual(),
        PoolMetrics::register(&mut Default::default()),
        7,
    );
    let limited = pool.add(EndpointConfig {
        limits: Some(kvgate_core::tenancy::LimitsConfig {
            rpm: Some(60.0),
            burst_secs: Some(2.0),
            ..Default::default()
        }),
        ..EndpointConfig::from_url("https://provider-a:443")
    });
    let other = pool.add(EndpointConfig {
        tier: 1,
        ..EndpointConfig::from_url("https://provider-b:443")
    });
    let mut served = Vec::new();
    for i in 0..4 {
        let t = pool.pick(&request(i, None), &[], Attempt::First).unwrap();
        served.push(t.id);
        pool.completed(i, t.id, Nanos(1), 1, (None, None));
    }
    // Two seconds of burst at one request per second, then the next tier.
    assert_eq!(served, vec![limited, limited, other, other]);
    pool.clock().advance(std::time::Duration::from_secs(1));
    let t = pool.pick(&request(9, None), &[], Attempt::First).unwrap();
    assert_eq!(t.id, limited, "refilled");
}

#[test]
fn a_spilled_session_stays_on_its_new_tier_and_a_failed_over_one_comes_back() {
    let mut config = Config::default();
    config.set_policy("least_outstanding").unwrap();
    config.spillover.queue = Some(2);
    let pool = Pool::new(
        &config.pool_settings(),
        Clock::manual(),
        PoolMetrics::register(&mut Default::default()),
        7,
    );
    let local = pool.add(EndpointConfig::from_url("http://local:1"));
    let hosted = pool.add(EndpointConfig {
        tier: 1,
        ..EndpointConfig::from_url("https://hosted:443")
    });
    let turn = |id: u64, session: &str| Request {
        session: Some(session.into()),
        ..request(id, None)
    };
    let waiting = |n: u32| Observation {
        waiting: n,
        ..Observation::default()
    };
    pool.observed(local, Some(waiting(5)), Nanos(0));
    let t = pool.pick(&turn(1, "a"), &[], Attempt::First).unwrap();
    assert_eq!((t.id, t.spilled), (hosted, Some("queue")));
    pool.completed(1, t.id, Nanos(1), 1, (None, None));
    // The queue is gone; session a stays where its context is cached, session b goes first tier.
    pool.observed(local, Some(waiting(0)), Nanos(0));
    let t = pool.pick(&turn(2, "a"), &[], Attempt::First).unwrap();
    assert_eq!((t.id, t.spilled), (hosted, Some("session")));
    pool.completed(2, t.id, Nanos(1), 1, (None, None));
    let t = pool.pick(&turn(3, "b"), &[], Attempt::First).unwrap();
    assert_eq!((t.id, t.spilled), (local, None));
    pool.completed(3, t.id, Nanos(1), 1, (None, None));
    // Its tier out, session a fails over to the first tier and the pin ends there.
    assert!(pool.set_draining(hosted, true));
    let t = pool.pick(&turn(4, "a"), &[], Attempt::First).unwrap();
    assert_eq!(t.id, local);
    pool.completed(4, t.id, Nanos(1), 1, (None, None));
    assert!(pool.set_draining(hosted, false));
    let t = pool.pick(&turn(5, "a"), &[], Attempt::First).unwrap();
    assert_eq!((t.id, t.spilled), (local, None));
    // Pins expire.
    pool.observed(local, Some(waiting(5)), Nanos(0));
    let t = pool.pick(&turn(6, "c"), &[], Attempt::First).unwrap();
    assert_eq!(t.id, hosted);
    pool.completed(6, t.id, Nanos(1), 1, (None, None));
    pool.observed(local, Some(waiting(0)), Nanos(0));
    pool.clock().advance(std::time::Duration::from_secs(301));
    let t = pool.pick(&turn(7, "c"), &[], Attempt::First).unwrap();
    assert_eq!(t.id, local);
}

#[test]
fn a_restarted_engine_s_cached_prefixes_are_forgotten() {
    use crate::engine_state::Incarnation;
    let (pool, ids) = pool("round_robin", &[("http://a:1", None)]);
    let text = "You are a helpful agent. ".repeat(40);
    let t = pool
        .pick(&Request::from_text(1, text.clone()), &[], Attempt::First)
        .unwrap();
    pool.first_token(1, t.id, t.ticket, Nanos(1), true);
    pool.completed(1, t.id, Nanos(2), 4, (None, t.prediction));
    let cached = |id| {
        let t = pool
            .pick(&Request::from_text(id, text.clone()), &[], Attempt::First)
            .unwrap();
        let cached = t.prediction.unwrap().cached_tokens(250);
        pool.completed(id, t.id, Nanos(3), 4, (None, None));
        cached
    };
    let run = |started: f64, prompt_tokens: f64| Incarnation {
        started: Some(started),
        counted_since: None,
        prompt_tokens: Some(prompt_tokens),
    };
    // The first scrape, then the same process counting on: nothing forgotten.
    assert!(!pool.incarnation(ids[0], run(100.0, 250.0)));
    assert!(!pool.incarnation(ids[0], run(100.0, 500.0)));
    // A scrape without the signals says nothing either way.
    assert!(!pool.incarnation(ids[0], Incarnation::default()));
    assert_eq!(cached(2), 250);
    // A new process: what the index held there is gone.
    assert!(pool.incarnation(ids[0], run(160.0, 0.0)));
    assert_eq!(cached(3), 0);
}
