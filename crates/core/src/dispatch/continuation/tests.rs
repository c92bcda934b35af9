use super::*;

const S: u64 = 1_000_000_000;

fn book(window_s: u64, sessions: usize) -> RehomeBook<&'static str, u64> {
    RehomeBook::new(Nanos(window_s * S), sessions, usize::MAX)
}

/// Request `id` of `session` sent at `at` seconds and ended on endpoint `on` then.
fn turn(b: &mut RehomeBook<&'static str, u64>, session: &'static str, id: u64, on: u32, at: u64) {
    b.remember(session, id, id, 2, Nanos(at * S));
    b.ended(id, EndpointId(on), Nanos(at * S));
}

fn sessions(displaced: &[(&'static str, u64, u64)]) -> Vec<&'static str> {
    displaced.iter().map(|(s, _, _)| *s).collect()
}

#[test]
fn a_session_s_next_turn_replaces_its_last_and_only_ended_turns_are_warmed() {
    let mut b = book(10, 16);
    turn(&mut b, "s1", 1, 0, 1);
    assert!(b.current(&"s1", 1));
    turn(&mut b, "s1", 2, 0, 2);
    assert!(!b.current(&"s1", 1) && b.current(&"s1", 2));
    // Still being answered: a stream that breaks is continued, which warms its session.
    b.remember("s2", 3, 3, 2, Nanos(2 * S));
    // Ended on endpoint 1 (a continuation finished it there): not endpoint 0's.
    turn(&mut b, "s3", 4, 0, 2);
    b.remember("s3", 5, 5, 2, Nanos(3 * S));
    b.ended(5, EndpointId(1), Nanos(3 * S));
    let displaced = b.displaced(EndpointId(0), Nanos(4 * S));
    assert_eq!(sessions(&displaced), ["s1"]);
    assert_eq!(
        (displaced[0].1, displaced[0].2),
        (2, 2),
        "its last turn's id and turn"
    );
    assert!(b.current(&"s2", 3));
}

#[test]
fn the_most_recent_go_first_and_ties_go_by_session() {
    let mut b = book(10, 16);
    turn(&mut b, "b", 1, 0, 1);
    turn(&mut b, "a", 2, 0, 1);
    turn(&mut b, "c", 3, 0, 3);
    assert_eq!(
        sessions(&b.displaced(EndpointId(0), Nanos(4 * S))),
        ["c", "a", "b"]
    );
}

#[test]
fn re_homing_starts_once_per_window_per_endpoint_and_not_at_all_when_off() {
    let mut b = book(10, 16);
    turn(&mut b, "s1", 1, 0, 0);
    turn(&mut b, "s2", 2, 1, 0);
    assert_eq!(sessions(&b.displaced(EndpointId(0), Nanos(S))), ["s1"]);
    assert!(b.displaced(EndpointId(0), Nanos(6 * S)).is_empty());
    assert_eq!(sessions(&b.displaced(EndpointId(1), Nanos(S))), ["s2"]);
    // A turn ended exactly a window before is still within it; a moment more is not.
    let mut b = book(10, 16);
    turn(&mut b, "s1", 1, 0, 0);
    assert_eq!(sessions(&b.displaced(EndpointId(0), Nanos(10 * S))), ["s1"]);
    let mut b = book(10, 16);
    turn(&mut b, "s1", 1, 0, 0);
    assert!(b.displaced(EndpointId(0), Nanos(10 * S + 1)).is_empty());
    let mut off = book(0, 16);
    turn(&mut off, "s1", 1, 0, 0);
    assert!(!off.current(&"s1", 1));
    assert!(off.displaced(EndpointId(0), Nanos(S)).is_empty());
}

#[test]
fn a_probe_goes_only_where_a_session_ended_and_one_at_a_time() {
    let mut b = book(10, 16);
    assert!(
        !b.should_probe(EndpointId(0), Nanos(S)),
        "nothing to re-home"
    );
    turn(&mut b, "s1", 1, 0, 1);
    assert!(b.should_probe(EndpointId(0), Nanos(2 * S)));
    assert!(
        !b.should_probe(EndpointId(0), Nanos(2 * S)),
        "one probe at a time"
    );
    b.probed(EndpointId(0));
    assert!(b.should_probe(EndpointId(0), Nanos(2 * S)));
    b.probed(EndpointId(0));
    assert_eq!(b.displaced(EndpointId(0), Nanos(3 * S)).len(), 1);
    assert!(
        !b.should_probe(EndpointId(0), Nanos(4 * S)),
        "re-homing started"
    );
}

#[test]
fn turns_that_ended_a_window_ago_are_let_go() {
    let mut b = book(10, 16);
    turn(&mut b, "s1", 1, 0, 0);
    turn(&mut b, "s2", 2, 0, 6);
    // Still being answered after the window: kept.
    b.remember("s3", 3, 3, 2, Nanos(6 * S));
    turn(&mut b, "s4", 4, 0, 11);
    assert!(!b.current(&"s1", 1));
    assert!(b.current(&"s2", 2) && b.current(&"s3", 3) && b.current(&"s4", 4));
    assert_eq!(b.kept(), (3, 6));
}

#[test]
fn the_oldest_sessions_give_way_to_either_bound() {
    let mut b = book(10, 2);
    for (id, s) in ["s1", "s2", "s3"].into_iter().enumerate() {
        turn(&mut b, s, id as u64, 0, 1);
    }
    assert!(!b.current(&"s1", 0) && b.current(&"s2", 1) && b.current(&"s3", 2));
    // A session that keeps coming back does not grow the bookkeeping.
    for id in 3..100 {
        turn(&mut b, "s3", id, 0, 1);
    }
    assert!(b.order.len() <= 5, "{}", b.order.len());
    assert!(b.open.is_empty());
    let mut b = RehomeBook::new(Nanos(10 * S), 16, 2_500);
    for (id, s) in ["s1", "s2", "s3"].into_iter().enumerate() {
        b.remember(s, id as u64, (), 1_000, Nanos(S));
    }
    assert!(!b.current(&"s1", 0) && b.current(&"s2", 1) && b.current(&"s3", 2));
    // A newer turn of a kept session replaces its weight, not adds to it.
    b.remember("s3", 3, (), 1_000, Nanos(S));
    assert_eq!(b.kept(), (2, 2_000));
}

#[test]
fn a_gate_admits_by_room_pin_and_yield() {
    let mut g = ContinuationGate::new(1);
    let (a, b) = (EndpointId(0), EndpointId(1));
    assert!(g.admits(a, None, false, 0) && g.admits(a, None, true, 0));
    assert!(
        !g.admits(a, None, true, 1),
        "yielding to a request awaiting its first token"
    );
    assert!(!g.admits(a, Some(b), false, 0), "pinned elsewhere");
    g.enter(a);
    assert!(!g.admits(a, None, false, 0) && g.admits(b, None, false, 0));
    assert_eq!(g.full(), [a]);
    g.leave(a);
    assert!(g.full().is_empty() && g.open.is_empty());
    g.enter(b);
    g.clear(b);
    assert!(g.has_room(b));
    let mut unlimited = ContinuationGate::new(0);
    unlimited.enter(a);
    unlimited.enter(a);
    assert!(unlimited.has_room(a) && unlimited.full().is_empty());
}

#[test]
fn a_head_that_adds_under_a_quarter_piece_is_held() {
    assert!(head_held(127, 512));
    assert!(!head_held(128, 512));
    assert!(head_held(0, 16));
}
