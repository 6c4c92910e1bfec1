//! The renewal loop's decisions, sans-IO: when to renew and when to step down.
//!
//! The driver starts a [`Renewer`] right after its Acquire committed, feeds it ticks and renew
//! outcomes with the time of its own monotonic clock (a `Duration` since its epoch), and does
//! what it returns: [`RenewerAction::Renew`] (send one renew; at most one is in flight) or
//! [`RenewerAction::StepDown`] (cancel activation, disconnect and quiesce; the renewer is then
//! done and returns nothing more).
//!
//! A success counts from the time its request was **sent** (for the first one, the Acquire's):
//! the store's expiry is at least that plus the TTL, so acting until `sent + renew_deadline` is
//! safe whatever the round trip took. It steps down on a definitive loss, and when no renew
//! sent less than `renew_deadline` ago has succeeded: a renew still in flight at the deadline, a
//! run of failures, or a process paused past it (the first tick after the pause steps down
//! before anything else).

use std::time::Duration;

use super::timing::{format_duration, LeaseTiming};
use super::types::Staleness;

/// A point in time on the driver's monotonic clock: how long since its epoch.
pub type Now = Duration;

/// What came of one renew request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenewOutcome {
    /// The store extended the ownership.
    Renewed,
    /// The store said the claim is stale (the ledger appended `Lost`): definitive.
    Lost(Staleness),
    /// The renew did not reach a verdict (store unreachable, timeout...): retried.
    Failed(String),
}

/// Why the holder steps down.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepDownReason {
    /// A renew found the claim stale.
    Lost(Staleness),
    /// No renew sent within the deadline succeeded.
    DeadlineMissed {
        /// How long since the newest successful renew was sent.
        since_success: Duration,
        /// The newest renew failure, if any.
        last_error: Option<String>,
    },
}

impl std::fmt::Display for StepDownReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Lost(reason) => write!(f, "the lease was lost: {reason}"),
            Self::DeadlineMissed {
                since_success,
                last_error,
            } => {
                write!(
                    f,
                    "no lease renew succeeded for {}",
                    format_duration(*since_success)
                )?;
                match last_error {
                    Some(error) => write!(f, " (last error: {error})"),
                    None => Ok(()),
                }
            }
        }
    }
}

/// What the driver must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenewerAction {
    /// Send one renew (holder and token as acquired).
    Renew,
    /// Stop acting: cancel activation, disconnect and quiesce.
    StepDown {
        /// Why.
        reason: StepDownReason,
    },
}

/// The renewal state machine of one ownership. See the module docs.
#[derive(Debug, Clone)]
pub struct Renewer {
    timing: LeaseTiming,
    last_success: Now,
    next_attempt: Now,
    in_flight: Option<Now>,
    last_error: Option<String>,
    stepped_down: Option<StepDownReason>,
    now: Now,
}

impl Renewer {
    /// A renewer for the ownership whose Acquire request was sent at `acquire_sent_at`.
    pub fn start(timing: LeaseTiming, acquire_sent_at: Now) -> Self {
        Self {
            timing,
            last_success: acquire_sent_at,
            next_attempt: acquire_sent_at.saturating_add(timing.renew_interval),
            in_flight: None,
            last_error: None,
            stepped_down: None,
            now: acquire_sent_at,
        }
    }

    /// Time passed: maybe renew, maybe step down.
    pub fn tick(&mut self, now: Now) -> Option<RenewerAction> {
        if self.stepped_down.is_some() {
            return None;
        }
        self.now = self.now.max(now);
        if self.now >= self.local_deadline() {
            return Some(self.step_down(StepDownReason::DeadlineMissed {
                since_success: self.now.saturating_sub(self.last_success),
                last_error: self.last_error.clone(),
            }));
        }
        if self.in_flight.is_none() && self.now >= self.next_attempt {
            self.in_flight = Some(self.now);
            return Some(RenewerAction::Renew);
        }
        None
    }

    /// The outcome of the renew in flight arrived at `now`. An outcome with no renew in
    /// flight (or after stepping down) is ignored.
    pub fn outcome(&mut self, now: Now, outcome: RenewOutcome) -> Option<RenewerAction> {
        if self.stepped_down.is_some() {
            return None;
        }
        let sent_at = self.in_flight.take()?;
        self.now = self.now.max(now);
        match outcome {
            RenewOutcome::Renewed => {
                self.last_success = self.last_success.max(sent_at);
                self.last_error = None;
                self.next_attempt = sent_at.saturating_add(self.timing.renew_interval);
            }
            RenewOutcome::Lost(reason) => {
                return Some(self.step_down(StepDownReason::Lost(reason)));
            }
            RenewOutcome::Failed(error) => {
                self.last_error = Some(error);
                self.next_attempt = self.now.saturating_add(self.timing.renew_interval);
            }
        }
        self.tick(self.now)
    }

    /// Until when the holder may act: the newest successful renew's send time plus the deadline.
    pub fn local_deadline(&self) -> Now {
        self.last_success.saturating_add(self.timing.renew_deadline)
    }

    /// When the driver must tick next (`None` once stepped down).
    pub fn next_wakeup(&self) -> Option<Now> {
        if self.stepped_down.is_some() {
            return None;
        }
        let deadline = self.local_deadline();
        Some(match self.in_flight {
            Some(_) => deadline,
            None => deadline.min(self.next_attempt),
        })
    }

    /// True while a renew is in flight.
    pub fn renew_in_flight(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Why it stepped down, once it has.
    pub fn stepped_down(&self) -> Option<&StepDownReason> {
        self.stepped_down.as_ref()
    }

    fn step_down(&mut self, reason: StepDownReason) -> RenewerAction {
        self.in_flight = None;
        self.stepped_down = Some(reason.clone());
        RenewerAction::StepDown { reason }
    }
}
