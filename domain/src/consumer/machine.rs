//! The consumer lifecycle's decisions, sans-IO. See the module docs of [`crate::consumer`].

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::state::ConsumerState;
use super::timing::LifecycleTiming;
use crate::{BindingSet, DeclarationError, DeclarerId, RegisterOutcome};

/// A point in time on the driver's monotonic clock: how long since its epoch.
pub type Now = Duration;

/// The store calls the lifecycle makes, by the name its reasons give them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreCall {
    /// A Register attempt (with its heartbeat).
    Attempt,
    /// The read of the group's install in effect.
    ReadInstall,
    /// A heartbeat.
    Heartbeat,
    /// The removal of the instance's heartbeat row.
    Leave,
}

impl StoreCall {
    /// How a reason names the call.
    pub fn name(self) -> &'static str {
        match self {
            Self::Attempt => "declaration attempt",
            Self::ReadInstall => "reading the group's install",
            Self::Heartbeat => "heartbeat",
            Self::Leave => "leave",
        }
    }
}

/// A store call that did not answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallFailure {
    /// The call failed; the error's text.
    Error(String),
    /// No answer within the call's deadline (the call itself runs on to its end, ADR 0068).
    NoAnswer,
}

impl CallFailure {
    /// The reason a stalled state gives: what failed, or that it timed out.
    pub fn reason(&self, call: StoreCall) -> String {
        match self {
            Self::Error(error) => format!("{} failed: {error}", call.name()),
            Self::NoAnswer => format!(
                "{}: no answer from the store within its deadline",
                call.name()
            ),
        }
    }
}

/// Why a declaration attempt did not come back with an outcome.
#[derive(Debug, Clone, PartialEq)]
pub enum AttemptFailure {
    /// Refused for good (e.g. the group consumes another topic).
    Refused(DeclarationError),
    /// The store failed or did not answer: retried.
    Call(CallFailure),
}

/// What a heartbeat found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeartbeatAnswer {
    /// The instance's row was there and now carries the new heartbeat.
    Recorded,
    /// The instance's row is gone (the group counted it as gone and it was deleted).
    RowGone,
}

/// The group's install in effect, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Install {
    /// The ledger position of its `Installed` event: the install's identity.
    pub position: i64,
    /// Its set's patterns (empty = the whole topic).
    pub patterns: Vec<String>,
}

/// What happened: an answer to the call the machine asked for, or a signal.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// Time passed (a wait ended). Any input also says what time it is.
    Tick,
    /// Shutdown was requested: declare no more (the claim loop stops claiming and drains).
    Stop,
    /// The claim loop has drained (without one: shutdown was requested): heartbeat no more.
    /// Implies [`Input::Stop`].
    Halt,
    /// The claim loop's fetch found the group's install moved on from this one.
    Fenced(i64),
    /// The answer to [`Next::Attempt`].
    Attempted(Result<RegisterOutcome, AttemptFailure>),
    /// The answer to [`Next::ReadInstall`].
    InstallRead(Result<Option<Install>, CallFailure>),
    /// The answer to [`Next::Heartbeat`].
    Heartbeat(Result<HeartbeatAnswer, CallFailure>),
    /// The answer to [`Next::Leave`].
    Left(Result<(), CallFailure>),
}

/// What the driver does next: exactly one thing.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Send one declaration attempt (with its heartbeat), stating `first_declared_at` (the
    /// time this declarer first stated its set, once a wait has told it), and wait for its
    /// answer until `deadline` at most.
    Attempt {
        /// When this instance first stated its set, if an earlier attempt of this
        /// declaration waited.
        first_declared_at: Option<DateTime<Utc>>,
        /// Until when to wait for the answer.
        deadline: Now,
    },
    /// Read the group's install in effect, waiting for the answer until `deadline` at most.
    ReadInstall {
        /// Until when to wait for the answer.
        deadline: Now,
    },
    /// Send one heartbeat, waiting for the answer until `deadline` at most.
    Heartbeat {
        /// Until when to wait for the answer.
        deadline: Now,
    },
    /// Nothing to send: wait until `until` (then [`Input::Tick`]), or for a signal (stop,
    /// halt, a fenced fetch), whichever comes first. `None`: only a signal ends the wait.
    Wait {
        /// When to tick.
        until: Option<Now>,
    },
    /// Remove the instance's heartbeat row, waiting for the answer until `deadline` at most.
    Leave {
        /// Until when to wait for the answer.
        deadline: Now,
    },
    /// A call is in flight: its answer is the next input (the one just given changed nothing
    /// that cannot wait for it).
    Await,
    /// The lifecycle is over (it left and reported [`ConsumerState::Stopped`]).
    End,
}

/// What the driver logs: each step's reason to speak, beside the state it publishes.
#[derive(Debug, Clone, PartialEq)]
pub enum Note {
    /// An attempt waits on a live incumbent's set (loudly, on every retry).
    Waiting {
        /// The set waited on.
        incumbent: BindingSet,
        /// The live instances that declare it.
        live_declarers: Vec<DeclarerId>,
        /// When this instance first stated its set.
        declared_at: DateTime<Utc>,
        /// Attempts made so far.
        attempts: u64,
    },
    /// The declaration is in effect: consuming under `install`.
    InEffect {
        /// What the attempt said.
        outcome: RegisterOutcome,
        /// The install joined: the fence.
        install: i64,
    },
    /// Right after a join the group's install is not this instance's set: declaring again.
    NotOwnAfterJoin {
        /// The install read.
        current: Option<Install>,
    },
    /// The install just joined could not be learned: retrying.
    LearnStalled {
        /// Why.
        reason: String,
    },
    /// The declaration was refused for good.
    Refused {
        /// Why.
        reason: String,
    },
    /// The attempt failed or got no answer: retrying.
    AttemptFailed {
        /// Why.
        reason: String,
    },
    /// The instance's heartbeat row is gone: re-declaring.
    RowGone,
    /// The group's install is no longer the one joined: re-declaring.
    InstallMoved {
        /// The install joined.
        joined: i64,
        /// The install read.
        current: Option<Install>,
    },
    /// A fetch found the group's install moved on from the one joined: re-declaring.
    Fenced {
        /// The install joined.
        install: i64,
    },
    /// A heartbeat was not confirmed: stalled until one is.
    HeartbeatUnconfirmed {
        /// Why.
        reason: String,
    },
    /// A heartbeat was confirmed again within the TTL: consuming again, same install.
    Resumed,
    /// No heartbeat confirmed within the TTL: re-declaring before claiming again.
    Lapsed,
    /// The heartbeat row was removed.
    Left,
    /// The heartbeat row could not be removed; it lapses after the TTL.
    LeaveFailed {
        /// Why.
        reason: String,
    },
}

/// Something the driver reports, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Log this.
    Note(Note),
    /// Publish this state (readiness, the claim loop's permission to claim under its install).
    Publish(ConsumerState),
}

/// What one input made of the machine: what to report, then what to do.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// What to report, in order.
    pub effects: Vec<Effect>,
    /// What to do next.
    pub next: Next,
}

impl Step {
    /// The states this step publishes, in order.
    pub fn published(&self) -> impl Iterator<Item = &ConsumerState> {
        self.effects.iter().filter_map(|effect| match effect {
            Effect::Publish(state) => Some(state),
            Effect::Note(_) => None,
        })
    }

    /// The notes this step logs, in order.
    pub fn notes(&self) -> impl Iterator<Item = &Note> {
        self.effects.iter().filter_map(|effect| match effect {
            Effect::Note(note) => Some(note),
            Effect::Publish(_) => None,
        })
    }
}

/// A heartbeat round of a consuming instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Beat {
    /// Between rounds: the next starts at `next`.
    Idle { next: Now },
    /// A heartbeat sent at `sent` is in flight.
    Sending { sent: Now },
    /// The heartbeat sent at `sent` was recorded; the install read is in flight.
    Checking { sent: Now },
}

/// Where the machine is.
#[derive(Debug, Clone, PartialEq)]
enum Phase {
    /// Declaring: the next attempt is due at `due`.
    Declaring { due: Now },
    /// An attempt sent at `sent` is in flight.
    Attempting { sent: Now },
    /// The attempt sent at `sent` joined or installed; the install read is in flight.
    Learning { sent: Now, outcome: RegisterOutcome },
    /// Refused for good: waits for a stop.
    Failed,
    /// In effect under `install`; `confirmed` is when the call that last confirmed the
    /// heartbeat was sent.
    Consuming {
        install: i64,
        confirmed: Now,
        beat: Beat,
    },
    /// Declaring and heartbeating are over: leave once the claim loop has drained.
    Done,
    /// The leave is in flight.
    Leaving,
    /// Left and stopped.
    Stopped,
}

/// The lifecycle of one consuming instance: declare (and wait), learn the install joined,
/// heartbeat with a readiness bounded by the TTL, re-declare, leave. See the module docs.
#[derive(Debug, Clone)]
pub struct ConsumerLifecycle {
    bindings: BindingSet,
    timing: LifecycleTiming,
    phase: Phase,
    state: ConsumerState,
    /// Attempts of the current declaration.
    attempts: u64,
    /// When this declarer first stated its set in the current declaration (a wait tells it).
    first_declared_at: Option<DateTime<Utc>>,
    joins: u64,
    stop: bool,
    halt: bool,
    /// The install a fetch was last fenced from, not yet looked at.
    fenced: Option<i64>,
}

impl ConsumerLifecycle {
    /// A lifecycle that declares `bindings`, in state [`ConsumerState::Declaring`]; call
    /// [`ConsumerLifecycle::start`] to begin.
    pub fn new(bindings: BindingSet, timing: LifecycleTiming) -> Self {
        Self {
            bindings,
            timing,
            phase: Phase::Declaring { due: Now::ZERO },
            state: ConsumerState::Declaring,
            attempts: 0,
            first_declared_at: None,
            joins: 0,
            stop: false,
            halt: false,
            fenced: None,
        }
    }

    /// Begins at `now`: the first attempt.
    pub fn start(&mut self, now: Now) -> Step {
        self.phase = Phase::Declaring { due: now };
        self.run(|machine, effects| machine.resume(now, effects))
    }

    /// `input` happened at `now`: what to report, and what to do next.
    pub fn step(&mut self, now: Now, input: Input) -> Step {
        self.run(|machine, effects| machine.handle(now, input, effects))
    }

    /// The state last published.
    pub fn state(&self) -> &ConsumerState {
        &self.state
    }

    /// The timing it runs by.
    pub fn timing(&self) -> &LifecycleTiming {
        &self.timing
    }

    /// How many times the instance has joined or installed.
    pub fn joins(&self) -> u64 {
        self.joins
    }

    /// While in effect: when its heartbeat may lapse, by the store's clock, for all the
    /// instance knows (the send of the last confirming call plus the TTL). Never consuming
    /// at or past it.
    pub fn lapse(&self) -> Option<Now> {
        match self.phase {
            Phase::Consuming { confirmed, .. } => Some(self.lapse_after(confirmed)),
            _ => None,
        }
    }

    /// True once a stop (or a halt) was given.
    pub fn stop_requested(&self) -> bool {
        self.stop
    }

    /// True once a halt was given.
    pub fn halted(&self) -> bool {
        self.halt
    }

    fn run(&mut self, decide: impl FnOnce(&mut Self, &mut Vec<Effect>) -> Next) -> Step {
        let mut effects = Vec::new();
        let next = decide(self, &mut effects);
        Step { effects, next }
    }

    fn lapse_after(&self, sent: Now) -> Now {
        sent.saturating_add(self.timing.instance_ttl)
    }

    /// A call's deadline: the call deadline from `now`, and never past `lapse`.
    fn deadline(&self, now: Now, lapse: Option<Now>) -> Now {
        let deadline = now.saturating_add(self.timing.call_deadline);
        lapse.map_or(deadline, |lapse| deadline.min(lapse))
    }

    fn publish(&mut self, state: ConsumerState, effects: &mut Vec<Effect>) {
        self.state = state.clone();
        effects.push(Effect::Publish(state));
    }

    fn consuming(&self, install: i64) -> ConsumerState {
        ConsumerState::Consuming {
            bindings: self.bindings.clone(),
            install,
            joins: self.joins,
        }
    }

    /// True when `install`'s set is this instance's (both normalized and sorted).
    fn is_own(&self, install: &Install) -> bool {
        sorted(install.patterns.clone()) == sorted(self.bindings.patterns())
    }

    fn handle(&mut self, now: Now, input: Input, effects: &mut Vec<Effect>) -> Next {
        match input {
            Input::Tick => self.resume(now, effects),
            Input::Stop => {
                self.stop = true;
                self.resume(now, effects)
            }
            Input::Halt => {
                self.stop = true;
                self.halt = true;
                self.resume(now, effects)
            }
            Input::Fenced(install) => {
                self.fenced = Some(install);
                self.resume(now, effects)
            }
            Input::Attempted(answer) => match self.phase {
                Phase::Attempting { sent } => self.attempted(now, sent, answer, effects),
                _ => self.resume(now, effects),
            },
            Input::InstallRead(answer) => match self.phase.clone() {
                Phase::Learning { sent, outcome } => {
                    self.learned(now, sent, outcome, answer, effects)
                }
                Phase::Consuming {
                    install,
                    confirmed,
                    beat: Beat::Checking { sent },
                } => self.checked(now, install, confirmed, sent, answer, effects),
                _ => self.resume(now, effects),
            },
            Input::Heartbeat(answer) => match self.phase {
                Phase::Consuming {
                    install,
                    confirmed,
                    beat: Beat::Sending { sent },
                } => self.beaten(now, install, confirmed, sent, answer, effects),
                _ => self.resume(now, effects),
            },
            Input::Left(answer) => match self.phase {
                Phase::Leaving => {
                    effects.push(Effect::Note(match answer {
                        Ok(()) => Note::Left,
                        Err(failure) => Note::LeaveFailed {
                            reason: failure.reason(StoreCall::Leave),
                        },
                    }));
                    self.phase = Phase::Stopped;
                    self.publish(ConsumerState::Stopped, effects);
                    Next::End
                }
                _ => self.resume(now, effects),
            },
        }
    }

    /// Nothing is answered: what the phase does at `now` (a call in flight is awaited).
    fn resume(&mut self, now: Now, effects: &mut Vec<Effect>) -> Next {
        match self.phase.clone() {
            Phase::Declaring { due } => {
                if self.stop {
                    self.done(now)
                } else if now >= due {
                    self.attempts += 1;
                    self.phase = Phase::Attempting { sent: now };
                    Next::Attempt {
                        first_declared_at: self.first_declared_at,
                        deadline: self.deadline(now, None),
                    }
                } else {
                    Next::Wait { until: Some(due) }
                }
            }
            Phase::Failed => {
                if self.stop {
                    self.done(now)
                } else {
                    Next::Wait { until: None }
                }
            }
            Phase::Consuming {
                install,
                confirmed,
                beat: Beat::Idle { next },
            } => {
                let lapse = self.lapse_after(confirmed);
                if self.halt {
                    return self.done(now);
                }
                if now >= lapse {
                    effects.push(Effect::Note(Note::Lapsed));
                    return self.redeclare(now, effects);
                }
                if let Some(fenced) = self.fenced.take() {
                    if fenced == install {
                        effects.push(Effect::Note(Note::Fenced { install }));
                        return self.redeclare(now, effects);
                    }
                }
                if now >= next {
                    self.phase = Phase::Consuming {
                        install,
                        confirmed,
                        beat: Beat::Sending { sent: now },
                    };
                    return Next::Heartbeat {
                        deadline: self.deadline(now, Some(lapse)),
                    };
                }
                Next::Wait {
                    until: Some(next.min(lapse)),
                }
            }
            Phase::Done => self.done(now),
            Phase::Attempting { .. }
            | Phase::Learning { .. }
            | Phase::Consuming { .. }
            | Phase::Leaving => Next::Await,
            Phase::Stopped => Next::End,
        }
    }

    /// Declaring and heartbeating are over; leave once the claim loop has drained.
    fn done(&mut self, now: Now) -> Next {
        self.phase = Phase::Done;
        if self.halt {
            self.phase = Phase::Leaving;
            Next::Leave {
                deadline: self.deadline(now, None),
            }
        } else {
            Next::Wait { until: None }
        }
    }

    /// Back to declaring, from the first attempt.
    fn redeclare(&mut self, now: Now, effects: &mut Vec<Effect>) -> Next {
        self.first_declared_at = None;
        self.attempts = 0;
        self.publish(ConsumerState::Declaring, effects);
        self.phase = Phase::Declaring { due: now };
        self.resume(now, effects)
    }

    /// The next attempt after the retry interval.
    fn retry(&mut self, now: Now, effects: &mut Vec<Effect>) -> Next {
        self.phase = Phase::Declaring {
            due: now.saturating_add(self.timing.retry_interval),
        };
        self.resume(now, effects)
    }

    fn stall(&mut self, reason: String, effects: &mut Vec<Effect>) {
        self.publish(ConsumerState::Stalled { reason }, effects);
    }

    fn attempted(
        &mut self,
        now: Now,
        sent: Now,
        answer: Result<RegisterOutcome, AttemptFailure>,
        effects: &mut Vec<Effect>,
    ) -> Next {
        match answer {
            Ok(RegisterOutcome::Waiting {
                incumbent,
                live_declarers,
                declared_at,
            }) => {
                self.first_declared_at = Some(declared_at);
                let attempts = self.attempts;
                effects.push(Effect::Note(Note::Waiting {
                    incumbent: incumbent.clone(),
                    live_declarers: live_declarers.clone(),
                    declared_at,
                    attempts,
                }));
                self.publish(
                    ConsumerState::Waiting {
                        incumbent,
                        live_declarers,
                        declared_at,
                        attempts,
                    },
                    effects,
                );
                self.retry(now, effects)
            }
            Ok(outcome) => {
                let lapse = self.lapse_after(sent);
                if now >= lapse {
                    // No read could confirm the join in time: a call is never sent past the
                    // lapse.
                    return self.join_too_late(now, effects);
                }
                self.phase = Phase::Learning { sent, outcome };
                Next::ReadInstall {
                    deadline: self.deadline(now, Some(lapse)),
                }
            }
            Err(AttemptFailure::Refused(refused)) => {
                let reason = refused.to_string();
                effects.push(Effect::Note(Note::Refused {
                    reason: reason.clone(),
                }));
                self.publish(ConsumerState::Failed { reason }, effects);
                self.phase = Phase::Failed;
                self.resume(now, effects)
            }
            Err(AttemptFailure::Call(failure)) => {
                let reason = failure.reason(StoreCall::Attempt);
                effects.push(Effect::Note(Note::AttemptFailed {
                    reason: reason.clone(),
                }));
                self.stall(reason, effects);
                self.retry(now, effects)
            }
        }
    }

    fn join_too_late(&mut self, now: Now, effects: &mut Vec<Effect>) -> Next {
        let reason =
            "the join was confirmed only after the instance TTL; declaring again".to_owned();
        effects.push(Effect::Note(Note::LearnStalled {
            reason: reason.clone(),
        }));
        self.stall(reason, effects);
        self.retry(now, effects)
    }

    /// The install read after the join (or install) sent at `sent`.
    fn learned(
        &mut self,
        now: Now,
        sent: Now,
        outcome: RegisterOutcome,
        answer: Result<Option<Install>, CallFailure>,
        effects: &mut Vec<Effect>,
    ) -> Next {
        match answer {
            Ok(Some(install)) if self.is_own(&install) => {
                if now >= self.lapse_after(sent) {
                    return self.join_too_late(now, effects);
                }
                self.joins += 1;
                effects.push(Effect::Note(Note::InEffect {
                    outcome,
                    install: install.position,
                }));
                self.publish(self.consuming(install.position), effects);
                self.phase = Phase::Consuming {
                    install: install.position,
                    confirmed: sent,
                    beat: Beat::Idle {
                        next: now.saturating_add(self.timing.heartbeat_interval),
                    },
                };
                self.resume(now, effects)
            }
            Ok(current) => {
                effects.push(Effect::Note(Note::NotOwnAfterJoin { current }));
                self.retry(now, effects)
            }
            Err(failure) => {
                let reason = failure.reason(StoreCall::ReadInstall);
                effects.push(Effect::Note(Note::LearnStalled {
                    reason: reason.clone(),
                }));
                self.stall(reason, effects);
                self.retry(now, effects)
            }
        }
    }

    /// The heartbeat sent at `sent` answered.
    fn beaten(
        &mut self,
        now: Now,
        install: i64,
        confirmed: Now,
        sent: Now,
        answer: Result<HeartbeatAnswer, CallFailure>,
        effects: &mut Vec<Effect>,
    ) -> Next {
        match answer {
            Ok(HeartbeatAnswer::Recorded) => {
                let lapse = self.lapse_after(confirmed);
                if now >= lapse {
                    // The install read could not be sent before the lapse.
                    effects.push(Effect::Note(Note::Lapsed));
                    return self.redeclare(now, effects);
                }
                self.phase = Phase::Consuming {
                    install,
                    confirmed,
                    beat: Beat::Checking { sent },
                };
                Next::ReadInstall {
                    deadline: self.deadline(now, Some(lapse)),
                }
            }
            Ok(HeartbeatAnswer::RowGone) => {
                effects.push(Effect::Note(Note::RowGone));
                self.redeclare(now, effects)
            }
            Err(failure) => self.unconfirmed(now, install, confirmed, failure, effects),
        }
    }

    /// The install read after the heartbeat sent at `sent` was recorded.
    fn checked(
        &mut self,
        now: Now,
        install: i64,
        confirmed: Now,
        sent: Now,
        answer: Result<Option<Install>, CallFailure>,
        effects: &mut Vec<Effect>,
    ) -> Next {
        match answer {
            Ok(Some(current)) if current.position == install && self.is_own(&current) => {
                if now >= self.lapse_after(confirmed) {
                    effects.push(Effect::Note(Note::Lapsed));
                    return self.redeclare(now, effects);
                }
                if !self.state.is_ready() {
                    effects.push(Effect::Note(Note::Resumed));
                    self.publish(self.consuming(install), effects);
                }
                self.phase = Phase::Consuming {
                    install,
                    confirmed: confirmed.max(sent),
                    beat: Beat::Idle {
                        next: now.saturating_add(self.timing.heartbeat_interval),
                    },
                };
                self.resume(now, effects)
            }
            Ok(current) => {
                effects.push(Effect::Note(Note::InstallMoved {
                    joined: install,
                    current,
                }));
                self.redeclare(now, effects)
            }
            Err(failure) => self.unconfirmed(now, install, confirmed, failure, effects),
        }
    }

    /// A heartbeat round that confirmed nothing: stalled at once, the next round after the
    /// interval (the lapse stays where it was).
    fn unconfirmed(
        &mut self,
        now: Now,
        install: i64,
        confirmed: Now,
        failure: CallFailure,
        effects: &mut Vec<Effect>,
    ) -> Next {
        let call = match self.phase {
            Phase::Consuming {
                beat: Beat::Checking { .. },
                ..
            } => StoreCall::ReadInstall,
            _ => StoreCall::Heartbeat,
        };
        let reason = failure.reason(call);
        effects.push(Effect::Note(Note::HeartbeatUnconfirmed {
            reason: reason.clone(),
        }));
        self.stall(reason, effects);
        self.phase = Phase::Consuming {
            install,
            confirmed,
            beat: Beat::Idle {
                next: now.saturating_add(self.timing.heartbeat_interval),
            },
        };
        self.resume(now, effects)
    }
}

fn sorted(mut patterns: Vec<String>) -> Vec<String> {
    patterns.sort();
    patterns
}
