//! Configuration reload: the file is polled for changes; a new version that parses and
//! validates has its endpoints (with their limits), policy and spillover thresholds applied in
//! place, without dropping traffic.
//!
//! The reload manages only the endpoints that came from the file: those given on the command
//! line or added through the admin API stay. File endpoints are matched by base URL: new ones
//! join (with blackout and slow start), missing ones leave (requests already sent there finish),
//! others get their new weight, model and labels. The policy is rebuilt only when the file's
//! `policy` section itself changed, so command-line policy flags survive reloads that touch only
//! endpoints. Other sections take effect on restart: a reload that changes one says which, in a
//! warning and in `/admin/config`, rather than appearing to apply it.

use crate::config::Config;
use crate::pool::EndpointSet;
use crate::state::Shared;
use kvgate_core::PolicyConfig;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// What the file contributed when last applied: its endpoints, policy and spillover.
#[derive(Debug)]
pub(crate) struct Reloader {
    endpoints: EndpointSet,
    file_policy: Option<PolicyConfig>,
    file_spillover: Option<crate::endpoint_config::SpilloverConfig>,
    /// The file's other sections as the gateway started with them.
    started: Option<serde_json::Value>,
}

/// The sections a reload applies; any other that changes needs a restart.
const RELOADED: [&str; 3] = ["endpoints", "policy", "spillover"];

impl Reloader {
    /// Starts from the file as it was when the gateway was configured (`None` if unreadable).
    pub(crate) fn new(shared: &Shared, initial: Option<&Config>) -> Self {
        Reloader {
            endpoints: initial.map_or_else(EndpointSet::default, |file| {
                EndpointSet::adopt(&shared.pool, &file.endpoints)
            }),
            file_policy: initial.map(|c| c.policy.clone()),
            file_spillover: initial.map(|c| c.spillover.clone()),
            started: initial.and_then(|c| serde_json::to_value(c).ok()),
        }
    }

    /// The sections of `new` other than those reloaded that differ from the file the gateway
    /// started with, by name.
    fn restart_needed(&self, new: &Config) -> Vec<String> {
        let (Some(started), Ok(new)) = (&self.started, serde_json::to_value(new)) else {
            return Vec::new();
        };
        let (Some(started), Some(new)) = (started.as_object(), new.as_object()) else {
            return Vec::new();
        };
        new.iter()
            .filter(|(k, v)| !RELOADED.contains(&k.as_str()) && started.get(*k) != Some(v))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Applies a new version of the file; answers the changed sections it could not apply.
    pub(crate) fn apply(&mut self, shared: &Arc<Shared>, new: &Config) -> Vec<String> {
        let (joined, _) = self.endpoints.sync(&shared.pool, &new.endpoints);
        for id in joined {
            shared.watch.start(id);
        }
        if self.file_policy.as_ref() != Some(&new.policy) {
            shared.pool.set_policy(&new.policy);
            self.file_policy = Some(new.policy.clone());
        }
        if self.file_spillover.as_ref() != Some(&new.spillover) {
            shared.pool.set_spillover(new.spillover.clone());
            self.file_spillover = Some(new.spillover.clone());
        }
        self.restart_needed(new)
    }
}

fn read(path: &PathBuf) -> Result<Config, String> {
    std::fs::read_to_string(path)
        .map_err(|e| e.to_string())
        .and_then(|t| Config::from_yaml(&t).map_err(|e| e.to_string()))
}

/// Polls `path` every `period` and applies valid changes; invalid ones are reported and ignored.
pub(crate) fn spawn(shared: Arc<Shared>, path: PathBuf, period: Duration) {
    let mut stop = shared.stop.subscribe();
    let mut reloader = Reloader::new(&shared, read(&path).ok().as_ref());
    shared.reloads().file = Some(path.display().to_string());
    tokio::spawn(async move {
        let modified = |p: &PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        let mut last: Option<SystemTime> = modified(&path);
        loop {
            tokio::select! {
                () = tokio::time::sleep(period) => {}
                _ = stop.changed() => return,
            }
            let now = modified(&path);
            if now == last {
                continue;
            }
            last = now;
            let (result, restart_needed) = match read(&path) {
                Ok(config) => {
                    let pending = reloader.apply(&shared, &config);
                    tracing::info!(path = %path.display(), "configuration reloaded");
                    if !pending.is_empty() {
                        tracing::warn!(
                            path = %path.display(),
                            sections = %pending.join(", "),
                            "configuration sections changed that take effect only on restart"
                        );
                    }
                    (None, pending)
                }
                Err(e) => {
                    tracing::warn!(
                        path = %path.display(),
                        error = %e,
                        "configuration not reloaded; keeping the running one"
                    );
                    (Some(e), Vec::new())
                }
            };
            let label = if result.is_some() {
                "rejected"
            } else {
                "applied"
            };
            shared
                .metrics
                .config_reloads
                .get_or_create(&crate::metrics::reason(label))
                .inc();
            shared.reloads().record(result, restart_needed);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EndpointConfig;

    #[tokio::test]
    async fn only_file_endpoints_and_a_changed_file_policy_are_reloaded() {
        let file = Config::from_yaml(
            "policy: {name: round_robin}\nendpoints: [{url: 'http://127.0.0.1:1'}]",
        )
        .unwrap();
        let mut running = file.clone();
        running.set_policy("least_outstanding").unwrap(); // a command-line override
        running
            .endpoints
            .push(EndpointConfig::from_url("http://127.0.0.1:2")); // --endpoint
        let shared = Shared::new(
            running,
            1,
            crate::observe::access_log::AccessLog::default(),
            None,
        )
        .unwrap();
        let mut reloader = Reloader::new(&shared, Some(&file));
        let urls = |s: &Shared| -> Vec<String> {
            s.pool.configs().into_iter().map(|(_, c)| c.url).collect()
        };

        let mut edited = file.clone();
        edited.endpoints = vec![EndpointConfig::from_url("http://127.0.0.1:3")];
        assert!(reloader.apply(&shared, &edited).is_empty(), "all applied");
        assert_eq!(
            urls(&shared),
            vec!["http://127.0.0.1:2", "http://127.0.0.1:3"]
        );
        assert_eq!(
            shared.pool.policy_name(),
            "least_outstanding",
            "file policy unchanged"
        );

        edited.set_policy("power_of_two").unwrap();
        reloader.apply(&shared, &edited);
        assert_eq!(shared.pool.policy_name(), "power_of_two");
        let _ = shared.stop.send(true);
    }

    /// Swapping the file's only endpoint for another must never leave the pool empty, not even
    /// between the two steps: a request routed at that moment would get a 503. Picks run on
    /// another thread throughout many swaps (the current-thread runtime keeps the spawned
    /// health checks from running, so only the swap can make a pick fail).
    #[tokio::test]
    async fn swapping_the_only_endpoint_never_leaves_nothing_to_route_to() {
        let url = |port: u16| {
            format!(
                "policy: {{name: round_robin}}\nendpoints: [{{url: 'http://127.0.0.1:{port}'}}]"
            )
        };
        let file = Config::from_yaml(&url(1)).unwrap();
        let shared = Arc::new(
            Shared::new(
                file.clone(),
                1,
                crate::observe::access_log::AccessLog::default(),
                None,
            )
            .unwrap(),
        );
        let mut reloader = Reloader::new(&shared, Some(&file));
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let picker = std::thread::spawn({
            let (shared, done) = (shared.clone(), done.clone());
            move || {
                let (mut picks, mut refused) = (0u64, 0u64);
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    let request = kvgate_core::Request::from_text(picks, "hello");
                    match shared.pool.pick(&request, &[], crate::pool::Attempt::First) {
                        Ok(_) => {}
                        Err(_) => refused += 1,
                    }
                    picks += 1;
                }
                (picks, refused)
            }
        });
        for i in 0..2000 {
            let port = if i % 2 == 0 { 2 } else { 1 };
            reloader.apply(&shared, &Config::from_yaml(&url(port)).unwrap());
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        let (picks, refused) = picker.join().unwrap();
        assert!(picks > 0);
        assert_eq!(refused, 0, "{refused} of {picks} picks found no endpoint");
        let _ = shared.stop.send(true);
    }

    /// A gateway started from `file`, and its reloader.
    fn started(file: &Config) -> (Arc<Shared>, Reloader) {
        let shared = Shared::new(
            file.clone(),
            1,
            crate::observe::access_log::AccessLog::default(),
            None,
        )
        .unwrap();
        let reloader = Reloader::new(&shared, Some(file));
        (shared, reloader)
    }

    #[tokio::test]
    async fn spillover_thresholds_and_an_endpoints_limits_are_reloaded() {
        let file = Config::from_yaml("endpoints: [{url: 'http://127.0.0.1:1'}]").unwrap();
        let (shared, mut reloader) = started(&file);
        let pick = |id| {
            let request = kvgate_core::Request::from_text(id, "hello");
            shared.pool.pick(&request, &[], crate::pool::Attempt::First)
        };
        assert!(pick(1).is_ok() && pick(2).is_ok(), "no limit yet");
        let edited = Config::from_yaml(
            "endpoints: [{url: 'http://127.0.0.1:1', limits: {max_concurrent: 1}}]\nspillover: {queue: 4}",
        )
        .unwrap();
        reloader.apply(&shared, &edited);
        assert_eq!(shared.pool.spillover(), edited.spillover);
        assert!(
            pick(3).is_ok(),
            "the new limit starts with nothing in flight"
        );
        assert!(pick(4).is_err(), "one concurrent request at most");
        let _ = shared.stop.send(true);
    }

    #[tokio::test]
    async fn a_reload_names_the_sections_that_need_a_restart() {
        let file = Config::from_yaml("endpoints: [{url: 'http://127.0.0.1:1'}]").unwrap();
        let (shared, mut reloader) = started(&file);
        let edited = Config::from_yaml(
            "endpoints: [{url: 'http://127.0.0.1:4'}]\npolicy: {name: round_robin}\nsemantic_cache: {ttl_secs: 9}\nadmission: {max_queue: 7}",
        )
        .unwrap();
        assert_eq!(
            reloader.apply(&shared, &edited),
            vec!["admission".to_string(), "semantic_cache".to_string()]
        );
        // Back as it started: nothing is pending.
        assert!(reloader.apply(&shared, &file).is_empty());
    }
}
