//! Tenants: who is calling (API keys), how fast they may spend (token-weighted rate limits), how
//! much (budgets), and the agent controls (session caps, fan-out serialisation). Fair queueing
//! between tenants lives in admission ([`crate::admission`]), which this module feeds with the
//! tenant, its weight and the request's estimated cost.
//!
//! A request passes here once, after parsing and before the admission queue:
//! key (401/403) -> rate limits of the key and of its tenant (429 with Retry-After and
//! `x-ratelimit-*`) -> budgets (refused before any engine sees it) -> a [`Lease`] that travels
//! with the request and, when it ends, replaces every estimate by the engine's usage.

pub mod config;
pub mod metrics;

pub(crate) mod budget;
mod fanout;
mod hold;
pub(crate) mod keys;
mod limits;
mod manage;
mod sessions;
mod shared;
mod store;

pub use config::{AgentConfig, BudgetConfig, KeyConfig, TenancyConfig, TenantConfig};
pub use metrics::TenantMetrics;
pub(crate) use shared::{Announcement, Announcer};

pub(crate) use hold::Held;

pub use fanout::FanoutEvent;
use fanout::FanoutGate;
use sessions::SessionCaps;

use crate::error::ApiError;
use axum::http::HeaderMap;
use budget::{Account, Budgets, Refusal, Reservation, Store};
use keys::KeyStore;
use kvgate_core::tenancy::{Charge, Exceeded, LimitsConfig, Price, RateLimiter};
use kvgate_core::{Nanos, Request};
use metrics::{AccountLabels, RefusalLabels, TenantLabel, TokenLabels};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

/// Response headers with their values.
type Headers = Box<[(&'static str, String)]>;

/// The metric label of tenants not named in the configuration.
const OTHER: &str = "other";

/// A request's standing with its tenant, from admission to its end.
#[derive(Debug)]
pub(crate) struct Lease {
    /// The tenant (the fair queue's key).
    pub(crate) tenant: String,
    /// Its fair-share weight.
    pub(crate) weight: f64,
    /// Whether a gateway API key identified the request (it is then not forwarded upstream).
    pub(crate) keyed: bool,
    label: String,
    limiters: Vec<String>,
    estimate: Charge,
    reservation: Reservation,
    price: Option<Price>,
    /// Output tokens already charged to the fair queue while streaming.
    pub(crate) streamed: u32,
    /// Admission charged the prompt to the fair queue (the request left the queue).
    pub(crate) admitted: bool,
    /// `x-ratelimit-*` of the request's first limiter (its key's, else its tenant's) after it
    /// was charged, for the response (OpenAI sends them on every answer).
    pub(crate) ratelimit_headers: Headers,
}

impl Lease {
    /// The prompt tokens admission estimated.
    pub(crate) fn prompt_tokens(&self) -> u32 {
        self.estimate.input as u32
    }

    /// The weighted prompt the fair queue charges at admission.
    pub(crate) fn admission_cost(&self, tenancy: &Tenancy) -> f64 {
        self.estimate.weighted_input(&tenancy.config.charge.weights)
    }
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Tenancy {
    config: TenancyConfig,
    keys: KeyStore,
    /// `key:NAME` and `tenant:NAME` limiters, created on first use.
    limiters: Mutex<HashMap<String, RateLimiter>>,
    budgets: Budgets,
    /// Tenants with their own metric label.
    named: RwLock<HashSet<String>>,
    fanout: Option<FanoutGate>,
    sessions: Option<SessionCaps>,
    metrics: TenantMetrics,
    /// Where limits taken and spend settled go to peer replicas, in a cluster.
    outbox: std::sync::OnceLock<Arc<dyn shared::Announcer>>,
}

impl Tenancy {
    /// `model`'s price in `tenancy.prices` (else the `*` entry).
    pub(crate) fn price(&self, model: Option<&str>) -> Option<Price> {
        self.config
            .prices
            .get(model.unwrap_or("*"))
            .or_else(|| self.config.prices.get("*"))
            .copied()
    }

    /// Builds the state; opens the store and loads keys added through the admin API.
    pub(crate) fn new(
        config: &TenancyConfig,
        metrics: TenantMetrics,
    ) -> Result<Self, crate::error::ConfigError> {
        let store_err = |e: budget::StoreError| crate::error::ConfigError::Invalid {
            field: "tenancy.store".into(),
            why: e.to_string(),
        };
        let store = config
            .store
            .as_deref()
            .map(Store::open)
            .transpose()
            .map_err(store_err)?;
        let stored_keys = store
            .as_ref()
            .map(Store::keys)
            .transpose()
            .map_err(store_err)?;
        let keys = KeyStore::default();
        let mut named: HashSet<String> = config.tenants.keys().cloned().collect();
        for k in config
            .keys
            .iter()
            .cloned()
            .chain(stored_keys.into_iter().flatten())
        {
            named.insert(k.tenant.clone().unwrap_or_else(|| k.name.clone()));
            keys.insert(k)
                .map_err(|why| crate::error::ConfigError::Invalid {
                    field: "tenancy.keys".into(),
                    why,
                })?;
        }
        let agents = &config.agents;
        Ok(Tenancy {
            budgets: Budgets::new(store).map_err(store_err)?,
            config: config.clone(),
            keys,
            limiters: Mutex::default(),
            named: RwLock::new(named),
            fanout: agents.serialize_fanout.then(|| {
                FanoutGate::new(
                    Duration::from_millis(agents.fanout_max_wait_ms),
                    Duration::from_millis(agents.fanout_seen_ttl_ms),
                )
            }),
            sessions: agents.session_max_concurrency.map(SessionCaps::new),
            metrics,
            outbox: Default::default(),
        })
    }

    fn label(&self, tenant: &str) -> String {
        let named = self.named.read().unwrap_or_else(|e| e.into_inner());
        if named.contains(tenant) {
            tenant.to_owned()
        } else {
            OTHER.to_owned()
        }
    }

    fn refuse(&self, tenant: &str, reason: &'static str) {
        self.metrics
            .refused
            .get_or_create(&RefusalLabels {
                tenant: tenant.to_owned(),
                reason,
            })
            .inc();
    }

    /// The client's key, from `Authorization: Bearer KEY`: `None` when keys are not in use and
    /// the request presents none this gateway knows; 401 when keys are in use and it has none.
    pub(crate) fn identify(&self, headers: &HeaderMap) -> Result<Option<Arc<KeyConfig>>, ApiError> {
        // Without keys there is nothing to match: no digest for every SDK's placeholder key.
        if !self.keys.enforced() {
            return Ok(None);
        }
        let bearer = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.strip_prefix("Bearer ").unwrap_or(v).trim())
            .filter(|k| !k.is_empty());
        match bearer.and_then(|b| self.keys.lookup(b)) {
            Some(k) => Ok(Some(k)),
            None => {
                self.refuse("unknown", "unauthorized");
                Err(ApiError::invalid_api_key(bearer.is_some()))
            }
        }
    }

    /// Checks the request's model, limits and budgets and returns its lease; the request's
    /// tenant becomes its key's.
    pub(crate) fn admit(
        &self,
        key: Option<Arc<KeyConfig>>,
        request: &mut Request,
        now: Nanos,
    ) -> Result<Lease, ApiError> {
        if let Some(k) = &key {
            request.tenant = Some(k.tenant.clone().unwrap_or_else(|| k.name.clone()));
        }
        let tenant = request.tenant.clone().unwrap_or_default();
        let label = self.label(&tenant);
        if let (Some(k), Some(model)) = (&key, &request.model) {
            if k.models.as_ref().is_some_and(|m| !m.contains(model)) {
                self.refuse(&label, "model_not_allowed");
                return Err(ApiError::model_not_allowed(&k.name, model));
            }
        }
        let tenant_config = self.config.tenants.get(&tenant);
        let estimate = self.config.charge.estimate(request);
        let mut scopes: Vec<(String, &LimitsConfig)> = Vec::with_capacity(2);
        if let Some(k) = key.as_ref().filter(|k| k.limits.any()) {
            scopes.push((format!("key:{}", k.name), &k.limits));
        }
        if let Some(t) = tenant_config.filter(|t| t.limits.any()) {
            scopes.push((format!("tenant:{tenant}"), &t.limits));
        }
        let (limiters, ratelimit_headers) =
            self.take_limits(&scopes, &estimate, now, &label, &tenant)?;
        let mut accounts = Vec::new();
        if let Some(b) = key.as_ref().and_then(|k| k.budget) {
            accounts.push(Account {
                id: format!("key:{}", key.as_ref().map_or("", |k| &k.name)),
                budget: b,
            });
        }
        if let Some(b) = tenant_config.and_then(|t| t.budget) {
            accounts.push(Account {
                id: format!("tenant:{tenant}"),
                budget: b,
            });
        }
        let model = request.model.as_deref().unwrap_or("*");
        let price = self.price(request.model.as_deref());
        let reservation = match self
            .budgets
            .reserve(accounts, &estimate, price.as_ref(), model)
        {
            Ok(r) => r,
            Err(refusal) => {
                self.release_limits(&limiters, &estimate, &Charge::default(), now);
                self.refuse(&label, "budget");
                return Err(match refusal {
                    Refusal::Exhausted {
                        account,
                        spent,
                        limit,
                    } => ApiError::budget_exceeded(format!(
                        "budget of {account} exhausted: {spent:.4} of {limit} spent or in flight"
                    )),
                    Refusal::NoPrice(m) => ApiError::budget_exceeded(format!(
                        "a budget in dollars applies and model `{m}` has no price in tenancy.prices"
                    )),
                });
            }
        };
        self.metrics
            .admitted
            .get_or_create(&TenantLabel {
                tenant: label.clone(),
            })
            .inc();
        Ok(Lease {
            weight: tenant_config.map_or(1.0, |t| t.weight),
            keyed: key.is_some(),
            tenant,
            label,
            limiters,
            estimate,
            reservation,
            price,
            streamed: 0,
            admitted: false,
            ratelimit_headers,
        })
    }

    /// The request ended having used `actual`: limits, budgets and metrics learn it. Returns
    /// the weighted service still to charge to the fair queue (what `actual` weighs minus what
    /// admission and streaming charged). Budgets in dollars are charged at `price`, the
    /// price of the deployment that answered when it has its own, else at the model's (the
    /// price the reservation was estimated with).
    pub(crate) fn settle(
        &self,
        lease: Lease,
        actual: &Charge,
        price: Option<&Price>,
        now: Nanos,
    ) -> f64 {
        self.release_limits(&lease.limiters, &lease.estimate, actual, now);
        let spent = self
            .budgets
            .settle(lease.reservation, actual, price.or(lease.price.as_ref()));
        self.share_spend(spent);
        let w = &self.config.charge.weights;
        let m = &self.metrics;
        for (kind, n) in [
            ("input", actual.input),
            ("cached_input", actual.cached_input),
            ("output", actual.output),
        ] {
            if n > 0.0 {
                m.tokens
                    .get_or_create(&TokenLabels {
                        tenant: lease.label.clone(),
                        kind,
                    })
                    .inc_by(n as u64);
            }
        }
        m.service
            .get_or_create(&TenantLabel {
                tenant: lease.label.clone(),
            })
            .inc_by(actual.weighted(w));
        // Only what was charged is corrected: a request that never left the queue was not.
        let admission = if lease.admitted {
            lease.estimate.weighted_input(w)
        } else {
            0.0
        };
        let charged = admission + f64::from(lease.streamed) * w.output;
        actual.weighted(w) - charged
    }

    /// The fair-queue weight of one streamed output token.
    pub(crate) fn output_weight(&self) -> f64 {
        self.config.charge.weights.output
    }

    /// The fan-out gate, when serialisation is on.
    pub(crate) fn fanout(&self) -> Option<&FanoutGate> {
        self.fanout.as_ref()
    }

    /// Shared prefixes shorter than this are not held for.
    pub(crate) fn fanout_min_tokens(&self) -> u32 {
        self.config.agents.fanout_min_prefix_tokens
    }

    /// The session cap, when on.
    pub(crate) fn sessions(&self) -> Option<&SessionCaps> {
        self.sessions.as_ref()
    }

    /// Writes spend to the store and the spend gauges (blocking).
    pub(crate) fn flush(&self) -> Result<usize, budget::StoreError> {
        let written = self.budgets.flush()?;
        for (id, b) in self.accounts() {
            let unit = if b.usd.is_some() { "usd" } else { "tokens" };
            self.metrics
                .spend
                .get_or_create(&AccountLabels {
                    account: id.clone(),
                    unit,
                })
                .set(self.budgets.usage(&id).0);
        }
        Ok(written)
    }

    /// Every configured budget account.
    fn accounts(&self) -> Vec<(String, BudgetConfig)> {
        let keys = self.keys.list();
        let key_budgets = keys
            .iter()
            .filter_map(|k| k.budget.map(|b| (format!("key:{}", k.name), b)));
        let tenant_budgets = self
            .config
            .tenants
            .iter()
            .filter_map(|(n, t)| t.budget.map(|b| (format!("tenant:{n}"), b)));
        key_budgets.chain(tenant_budgets).collect()
    }

    /// How often to flush.
    pub(crate) fn flush_every(&self) -> Duration {
        Duration::from_millis(self.config.flush_ms)
    }

    /// Whether anything needs flushing at all.
    pub(crate) fn persists(&self) -> bool {
        self.budgets.store().is_some()
    }
}
