//! Configuration reload: the file is polled for changes; a new version that parses and
//! validates has its endpoints and policy applied in place, without dropping traffic. Endpoints
//! are matched by base URL: new ones join (with blackout and slow start), missing ones leave
//! (requests already sent there finish), others get their new weight, model and labels. A
//! changed policy section rebuilds the policy. Other sections take effect on restart.

use crate::config::Config;
use crate::state::Shared;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Applies `new`'s endpoints and policy to the running gateway.
pub(crate) fn apply(
    shared: &Arc<Shared>,
    new: &Config,
    current_policy: &mut kvgate_core::PolicyConfig,
) {
    let existing = shared.pool.configs();
    for (id, old) in &existing {
        match new
            .endpoints
            .iter()
            .find(|e| e.base_url() == old.base_url())
        {
            Some(e) => shared.pool.update(*id, e.clone()),
            None => {
                shared.pool.remove(*id);
            }
        }
    }
    for e in &new.endpoints {
        if !existing
            .iter()
            .any(|(_, old)| old.base_url() == e.base_url())
        {
            let id = shared.pool.add(e.clone());
            crate::scrape::spawn(shared.clone(), id);
        }
    }
    if &new.policy != current_policy {
        shared.pool.set_policy(&new.policy);
        *current_policy = new.policy.clone();
    }
}

/// Polls `path` every `period` and applies valid changes; invalid ones are reported and ignored.
pub(crate) fn spawn(shared: Arc<Shared>, path: PathBuf, period: Duration) {
    let mut stop = shared.stop.subscribe();
    tokio::spawn(async move {
        let modified = |p: &PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        let mut last: Option<SystemTime> = modified(&path);
        let mut policy = shared.config.policy.clone();
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
            match std::fs::read_to_string(&path).map(|t| Config::from_yaml(&t)) {
                Ok(Ok(config)) => {
                    apply(&shared, &config, &mut policy);
                    eprintln!("kvgate serve: reloaded {}", path.display());
                }
                Ok(Err(e)) => eprintln!(
                    "kvgate serve: {}: {e}; keeping the running configuration",
                    path.display()
                ),
                Err(e) => eprintln!(
                    "kvgate serve: {}: {e}; keeping the running configuration",
                    path.display()
                ),
            }
        }
    });
}
