//! The lifecycle's durations.

use std::time::Duration;

/// How a consumer's lifecycle is timed (the `declarations` section of the configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LifecycleTiming {
    /// How long a heartbeat row stays live by the store's clock: the bound on readiness.
    pub instance_ttl: Duration,
    /// How long after a heartbeat round the next one starts.
    pub heartbeat_interval: Duration,
    /// How long after an attempt that did not put the instance in effect the next one starts.
    pub retry_interval: Duration,
    /// The deadline of one store call (an attempt, a heartbeat, an install read, a leave).
    pub call_deadline: Duration,
}

impl LifecycleTiming {
    /// The timing with the configuration's call deadline: a third of `instance_ttl`, at least
    /// a millisecond.
    pub fn new(
        instance_ttl: Duration,
        heartbeat_interval: Duration,
        retry_interval: Duration,
    ) -> Self {
        Self {
            instance_ttl,
            heartbeat_interval,
            retry_interval,
            call_deadline: (instance_ttl / 3).max(Duration::from_millis(1)),
        }
    }
}
