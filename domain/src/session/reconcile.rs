//! The reconcile state machine of a managed MQTT session: sans-IO and deterministic.
//!
//! The driver (the runtime) feeds [`Input`]s (connection events, SUBACK/UNSUBACK outcomes,
//! ledger commits, deliveries, ticks) with the time it read from its monotonic clock, and does
//! what the returned [`Action`]s say. The machine reads no clock and does no I/O, so every rule
//! below is a unit test, and a crash is "drop the machine, rebuild it from the durable history".
//!
//! The rules (issue 9, points 5 to 7):
//! 1. **Every desired filter is SUBSCRIBEd on every connection**, whatever `session_present`
//!    says, and none before it is durable: a desired filter not yet in the history (or held at
//!    another QoS) is **Remembered** (a ledger write) first and SUBSCRIBEd once
//!    [`Input::Remembered`] says its write committed. The filters already in the history go out
//!    at once. New filters are Remembered in waves (one outstanding at a time; the first of at
//!    most [`ReconcileSettings::first_wave`] filters, each later one up to twice the one
//!    before): a wave's SUBSCRIBE goes out as soon as it committed, while the next wave is
//!    written, so the broker's round trips overlap the ledger's (ADR 0041). The reconcile is
//!    judged once every wave was Remembered and every Subscribe answered.
//! 2. A SUBACK that refuses a filter, leaves one out, or grants a QoS below the requested one
//!    **fails** the reconcile ([`Action::Failed`], judged over all the connection's SUBACKs):
//!    the history is kept, the level stays `Connected`, and the machine waits for a new
//!    connection to retry. No per-filter quarantine.
//! 3. All granted: `Subscribed`. The stale filters (history minus desired) are UNSUBSCRIBEd by
//!    their exact strings. UNSUBACK reasons 0x00 and 0x11 verify a removal; any other reason,
//!    or no reason at all, leaves the filter pending (durable, retried on a later connection).
//! 4. If any stale filter was removed: [`Action::Recycle`] (reconnect) before normal dispatch.
//!    The replacement connection subscribes the desired filters again and keeps the history
//!    through one `unmatched_grace` window; then the verified filters are **Forgotten** (a ledger
//!    write); after [`Input::Forgotten`] the machine unsubscribes any still-pending stale
//!    filters, or reaches `Full`.
//! 5. A redelivery (`dup`) that came through a removed shared filter, on a connection opened
//!    after the removal and before that filter's Forget was issued, is never acked nor dropped:
//!    [`Action::Hold`], [`Action::Disconnect`], [`Action::RequireMigration`]; the machine is then
//!    terminal (`MigrationRequired`, history kept).
//!
//! Deliveries (each judged once, in arrival order, re-judged while undecided):
//! - matching a desired filter: [`Action::Dispatch`] once subscribed on that connection, and,
//!   on a connection that has not been recycled, only when no stale filter awaits removal;
//!   until then it waits (and is redelivered by the broker if the connection ends first);
//! - matching a stale history filter (pending, or removed but not yet forgotten) and no desired
//!   filter: **coverage-protected**, [`Action::Hold`]: never acked on this connection, however
//!   long it stays, so the broker redelivers it after a reconnect;
//! - matching nothing at all: waits `unmatched_grace` from its arrival, then
//!   [`Action::AckUnmatched`] (acked and dropped: no handler wants it and no filter that might
//!   still exist covers it). If its connection ends first it is simply forgotten.
//!
//! Which filter a delivery came through: the filters whose [`subscription_id`] the delivery
//! carries and whose topic filter matches its topic; when it carries none of those, every filter
//! whose topic filter matches its topic. Inputs of another generation than the current
//! connection's are never acted on; [`Reconciler::ignored_inputs`] counts them.

mod deliveries;
mod io;
mod plan;
mod removal;

pub use io::{Action, Input, ReconcileStatus, SessionLevel};
pub use plan::{plan, subscription_id, Plan, PLAIN_SUBSCRIPTION_ID};

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use super::exact_filter::{ExactFilter, Qos};
use super::ledger::{
    is_removal_verified, FilterRecord, ManagedSession, ManagedSessionError, SubscribeOutcome,
};
use crate::error::ValidationError;
use deliveries::Parked;
use plan::{partition, to_remember};
use removal::join_limited;

/// A point in time: how long since an arbitrary epoch the driver chose (its monotonic clock).
pub type Now = Duration;

/// The machine's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReconcileSettings {
    /// How long a delivery matching nothing waits before it is acked and dropped, and how long
    /// a replacement connection is watched before removed filters are forgotten.
    pub unmatched_grace: Duration,
    /// The most filters the first [`Action::Remember`] carries (at least 1); each later one
    /// carries up to twice as many as the one before, so `n` new filters take about
    /// `log2(n / first_wave)` ledger writes and the first SUBSCRIBE waits for a small one.
    pub first_wave: usize,
}

impl ReconcileSettings {
    /// The first wave the runtime uses: a Remember of 250 filters is one small ledger write
    /// (a few milliseconds on either backend), after which the broker is kept busy.
    pub const DEFAULT_FIRST_WAVE: usize = 250;

    /// Settings with `unmatched_grace` and the default first wave.
    pub fn new(unmatched_grace: Duration) -> Self {
        Self {
            unmatched_grace,
            first_wave: Self::DEFAULT_FIRST_WAVE,
        }
    }

    /// The same settings with a first Remember of at most `filters` filters.
    pub fn with_first_wave(self, filters: usize) -> Self {
        Self {
            first_wave: filters,
            ..self
        }
    }
}

/// Where the current connection is in its reconcile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Remembering waves and awaiting SUBACKs until every desired filter was answered.
    Subscribing,
    SubscribeFailed,
    AwaitUnsubAck,
    Recycling,
    Verifying {
        until: Now,
    },
    AwaitForget,
    Settled,
}

/// A removal an UNSUBACK verified in this process, not yet forgotten.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Removal {
    reason_code: u8,
    generation: u64,
}

#[derive(Debug, Clone)]
struct Connection {
    generation: u64,
    stage: Stage,
    subscribed: bool,
    /// Subscribe actions of this connection whose SUBACK has not come back.
    subscribes_outstanding: usize,
    /// What this connection's SUBACKs answered so far.
    answered: BTreeMap<ExactFilter, SubscribeOutcome>,
    /// Opened while verified removals awaited their Forget: deliveries may dispatch here.
    replacement: bool,
    unsubscribe_attempted: bool,
    unsubscribing: Vec<ExactFilter>,
    parked: BTreeMap<u64, Parked>,
}

/// The reconcile state machine of one managed session. See the module docs for the rules.
#[derive(Debug, Clone)]
pub struct Reconciler {
    desired: BTreeMap<ExactFilter, Qos>,
    history: BTreeMap<ExactFilter, FilterRecord>,
    settings: ReconcileSettings,
    remember_outstanding: Option<Vec<(ExactFilter, Qos)>>,
    /// Desired filters not durable at their QoS and not yet in a Remember, in order: only
    /// waves take from it (the history changes otherwise only by Forgets of stale filters).
    unremembered: VecDeque<(ExactFilter, Qos)>,
    /// The most filters the next Remember may carry.
    next_wave: usize,
    forget_outstanding: Option<Vec<(ExactFilter, u8)>>,
    removed: BTreeMap<ExactFilter, Removal>,
    connection: Option<Connection>,
    last_generation: Option<u64>,
    level: SessionLevel,
    terminal: Option<String>,
    last_failure: Option<String>,
    ignored_inputs: u64,
    /// The newest time any input brought (never moves back).
    now: Now,
}

impl Reconciler {
    /// A machine for `desired` against the known `history` (the ledger's, never unknown).
    /// Refuses a filter desired at two QoS levels, naming it.
    pub fn new(
        desired: Vec<(ExactFilter, Qos)>,
        history: BTreeMap<ExactFilter, FilterRecord>,
        settings: ReconcileSettings,
    ) -> Result<Self, ValidationError> {
        let desired = strict_desired(desired).map_err(|(filter, first, second)| {
            ValidationError::new(
                "subscriptions",
                filter.as_str(),
                &format!("the filter is desired at QoS {first} and at QoS {second}"),
            )
        })?;
        Ok(Self::build(desired, history, settings))
    }

    /// A machine for `desired` against a ledger's state, failing closed: refuses an unknown
    /// history (never seeded), a ledger in the terminal migration-required state, and a filter
    /// desired at two QoS levels.
    pub fn from_ledger(
        desired: Vec<(ExactFilter, Qos)>,
        ledger: &ManagedSession,
        settings: ReconcileSettings,
    ) -> Result<Self, ManagedSessionError> {
        if let Some(reason) = &ledger.migration_required {
            return Err(ManagedSessionError::MigrationRequired {
                reason: reason.clone(),
            });
        }
        let history = ledger
            .history
            .clone()
            .ok_or(ManagedSessionError::HistoryUnknown)?;
        let desired = strict_desired(desired).map_err(|(filter, first, second)| {
            ManagedSessionError::ConflictingQos {
                filter,
                first,
                second,
            }
        })?;
        Ok(Self::build(desired, history, settings))
    }

    fn build(
        desired: BTreeMap<ExactFilter, Qos>,
        history: BTreeMap<ExactFilter, FilterRecord>,
        settings: ReconcileSettings,
    ) -> Self {
        let unremembered = to_remember(&desired, &history).into();
        Self {
            desired,
            history,
            settings,
            remember_outstanding: None,
            unremembered,
            next_wave: settings.first_wave.max(1),
            forget_outstanding: None,
            removed: BTreeMap::new(),
            connection: None,
            last_generation: None,
            level: SessionLevel::Starting,
            terminal: None,
            last_failure: None,
            ignored_inputs: 0,
            now: Duration::ZERO,
        }
    }

    /// The current level.
    pub fn level(&self) -> SessionLevel {
        self.level
    }

    /// The history as the machine knows it (its Remember/Forget commits applied).
    pub fn history(&self) -> &BTreeMap<ExactFilter, FilterRecord> {
        &self.history
    }

    /// History filters not desired: awaiting removal (including verified ones not forgotten).
    pub fn pending_stale(&self) -> Vec<ExactFilter> {
        self.stale().cloned().collect()
    }

    /// The plan from the current history.
    pub fn plan(&self) -> Plan {
        let desired: Vec<_> = self.desired.iter().map(|(f, q)| (f.clone(), *q)).collect();
        plan(&desired, &self.history)
    }

    /// Why the last reconcile attempt failed, or the migration reason once terminal.
    pub fn last_failure(&self) -> Option<&str> {
        self.terminal.as_deref().or(self.last_failure.as_deref())
    }

    /// How many inputs were ignored: another generation's, or no longer expected.
    pub fn ignored_inputs(&self) -> u64 {
        self.ignored_inputs
    }

    /// A snapshot for the API.
    pub fn status(&self) -> ReconcileStatus {
        ReconcileStatus {
            level: self.level,
            history: self.history.keys().cloned().collect(),
            pending_stale: self.pending_stale(),
            last_failure: self.last_failure().map(str::to_owned),
            ignored_inputs: self.ignored_inputs,
        }
    }

    /// The earliest time a [`Input::Tick`] would change something, if any.
    pub fn next_deadline(&self) -> Option<Now> {
        if self.terminal.is_some() {
            return None;
        }
        let connection = self.connection.as_ref()?;
        let window = match connection.stage {
            Stage::Verifying { until } => Some(until),
            _ => None,
        };
        // Only a delivery that matches no known filter waits on the clock.
        let grace = connection
            .parked
            .values()
            .filter(|p| self.came_through(p).is_empty())
            .map(|p| p.arrived.saturating_add(self.settings.unmatched_grace))
            .min();
        window.into_iter().chain(grace).min()
    }

    /// Feeds one input at time `now`; returns what to do, in order.
    pub fn handle(&mut self, input: Input, now: Now) -> Vec<Action> {
        self.now = self.now.max(now);
        let mut actions = Vec::new();
        match input {
            Input::Connected { generation, .. } => self.on_connected(generation, &mut actions),
            Input::Remembered => self.on_remembered(&mut actions),
            Input::SubAck {
                generation,
                outcomes,
            } => self.on_suback(generation, outcomes, &mut actions),
            Input::UnsubAck {
                generation,
                outcomes,
            } => self.on_unsuback(generation, outcomes, &mut actions),
            Input::Forgotten => self.on_forgotten(&mut actions),
            Input::Disconnected { generation } => self.on_disconnected(generation, &mut actions),
            Input::Delivery {
                id,
                generation,
                topic,
                dup,
                subscription_ids,
            } => self.on_delivery(id, generation, topic, dup, subscription_ids),
            Input::Tick => {}
        }
        self.on_time(&mut actions);
        self.judge_parked(&mut actions);
        actions
    }

    fn stale(&self) -> impl Iterator<Item = &ExactFilter> {
        self.history
            .keys()
            .filter(|f| !self.desired.contains_key(*f))
    }

    fn set_level(&mut self, level: SessionLevel, actions: &mut Vec<Action>) {
        if self.level != level && self.level != SessionLevel::MigrationRequired {
            self.level = level;
            actions.push(Action::Level(level));
        }
    }

    fn current(&mut self, generation: u64) -> Option<&mut Connection> {
        match self.connection.as_mut() {
            Some(c) if c.generation == generation => Some(c),
            _ => {
                self.ignored_inputs += 1;
                None
            }
        }
    }

    fn on_connected(&mut self, generation: u64, actions: &mut Vec<Action>) {
        if self.last_generation.is_some_and(|last| generation <= last) {
            self.ignored_inputs += 1;
            return;
        }
        self.last_generation = Some(generation);
        if self.terminal.is_some() {
            actions.push(Action::Disconnect);
            return;
        }
        self.connection = Some(Connection {
            generation,
            stage: Stage::Subscribing,
            subscribed: false,
            subscribes_outstanding: 0,
            answered: BTreeMap::new(),
            replacement: !self.removed.is_empty(),
            unsubscribe_attempted: false,
            unsubscribing: Vec::new(),
            parked: BTreeMap::new(),
        });
        self.set_level(SessionLevel::Connected, actions);
        self.remember_or_subscribe(actions);
    }

    /// A new connection: SUBSCRIBE what the history already holds at its QoS, and Remember
    /// the first wave of the rest (unless a Remember is outstanding: its commit goes on).
    fn remember_or_subscribe(&mut self, actions: &mut Vec<Action>) {
        let (known, _) = partition(&self.desired, &self.history);
        self.subscribe_on_current(known, actions);
        self.remember_next_wave(actions);
        self.judge_if_answered(actions);
    }

    /// Issues the next Remember of at most one wave, when none is outstanding.
    fn remember_next_wave(&mut self, actions: &mut Vec<Action>) {
        if self.remember_outstanding.is_some() || self.unremembered.is_empty() {
            return;
        }
        let size = self.next_wave.min(self.unremembered.len());
        self.next_wave = self.next_wave.saturating_mul(2);
        let wave: Vec<_> = self.unremembered.drain(..size).collect();
        self.remember_outstanding = Some(wave.clone());
        actions.push(Action::Remember(wave));
    }

    /// SUBSCRIBEs `filters` on the current connection while it is still subscribing.
    fn subscribe_on_current(
        &mut self,
        filters: Vec<(ExactFilter, Qos)>,
        actions: &mut Vec<Action>,
    ) {
        let Some(connection) = self.connection.as_mut() else {
            return;
        };
        if filters.is_empty() || connection.stage != Stage::Subscribing {
            return;
        }
        connection.subscribes_outstanding += 1;
        actions.push(Action::Subscribe(filters));
    }

    /// Judges the connection's reconcile once nothing is left to Remember or to answer.
    fn judge_if_answered(&mut self, actions: &mut Vec<Action>) {
        let remaining = self.remember_outstanding.is_some() || !self.unremembered.is_empty();
        let Some(connection) = self.connection.as_mut() else {
            return;
        };
        if remaining
            || connection.stage != Stage::Subscribing
            || connection.subscribes_outstanding > 0
        {
            return;
        }
        let problems = suback_problems(&self.desired, &connection.answered);
        if problems.is_empty() {
            self.subscribed(actions);
            return;
        }
        let reason = format!("subscribe failed: {}", join_limited(&problems));
        connection.stage = Stage::SubscribeFailed;
        self.last_failure = Some(reason.clone());
        actions.push(Action::Failed { reason });
    }

    fn on_remembered(&mut self, actions: &mut Vec<Action>) {
        let Some(remembered) = self.remember_outstanding.take() else {
            self.ignored_inputs += 1;
            return;
        };
        for (filter, qos) in &remembered {
            self.history.entry(filter.clone()).or_default().qos = Some(*qos);
        }
        if self.terminal.is_some() {
            return;
        }
        let subscribing = self
            .connection
            .as_ref()
            .is_some_and(|c| c.stage == Stage::Subscribing);
        if !subscribing {
            // The next connection SUBSCRIBEs them with the rest of the history.
            return;
        }
        self.subscribe_on_current(remembered, actions);
        self.remember_next_wave(actions);
        self.judge_if_answered(actions);
    }

    fn on_suback(
        &mut self,
        generation: u64,
        outcomes: Vec<(ExactFilter, SubscribeOutcome)>,
        actions: &mut Vec<Action>,
    ) {
        let terminal = self.terminal.is_some();
        let Some(connection) = self.current(generation) else {
            return;
        };
        if connection.stage != Stage::Subscribing
            || connection.subscribes_outstanding == 0
            || terminal
        {
            self.ignored_inputs += 1;
            return;
        }
        connection.subscribes_outstanding -= 1;
        connection.answered.extend(outcomes);
        self.judge_if_answered(actions);
    }

    /// Every desired filter granted on the current connection.
    fn subscribed(&mut self, actions: &mut Vec<Action>) {
        if let Some(connection) = self.connection.as_mut() {
            connection.subscribed = true;
        }
        self.set_level(SessionLevel::Subscribed, actions);
        self.after_subscribed(actions);
    }

    fn after_subscribed(&mut self, actions: &mut Vec<Action>) {
        let now = self.now;
        let forget_outstanding = self.forget_outstanding.is_some();
        let grace = self.settings.unmatched_grace;
        let Some(connection) = self.connection.as_mut() else {
            return;
        };
        if forget_outstanding {
            connection.stage = Stage::AwaitForget;
            return;
        }
        if connection.replacement && !self.removed.is_empty() {
            connection.stage = Stage::Verifying {
                until: now.saturating_add(grace),
            };
            return;
        }
        self.unsubscribe_or_settle(actions);
    }

    fn on_disconnected(&mut self, generation: u64, actions: &mut Vec<Action>) {
        if self.current(generation).is_none() {
            return;
        }
        // Undecided deliveries are not acked: the broker redelivers them.
        self.connection = None;
        self.set_level(SessionLevel::Starting, actions);
    }

    fn on_delivery(
        &mut self,
        id: u64,
        generation: u64,
        topic: String,
        dup: bool,
        subscription_ids: Vec<u32>,
    ) {
        let now = self.now;
        let Some(connection) = self.current(generation) else {
            return;
        };
        if connection.parked.contains_key(&id) {
            self.ignored_inputs += 1;
            return;
        }
        let parked = Parked {
            topic,
            dup,
            subscription_ids,
            arrived: now,
        };
        connection.parked.insert(id, parked);
    }
}

/// The desired set by filter; a filter listed at two QoS levels is the error.
fn strict_desired(
    desired: Vec<(ExactFilter, Qos)>,
) -> Result<BTreeMap<ExactFilter, Qos>, (ExactFilter, Qos, Qos)> {
    let mut merged = BTreeMap::new();
    for (filter, qos) in desired {
        if let Some(first) = merged.insert(filter.clone(), qos) {
            if first != qos {
                return Err((filter, first, qos));
            }
        }
    }
    Ok(merged)
}

/// What is wrong with a SUBACK for the desired filters: refused, downgraded or unanswered.
fn suback_problems(
    desired: &BTreeMap<ExactFilter, Qos>,
    answered: &BTreeMap<ExactFilter, SubscribeOutcome>,
) -> Vec<String> {
    desired
        .iter()
        .filter_map(|(filter, requested)| match answered.get(filter) {
            None => Some(format!("no SUBACK outcome for \"{filter}\"")),
            Some(SubscribeOutcome::Refused { reason_code }) => Some(format!(
                "\"{filter}\" refused with reason 0x{reason_code:02x}"
            )),
            Some(SubscribeOutcome::Granted { qos }) if qos < requested => Some(format!(
                "\"{filter}\" granted QoS {qos}, below the requested {requested}"
            )),
            Some(SubscribeOutcome::Granted { .. }) => None,
        })
        .collect()
}
