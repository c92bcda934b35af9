//! vLLM's Prometheus metrics (vLLM docs, "Production metrics"), with vLLM's names, types, labels
//! and buckets.
//!
//! Real vLLM (checked against `test-data/vllm/metrics.txt`) exposes every series with labels
//! `engine` (the engine index, "0" for one engine) and `model_name`; counters carry the `_total`
//! suffix; histograms use the bucket bounds below. The scheduler task updates one
//! [`MetricsState`] behind a mutex once per iteration; `/metrics` renders it.

use std::fmt::Write;

/// TTFT buckets of vLLM's `vllm:time_to_first_token_seconds`.
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// Buckets of vLLM's `vllm:inter_token_latency_seconds` and
/// `vllm:request_time_per_output_token_seconds`.
const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// Buckets of vLLM's per-request phase histograms (queue, prefill, decode, e2e).
const REQUEST_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// A cumulative histogram with fixed bounds.
#[derive(Clone, Debug)]
pub(crate) struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    pub(crate) fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    /// Records one observation in seconds.
    pub(crate) fn observe(&mut self, seconds: f64) {
        let idx = self.bounds.partition_point(|&b| b < seconds);
        if let Some(c) = self.counts.get_mut(idx) {
            *c += 1;
        }
        self.sum += seconds;
        self.count += 1;
    }
}

/// Every value `/metrics` shows.
#[derive(Clone, Debug)]
pub(crate) struct MetricsState {
    pub(crate) running: u32,
    pub(crate) waiting: u32,
    pub(crate) kv_usage: f64,
    pub(crate) prefix_queries: u64,
    pub(crate) prefix_hits: u64,
    pub(crate) preemptions: u64,
    pub(crate) prompt_tokens: u64,
    pub(crate) generation_tokens: u64,
    pub(crate) success_stop: u64,
    pub(crate) success_length: u64,
    pub(crate) success_abort: u64,
    pub(crate) ttft: Histogram,
    pub(crate) itl: Histogram,
    pub(crate) queue: Histogram,
    pub(crate) prefill: Histogram,
    pub(crate) decode: Histogram,
    pub(crate) e2e: Histogram,
    pub(crate) tpot: Histogram,
    pub(crate) inference: Histogram,
    /// Disaggregation's counters; rendered once any is non-zero or the engine plays a role.
    pub(crate) pd: crate::pd::PdMetrics,
    pub(crate) pd_shown: bool,
    /// The adapter gauges, when adapters are served.
    pub(crate) lora: Option<crate::backend::LoraStats>,
}

impl Default for MetricsState {
    fn default() -> Self {
        MetricsState {
            running: 0,
            waiting: 0,
            kv_usage: 0.0,
            prefix_queries: 0,
            prefix_hits: 0,
            preemptions: 0,
            prompt_tokens: 0,
            generation_tokens: 0,
            success_stop: 0,
            success_length: 0,
            success_abort: 0,
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            queue: Histogram::new(REQUEST_BUCKETS),
            prefill: Histogram::new(REQUEST_BUCKETS),
            decode: Histogram::new(REQUEST_BUCKETS),
            e2e: Histogram::new(REQUEST_BUCKETS),
            tpot: Histogram::new(ITL_BUCKETS),
            inference: Histogram::new(REQUEST_BUCKETS),
            pd: crate::pd::PdMetrics::default(),
            pd_shown: false,
            lora: None,
        }
    }
}

/// Static facts shown as the `vllm:cache_config_info` info gauge.
#[derive(Clone, Debug)]
pub(crate) struct CacheInfo {
    pub(crate) block_size: usize,
    pub(crate) num_gpu_blocks: usize,
    pub(crate) enable_prefix_caching: bool,
}

struct Writer<'a> {
    out: String,
    model_name: &'a str,
}

impl Writer<'_> {
    fn header(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    /// One sample; labels are written sorted by name, as prometheus_client does in vLLM.
    fn sample(&mut self, name: &str, extra: Option<(&str, &str)>, value: f64) {
        let mut labels: Vec<(&str, &str)> = vec![("engine", "0"), ("model_name", self.model_name)];
        labels.extend(extra);
        labels.sort_unstable_by_key(|(k, _)| *k);
        let _ = write!(self.out, "{name}{{");
        for (i, (k, v)) in labels.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            let _ = write!(self.out, "{sep}{k}=\"{}\"", escape(v));
        }
        let _ = writeln!(self.out, "}} {}", fmt_value(value));
    }

    fn gauge(&mut self, name: &str, help: &str, value: f64) {
        self.header(name, "gauge", help);
        self.sample(name, None, value);
    }

    fn counter(&mut self, name: &str, help: &str, value: u64) {
        self.header(name, "counter", help);
        self.sample(name, None, value as f64);
    }

    fn histogram(&mut self, name: &str, help: &str, h: &Histogram) {
        self.header(name, "histogram", help);
        let bucket = format!("{name}_bucket");
        let mut cumulative = 0;
        for (bound, count) in h.bounds.iter().zip(&h.counts) {
            cumulative += count;
            self.sample(&bucket, Some(("le", &fmt_value(*bound))), cumulative as f64);
        }
        self.sample(&bucket, Some(("le", "+Inf")), h.count as f64);
        self.sample(&format!("{name}_count"), None, h.count as f64);
        self.sample(&format!("{name}_sum"), None, h.sum);
    }
}

/// Python's float formatting as prometheus_client prints it (`1.0`, `0.25`, `2560.0`).
fn fmt_value(v: f64) -> String {
    if v.is_finite() && v == v.trunc() && v.abs() < 1e15 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

/// Escapes a label value for the text exposition format.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Requests running and waiting, and the KV cache's usage.
fn scheduler_gauges(w: &mut Writer<'_>, state: &MetricsState) {
    w.gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        f64::from(state.running),
    );
    w.gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        f64::from(state.waiting),
    );
    w.header(
        "vllm:num_requests_waiting_by_reason",
        "gauge",
        "Waiting requests by reason: capacity (no batch slot or KV blocks) or deferred (other constraints).",
    );
    // The engine model only ever waits for capacity.
    w.sample(
        "vllm:num_requests_waiting_by_reason",
        Some(("reason", "capacity")),
        f64::from(state.waiting),
    );
    w.sample(
        "vllm:num_requests_waiting_by_reason",
        Some(("reason", "deferred")),
        0.0,
    );
    w.gauge(
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        state.kv_usage,
    );
}

/// Prefix cache, preemption, token and finished-request counts.
fn counters(w: &mut Writer<'_>, state: &MetricsState) {
    w.counter(
        "vllm:prefix_cache_queries_total",
        "Prefix cache queries, in terms of number of queried tokens.",
        state.prefix_queries,
    );
    w.counter(
        "vllm:prefix_cache_hits_total",
        "Prefix cache hits, in terms of number of cached tokens.",
        state.prefix_hits,
    );
    w.counter(
        "vllm:num_preemptions_total",
        "Cumulative number of preemption from the engine.",
        state.preemptions,
    );
    w.counter(
        "vllm:prompt_tokens_total",
        "Number of prefill tokens processed.",
        state.prompt_tokens,
    );
    w.counter(
        "vllm:generation_tokens_total",
        "Number of generation tokens processed.",
        state.generation_tokens,
    );
    w.header(
        "vllm:request_success_total",
        "counter",
        "Count of successfully processed requests.",
    );
    for (reason, n) in [
        ("stop", state.success_stop),
        ("length", state.success_length),
        ("abort", state.success_abort),
        ("error", 0),
        ("repetition", 0),
    ] {
        w.sample(
            "vllm:request_success_total",
            Some(("finished_reason", reason)),
            n as f64,
        );
    }
}

/// The latency histograms, per phase of a request.
fn histograms(w: &mut Writer<'_>, state: &MetricsState) {
    w.histogram(
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        &state.ttft,
    );
    w.histogram(
        "vllm:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        &state.itl,
    );
    w.histogram(
        "vllm:request_time_per_output_token_seconds",
        "Histogram of time per output token (after the first) per request, in seconds.",
        &state.tpot,
    );
    w.histogram(
        "vllm:request_inference_time_seconds",
        "Histogram of time spent running (prefill and decode) per request, in seconds.",
        &state.inference,
    );
    w.histogram(
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        &state.e2e,
    );
    w.histogram(
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        &state.queue,
    );
    w.histogram(
        "vllm:request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
        &state.prefill,
    );
    w.histogram(
        "vllm:request_decode_time_seconds",
        "Histogram of time spent in DECODE phase for request.",
        &state.decode,
    );
}

/// The cache configuration, as the labels of an info gauge.
fn cache_config_info(w: &mut Writer<'_>, cache: &CacheInfo) {
    // The info gauge carries the cache configuration as labels (and `engine`, not `model_name`).
    w.header(
        "vllm:cache_config_info",
        "gauge",
        "Information of the LLMEngine CacheConfig",
    );
    let _ = writeln!(
        w.out,
        "vllm:cache_config_info{{block_size=\"{}\",enable_prefix_caching=\"{}\",engine=\"0\",num_gpu_blocks=\"{}\"}} 1.0",
        cache.block_size,
        if cache.enable_prefix_caching { "True" } else { "False" },
        cache.num_gpu_blocks
    );
}

/// Renders the Prometheus text exposition (format 0.0.4). `started` is the process's start,
/// unix seconds, shown unlabelled as prometheus_client's process collector shows it in vLLM.
pub(crate) fn render(
    state: &MetricsState,
    cache: &CacheInfo,
    model_name: &str,
    started: f64,
) -> String {
    let mut w = Writer {
        out: String::with_capacity(16 * 1024),
        model_name,
    };
    w.header(
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since unix epoch in seconds.",
    );
    let _ = writeln!(w.out, "process_start_time_seconds {}", fmt_value(started));
    scheduler_gauges(&mut w, state);
    counters(&mut w, state);
    histograms(&mut w, state);
    cache_config_info(&mut w, cache);
    if state.pd_shown {
        disaggregation(&mut w, &state.pd);
    }
    w.out
}

/// KV-transfer time buckets, seconds (a link moves a long prompt's KV in milliseconds to a
/// second).
pub(crate) const TRANSFER_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// Disaggregation's series, named as vLLM's NIXL connector names them, and kvgate's own for
/// what vLLM only logs.
fn disaggregation(w: &mut Writer<'_>, pd: &crate::pd::PdMetrics) {
    w.histogram(
        "vllm:nixl_xfer_time_seconds",
        "Histogram of transfer duration for NIXL KV Cache transfers.",
        &pd.xfer_time,
    );
    w.counter(
        "vllm:nixl_bytes_transferred_total",
        "Bytes transferred per NIXL KV Cache transfer, summed.",
        pd.bytes,
    );
    w.counter(
        "vllm:nixl_num_failed_transfers_total",
        "Number of failed NIXL KV Cache transfers.",
        pd.failed,
    );
    w.counter(
        "vllm:nixl_num_kv_expired_reqs_total",
        "Number of requests whose held KV expired before a decode engine read it.",
        pd.expired,
    );
    w.counter(
        "kvgate_kv_prefill_legs_total",
        "Prefill legs answered with their KV held for a decode engine.",
        pd.prefills,
    );
    w.counter(
        "kvgate_kv_transfers_total",
        "Decode legs that read their KV from a prefill engine.",
        pd.transfers,
    );
    w.counter(
        "kvgate_kv_transfer_invalid_params_total",
        "Decode legs with invalid transfer parameters, prefilled locally.",
        pd.invalid,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_le_inclusive() {
        let mut h = Histogram::new(&[0.1, 1.0]);
        h.observe(0.1);
        h.observe(0.5);
        h.observe(5.0);
        let state = MetricsState {
            ttft: h,
            ..MetricsState::default()
        };
        let cache = CacheInfo {
            block_size: 16,
            num_gpu_blocks: 10,
            enable_prefix_caching: true,
        };
        let text = render(&state, &cache, "m", 1.5);
        assert!(text.contains("\nprocess_start_time_seconds 1.5\n"));
        assert!(text.contains("vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.1\",model_name=\"m\"} 1.0\n"));
        assert!(text.contains("vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"1.0\",model_name=\"m\"} 2.0\n"));
        assert!(text.contains("vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"+Inf\",model_name=\"m\"} 3.0\n"));
        assert!(text.contains(
            "vllm:time_to_first_token_seconds_count{engine=\"0\",model_name=\"m\"} 3.0\n"
        ));
    }

    #[test]
    fn label_values_are_escaped() {
        let text = render(
            &MetricsState::default(),
            &CacheInfo {
                block_size: 16,
                num_gpu_blocks: 1,
                enable_prefix_caching: false,
            },
            "a\"b",
            0.0,
        );
        assert!(text.contains("model_name=\"a\\\"b\""));
    }
}
