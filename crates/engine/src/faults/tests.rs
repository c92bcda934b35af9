use super::*;

#[test]
fn specs_parse_and_print_back() {
    for spec in [
        "429:retry_after=3",
        "500",
        "503:p=0.25",
        "reset",
        "stall_first",
        "stall_first:ms=200",
        "stall_mid:after=5,ms=100",
        "disconnect_mid:after=2",
        "slow_decode:factor=2.5",
        "drain",
        "low_confidence:p=0.5",
    ] {
        let fault: Fault = spec.parse().unwrap();
        assert_eq!(fault.to_string(), spec);
    }
    assert_eq!(
        "429".parse::<Fault>().unwrap().kind,
        FaultKind::RateLimited {
            retry_after_secs: 1
        }
    );
}

#[test]
fn bad_specs_are_rejected() {
    for spec in [
        "",
        "418",
        "429:ms=3",
        "500:p=2",
        "slow_decode:factor=0.5",
        "stall_mid:after",
        "stall_mid:after=0",
        "reset:x=1",
    ] {
        assert!(spec.parse::<Fault>().is_err(), "{spec}");
    }
}

#[test]
fn draws_follow_probability_with_a_fixed_seed() {
    let state = FaultState::new(vec!["500:p=0.5".parse().unwrap()], 42);
    let refused = (0..1000).filter(|_| state.draw().refuse.is_some()).count();
    let again = FaultState::new(vec!["500:p=0.5".parse().unwrap()], 42);
    let refused_again = (0..1000).filter(|_| again.draw().refuse.is_some()).count();
    assert_eq!(refused, refused_again);
    assert!((400..600).contains(&refused), "{refused}");
}

#[test]
fn first_listed_error_wins_and_engine_wide_kinds_are_visible() {
    let state = FaultState::new(vec!["503".parse().unwrap(), "429".parse().unwrap()], 1);
    assert_eq!(state.draw().refuse, Some(FaultKind::Unavailable));
    assert!(!state.draining());
    state.set(vec![
        "drain".parse().unwrap(),
        "slow_decode:factor=3".parse().unwrap(),
    ]);
    assert!(state.draining());
    assert_eq!(state.decode_factor(), 3.0);
    assert_eq!(state.draw().refuse, Some(FaultKind::Draining));
}
