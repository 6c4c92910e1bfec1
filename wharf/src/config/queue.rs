//! The `queue` section: claims, retries, the consumer runtime and log retention.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::retention::check_retention;
use crate::error::WharfError;

/// The message log: how claims and retries behave, how a consumer's runtime claims and drains,
/// and how long the log keeps aged messages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueConfig {
    /// How long a claim hides a message from other instances; a handler still running after
    /// this may see its message redelivered elsewhere (delivery is at least once).
    #[serde(with = "humantime_serde")]
    pub visibility_timeout: Duration,
    /// How many times a message may be claimed before it goes to the group's dead letters.
    pub max_attempts: u32,
    /// The backoff after a message's first failure; it doubles with every further attempt.
    #[serde(with = "humantime_serde")]
    pub backoff_base: Duration,
    /// The longest backoff between attempts.
    #[serde(with = "humantime_serde")]
    pub backoff_max: Duration,
    /// How many log positions one routing step reads.
    pub route_batch: i64,
    /// The most messages a consumer claims in one fetch.
    pub claim_batch: u32,
    /// How long a consumer waits after a fetch that claimed nothing before it fetches again.
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
    /// The most handlers one consumer runs at once.
    pub concurrency: u32,
    /// How long a running handler's claim is kept alive by extending it (by the visibility
    /// timeout, every third of it). After this the claim is left to expire, so a hung handler
    /// cannot hold its message forever. `0s` never extends.
    #[serde(with = "humantime_serde")]
    pub max_claim_hold: Duration,
    /// How long a shutting-down consumer waits for its running handlers before it aborts them
    /// (their claims then expire and the messages are redelivered).
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// Messages older than this that no live group still needs are deleted from the log.
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
    /// Rows per retention delete transaction.
    pub retention_batch: i64,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            visibility_timeout: Duration::from_secs(30),
            max_attempts: 5,
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            route_batch: 1000,
            claim_batch: 32,
            poll_interval: Duration::from_millis(200),
            concurrency: 8,
            max_claim_hold: Duration::from_secs(3600),
            drain_timeout: Duration::from_secs(30),
            retention: Duration::from_secs(7 * 24 * 3600),
            retention_batch: 5000,
        }
    }
}

impl QueueConfig {
    /// The claim and retry settings the queue layer works with.
    pub fn settings(&self) -> wharf_queue::QueueSettings {
        wharf_queue::QueueSettings {
            visibility_timeout: self.visibility_timeout,
            max_attempts: self.max_attempts,
            backoff_base: self.backoff_base,
            backoff_max: self.backoff_max,
            route_batch: self.route_batch,
        }
    }

    /// Checks every key of the section; the error names the key and the value.
    pub fn validate(&self) -> Result<(), WharfError> {
        let zero_durations = [
            ("visibility_timeout", self.visibility_timeout),
            ("poll_interval", self.poll_interval),
            ("retention", self.retention),
        ];
        if let Some((key, _)) = zero_durations.iter().find(|(_, d)| d.is_zero()) {
            return Err(WharfError::Config(format!("queue.{key} must be above 0")));
        }
        check_retention("queue.retention", self.retention)?;
        let counts = [
            ("max_attempts", i64::from(self.max_attempts)),
            ("route_batch", self.route_batch),
            ("claim_batch", i64::from(self.claim_batch)),
            ("concurrency", i64::from(self.concurrency)),
            ("retention_batch", self.retention_batch),
        ];
        if let Some((key, value)) = counts.iter().find(|(_, n)| *n < 1) {
            return Err(WharfError::Config(format!(
                "queue.{key} must be at least 1, got {value}"
            )));
        }
        if self.max_claim_hold > Duration::from_secs(7 * 24 * 3600) {
            return Err(WharfError::Config(format!(
                "queue.max_claim_hold must be at most 7 days, got {}",
                humantime::format_duration(self.max_claim_hold)
            )));
        }
        if self.backoff_max < self.backoff_base {
            return Err(WharfError::Config(format!(
                "queue.backoff_max ({}) must not be below queue.backoff_base ({})",
                humantime::format_duration(self.backoff_max),
                humantime::format_duration(self.backoff_base)
            )));
        }
        Ok(())
    }
}
