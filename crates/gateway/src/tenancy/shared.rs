//! Rate limits and budgets shared by gateway replicas (`cluster`).
//!
//! Each replica tells its peers what it took from a `key:` or `tenant:` limiter when it admitted
//! a request (one request, the estimated tokens) and the correction when the request settled
//! (actual minus estimate), and what each budget account spent at settlement; peers take the
//! same amounts from their own limiters ([`RateLimiter::take_shared`]) and add the spend to
//! their ledgers, which persist it, so every replica's store holds the fleet's spend.
//!
//! Consistency bound: a replica learns a peer's admission one NATS hop (about a millisecond
//! on a LAN, `kvgate_cluster_lag_seconds`) after it, so over any window the fleet admits at
//! most the limit plus what the other replicas admitted within that hop. Budget reservations
//! for requests in flight stay local: the fleet can overspend a budget by at most the
//! estimates in flight at the other replicas. Concurrency caps (`max_concurrent`) stay per
//! replica. A replica that was away (NATS down, restarted) misses what peers took meanwhile.

use super::{FanoutEvent, Tenancy};
use kvgate_core::tenancy::{Charge, LimitsConfig, RateLimiter};
use kvgate_core::Nanos;
use std::sync::Arc;

/// What tenancy tells the other replicas of a cluster.
#[derive(Debug)]
pub(crate) enum Announcement {
    /// The fan-out gate's claims and releases.
    Fanout(FanoutEvent),
    /// Taken from rate limiters (negative: given back): requests, limited input and output
    /// tokens.
    Limits {
        scopes: Vec<String>,
        requests: f64,
        input: f64,
        output: f64,
    },
    /// Spent per budget account.
    Spend(Vec<(String, f64)>),
}

/// Where tenancy's announcements go: the cluster's link, which implements it, so tenancy knows
/// nothing of how replicas talk. It must not block: the request path announces.
pub(crate) trait Announcer: std::fmt::Debug + Send + Sync {
    /// Queues `what` for the peers.
    fn announce(&self, what: Announcement);
    /// Replicas heard from lately, this one not counted.
    fn peers(&self) -> i64;
}

impl Tenancy {
    /// From now on, limits taken and spend settled here go to `announcer`.
    pub(crate) fn join_cluster(&self, announcer: Arc<dyn Announcer>) {
        let _ = self.outbox.set(announcer);
    }

    /// Tells peers that `requests` requests and `plus - minus` tokens were taken from the
    /// limiters `ids`.
    pub(super) fn share_limits(
        &self,
        ids: &[String],
        requests: f64,
        plus: &Charge,
        minus: &Charge,
    ) {
        let Some(outbox) = self.outbox.get().filter(|_| !ids.is_empty()) else {
            return;
        };
        let w = &self.config.charge.weights;
        outbox.announce(Announcement::Limits {
            scopes: ids.to_vec(),
            requests,
            input: plus.limited_input(w) - minus.limited_input(w),
            output: plus.output - minus.output,
        });
    }

    /// Tells peers what each account spent.
    pub(super) fn share_spend(&self, spent: Vec<(String, f64)>) {
        if let Some(outbox) = self.outbox.get().filter(|_| !spent.is_empty()) {
            outbox.announce(Announcement::Spend(spent));
        }
    }

    /// A peer took these amounts from its limiters `scopes`.
    pub(crate) fn peer_limits(
        &self,
        scopes: &[String],
        (requests, input, output): (f64, f64, f64),
        now: Nanos,
    ) {
        let weights = self.config.charge.weights;
        let mut limiters = self.limiters.lock().unwrap_or_else(|e| e.into_inner());
        for scope in scopes {
            if !limiters.contains_key(scope) {
                let Some(config) = self.limits_of(scope) else {
                    continue;
                };
                limiters.insert(scope.clone(), RateLimiter::new(&config, weights, now));
            }
            if let Some(l) = limiters.get_mut(scope) {
                l.take_shared(now, requests, input, output);
            }
        }
    }

    /// A peer settled spend in these accounts.
    pub(crate) fn peer_spend(&self, spent: &[(String, f64)]) {
        self.budgets.add_spent(spent);
    }

    /// The limits of `key:NAME` or `tenant:NAME`, when it has any.
    fn limits_of(&self, scope: &str) -> Option<LimitsConfig> {
        let limits = match scope.split_once(':')? {
            ("key", name) => self
                .keys
                .list()
                .into_iter()
                .find(|k| k.name == name)?
                .limits
                .clone(),
            ("tenant", name) => self.config.tenants.get(name)?.limits.clone(),
            _ => return None,
        };
        limits.any().then_some(limits)
    }
}
