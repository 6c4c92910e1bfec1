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
//! this path has a deadline of a third of the TTL (`DeclarationConfig::call_deadline`); a failed
//! or late heartbeat makes the instance `Stalled` (not ready, no claims) at once, and once no
//! heartbeat has been confirmed for the TTL (measured on the monotonic clock from the moment the
//! last confirmed call was sent), the group may already count the instance as gone, so it
//! re-declares (and may wait) before it claims again. A heartbeat confirmed again within the TTL
//! resumes consuming under the same install.
//!
//! On shutdown it stops claiming, drains its running handlers (heartbeating meanwhile, so its
//! set stays in effect while they finish), and only then leaves, so a waiting new set does not
//! have to wait for this instance's heartbeat to lapse.

use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{error, info, warn, Instrument};
use wharf_domain::{BindingSet, DeclarerId, RegisterOutcome};
use wharf_queue::{EffectiveInstall, Queue};
use wharf_store::{finish_by, finish_within, Store};

use crate::config::DeclarationConfig;
use crate::declare::{Attempter, GroupStates, Registration};
use crate::error::WharfError;
use crate::runtime::{ConsumerStats, Counters, Runtime};

/// Where a consumer is in its lifecycle.
#[derive(Debug, Clone, PartialEq)]
pub enum ConsumerState {
    /// The first attempt has not finished yet, or the instance is declaring again (its
    /// heartbeat lapsed, or the group's install moved on).
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
        /// The install it joined (the ledger position of the group's `Installed` event): its
        /// claims are fenced by it, and hand out nothing once the group's install moves on.
        install: i64,
        /// How many times this instance has joined or installed: 1 after its first
        /// declaration, one more after each re-declaration (after a lapse or a fence).
        joins: u64,
    },
    /// The store could not be reached to attempt or to heartbeat (an error, or no answer
    /// within the call's deadline); not ready and not claiming until it can.
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
/// loop has drained, so the instance leaves only once no handler of it runs any more. The claim
/// loop reports a fenced fetch on `fenced` (the install it was fenced from); the lifecycle then
/// re-declares.
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
    lifecycle.leave().await;
    state.send_replace(ConsumerState::Stopped);
}

/// Why the consuming phase ended.
enum Interrupt {
    Stop,
    Redeclare,
}

/// A declaration in effect for this instance.
struct Joined {
    /// The install it joined: its fence.
    install: i64,
    /// When the call that last confirmed its heartbeat was sent. The row's heartbeat is no
    /// older than this, so it cannot lapse (by the store's clock) before `confirmed + TTL`.
    confirmed: Instant,
}

/// Why a join did not put the instance in effect.
enum NotJoined {
    /// The store failed or did not answer in time.
    Stalled(String),
    /// The group's install is not (or no longer) this instance's set.
    Moved(Option<EffectiveInstall>),
}

impl Lifecycle {
    /// Declares and heartbeats. `stop` ends declaring; `halt` ends heartbeating (the same
    /// signal without a claim loop; with one, it comes once the loop has drained).
    async fn run(
        &self,
        state: &watch::Sender<ConsumerState>,
        mut stop: watch::Receiver<bool>,
        mut halt: watch::Receiver<bool>,
        mut fenced: watch::Receiver<Option<i64>>,
    ) {
        let mut first_declared_at = None;
        let mut joins = 0u64;
        loop {
            let Some(joined) = self.declare(state, &mut stop, &mut first_declared_at).await else {
                break;
            };
            joins += 1;
            state.send_replace(self.consuming(joined.install, joins));
            match self
                .consume_phase(state, &mut halt, &mut fenced, joined, joins)
                .await
            {
                Interrupt::Stop => break,
                Interrupt::Redeclare => {
                    first_declared_at = None;
                    state.send_replace(ConsumerState::Declaring);
                }
            }
        }
    }

    fn consuming(&self, install: i64, joins: u64) -> ConsumerState {
        ConsumerState::Consuming {
            bindings: self.registration.bindings.clone(),
            install,
            joins,
        }
    }

    /// Removes this instance's heartbeat row, so the group stops counting it as live.
    async fn leave(&self) {
        let (store, group) = (self.store.clone(), self.registration.group.clone());
        let declarer = self.declarer.clone();
        let deadline = Instant::now() + self.settings.call_deadline();
        let left = bounded("leave", deadline, async move {
            store.leave(group.as_str(), declarer.as_str()).await
        });
        match left.await {
            Ok(_) => info!("left the group's live instances"),
            Err(reason) => {
                warn!(%reason, "could not remove the heartbeat row; it lapses after the TTL")
            }
        }
    }

    /// One Register attempt (with a heartbeat), owning what it needs, so that a caller past
    /// its deadline can let it run to its end (ADR 0068).
    fn attempt(
        &self,
        first_declared_at: Option<DateTime<Utc>>,
    ) -> impl Future<Output = Result<RegisterOutcome, WharfError>> + Send + 'static {
        let (store, states) = (self.store.clone(), self.states.clone());
        let (declarer, registration) = (self.declarer.clone(), self.registration.clone());
        let (instance_ttl, snapshot_every) =
            (self.settings.instance_ttl, self.settings.snapshot_every);
        async move {
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
        }
    }

    /// Attempts until joined or installed and the install learned (`Some`), or stopped
    /// (`None`).
    async fn declare(
        &self,
        state: &watch::Sender<ConsumerState>,
        stop: &mut watch::Receiver<bool>,
        first_declared_at: &mut Option<DateTime<Utc>>,
    ) -> Option<Joined> {
        let mut attempts = 0u64;
        loop {
            if *stop.borrow() {
                return None;
            }
            attempts += 1;
            let sent = Instant::now();
            let outcome = finish_within(
                self.settings.call_deadline(),
                self.attempt(*first_declared_at),
            )
            .await;
            match outcome {
                Ok(Ok(RegisterOutcome::Waiting {
                    incumbent,
                    live_declarers,
                    declared_at,
                })) => {
                    *first_declared_at = Some(declared_at);
                    self.log_wait(&incumbent, &live_declarers, declared_at, attempts);
                    state.send_replace(ConsumerState::Waiting {
                        incumbent,
                        live_declarers,
                        declared_at,
                        attempts,
                    });
                }
                Ok(Ok(outcome)) => match self.learn_install(sent).await {
                    Ok(joined) => {
                        info!(
                            ?outcome,
                            bindings = %self.registration.bindings,
                            install = joined.install,
                            "declaration in effect; consuming"
                        );
                        return Some(joined);
                    }
                    Err(NotJoined::Moved(current)) => warn!(
                        current = ?current,
                        "the group's install is not this instance's set right after its join; \
                         declaring again"
                    ),
                    Err(NotJoined::Stalled(reason)) => {
                        error!(%reason, "could not learn the install just joined; retrying");
                        state.send_replace(ConsumerState::Stalled { reason });
                    }
                },
                Ok(Err(WharfError::Declaration(refused))) => {
                    error!(error = %refused, "declaration refused; this instance will not consume");
                    state.send_replace(ConsumerState::Failed {
                        reason: refused.to_string(),
                    });
                    let _ = stop.wait_for(|stopped| *stopped).await;
                    return None;
                }
                Ok(Err(e)) => {
                    let reason = format!("declaration attempt failed: {e}");
                    error!(%reason, "retrying");
                    state.send_replace(ConsumerState::Stalled { reason });
                }
                Err(_) => {
                    let reason = no_answer("declaration attempt");
                    error!(%reason, "retrying");
                    state.send_replace(ConsumerState::Stalled { reason });
                }
            }
            if sleep_or_stop(self.settings.retry_interval, stop).await {
                return None;
            }
        }
    }

    /// After a join or install sent at `sent`: reads the group's install in effect; if its set
    /// is this instance's own, that install is the instance's fence.
    async fn learn_install(&self, sent: Instant) -> Result<Joined, NotJoined> {
        let lapse = sent + self.settings.instance_ttl;
        let deadline = (Instant::now() + self.settings.call_deadline()).min(lapse);
        let (queue, group) = (self.queue.clone(), self.registration.group.clone());
        let current = bounded("reading the group's install", deadline, async move {
            queue.effective_install(&group).await
        })
        .await
        .map_err(NotJoined::Stalled)?;
        match current {
            Some(install) if self.is_own(&install) && Instant::now() < lapse => Ok(Joined {
                install: install.position,
                confirmed: sent,
            }),
            Some(install) if self.is_own(&install) => Err(NotJoined::Stalled(
                "the join was confirmed only after the instance TTL; declaring again".into(),
            )),
            other => Err(NotJoined::Moved(other)),
        }
    }

    /// True when `install`'s set is this instance's (both normalized and sorted).
    fn is_own(&self, install: &EffectiveInstall) -> bool {
        sorted(install.patterns.clone()) == sorted(self.registration.bindings.patterns())
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

    /// Heartbeats until stopped, or until the declaration is no longer this instance's: its row
    /// is gone, the group's install moved on (seen here or by a fenced fetch), or no heartbeat
    /// was confirmed for the instance TTL.
    async fn consume_phase(
        &self,
        state: &watch::Sender<ConsumerState>,
        halt: &mut watch::Receiver<bool>,
        fenced: &mut watch::Receiver<Option<i64>>,
        mut joined: Joined,
        joins: u64,
    ) -> Interrupt {
        let group = &self.registration.group;
        let call = self.settings.call_deadline();
        let mut fence_open = true;
        loop {
            let lapse = joined.confirmed + self.settings.instance_ttl;
            let next_beat = Instant::now() + self.settings.heartbeat_interval;
            loop {
                tokio::select! {
                    biased;
                    _ = halt.wait_for(|halted| *halted) => return Interrupt::Stop,
                    () = tokio::time::sleep_until(lapse) => return self.lapsed(),
                    changed = fenced.changed(), if fence_open => {
                        if changed.is_err() {
                            fence_open = false;
                        } else if *fenced.borrow_and_update() == Some(joined.install) {
                            warn!(
                                install = joined.install,
                                "a fetch found the group's install moved on; re-declaring"
                            );
                            return Interrupt::Redeclare;
                        }
                    }
                    () = tokio::time::sleep_until(next_beat) => break,
                }
            }
            let sent = Instant::now();
            let deadline = (sent + call).min(lapse);
            let (store, declarer, beating) =
                (self.store.clone(), self.declarer.clone(), group.clone());
            let beat = bounded("heartbeat", deadline, async move {
                store.heartbeat(beating.as_str(), declarer.as_str()).await
            })
            .await;
            let checked = match beat {
                Ok(true) => {
                    let deadline = (Instant::now() + call).min(lapse);
                    let (queue, group) = (self.queue.clone(), group.clone());
                    let read = async move { queue.effective_install(&group).await };
                    bounded("reading the group's install", deadline, read)
                        .await
                        .map(Some)
                }
                Ok(false) => Ok(None),
                Err(reason) => Err(reason),
            };
            match checked {
                Ok(None) => {
                    warn!("this instance's heartbeat row is gone; re-declaring");
                    return Interrupt::Redeclare;
                }
                Ok(Some(Some(current)))
                    if current.position == joined.install && self.is_own(&current) =>
                {
                    if Instant::now() >= lapse {
                        return self.lapsed();
                    }
                    joined.confirmed = sent;
                    if !state.borrow().is_ready() {
                        info!("heartbeat confirmed within the instance TTL; consuming again");
                        state.send_replace(self.consuming(joined.install, joins));
                    }
                }
                Ok(Some(current)) => {
                    warn!(
                        joined = joined.install,
                        current = ?current,
                        "the group's install is no longer the one this instance joined; re-declaring"
                    );
                    return Interrupt::Redeclare;
                }
                Err(reason) => {
                    error!(
                        %reason,
                        "heartbeat not confirmed; not ready until one is (past the instance TTL \
                         it re-declares first)"
                    );
                    state.send_replace(ConsumerState::Stalled { reason });
                }
            }
        }
    }

    /// No heartbeat confirmed for the instance TTL: the group may already count this instance
    /// as gone and have swapped its set, so it declares again before it claims again.
    fn lapsed(&self) -> Interrupt {
        error!(
            instance_ttl = %humantime::format_duration(self.settings.instance_ttl),
            "no heartbeat confirmed within the instance TTL; re-declaring before claiming again"
        );
        Interrupt::Redeclare
    }
}

/// Runs one store call with a deadline; the error says what failed or that it timed out.
/// Past the deadline the call goes on to its end unobserved, never dropped mid-statement
/// (ADR 0068).
async fn bounded<T, E>(
    what: &str,
    deadline: Instant,
    call: impl Future<Output = Result<T, E>> + Send + 'static,
) -> Result<T, String>
where
    T: Send + 'static,
    E: Display + Send + 'static,
{
    match finish_by(deadline, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(format!("{what} failed: {e}")),
        Err(_) => Err(no_answer(what)),
    }
}

fn no_answer(what: &str) -> String {
    format!("{what}: no answer from the store within its deadline")
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
