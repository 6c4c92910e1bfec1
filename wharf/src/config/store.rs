//! The `store` section: where the ledger lives.

use serde::{Deserialize, Serialize};

use crate::error::WharfError;

/// Where the ledger lives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `sqlite://PATH` (the embedded default) or `postgres://...` (cluster mode).
    pub url: String,
    /// Postgres only: the schema Wharf's tables live in (created if missing). Empty = default.
    pub schema: String,
    /// Postgres only: the most connections this process holds (1 to 1000).
    pub max_connections: u32,
    /// Apply pending migrations at start. When false, start fails on an unmigrated schema.
    pub auto_migrate: bool,
}

impl StoreConfig {
    /// Checks the pool size, the schema name and the URL; the error names the key and the
    /// value.
    pub fn validate(&self) -> Result<(), WharfError> {
        if !(1..=1000).contains(&self.max_connections) {
            return Err(WharfError::Config(format!(
                "store.max_connections must be between 1 and 1000, got {}",
                self.max_connections
            )));
        }
        if !self.schema.is_empty() {
            wharf_store::postgres::check_schema_name(&self.schema)
                .map_err(|e| WharfError::Config(e.to_string()))?;
        }
        wharf_store::StoreLocation::parse(&self.url)
            .map_err(|e| WharfError::Config(format!("store.url: {e}")))?;
        Ok(())
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            url: "sqlite://wharf.db".into(),
            schema: String::new(),
            max_connections: 10,
            auto_migrate: true,
        }
    }
}
