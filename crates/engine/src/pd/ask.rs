//! What a request asks of disaggregation, read from its body's `kv_transfer_params` (vLLM)
//! or `bootstrap_*` fields (SGLang).

use super::Role;
use serde::Deserialize;
use serde_json::Value;

/// Which leg a request is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Ask {
    /// An ordinary request.
    Plain,
    /// A prefill leg: hold the KV under `key` once computed (`None`: vLLM, the engine names it
    /// and says so in its answer's `kv_transfer_params`).
    Prefill { key: Option<String> },
    /// A decode leg whose KV comes from a prefill engine.
    Decode(Source),
}

/// Where a decode leg's KV is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// Held by the engine at `host:port` under `key`; `waits` when the prefill may not have
    /// finished yet (SGLang sends both legs at once; vLLM's decode leg follows the answer).
    Remote {
        host: String,
        port: u16,
        key: String,
        waits: bool,
    },
    /// The parameters did not say where (vLLM then prefills locally).
    Invalid,
}

#[derive(Debug, Default, Deserialize)]
struct Fields {
    #[serde(default)]
    kv_transfer_params: Option<Value>,
    #[serde(default)]
    bootstrap_host: Option<Value>,
    #[serde(default)]
    bootstrap_port: Option<Value>,
    #[serde(default)]
    bootstrap_room: Option<Value>,
}

/// The first of a scalar or a one-element array (SGLang sends arrays for batched prompts).
fn first(v: Option<&Value>) -> Option<&Value> {
    match v? {
        Value::Array(a) => a.first(),
        Value::Null => None,
        other => Some(other),
    }
}

fn port(v: Option<&Value>) -> Option<u16> {
    first(v)?.as_u64().and_then(|p| u16::try_from(p).ok())
}

impl Ask {
    /// A prefill leg's key and prompt, to hold once it is computed.
    pub(crate) fn held(&self, prompt: &[u32]) -> Option<(Option<String>, Vec<u32>)> {
        match self {
            Ask::Prefill { key } => Some((key.clone(), prompt.to_vec())),
            _ => None,
        }
    }

    /// Reads `body` for an engine playing `role`. A leg for the other role is served as an
    /// ordinary request; an engine playing both serves SGLang's legs (which name no leg) as
    /// ordinary requests too.
    pub(crate) fn parse(body: &[u8], role: Role) -> Ask {
        let fields: Fields = serde_json::from_slice(body).unwrap_or_default();
        if let Some(Value::Object(p)) = &fields.kv_transfer_params {
            let flag = |k: &str| p.get(k).and_then(Value::as_bool) == Some(true);
            if flag("do_remote_decode") && role.prefills() {
                return Ask::Prefill { key: None };
            }
            if flag("do_remote_prefill") && role.decodes() {
                let host = p.get("remote_host").and_then(Value::as_str);
                let port = port(p.get("remote_port"));
                let key = p.get("remote_request_id").and_then(Value::as_str);
                let engine = p.get("remote_engine_id").and_then(Value::as_str);
                let blocks = p.get("remote_block_ids").is_some_and(Value::is_array);
                return Ask::Decode(match (host, port, key, engine, blocks) {
                    (Some(host), Some(port), Some(key), Some(_), true) => Source::Remote {
                        host: host.to_owned(),
                        port,
                        key: key.to_owned(),
                        waits: false,
                    },
                    _ => Source::Invalid,
                });
            }
            return Ask::Plain;
        }
        let Some(room) = first(fields.bootstrap_room.as_ref()).and_then(Value::as_u64) else {
            return Ask::Plain;
        };
        let key = format!("room-{room}");
        match role {
            Role::Both => Ask::Plain,
            Role::Prefill => Ask::Prefill { key: Some(key) },
            Role::Decode => {
                let host = first(fields.bootstrap_host.as_ref()).and_then(Value::as_str);
                Ask::Decode(match (host, port(fields.bootstrap_port.as_ref())) {
                    (Some(host), Some(port)) => Source::Remote {
                        host: host.to_owned(),
                        port,
                        key,
                        waits: true,
                    },
                    _ => Source::Invalid,
                })
            }
        }
    }
}
