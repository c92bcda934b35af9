//! The `tenancy` section: API keys, tenants, what tokens cost, budgets and agent controls.

use kvgate_core::tenancy::{ChargeModel, LimitsConfig, Price};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Who may call the gateway and how much of the fleet each caller gets. Everything is off by
/// default: without keys any client is served, and its tenant is the tenant header or the hash of
/// its bearer key, as before.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenancyConfig {
    /// Client API keys. With one or more keys (here or added through the admin API), a request
    /// without a known key gets 401.
    pub keys: Vec<KeyConfig>,
    /// Tenants by name: fair-share weight, limits and budget shared by all their keys.
    pub tenants: BTreeMap<String, TenantConfig>,
    /// How a request's tokens are estimated and weighed.
    pub charge: ChargeModel,
    /// Prices per model, for budgets in dollars and the access log's cost.
    pub prices: BTreeMap<String, Price>,
    /// The embedded database holding spend (and keys added through the admin API) across
    /// restarts; required when any budget is set.
    pub store: Option<PathBuf>,
    /// How often spend is written to the store: a kill -9 loses at most this much settled spend
    /// (a SIGTERM loses none).
    pub flush_ms: u64,
    /// Agent controls.
    pub agents: AgentConfig,
}

impl Default for TenancyConfig {
    fn default() -> Self {
        TenancyConfig {
            keys: Vec::new(),
            tenants: BTreeMap::new(),
            charge: ChargeModel::default(),
            prices: BTreeMap::new(),
            store: None,
            flush_ms: 500,
            agents: AgentConfig::default(),
        }
    }
}

/// One client API key. Only its SHA-256 is kept (`printf %s "$KEY" | sha256sum`), so a leaked
/// configuration or store leaks no key.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KeyConfig {
    /// A name for logs, metrics and the admin API.
    pub name: String,
    /// The key's SHA-256, 64 hex digits.
    pub key_sha256: String,
    /// The tenant its requests belong to; the key's name when absent.
    pub tenant: Option<String>,
    /// Models it may use; all when absent.
    pub models: Option<Vec<String>>,
    /// Its own limits, on top of its tenant's.
    pub limits: LimitsConfig,
    /// Its own budget, on top of its tenant's.
    pub budget: Option<BudgetConfig>,
}

/// A tenant.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantConfig {
    /// Share of the fleet relative to other tenants when they all wait (fair queueing).
    pub weight: f64,
    /// Limits of the tenant as a whole.
    pub limits: LimitsConfig,
    /// Budget of the tenant as a whole.
    pub budget: Option<BudgetConfig>,
}

impl Default for TenantConfig {
    fn default() -> Self {
        TenantConfig {
            weight: 1.0,
            limits: LimitsConfig::default(),
            budget: None,
        }
    }
}

/// A spend limit: tokens (prompt plus output, as the engines report them) or dollars (from
/// `prices`); exactly one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BudgetConfig {
    /// Tokens.
    pub tokens: Option<f64>,
    /// Dollars.
    pub usd: Option<f64>,
}

/// Controls for agents, whose one action becomes many calls.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    /// Requests of one session in flight at once; more wait (in arrival order, within the
    /// queue timeout). Off when absent.
    pub session_max_concurrency: Option<u32>,
    /// Fan-out first-call serialisation: when calls sharing a new prefix arrive together, send one
    /// and hold the others until its first token, so they find the prefix cached (a parallel
    /// fan-out otherwise all misses).
    pub serialize_fanout: bool,
    /// Longest a held call waits for its leader's first token.
    pub fanout_max_wait_ms: u64,
    /// Shared prefixes shorter than this (estimated tokens) are not worth holding for.
    pub fanout_min_prefix_tokens: u32,
    /// How long a prefix counts as seen (and no longer new) after its first token.
    pub fanout_seen_ttl_ms: u64,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            session_max_concurrency: None,
            serialize_fanout: true,
            fanout_max_wait_ms: 2_000,
            fanout_min_prefix_tokens: 256,
            fanout_seen_ttl_ms: 60_000,
        }
    }
}

fn invalid(field: String, why: impl Into<String>) -> crate::error::ConfigError {
    crate::error::ConfigError::Invalid {
        field,
        why: why.into(),
    }
}

impl BudgetConfig {
    fn validate(&self, field: &str) -> Result<(), crate::error::ConfigError> {
        match (self.tokens, self.usd) {
            (Some(v), None) | (None, Some(v)) if v.is_finite() && v >= 0.0 => Ok(()),
            (Some(_), Some(_)) | (None, None) => Err(invalid(
                field.into(),
                "set exactly one of `tokens` and `usd`",
            )),
            _ => Err(invalid(field.into(), "must be a number, not negative")),
        }
    }
}

/// Checks limits and a budget, naming fields through `at`.
fn check_share(
    limits: &LimitsConfig,
    budget: Option<&BudgetConfig>,
    at: impl Fn(&str) -> String,
) -> Result<(), crate::error::ConfigError> {
    limits
        .validate()
        .map_err(|why| invalid(at("limits"), why))?;
    budget.map_or(Ok(()), |b| b.validate(&at("budget")))
}

impl KeyConfig {
    /// Checks one key (from the file or the admin API), naming fields through `at`.
    pub(crate) fn check(
        &self,
        at: impl Fn(&str) -> String,
    ) -> Result<(), crate::error::ConfigError> {
        if self.name.is_empty() {
            return Err(invalid(at("name"), "must be set"));
        }
        super::keys::parse_sha256(&self.key_sha256)
            .map_err(|why| invalid(at("key_sha256"), why))?;
        check_share(&self.limits, self.budget.as_ref(), at)
    }
}

impl TenancyConfig {
    /// Checks keys, limits, weights, prices and budgets.
    pub fn validate(&self) -> Result<(), crate::error::ConfigError> {
        self.charge
            .validate()
            .map_err(|why| invalid("tenancy.charge".into(), why))?;
        let mut names = std::collections::HashSet::new();
        let mut hashes = std::collections::HashSet::new();
        let mut budgets = false;
        for (i, k) in self.keys.iter().enumerate() {
            let at = |f: &str| format!("tenancy.keys[{i}].{f}");
            k.check(at)?;
            if !names.insert(k.name.as_str()) {
                return Err(invalid(at("name"), "must be unique"));
            }
            if !hashes.insert(k.key_sha256.to_ascii_lowercase()) {
                return Err(invalid(at("key_sha256"), "two keys have the same hash"));
            }
            budgets |= k.budget.is_some();
        }
        for (name, t) in &self.tenants {
            let at = |f: &str| format!("tenancy.tenants.{name}.{f}");
            if !(t.weight.is_finite() && t.weight > 0.0) {
                return Err(invalid(at("weight"), "must be a positive number"));
            }
            check_share(&t.limits, t.budget.as_ref(), at)?;
            budgets |= t.budget.is_some();
        }
        for (model, p) in &self.prices {
            p.validate()
                .map_err(|why| invalid(format!("tenancy.prices.{model}"), why))?;
        }
        if budgets && self.store.is_none() {
            return Err(invalid(
                "tenancy.store".into(),
                "budgets need a store file so spend survives restarts",
            ));
        }
        if !(10..=60_000).contains(&self.flush_ms) {
            return Err(invalid(
                "tenancy.flush_ms".into(),
                "must be from 10 to 60000",
            ));
        }
        if self.agents.session_max_concurrency == Some(0) {
            return Err(invalid(
                "tenancy.agents.session_max_concurrency".into(),
                "must be at least 1",
            ));
        }
        Ok(())
    }
}
