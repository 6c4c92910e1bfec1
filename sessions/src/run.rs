//! One reconcile run: load the history, then drive the domain's [`Reconciler`] over one
//! connection after another (a recycle opens the next one) until the run ends.
//!
//! The run is the only I/O around the machine: it feeds [`Input`]s with the time of a
//! monotonic clock (tokio's, so tests can pause it) and carries out each [`Action`] in order.
//! Ledger writes happen before the broker operations they protect (a wave's Remember before
//! its SUBSCRIBE, Forget only after a verified UNSUBACK and the recycle's watch window), and
//! one at a time: a SUBSCRIBE goes out in a background task so the next wave's Remember is
//! written while the broker answers, and its outcomes are recorded on the loop, with whatever
//! other answers are in, before the machine hears of them (ADR 0041). Any failure ends the
//! run; the next one starts again from the ledger, which is what makes a crash at any step
//! safe. Acks go only to the connection that received the delivery, and only after the handler
//! succeeded (the driver refuses any other ack). A connection that reaches Full still holding
//! deliveries (replays only a since-forgotten filter covered) is recycled once, so their
//! receive-maximum slots do not stay taken: the broker redelivers them to the next one.

use std::collections::{BTreeMap, VecDeque};

use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;
use wharf_domain::session::{
    Action, ExactFilter, FilterRecord, Input, Qos, ReconcileSettings, Reconciler, SessionLevel,
    SubscribeOutcome,
};
use wharf_mqtt::{
    ConnectOptions, Credentials, Deliveries, Delivery, DisconnectReason, Session, SessionHandle,
};

use super::ingest::MqttHandler;
use super::settings::RuntimeSettings;
use super::status::{level_reason, ReconcileOutcome, SessionStatus};
use super::SessionLedger;
use crate::config::ResolvedSession;

mod deliveries;

/// How a run ended.
pub(super) enum Outcome {
    /// Shutdown was requested.
    Stopped,
    /// Migration required: stay down.
    Terminal,
    /// Start a new run after a backoff; `converged` when this one had reached Full.
    Retry { reason: String, converged: bool },
}

/// One connection of a run.
struct Connection {
    handle: SessionHandle,
    deliveries: Deliveries,
}

impl Connection {
    fn generation(&self) -> u64 {
        self.handle.generation().0
    }
}

pub(super) struct Run<'a> {
    session: &'a ResolvedSession,
    settings: &'a RuntimeSettings,
    ledger: &'a SessionLedger,
    handler: &'a dyn MqttHandler,
    status: &'a watch::Sender<SessionStatus>,
    started: Instant,
    inputs: VecDeque<Input>,
    /// Deliveries the machine has not settled yet, by the run's id for them.
    parked: BTreeMap<u64, Delivery>,
    /// Deliveries dispatched and not yet handed to the handler, in order.
    batch: Vec<(u64, Delivery)>,
    /// Deliveries held (never acked) on the current connection: each keeps a receive-maximum
    /// slot at the broker until the connection ends.
    held: usize,
    next_id: u64,
    converged: bool,
    /// Subscribe actions the broker is answering (aborted when the run ends).
    subscribing: JoinSet<SubscribeAnswers>,
}

/// A Subscribe action's answers: its connection, its filters and one answer each (none where
/// the broker gave none).
struct SubscribeAnswers {
    generation: u64,
    filters: Vec<(ExactFilter, Qos)>,
    answers: Vec<Option<SubscribeOutcome>>,
}

/// What carrying out one action asks of the loop.
enum Step {
    Continue,
    End(Outcome),
}

impl<'a> Run<'a> {
    pub(super) fn new(
        session: &'a ResolvedSession,
        settings: &'a RuntimeSettings,
        ledger: &'a SessionLedger,
        handler: &'a dyn MqttHandler,
        status: &'a watch::Sender<SessionStatus>,
    ) -> Self {
        Self {
            session,
            settings,
            ledger,
            handler,
            status,
            started: Instant::now(),
            inputs: VecDeque::new(),
            parked: BTreeMap::new(),
            batch: Vec::new(),
            held: 0,
            next_id: 0,
            converged: false,
            subscribing: JoinSet::new(),
        }
    }

    fn retry(&self, reason: impl Into<String>) -> Outcome {
        Outcome::Retry {
            reason: reason.into(),
            converged: self.converged,
        }
    }

    /// Runs until shutdown, a terminal state, or a failure.
    pub(super) async fn execute(mut self, stop: &mut watch::Receiver<bool>) -> Outcome {
        let history = match self.load_history().await {
            Ok(history) => history,
            Err(outcome) => return outcome,
        };
        let settings = ReconcileSettings::new(self.settings.unmatched_grace);
        let mut machine = match Reconciler::new(self.session.desired(), history, settings) {
            Ok(machine) => machine,
            Err(e) => return self.retry(e.to_string()),
        };
        let mut connection = match self.connect().await {
            Ok(connection) => connection,
            Err(reason) => return self.retry(reason),
        };
        loop {
            let step = self.drain(&mut machine, &mut connection).await;
            // Published on every path: a run that ends here must not leave a stale list.
            self.publish_machine(&machine);
            if let Step::End(outcome) = step {
                disconnect(&connection, DisconnectReason::Normal).await;
                return outcome;
            }
            let deadline = machine
                .next_deadline()
                .map(|at| self.started + at)
                .unwrap_or_else(|| Instant::now() + std::time::Duration::from_secs(3600));
            tokio::select! {
                _ = async { stop.wait_for(|stopped| *stopped).await.map(|_| ()) } => {
                    disconnect(&connection, DisconnectReason::Normal).await;
                    return Outcome::Stopped;
                }
                received = connection.deliveries.next() => match received {
                    Ok(delivery) => self.receive(delivery, &mut connection),
                    Err(cause) => {
                        // Nothing of this connection can be acked any more: what it delivered
                        // and nobody acked is the broker's to replay, so none of it is handled
                        // now (that would only add duplicates).
                        self.parked.clear();
                        self.batch.clear();
                        self.inputs.push_back(Input::Disconnected {
                            generation: connection.generation(),
                        });
                        let _ = self.drain(&mut machine, &mut connection).await;
                        self.publish_machine(&machine);
                        return self.retry(format!("the connection ended: {cause}"));
                    }
                },
                Some(answered) = self.subscribing.join_next(), if !self.subscribing.is_empty() => {
                    if let Step::End(outcome) = self.record_answers(answered).await {
                        self.publish_machine(&machine);
                        disconnect(&connection, DisconnectReason::Normal).await;
                        return outcome;
                    }
                }
                _ = tokio::time::sleep_until(deadline) => self.inputs.push_back(Input::Tick),
            }
        }
    }

    /// The exact history, loaded strongly; an unknown history or a store failure ends the run
    /// before anything connects. Ephemeral sessions keep nothing at the broker: empty.
    async fn load_history(&self) -> Result<BTreeMap<ExactFilter, FilterRecord>, Outcome> {
        if !self.session.is_durable() {
            return Ok(BTreeMap::new());
        }
        let id = self.session.identity.id();
        let loaded = tokio::time::timeout(self.settings.store_deadline, self.ledger.load(id)).await;
        let state = match loaded {
            Ok(Ok(state)) => state,
            Ok(Err(e)) => {
                return Err(self.retry(format!(
                    "cannot load the managed-filter history ({e}); not connecting (fail closed)"
                )))
            }
            Err(_) => {
                return Err(self.retry(format!(
                    "the store did not answer within {:?} loading the managed-filter history; \
                     not connecting (fail closed)",
                    self.settings.store_deadline
                )))
            }
        };
        if let Some(reason) = state.migration_required {
            self.status.send_modify(|s| {
                s.level = SessionLevel::MigrationRequired;
                s.reason = Some(reason);
            });
            return Err(Outcome::Terminal);
        }
        state.history.ok_or_else(|| {
            let name = &self.session.name;
            self.retry(format!(
                "the managed-filter history of {name} ({id}) is unknown: its broker session may \
                 hold filters no one recorded. Seed it with `wharf sessions seed '{name}=FILTER,...'` \
                 (the exact filters it holds) or `wharf sessions seed {name}` (explicitly empty, \
                 only when it holds none); not connecting until then"
            ))
        })
    }

    async fn connect(&mut self) -> Result<Connection, String> {
        let broker = &self.session.brokers[0];
        let mut options = ConnectOptions::new(
            broker.host.trim_matches(|c| c == '[' || c == ']'),
            broker.port,
            self.session.client_id.clone(),
        );
        options.clean_start = self.session.clean_start;
        options.session_expiry = self.session.session_expiry_secs;
        options.keep_alive = u16::try_from(self.session.keep_alive.as_secs()).unwrap_or(u16::MAX);
        options.connect_timeout = self.settings.connect_timeout;
        options.operation_timeout = self.settings.subscribe_timeout;
        // The log keeps payloads of up to 8 MiB: the broker discards larger packets for us.
        options.max_packet_size = 8 * 1024 * 1024 + 64 * 1024;
        options.tls = self.settings.tls.clone();
        options.credentials = match (&self.session.username, &self.settings.password) {
            (Some(user), Some(password)) => Some(Credentials::new(user.clone(), password.clone())),
            (Some(user), None) => Some(Credentials::username_only(user.clone())),
            (None, _) => None,
        };
        let (handle, deliveries) = Session::connect(options)
            .await
            .map_err(|e| format!("connecting to {} failed: {e}", broker.url()))?;
        let generation = handle.generation().0;
        self.inputs.push_back(Input::Connected {
            generation,
            session_present: handle.connack().session_present,
        });
        self.status.send_modify(|s| s.generation = Some(generation));
        tracing::info!(
            generation,
            session_present = handle.connack().session_present,
            "connected"
        );
        Ok(Connection { handle, deliveries })
    }

    /// Feeds every queued input and carries out what the machine answers, then hands the
    /// dispatched batch to the handler.
    async fn drain(&mut self, machine: &mut Reconciler, connection: &mut Connection) -> Step {
        while let Some(input) = self.inputs.pop_front() {
            let now = self.started.elapsed();
            for action in machine.handle(input, now) {
                if let Step::End(outcome) = self.carry_out(action, machine, connection).await {
                    return Step::End(outcome);
                }
            }
        }
        self.flush(connection).await
    }

    async fn carry_out(
        &mut self,
        action: Action,
        machine: &Reconciler,
        connection: &mut Connection,
    ) -> Step {
        match action {
            Action::Remember(filters) => self.remember(filters).await,
            Action::Subscribe(filters) => {
                self.start_subscribe(filters, connection);
                Step::Continue
            }
            Action::Unsubscribe(filters) => self.unsubscribe(filters, connection).await,
            Action::Forget(filters) => self.forget(filters).await,
            Action::Recycle => self.recycle(connection).await,
            Action::Dispatch { id } => {
                if let Some(delivery) = self.parked.remove(&id) {
                    self.batch.push((id, delivery));
                }
                Step::Continue
            }
            Action::Hold { id } => {
                if self.parked.contains_key(&id) {
                    self.held += 1;
                    self.status.send_modify(|s| s.held += 1);
                }
                Step::Continue
            }
            Action::AckUnmatched { id } => {
                if let Some(delivery) = self.parked.remove(&id) {
                    tracing::warn!(topic = %delivery.topic,
                        "a delivery matched no filter past mqtt.unmatched_grace: acked and dropped");
                    connection.handle.ack(&delivery).await;
                    self.status.send_modify(|s| s.dropped_unmatched += 1);
                }
                Step::Continue
            }
            Action::Disconnect => {
                disconnect(connection, DisconnectReason::Normal).await;
                Step::Continue
            }
            Action::RequireMigration { reason, filters } => {
                self.require_migration(reason, filters).await
            }
            Action::Failed { reason } => {
                self.record_reconcile(false, &reason);
                Step::End(self.retry(format!("the reconcile failed: {reason}")))
            }
            Action::Level(level) => {
                self.on_level(level, machine);
                if level == SessionLevel::Full && self.held > 0 {
                    // Only filters already forgotten covered them: held here, they would keep
                    // their slots for as long as this connection lives (enough of them stall
                    // the session at Full). A new connection gets them again, matching nothing.
                    tracing::info!(
                        held = self.held,
                        "held deliveries at Full: reconnecting so the broker redelivers them"
                    );
                    return self.recycle(connection).await;
                }
                Step::Continue
            }
        }
    }

    fn on_level(&mut self, level: SessionLevel, machine: &Reconciler) {
        if level == SessionLevel::Full {
            self.converged = true;
            self.record_reconcile(true, "every desired filter granted; history equals desired");
        }
        let reason = level_reason(level, machine);
        tracing::info!(%level, "session level");
        let pending = pending_strings(machine);
        self.status.send_modify(|s| {
            s.level = level;
            s.reason = reason;
            s.pending_stale = pending;
        });
    }

    fn record_reconcile(&self, converged: bool, detail: &str) {
        self.status.send_modify(|s| {
            s.last_reconcile = Some(ReconcileOutcome {
                converged,
                detail: detail.to_owned(),
            });
        });
    }

    fn publish_machine(&self, machine: &Reconciler) {
        let pending = pending_strings(machine);
        self.status.send_if_modified(|s| {
            let changed = s.pending_stale != pending;
            s.pending_stale.clone_from(&pending);
            changed
        });
    }

    /// One ledger write about `filters` filters, under the store deadline per
    /// [`FILTERS_PER_DEADLINE`] of them: a write grows with the reconcile, and a deadline that
    /// did not would fail the same large write on every retry, so the session never converged.
    async fn ledger_call<T>(
        &self,
        what: &str,
        filters: usize,
        call: impl std::future::Future<Output = Result<T, crate::SessionError>>,
    ) -> Result<T, Outcome> {
        let deadline = write_deadline(self.settings.store_deadline, filters);
        match tokio::time::timeout(deadline, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(self.retry(format!("the ledger refused {what}: {e}"))),
            Err(_) => Err(self.retry(format!(
                "the store did not answer {what} ({filters} filter(s)) within {deadline:?}"
            ))),
        }
    }

    async fn remember(&mut self, filters: Vec<(ExactFilter, Qos)>) -> Step {
        if self.session.is_durable() {
            let id = self.session.identity.id();
            if let Err(outcome) = self
                .ledger_call("Remember", filters.len(), self.ledger.remember(id, filters))
                .await
            {
                return Step::End(outcome);
            }
        }
        self.inputs.push_back(Input::Remembered);
        Step::Continue
    }

    /// Sends a Subscribe action's SUBSCRIBEs in the background: the loop goes on (the next
    /// wave's Remember, deliveries) while the broker answers; [`Run::record_answers`] takes the
    /// answers when they are in.
    fn start_subscribe(&mut self, filters: Vec<(ExactFilter, Qos)>, connection: &Connection) {
        let handle = connection.handle.clone();
        let generation = connection.generation();
        self.subscribing.spawn(async move {
            let answers = super::subscribe::subscribe_all(&handle, &filters).await;
            SubscribeAnswers {
                generation,
                filters,
                answers,
            }
        });
    }

    /// Takes `first` and every other Subscribe action already answered, records their
    /// outcomes in one ledger write (durable sessions), then tells the machine, one
    /// [`Input::SubAck`] per action: a level the machine reaches on them is reported only once
    /// the outcomes are in the ledger.
    async fn record_answers(
        &mut self,
        first: Result<SubscribeAnswers, tokio::task::JoinError>,
    ) -> Step {
        let mut joined = vec![first];
        while let Some(more) = self.subscribing.try_join_next() {
            joined.push(more);
        }
        let mut recorded = Vec::new();
        let mut inputs = Vec::with_capacity(joined.len());
        for answered in joined {
            let answered = match answered {
                Ok(answered) => answered,
                Err(e) => return Step::End(self.retry(format!("a SUBSCRIBE task failed: {e}"))),
            };
            let mut outcomes = Vec::new();
            for ((filter, qos), answer) in answered.filters.into_iter().zip(answered.answers) {
                if let Some(outcome) = answer {
                    recorded.push((filter.clone(), qos, outcome));
                    outcomes.push((filter, outcome));
                }
            }
            inputs.push(Input::SubAck {
                generation: answered.generation,
                outcomes,
            });
        }
        if self.session.is_durable() && !recorded.is_empty() {
            let id = self.session.identity.id();
            if let Err(outcome) = self
                .ledger_call(
                    "the SUBACK outcomes",
                    recorded.len(),
                    self.ledger.record_suback(id, recorded),
                )
                .await
            {
                return Step::End(outcome);
            }
        }
        self.inputs.extend(inputs);
        Step::Continue
    }

    async fn unsubscribe(&mut self, filters: Vec<ExactFilter>, connection: &Connection) -> Step {
        let strings = filters.iter().map(|f| f.as_str().to_owned()).collect();
        let reasons = match connection.handle.unsubscribe(strings).await {
            Ok(reasons) => reasons,
            Err(e) => {
                tracing::warn!(error = %e, "UNSUBSCRIBE failed; the filters stay in the history");
                Vec::new()
            }
        };
        let outcomes = filters
            .into_iter()
            .zip(reasons)
            .map(|(filter, reason)| (filter, reason.code()))
            .collect();
        self.inputs.push_back(Input::UnsubAck {
            generation: connection.generation(),
            outcomes,
        });
        Step::Continue
    }

    async fn forget(&mut self, filters: Vec<(ExactFilter, u8)>) -> Step {
        if self.session.is_durable() {
            let id = self.session.identity.id();
            if let Err(outcome) = self
                .ledger_call("Forget", filters.len(), self.ledger.forget(id, filters))
                .await
            {
                return Step::End(outcome);
            }
        }
        self.inputs.push_back(Input::Forgotten);
        Step::Continue
    }

    async fn recycle(&mut self, connection: &mut Connection) -> Step {
        let old = connection.generation();
        disconnect(connection, DisconnectReason::Normal).await;
        // What the old connection delivered and nobody acked is the broker's to replay.
        self.parked.clear();
        self.batch.clear();
        self.held = 0;
        self.inputs
            .push_back(Input::Disconnected { generation: old });
        match self.connect().await {
            Ok(next) => {
                *connection = next;
                Step::Continue
            }
            Err(reason) => Step::End(self.retry(reason)),
        }
    }

    async fn require_migration(&mut self, reason: String, filters: Vec<ExactFilter>) -> Step {
        let id = self.session.identity.id();
        let written = self
            .ledger_call(
                "MigrationRequired",
                filters.len(),
                self.ledger.require_migration(id, reason.clone(), filters),
            )
            .await;
        self.status.send_modify(|s| {
            s.level = SessionLevel::MigrationRequired;
            s.reason = Some(reason.clone());
        });
        match written {
            Ok(_) => Step::End(Outcome::Terminal),
            // Not recorded: the next run sees the same replay again and decides the same.
            Err(outcome) => Step::End(outcome),
        }
    }
}

/// How many filters one ledger write may carry per store deadline.
const FILTERS_PER_DEADLINE: usize = 500;

/// The deadline of a ledger write about `filters` filters: `base` per started
/// [`FILTERS_PER_DEADLINE`].
fn write_deadline(base: std::time::Duration, filters: usize) -> std::time::Duration {
    let units = filters.div_ceil(FILTERS_PER_DEADLINE).max(1);
    base.saturating_mul(u32::try_from(units).unwrap_or(u32::MAX))
}

fn pending_strings(machine: &Reconciler) -> Vec<String> {
    machine
        .pending_stale()
        .iter()
        .map(|f| f.as_str().to_owned())
        .collect()
}

async fn disconnect(connection: &Connection, reason: DisconnectReason) {
    if connection.handle.disconnected().is_none() {
        let _ = connection.handle.disconnect(reason).await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::write_deadline;

    #[test]
    fn a_write_gets_the_deadline_per_started_500_filters() {
        let base = Duration::from_millis(300);
        assert_eq!(write_deadline(base, 0), base);
        assert_eq!(write_deadline(base, 500), base);
        assert_eq!(write_deadline(base, 501), base * 2);
        assert_eq!(write_deadline(base, 3000), base * 6);
    }
}
