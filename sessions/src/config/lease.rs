//! The `lease` section: the HA lease of exclusive MQTT sessions (ADR 0028, ADR 0030).
//!
//! ```toml
//! [lease]
//! ttl = "45s"             # how long an ownership lasts without a renew (store clock)
//! renew_interval = "6s"   # a renew every this long (2/15 of the TTL)
//! renew_deadline = "30s"  # the owner steps down if no renew sent this long ago succeeded
//! ```
//!
//! Checked as client-go checks its three durations: `ttl > renew_deadline > 1.2 x
//! renew_interval`, all non-zero, the TTL whole milliseconds and at most a day.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use wharf_domain::lease::LeaseTiming;

use crate::error::SessionError;

/// The HA lease timing of exclusive sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LeaseConfig {
    /// How long an ownership lasts without a renew, by the store's clock.
    #[serde(with = "humantime_serde")]
    pub ttl: Duration,
    /// How often the owner renews.
    #[serde(with = "humantime_serde")]
    pub renew_interval: Duration,
    /// How long after the newest successful renew's send the owner may keep acting.
    #[serde(with = "humantime_serde")]
    pub renew_deadline: Duration,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        let timing = LeaseTiming::default();
        Self {
            ttl: timing.ttl,
            renew_interval: timing.renew_interval,
            renew_deadline: timing.renew_deadline,
        }
    }
}

impl LeaseConfig {
    /// The timing, validated (errors name `lease.KEY` and the value).
    pub fn timing(&self) -> Result<LeaseTiming, SessionError> {
        let timing = LeaseTiming {
            ttl: self.ttl,
            renew_interval: self.renew_interval,
            renew_deadline: self.renew_deadline,
        };
        timing
            .validate("lease")
            .map_err(|e| SessionError::Config(e.to_string()))?;
        Ok(timing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_client_gos_ratios_at_45s() {
        let timing = LeaseConfig::default().timing().expect("valid");
        assert_eq!(timing.ttl, Duration::from_secs(45));
        assert_eq!(timing.renew_interval, Duration::from_secs(6));
        assert_eq!(timing.renew_deadline, Duration::from_secs(30));
    }

    #[test]
    fn a_deadline_at_or_past_the_ttl_is_refused_by_name() {
        let config = LeaseConfig {
            renew_deadline: Duration::from_secs(45),
            ..LeaseConfig::default()
        };
        let e = config.timing().expect_err("refused").to_string();
        assert!(
            e.contains("lease.renew_deadline") && e.contains("45s"),
            "{e}"
        );
    }
}
