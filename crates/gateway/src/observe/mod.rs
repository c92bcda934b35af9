//! What the gateway tells operators about each request: the access log, decision records and
//! their configuration.

pub(crate) mod access_log;
pub mod decisions;
pub(crate) mod otel;
pub(crate) mod series;

use crate::error::ConfigError;
use serde::{Deserialize, Serialize};

/// Access log and decision records.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ObservabilityConfig {
    /// Where the access log (one JSON line per request) goes: `stdout`, `stderr`, `off`, or a
    /// file path (appended to). Unset, the library writes none and `kvgate serve` writes to
    /// stdout.
    pub access_log: Option<String>,
    /// Decision records kept for `/admin/decisions` and the live page (0 keeps none).
    pub decision_records: usize,
    /// Where to send OpenTelemetry traces (OTLP over HTTP/protobuf, the full URL, e.g.
    /// `http://collector:4318/v1/traces`). Unset, the standard `OTEL_EXPORTER_OTLP_*`
    /// variables decide; with neither, no traces.
    pub otlp_traces_endpoint: Option<String>,
}

impl Default for ObservabilityConfig {
    fn default() -> Self {
        ObservabilityConfig {
            access_log: None,
            // A few seconds of traffic at a thousand requests per second; about 1 KiB each.
            decision_records: 2048,
            otlp_traces_endpoint: None,
        }
    }
}

impl ObservabilityConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self
            .access_log
            .as_deref()
            .is_some_and(|t| t.trim().is_empty())
        {
            return Err(ConfigError::Invalid {
                field: "observability.access_log".into(),
                why: "must be stdout, stderr, off or a file path".into(),
            });
        }
        if self.decision_records > 1_000_000 {
            return Err(ConfigError::Invalid {
                field: "observability.decision_records".into(),
                why: "must be at most 1000000".into(),
            });
        }
        Ok(())
    }
}
