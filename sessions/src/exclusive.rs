//! An exclusive session's supervision: hold the HA lease, act only while holding it
//! (ADR 0028, ADR 0030).
//!
//! Each round acquires the lease (by the store's clock; a held lease makes this process a
//! standby that tries again every `lease.renew_interval`), then runs the session exactly like
//! a persistent one, with three differences:
//! - every managed-filter write goes through the fenced ledger (holder and token checked in the
//!   write's own transaction);
//! - a renewal loop, the only renewer, drives the sans-IO [`Renewer`]; when it steps down (a
//!   definitive loss, or no renew succeeded within `lease.renew_deadline`) the run is stopped,
//!   disconnects and quiesces before the round ends;
//! - the activation (acquire to Full) has one hard bound ([`ActivationPhases::hard_bound`]);
//!   past it the round fails closed.
//!
//! A round that ends releases the lease only once the run has quiesced, and only when it may:
//! after a failed reconcile (a refused SUBACK, a lost connection), a shutdown, or the
//! activation bound. A migration-required run keeps the lease until it expires naturally. A
//! run that does not quiesce within the lease's margin (`ttl - renew_deadline`) is wedged: the
//! session stays down without releasing anything, since work may still be in flight.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use wharf_domain::lease::{
    ActivationPhases, FencingToken, LeaseError, LeaseHolder, RenewOutcome, StepDownReason,
};
use wharf_domain::session::SessionLevel;
use wharf_domain::DeclarerId;
use wharf_store::LeaseClaim;

use super::ingest::MqttHandler;
use super::lease::{Acquired, LeaseLedger, RenewVerdict};
use super::run::{Outcome, Run};
use super::settings::RuntimeSettings;
use super::status::{LeaseView, SessionStatus};
use super::SessionLedger;
use crate::config::ResolvedSession;
use crate::error::SessionError;

/// Numbers the lease holders of this process: each runtime is its own holder, so an old and a
/// new runtime of one session in one process (a reload) never share a claim.
static HOLDERS: AtomicU64 = AtomicU64::new(0);

/// A fresh holder: the process's identity as the caller passed it in (the `wharf` server
/// passes its declarer identity, `host:pid:random`) and `:sN`.
pub(super) fn next_holder(process: &DeclarerId) -> LeaseHolder {
    let n = HOLDERS.fetch_add(1, Ordering::Relaxed) + 1;
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':');
    let base: String = process
        .as_str()
        .chars()
        .map(|c| if allowed(c) { c } else { '-' })
        .take(200)
        .collect();
    LeaseHolder::parse("holder", &format!("{base}:s{n}"))
        .expect("ASCII letters, digits and '-', ':' within 255 bytes form a valid holder")
}

/// The whole-path activation bound of a session under `settings`: every phase that may run in
/// sequence, at the timeout that bounds it (ADR 0028). One operation timeout bounds SUBSCRIBE
/// and UNSUBSCRIBE alike; the ingest quiescence before a recycle is one handler commit, bounded
/// by the store deadline.
pub fn activation_bound(settings: &RuntimeSettings) -> Duration {
    runtime_phases(settings).hard_bound()
}

fn runtime_phases(settings: &RuntimeSettings) -> ActivationPhases {
    activation_phases(
        settings.connect_timeout,
        settings.subscribe_timeout,
        settings.store_deadline,
        settings.unmatched_grace,
    )
}

/// The activation's phases from the settings that bound them (the one place they are mapped:
/// the runtime's bound and the supervisor's convergence budget both come from here).
pub fn activation_phases(
    connect_timeout: Duration,
    subscribe_timeout: Duration,
    store_deadline: Duration,
    unmatched_grace: Duration,
) -> ActivationPhases {
    ActivationPhases {
        connect_timeout,
        subscribe_timeout,
        unsubscribe_timeout: subscribe_timeout,
        quiescence_timeout: store_deadline,
        unmatched_grace,
    }
}

/// How one ownership ended.
enum HoldEnd {
    /// Shutdown: quiesced and released.
    Stopped,
    /// The round ended (released when it could be); try again after a backoff.
    Retry { reason: String, converged: bool },
    /// Migration required: the lease is kept until it expires.
    Terminal,
    /// The run did not quiesce: stay down, release nothing.
    Wedged(String),
}

/// What an acquire came to.
enum AcquireResult {
    Won(Acquired),
    Standby(String, LeaseView),
    /// This runtime's own earlier ownership, kept after a migration-required run, has not
    /// expired yet: not a standby of anyone.
    OwnKept,
    Failed(String),
}

pub(super) struct Exclusive<'a> {
    pub session: &'a ResolvedSession,
    pub settings: &'a RuntimeSettings,
    pub ledger: &'a SessionLedger,
    pub leases: &'a LeaseLedger,
    pub handler: &'a Arc<dyn MqttHandler>,
    pub status: &'a watch::Sender<SessionStatus>,
    pub holder: LeaseHolder,
}

impl Exclusive<'_> {
    /// Supervises the session until shutdown.
    pub(super) async fn supervise(self, mut stop: watch::Receiver<bool>) {
        let mut wait = self.settings.retry_base;
        loop {
            if *stop.borrow() {
                return;
            }
            let sent = Instant::now();
            match self.acquire().await {
                AcquireResult::Won(acquired) => {
                    tracing::info!(holder = %self.holder, token = %acquired.token, "lease acquired");
                    self.set_lease(true, Some(acquired.token), Some(acquired.expires_at));
                    match self.hold(acquired, sent, &mut stop).await {
                        HoldEnd::Stopped => return,
                        HoldEnd::Retry { reason, converged } => {
                            if converged {
                                wait = self.settings.retry_base;
                            }
                            tracing::warn!(%reason, retry_in = ?wait, "the exclusive round ended");
                            self.set_reason(reason);
                        }
                        HoldEnd::Terminal => wait = self.settings.retry_cap,
                        HoldEnd::Wedged(reason) => {
                            tracing::error!(%reason, "the session is wedged: it stays down, \
                                holding nothing it could release safely; restart the process");
                            self.set_reason(reason);
                            let _ = stop.wait_for(|stopped| *stopped).await;
                            return;
                        }
                    }
                }
                AcquireResult::Standby(reason, view) => {
                    self.status.send_modify(|s| {
                        s.level = SessionLevel::Starting;
                        s.reason = Some(reason);
                        s.lease = Some(view);
                    });
                    // A standby polls at the renew interval: a takeover follows the owner's
                    // expiry by at most that, whatever the failures before.
                    wait = self.settings.retry_base;
                    tokio::select! {
                        _ = tokio::time::sleep(self.settings.lease.renew_interval) => continue,
                        _ = stop.wait_for(|stopped| *stopped) => return,
                    }
                }
                AcquireResult::OwnKept => wait = self.settings.retry_cap,
                AcquireResult::Failed(reason) => {
                    tracing::warn!(%reason, retry_in = ?wait, "cannot acquire the lease");
                    // Who holds it is unknown now: no longer a standby of anyone.
                    self.set_lease(false, None, None);
                    self.set_reason(reason);
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.wait_for(|stopped| *stopped) => return,
            }
            wait = (wait * 2).min(self.settings.retry_cap);
        }
    }

    async fn acquire(&self) -> AcquireResult {
        let id = self.session.identity.id();
        let ttl = self.settings.lease.ttl;
        let call = self.leases.acquire(id, &self.holder, ttl);
        match tokio::time::timeout(self.settings.store_deadline, call).await {
            Ok(Ok(acquired)) => AcquireResult::Won(acquired),
            Ok(Err(SessionError::Lease(LeaseError::Held { holder, .. })))
                if holder == self.holder =>
            {
                AcquireResult::OwnKept
            }
            Ok(Err(SessionError::Lease(LeaseError::Held {
                holder,
                token,
                expires_at,
            }))) => {
                let reason = format!(
                    "standby: the lease is held by {holder} (token {token}) until {}",
                    expires_at.to_rfc3339()
                );
                let transitions = self
                    .status
                    .borrow()
                    .lease
                    .as_ref()
                    .map_or(0, |l| l.transitions);
                let view = LeaseView {
                    held: false,
                    holder: Some(holder.as_str().to_owned()),
                    token: Some(token.get()),
                    expires_at: Some(expires_at),
                    transitions,
                };
                AcquireResult::Standby(reason, view)
            }
            Ok(Err(e)) => AcquireResult::Failed(format!(
                "cannot acquire the lease ({e}); not connecting (fail closed)"
            )),
            Err(_) => AcquireResult::Failed(format!(
                "the store did not answer the lease acquire within {:?}; not connecting \
                 (fail closed)",
                self.settings.store_deadline
            )),
        }
    }

    /// Acts on the session while the ownership `acquired` (sent at `sent`) holds.
    async fn hold(
        &self,
        acquired: Acquired,
        sent: Instant,
        stop: &mut watch::Receiver<bool>,
    ) -> HoldEnd {
        let token = acquired.token;
        let fenced = self.ledger.fenced(LeaseClaim {
            holder: self.holder.as_str().to_owned(),
            token: i64::try_from(token.get()).unwrap_or(i64::MAX),
        });
        let (run_stop_tx, mut run_stop) = watch::channel(false);
        let handler = self.handler.as_ref();
        let run = Run::new(self.session, self.settings, &fenced, handler, self.status);
        let run = run.execute(&mut run_stop);
        let renewals = self.keep_renewed(token, sent);
        let bound = activation_bound(self.settings);
        let activation = self.activation_watch(sent + bound, bound);
        tokio::pin!(run, renewals, activation);
        let stopped = async { stop.wait_for(|stopped| *stopped).await.map(|_| ()) };
        let cause = tokio::select! {
            outcome = &mut run => Err(outcome),
            reason = &mut renewals => Ok(Cause::SteppedDown(reason)),
            reason = &mut activation => Ok(Cause::Activation(reason)),
            _ = stopped => Ok(Cause::Stop),
        };
        let cause = match cause {
            Ok(cause) => cause,
            Err(outcome) => return self.after_run(outcome, token).await,
        };
        let _ = run_stop_tx.send(true);
        let margin = self.settings.lease.margin();
        if tokio::time::timeout(margin, &mut run).await.is_err() {
            self.set_lease(false, Some(token), None);
            return HoldEnd::Wedged(format!(
                "the session run did not quiesce within {margin:?} after {cause}"
            ));
        }
        match cause {
            Cause::Stop => {
                self.release(token).await;
                HoldEnd::Stopped
            }
            Cause::Activation(reason) => {
                self.release(token).await;
                HoldEnd::Retry {
                    reason,
                    converged: false,
                }
            }
            Cause::SteppedDown(reason) => {
                tracing::warn!(%reason, "stepped down");
                if matches!(reason, StepDownReason::DeadlineMissed { .. }) {
                    // Quiesced: nothing acts any more. The claim may still hold at the store;
                    // a release spares the standby the wait (refused harmlessly if stale).
                    self.release(token).await;
                }
                self.set_lease(false, Some(token), None);
                HoldEnd::Retry {
                    reason: format!("stepped down: {reason}"),
                    converged: false,
                }
            }
        }
    }

    /// The run ended by itself (it has disconnected).
    async fn after_run(&self, outcome: Outcome, token: FencingToken) -> HoldEnd {
        match outcome {
            Outcome::Stopped => {
                self.release(token).await;
                HoldEnd::Stopped
            }
            Outcome::Terminal => {
                tracing::error!(
                    "the session requires a managed-filter migration; the lease is kept until \
                     it expires (docs/runbooks/managed-filter-migration.md)"
                );
                // Not renewed any more, not released: this process no longer acts on it.
                self.set_lease(false, Some(token), None);
                HoldEnd::Terminal
            }
            Outcome::Retry { reason, converged } => {
                self.release(token).await;
                HoldEnd::Retry { reason, converged }
            }
        }
    }

    /// Renews every `renew_interval` until the renewer steps down; returns why.
    async fn keep_renewed(&self, token: FencingToken, sent: Instant) -> StepDownReason {
        let id = self.session.identity.id();
        super::renewal::renew_until_step_down(self.settings.lease, sent, || async move {
            match self.leases.renew(id, &self.holder, token).await {
                Ok(RenewVerdict::Renewed { expires_at }) => {
                    self.set_lease(true, Some(token), Some(expires_at));
                    RenewOutcome::Renewed
                }
                Ok(RenewVerdict::Lost(reason)) => RenewOutcome::Lost(reason),
                Err(e) => RenewOutcome::Failed(e.to_string()),
            }
        })
        .await
    }

    /// Resolves (with the reason) if the session is not at Full by `deadline`; stays pending
    /// once it is.
    async fn activation_watch(&self, deadline: Instant, bound: Duration) -> String {
        let mut levels = self.status.subscribe();
        let reached = {
            let full = levels.wait_for(|s| s.level == SessionLevel::Full);
            tokio::time::timeout_at(deadline, full).await.is_ok()
        };
        if reached {
            return std::future::pending().await;
        }
        format!(
            "the activation did not reach Full within its bound of {} (fail closed)",
            humantime::format_duration(bound)
        )
    }

    async fn release(&self, token: FencingToken) {
        let id = self.session.identity.id();
        let call = self.leases.release(id, &self.holder, token);
        match tokio::time::timeout(self.settings.store_deadline, call).await {
            Ok(Ok(())) => tracing::info!(%token, "lease released"),
            Ok(Err(e)) => tracing::warn!(error = %e, "the lease release was refused"),
            Err(_) => tracing::warn!("the lease release did not answer; it will expire"),
        }
        self.set_lease(false, Some(token), None);
    }

    fn set_lease(
        &self,
        held: bool,
        token: Option<FencingToken>,
        expires_at: Option<chrono::DateTime<chrono::Utc>>,
    ) {
        let holder = self.holder.as_str().to_owned();
        self.status.send_modify(|s| {
            let was_held = s.lease.as_ref().is_some_and(|l| l.held);
            let transitions =
                s.lease.as_ref().map_or(0, |l| l.transitions) + u64::from(was_held != held);
            s.lease = Some(LeaseView {
                held,
                holder: held.then_some(holder),
                token: token.map(FencingToken::get),
                expires_at,
                transitions,
            });
        });
    }

    fn set_reason(&self, reason: String) {
        self.status.send_modify(|s| {
            s.level = SessionLevel::Starting;
            s.reason = Some(reason);
        });
    }
}

/// Why a round's run was stopped from outside.
enum Cause {
    Stop,
    Activation(String),
    SteppedDown(StepDownReason),
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Stop => f.write_str("a shutdown"),
            Self::Activation(reason) => f.write_str(reason),
            Self::SteppedDown(reason) => write!(f, "a step-down ({reason})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(connect: u64, subscribe: u64, store: u64, grace: u64) -> RuntimeSettings {
        RuntimeSettings {
            unmatched_grace: Duration::from_millis(grace),
            connect_timeout: Duration::from_millis(connect),
            subscribe_timeout: Duration::from_millis(subscribe),
            ingest_batch: 100,
            ingest_batch_bytes: 1024 * 1024,
            password: None,
            retry_base: Duration::from_secs(1),
            retry_cap: Duration::from_secs(30),
            store_deadline: Duration::from_millis(store),
            tls: None,
            lease: wharf_domain::lease::LeaseTiming::default(),
            process: DeclarerId::parse("declarer", "host-1:42:ab12").unwrap(),
        }
    }

    /// 2 x connect + 2 x subscribe + 1 x unsubscribe (the subscribe timeout) + 1 x quiescence
    /// (the store deadline) + 2 x unmatched_grace, as ADR 0028 and ADR 0030 state it.
    fn formula(connect: u64, subscribe: u64, store: u64, grace: u64) -> Duration {
        Duration::from_millis(2 * connect + 3 * subscribe + store + 2 * grace)
    }

    #[test]
    fn the_activation_bound_is_the_documented_formula() {
        let every_phase_at_30s = settings(30_000, 30_000, 30_000, 30_000);
        assert_eq!(
            activation_bound(&every_phase_at_30s),
            Duration::from_secs(240)
        );
        // Wharf's defaults: 30 s MQTT timeouts, a 10 s store deadline (a third of the 30 s
        // instance TTL), a 5 s unmatched grace.
        let defaults = settings(30_000, 30_000, 10_000, 5_000);
        assert_eq!(activation_bound(&defaults), Duration::from_secs(170));
        for (connect, subscribe, store, grace) in [
            (5_000, 10_000, 1_667, 300),
            (1, 2, 3, 4),
            (60_000, 5_000, 20_000, 0),
        ] {
            assert_eq!(
                activation_bound(&settings(connect, subscribe, store, grace)),
                formula(connect, subscribe, store, grace),
                "{connect} {subscribe} {store} {grace}"
            );
        }
    }

    #[test]
    fn each_runtime_is_a_holder_of_its_own() {
        let process = DeclarerId::parse("declarer", "host-1:42:ab12").unwrap();
        let (a, b) = (next_holder(&process), next_holder(&process));
        assert_ne!(a, b);
        assert!(
            a.as_str().starts_with("host-1:42:ab12:s"),
            "{a} names the process ({process})"
        );
    }
}
