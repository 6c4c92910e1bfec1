//! The hard bound on one initial exclusive activation (issue 10, point 3).
//!
//! Initial activation runs under one conservative whole-path bound, not the short cap a
//! recurring reconnect's reconcile has. The bound is the sum of every phase that may run in
//! sequence, each at the timeout that bounds it:
//!
//! ```text
//! bound = 2 x connect_timeout        initial connection wait + recycle connection wait
//!       + 2 x subscribe_timeout      initial SUBSCRIBE + final SUBSCRIBE on the replacement
//!       + 1 x unsubscribe_timeout    exact cleanup (one UNSUBSCRIBE of the stale filters)
//!       + 1 x quiescence_timeout     bounded ingress quiescence before the recycle
//!       + 2 x unmatched_grace        both possible replay verification windows
//! ```
//!
//! With the 30 s MQTT defaults (every one of the five at 30 s) that is 8 x 30 s = 4 min.
//! Nested reconnect-attempt limits are not counted again: a connection wait is the whole
//! budget for getting that connection, however many attempts it takes inside, and the
//! recurring reconnect cap (connect plus reconcile of one reconnect) is made of phases already
//! in the sum. The bound exceeds the 45 s lease TTL, which is why the renewer keeps the lease
//! throughout.

use std::time::Duration;

use super::renewer::Now;

/// The timeouts of the phases an initial activation may run in sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActivationPhases {
    /// A connection wait (TCP, TLS, CONNACK), for the initial and the recycle connection.
    pub connect_timeout: Duration,
    /// A SUBSCRIBE's wait for its SUBACK, for the initial and the final subscription.
    pub subscribe_timeout: Duration,
    /// The exact cleanup's wait for its UNSUBACK.
    pub unsubscribe_timeout: Duration,
    /// The longest wait for ingress to quiesce (in-flight deliveries settled) before a recycle.
    pub quiescence_timeout: Duration,
    /// One replay verification window (and the hold on a delivery that matches nothing).
    pub unmatched_grace: Duration,
}

impl ActivationPhases {
    /// Every phase at the 30 s MQTT defaults: the bound is 4 min.
    pub fn mqtt_defaults() -> Self {
        let thirty = Duration::from_secs(30);
        Self {
            connect_timeout: thirty,
            subscribe_timeout: thirty,
            unsubscribe_timeout: thirty,
            quiescence_timeout: thirty,
            unmatched_grace: thirty,
        }
    }

    /// Every phase that may run, in the order it may run, with its bound.
    pub fn phases(&self) -> [(&'static str, Duration); 8] {
        [
            ("initial connection", self.connect_timeout),
            ("initial subscription", self.subscribe_timeout),
            ("exact cleanup", self.unsubscribe_timeout),
            ("ingress quiescence", self.quiescence_timeout),
            ("recycle connection", self.connect_timeout),
            ("final subscription", self.subscribe_timeout),
            ("first replay verification", self.unmatched_grace),
            ("second replay verification", self.unmatched_grace),
        ]
    }

    /// The whole-path hard bound: the sum of [`Self::phases`] (saturating). See the module docs.
    pub fn hard_bound(&self) -> Duration {
        self.phases()
            .iter()
            .fold(Duration::ZERO, |sum, (_, phase)| sum.saturating_add(*phase))
    }
}

/// When an activation started at `started` must be over: its hard bound, or the caller's
/// deadline when that is sooner. Past it, the activation fails closed.
pub fn activation_deadline(started: Now, bound: Duration, caller: Option<Now>) -> Now {
    let own = started.saturating_add(bound);
    caller.map_or(own, |caller| caller.min(own))
}
