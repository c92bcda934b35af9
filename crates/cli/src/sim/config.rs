//! From a gateway configuration file to the simulator's [`Deployment`]: the endpoints (with
//! `--speed`s), the policy, the scrape period, the admission limits and whether the engines'
//! KV events reach the gateway. The sections the simulator does not model are not required to
//! work here (a tenancy key's placeholder hash, a tokenizer directory on another machine): they
//! are set aside before the rest is validated as `kvgate serve` would, and named in the notes.

use anyhow::{bail, Context};
use kvgate_core::Nanos;
use kvgate_gateway::Config;
use kvgate_sim::fleet::AdmissionLimits;
use kvgate_sim::scenario::configured::{Deployment, Endpoint};
use std::path::Path;

/// Reads `path` and maps it, with `--speed NAME=FACTOR` settings `speeds` and `--replicas`.
pub(super) fn deployment(
    path: &Path,
    speeds: &[String],
    replicas: Option<usize>,
) -> anyhow::Result<Deployment> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut config: Config =
        yaml_serde::from_str(&text).with_context(|| format!("loading {}", path.display()))?;
    let mut notes = Vec::new();
    if config.tenancy != Default::default() {
        notes.push(
            "tenancy (keys, tenants, rate limits, budgets) is not simulated: every request is \
             admitted alike; its keys were not checked."
                .to_string(),
        );
        config.tenancy = Default::default();
    }
    if !config.tokenizers.is_empty() {
        notes.push(
            "tokenizers are not needed: the simulated prompts are token ids, which the routers \
             match exactly, as with a tokenizer; the directories were not read."
                .to_string(),
        );
        config.tokenizers.clear();
    }
    config
        .validate()
        .with_context(|| format!("loading {}", path.display()))?;
    let mut endpoints = endpoints(&config, replicas)?;
    for kv in speeds {
        let (name, factor) = kv
            .split_once('=')
            .with_context(|| format!("--speed {kv:?}: expected NAME=FACTOR"))?;
        let factor: f64 = factor
            .trim()
            .parse()
            .ok()
            .filter(|f: &f64| f.is_finite() && *f > 0.0)
            .with_context(|| format!("--speed {kv:?}: {factor:?} is not a positive number"))?;
        let name = name.trim();
        let matching = |e: &&mut (Endpoint, String)| e.0.name == name || e.1 == name;
        let mut found = false;
        for (e, _) in endpoints.iter_mut().filter(matching) {
            e.speed = factor;
            found = true;
        }
        if !found {
            let known: Vec<&str> = endpoints.iter().map(|(e, _)| e.name.as_str()).collect();
            bail!(
                "--speed {kv:?}: no endpoint named {name:?} (endpoints, by name or URL: {})",
                known.join(", ")
            );
        }
    }
    notes.extend(unsimulated(&config));
    Ok(Deployment {
        kv_events: !config.endpoints.is_empty()
            && config.endpoints.iter().all(|e| e.kv_events.is_some()),
        endpoints: endpoints.into_iter().map(|(e, _)| e).collect(),
        policy: config.policy.clone(),
        dispatch: config.pool_settings().dispatch,
        scrape_interval: Nanos::from_millis(config.scrape.interval_ms),
        admission: Some(AdmissionLimits {
            max_concurrency: config.admission.max_concurrency,
            max_queue: config.admission.max_queue,
            queue_timeout: Nanos::from_millis(config.admission.queue_timeout_ms),
        }),
        notes,
    })
}

/// The configured endpoints at speed 1, each with its URL; or `replicas` identical ones when
/// the configuration names none.
fn endpoints(config: &Config, replicas: Option<usize>) -> anyhow::Result<Vec<(Endpoint, String)>> {
    match (config.endpoints.len(), replicas) {
        (0, Some(n)) if n > 0 => Ok((0..n)
            .map(|i| {
                let endpoint = Endpoint {
                    name: format!("replica-{i}"),
                    speed: 1.0,
                    weight: 1.0,
                    tier: 0,
                };
                (endpoint, String::new())
            })
            .collect()),
        (_, Some(0)) => bail!("--replicas must be at least 1"),
        (0, None) => {
            let why = match &config.discovery.inference_pool {
                Some(pool) => format!(
                    "the config discovers them from the Kubernetes InferencePool {:?}",
                    pool.name
                ),
                None => "the config lists none".to_string(),
            };
            bail!("no endpoints to simulate: {why}; add endpoints or pass --replicas N")
        }
        (n, Some(_)) => {
            bail!("--replicas is for a config without endpoints; this one lists {n}")
        }
        (_, None) => Ok(config
            .endpoints
            .iter()
            .map(|e| {
                let endpoint = Endpoint {
                    name: e.display_name(),
                    speed: 1.0,
                    weight: e.weight,
                    tier: e.tier,
                };
                (endpoint, e.url.clone())
            })
            .collect()),
    }
}

/// Notes on the parts of `config` the simulation leaves out, where they are set.
fn unsimulated(config: &Config) -> Vec<String> {
    let mut notes = Vec::new();
    let with_events = config
        .endpoints
        .iter()
        .filter(|e| e.kv_events.is_some())
        .count();
    if with_events > 0 && with_events < config.endpoints.len() {
        notes.push(format!(
            "KV events: {with_events} of {} endpoints publish them; the simulation has every \
             replica publish or none, so it runs without.",
            config.endpoints.len()
        ));
    }
    if let Some(pool) = config
        .discovery
        .inference_pool
        .as_ref()
        .filter(|_| !config.endpoints.is_empty())
    {
        notes.push(format!(
            "discovery: the pods of InferencePool {:?} are not simulated, only the listed \
             endpoints.",
            pool.name
        ));
    }
    if config.cluster.url.is_some() {
        notes.push(
            "cluster: one gateway replica is simulated; --set routers=N --set share_ms=D \
             simulates N sharing their state D ms late."
                .to_string(),
        );
    }
    if config.endpoints.iter().any(|e| e.limits.is_some()) {
        notes.push("endpoints' own rate limits (limits) are not simulated.".to_string());
    }
    let mut models: Vec<&str> = config
        .endpoints
        .iter()
        .filter_map(|e| e.model.as_deref())
        .collect();
    models.sort_unstable();
    models.dedup();
    if models.len() > 1 {
        notes.push(format!(
            "models: the endpoints serve {}; the simulation sends any request to any endpoint.",
            models.join(", ")
        ));
    }
    notes
}
