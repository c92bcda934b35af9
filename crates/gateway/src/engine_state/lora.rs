//! What an engine's `/metrics` says of its LoRA adapters.
//!
//! vLLM sets `vllm:lora_requests_info{max_lora, waiting_lora_adapters, running_lora_adapters}`
//! to the current Unix time whenever its stats are logged; prometheus_client keeps every label
//! set it was ever set with as its own series, so the newest series (the largest value) is the
//! present. Adapter lists are comma-separated, sometimes with spaces (vLLM's docs show `", "`);
//! names are trimmed. A series with both lists empty (an idle engine) says nothing ran, but the
//! adapters of the newest non-empty series are still loaded: they become
//! [`AdapterState::recent`] (llm-d's scraper keeps the last non-empty series for that reason).
//! SGLang reports only counts: `sglang:lora_pool_slots_used` and `sglang:lora_pool_slots_total`.

use kvgate_core::lora::AdapterState;

/// The adapters in an OpenAI `/v1/models` answer: the ids listed with a `parent` model.
pub fn listed_adapters(body: &[u8]) -> Vec<String> {
    super::exposition::model_ids(body, |m| m["parent"].as_str().is_some())
}

/// One `vllm:lora_requests_info` series.
#[derive(Clone)]
struct Series {
    at: f64,
    max_lora: Option<u32>,
    running: Vec<String>,
    waiting: Vec<String>,
}

/// The adapters `text` (a Prometheus exposition) reports; `None` when it reports none.
pub fn parse_adapters(text: &str) -> Option<AdapterState> {
    let mut newest: Option<Series> = None;
    let mut newest_active: Option<Series> = None;
    let (mut used, mut total) = (None, None);
    for line in text.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("vllm:lora_requests_info{") {
            let Some(series) = series(rest) else { continue };
            let active = !(series.running.is_empty() && series.waiting.is_empty());
            if active && newest_active.as_ref().is_none_or(|s| series.at > s.at) {
                newest_active = Some(series.clone());
            }
            if newest.as_ref().is_none_or(|s| series.at > s.at) {
                newest = Some(series);
            }
        } else if let Some(v) = sample(line, "sglang:lora_pool_slots_used") {
            used = Some(used.unwrap_or(0) + v);
        } else if let Some(v) = sample(line, "sglang:lora_pool_slots_total") {
            total = Some(total.unwrap_or(0) + v);
        }
    }
    if let Some(now) = newest {
        let recent = newest_active.map(|s| s.running).unwrap_or_default();
        return Some(AdapterState {
            max_loras: now.max_lora,
            running: now.running,
            waiting: now.waiting,
            slots_used: None,
            recent,
        });
    }
    total.map(|total| AdapterState {
        max_loras: Some(total),
        slots_used: used,
        ..AdapterState::default()
    })
}

/// The labels and value after `vllm:lora_requests_info{`.
fn series(rest: &str) -> Option<Series> {
    let (labels, value) = split_labels(rest)?;
    let at = value.split_whitespace().next()?.parse::<f64>().ok()?;
    let mut series = Series {
        at,
        max_lora: None,
        running: Vec::new(),
        waiting: Vec::new(),
    };
    for (key, value) in labels {
        match key {
            "max_lora" => series.max_lora = value.trim().parse().ok(),
            "running_lora_adapters" => series.running = names(value),
            "waiting_lora_adapters" => series.waiting = names(value),
            _ => {}
        }
    }
    Some(series)
}

/// Splits `k="v",k2="v2"} value` into its label pairs (values may hold commas) and the rest.
fn split_labels(mut s: &str) -> Option<(Vec<(&str, &str)>, &str)> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start_matches([',', ' ']);
        if let Some(rest) = s.strip_prefix('}') {
            return Some((labels, rest));
        }
        let (key, rest) = s.split_once('=')?;
        let rest = rest.strip_prefix('"')?;
        let close = rest.find('"')?;
        labels.push((key.trim(), &rest[..close]));
        s = &rest[close + 1..];
    }
}

fn names(list: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if !out.iter().any(|n| n == name) {
            out.push(name.to_owned());
        }
    }
    out
}

/// The value of an unlabelled or labelled sample of `name`, as a count.
fn sample(line: &str, name: &str) -> Option<u32> {
    let rest = line.strip_prefix(name)?;
    let value = match rest.strip_prefix('{') {
        Some(labelled) => labelled.rsplit_once('}')?.1,
        None if rest.starts_with(' ') => rest,
        None => return None,
    };
    let v = value.split_whitespace().next()?.parse::<f64>().ok()?;
    (v.is_finite() && v >= 0.0).then_some(v as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_series_is_the_present_and_names_are_trimmed() {
        let text = "# TYPE vllm:lora_requests_info gauge\n\
            vllm:lora_requests_info{max_lora=\"2\",waiting_lora_adapters=\"\",running_lora_adapters=\"sql, chat\"} 1.7e9\n\
            vllm:lora_requests_info{max_lora=\"2\",waiting_lora_adapters=\"math\",running_lora_adapters=\"sql\"} 1.8e9\n\
            vllm:lora_requests_info{max_lora=\"2\",waiting_lora_adapters=\"\",running_lora_adapters=\"\"} 1.6e9\n";
        let state = parse_adapters(text).unwrap();
        assert_eq!(state.max_loras, Some(2));
        assert_eq!(state.running, ["sql"]);
        assert_eq!(state.waiting, ["math"]);
        assert_eq!(state.recent, ["sql"]);
    }

    #[test]
    fn an_idle_engine_keeps_its_last_adapters_as_recent() {
        let text = "vllm:lora_requests_info{max_lora=\"1\",waiting_lora_adapters=\"\",running_lora_adapters=\"sql\"} 100\n\
            vllm:lora_requests_info{max_lora=\"1\",waiting_lora_adapters=\"\",running_lora_adapters=\"\"} 200\n";
        let state = parse_adapters(text).unwrap();
        assert!(state.running.is_empty() && state.waiting.is_empty());
        assert_eq!(state.recent, ["sql"]);
        assert_eq!(state.affinity("sql"), kvgate_core::lora::Affinity::Running);
    }

    #[test]
    fn sglang_reports_slot_counts() {
        let text = "sglang:lora_pool_slots_used{tp_rank=\"0\"} 3\nsglang:lora_pool_slots_total 8\n";
        let state = parse_adapters(text).unwrap();
        assert_eq!((state.max_loras, state.slots_used), (Some(8), Some(3)));
        assert!(parse_adapters("vllm:num_requests_running 1\n").is_none());
    }
}

/// The files `scripts/real-vllm-lora.sh` captured from a real vLLM 0.32 serving adapters.
#[cfg(test)]
mod real_vllm {
    use super::*;

    fn fixture(name: &str) -> String {
        let path = format!("{}/../../test-data/vllm/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(path).unwrap()
    }

    #[test]
    fn reads_the_lora_gauge_vllm_wrote() {
        let state = parse_adapters(&fixture("lora-requests-info.txt")).unwrap();
        assert_eq!(state.max_loras, Some(1));
        // Three series (sql's, chat's, idle); the newest is the idle one, written after the last
        // request finished, and chat's is the newest with adapters.
        assert!(state.running.is_empty() && state.waiting.is_empty());
        assert_eq!(state.recent, ["chat"]);
    }

    #[test]
    fn reads_the_adapters_vllm_lists() {
        let body = fixture("models-lora.json");
        assert_eq!(listed_adapters(body.as_bytes()), ["sql", "chat"]);
    }
}
