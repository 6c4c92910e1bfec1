//! Renewal timing: the TTL, how often the holder renews, and how long it may go without a
//! successful renew before it steps down.
//!
//! The ratios are client-go leader election's (15 s lease, 10 s renew deadline, 2 s retry
//! period), which requires `lease > renew deadline > 1.2 x retry period` (1.2 is its jitter
//! factor: at least one full retry fits in the deadline). Wharf keeps the same ratios at its
//! 45 s default TTL, so the default is exactly client-go's times three:
//! - `ttl` 45 s: how long the store keeps an ownership without a renew (the default);
//! - `renew_deadline` 30 s (2/3 of the TTL): the holder acts only while its newest successful
//!   renew was *sent* less than this long ago. The 15 s left before the store's expiry are the
//!   margin for stepping down (cancel, disconnect, quiesce) and for the rate difference between
//!   the holder's monotonic clock and the store's clock;
//! - `renew_interval` 6 s (2/15 of the TTL, client-go's retry period): the pause between renew
//!   attempts, after a success and after a failure alike, so five attempts fit in the deadline.

use std::time::Duration;

use super::ledger::MAX_TTL;
use crate::error::ValidationError;

/// client-go's jitter factor: the deadline must exceed this many renew intervals.
pub const JITTER_FACTOR: f64 = 1.2;

/// The lease TTL, the renew interval and the renew deadline. See the module docs for the ratios.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTiming {
    /// How long the store keeps an ownership without a renew.
    pub ttl: Duration,
    /// The pause between renew attempts (client-go's retry period).
    pub renew_interval: Duration,
    /// How long the holder may go without a successful renew before it steps down.
    pub renew_deadline: Duration,
}

impl Default for LeaseTiming {
    /// 45 s / 6 s / 30 s: client-go's 15 s / 2 s / 10 s times three.
    fn default() -> Self {
        Self::scaled(Duration::from_secs(45))
    }
}

impl LeaseTiming {
    /// client-go's ratios at `ttl`: deadline 2/3 of it, interval 2/15 of it (15 s gives
    /// exactly 15 s / 2 s / 10 s, 45 s gives 45 s / 6 s / 30 s).
    pub fn scaled(ttl: Duration) -> Self {
        Self {
            ttl,
            renew_interval: ttl * 2 / 15,
            renew_deadline: ttl * 2 / 3,
        }
    }

    /// How long before the store's expiry the holder has stopped acting, at the latest.
    pub fn margin(&self) -> Duration {
        self.ttl.saturating_sub(self.renew_deadline)
    }

    /// Checks every field is non-zero, the TTL is whole milliseconds and at most one day, and
    /// `ttl > renew_deadline > 1.2 x renew_interval`. Errors name `{section}.FIELD`.
    pub fn validate(&self, section: &str) -> Result<(), ValidationError> {
        let field = |name: &str| format!("{section}.{name}");
        for (name, value) in [
            ("ttl", self.ttl),
            ("renew_interval", self.renew_interval),
            ("renew_deadline", self.renew_deadline),
        ] {
            if value.is_zero() {
                return Err(invalid(&field(name), value, "must be greater than zero"));
            }
        }
        if self.ttl > MAX_TTL || !self.ttl.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(invalid(
                &field("ttl"),
                self.ttl,
                "must be whole milliseconds, at most 24h",
            ));
        }
        if self.renew_deadline >= self.ttl {
            let reason = format!(
                "must be shorter than ttl ({}): the holder must stop before the store expires it",
                format_duration(self.ttl)
            );
            return Err(invalid(
                &field("renew_deadline"),
                self.renew_deadline,
                &reason,
            ));
        }
        if self.renew_deadline.as_secs_f64() <= JITTER_FACTOR * self.renew_interval.as_secs_f64() {
            let reason = format!(
                "must be shorter than renew_deadline / 1.2 ({} / 1.2): at least one retry must \
                 fit in the deadline",
                format_duration(self.renew_deadline)
            );
            return Err(invalid(
                &field("renew_interval"),
                self.renew_interval,
                &reason,
            ));
        }
        Ok(())
    }
}

fn invalid(field: &str, value: Duration, reason: &str) -> ValidationError {
    ValidationError::new(field, &format_duration(value), reason)
}

/// A duration as `45s`, `1500ms` or `250us`: the coarsest whole unit.
pub fn format_duration(value: Duration) -> String {
    let nanos = value.as_nanos();
    if nanos.is_multiple_of(1_000_000_000) {
        format!("{}s", nanos / 1_000_000_000)
    } else if nanos.is_multiple_of(1_000_000) {
        format!("{}ms", nanos / 1_000_000)
    } else if nanos.is_multiple_of(1_000) {
        format!("{}us", nanos / 1_000)
    } else {
        format!("{nanos}ns")
    }
}
