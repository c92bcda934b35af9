//! OpenTelemetry traces over OTLP (HTTP/protobuf): one server span per request and one client
//! span per upstream attempt, with the GenAI semantic conventions' attributes
//! (`gen_ai.operation.name`, `gen_ai.request.model`, `gen_ai.usage.*`,
//! `gen_ai.server.time_to_first_token`, `gen_ai.server.time_per_output_token`,
//! `gen_ai.conversation.id`), and each attempt's context sent upstream as `traceparent`, so an
//! engine that traces (vLLM's `--otlp-traces-endpoint`) joins the same trace.
//!
//! Off unless asked for: by `observability.otlp_traces_endpoint`, or by the standard
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT` variables (which the
//! exporter resolves itself, as every OpenTelemetry SDK does; `OTEL_EXPORTER_OTLP_HEADERS` and
//! `OTEL_BSP_*` apply too). `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn it off.
//! Spans leave through the SDK's batch processor on its own thread: a slow collector drops
//! spans (the processor's queue is bounded), never slows requests.

use super::ObservabilityConfig;
use crate::error::ConfigError;
use axum::http::HeaderMap;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{
    Span as _, SpanContext, SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, Span};
use opentelemetry_sdk::Resource;
use std::time::SystemTime;

/// A span being recorded.
pub(crate) type LiveSpan = Span;

/// The tracer, when traces are on.
#[derive(Debug)]
pub(crate) struct Tracing {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    propagator: TraceContextPropagator,
}

fn env_says(name: &str, value: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v.trim().eq_ignore_ascii_case(value))
}

impl Tracing {
    /// The tracer `config` and the environment ask for, if any.
    pub(crate) fn from_config(config: &ObservabilityConfig) -> Result<Option<Self>, ConfigError> {
        let from_env = [
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|s| !s.trim().is_empty()));
        let disabled =
            env_says("OTEL_SDK_DISABLED", "true") || env_says("OTEL_TRACES_EXPORTER", "none");
        if disabled || (config.otlp_traces_endpoint.is_none() && !from_env) {
            return Ok(None);
        }
        if std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL").is_ok_and(|p| p != "http/protobuf") {
            tracing::warn!(
                "OTEL_EXPORTER_OTLP_PROTOCOL: kvgate exports traces over http/protobuf only"
            );
        }
        let provider = provider(config.otlp_traces_endpoint.as_deref())?;
        Ok(Some(Tracing {
            tracer: provider.tracer("kvgate"),
            provider,
            propagator: TraceContextPropagator::new(),
        }))
    }

    /// A request's server span, started at `arrived`, child of the client's `traceparent`.
    pub(crate) fn request_span(&self, headers: &HeaderMap, arrived: SystemTime) -> LiveSpan {
        let parent = self.propagator.extract(&HeaderExtractor(headers));
        self.tracer
            .span_builder("kvgate request")
            .with_kind(SpanKind::Server)
            .with_start_time(arrived)
            .start_with_context(&self.tracer, &parent)
    }

    /// An attempt's client span under the request's, started now, and the headers that carry
    /// its context upstream in place of the client's.
    pub(crate) fn attempt_span(
        &self,
        parent: &SpanContext,
        name: String,
        attributes: Vec<KeyValue>,
        forwarded: &mut HeaderMap,
    ) -> LiveSpan {
        let cx = Context::new().with_remote_span_context(parent.clone());
        let span = self
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Client)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &cx);
        let cx = Context::new().with_remote_span_context(span.span_context().clone());
        self.propagator
            .inject_context(&cx, &mut HeaderInjector(forwarded));
        span
    }

    /// Exports every finished span now (tests, shutdown).
    pub(crate) fn flush(&self) {
        if let Err(e) = self.provider.force_flush() {
            tracing::warn!(error = %e, "could not export traces");
        }
    }
}

/// Spans exported in batches over OTLP/HTTP to `endpoint` (else where the environment says),
/// as the service `OTEL_SERVICE_NAME` (`kvgate` by default).
#[cfg(feature = "otel")]
fn provider(endpoint: Option<&str>) -> Result<SdkTracerProvider, ConfigError> {
    use opentelemetry_otlp::WithExportConfig;
    let mut builder = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary);
    if let Some(endpoint) = endpoint {
        builder = builder.with_endpoint(endpoint);
    }
    let exporter = builder
        .build()
        .map_err(|e| ConfigError::invalid("observability.otlp_traces_endpoint", e.to_string()))?;
    let service = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "kvgate".into());
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(Resource::builder().with_service_name(service).build())
        .build())
}

/// Without the `otel` feature there is no exporter: asking for traces is a configuration error.
#[cfg(not(feature = "otel"))]
fn provider(_: Option<&str>) -> Result<SdkTracerProvider, ConfigError> {
    Err(ConfigError::invalid(
        "observability.otlp_traces_endpoint",
        "this build has no OTLP exporter (the gateway's `otel` feature; the `kvgate` binary has it)",
    ))
}

impl Drop for Tracing {
    fn drop(&mut self) {
        let _ = self.provider.shutdown();
    }
}

/// Ends `span` as failed with `error_type` (the semantic conventions' `error.type`).
pub(crate) fn fail(span: &mut LiveSpan, error_type: &'static str) {
    span.set_attribute(KeyValue::new("error.type", error_type));
    span.set_status(Status::error(error_type));
}

/// `gen_ai.operation.name` of an API.
pub(crate) fn operation(api: crate::parse::Api) -> &'static str {
    match api {
        crate::parse::Api::Chat => "chat",
        crate::parse::Api::Completions => "text_completion",
    }
}

/// The GenAI conventions' span name: `{operation} {model}`.
pub(crate) fn span_name(api: crate::parse::Api, model: Option<&str>) -> String {
    match model {
        Some(m) => format!("{} {m}", operation(api)),
        None => operation(api).to_owned(),
    }
}
