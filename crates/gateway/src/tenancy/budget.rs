//! Budgets: spend per key and per tenant, checked before a request is sent and kept across
//! restarts in an embedded database.
//!
//! Spend is held in memory and written to the store every `flush_ms` and at shutdown, in one
//! transaction that is durable when it commits. The store (`super::store`) is redb, a pure-Rust embedded
//! key-value store with ACID transactions: one file, no server, no C toolchain (SQLite would
//! bring all three questions for two small tables), and a crash between commits leaves the last
//! committed state. A kill -9 therefore loses at most `flush_ms` of settled spend; requests in
//! flight are not yet spend (their estimate is a reservation, in memory only).
//!
//! Before a request is sent, every budget it counts against must have room for what is already
//! spent, what requests in flight reserved, and this request's estimate; otherwise it is refused
//! before it reaches an engine.

use super::config::BudgetConfig;
pub(crate) use super::store::{Store, StoreError};
use kvgate_core::tenancy::{Charge, Price};
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

/// A budget a request counts against: `key:NAME` or `tenant:NAME`.
#[derive(Clone, Debug)]
pub(crate) struct Account {
    pub(crate) id: String,
    pub(crate) budget: BudgetConfig,
}

impl Account {
    /// What `charge` costs in this budget's unit; `None` for a dollar budget without a price.
    fn cost(&self, charge: &Charge, price: Option<&Price>) -> Option<f64> {
        match self.budget.usd {
            Some(_) => price.map(|p| p.cost(charge)),
            None => Some(charge.input + charge.cached_input + charge.output),
        }
    }

    fn limit(&self) -> f64 {
        self.budget
            .usd
            .or(self.budget.tokens)
            .unwrap_or(f64::INFINITY)
    }
}

/// Why a request was refused.
#[derive(Debug, PartialEq)]
pub(crate) enum Refusal {
    /// The budget has no room.
    Exhausted {
        /// `key:NAME` or `tenant:NAME`.
        account: String,
        /// Spent so far (in flight included).
        spent: f64,
        /// The limit.
        limit: f64,
    },
    /// A dollar budget applies and the model has no price.
    NoPrice(String),
}

#[derive(Debug, Default)]
struct Ledger {
    spent: HashMap<String, f64>,
    reserved: HashMap<String, f64>,
    dirty: HashSet<String>,
}

/// Spend in memory, written to the store. See the module documentation.
#[derive(Debug)]
pub(crate) struct Budgets {
    ledger: Mutex<Ledger>,
    store: Option<Store>,
}

/// What a request reserved; give it to [`Budgets::settle`].
#[derive(Debug, Default)]
pub(crate) struct Reservation {
    holds: Vec<(Account, f64)>,
}

impl Budgets {
    /// Budgets loaded from `store`.
    pub(crate) fn new(store: Option<Store>) -> Result<Self, StoreError> {
        let spent = match &store {
            Some(s) => s.spend()?,
            None => HashMap::new(),
        };
        Ok(Budgets {
            ledger: Mutex::new(Ledger {
                spent,
                ..Ledger::default()
            }),
            store,
        })
    }

    /// The store, for admin-added keys.
    pub(crate) fn store(&self) -> Option<&Store> {
        self.store.as_ref()
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reserves `estimate` in every account, or refuses without reserving anything.
    pub(crate) fn reserve(
        &self,
        accounts: Vec<Account>,
        estimate: &Charge,
        price: Option<&Price>,
        model: &str,
    ) -> Result<Reservation, Refusal> {
        if accounts.is_empty() {
            return Ok(Reservation::default());
        }
        let mut ledger = self.ledger();
        let mut holds = Vec::with_capacity(accounts.len());
        for a in accounts {
            let cost = a
                .cost(estimate, price)
                .ok_or_else(|| Refusal::NoPrice(model.into()))?;
            let spent = ledger.spent.get(&a.id).copied().unwrap_or(0.0)
                + ledger.reserved.get(&a.id).copied().unwrap_or(0.0);
            if spent + cost > a.limit() {
                return Err(Refusal::Exhausted {
                    limit: a.limit(),
                    account: a.id,
                    spent,
                });
            }
            holds.push((a, cost));
        }
        for (a, cost) in &holds {
            *ledger.reserved.entry(a.id.clone()).or_default() += cost;
        }
        Ok(Reservation { holds })
    }

    /// Replaces a reservation by what the request used; returns what each account spent.
    pub(crate) fn settle(
        &self,
        reservation: Reservation,
        actual: &Charge,
        price: Option<&Price>,
    ) -> Vec<(String, f64)> {
        if reservation.holds.is_empty() {
            return Vec::new();
        }
        let mut ledger = self.ledger();
        let mut spent = Vec::with_capacity(reservation.holds.len());
        for (a, held) in reservation.holds {
            if let Some(r) = ledger.reserved.get_mut(&a.id) {
                *r = (*r - held).max(0.0);
            }
            let used = a.cost(actual, price).unwrap_or(held);
            *ledger.spent.entry(a.id.clone()).or_default() += used;
            ledger.dirty.insert(a.id.clone());
            spent.push((a.id, used));
        }
        spent
    }

    /// Adds what peers (other gateway replicas) spent; written to the store like local spend,
    /// so every replica's store holds the whole fleet's.
    pub(crate) fn add_spent(&self, spent: &[(String, f64)]) {
        let mut ledger = self.ledger();
        for (id, used) in spent {
            if used.is_finite() && *used > 0.0 {
                *ledger.spent.entry(id.clone()).or_default() += used;
                ledger.dirty.insert(id.clone());
            }
        }
    }

    /// Spent and reserved in `account`.
    pub(crate) fn usage(&self, account: &str) -> (f64, f64) {
        let ledger = self.ledger();
        (
            ledger.spent.get(account).copied().unwrap_or(0.0),
            ledger.reserved.get(account).copied().unwrap_or(0.0),
        )
    }

    /// Writes changed spend to the store (blocking: call from a blocking thread).
    pub(crate) fn flush(&self) -> Result<usize, StoreError> {
        let Some(store) = &self.store else {
            return Ok(0);
        };
        let rows: Vec<(String, f64)> = {
            let mut ledger = self.ledger();
            let dirty = std::mem::take(&mut ledger.dirty);
            dirty
                .into_iter()
                .map(|id| {
                    let v = ledger.spent.get(&id).copied().unwrap_or(0.0);
                    (id, v)
                })
                .collect()
        };
        if rows.is_empty() {
            return Ok(0);
        }
        if let Err(e) = store.write_spend(&rows) {
            // Keep them dirty for the next flush.
            self.ledger()
                .dirty
                .extend(rows.into_iter().map(|(id, _)| id));
            return Err(e);
        }
        Ok(rows.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(id: &str, limit: f64) -> Account {
        Account {
            id: id.into(),
            budget: BudgetConfig {
                tokens: Some(limit),
                usd: None,
            },
        }
    }

    #[cfg(feature = "store")]
    #[test]
    fn spend_survives_reopening_and_refuses_what_would_exceed() {
        let dir = std::env::temp_dir().join(format!("kvgate-budget-{}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        let estimate = Charge {
            input: 600.0,
            ..Default::default()
        };
        {
            let b = Budgets::new(Some(Store::open(&dir).unwrap())).unwrap();
            let r = b
                .reserve(vec![tokens("key:a", 1000.0)], &estimate, None, "m")
                .unwrap();
            // In flight, the reservation counts: a second one would exceed.
            assert!(matches!(
                b.reserve(vec![tokens("key:a", 1000.0)], &estimate, None, "m"),
                Err(Refusal::Exhausted { .. })
            ));
            b.settle(
                r,
                &Charge {
                    input: 500.0,
                    ..Default::default()
                },
                None,
            );
            assert_eq!(b.usage("key:a"), (500.0, 0.0));
            assert_eq!(b.flush().unwrap(), 1);
        }
        let b = Budgets::new(Some(Store::open(&dir).unwrap())).unwrap();
        assert_eq!(b.usage("key:a"), (500.0, 0.0));
        assert!(b
            .reserve(vec![tokens("key:a", 1000.0)], &estimate, None, "m")
            .is_err());
        let usd = Account {
            id: "tenant:t".into(),
            budget: BudgetConfig {
                tokens: None,
                usd: Some(1.0),
            },
        };
        assert_eq!(
            b.reserve(vec![usd], &estimate, None, "m").unwrap_err(),
            Refusal::NoPrice("m".into())
        );
        let _ = std::fs::remove_file(&dir);
    }
}
