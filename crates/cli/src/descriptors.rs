//! The process's file-descriptor limit. Every client connection holds one descriptor and every
//! upstream request may hold another, while the usual soft limit is 1,024: like Go's runtime
//! and nginx's `worker_rlimit_nofile`, `kvgate serve` raises the soft limit to the hard one at
//! start, and says so when even that is short of what the configuration allows.

/// Raises the soft limit towards `needed` descriptors (up to the hard limit).
#[cfg(unix)]
pub(crate) fn raise_limit(needed: u64) {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    let (Some(current), maximum) = (limit.current, limit.maximum) else {
        return; // unlimited
    };
    let target = maximum.map_or(needed, |max| needed.min(max));
    if target > current {
        let raised = Rlimit {
            current: Some(target),
            maximum,
        };
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            tracing::warn!(current, error = %e, "could not raise the descriptor limit");
            return;
        }
    }
    let now = target.max(current);
    if now < needed {
        tracing::warn!(
            allowed = now,
            wanted = needed,
            "fewer file descriptors allowed (hard limit) than the configured connections and \
             upstream requests want; at the limit the oldest idle connection is closed to \
             accept a new one"
        );
    }
}

/// Elsewhere the limit is left as it is.
#[cfg(not(unix))]
pub(crate) fn raise_limit(_needed: u64) {}
