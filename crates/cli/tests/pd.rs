//! Prefill/decode disaggregation through `kvgate serve` on real `kvgate engine` processes:
//! prefill and decode pools and a mixed fleet, vLLM's and SGLang's protocols, streams and
//! whole answers, and a failing prefill pool that costs no request.

mod support;

use support::{chat, client, config_file, engine, gateway, get_text, header, metric, Proc};

/// `kvgate engine` in `role` with `extra` flags.
fn role_engine(id: &str, role: &str, extra: &[&str]) -> Proc {
    let mut args = vec!["--role", role];
    args.extend_from_slice(extra);
    engine(id, "0", &args)
}

fn port(p: &Proc) -> u16 {
    p.url.rsplit(':').next().unwrap().parse().unwrap()
}

/// The gateway in front of `engines` (each with its role) and the `disaggregation` section.
async fn pd_gateway(name: &str, engines: &[(&Proc, &str)], disaggregation: &str) -> Proc {
    let mut yaml = String::from("endpoints:\n");
    for (e, role) in engines {
        yaml.push_str(&format!(
            "  - {{url: \"{}\", role: {role}, bootstrap_port: {}}}\n",
            e.url,
            port(e)
        ));
    }
    yaml.push_str(&format!("disaggregation: {disaggregation}\n"));
    let config = config_file(name, &yaml);
    gateway(&[], &["--config", config.to_str().unwrap()]).await
}

/// A long prompt unique to `tag`, as chat messages.
fn long(tag: &str) -> serde_json::Value {
    let text: String = (0..600).map(|i| format!("{tag}{i} ")).collect();
    serde_json::json!([{"role": "user", "content": text}])
}

/// Sends one request; returns (x-kvgate-endpoint, x-kvgate-disagg, prefill endpoint header).
async fn send(g: &Proc, tag: &str, stream: bool) -> (String, String, Option<String>) {
    let r = client()
        .post(format!("{}/v1/chat/completions", g.url))
        .json(&chat(long(tag), 12, stream))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let endpoint = header(&r, "x-kvgate-endpoint");
    let disagg = header(&r, "x-kvgate-disagg");
    let prefill = r
        .headers()
        .get("x-kvgate-prefill-endpoint")
        .map(|v| v.to_str().unwrap().to_owned());
    let text = r.text().await.unwrap();
    if stream {
        assert!(text.contains("[DONE]"), "{text}");
    } else {
        let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(answer["usage"]["completion_tokens"], 12, "{answer}");
    }
    (endpoint, disagg, prefill)
}

/// The sum of a counter over `engines`.
async fn total(engines: &[&Proc], name: &str) -> f64 {
    let mut sum = 0.0;
    for e in engines {
        let text = get_text(&client(), &e.url, "/metrics").await;
        sum += metric(&text, name).unwrap_or(0.0);
    }
    sum
}

fn name_of(p: &Proc) -> String {
    p.url.trim_start_matches("http://").to_owned()
}

async fn both_protocols_prefill_remotely(protocol: &str) {
    let p = [
        role_engine("p0", "prefill", &[]),
        role_engine("p1", "prefill", &[]),
    ];
    let d = [
        role_engine("d0", "decode", &[]),
        role_engine("d1", "decode", &[]),
    ];
    let fleet = [
        (&p[0], "prefill"),
        (&p[1], "prefill"),
        (&d[0], "decode"),
        (&d[1], "decode"),
    ];
    let section = format!("{{protocol: {protocol}, decision: {{mode: always}}}}");
    let g = pd_gateway(&format!("pd-{protocol}"), &fleet, &section).await;
    let decode_names: Vec<String> = d.iter().map(name_of).collect();
    let prefill_names: Vec<String> = p.iter().map(name_of).collect();
    for (i, stream) in [false, true, false, true].into_iter().enumerate() {
        let (endpoint, disagg, prefill) = send(&g, &format!("{protocol}{i}x"), stream).await;
        assert!(
            decode_names.contains(&endpoint),
            "{endpoint} is not a decode engine"
        );
        assert!(disagg.starts_with("remote; always"), "{disagg}");
        assert!(prefill_names.contains(&prefill.unwrap()));
    }
    let (p_refs, d_refs): (Vec<&Proc>, Vec<&Proc>) = (p.iter().collect(), d.iter().collect());
    assert_eq!(total(&p_refs, "kvgate_kv_prefill_legs_total").await, 4.0);
    assert_eq!(total(&d_refs, "kvgate_kv_transfers_total").await, 4.0);
    // The decode engines computed one token of each prompt: their prompts' KV came over.
    assert_eq!(
        total(&d_refs, "vllm:nixl_num_failed_transfers_total").await,
        0.0
    );
    let metrics = get_text(&client(), &g.url, "/metrics").await;
    let line = "kvgate_disagg_requests_total{mode=\"always\",outcome=\"remote\"}";
    assert_eq!(metric(&metrics, line), Some(4.0), "{metrics}");
    assert!(
        metrics.contains("kvgate_disagg_prefill_leg_seconds_count"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_legs_run_on_a_prefill_and_a_decode_pool() {
    both_protocols_prefill_remotely("vllm").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_legs_run_on_a_prefill_and_a_decode_pool() {
    both_protocols_prefill_remotely("sglang").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_prefill_pool_falls_back_to_local_prefill_without_failed_requests() {
    for protocol in ["vllm", "sglang"] {
        let p = role_engine("p0", "prefill", &["--fault", "500"]);
        let d = role_engine("d0", "decode", &[]);
        let both = role_engine("b0", "both", &[]);
        let fleet = [(&p, "prefill"), (&d, "decode"), (&both, "both")];
        let section = format!("{{protocol: {protocol}, decision: {{mode: always}}}}");
        let g = pd_gateway(&format!("pd-fail-{protocol}"), &fleet, &section).await;
        for (i, stream) in [true, false, true].into_iter().enumerate() {
            let (endpoint, disagg, prefill) = send(&g, &format!("f{protocol}{i}"), stream).await;
            assert_ne!(
                endpoint,
                name_of(&p),
                "a decode leg never goes to a prefill engine"
            );
            assert!(
                disagg.starts_with("fallback; always"),
                "{protocol} {i}: {disagg}"
            );
            assert_eq!(prefill, None);
        }
        assert_eq!(total(&[&d, &both], "kvgate_kv_transfers_total").await, 0.0);
        let metrics = get_text(&client(), &g.url, "/metrics").await;
        let fallback = "kvgate_disagg_requests_total{mode=\"always\",outcome=\"fallback\"}";
        assert_eq!(metric(&metrics, fallback), Some(3.0), "{metrics}");
        assert!(!metrics.contains("outcome=\"upstream_error\""), "{metrics}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_transfer_is_prefilled_by_the_decode_engine() {
    let p = role_engine("p0", "prefill", &["--fault", "kv_fail"]);
    let d = role_engine("d0", "decode", &[]);
    let g = pd_gateway(
        "pd-kv-fail",
        &[(&p, "prefill"), (&d, "decode")],
        "{decision: {mode: always}}",
    )
    .await;
    let (_, disagg, _) = send(&g, "kvfail", true).await;
    assert!(disagg.starts_with("remote"), "{disagg}");
    assert_eq!(
        total(&[&d], "vllm:nixl_num_failed_transfers_total").await,
        1.0
    );
    assert_eq!(total(&[&d], "kvgate_kv_transfers_total").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditional_mode_keeps_a_prompt_local_when_the_transfer_cannot_pay() {
    let p = role_engine("p0", "prefill", &[]);
    let d = role_engine("d0", "decode", &[]);
    let g = pd_gateway("pd-conditional", &[(&p, "prefill"), (&d, "decode")], "{}").await;
    // Idle engines: the remote leg pays the transfer and a decode step on top of the same
    // prefill.
    let (endpoint, disagg, prefill) = send(&g, "cond", false).await;
    assert_eq!(endpoint, name_of(&d));
    assert!(disagg.starts_with("local; local_cheaper"), "{disagg}");
    assert_eq!(prefill, None);
    let metrics = get_text(&client(), &g.url, "/metrics").await;
    let local = "kvgate_disagg_requests_total{mode=\"conditional\",outcome=\"local\"}";
    assert_eq!(metric(&metrics, local), Some(1.0), "{metrics}");
}
