use super::*;
use crate::decision::Usage;
use crate::router::accept_all;
use crate::{EndpointView, PolicyConfig, Request, Routing};

fn routing(endpoints: u32) -> Routing {
    let mut r = Routing::new(&PolicyConfig::PredictedTtft(Config::default()), 1);
    for i in 0..endpoints {
        r.router_mut().add(EndpointView::new(EndpointId(i)));
    }
    r
}

/// `tokens` tokens of which the first `prefix` are shared by every such request.
fn request(id: u64, prefix: u32, tokens: u32) -> Request {
    let unique = |i: u32| 1_000_000 + (id as u32) * 10_000 + i;
    Request::from_tokens(
        id,
        (0..tokens)
            .map(|i| if i < prefix { i } else { unique(i) })
            .collect(),
    )
}

/// Serves `r` on `e` at `at` with the given TTFT: first token, usage, completion.
fn serve(routing: &mut Routing, r: &Request, e: EndpointId, at: Nanos, ttft: Nanos, cached: u32) {
    routing.first_token(r.id, e, at + ttft, ttft);
    let usage = Usage {
        prompt_tokens: r.prompt_tokens,
        cached_tokens: Some(cached),
        output_tokens: 10,
    };
    routing.usage(r.id, e, at + ttft, usage);
    routing.completed(r.id, e, at + ttft, ttft, 10);
}

#[test]
fn a_burst_sharing_a_prefix_follows_the_first_call_until_queueing_costs_more_than_recomputing() {
    let mut r = routing(4);
    let now = Nanos::ZERO;
    let mut homes = Vec::new();
    // Eight calls at once, each a 4,000-token shared prompt and 200 tokens of its own.
    for k in 0..8 {
        let d = r.route(&request(k, 4_000, 4_200), now, &accept_all);
        homes.push(d.endpoint().unwrap());
    }
    let first = homes[0];
    let at_home = homes.iter().filter(|&&e| e == first).count();
    assert!(
        at_home >= 2,
        "siblings follow the first call while its queue is short: {homes:?}"
    );
    assert!(
        homes.iter().any(|&e| e != first),
        "and spread once queueing at home costs more than a recompute: {homes:?}"
    );
}

#[test]
fn a_slow_replica_is_learned_and_gets_less_work() {
    let mut r = routing(2);
    // Endpoint 1 is four times slower; teach both with ordinary traffic.
    for k in 0..200u64 {
        let at = Nanos::from_millis(k * 100);
        for e in [0u32, 1] {
            let req = request(
                10_000 + k * 2 + u64::from(e),
                0,
                1_000 + (k as u32 % 7) * 300,
            );
            let only = |v: &EndpointView| v.id == EndpointId(e);
            assert_eq!(r.route(&req, at, &only).endpoint(), Some(EndpointId(e)));
            let speed = if e == 0 { 8_000.0 } else { 2_000.0 };
            let ttft = Nanos::from_secs_f64(0.01 + f64::from(req.prompt_tokens) / speed);
            serve(&mut r, &req, EndpointId(e), at, ttft, 0);
        }
    }
    let at = Nanos::from_secs(30);
    let picks: Vec<EndpointId> = (0..4)
        .map(|k| {
            r.route(&request(90_000 + k, 0, 2_000), at, &accept_all)
                .endpoint()
                .unwrap()
        })
        .collect();
    let slow = picks.iter().filter(|&&e| e == EndpointId(1)).count();
    assert!(
        slow <= 1,
        "the slow replica takes work only when the fast one queues: {picks:?}"
    );
    assert!(
        matches!(
            r.route(&request(99_999, 0, 2_000), at, &|v: &EndpointView| v.id == EndpointId(1)),
            Decision::Route(Route { reason: Reason::PredictedTtft { ttft_ms, .. }, .. }) if ttft_ms > 900.0
        ),
        "2,000 tokens at 2,000 tokens/s predict about a second"
    );
}

/// The predicted TTFT and cached tokens of routing `r` at `at` to endpoint 0.
fn predicted_on_0(routing: &mut Routing, r: &Request, at: Nanos) -> (f64, u32) {
    let only = |v: &EndpointView| v.id == EndpointId(0);
    match routing.route(r, at, &only) {
        Decision::Route(Route {
            reason:
                Reason::PredictedTtft {
                    ttft_ms,
                    cached_tokens,
                },
            ..
        }) => (ttft_ms, cached_tokens),
        other => panic!("{other:?}"),
    }
}

#[test]
fn queued_work_drains_at_the_learned_rate_and_a_first_token_clears_what_was_sent_before() {
    let long = request(1, 0, 8_000);
    let short = |id| request(id, 0, 100);
    // Right after an 8,000-token prompt was sent, a short one waits for all of it (the prior
    // rate is 8,000 tokens/s).
    let mut r = routing(1);
    predicted_on_0(&mut r, &long, Nanos::ZERO);
    let (fresh, _) = predicted_on_0(&mut r, &short(2), Nanos::ZERO);
    assert!(fresh > 900.0, "{fresh}");
    // 0.75 s later most of it is computed.
    let mut r = routing(1);
    predicted_on_0(&mut r, &long, Nanos::ZERO);
    let (later, _) = predicted_on_0(&mut r, &short(2), Nanos::from_millis(750));
    assert!(
        later < fresh - 600.0 && later > 100.0,
        "{later} ms after 750 ms of draining, {fresh} ms fresh"
    );
    // Its first token means it is all computed, and only what was sent after it is ahead.
    r.first_token(
        long.id,
        EndpointId(0),
        Nanos::from_millis(200),
        Nanos::from_millis(200),
    );
    let (after, _) = predicted_on_0(&mut r, &short(3), Nanos::from_millis(200));
    assert!(after < 100.0, "{after}");
}

#[test]
fn siblings_count_the_prefix_an_earlier_call_is_prefilling_as_cached() {
    // A 5,000-token shared prefix, 100 tokens of each call's own. The engine caches blocks as
    // it schedules them, so the second call finds the whole prefix cached even though it is
    // admitted in the iteration that computes the first call's last chunk (5,100 % 2,048 =
    // 1,004 tokens, 904 of them the prefix's).
    let mut r = routing(1);
    let at = Nanos::ZERO;
    let (_, first) = predicted_on_0(&mut r, &request(1, 5_000, 5_100), at);
    assert_eq!(first, 0);
    for id in 2..6 {
        let (_, cached) = predicted_on_0(&mut r, &request(id, 5_000, 5_100), at);
        assert!((4_984..=5_000).contains(&cached), "call {id}: {cached}");
    }
}

#[test]
fn a_sibling_that_missed_an_in_flight_prefix_does_not_make_the_index_forget_what_is_held() {
    let mut r = routing(1);
    let e = EndpointId(0);
    let serve_alone = |r: &mut Routing, req: &Request, at: Nanos, cached: u32| {
        predicted_on_0(r, req, at);
        serve(r, req, e, at, Nanos::from_millis(200), cached);
    };
    // A is served and cached; so are the first 1,000 tokens of another prefix, X.
    serve_alone(&mut r, &request(1, 4_000, 4_200), Nanos::ZERO, 0);
    let x = |id: u64, shared: u32, len: u32| {
        Request::from_tokens(
            id,
            (0..len)
                .map(|i| {
                    if i < shared {
                        500_000 + i
                    } else {
                        600_000 + id as u32 * 10_000 + i
                    }
                })
                .collect(),
        )
    };
    serve_alone(&mut r, &x(2, 1_000, 1_100), Nanos::from_millis(500), 0);
    // B and C share 3,000 tokens of X and go out together: C counts the part of X that B is
    // still computing as soon cached, but an engine that admits C before it caches B's blocks
    // reports only the 1,000 tokens held before.
    let at = Nanos::from_secs(1);
    let (b, c) = (x(3, 3_000, 3_100), x(4, 3_000, 3_100));
    predicted_on_0(&mut r, &b, at);
    let (_, counted) = predicted_on_0(&mut r, &c, at);
    assert!(counted >= 2_000, "the in-flight part counts: {counted}");
    serve(&mut r, &b, e, at, Nanos::from_millis(400), 1_000);
    serve(&mut r, &c, e, at, Nanos::from_millis(450), 1_000);
    // That shortfall is no eviction: A is still listed.
    let (_, cached) = predicted_on_0(&mut r, &request(5, 4_000, 4_200), Nanos::from_secs(2));
    assert!(
        cached >= 3_984,
        "A's prefix is still predicted cached: {cached}"
    );
}

/// The endpoints a burst of `calls` sharing a 4,000-token prompt and 1,000 tokens of context
/// goes to, on two replicas busy half the last 10 s, when only replica 0 has computed the
/// prompt.
fn burst_homes(replicate: bool, session: bool, calls: u64) -> Vec<EndpointId> {
    let config = Config {
        replicate_shared_prefixes: replicate,
        second_copies: false,
        ..Config::default()
    };
    let mut r = Routing::new(&PolicyConfig::PredictedTtft(config), 1);
    for i in 0..2 {
        r.router_mut().add(EndpointView::new(EndpointId(i)));
    }
    let only = |e: u32| move |v: &EndpointView| v.id == EndpointId(e);
    let warm = request(1, 4_000, 4_200);
    r.route(&warm, Nanos::ZERO, &only(0));
    serve(
        &mut r,
        &warm,
        EndpointId(0),
        Nanos::ZERO,
        Nanos::from_millis(500),
        0,
    );
    for e in 0..2u32 {
        let background = request(10 + u64::from(e), 0, 8_000);
        r.route(&background, Nanos::ZERO, &only(e));
        let busy = Nanos::from_secs(7);
        r.first_token(background.id, EndpointId(e), busy, busy);
    }
    let at = Nanos::from_secs(7);
    (0..calls)
        .map(|k| {
            let tokens = (0..5_300)
                .map(|i| match i {
                    0..4_000 => i,
                    4_000..5_000 => 500_000 + i,
                    _ => 1_000_000 + k as u32 * 10_000 + i,
                })
                .collect();
            let mut call = Request::from_tokens(100 + k, tokens);
            if session {
                call = call.with_session("parent");
            }
            r.route(&call, at, &accept_all).endpoint().unwrap()
        })
        .collect()
}

#[test]
fn a_burst_copies_a_shared_prompt_its_siblings_are_queueing_for() {
    let copies = |homes: &[EndpointId]| homes.iter().filter(|&&e| e == EndpointId(1)).count();
    let charged = burst_homes(false, true, 40);
    let replicated = burst_homes(true, true, 40);
    assert_eq!(
        replicated[0],
        EndpointId(0),
        "the first call goes where the prompt is"
    );
    assert!(
        copies(&replicated) > copies(&charged) && copies(&charged) <= 2,
        "copying the shared prompt is not charged as load: {} calls to the second replica, \
         {} when it is",
        copies(&replicated),
        copies(&charged)
    );
    // Without a session name, a prefix on one replica may be a conversation's history.
    assert_eq!(copies(&burst_homes(true, false, 40)), copies(&charged));
}

#[test]
fn the_iteration_in_progress_is_waited_for_and_not_learned_as_prefill() {
    let mut r = routing(2);
    let ms = Nanos::from_millis;
    // Both engines iterate every 40 ms; endpoint 0's iteration ended at 1,000 ms, endpoint 1's
    // at 1,030 ms.
    for (e, end) in [(0, 1_000), (1, 1_030)] {
        for k in 0..4 {
            r.tokens(EndpointId(e), ms(end - 120 + 40 * k));
        }
    }
    let req = request(1, 0, 100);
    let d = r.route(&req, ms(1_035), &accept_all);
    assert_eq!(
        d.endpoint(),
        Some(EndpointId(0)),
        "5 ms to wait there, 35 ms here"
    );
    let Decision::Route(Route {
        reason: Reason::PredictedTtft { ttft_ms, .. },
        ..
    }) = d
    else {
        panic!("{d:?}")
    };
    let idle = {
        let mut fresh = routing(1);
        let d = fresh.route(&request(2, 0, 100), ms(1_035), &accept_all);
        match d {
            Decision::Route(Route {
                reason: Reason::PredictedTtft { ttft_ms, .. },
                ..
            }) => ttft_ms,
            _ => panic!("{d:?}"),
        }
    };
    assert!((ttft_ms - idle - 5.0).abs() < 1e-6, "{ttft_ms} vs {idle}");
    // A first token 5 ms of phase plus 20 ms of work later teaches the model 20 ms, not 25.
    serve(&mut r, &req, EndpointId(0), ms(1_035), ms(25), 0);
    let model = r.router_mut().models(ms(1_060));
    let m = model.iter().find(|(id, _)| *id == EndpointId(0)).unwrap().1;
    let taught = {
        let mut other = routing(1);
        let q = request(3, 0, 100);
        other.route(&q, ms(1_040), &accept_all);
        serve(&mut other, &q, EndpointId(0), ms(1_040), ms(20), 0);
        other.router_mut().models(ms(1_060))[0].1
    };
    assert_eq!(m, taught);
}

#[test]
fn cached_tokens_are_predicted_in_whole_blocks_once_the_engine_reports_its_block_size() {
    let cached_of = |block_size: Option<u32>| {
        let mut r = routing(1);
        let now = Nanos::ZERO;
        let observation = crate::Observation {
            block_size,
            ..crate::Observation::default()
        };
        r.router_mut().observed(EndpointId(0), observation, now);
        let first = request(1, 530, 530);
        r.route(&first, now, &accept_all);
        serve(
            &mut r,
            &first,
            EndpointId(0),
            now,
            Nanos::from_millis(50),
            0,
        );
        let at = Nanos::from_millis(100);
        match r.route(&request(2, 530, 1_000), at, &accept_all) {
            Decision::Route(Route {
                reason: Reason::PredictedTtft { cached_tokens, .. },
                ..
            }) => cached_tokens,
            other => panic!("{other:?}"),
        }
    };
    // The engine caches whole blocks: of a 530-token shared prefix, 33 blocks of 16.
    assert_eq!(cached_of(Some(16)), 528);
    assert_eq!(cached_of(None), 530);
}

#[test]
fn a_text_index_learns_how_the_engine_counts_a_new_turn_and_keeps_what_it_holds() {
    // Two chats on one endpoint, keyed by text. The engine counts each new turn's 400 bytes as
    // 130 tokens where the text's average says 100 (a turn's chat-template tokens have no
    // text), so every hit reports 30-45 tokens fewer cached than the bytes read in proportion.
    let mut r = routing(1);
    let e = EndpointId(0);
    let chat = |id: u64, turns: u64| {
        let text: String = (0..turns)
            .map(|t| format!("chat {id:>3} turn {t:>3} {}", "x".repeat(382)))
            .collect();
        Request::from_text(id * 1_000 + turns, text)
    };
    let mut at = Nanos::ZERO;
    let mut send = |r: &mut Routing, req: &Request, first: bool| {
        let (_, predicted) = predicted_on_0(r, req, at);
        let cached = if first {
            0
        } else {
            let c = req.prompt_tokens - 130;
            c - c % 16
        };
        serve(r, req, e, at, Nanos::from_millis(100), cached);
        at = at + Nanos::from_millis(500);
        (predicted, cached)
    };
    for turns in 1..=40 {
        send(&mut r, &chat(1, turns), turns == 1);
    }
    // The other chat arrives; the first goes on, every one of its turns a hit.
    send(&mut r, &chat(2, 5), true);
    for turns in 41..=50 {
        let (predicted, cached) = send(&mut r, &chat(1, turns), false);
        assert!(
            predicted.abs_diff(cached) <= 16,
            "turn {turns}: {predicted} predicted, {cached} reported"
        );
    }
    // Those hits were no evictions: the other chat is still listed.
    let (predicted, cached) = send(&mut r, &chat(2, 6), false);
    assert!(
        predicted.abs_diff(cached) <= 16,
        "{predicted} predicted, {cached} reported"
    );
}

#[test]
fn a_cached_replica_whose_batch_slots_are_all_taken_loses_to_a_recompute() {
    let pick_when = |waiting: u32| {
        // Without the second copy, which would place the shared prompt on the idle replica
        // before the slots fill.
        let config = Config {
            second_copies: false,
            ..Config::default()
        };
        let mut r = Routing::new(&PolicyConfig::PredictedTtft(config), 1);
        for i in 0..2 {
            r.router_mut().add(EndpointView::new(EndpointId(i)));
        }
        let home = EndpointId(0);
        let only_home = |v: &EndpointView| v.id == home;
        // One long conversation at home: 4,000 shared tokens, each turn decodes for 6 s.
        for k in 0..20u64 {
            let at = Nanos::from_secs(k * 2);
            let req = request(k, 4_000, 4_200);
            assert_eq!(r.route(&req, at, &only_home).endpoint(), Some(home));
            let ttft = Nanos::from_millis(100);
            r.first_token(req.id, home, at + ttft, ttft);
            let usage = Usage {
                prompt_tokens: req.prompt_tokens,
                cached_tokens: Some(if k == 0 { 0 } else { 4_000 }),
                output_tokens: 200,
            };
            r.usage(req.id, home, at + ttft, usage);
            r.completed(
                req.id,
                home,
                at + Nanos::from_millis(6_100),
                Nanos::from_millis(6_100),
                200,
            );
        }
        // Two scrapes in a row, each read by a pick: home runs 128 sequences with `waiting`
        // more queued; the other replica runs 10.
        let scrape = |running, waiting| crate::Observation {
            running,
            waiting,
            ..crate::Observation::default()
        };
        for (k, at) in [(0, Nanos::from_secs(59)), (1, Nanos::from_secs(60))] {
            r.router_mut().observed(home, scrape(128, waiting), at);
            r.router_mut().observed(EndpointId(1), scrape(10, 0), at);
            r.route(&request(50 + k, 0, 100), at, &accept_all);
        }
        r.route(
            &request(99, 4_000, 4_200),
            Nanos::from_secs(60),
            &accept_all,
        )
        .endpoint()
        .unwrap()
    };
    // Not full: the cached prefix wins.
    assert_eq!(pick_when(0), EndpointId(0));
    // 30 queued for a slot: the 31st arrival waits for 31 of 128 sequences decoding 6 s each
    // (about 1.5 s), longer than recomputing 4,200 tokens elsewhere.
    assert_eq!(pick_when(30), EndpointId(1));
}

/// Where a request of a 2,000-token prompt that other questions share goes, when only replica
/// 0 has computed it and 1,500 tokens of another prompt are queued there; replica 1 is idle.
/// `setup` runs on the routing first; the request names session `s` when `session`.
fn second_copy_pick(
    second_copies: bool,
    session: bool,
    setup: impl FnOnce(&mut Routing),
) -> EndpointId {
    let config = Config {
        second_copies,
        ..Config::default()
    };
    let mut r = Routing::new(&PolicyConfig::PredictedTtft(config), 1);
    for i in 0..2 {
        r.router_mut().add(EndpointView::new(EndpointId(i)));
    }
    let only = |e: u32| move |v: &EndpointView| v.id == EndpointId(e);
    for (k, at) in [(1, 0), (2, 1)] {
        let asked = request(k, 2_000, 2_100);
        let at = Nanos::from_secs(at);
        r.route(&asked, at, &only(0));
        let cached = if k == 1 { 0 } else { 2_000 };
        serve(
            &mut r,
            &asked,
            EndpointId(0),
            at,
            Nanos::from_millis(300),
            cached,
        );
    }
    setup(&mut r);
    r.route(&request(3, 0, 1_500), Nanos::from_secs(3), &only(0));
    let mut question = request(4, 2_000, 2_100);
    if session {
        question = question.with_session("s");
    }
    r.route(&question, Nanos::from_secs(3), &accept_all)
        .endpoint()
        .unwrap()
}

#[test]
fn a_shared_prompt_on_one_replica_gets_a_second_copy_where_no_prefill_waits() {
    // Queueing behind 1,500 tokens at home is predicted faster than recomputing 2,000.
    assert_eq!(second_copy_pick(false, false, |_| {}), EndpointId(0));
    assert_eq!(second_copy_pick(true, false, |_| {}), EndpointId(1));
    // A session's first request may make the copy too.
    assert_eq!(second_copy_pick(true, true, |_| {}), EndpointId(1));
}

#[test]
fn no_second_copy_once_a_cache_evicts_or_for_a_session_under_way() {
    // Replica 1's engine reports a miss on a prefix it was sent: its cache evicts.
    let evicting = |r: &mut Routing| {
        let only = |v: &EndpointView| v.id == EndpointId(1);
        for (k, at, cached) in [(20, 2_000, 0), (21, 2_500, 0)] {
            let other = Request::from_tokens(k, (0..1_000).map(|i| 700_000 + i).collect());
            let at = Nanos::from_millis(at);
            r.route(&other, at, &only);
            serve(
                r,
                &other,
                EndpointId(1),
                at,
                Nanos::from_millis(100),
                cached,
            );
        }
    };
    assert_eq!(second_copy_pick(true, false, evicting), EndpointId(0));
    // A session whose last request went to replica 0 keeps its history there.
    let under_way = |r: &mut Routing| {
        let earlier = request(30, 2_000, 2_050).with_session("s");
        r.route(&earlier, Nanos::from_secs(2), &|v: &EndpointView| {
            v.id == EndpointId(0)
        });
    };
    assert_eq!(second_copy_pick(true, true, under_way), EndpointId(0));
}
