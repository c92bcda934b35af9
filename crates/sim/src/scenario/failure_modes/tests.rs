use super::*;
use crate::fleet::RequestRecord;
use serde_json::json;

fn record(session: u64, replica: u32, arrival_s: u64, ttft_ms: u64) -> RequestRecord {
    let arrival = Nanos::from_secs(arrival_s);
    RequestRecord {
        arrival,
        first_token: Some(arrival + Nanos::from_millis(ttft_ms)),
        finished: None,
        replica,
        router: 0,
        prompt_tokens: 1_000,
        cached_tokens: 0,
        output_tokens: 1,
        tag: 0,
        tenant: None,
        session: Some(session),
        retries: 0,
        failed: false,
        predicted_ttft_ms: None,
        predicted_cached: None,
        resumed: None,
    }
}

#[test]
fn only_the_first_request_of_a_session_displaced_by_the_loss_counts_as_a_recompute() {
    let mut o = Outcome::new(2);
    // Session 1 lived on replica 1 (lost at 100 s), session 2 on replica 0.
    o.records.push(record(1, 1, 90, 100));
    o.records.push(record(2, 0, 95, 100));
    // After the loss: session 1's next request recomputes (900 ms), its later ones do not.
    o.records.push(record(1, 0, 105, 900));
    o.records.push(record(1, 0, 110, 120));
    o.records.push(record(2, 0, 106, 110));
    let keys = before_and_after(&o, Nanos::from_secs(100), Some(1));
    assert_eq!(keys["recomputes_30s_after"], json!(1));
    assert_eq!(keys["requests_30s_after"], json!(3));
    assert_eq!(keys["recompute_ttft_p50"], json!(900.0));
    let without = keys["ttft_p95_30s_after_without_recomputes"]
        .as_f64()
        .unwrap();
    let with = keys["ttft_p95_30s_after"].as_f64().unwrap();
    assert!(without < 121.0 && with > 500.0, "{without} {with}");
}

#[test]
fn with_no_replica_lost_only_the_windows_are_reported() {
    let mut o = Outcome::new(2);
    o.records.push(record(1, 1, 90, 100));
    o.records.push(record(1, 0, 105, 300));
    o.records.push(record(2, 0, 140, 900));
    let keys = before_and_after(&o, Nanos::from_secs(100), None);
    let names: Vec<&str> = keys.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "requests_30s_after",
            "ttft_p95_30s_after",
            "ttft_p95_30s_before"
        ]
    );
    assert_eq!(keys["ttft_p95_30s_before"], json!(100.0));
    assert_eq!(keys["ttft_p95_30s_after"], json!(300.0));
    assert_eq!(keys["requests_30s_after"], json!(1));
}
