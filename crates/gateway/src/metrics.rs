//! The vocabulary of the gateway's Prometheus metrics: label sets, histogram buckets and the
//! families of requests and usage. Every concern registers its own families (`PoolMetrics` in
//! `crate::pool`, `TenantMetrics` in `crate::tenancy`, ...); `crate::telemetry` composes them
//! into the one registry `/metrics` encodes. Every name is prefixed `kvgate_` with its unit in
//! the name (Prometheus' naming practices: an application prefix, base units as suffixes).

use prometheus_client::encoding::EncodeLabelSet;
pub use prometheus_client::metrics::counter::Counter;
pub use prometheus_client::metrics::family::Family;
pub use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::exponential_buckets;
pub use prometheus_client::metrics::histogram::Histogram;
pub use prometheus_client::registry::{Registry, Unit};

/// `outcome`, `policy` and `endpoint` of a finished request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `ok`, `upstream_error`, `stream_error`, `cancelled`, `client_error`, `no_endpoint`,
    /// `queue_full` or `deadline`.
    pub outcome: &'static str,
    /// The policy's name.
    pub policy: &'static str,
    /// The endpoint that answered, or `none`.
    pub endpoint: String,
}

/// One label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabel {
    /// The endpoint's name.
    pub endpoint: String,
}

/// A policy's pick reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PickLabels {
    /// The policy.
    pub policy: &'static str,
    /// [`kvgate_core::Reason::label`].
    pub reason: &'static str,
}

/// Why something happened.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// The reason.
    pub reason: &'static str,
}

/// The policy in force.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabel {
    /// Its name.
    pub policy: &'static str,
}

/// How a cache prediction compared with the engine's usage.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `exact` (within one block), `over` or `under`.
    pub result: &'static str,
}

/// A gauge of floats.
pub type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

/// Scrape result per endpoint.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScrapeLabels {
    /// The endpoint.
    pub endpoint: String,
    /// `ok` or `error`.
    pub result: &'static str,
}

/// Histograms by label set, each made by one constructor.
pub type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// Buckets for latencies: 1 ms to about 2 minutes, doubling.
pub fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 18))
}

/// Buckets for a policy's decision time: 100 ns to about 0.1 s, doubling.
pub fn decision_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-7, 2.0, 20))
}

/// Requests as the client sees them: outcomes, latency, retries and hedges.
#[derive(Clone, Debug)]
pub struct RequestMetrics {
    /// Finished requests.
    pub requests: Family<RequestLabels, Counter>,
    /// Gateway-side time to first token.
    pub ttft: Histograms<PolicyLabel>,
    /// Time per output token after the first.
    pub tpot: Histograms<PolicyLabel>,
    /// End to end latency.
    pub e2e: Histograms<PolicyLabel>,
    /// Retries by cause.
    pub retries: Family<ReasonLabel, Counter>,
    /// Retries refused by the budget or the attempt limit.
    pub retries_denied: Family<ReasonLabel, Counter>,
    /// Hedges launched and won.
    pub hedges: Family<ReasonLabel, Counter>,
    /// Measured over predicted time to first token, streaming requests of a policy that
    /// predicts it.
    pub ttft_prediction_ratio: Histogram,
    /// `kvgate epp` requests: `picked`, `bad_request`, `no_endpoint`.
    pub epp_picks: Family<ReasonLabel, Counter>,
    /// Access-log lines dropped because the writer fell behind.
    pub access_log_dropped: Counter,
}

impl RequestMetrics {
    /// Every family, registered in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = RequestMetrics {
            requests: Family::default(),
            ttft: Family::new_with_constructor(latency_histogram),
            tpot: Family::new_with_constructor(latency_histogram),
            e2e: Family::new_with_constructor(latency_histogram),
            retries: Family::default(),
            retries_denied: Family::default(),
            hedges: Family::default(),
            ttft_prediction_ratio: Histogram::new(exponential_buckets(0.25, 1.25, 13)),
            epp_picks: Family::default(),
            access_log_dropped: Counter::default(),
        };
        registry.register(
            "requests",
            "Finished requests by outcome",
            metrics.requests.clone(),
        );
        registry.register_with_unit(
            "ttft",
            "Gateway-side time to first token by policy",
            Unit::Seconds,
            metrics.ttft.clone(),
        );
        registry.register_with_unit(
            "tpot",
            "Time per output token after the first, by policy",
            Unit::Seconds,
            metrics.tpot.clone(),
        );
        registry.register_with_unit(
            "e2e",
            "End-to-end request latency by policy",
            Unit::Seconds,
            metrics.e2e.clone(),
        );
        registry.register(
            "retries",
            "Retries before the first token, by cause",
            metrics.retries.clone(),
        );
        registry.register(
            "retries_denied",
            "Retries not made: budget exhausted or attempts used up",
            metrics.retries_denied.clone(),
        );
        registry.register(
            "hedges",
            "Hedged attempts launched and won",
            metrics.hedges.clone(),
        );
        registry.register(
            "ttft_prediction_ratio",
            "Measured over predicted time to first token (streams, predicted_ttft)",
            metrics.ttft_prediction_ratio.clone(),
        );
        registry.register(
            "epp_picks",
            "Endpoint-picker (kvgate epp) requests: picked, or answered by the proxy and why",
            metrics.epp_picks.clone(),
        );
        registry.register(
            "access_log_dropped",
            "Access-log lines dropped because the writer fell behind",
            metrics.access_log_dropped.clone(),
        );
        metrics
    }

    /// Counts one finished request.
    pub fn request(&self, outcome: &'static str, policy: &'static str, endpoint: &str) {
        self.requests
            .get_or_create(&RequestLabels {
                outcome,
                policy,
                endpoint: endpoint.to_string(),
            })
            .inc();
    }
}

/// Tokens and dollars per endpoint, from the engines' usage.
#[derive(Clone, Debug)]
pub struct UsageMetrics {
    /// Prompt tokens per endpoint, from the engines' usage.
    pub prompt_tokens: Family<EndpointLabel, Counter>,
    /// Prompt tokens the engines' prefix caches served, per endpoint (engines that report it).
    pub cached_tokens: Family<EndpointLabel, Counter>,
    /// Prompt tokens of answers whose usage reported cached tokens, per endpoint: the hit
    /// ratio's denominator, so engines that do not report hits do not dilute it.
    pub cache_checked_tokens: Family<EndpointLabel, Counter>,
    /// Output tokens per endpoint.
    pub output_tokens: Family<EndpointLabel, Counter>,
    /// Dollars spent per endpoint: usage at the deployment's price.
    pub cost_usd: Family<EndpointLabel, Counter<f64, std::sync::atomic::AtomicU64>>,
}

impl UsageMetrics {
    /// Every family, registered in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = UsageMetrics {
            prompt_tokens: Family::default(),
            cached_tokens: Family::default(),
            cache_checked_tokens: Family::default(),
            output_tokens: Family::default(),
            cost_usd: Family::default(),
        };
        registry.register(
            "prompt_tokens",
            "Prompt tokens per endpoint, from the engines' usage",
            metrics.prompt_tokens.clone(),
        );
        registry.register(
            "cached_tokens",
            "Prompt tokens served from the engine's prefix cache, per endpoint",
            metrics.cached_tokens.clone(),
        );
        registry.register(
            "cache_checked_tokens",
            "Prompt tokens of answers that reported cached tokens, per endpoint (hit ratio = cached / checked)",
            metrics.cache_checked_tokens.clone(),
        );
        registry.register(
            "output_tokens",
            "Output tokens per endpoint",
            metrics.output_tokens.clone(),
        );
        registry.register(
            "cost_usd",
            "Dollars spent per endpoint: the engines' usage at the deployment's price (endpoints[].price, else tenancy.prices), cached prompt tokens at the cached price",
            metrics.cost_usd.clone(),
        );
        metrics
    }
}

/// A label value for one reason.
pub fn reason(reason: &'static str) -> ReasonLabel {
    ReasonLabel { reason }
}

/// A label value for one endpoint.
pub fn endpoint(name: &str) -> EndpointLabel {
    EndpointLabel {
        endpoint: name.to_string(),
    }
}
