//! What the admin API reads and changes of tenancy: its status, and keys added and revoked
//! at run time.

use super::*;

impl Tenancy {
    /// Keys, limits, budgets and sessions, for the admin status.
    pub(crate) fn status(&self, now: Nanos) -> serde_json::Value {
        let mut limiters = self.limiters.lock().unwrap_or_else(|e| e.into_inner());
        let limits: serde_json::Map<String, serde_json::Value> = limiters
            .iter_mut()
            .map(|(id, l)| {
                let rates: Vec<_> = l
                    .snapshot(now)
                    .into_iter()
                    .map(|(kind, limit, remaining, reset)| {
                        serde_json::json!({"limit": kind.label(), "per_minute": limit, "remaining": remaining, "full_in_secs": reset})
                    })
                    .collect();
                (id.clone(), serde_json::json!({"rates": rates, "in_flight": l.in_flight()}))
            })
            .collect();
        drop(limiters);
        let budgets: Vec<_> = self
            .accounts()
            .into_iter()
            .map(|(id, b)| {
                let (spent, reserved) = self.budgets.usage(&id);
                serde_json::json!({"account": id, "tokens": b.tokens, "usd": b.usd, "spent": spent, "in_flight": reserved})
            })
            .collect();
        serde_json::json!({
            "keys_required": self.keys.enforced(),
            "keys": self.keys_json(),
            "tenants": self.config.tenants,
            "limits": limits,
            "budgets": budgets,
            "sessions_capped": self.sessions.as_ref().map(SessionCaps::active),
            "fanout_prefixes_tracked": self.fanout.as_ref().map(FanoutGate::tracked),
        })
    }

    /// Every key as the admin API shows it: never the digest.
    pub(crate) fn keys_json(&self) -> Vec<serde_json::Value> {
        self.keys
            .list()
            .iter()
            .map(|k| serde_json::json!({"name": k.name, "tenant": k.tenant.as_deref().unwrap_or(&k.name), "models": k.models, "limits": k.limits, "budget": k.budget}))
            .collect()
    }

    /// Adds a key through the admin API (persisted when there is a store).
    pub(crate) fn add_key(&self, key: KeyConfig) -> Result<(), ApiError> {
        let bad = |why: String| ApiError::invalid("invalid_value", why);
        key.check(|f| f.to_owned())
            .map_err(|e| bad(e.to_string()))?;
        if key.budget.is_some() && self.budgets.store().is_none() {
            return Err(bad("budgets need tenancy.store".into()));
        }
        if let Some(store) = self.budgets.store() {
            store
                .put_key(&key.name, Some(&key))
                .map_err(|e| ApiError::upstream(e.to_string()))?;
        }
        self.named
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.tenant.clone().unwrap_or_else(|| key.name.clone()));
        self.keys.insert(key).map_err(bad)
    }

    /// Removes a key; whether it existed.
    pub(crate) fn remove_key(&self, name: &str) -> Result<bool, ApiError> {
        if let Some(store) = self.budgets.store() {
            store
                .put_key(name, None)
                .map_err(|e| ApiError::upstream(e.to_string()))?;
        }
        Ok(self.keys.remove(name))
    }
}
