//! The tenancy store: spend per budget account and keys added through the admin API, in an
//! embedded database ([`redb`], a pure-Rust embedded key-value store whose write transaction is
//! durable when it commits) behind the `store` feature. Without it, a configuration naming a
//! store is refused.

use super::config::KeyConfig;
use std::collections::HashMap;
use std::path::Path;

/// The store failed.
#[derive(Debug, thiserror::Error)]
#[error("tenancy store: {0}")]
pub(crate) struct StoreError(String);

#[cfg(feature = "store")]
pub(crate) use embedded::Store;

#[cfg(feature = "store")]
mod embedded {
    use super::{HashMap, KeyConfig, Path, StoreError};
    use redb::{Database, ReadableTable, TableDefinition};

    fn err(e: impl std::fmt::Display) -> StoreError {
        StoreError(e.to_string())
    }

    const SPEND: TableDefinition<&str, f64> = TableDefinition::new("spend");
    const KEYS: TableDefinition<&str, &str> = TableDefinition::new("keys");

    /// The embedded database.
    #[derive(Debug)]
    pub(crate) struct Store {
        db: Database,
    }

    impl Store {
        /// Opens (or creates) the file.
        pub(crate) fn open(path: &Path) -> Result<Self, StoreError> {
            let db = Database::create(path)
                .map_err(|e| StoreError(format!("{}: {e}", path.display())))?;
            let tx = db.begin_write().map_err(err)?;
            tx.open_table(SPEND).map_err(err)?;
            tx.open_table(KEYS).map_err(err)?;
            tx.commit().map_err(err)?;
            Ok(Store { db })
        }

        pub(crate) fn spend(&self) -> Result<HashMap<String, f64>, StoreError> {
            let tx = self.db.begin_read().map_err(err)?;
            let table = tx.open_table(SPEND).map_err(err)?;
            let mut out = HashMap::new();
            for row in table.iter().map_err(err)? {
                let (k, v) = row.map_err(err)?;
                out.insert(k.value().to_owned(), v.value());
            }
            Ok(out)
        }

        pub(crate) fn write_spend(&self, rows: &[(String, f64)]) -> Result<(), StoreError> {
            let tx = self.db.begin_write().map_err(err)?;
            {
                let mut table = tx.open_table(SPEND).map_err(err)?;
                for (k, v) in rows {
                    table.insert(k.as_str(), *v).map_err(err)?;
                }
            }
            tx.commit().map_err(err)
        }

        /// Keys added through the admin API.
        pub(crate) fn keys(&self) -> Result<Vec<KeyConfig>, StoreError> {
            let tx = self.db.begin_read().map_err(err)?;
            let table = tx.open_table(KEYS).map_err(err)?;
            let mut out = Vec::new();
            for row in table.iter().map_err(err)? {
                let (_, v) = row.map_err(err)?;
                out.push(serde_json::from_str(v.value()).map_err(err)?);
            }
            Ok(out)
        }

        /// Saves (or, with `None`, deletes) an admin-added key.
        pub(crate) fn put_key(
            &self,
            name: &str,
            key: Option<&KeyConfig>,
        ) -> Result<(), StoreError> {
            let tx = self.db.begin_write().map_err(err)?;
            {
                let mut table = tx.open_table(KEYS).map_err(err)?;
                match key {
                    Some(k) => {
                        let json = serde_json::to_string(k).map_err(err)?;
                        table.insert(name, json.as_str()).map_err(err)?;
                    }
                    None => {
                        table.remove(name).map_err(err)?;
                    }
                }
            }
            tx.commit().map_err(err)
        }
    }
}

/// Without the `store` feature a store cannot be opened, so none exists.
#[cfg(not(feature = "store"))]
#[derive(Debug)]
pub(crate) struct Store {
    never: std::convert::Infallible,
}

#[cfg(not(feature = "store"))]
impl Store {
    /// Refuses: this build keeps nothing across restarts.
    pub(crate) fn open(path: &Path) -> Result<Self, StoreError> {
        Err(StoreError(format!(
            "{}: this build has no store (the gateway's `store` feature; the `kvgate` binary has it)",
            path.display()
        )))
    }

    pub(crate) fn spend(&self) -> Result<HashMap<String, f64>, StoreError> {
        match self.never {}
    }

    pub(crate) fn write_spend(&self, _: &[(String, f64)]) -> Result<(), StoreError> {
        match self.never {}
    }

    pub(crate) fn keys(&self) -> Result<Vec<KeyConfig>, StoreError> {
        match self.never {}
    }

    pub(crate) fn put_key(&self, _: &str, _: Option<&KeyConfig>) -> Result<(), StoreError> {
        match self.never {}
    }
}
