//! The gateway's own Prometheus metrics, every name prefixed `kvgate_` with its unit in the name
//! (Prometheus' naming practices: an application prefix, base units as suffixes). Encoded with the
//! `prometheus-client` crate.

use prometheus_client::encoding::EncodeLabelSet;
pub use prometheus_client::metrics::counter::Counter;
pub use prometheus_client::metrics::family::Family;
pub use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

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

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 18))
}

fn decision_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-7, 2.0, 20))
}

/// Every metric the gateway exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
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
    /// Streams broken after the first token, by what became of them.
    pub stream_resumes: Family<ReasonLabel, Counter>,
    /// Time a continuation waited at the gateway for its endpoint's previous one.
    pub stream_resume_wait: Histogram,
    /// Warm-up heads of staged continuations that ended with their prefix computed.
    pub stream_resume_heads: Counter,
    /// Heads of staged continuations skipped, the next sent in their place (`stage_grow`).
    pub stream_resume_heads_skipped: Counter,
    /// Heads of staged continuations not sent because the endpoint was predicted to hold them.
    pub stream_resume_heads_held: Counter,
    /// Re-homing warm-ups of sessions a lost endpoint served (`resume.rehome_s`): `sent`, or
    /// why not (`superseded`: the session's next turn came first; `no_endpoint`, `failed`).
    pub rehome_warmups: Family<ReasonLabel, Counter>,
    /// Heads of staged re-homing warm-ups that ended with their prefix computed.
    pub rehome_heads: Counter,
    /// Probes of an endpoint after a sign of loss, by what they found.
    pub rehome_probes: Family<ReasonLabel, Counter>,
    /// Configuration file reloads, `applied` or `rejected`.
    pub config_reloads: Family<ReasonLabel, Counter>,
    /// `kvgate epp` requests: `picked`, `bad_request`, `no_endpoint`.
    pub epp_picks: Family<ReasonLabel, Counter>,
    /// Breaker state per endpoint (0 closed, 1 half-open, 2 open).
    pub breaker: Family<EndpointLabel, Gauge>,
    /// Whether an endpoint is routable (1) or not (0).
    pub endpoint_up: Family<EndpointLabel, Gauge>,
    /// Requests this gateway has in flight per endpoint.
    pub inflight: Family<EndpointLabel, Gauge>,
    /// Requests waiting for an admission slot.
    pub queue_depth: Gauge,
    /// Time spent waiting for admission.
    pub queue_wait: Histogram,
    /// Policy picks by reason.
    pub picks: Family<PickLabels, Counter>,
    /// Time the policy took to decide.
    pub decision: Histogram,
    /// Queued plus in-flight requests: the autoscaling signal.
    pub pending: Gauge,
    /// Engine metric scrapes.
    pub scrapes: Family<ScrapeLabels, Counter>,
    /// Engines found restarted by their scrapes (their cache gone).
    pub restarts: Family<EndpointLabel, Counter>,
    /// Cached-token predictions scored against the engine's usage.
    pub cache_prediction: Family<ResultLabel, Counter>,
    /// Learned prefill speed per endpoint (`predicted_ttft`).
    pub prefill_rate: Family<EndpointLabel, FloatGauge>,
    /// Engine iteration time per endpoint, from the streams relayed.
    pub iteration: Family<EndpointLabel, FloatGauge>,
    /// Learned fixed time to first token per endpoint (`predicted_ttft`).
    pub ttft_fixed: Family<EndpointLabel, FloatGauge>,
    /// Learned speed relative to the fleet per endpoint (`predicted_ttft`).
    pub speed_factor: Family<EndpointLabel, FloatGauge>,
    /// Measured over predicted time to first token, streaming requests of a policy that
    /// predicts it.
    pub ttft_prediction_ratio: Histogram,
    /// Client connections.
    pub connections: ConnectionMetrics,
    /// Per-tenant admission, tokens, refusals, budgets and fan-out serialisation.
    pub tenants: crate::tenancy::TenantMetrics,
    /// Access-log lines dropped because the writer fell behind.
    pub access_log_dropped: Counter,
    /// Prompt tokens per endpoint, from the engines' usage.
    pub prompt_tokens: Family<EndpointLabel, Counter>,
    /// Prompt tokens the engines' prefix caches served, per endpoint (engines that report it).
    pub cached_tokens: Family<EndpointLabel, Counter>,
    /// Prompt tokens of answers whose usage reported cached tokens, per endpoint: the hit
    /// ratio's denominator, so engines that do not report hits do not dilute it.
    pub cache_checked_tokens: Family<EndpointLabel, Counter>,
    /// Output tokens per endpoint.
    pub output_tokens: Family<EndpointLabel, Counter>,
    /// Exact tokenization and KV-event ingestion.
    pub engine_state: crate::engine_state::EngineStateMetrics,
    /// Discovery polls by result (`ok`, `error`).
    pub discovery: Family<ReasonLabel, Counter>,
    /// State sharing between replicas.
    pub cluster: std::sync::Arc<crate::cluster::ClusterMetrics>,
    /// Attempts placed below the first priority tier, by why (`unavailable`, `ttft`, `queue`).
    pub spillover: Family<ReasonLabel, Counter>,
    /// Dollars spent per endpoint: usage at the deployment's price.
    pub cost_usd: Family<EndpointLabel, Counter<f64, std::sync::atomic::AtomicU64>>,
}

/// Client connections of the listeners.
#[derive(Clone, Debug, Default)]
pub struct ConnectionMetrics {
    /// Open now.
    pub open: Gauge,
    /// Accepted.
    pub accepted: Counter,
    /// Closed by the gateway, by reason (`header_timeout`, `idle`, `evicted`, `refused`,
    /// `tls_handshake`).
    pub closed: Family<ReasonLabel, Counter>,
    /// Failed accepts (out of file descriptors, mostly).
    pub accept_errors: Counter,
}

impl ConnectionMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "connections_open",
            "Client connections open",
            self.open.clone(),
        );
        registry.register(
            "connections_accepted",
            "Client connections accepted",
            self.accepted.clone(),
        );
        registry.register(
            "connections_closed",
            "Client connections the gateway closed: header_timeout, idle, evicted (at the cap, oldest without a request), refused (at the cap, all busy), tls_handshake (failed or too slow)",
            self.closed.clone(),
        );
        registry.register(
            "connections_accept_errors",
            "Failed accepts, mostly out of file descriptors",
            self.accept_errors.clone(),
        );
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("kvgate");
        let requests = Family::default();
        registry.register("requests", "Finished requests by outcome", requests.clone());
        let hist =
            || -> Histograms<PolicyLabel> { Family::new_with_constructor(latency_histogram) };
        let (ttft, tpot, e2e) = (hist(), hist(), hist());
        registry.register_with_unit(
            "ttft",
            "Gateway-side time to first token by policy",
            Unit::Seconds,
            ttft.clone(),
        );
        registry.register_with_unit(
            "tpot",
            "Time per output token after the first, by policy",
            Unit::Seconds,
            tpot.clone(),
        );
        registry.register_with_unit(
            "e2e",
            "End-to-end request latency by policy",
            Unit::Seconds,
            e2e.clone(),
        );
        let retries = Family::default();
        registry.register(
            "retries",
            "Retries before the first token, by cause",
            retries.clone(),
        );
        let retries_denied = Family::default();
        registry.register(
            "retries_denied",
            "Retries not made: budget exhausted or attempts used up",
            retries_denied.clone(),
        );
        let hedges = Family::default();
        registry.register("hedges", "Hedged attempts launched and won", hedges.clone());
        let epp_picks = Family::default();
        registry.register(
            "epp_picks",
            "Endpoint-picker (kvgate epp) requests: picked, or answered by the proxy and why",
            epp_picks.clone(),
        );
        let config_reloads = Family::default();
        registry.register(
            "config_reloads",
            "Configuration file changes applied, or rejected (the running configuration stays)",
            config_reloads.clone(),
        );
        let stream_resumes = Family::default();
        registry.register(
            "stream_resumes",
            "Streams that broke after the first token: resumed on another endpoint, finished, or why not",
            stream_resumes.clone(),
        );
        let stream_resume_wait = latency_histogram();
        registry.register(
            "stream_resume_wait_seconds",
            "Time a mid-stream continuation waited at the gateway for its endpoint's previous one to reach its first token",
            stream_resume_wait.clone(),
        );
        let stream_resume_heads = Counter::default();
        registry.register(
            "stream_resume_heads",
            "Warm-up heads of staged mid-stream continuations that ended with their prefix computed (resume.stage_tokens)",
            stream_resume_heads.clone(),
        );
        let stream_resume_heads_skipped = Counter::default();
        registry.register(
            "stream_resume_heads_skipped",
            "Heads of staged mid-stream continuations skipped where no other request awaited a first token, the next head sent in their place (resume.stage_grow)",
            stream_resume_heads_skipped.clone(),
        );
        let stream_resume_heads_held = Counter::default();
        registry.register(
            "stream_resume_heads_held",
            "Heads of staged mid-stream continuations not sent because the prefix index said the endpoint already held them (resume.stage_tokens)",
            stream_resume_heads_held.clone(),
        );
        let rehome_warmups = Family::default();
        registry.register(
            "rehome_warmups",
            "Warm-ups of the sessions whose last turn ran on an endpoint that broke a stream or refused a connection, sent to another (resume.rehome_s): sent, or why not",
            rehome_warmups.clone(),
        );
        let rehome_probes = Family::default();
        registry.register(
            "rehome_probes",
            "Endpoints asked after a broken stream or failed connection when re-homing is on: answered (no re-homing) or lost",
            rehome_probes.clone(),
        );
        let rehome_heads = Counter::default();
        registry.register(
            "rehome_heads",
            "Heads of staged re-homing warm-ups that ended with their prefix computed (resume.rehome_s, resume.stage_tokens)",
            rehome_heads.clone(),
        );
        let breaker = Family::default();
        registry.register(
            "breaker_state",
            "Circuit breaker per endpoint: 0 closed, 1 half-open, 2 open",
            breaker.clone(),
        );
        let endpoint_up = Family::default();
        registry.register(
            "endpoint_up",
            "1 when the endpoint is routable",
            endpoint_up.clone(),
        );
        let inflight = Family::default();
        registry.register(
            "inflight_requests",
            "Requests in flight per endpoint",
            inflight.clone(),
        );
        let queue_depth = Gauge::default();
        registry.register(
            "queue_depth",
            "Requests waiting for admission",
            queue_depth.clone(),
        );
        let queue_wait = latency_histogram();
        registry.register_with_unit(
            "queue_wait",
            "Time spent waiting for admission",
            Unit::Seconds,
            queue_wait.clone(),
        );
        let picks = Family::default();
        registry.register(
            "picks",
            "Policy decisions by reason: affinity, miss, escape, hash_owner, overflow, predicted, least_loaded, ...",
            picks.clone(),
        );
        let decision = decision_histogram();
        registry.register_with_unit(
            "decision",
            "Time the policy took to choose an endpoint",
            Unit::Seconds,
            decision.clone(),
        );
        let pending = Gauge::default();
        registry.register(
            "pending_requests",
            "Queued plus in-flight requests: an autoscaling signal",
            pending.clone(),
        );
        let scrapes = Family::default();
        registry.register(
            "scrapes",
            "Engine metric scrapes by result",
            scrapes.clone(),
        );
        let restarts = Family::default();
        registry.register(
            "endpoint_restarts",
            "Engines whose scrape showed a new process (start time changed or counters went back): the index forgot what they held",
            restarts.clone(),
        );
        let cache_prediction = Family::default();
        registry.register(
            "cache_prediction",
            "Predicted cached prompt tokens against the engine's usage: exact (within one block), over or under",
            cache_prediction.clone(),
        );
        let prefill_rate = Family::default();
        registry.register(
            "endpoint_prefill_tokens_per_second",
            "Learned prefill speed per endpoint (predicted_ttft)",
            prefill_rate.clone(),
        );
        let iteration = Family::default();
        registry.register_with_unit(
            "endpoint_iteration",
            "Engine iteration time per endpoint, from the gaps between chunks of the streams relayed",
            Unit::Seconds,
            iteration.clone(),
        );
        let ttft_fixed = Family::default();
        registry.register_with_unit(
            "endpoint_ttft_fixed",
            "Learned fixed time to first token per endpoint (predicted_ttft)",
            Unit::Seconds,
            ttft_fixed.clone(),
        );
        let speed_factor = Family::default();
        registry.register(
            "endpoint_speed_factor",
            "Learned slowness relative to the fleet per endpoint, 1 = fleet speed (predicted_ttft)",
            speed_factor.clone(),
        );
        let ttft_prediction_ratio = Histogram::new(exponential_buckets(0.25, 1.25, 13));
        registry.register(
            "ttft_prediction_ratio",
            "Measured over predicted time to first token (streams, predicted_ttft)",
            ttft_prediction_ratio.clone(),
        );
        let connections = ConnectionMetrics::default();
        connections.register(&mut registry);
        let tenants = crate::tenancy::TenantMetrics::new();
        tenants.register(&mut registry);
        let engine_state = crate::engine_state::EngineStateMetrics::new();
        engine_state.register(&mut registry);
        let discovery = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "discovery_polls",
            "Polls of the Kubernetes API for an InferencePool's pods, by result (ok, error)",
            discovery.clone(),
        );
        let cluster = std::sync::Arc::new(crate::cluster::ClusterMetrics::default());
        cluster.register(&mut registry);
        let cost_usd = Family::default();
        registry.register(
            "cost_usd",
            "Dollars spent per endpoint: the engines' usage at the deployment's price (endpoints[].price, else tenancy.prices), cached prompt tokens at the cached price",
            cost_usd.clone(),
        );
        let spillover = Family::default();
        registry.register(
            "spillover",
            "Attempts placed below the first priority tier: unavailable (every higher tier out), ttft or queue (spilled by the spillover thresholds), session (a spilled session kept on its tier)",
            spillover.clone(),
        );
        let access_log_dropped = Counter::default();
        registry.register(
            "access_log_dropped",
            "Access-log lines dropped because the writer fell behind",
            access_log_dropped.clone(),
        );
        let tokens = |registry: &mut Registry, name: &str, help: &str| {
            let family = Family::<EndpointLabel, Counter>::default();
            registry.register(name, help, family.clone());
            family
        };
        let prompt_tokens = tokens(
            &mut registry,
            "prompt_tokens",
            "Prompt tokens per endpoint, from the engines' usage",
        );
        let cached_tokens = tokens(
            &mut registry,
            "cached_tokens",
            "Prompt tokens served from the engine's prefix cache, per endpoint",
        );
        let cache_checked_tokens = tokens(
            &mut registry,
            "cache_checked_tokens",
            "Prompt tokens of answers that reported cached tokens, per endpoint (hit ratio = cached / checked)",
        );
        let output_tokens = tokens(&mut registry, "output_tokens", "Output tokens per endpoint");
        Metrics {
            cost_usd,
            spillover,
            engine_state,
            discovery,
            cluster,
            prompt_tokens,
            cached_tokens,
            cache_checked_tokens,
            output_tokens,
            access_log_dropped,
            connections,
            tenants,
            cache_prediction,
            prefill_rate,
            iteration,
            ttft_fixed,
            speed_factor,
            ttft_prediction_ratio,
            registry,
            requests,
            ttft,
            tpot,
            e2e,
            retries,
            retries_denied,
            hedges,
            stream_resumes,
            stream_resume_wait,
            stream_resume_heads,
            stream_resume_heads_skipped,
            stream_resume_heads_held,
            rehome_warmups,
            rehome_heads,
            rehome_probes,
            config_reloads,
            epp_picks,
            breaker,
            endpoint_up,
            inflight,
            queue_depth,
            queue_wait,
            picks,
            decision,
            pending,
            scrapes,
            restarts,
        }
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

    /// Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_prefix_and_units() {
        let m = Metrics::new();
        m.request("ok", "round_robin", "e0");
        m.ttft
            .get_or_create(&PolicyLabel {
                policy: "round_robin",
            })
            .observe(0.01);
        let text = m.encode();
        assert!(
            text.contains(
                "kvgate_requests_total{outcome=\"ok\",policy=\"round_robin\",endpoint=\"e0\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains("kvgate_ttft_seconds_bucket"), "{text}");
        assert!(text.contains("kvgate_pending_requests"), "{text}");
    }

    /// The families `encode` announces, by the names a scraper sees (`_total` on counters).
    fn exposed(text: &str) -> std::collections::BTreeSet<String> {
        text.lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| match l.split_once(' ') {
                Some((name, "counter")) => format!("{name}_total"),
                Some((name, _)) => name.to_owned(),
                None => l.to_owned(),
            })
            .collect()
    }

    #[test]
    fn every_metric_is_documented_and_every_documented_one_exists() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/metrics.md");
        let doc = std::fs::read_to_string(path).unwrap();
        let documented: std::collections::BTreeSet<String> = doc
            .lines()
            .filter_map(|l| l.strip_prefix("| `")?.split('`').next())
            .map(str::to_owned)
            .collect();
        let exposed = exposed(&Metrics::new().encode());
        assert!(exposed.len() > 50, "{exposed:?}");
        let undocumented: Vec<_> = exposed.difference(&documented).collect();
        let gone: Vec<_> = documented.difference(&exposed).collect();
        assert!(
            undocumented.is_empty(),
            "not in docs/metrics.md: {undocumented:?}"
        );
        assert!(
            gone.is_empty(),
            "in docs/metrics.md but not exposed: {gone:?}"
        );
    }
}
