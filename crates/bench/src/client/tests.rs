use super::*;

#[test]
fn target_resolves_base_v1_and_full_urls() {
    let t = Target::new("http://h:1/", Api::Chat);
    assert_eq!(t.endpoint(), "http://h:1/v1/chat/completions");
    assert_eq!(t.models, "http://h:1/v1/models");
    let t = Target::new("http://h:1/v1", Api::Completions);
    assert_eq!(t.endpoint(), "http://h:1/v1/completions");
    let t = Target::new("http://h:1/v1/chat/completions", Api::Completions);
    assert_eq!(t.endpoint(), "http://h:1/v1/chat/completions");
    assert_eq!(t.models, "http://h:1/v1/models");
}

#[test]
fn replicas_share_a_target_evenly_and_labels_name_it() {
    let t = Target::new("three=http://a:1,http://b:1/v1,http://c:1", Api::Chat);
    assert_eq!(t.name, "three");
    assert_eq!(t.models, "http://a:1/v1/models");
    let mut counts = std::collections::HashMap::new();
    for _ in 0..3000 {
        *counts.entry(t.endpoint().to_owned()).or_insert(0) += 1;
    }
    assert_eq!(counts.len(), 3);
    assert!(
        counts.values().all(|&n| (900..1100).contains(&n)),
        "{counts:?}"
    );
    assert_eq!(
        Target::new("http://h:1/?a=b", Api::Chat).name,
        "http://h:1/?a=b"
    );
}

#[test]
fn meter_parses_sse_split_across_reads() {
    let t0 = Instant::now();
    let mut m = Meter::default();
    let text = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n\
                data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n\
                data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\r\n\r\n\
                data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":2,\
                \"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\ndata: [DONE]\n\n";
    for (i, piece) in text.as_bytes().chunks(7).enumerate() {
        m.feed(Some(piece), t0 + Duration::from_millis(i as u64));
    }
    assert!(m.done && !m.failed);
    assert_eq!(m.chunks, 2);
    assert_eq!(m.itl_ms.len(), 1);
    assert_eq!(
        (m.usage_output, m.prompt_tokens, m.cached_tokens),
        (Some(2), 10, Some(4))
    );
}

#[test]
fn body_has_stream_options_and_ignore_eos() {
    let spec = RequestSpec {
        model: None,
        messages: vec![Message {
            role: "user".into(),
            content: "hi".into(),
        }],
        max_tokens: 3,
        user: Some("session-1".into()),
    };
    let opts = BodyOptions {
        model: "m".into(),
        api: Api::Chat,
        stream: true,
        ignore_eos: true,
    };
    let v: serde_json::Value = serde_json::from_slice(&body(&spec, &opts)).unwrap();
    assert_eq!(v["stream_options"]["include_usage"], true);
    assert_eq!(v["ignore_eos"], true);
    assert_eq!(v["messages"][0]["content"], "hi");
    assert_eq!(v["user"], "session-1");
    let spec = RequestSpec { user: None, ..spec };
    let opts = BodyOptions {
        api: Api::Completions,
        stream: false,
        ignore_eos: false,
        ..opts
    };
    let v: serde_json::Value = serde_json::from_slice(&body(&spec, &opts)).unwrap();
    assert_eq!(v["prompt"], "hi");
    assert!(v.get("ignore_eos").is_none() && v.get("stream_options").is_none());
    assert!(v.get("user").is_none());
}

#[test]
fn tpot_follows_the_definition() {
    let r = Record {
        ttft_ms: Some(100.0),
        e2e_ms: 190.0,
        output_tokens: 10,
        ..Record::default()
    };
    assert_eq!(r.tpot_ms(), Some(10.0));
    let one = Record {
        output_tokens: 1,
        ..r.clone()
    };
    assert_eq!(one.tpot_ms(), None);
}
