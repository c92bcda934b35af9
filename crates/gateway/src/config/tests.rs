//! Configuration parsing and validation.

use super::*;

/// `yaml` parses but is refused as invalid (not as bad YAML).
#[track_caller]
fn assert_invalid(yaml: &str) {
    assert!(
        matches!(Config::from_yaml(yaml), Err(ConfigError::Invalid { .. })),
        "{yaml}"
    );
}

#[test]
fn the_readme_complete_file_parses_and_names_every_default() {
    let readme = include_str!("../../README.md");
    let start = readme.find("A complete file").unwrap();
    let block = &readme[start..];
    let yaml = block
        .split("```yaml\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .unwrap();
    let config = Config::from_yaml(yaml).unwrap();
    assert_eq!(config.listener, ListenerConfig::default());
    assert!(Config::from_yaml("admin_listen: 127.0.0.1:9090").is_err());
    assert!(Config::from_yaml("listener: {max_header_bytes: 100}").is_err());
}

/// Found by fuzzing: `1e300` passed as positive and `Duration::from_secs_f64` panicked when
/// the listener started. Below four nanoseconds (seen reading the same code) the sweep's
/// period rounds to zero, which panics in tokio.
#[test]
fn listener_timeouts_must_fit_a_duration() {
    for bad in ["1e300", "1e-10", "-1", ".nan", ".inf"] {
        for key in ["header_read_timeout_secs", "idle_timeout_secs"] {
            assert_invalid(&format!("listener: {{{key}: {bad}}}"));
        }
    }
    let config =
        Config::from_yaml("listener: {header_read_timeout_secs: 0.001, idle_timeout_secs: 1e9}")
            .unwrap();
    crate::listener::Listening::new(&config.listener, Default::default());
}

/// Found by fuzzing: these loaded, then building the gateway panicked (tokio's semaphore
/// beyond its permits, a TTFT window beyond what a `Vec` can hold) or aborted (a window of
/// 4294967295 samples asked for 32 GiB).
#[test]
fn sizes_the_gateway_allocates_from_are_bounded() {
    for yaml in [
        "admission: {max_concurrency: 18446744073709551615}",
        "hedge: {window: 18446744073709551615}",
        "hedge: {window: 4294967295}",
        "admission: {max_prefills: 0}",
        "admission: {max_prefills: 18446744073709551615}",
    ] {
        assert_invalid(yaml);
    }
    assert_eq!(
        Config::from_yaml("admission: {max_prefills: 3}")
            .unwrap()
            .admission
            .max_prefills,
        Some(3)
    );
    let config =
        Config::from_yaml("admission: {max_concurrency: 1}\nhedge: {window: 65536}").unwrap();
    crate::Gateway::with_seed(config, 1).unwrap();
}

#[test]
fn yaml_round_trip_with_policy_section() {
    let config = Config::from_yaml(
        "endpoints:\n  - url: http://127.0.0.1:9001/v1\n    weight: 2\n    model: m\n    labels: {zone: a}\npolicy:\n  name: cache_aware\n  cache_threshold: 0.5\n",
    )
    .unwrap();
    assert_eq!(config.endpoints[0].base_url(), "http://127.0.0.1:9001");
    assert_eq!(config.endpoints[0].display_name(), "127.0.0.1:9001");
    let PolicyConfig::CacheAware(c) = &config.policy else {
        panic!("{:?}", config.policy)
    };
    assert_eq!(c.cache_threshold, 0.5);
}

#[test]
fn unknown_fields_and_bad_values_are_refused() {
    assert!(matches!(
        Config::from_yaml("endpoint: []"),
        Err(ConfigError::Yaml(_))
    ));
    assert!(matches!(
        Config::from_yaml("policy: {name: cache_aware, cache_treshold: 0.5}"),
        Err(ConfigError::Yaml(_))
    ));
    assert!(matches!(
        Config::from_yaml("policy: {name: cache_aware, cache_threshold: 2}"),
        Err(ConfigError::Policy(_))
    ));
    assert!(matches!(
        Config::from_yaml("endpoints: [{url: 'ftp://x'}]"),
        Err(ConfigError::Invalid { .. })
    ));
}

#[test]
fn policy_params_are_set_by_name_including_nested_ones() {
    let mut config = Config::default();
    config.set_policy("cache_aware").unwrap();
    config
        .set_policy_param("balance_abs_threshold", "8")
        .unwrap();
    config.set_policy_param("load.expiry_ms", "250").unwrap();
    config.set_policy_param("key", "text").unwrap();
    let PolicyConfig::CacheAware(c) = &config.policy else {
        panic!()
    };
    assert_eq!(c.balance_abs_threshold, 8.0);
    assert_eq!(c.load.expiry_ms, 250);
    config.set_policy("round_robin").unwrap();
    assert!(config.set_policy_param("cache_threshold", "0.1").is_err());
    assert!(config.set_policy("nope").is_err());
}

/// `interval_ms: 18446744073709551615` used to load, and the scrape loop then overflowed
/// an `Instant`.
#[test]
fn scrape_periods_are_bounded() {
    for yaml in [
        "scrape: {interval_ms: 18446744073709551615}",
        "scrape: {interval_ms: 0}",
        "scrape: {timeout_ms: 18446744073709551615}",
        "scrape: {timeout_ms: 0}",
    ] {
        assert_invalid(yaml);
    }
    Config::from_yaml("scrape: {interval_ms: 86400000, timeout_ms: 1}").unwrap();
}

#[test]
fn endpoints_take_https_tiers_aliases_and_headers_and_refuse_what_cannot_work() {
    let ok = Config::from_yaml(
        "endpoints:\n  - {url: 'https://api.example.com/v1', tier: 1, model: m, served_as: [chat, fast], headers: {x-project: p}}",
    )
    .unwrap();
    assert_eq!(ok.endpoints[0].tier, 1);
    assert_eq!(ok.endpoints[0].base_url(), "https://api.example.com");
    for bad in [
        "endpoints: [{url: 'ftp://x'}]",
        "endpoints: [{url: 'https://'}]",
        // An alias needs the name to send upstream instead.
        "endpoints: [{url: 'http://x:1', served_as: [chat]}]",
        "endpoints: [{url: 'http://x:1', model: m, served_as: [m]}]",
        "endpoints: [{url: 'http://x:1', headers: {Authorization: 'Bearer k'}}]",
        "endpoints: [{url: 'http://x:1', headers: {'bad header': v}}]",
        "endpoints: [{url: 'http://x:1', kv_events: 'ipc:///tmp/x'}]",
    ] {
        assert_invalid(bad);
    }
    // A CA file that is not there fails the start, naming the file.
    let config =
        Config::from_yaml("endpoints: [{url: 'https://127.0.0.1:1', ca_file: no/such/ca.pem}]")
            .unwrap();
    let err = crate::Gateway::new(config).unwrap_err().to_string();
    assert!(err.contains("no/such/ca.pem"), "{err}");
}

#[test]
fn a_staged_continuations_heads_are_at_least_a_block() {
    for bad in [1, 15] {
        assert_invalid(&format!("resume: {{stage_tokens: {bad}}}"));
    }
    for good in [0, 16, 512] {
        let yaml = format!("resume: {{stage_tokens: {good}}}");
        assert_eq!(Config::from_yaml(&yaml).unwrap().resume.stage_tokens, good);
    }
}

#[test]
fn re_homing_keeps_at_least_one_session() {
    assert_invalid("resume: {rehome_s: 10, rehome_sessions: 0}");
    // On by default.
    assert_invalid("resume: {rehome_sessions: 0}");
    // Off, the bound is not read.
    let off = Config::from_yaml("resume: {rehome_s: 0, rehome_sessions: 0}").unwrap();
    assert_eq!(off.resume.rehome_s, 0);
    let on = Config::default().resume;
    assert_eq!((on.rehome_s, on.rehome_sessions), (10, 4_096));
}
