use super::held::{digest, Held, Miss};
use super::{Ask, Role, Source};
use serde_json::json;
use std::time::{Duration, Instant};

fn ask(body: serde_json::Value, role: Role) -> Ask {
    Ask::parse(body.to_string().as_bytes(), role)
}

#[test]
fn vllm_parameters_name_the_leg_for_the_engines_role() {
    let prefill = json!({"kv_transfer_params": {"do_remote_decode": true}});
    assert_eq!(
        ask(prefill.clone(), Role::Prefill),
        Ask::Prefill { key: None }
    );
    assert_eq!(ask(prefill, Role::Decode), Ask::Plain);
    let decode = json!({"kv_transfer_params": {
        "do_remote_prefill": true, "remote_host": "10.0.0.1", "remote_port": 8100,
        "remote_request_id": "cmpl-1", "remote_engine_id": "p0", "remote_block_ids": [0, 1],
    }});
    let remote = Source::Remote {
        host: "10.0.0.1".into(),
        port: 8100,
        key: "cmpl-1".into(),
        waits: false,
    };
    assert_eq!(ask(decode.clone(), Role::Both), Ask::Decode(remote));
    assert_eq!(ask(decode, Role::Prefill), Ask::Plain);
    let missing = json!({"kv_transfer_params": {"do_remote_prefill": true, "remote_port": 1}});
    assert_eq!(ask(missing, Role::Decode), Ask::Decode(Source::Invalid));
    assert_eq!(
        ask(json!({"kv_transfer_params": null}), Role::Decode),
        Ask::Plain
    );
}

#[test]
fn sglang_bootstrap_fields_are_read_as_scalars_or_arrays() {
    let body = json!({"bootstrap_host": ["h"], "bootstrap_port": [9], "bootstrap_room": [7]});
    let key = "room-7".to_owned();
    assert_eq!(
        ask(body.clone(), Role::Prefill),
        Ask::Prefill {
            key: Some(key.clone())
        }
    );
    let remote = Source::Remote {
        host: "h".into(),
        port: 9,
        key,
        waits: true,
    };
    assert_eq!(ask(body.clone(), Role::Decode), Ask::Decode(remote));
    assert_eq!(ask(body, Role::Both), Ask::Plain);
    let no_port = json!({"bootstrap_host": "h", "bootstrap_port": null, "bootstrap_room": 7});
    assert_eq!(ask(no_port, Role::Decode), Ask::Decode(Source::Invalid));
}

#[tokio::test]
async fn held_kv_is_taken_once_for_its_prompt_and_expires() {
    let held = Held::new(Duration::from_secs(30));
    let prompt = [1, 2, 3];
    held.put("a".into(), &prompt, Instant::now());
    let wait = Duration::from_millis(1);
    assert_eq!(
        held.take("a", digest(&[9]), wait).await,
        Err(Miss::OtherPrompt)
    );
    assert_eq!(held.take("a", digest(&prompt), wait).await, Ok(3));
    assert_eq!(
        held.take("a", digest(&prompt), wait).await,
        Err(Miss::Absent)
    );
    let past = Instant::now() - Duration::from_secs(31);
    held.put("old".into(), &prompt, past);
    assert_eq!(
        held.take("old", digest(&prompt), wait).await,
        Err(Miss::Absent)
    );
    assert_eq!(
        held.put("b".into(), &prompt, Instant::now()),
        1,
        "the old lease expired"
    );
}

#[test]
fn roles_parse_by_name() {
    assert_eq!("prefill".parse::<Role>().unwrap(), Role::Prefill);
    assert!("mixed"
        .parse::<Role>()
        .unwrap_err()
        .to_string()
        .contains("prefill, decode, both"));
}
