//! The `declarations` section: how declarations retry and how liveness is judged.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::WharfError;

/// How declarations retry and how liveness is judged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeclarationConfig {
    /// How often a waiting `consume` re-attempts its declaration. There is deliberately no
    /// timeout: deadline policy belongs to the orchestrator's readiness probe.
    #[serde(with = "humantime_serde")]
    pub retry_interval: Duration,
    /// How often a consuming instance heartbeats. Must be below half of `instance_ttl`.
    #[serde(with = "humantime_serde")]
    pub heartbeat_interval: Duration,
    /// How old a heartbeat may be, by the store's clock, for its instance to count as live.
    /// It also bounds a consumer's readiness: a consumer whose heartbeat has not been confirmed
    /// for this long stops being ready and claiming, and re-declares before it claims again.
    /// Every store call of a consumer gets a third of it as its deadline.
    #[serde(with = "humantime_serde")]
    pub instance_ttl: Duration,
    /// Save a group's folded state (its snapshot, ADR 0034) once its ledger has grown this
    /// many events past the saved one, in the same transaction as the attempt that crosses it,
    /// so a process that does not hold the group yet folds only the events after it. 0 turns
    /// saving off (saved states are still read).
    pub snapshot_every: u64,
}

impl DeclarationConfig {
    /// Checks the intervals and that the TTL outlasts two heartbeats; the error names the keys
    /// and their values.
    pub fn validate(&self) -> Result<(), WharfError> {
        if self.heartbeat_interval.is_zero() || self.retry_interval.is_zero() {
            return Err(WharfError::Config(
                "declarations.heartbeat_interval and declarations.retry_interval must be above 0"
                    .into(),
            ));
        }
        if self.instance_ttl <= self.heartbeat_interval * 2 {
            return Err(WharfError::Config(format!(
                "declarations.instance_ttl ({}) must exceed twice declarations.heartbeat_interval ({}), \
                 or one late heartbeat would let a live incumbent be swapped out",
                humantime::format_duration(self.instance_ttl),
                humantime::format_duration(self.heartbeat_interval)
            )));
        }
        Ok(())
    }

    /// The deadline of every store call on a consumer's path (a declaration attempt, a
    /// heartbeat, the effective-install read, a leave, a fetch): a third of `instance_ttl`.
    ///
    /// A third leaves time for a retry before an instance's heartbeat row can lapse (the last
    /// confirmed heartbeat plus the TTL), yet does not abandon a store that is merely slow.
    /// Never below a millisecond, even for an unvalidated configuration.
    pub fn call_deadline(&self) -> Duration {
        (self.instance_ttl / 3).max(Duration::from_millis(1))
    }
}

impl Default for DeclarationConfig {
    fn default() -> Self {
        Self {
            retry_interval: Duration::from_secs(5),
            heartbeat_interval: Duration::from_secs(5),
            instance_ttl: Duration::from_secs(30),
            snapshot_every: 1000,
        }
    }
}
