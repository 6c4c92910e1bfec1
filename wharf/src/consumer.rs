//! The consuming instance's declaration lifecycle: wait, join, heartbeat, leave.
//!
//! A consumer started with a handler also runs the claim loop (`runtime`) beside this lifecycle;
//! the loop claims only while the state is [`ConsumerState::Consuming`].
//!
//! `consume` re-attempts the declaration on an interval until it joins or installs (even when
//! `register` already installed: between the two calls the instance had no heartbeat, so another
//! declarer may have replaced the set). While waiting it logs loudly at warn and is never ready.
//! Once joined it heartbeats; if its heartbeat row is gone or the group's effective set is no
//! longer its own, it stops being ready and goes back to declaring. On shutdown it stops claiming,
//! drains its running handlers (heartbeating meanwhile, so its set stays in effect while they
//! finish), and only then leaves, so a waiting new set does not have to wait for this instance's
//! heartbeat to lapse.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{error, info, warn, Instrument};
use wharf_domain::{BindingSet, DeclarerId, RegisterOutcome};
use wharf_projections::ReadModel;
use wharf_store::Store;

use crate::config::DeclarationConfig;
use crate::declare::{Attempter, GroupStates, Registration};
use crate::error::WharfError;
use crate::runtime::{ConsumerStats, Counters, Runtime};

/// Where a consumer is in its lifecycle.
#[derive(Debug, Clone, PartialEq)]
pub enum ConsumerState {
    /// The first attempt has not finished yet.
    Declaring,
    /// A live incumbent declares a different set; this instance waits and does not consume.
    Waiting {
        /// The stored set being waited on.
        incumbent: BindingSet,
        /// The live instances that declare it.
        live_declarers: Vec<DeclarerId>,
        /// When this instance first stated its set.
        declared_at: DateTime<Utc>,
        /// Attempts made so far.
        attempts: u64,
    },
    /// The declaration joined or installed; the instance heartbeats and may consume.
    Consuming {
        /// The set it consumes with.
        bindings: BindingSet,
    },
    /// The store could not be reached to attempt or to heartbeat; not ready until it can.
    Stalled {
        /// The last error.
        reason: String,
    },
    /// The declaration was refused for good (e.g. the group consumes another topic).
    Failed {
        /// Why.
        reason: String,
    },
    /// Shut down.
    Stopped,
}

impl ConsumerState {
    /// True only while consuming: what a readiness probe should report.
    pub fn is_ready(&self) -> bool {
        matches!(self, Self::Consuming { .. })
    }
}

/// A running consumer's handle.
///
/// Call [`Consumer::shutdown`] to stop gracefully (running handlers are drained, then the
/// instance leaves the group's live instances at once). Dropping the handle instead stops
/// everything abruptly, as a crash would: running handlers are cancelled, their claims expire
/// after the visibility timeout, and the heartbeat row stays until it lapses after the instance
/// TTL.
pub struct Consumer {
    state: watch::Receiver<ConsumerState>,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
    counters: Arc<Counters>,
}

impl Drop for Consumer {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Consumer {
    /// The current state.
    pub fn state(&self) -> ConsumerState {
        self.state.borrow().clone()
    }

    /// True while the instance is consuming (joined and heartbeating).
    pub fn is_ready(&self) -> bool {
        self.state.borrow().is_ready()
    }

    /// A receiver of state changes (for readiness endpoints and tests).
    pub fn watch(&self) -> watch::Receiver<ConsumerState> {
        self.state.clone()
    }

    /// What this consumer's handlers have done so far (all zero without a handler).
    pub fn stats(&self) -> ConsumerStats {
        self.counters.snapshot()
    }

    /// Stops claiming, waits for running handlers up to `queue.drain_timeout` (aborting the
    /// rest), then stops heartbeating and leaves the group's live instances. Returns, once all
    /// of that is done, what the handlers did in the consumer's lifetime.
    pub async fn shutdown(mut self) -> ConsumerStats {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            if let Err(e) = task.await {
                error!(error = %e, "consumer task ended abnormally");
            }
        }
        self.counters.snapshot()
    }
}

/// Everything the lifecycle task needs.
pub(crate) struct Lifecycle {
    pub states: GroupStates,
    pub store: Store,
    pub read: ReadModel,
    pub declarer: DeclarerId,
    pub registration: Registration,
    pub settings: DeclarationConfig,
}

/// Starts the lifecycle task, with the claim loop beside it when there is a handler.
pub(crate) fn start(lifecycle: Lifecycle, runtime: Option<Runtime>) -> Consumer {
    let (state_tx, state) = watch::channel(ConsumerState::Declaring);
    let (stop, stop_rx) = watch::channel(false);
    let counters = runtime
        .as_ref()
        .map(|runtime| runtime.counters.clone())
        .unwrap_or_default();
    let span = tracing::info_span!(
        "consume",
        group = %lifecycle.registration.group,
        topic = %lifecycle.registration.topic,
        declarer = %lifecycle.declarer,
    );
    let task = tokio::spawn(supervise(lifecycle, runtime, state_tx, stop_rx).instrument(span));
    Consumer {
        state,
        stop,
        task: Some(task),
        counters,
    }
}

/// Runs the lifecycle (and the claim loop, if any) until stopped, then leaves.
///
/// With a claim loop, a stop first ends claiming; the lifecycle keeps heartbeating until the
/// loop has drained, so the instance leaves only once no handler of it runs any more.
async fn supervise(
    lifecycle: Lifecycle,
    runtime: Option<Runtime>,
    state: watch::Sender<ConsumerState>,
    stop: watch::Receiver<bool>,
) {
    match runtime {
        None => lifecycle.run(&state, stop.clone(), stop).await,
        Some(runtime) => {
            let (halt_tx, halt) = watch::channel(false);
            let claims = runtime.run(state.subscribe(), stop.clone());
            let claims = async move {
                claims.await;
                halt_tx.send_replace(true);
            };
            tokio::join!(lifecycle.run(&state, stop, halt), claims);
        }
    }
    lifecycle.leave().await;
    state.send_replace(ConsumerState::Stopped);
}

/// Why the consuming phase ended.
enum Interrupt {
    Stop,
    Redeclare,
}

impl Lifecycle {
    /// Declares and heartbeats. `stop` ends declaring; `halt` ends heartbeating (the same
    /// signal without a claim loop; with one, it comes once the loop has drained).
    async fn run(
        &self,
        state: &watch::Sender<ConsumerState>,
        mut stop: watch::Receiver<bool>,
        mut halt: watch::Receiver<bool>,
    ) {
        let mut first_declared_at = None;
        loop {
            if self
                .declare(state, &mut stop, &mut first_declared_at)
                .await
                .is_none()
            {
                break;
            }
            match self.consume_phase(state, &mut halt).await {
                Interrupt::Stop => break,
                Interrupt::Redeclare => first_declared_at = None,
            }
        }
    }

    /// Removes this instance's heartbeat row, so the group stops counting it as live.
    async fn leave(&self) {
        let group = self.registration.group.as_str();
        match self.store.leave(group, self.declarer.as_str()).await {
            Ok(_) => info!("left the group's live instances"),
            Err(e) => {
                warn!(error = %e, "could not remove the heartbeat row; it lapses after the TTL")
            }
        }
    }

    /// Attempts until joined or installed (`Some`), or stopped (`None`).
    async fn declare(
        &self,
        state: &watch::Sender<ConsumerState>,
        stop: &mut watch::Receiver<bool>,
        first_declared_at: &mut Option<DateTime<Utc>>,
    ) -> Option<()> {
        let mut attempts = 0u64;
        loop {
            if *stop.borrow() {
                return None;
            }
            attempts += 1;
            let attempter = Attempter {
                store: &self.store,
                states: &self.states,
                declarer: &self.declarer,
                instance_ttl: self.settings.instance_ttl,
            };
            let outcome = attempter
                .attempt(&self.registration, true, *first_declared_at)
                .await;
            match outcome {
                Ok(RegisterOutcome::Waiting {
                    incumbent,
                    live_declarers,
                    declared_at,
                }) => {
                    *first_declared_at = Some(declared_at);
                    self.log_wait(&incumbent, &live_declarers, declared_at, attempts);
                    state.send_replace(ConsumerState::Waiting {
                        incumbent,
                        live_declarers,
                        declared_at,
                        attempts,
                    });
                }
                Ok(outcome) => {
                    info!(?outcome, bindings = %self.registration.bindings, "declaration in effect; consuming");
                    state.send_replace(ConsumerState::Consuming {
                        bindings: self.registration.bindings.clone(),
                    });
                    return Some(());
                }
                Err(WharfError::Declaration(refused)) => {
                    error!(error = %refused, "declaration refused; this instance will not consume");
                    state.send_replace(ConsumerState::Failed {
                        reason: refused.to_string(),
                    });
                    let _ = stop.wait_for(|stopped| *stopped).await;
                    return None;
                }
                Err(e) => {
                    error!(error = %e, "declaration attempt failed; retrying");
                    state.send_replace(ConsumerState::Stalled {
                        reason: e.to_string(),
                    });
                }
            }
            if sleep_or_stop(self.settings.retry_interval, stop).await {
                return None;
            }
        }
    }

    fn log_wait(
        &self,
        incumbent: &BindingSet,
        live_declarers: &[DeclarerId],
        declared_at: DateTime<Utc>,
        attempts: u64,
    ) {
        let waited = (Utc::now() - declared_at).to_std().unwrap_or_default();
        let declarers: Vec<&str> = live_declarers.iter().map(DeclarerId::as_str).collect();
        warn!(
            requested = %self.registration.bindings,
            incumbent = %incumbent,
            live_declarers = ?declarers,
            waiting_for = %humantime::format_duration(Duration::from_secs(waited.as_secs())),
            attempts,
            "WAITING: live instances still declare a different binding set; this instance will \
             not consume or report ready until they are gone (no timeout)"
        );
    }

    /// Heartbeats until stopped or until the declaration is no longer this instance's.
    async fn consume_phase(
        &self,
        state: &watch::Sender<ConsumerState>,
        stop: &mut watch::Receiver<bool>,
    ) -> Interrupt {
        let group = &self.registration.group;
        let own = sorted(self.registration.bindings.patterns());
        loop {
            if sleep_or_stop(self.settings.heartbeat_interval, stop).await {
                return Interrupt::Stop;
            }
            let beat = self
                .store
                .heartbeat(group.as_str(), self.declarer.as_str())
                .await;
            let effective = self.read.effective_bindings(group).await;
            match (beat, effective) {
                (Ok(true), Ok(effective)) if sorted(effective.clone()) == own => {
                    if !state.borrow().is_ready() {
                        info!("heartbeat restored; consuming again");
                        state.send_replace(ConsumerState::Consuming {
                            bindings: self.registration.bindings.clone(),
                        });
                    }
                }
                (Ok(true), Ok(effective)) => {
                    warn!(?effective, own = ?own, "the group's effective set is no longer this instance's; re-declaring");
                    return Interrupt::Redeclare;
                }
                (Ok(false), _) => {
                    warn!("this instance's heartbeat row is gone; re-declaring");
                    return Interrupt::Redeclare;
                }
                (Err(e), _) | (_, Err(e)) => {
                    error!(error = %e, "heartbeat failed; not ready until it succeeds");
                    state.send_replace(ConsumerState::Stalled {
                        reason: e.to_string(),
                    });
                }
            }
        }
    }
}

fn sorted(mut patterns: Vec<String>) -> Vec<String> {
    patterns.sort();
    patterns
}

/// Sleeps for `period`; returns true if asked to stop meanwhile.
async fn sleep_or_stop(period: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    if *stop.borrow() {
        return true;
    }
    tokio::select! {
        _ = tokio::time::sleep(period) => false,
        _ = stop.wait_for(|stopped| *stopped) => true,
    }
}
