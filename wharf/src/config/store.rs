//! The `store` section: where the ledger lives.

use serde::{Deserialize, Serialize};

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
