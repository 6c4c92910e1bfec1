//! The `prune` section: the deferred pruner.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The deferred pruner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PruneConfig {
    /// Superseded waiting attempts younger than this are kept.
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
    /// How often `serve` runs the pruner; `0s` disables the schedule.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Rows per delete transaction.
    pub batch: i64,
}

impl Default for PruneConfig {
    fn default() -> Self {
        Self {
            retention: Duration::from_secs(24 * 3600),
            interval: Duration::from_secs(3600),
            batch: 1000,
        }
    }
}
