//! Watching the engines behind each target while it runs (`--engines`): every 100 ms each
//! engine's `/metrics` gives its requests running plus waiting (vLLM's
//! `vllm:num_requests_running` and `vllm:num_requests_waiting`), and each sample's spread,
//! the busiest engine's count minus the mean, measures herding: routers that see stale or
//! partial load pile requests onto the same engine while others idle.

use serde::Serialize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often the engines are sampled.
const PERIOD: Duration = Duration::from_millis(100);

/// One target's engines over one run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EngineLoad {
    /// Samples taken (each of every engine of the target).
    pub samples: usize,
    /// Mean over samples of the mean requests per engine.
    pub mean_inflight: f64,
    /// Mean over samples of (the busiest engine's requests minus the mean).
    pub herding_mean: f64,
    /// 95th percentile over samples of the same.
    pub herding_p95: f64,
}

impl EngineLoad {
    /// Summarises samples of per-engine counts; `None` without any.
    pub fn of(samples: &[Vec<f64>]) -> Option<Self> {
        let spreads: Vec<(f64, f64)> = samples
            .iter()
            .filter(|s| !s.is_empty())
            .map(|s| {
                let mean = s.iter().sum::<f64>() / s.len() as f64;
                (mean, s.iter().copied().fold(f64::MIN, f64::max) - mean)
            })
            .collect();
        if spreads.is_empty() {
            return None;
        }
        let n = spreads.len() as f64;
        let mut h: Vec<f64> = spreads.iter().map(|s| s.1).collect();
        h.sort_by(f64::total_cmp);
        Some(EngineLoad {
            samples: spreads.len(),
            mean_inflight: spreads.iter().map(|s| s.0).sum::<f64>() / n,
            herding_mean: h.iter().sum::<f64>() / n,
            herding_p95: kvgate_core::stats::percentile(&h, 0.95).unwrap_or(f64::NAN),
        })
    }
}

/// Requests running plus waiting in a Prometheus exposition (`None` when neither is there).
pub fn inflight(text: &str) -> Option<f64> {
    let mut total = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap_or("");
        if name == "vllm:num_requests_running" || name == "vllm:num_requests_waiting" {
            let value = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
            if let Some(v) = value {
                *total.get_or_insert(0.0) += v;
            }
        }
    }
    total
}

/// Samples each group of engines until dropped.
#[derive(Debug)]
pub struct EngineWatch {
    samples: Arc<Mutex<Vec<Vec<Vec<f64>>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl EngineWatch {
    /// Starts sampling `groups` (one list of engine base URLs per target).
    pub fn start(client: reqwest::Client, groups: Vec<Vec<String>>) -> Self {
        let samples = Arc::new(Mutex::new(vec![Vec::new(); groups.len()]));
        let sink = samples.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(PERIOD);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let reads = groups.iter().map(|g| {
                    futures_util::future::join_all(g.iter().map(|url| {
                        let client = client.clone();
                        async move {
                            let r = client
                                .get(format!("{}/metrics", url.trim_end_matches('/')))
                                .timeout(PERIOD * 5)
                                .send()
                                .await
                                .ok()?;
                            inflight(&r.text().await.ok()?)
                        }
                    }))
                });
                let all = futures_util::future::join_all(reads).await;
                let mut sink = sink.lock().unwrap_or_else(|p| p.into_inner());
                for (k, counts) in all.into_iter().enumerate() {
                    // A sample counts only when every engine of the group answered.
                    if let Some(c) = counts.into_iter().collect::<Option<Vec<f64>>>() {
                        sink[k].push(c);
                    }
                }
            }
        });
        EngineWatch { samples, task }
    }

    /// Stops and summarises each group.
    pub fn finish(self) -> Vec<Option<EngineLoad>> {
        self.task.abort();
        let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        samples.iter().map(|s| EngineLoad::of(s)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_running_plus_waiting_and_nothing_else() {
        let text = "# HELP vllm:num_requests_running x\n\
                    vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0\n\
                    vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 2.0\n\
                    vllm:num_requests_waiting_by_reason{reason=\"capacity\"} 9.0\n";
        assert_eq!(inflight(text), Some(5.0));
        assert_eq!(inflight("other 1\n"), None);
    }

    #[test]
    fn herding_is_the_busiest_engine_above_the_mean() {
        let load = EngineLoad::of(&[vec![4.0, 0.0, 0.0, 0.0], vec![1.0, 1.0, 1.0, 1.0]]).unwrap();
        assert_eq!(load.samples, 2);
        assert!((load.mean_inflight - 1.0).abs() < 1e-9);
        assert!((load.herding_mean - 1.5).abs() < 1e-9);
        assert_eq!(EngineLoad::of(&[]), None);
    }
}
