//! LoRA adapters as vLLM serves them (`--enable-lora`): adapters named at startup
//! (`--lora-modules name=path`) or loaded at runtime (`POST /v1/load_lora_adapter`
//! `{"lora_name", "lora_path"}`, `POST /v1/unload_lora_adapter` `{"lora_name"}`, which vLLM
//! allows with `VLLM_ALLOW_RUNTIME_LORA_UPDATING`), listed by `/v1/models` with the base model as
//! their `parent`, and used by a request whose `model` is an adapter's name (or SGLang's
//! `base:adapter`). The scheduling, the load time and the adapter-keyed prefix blocks are the
//! engine model's (`kvgate_sim::model::lora`); the gauge is vLLM's `vllm:lora_requests_info`.

use crate::error::ApiError;
use crate::state::Shared;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

/// The LoRA section of the engine's configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoraSettings {
    /// Serve adapters (vLLM `--enable-lora`); implied by `modules`.
    pub enable: bool,
    /// Adapters available from startup: `name=path` or a bare name (vLLM `--lora-modules`).
    pub modules: Vec<String>,
    /// Distinct adapters one batch may hold (vLLM `--max-loras`).
    pub max_loras: usize,
    /// Adapters kept in memory (vLLM `--max-cpu-loras`; `max_loras` when absent).
    pub max_cpu_loras: Option<usize>,
    /// Milliseconds of engine time to load an adapter that is not in memory.
    pub load_ms: f64,
}

impl Default for LoraSettings {
    fn default() -> Self {
        LoraSettings {
            enable: false,
            modules: Vec::new(),
            max_loras: 1,
            max_cpu_loras: None,
            load_ms: 100.0,
        }
    }
}

impl LoraSettings {
    /// Whether adapters are served.
    pub fn enabled(&self) -> bool {
        self.enable || !self.modules.is_empty()
    }

    /// The startup adapters as (name, path); a bare name's path is the name.
    pub(crate) fn adapters(&self) -> Vec<(String, String)> {
        self.modules
            .iter()
            .map(|m| match m.split_once('=') {
                Some((name, path)) => (name.trim().to_owned(), path.trim().to_owned()),
                None => (m.trim().to_owned(), m.trim().to_owned()),
            })
            .collect()
    }

    /// Why these settings cannot serve, if they cannot.
    pub(crate) fn problem(&self, model: &str) -> Option<String> {
        if self.max_loras == 0 {
            return Some("lora.max_loras must be at least 1".into());
        }
        if self.max_cpu_loras.is_some_and(|c| c < self.max_loras) {
            return Some("lora.max_cpu_loras must be at least lora.max_loras".into());
        }
        if !(self.load_ms.is_finite() && self.load_ms >= 0.0) {
            return Some("lora.load_ms must be a finite number >= 0".into());
        }
        let adapters = self.adapters();
        for (i, (name, _)) in adapters.iter().enumerate() {
            if name.is_empty() || name == model {
                return Some(format!(
                    "lora module `{name}` needs a name other than the base model's"
                ));
            }
            if adapters[..i].iter().any(|(n, _)| n == name) {
                return Some(format!("lora module `{name}` is named twice"));
            }
        }
        None
    }

    /// The engine model's view of these settings.
    pub(crate) fn model_config(&self) -> kvgate_sim::model::LoraConfig {
        kvgate_sim::model::LoraConfig {
            max_loras: self.max_loras,
            max_cpu_loras: self.max_cpu_loras.unwrap_or(self.max_loras),
            load: kvgate_core::Nanos((self.load_ms * 1e6).round() as u64),
        }
    }
}

/// The adapters the engine answers to now, name to path.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    adapters: Mutex<BTreeMap<String, String>>,
    /// Every `vllm:lora_requests_info` label set reported so far and when it was last set:
    /// prometheus_client keeps a label set's series once created, so old ones stay with their
    /// old timestamps.
    series: Mutex<BTreeMap<(String, String), f64>>,
}

impl Registry {
    pub(crate) fn new(settings: &LoraSettings) -> Self {
        Registry {
            adapters: Mutex::new(settings.adapters().into_iter().collect()),
            series: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, String>> {
        self.adapters.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The adapters, name and path, in name order.
    pub(crate) fn list(&self) -> Vec<(String, String)> {
        self.lock()
            .iter()
            .map(|(n, p)| (n.clone(), p.clone()))
            .collect()
    }

    /// Which adapter a request for `model` uses: `Ok(None)` for the base model, the adapter
    /// for its name or `base:adapter`, `Err` for a name the engine does not serve.
    pub(crate) fn resolve(&self, base: &str, model: &str) -> Result<Option<String>, ()> {
        if model == base {
            return Ok(None);
        }
        let name = match model.split_once(':') {
            Some((b, adapter)) if b == base => adapter,
            _ => model,
        };
        self.lock()
            .contains_key(name)
            .then(|| Some(name.to_owned()))
            .ok_or(())
    }

    /// Records the gauge's current label set at `now` (unix seconds).
    pub(crate) fn observe(&self, running: &[String], waiting: &[String], now: f64) {
        let mut series = self.series.lock().unwrap_or_else(|e| e.into_inner());
        series.insert((running.join(","), waiting.join(",")), now);
    }

    /// `vllm:lora_requests_info`, every label set it has had, each valued at when it was last
    /// set, written as vLLM 0.32 writes it (`test-data/vllm/lora-requests-info.txt`: labels
    /// `max_lora`, `running_lora_adapters`, `waiting_lora_adapters`; the time as
    /// prometheus_client formats a float, `1.7965514805616887e+09`).
    pub(crate) fn render(&self, out: &mut String, max_loras: usize) {
        let series = self.series.lock().unwrap_or_else(|e| e.into_inner());
        out.push_str("# HELP vllm:lora_requests_info Running stats on lora requests.\n");
        out.push_str("# TYPE vllm:lora_requests_info gauge\n");
        for ((running, waiting), at) in series.iter() {
            let _ = writeln!(
                out,
                "vllm:lora_requests_info{{max_lora=\"{max_loras}\",running_lora_adapters=\"{running}\",waiting_lora_adapters=\"{waiting}\"}} {}",
                go_float(*at)
            );
        }
    }
}

/// A Unix time as prometheus_client's `floatToGoString` writes it: Python's shortest digits in
/// Go's exponent form (`1.7965514805616887e+09`), which it uses past six digits before the point.
/// Only for values that large.
fn go_float(v: f64) -> String {
    let s = format!("{v:e}");
    match s.split_once('e') {
        Some((mantissa, exp)) => {
            let (sign, digits) = match exp.strip_prefix('-') {
                Some(d) => ('-', d),
                None => ('+', exp),
            };
            format!("{mantissa}e{sign}{digits:0>2}")
        }
        None => s,
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct LoadRequest {
    lora_name: String,
    #[serde(default)]
    lora_path: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct UnloadRequest {
    lora_name: String,
}

fn disabled() -> Response {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "LoRA is not enabled on this engine (start it with --enable-lora).",
    )
    .into_response()
}

/// `POST /v1/load_lora_adapter`, answered with vLLM's wording.
pub(crate) async fn load(
    State(shared): State<Arc<Shared>>,
    axum::Json(body): axum::Json<LoadRequest>,
) -> Response {
    if !shared.config.lora.enabled() {
        return disabled();
    }
    let name = body.lora_name.trim().to_owned();
    let Some(path) = body.lora_path.filter(|p| !p.is_empty()) else {
        return ApiError::bad_request("Both 'lora_name' and 'lora_path' must be provided.")
            .into_response();
    };
    if name.is_empty() || name == shared.config.model {
        return ApiError::bad_request(format!("Invalid LoRA adapter name `{name}`."))
            .into_response();
    }
    let mut adapters = shared.lora.lock();
    if adapters.contains_key(&name) {
        return ApiError::bad_request(format!(
            "The lora adapter '{name}' has already been loaded."
        ))
        .into_response();
    }
    adapters.insert(name.clone(), path);
    format!("Success: LoRA adapter '{name}' added successfully.").into_response()
}

/// `POST /v1/unload_lora_adapter`, answered with vLLM's wording.
pub(crate) async fn unload(
    State(shared): State<Arc<Shared>>,
    axum::Json(body): axum::Json<UnloadRequest>,
) -> Response {
    if !shared.config.lora.enabled() {
        return disabled();
    }
    let name = body.lora_name.trim();
    if shared.lora.lock().remove(name).is_none() {
        return ApiError::new(
            StatusCode::NOT_FOUND,
            format!("The lora adapter '{name}' cannot be found."),
        )
        .into_response();
    }
    format!("Success: LoRA adapter '{name}' removed successfully.").into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modules_resolve_by_name_and_sglang_form() {
        let settings = LoraSettings {
            modules: vec!["a=/adapters/a".into(), "b".into()],
            ..LoraSettings::default()
        };
        assert!(settings.enabled());
        assert_eq!(settings.problem("base"), None);
        let registry = Registry::new(&settings);
        assert_eq!(registry.resolve("base", "base"), Ok(None));
        assert_eq!(registry.resolve("base", "a"), Ok(Some("a".into())));
        assert_eq!(registry.resolve("base", "base:b"), Ok(Some("b".into())));
        assert_eq!(registry.resolve("base", "c"), Err(()));
        assert_eq!(registry.list()[0], ("a".into(), "/adapters/a".into()));
        let twice = LoraSettings {
            modules: vec!["a".into(), "a=x".into()],
            ..LoraSettings::default()
        };
        assert!(twice.problem("base").unwrap().contains("twice"));
    }

    #[test]
    fn every_label_set_stays_a_series() {
        let registry = Registry::new(&LoraSettings::default());
        registry.observe(&["a".into()], &[], 1.0e9);
        registry.observe(&["a".into()], &["b".into()], 1.5e9);
        let mut out = String::new();
        registry.render(&mut out, 1);
        assert!(out.contains(
            "vllm:lora_requests_info{max_lora=\"1\",running_lora_adapters=\"a\",waiting_lora_adapters=\"b\"} 1.5e+09"
        ));
        assert!(out.contains("running_lora_adapters=\"a\",waiting_lora_adapters=\"\"} 1e+09"));
        assert_eq!(go_float(1_796_551_480.561_688_7), "1.7965514805616887e+09");
    }
}
