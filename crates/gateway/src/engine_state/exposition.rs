//! What an engine's own answers say: its load and which process it is, from its Prometheus
//! exposition (`/metrics`), and the models it serves (`/v1/models`).
//!
//! Recognised names (summed over label sets, usage the maximum):
//! - vLLM: `vllm:num_requests_running`, `vllm:num_requests_waiting`,
//!   `vllm:kv_cache_usage_perc` (older `vllm:gpu_cache_usage_perc`), block counts
//!   `vllm:num_gpu_blocks` / `vllm:num_free_gpu_blocks` or the `num_gpu_blocks` label of
//!   `vllm:cache_config_info` (whose `block_size` label sizes the engine's cache in tokens);
//! - SGLang: `sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage`.

use kvgate_core::Observation;

/// Which run of an engine a scrape came from. A restarted engine at the same address has lost
/// its prefix cache, and only its metrics say so when the restart broke no request of ours (a
/// quick restart between scrapes, or one while it was idle): its process start
/// (`process_start_time_seconds`, prometheus_client's process collector in vLLM and SGLang), the
/// creation time of its prompt-token counter (`vllm:prompt_tokens_created`, prometheus_client's
/// `_created` series) and that counter itself (`vllm:prompt_tokens_total`,
/// `sglang:prompt_tokens_total`), which only a new process counts back down.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Incarnation {
    /// `process_start_time_seconds`.
    pub started: Option<f64>,
    /// The prompt-token counter's creation time.
    pub counted_since: Option<f64>,
    /// The prompt-token counter, summed over its label sets.
    pub prompt_tokens: Option<f64>,
}

impl Incarnation {
    /// Whether this scrape, taken after `before`, comes from a new process: a start time that
    /// changed, or a counter that went back. A signal one scrape lacks says nothing.
    pub fn restarted_since(&self, before: &Incarnation) -> bool {
        let changed =
            |a: Option<f64>, b: Option<f64>| matches!((a, b), (Some(a), Some(b)) if a != b);
        let went_back = matches!(
            (before.prompt_tokens, self.prompt_tokens),
            (Some(a), Some(b)) if b < a
        );
        changed(before.started, self.started)
            || changed(before.counted_since, self.counted_since)
            || went_back
    }
}

/// Parses Prometheus text exposition into an observation; `None` when no known metric appears.
pub fn parse_metrics(text: &str) -> Option<Observation> {
    parse_scrape(text).0
}

/// Parses Prometheus text exposition into an observation (`None` when no known metric appears)
/// and the engine's [`Incarnation`].
pub fn parse_scrape(text: &str) -> (Option<Observation>, Incarnation) {
    let mut obs = Observation::default();
    let mut run = Incarnation::default();
    let mut seen = false;
    let mut free: Option<u64> = None;
    let mut total: Option<u64> = None;
    let mut block_size: Option<u32> = None;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, labels, rest) = match line.find(['{', ' ']) {
            Some(i) if line.as_bytes()[i] == b'{' => {
                let Some(close) = line.rfind('}').filter(|&close| close > i) else {
                    continue;
                };
                (&line[..i], &line[i + 1..close], &line[close + 1..])
            }
            Some(i) => (&line[..i], "", &line[i..]),
            None => continue,
        };
        let Some(value) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        if !value.is_finite() {
            continue;
        }
        let count = value.max(0.0) as u32;
        match name {
            "vllm:num_requests_running" | "sglang:num_running_reqs" => {
                obs.running = obs.running.saturating_add(count);
            }
            "vllm:num_requests_waiting" | "sglang:num_queue_reqs" => {
                obs.waiting = obs.waiting.saturating_add(count);
            }
            "vllm:kv_cache_usage_perc" | "vllm:gpu_cache_usage_perc" | "sglang:token_usage" => {
                obs.kv_usage = obs.kv_usage.max(value.clamp(0.0, 1.0));
            }
            "vllm:num_gpu_blocks" => {
                total = Some(total.unwrap_or(0).saturating_add(value as u64));
            }
            "vllm:num_free_gpu_blocks" => {
                free = Some(free.unwrap_or(0).saturating_add(value as u64));
            }
            "process_start_time_seconds" => {
                run.started = Some(run.started.map_or(value, |s| s.max(value)));
                continue;
            }
            "vllm:prompt_tokens_created" | "sglang:prompt_tokens_created" => {
                run.counted_since = Some(run.counted_since.map_or(value, |s| s.max(value)));
                continue;
            }
            "vllm:prompt_tokens_total" | "sglang:prompt_tokens_total" => {
                run.prompt_tokens = Some(run.prompt_tokens.unwrap_or(0.0) + value.max(0.0));
                continue;
            }
            "vllm:cache_config_info" => {
                if let Some(blocks) = label(labels, "num_gpu_blocks").and_then(|v| v.parse().ok()) {
                    total.get_or_insert(blocks);
                }
                if let Some(size) = label(labels, "block_size").and_then(|v| v.parse().ok()) {
                    block_size.get_or_insert(size);
                }
                continue;
            }
            _ => continue,
        }
        seen = true;
    }
    obs.total_blocks = total;
    obs.free_blocks = free;
    obs.block_size = block_size;
    ((seen || total.is_some()).then_some(obs), run)
}

fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    labels.split(',').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches('"'))
    })
}

/// The model ids in an OpenAI `/v1/models` answer.
pub fn parse_models(body: &[u8]) -> Vec<String> {
    model_ids(body, |_| true)
}

/// The ids of the entries of an OpenAI `/v1/models` answer that `keep` accepts.
pub(crate) fn model_ids(body: &[u8], keep: impl Fn(&serde_json::Value) -> bool) -> Vec<String> {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else {
        return Vec::new();
    };
    value["data"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter(|m| keep(m))
                .filter_map(|m| m["id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vllm_names() {
        let text = "# HELP vllm:num_requests_running x\n\
            vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0\n\
            vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 2.0\n\
            vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\n\
            vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"1000\"} 1.0\n\
            vllm:prompt_tokens_total{model_name=\"m\"} 77\n";
        let obs = parse_metrics(text).unwrap();
        assert_eq!((obs.running, obs.waiting), (3, 2));
        assert_eq!(obs.kv_usage, 0.25);
        assert_eq!(obs.total_blocks, Some(1000));
        assert_eq!(obs.used_blocks(), Some(250));
        assert_eq!(obs.block_size, Some(16));
        assert_eq!(obs.capacity_tokens(), Some(16_000));
    }

    #[test]
    fn reads_sglang_names_and_sums_label_sets() {
        let text =
            "sglang:num_running_reqs{tp_rank=\"0\"} 4\nsglang:num_running_reqs{tp_rank=\"1\"} 1\n\
            sglang:num_queue_reqs 7 1700000000\nsglang:token_usage 0.5\n";
        let obs = parse_metrics(text).unwrap();
        assert_eq!((obs.running, obs.waiting, obs.kv_usage), (5, 7, 0.5));
        assert!(parse_metrics("other_metric 1\n").is_none());
    }

    #[test]
    fn reads_the_engine_s_incarnation_from_vllm_s_exposition() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../test-data/vllm/metrics.txt"
        ))
        .unwrap();
        let (obs, run) = parse_scrape(&text);
        assert!(obs.is_some());
        assert_eq!(run.started, Some(1_796_034_993.65));
        assert_eq!(run.counted_since, Some(1_796_035_065.947_257_5));
        assert_eq!(run.prompt_tokens, Some(16_070.0));
    }

    #[test]
    fn a_new_start_or_a_counter_gone_back_is_a_restart() {
        let run = |started, counted_since, prompt_tokens| Incarnation {
            started,
            counted_since,
            prompt_tokens,
        };
        let before = run(Some(100.0), Some(101.0), Some(5_000.0));
        assert!(!run(Some(100.0), Some(101.0), Some(5_000.0)).restarted_since(&before));
        assert!(!run(Some(100.0), Some(101.0), Some(9_000.0)).restarted_since(&before));
        assert!(run(Some(130.0), Some(101.0), Some(9_000.0)).restarted_since(&before));
        assert!(run(Some(100.0), Some(131.0), Some(9_000.0)).restarted_since(&before));
        assert!(run(Some(100.0), Some(101.0), Some(10.0)).restarted_since(&before));
        // Only the counter (SGLang without the process collector, say): it went back.
        assert!(run(None, None, Some(10.0)).restarted_since(&before));
        // A signal missing on either side says nothing.
        assert!(!run(None, None, None).restarted_since(&before));
        assert!(!before.restarted_since(&run(None, None, None)));
    }

    /// Found by fuzzing: a `}` before the first `{` sliced the line backwards and panicked.
    #[test]
    fn a_closing_brace_before_the_labels_is_skipped() {
        assert!(parse_metrics("}{").is_none());
        let obs = parse_metrics("x}{y 1\nvllm:num_requests_running 2\n").unwrap();
        assert_eq!(obs.running, 2);
    }

    /// Found by fuzzing: block counts an engine reports overflowed when summed over label sets
    /// or multiplied by the block size (a panic in debug builds, a wrapped count in release).
    #[test]
    fn huge_block_counts_saturate() {
        let text =
            "vllm:cache_config_info{block_size=\"32\",num_gpu_blocks=\"18446744073709551615\"} 1\n\
            vllm:num_gpu_blocks 128\n\
            vllm:num_free_gpu_blocks 1e30\nvllm:num_free_gpu_blocks 1\n";
        let obs = parse_metrics(text).unwrap();
        assert_eq!(obs.total_blocks, Some(u64::MAX));
        assert_eq!(obs.free_blocks, Some(u64::MAX));
        assert_eq!(obs.capacity_tokens(), Some(u64::MAX));
    }

    #[test]
    fn reads_model_lists() {
        assert_eq!(
            parse_models(br#"{"object":"list","data":[{"id":"a"},{"id":"b"}]}"#),
            vec!["a", "b"]
        );
        assert!(parse_models(b"nope").is_empty());
    }
}
