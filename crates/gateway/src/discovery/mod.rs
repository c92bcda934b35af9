//! Endpoints discovered from the Kubernetes API: the ready pods an InferencePool (Gateway API
//! Inference Extension) selects, at its target port, polled every `interval_ms` and applied to
//! the pool like a reloaded file ([`crate::reload::EndpointSet`]): new pods join with blackout
//! and slow start, pods gone or not ready leave, requests already sent finish.
//!
//! In a pod the defaults need no configuration beyond the pool's name: the API server from
//! `KUBERNETES_SERVICE_HOST`/`_PORT`, the service account's token (re-read at every poll, as
//! projected tokens rotate), CA and namespace from `/var/run/secrets/kubernetes.io/serviceaccount`.
//! The service account needs `get` on `inferencepools` and `list` on `pods` (docs/epp.md).
//! A failed poll keeps the endpoints as they are: an API server that is away must not empty the
//! pool.

mod k8s;

use crate::endpoint_config::EndpointConfig;
use crate::metrics::{Counter, Family, ReasonLabel};
use crate::pool::EndpointSet;
use crate::watch::EngineWatch;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

const SERVICE_ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// `discovery:` in the configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiscoveryConfig {
    /// Endpoints from an InferencePool's pods.
    pub inference_pool: Option<InferencePoolConfig>,
}

/// Which InferencePool, and how to reach the API server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InferencePoolConfig {
    /// The pool's name.
    pub name: String,
    /// Its namespace; default: the service account's.
    pub namespace: Option<String>,
    /// `inference.networking.k8s.io/v1` (default) or `inference.networking.x-k8s.io/v1alpha2`.
    pub api_version: String,
    /// The API server; default: `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`.
    pub api_server: Option<String>,
    /// Bearer token file; default: the service account's.
    pub token_file: Option<PathBuf>,
    /// CA of the API server's certificate; default: the service account's.
    pub ca_file: Option<PathBuf>,
    /// Milliseconds between polls.
    pub interval_ms: u64,
    /// The model the pods serve (else each is asked through `/v1/models`).
    pub model: Option<String>,
    /// The port each pod publishes KV events on (vLLM's `--kv-events-config` endpoint), if
    /// they do: `tcp://POD_IP:PORT` becomes the endpoint's `kv_events`.
    pub kv_events_port: Option<u16>,
}

impl Default for InferencePoolConfig {
    fn default() -> Self {
        InferencePoolConfig {
            name: String::new(),
            namespace: None,
            api_version: k8s::V1.into(),
            api_server: None,
            token_file: None,
            ca_file: None,
            interval_ms: 5000,
            model: None,
            kv_events_port: None,
        }
    }
}

impl DiscoveryConfig {
    pub(crate) fn validate(&self) -> Result<(), crate::error::ConfigError> {
        let Some(p) = &self.inference_pool else {
            return Ok(());
        };
        let invalid = |field: &str, why: &str| crate::error::ConfigError::Invalid {
            field: format!("discovery.inference_pool.{field}"),
            why: why.into(),
        };
        if p.name.is_empty() {
            return Err(invalid("name", "the InferencePool's name is required"));
        }
        if ![k8s::V1, k8s::V1ALPHA2].contains(&p.api_version.as_str()) {
            return Err(invalid(
                "api_version",
                &format!("must be {} or {}", k8s::V1, k8s::V1ALPHA2),
            ));
        }
        if p.interval_ms < 100 {
            return Err(invalid("interval_ms", "must be at least 100"));
        }
        Ok(())
    }
}

/// Where and as whom to ask.
struct Api {
    server: String,
    namespace: String,
    token_file: PathBuf,
    client: crate::upstream::HttpClient,
}

impl Api {
    fn resolve(p: &InferencePoolConfig) -> Result<Api, String> {
        let account = PathBuf::from(SERVICE_ACCOUNT);
        let server = match &p.api_server {
            Some(s) => s.trim_end_matches('/').to_owned(),
            None => {
                let host = std::env::var("KUBERNETES_SERVICE_HOST").map_err(|_| {
                    "no api_server and not in a pod (KUBERNETES_SERVICE_HOST unset)"
                })?;
                let port =
                    std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
                let host = if host.contains(':') {
                    format!("[{host}]")
                } else {
                    host
                };
                format!("https://{host}:{port}")
            }
        };
        let namespace = match &p.namespace {
            Some(n) => n.clone(),
            None => std::fs::read_to_string(account.join("namespace"))
                .map(|n| n.trim().to_owned())
                .unwrap_or_else(|_| "default".into()),
        };
        let ca = p.ca_file.clone().or_else(|| {
            let ca = account.join("ca.crt");
            ca.exists().then_some(ca)
        });
        let cas: Vec<&std::path::Path> = ca.iter().map(PathBuf::as_path).collect();
        let client = crate::upstream::client(&cas).map_err(|e| e.to_string())?;
        Ok(Api {
            server,
            namespace,
            token_file: p
                .token_file
                .clone()
                .unwrap_or_else(|| account.join("token")),
            client,
        })
    }

    /// `GET path` as JSON.
    async fn get(&self, path: &str) -> Result<serde_json::Value, String> {
        let mut request = hyper::Request::get(format!("{}{path}", self.server));
        if let Ok(token) = std::fs::read_to_string(&self.token_file) {
            request = request.header("authorization", format!("Bearer {}", token.trim()));
        }
        let request = request
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .map_err(|e| e.to_string())?;
        let (status, body) = crate::upstream::fetch(
            &self.client,
            request,
            16 * 1024 * 1024,
            Duration::from_secs(10),
        )
        .await
        .map_err(|e| format!("{path}: {e}"))?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
            let text: String = text.chars().take(200).collect();
            return Err(format!("{path}: {status}: {text}"));
        }
        serde_json::from_slice(&body).map_err(|e| format!("{path}: {e}"))
    }

    /// The pool's ready pods as endpoints.
    async fn endpoints(&self, p: &InferencePoolConfig) -> Result<Vec<EndpointConfig>, String> {
        let pool = self
            .get(&format!(
                "/apis/{}/namespaces/{}/inferencepools/{}",
                p.api_version, self.namespace, p.name
            ))
            .await?;
        let (labels, port) = k8s::pool_selector(&pool)?;
        let pods = self
            .get(&format!(
                "/api/v1/namespaces/{}/pods?labelSelector={}",
                self.namespace,
                k8s::label_selector(&labels)
            ))
            .await?;
        Ok(k8s::ready_pod_ips(&pods)
            .into_iter()
            .map(|ip| {
                let host = if ip.contains(':') {
                    format!("[{ip}]")
                } else {
                    ip
                };
                EndpointConfig {
                    model: p.model.clone(),
                    kv_events: p.kv_events_port.map(|k| format!("tcp://{host}:{k}")),
                    ..EndpointConfig::from_url(format!("http://{host}:{port}"))
                }
            })
            .collect())
    }
}

/// Polls the InferencePool, when one is configured, until the gateway stops: its ready pods
/// join the watched pool, gone ones leave; `polls` counts the polls by result.
pub(crate) fn spawn(
    config: &DiscoveryConfig,
    watch: EngineWatch,
    polls: Family<ReasonLabel, Counter>,
) {
    let Some(p) = config.inference_pool.clone() else {
        return;
    };
    let api = match Api::resolve(&p) {
        Ok(api) => api,
        Err(e) => {
            tracing::error!("discovery: InferencePool {} not watched: {e}", p.name);
            return;
        }
    };
    let mut stop = watch.stop.clone();
    tokio::spawn(async move {
        let mut set = EndpointSet::default();
        let mut last_error: Option<String> = None;
        loop {
            let result = api.endpoints(&p).await;
            let label = if result.is_ok() { "ok" } else { "error" };
            polls.get_or_create(&crate::metrics::reason(label)).inc();
            match result {
                Ok(wanted) => {
                    last_error = None;
                    let (joined, left) = set.sync(&watch.pool, &wanted);
                    for &id in &joined {
                        watch.start(id);
                    }
                    let joined = joined.len();
                    if joined + left > 0 {
                        tracing::info!(
                            "discovery: InferencePool {}/{}: {} ready pods ({joined} joined, {left} left)",
                            api.namespace,
                            p.name,
                            wanted.len()
                        );
                    }
                }
                Err(e) => {
                    if last_error.as_ref() != Some(&e) {
                        tracing::warn!(
                            "discovery: InferencePool {}: {e}; keeping the endpoints as they are",
                            p.name
                        );
                    }
                    last_error = Some(e);
                }
            }
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(p.interval_ms)) => {}
                _ = stop.changed() => return,
            }
        }
    });
}
