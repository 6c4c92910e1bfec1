//! The consuming instance's declaration lifecycle: wait, join, learn the install, heartbeat,
//! leave.
//!
//! A consumer started with a handler also runs the claim loop (`runtime`) beside this lifecycle;
//! the loop claims only while the state is [`ConsumerState::Consuming`], and only under the
//! install that state names.
//!
//! Each consumer is its own instance (ADR 0015): its own declarer identity (the process's plus
//! `/N`) and its own heartbeat row, so two consumers of one group in one process behave exactly
//! like two processes.
//!
//! `consume` re-attempts the declaration on an interval until it joins or installs (even when
//! `register` already installed: between the two calls the instance had no heartbeat, so another
//! declarer may have replaced the set). While waiting it logs loudly at warn and is never ready.
//! Once joined it reads the group's install in effect; if that install's set is its own, the
//! install's ledger position is the instance's fence, published in `Consuming { install, .. }`
//! (the claim loop fetches with it, and a fenced fetch makes the lifecycle re-declare);
//! otherwise it declares again.
//!
//! Once consuming it heartbeats, and checks after each heartbeat that the group's install is
//! still the one it joined; if its heartbeat row is gone or the install moved on, it stops being
//! ready and goes back to declaring. Liveness is bounded by `instance_ttl`: every store call on
//! this path has a deadline of a third of the TTL (`DeclarationConfig::call_deadline`), never
//! past the lapse; a failed or late heartbeat makes the instance `Stalled` (not ready, no
//! claims) at once, and once no heartbeat has been confirmed for the TTL (measured on the
//! monotonic clock from the moment the last confirmed call was sent), the group may already
//! count the instance as gone, so it re-declares (and may wait) before it claims again. A
//! heartbeat confirmed again within the TTL resumes consuming under the same install.
//!
//! On shutdown it stops claiming, drains its running handlers (heartbeating meanwhile, so its
//! set stays in effect while they finish), and only then leaves, so a waiting new set does not
//! have to wait for this instance's heartbeat to lapse.
//!
//! Every one of those decisions is made by `wharf_domain::consumer::ConsumerLifecycle`, a
//! sans-IO machine given the time (ADR 0076). This module is its driver, and the only place
//! the lifecycle reads a clock: it counts tokio's monotonic `Instant` as a `Duration` since the
//! lifecycle started, makes the one store call each step asks for within the step's deadline,
//! sleeps until the time a step names or a signal (stop, the claim loop's drain, a fenced
//! fetch), publishes the states on the watch channel and logs the notes.

use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{error, info, warn, Instrument};
use wharf_domain::consumer::{
    AttemptFailure, CallFailure, ConsumerLifecycle, Effect, HeartbeatAnswer, Input, Install,
    LifecycleTiming, Next, Note, Now, Step,
};
use wharf_domain::{BindingSet, DeclarerId, RegisterOutcome};
use wharf_queue::Queue;
use wharf_store::{finish_by, Store};

use crate::config::DeclarationConfig;
use crate::declare::{Attempter, GroupStates, Registration};
use crate::error::WharfError;
use crate::runtime::{ConsumerStats, Counters, Runtime};

/// Where a consumer is in its lifecycle: the domain's type, which the lifecycle machine
/// publishes and the claim loop reads.
pub use wharf_domain::consumer::ConsumerState;

/// A running consumer's handle.
///
/// Call [`Consumer::shutdown`] to stop gracefully (running handlers are drained, then the
/// instance leaves the group's live instances at once). Dropping the handle instead stops
/// everything abruptly, as a crash would: running handlers are cancelled, their claims expire
/// after the visibility timeout, and the heartbeat row stays until it lapses after the instance
/// TTL.
pub struct Consumer {
    declarer: DeclarerId,
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
    /// This instance's declarer identity (the process's plus `/N`): the name of its heartbeat
    /// row, and what its declaration attempts record.
    pub fn declarer(&self) -> &DeclarerId {
        &self.declarer
    }

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
    pub queue: Queue,
    /// This instance's own identity (see [`crate::declarer`]).
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
    let declarer = lifecycle.declarer.clone();
    let span = tracing::info_span!(
        "consume",
        group = %lifecycle.registration.group,
        topic = %lifecycle.registration.topic,
        declarer = %lifecycle.declarer,
    );
    let task = tokio::spawn(supervise(lifecycle, runtime, state_tx, stop_rx).instrument(span));
    Consumer {
        declarer,
        state,
        stop,
        task: Some(task),
        counters,
    }
}

/// Runs the lifecycle (and the claim loop, if any) until stopped, then leaves.
///
/// With a claim loop, a stop first ends claiming; the lifecycle keeps heartbeating until the
/// loop has drained (the halt), so the instance leaves only once no handler of it runs any
/// more. The claim loop reports a fenced fetch on `fenced` (the install it was fenced from);
/// the lifecycle then re-declares.
async fn supervise(
    lifecycle: Lifecycle,
    runtime: Option<Runtime>,
    state: watch::Sender<ConsumerState>,
    stop: watch::Receiver<bool>,
) {
    let (fenced_tx, fenced) = watch::channel(None);
    match runtime {
        None => {
            lifecycle.run(&state, stop.clone(), stop, fenced).await;
            drop(fenced_tx);
        }
        Some(runtime) => {
            let (halt_tx, halt) = watch::channel(false);
            let claims = runtime.run(state.subscribe(), stop.clone(), fenced_tx);
            let claims = async move {
                claims.await;
                halt_tx.send_replace(true);
            };
            tokio::join!(lifecycle.run(&state, stop, halt, fenced), claims);
        }
    }
}

/// The lifecycle's monotonic clock as the machine counts time: since the lifecycle started.
#[derive(Clone, Copy)]
struct Clock {
    epoch: Instant,
}

impl Clock {
    fn start() -> Self {
        Self {
            epoch: Instant::now(),
        }
    }

    fn now(self) -> Now {
        Instant::now().saturating_duration_since(self.epoch)
    }

    fn at(self, time: Now) -> Instant {
        self.epoch + time
    }
}

/// The signals a wait listens for besides its time.
struct Signals {
    stop: watch::Receiver<bool>,
    halt: watch::Receiver<bool>,
    fenced: watch::Receiver<Option<i64>>,
    /// False once the claim loop (or its absence) closed the fence channel.
    fence_open: bool,
}

impl Signals {
    /// A stop or halt given while a call was in flight, for the machine to know before the
    /// call's answer (the lifecycle always looked at them before deciding what came next).
    fn pending(&self, machine: &ConsumerLifecycle) -> Option<Input> {
        if !machine.halted() && *self.halt.borrow() {
            Some(Input::Halt)
        } else if !machine.stop_requested() && *self.stop.borrow() {
            Some(Input::Stop)
        } else {
            None
        }
    }

    /// Waits until `until` (a tick), or for a signal the machine has not had yet. A closed
    /// stop or halt channel counts as the signal (its sender is gone).
    async fn wait(&mut self, machine: &ConsumerLifecycle, until: Option<Instant>) -> Input {
        loop {
            let tick = async {
                match until {
                    Some(until) => tokio::time::sleep_until(until).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = self.halt.wait_for(|halted| *halted), if !machine.halted() => {
                    return Input::Halt;
                }
                _ = self.stop.wait_for(|stopped| *stopped), if !machine.stop_requested() => {
                    return Input::Stop;
                }
                changed = self.fenced.changed(), if self.fence_open => {
                    if changed.is_err() {
                        self.fence_open = false;
                    } else if let Some(install) = *self.fenced.borrow_and_update() {
                        return Input::Fenced(install);
                    }
                }
                () = tick => return Input::Tick,
            }
        }
    }
}

impl Lifecycle {
    fn timing(&self) -> LifecycleTiming {
        LifecycleTiming {
            instance_ttl: self.settings.instance_ttl,
            heartbeat_interval: self.settings.heartbeat_interval,
            retry_interval: self.settings.retry_interval,
            call_deadline: self.settings.call_deadline(),
        }
    }

    /// Drives the lifecycle machine to its end: declares and heartbeats, then leaves and
    /// reports `Stopped`. `stop` ends declaring; `halt` ends heartbeating (the same signal
    /// without a claim loop; with one, it comes once the loop has drained).
    async fn run(
        &self,
        state: &watch::Sender<ConsumerState>,
        stop: watch::Receiver<bool>,
        halt: watch::Receiver<bool>,
        fenced: watch::Receiver<Option<i64>>,
    ) {
        let clock = Clock::start();
        let mut signals = Signals {
            stop,
            halt,
            fenced,
            fence_open: true,
        };
        let mut machine = ConsumerLifecycle::new(self.registration.bindings.clone(), self.timing());
        let mut step = machine.start(clock.now());
        loop {
            self.report(state, &step);
            let answer = match step.next {
                Next::Attempt {
                    first_declared_at,
                    deadline,
                } => Input::Attempted(self.attempt(clock.at(deadline), first_declared_at).await),
                Next::ReadInstall { deadline } => {
                    Input::InstallRead(self.read_install(clock.at(deadline)).await)
                }
                Next::Heartbeat { deadline } => {
                    Input::Heartbeat(self.heartbeat(clock.at(deadline)).await)
                }
                Next::Leave { deadline } => Input::Left(self.leave(clock.at(deadline)).await),
                Next::Wait { until } => {
                    let until = until.map(|until| clock.at(until));
                    let signal = signals.wait(&machine, until).await;
                    step = machine.step(clock.now(), signal);
                    continue;
                }
                Next::Await => {
                    // Only an input given while a call is in flight is answered so, and this
                    // loop gives none: nothing is in flight, so only a stop can end this.
                    error!("the consumer lifecycle awaits an answer no call will give");
                    let signal = signals.wait(&machine, None).await;
                    step = machine.step(clock.now(), signal);
                    continue;
                }
                Next::End => return,
            };
            if let Some(signal) = signals.pending(&machine) {
                // A call is in flight as far as the machine knows: this only records the signal.
                let recorded = machine.step(clock.now(), signal);
                self.report(state, &recorded);
            }
            step = machine.step(clock.now(), answer);
        }
    }

    /// Publishes the step's states and logs its notes, in order.
    fn report(&self, state: &watch::Sender<ConsumerState>, step: &Step) {
        for effect in &step.effects {
            match effect {
                Effect::Publish(published) => {
                    state.send_replace(published.clone());
                }
                Effect::Note(note) => self.log(note),
            }
        }
    }

    fn log(&self, note: &Note) {
        match note {
            Note::Waiting {
                incumbent,
                live_declarers,
                declared_at,
                attempts,
            } => self.log_wait(incumbent, live_declarers, *declared_at, *attempts),
            Note::InEffect { outcome, install } => info!(
                ?outcome,
                bindings = %self.registration.bindings,
                install,
                "declaration in effect; consuming"
            ),
            Note::NotOwnAfterJoin { current } => warn!(
                current = ?current,
                "the group's install is not this instance's set right after its join; \
                 declaring again"
            ),
            Note::LearnStalled { reason } => {
                error!(%reason, "could not learn the install just joined; retrying")
            }
            Note::Refused { reason } => {
                error!(error = %reason, "declaration refused; this instance will not consume")
            }
            Note::AttemptFailed { reason } => error!(%reason, "retrying"),
            Note::RowGone => warn!("this instance's heartbeat row is gone; re-declaring"),
            Note::InstallMoved { joined, current } => warn!(
                joined,
                current = ?current,
                "the group's install is no longer the one this instance joined; re-declaring"
            ),
            Note::Fenced { install } => warn!(
                install,
                "a fetch found the group's install moved on; re-declaring"
            ),
            Note::HeartbeatUnconfirmed { reason } => error!(
                %reason,
                "heartbeat not confirmed; not ready until one is (past the instance TTL \
                 it re-declares first)"
            ),
            Note::Resumed => info!("heartbeat confirmed within the instance TTL; consuming again"),
            Note::Lapsed => error!(
                instance_ttl = %humantime::format_duration(self.settings.instance_ttl),
                "no heartbeat confirmed within the instance TTL; re-declaring before claiming again"
            ),
            Note::Left => info!("left the group's live instances"),
            Note::LeaveFailed { reason } => {
                warn!(%reason, "could not remove the heartbeat row; it lapses after the TTL")
            }
        }
    }

    /// One Register attempt (with a heartbeat), awaited until `deadline`. Past it the attempt
    /// runs on to its end unobserved (ADR 0068).
    async fn attempt(
        &self,
        deadline: Instant,
        first_declared_at: Option<DateTime<Utc>>,
    ) -> Result<RegisterOutcome, AttemptFailure> {
        let (store, states) = (self.store.clone(), self.states.clone());
        let (declarer, registration) = (self.declarer.clone(), self.registration.clone());
        let (instance_ttl, snapshot_every) =
            (self.settings.instance_ttl, self.settings.snapshot_every);
        let attempt = async move {
            let attempter = Attempter {
                store: &store,
                states: &states,
                declarer: &declarer,
                instance_ttl,
                snapshot_every,
            };
            attempter
                .attempt(&registration, true, first_declared_at)
                .await
        };
        match finish_by(deadline, attempt).await {
            Ok(Ok(outcome)) => Ok(outcome),
            Ok(Err(WharfError::Declaration(refused))) => Err(AttemptFailure::Refused(refused)),
            Ok(Err(e)) => Err(AttemptFailure::Call(CallFailure::Error(e.to_string()))),
            Err(_) => Err(AttemptFailure::Call(CallFailure::NoAnswer)),
        }
    }

    /// Reads the group's install in effect.
    async fn read_install(&self, deadline: Instant) -> Result<Option<Install>, CallFailure> {
        let (queue, group) = (self.queue.clone(), self.registration.group.clone());
        let current = bounded(
            deadline,
            async move { queue.effective_install(&group).await },
        );
        Ok(current.await?.map(|install| Install {
            position: install.position,
            patterns: install.patterns,
        }))
    }

    /// Records this instance's heartbeat, if its row is still there.
    async fn heartbeat(&self, deadline: Instant) -> Result<HeartbeatAnswer, CallFailure> {
        let (store, group) = (self.store.clone(), self.registration.group.clone());
        let declarer = self.declarer.clone();
        let beat = bounded(deadline, async move {
            store.heartbeat(group.as_str(), declarer.as_str()).await
        });
        Ok(match beat.await? {
            true => HeartbeatAnswer::Recorded,
            false => HeartbeatAnswer::RowGone,
        })
    }

    /// Removes this instance's heartbeat row, so the group stops counting it as live.
    async fn leave(&self, deadline: Instant) -> Result<(), CallFailure> {
        let (store, group) = (self.store.clone(), self.registration.group.clone());
        let declarer = self.declarer.clone();
        bounded(deadline, async move {
            store.leave(group.as_str(), declarer.as_str()).await
        })
        .await
        .map(drop)
    }

    fn log_wait(
        &self,
        incumbent: &BindingSet,
        live_declarers: &[DeclarerId],
        declared_at: DateTime<Utc>,
        attempts: u64,
    ) {
        // The wall clock, for the log line only: how long this instance has waited.
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
}

/// Runs one store call with a deadline. Past the deadline the call goes on to its end
/// unobserved, never dropped mid-statement (ADR 0068).
async fn bounded<T, E>(
    deadline: Instant,
    call: impl Future<Output = Result<T, E>> + Send + 'static,
) -> Result<T, CallFailure>
where
    T: Send + 'static,
    E: Display + Send + 'static,
{
    match finish_by(deadline, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(CallFailure::Error(e.to_string())),
        Err(_) => Err(CallFailure::NoAnswer),
    }
}
