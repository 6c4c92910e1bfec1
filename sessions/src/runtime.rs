//! A managed session's runtime: supervision around one reconcile run at a time.
//!
//! Each run loads the exact history strongly from the ledger before it connects (fail closed:
//! an unknown history or a store error never connects), builds the domain's [`Reconciler`],
//! and drives it over one connection after another (`run.rs`). A run that fails (a refused
//! SUBACK, a lost connection, a failed ledger write, a failed handler) ends; supervision waits
//! with a capped exponential backoff (1s doubling to 30s) and starts a new run from the ledger.
//! A migration-required session stays disconnected; it only rereads its ledger (every
//! `retry_cap`) until the operator records the resolution (`wharf sessions resolve-migration`).
//!
//! The status (level, why it is below Full, the last reconcile outcome) is published on a
//! watch channel for readiness, the REST API and tests.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use wharf_domain::lease::LeaseTiming;
use wharf_domain::session::{Reconciler, SessionLevel, SessionMode};
use wharf_domain::DeclarerId;

use super::ingest::MqttHandler;
use super::run::{Outcome, Run};
use super::SessionLedger;
use crate::config::ResolvedSession;

/// What a session runtime needs beside its session.
#[derive(Clone)]
pub struct RuntimeSettings {
    /// `mqtt.unmatched_grace`.
    pub unmatched_grace: Duration,
    /// `mqtt.connect_timeout`.
    pub connect_timeout: Duration,
    /// `mqtt.subscribe_timeout`.
    pub subscribe_timeout: Duration,
    /// `mqtt.ingest_batch`.
    pub ingest_batch: usize,
    /// `mqtt.ingest_batch_bytes`.
    pub ingest_batch_bytes: usize,
    /// The password, resolved from the configuration (never logged).
    pub password: Option<String>,
    /// The first retry's wait; doubled per failed run up to `retry_cap`.
    pub retry_base: Duration,
    /// The longest wait between runs.
    pub retry_cap: Duration,
    /// The deadline of every ledger call (a store that does not answer fails the run).
    pub store_deadline: Duration,
    /// TLS for `mqtts://` brokers, its files read when the runtime was set up.
    pub tls: Option<wharf_mqtt::TlsOptions>,
    /// The HA lease timing (exclusive sessions only).
    pub lease: LeaseTiming,
    /// The process an exclusive session's lease holder names (each runtime holds as this
    /// identity plus `:sN`, so two runtimes of one process never share a claim).
    pub process: DeclarerId,
}

impl RuntimeSettings {
    /// Whether an ingest batch of `deliveries` holding `bytes` of payload is full: at
    /// `mqtt.ingest_batch` deliveries, or once its payloads reached `mqtt.ingest_batch_bytes`.
    pub(super) fn ingest_batch_full(&self, deliveries: usize, bytes: usize) -> bool {
        deliveries >= self.ingest_batch.max(1) || bytes >= self.ingest_batch_bytes
    }
}

/// The outcome of the newest reconcile attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReconcileOutcome {
    /// True once every desired filter was granted and the history matched.
    pub converged: bool,
    /// What happened, for people.
    pub detail: String,
}

/// A session's state as its runtime reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SessionStatus {
    /// The session's configured name.
    pub name: String,
    /// Its durable identity.
    pub session_id: String,
    /// The identity, for people (no credentials).
    pub identity: String,
    /// The readiness level; only `full` is ready.
    pub level: SessionLevel,
    /// Why it is below Full, when it is.
    pub reason: Option<String>,
    /// The newest connection's generation.
    pub generation: Option<u64>,
    /// History filters not desired, awaiting removal.
    pub pending_stale: Vec<String>,
    /// The newest reconcile attempt's outcome.
    pub last_reconcile: Option<ReconcileOutcome>,
    /// Messages handed to the handler and acked to the broker after it succeeded.
    pub ingested: u64,
    /// Deliveries held unacked (coverage-protected or replays after a removal).
    pub held: u64,
    /// Deliveries that matched no filter and were acked and dropped past `unmatched_grace`.
    pub dropped_unmatched: u64,
    /// The HA lease of an exclusive session (None for other modes).
    pub lease: Option<LeaseView>,
}

impl SessionStatus {
    /// An exclusive session standing by: another process holds its lease (this process has
    /// nothing to converge and is doing its part).
    pub fn stands_by(&self) -> bool {
        self.lease
            .as_ref()
            .is_some_and(|l| !l.held && l.holder.is_some())
    }
}

/// An exclusive session's HA lease as this process sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeaseView {
    /// True while this process holds the lease (and may act on the session).
    pub held: bool,
    /// The holder this process last saw (itself when `held`), if any.
    pub holder: Option<String>,
    /// That holder's fencing token.
    pub token: Option<u64>,
    /// When that ownership lapses unless renewed, by the store's clock.
    pub expires_at: Option<chrono::DateTime<chrono::Utc>>,
    /// How many times this runtime became or stopped being the holder.
    pub transitions: u64,
}

/// A running session; dropping it does not stop it: call [`SessionRuntime::shutdown`].
pub struct SessionRuntime {
    status: watch::Receiver<SessionStatus>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl SessionRuntime {
    /// Starts supervising `session`.
    pub fn start(
        session: ResolvedSession,
        settings: RuntimeSettings,
        ledger: SessionLedger,
        handler: Arc<dyn MqttHandler>,
    ) -> Self {
        let initial = SessionStatus {
            name: session.name.clone(),
            session_id: session.identity.id().to_owned(),
            identity: session.identity.describe(),
            level: SessionLevel::Starting,
            reason: Some("starting".to_owned()),
            generation: None,
            pending_stale: Vec::new(),
            last_reconcile: None,
            ingested: 0,
            held: 0,
            dropped_unmatched: 0,
            lease: None,
        };
        let (status_tx, status) = watch::channel(initial);
        let (stop, stop_rx) = watch::channel(false);
        let span = tracing::info_span!("mqtt_session", session = %session.name,
            session_id = %session.identity.id());
        let task = tokio::spawn(tracing::Instrument::instrument(
            supervise(session, settings, ledger, handler, status_tx, stop_rx),
            span,
        ));
        Self { status, stop, task }
    }

    /// The newest status.
    pub fn status(&self) -> SessionStatus {
        self.status.borrow().clone()
    }

    /// A receiver of every status change.
    pub fn watch(&self) -> watch::Receiver<SessionStatus> {
        self.status.clone()
    }

    /// Stops the session: disconnects (unacked deliveries stay with the broker) and waits.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }

    /// Stops the session as [`shutdown`](Self::shutdown) does, waiting at most `drain`; past
    /// it the runtime's task is aborted (its connection dropped; an exclusive session's lease,
    /// not released, expires by its TTL while the fence refuses anything it had in flight).
    /// Returns false when it had to abort.
    pub async fn shutdown_within(mut self, drain: std::time::Duration) -> bool {
        let _ = self.stop.send(true);
        if tokio::time::timeout(drain, &mut self.task).await.is_ok() {
            return true;
        }
        self.task.abort();
        let _ = self.task.await;
        false
    }
}

async fn supervise(
    session: ResolvedSession,
    settings: RuntimeSettings,
    ledger: SessionLedger,
    handler: Arc<dyn MqttHandler>,
    status: watch::Sender<SessionStatus>,
    mut stop: watch::Receiver<bool>,
) {
    if session.identity.mode() == SessionMode::Exclusive {
        let leases = ledger.leases();
        let exclusive = super::exclusive::Exclusive {
            session: &session,
            settings: &settings,
            ledger: &ledger,
            leases: &leases,
            handler: &handler,
            status: &status,
            holder: super::exclusive::next_holder(&settings.process),
        };
        return exclusive.supervise(stop).await;
    }
    let mut wait = settings.retry_base;
    loop {
        if *stop.borrow() {
            return;
        }
        let run = Run::new(&session, &settings, &ledger, handler.as_ref(), &status);
        match run.execute(&mut stop).await {
            Outcome::Stopped => return,
            Outcome::Terminal => {
                tracing::error!(
                    "the session requires a managed-filter migration; it stays disconnected \
                     until `wharf sessions resolve-migration` records the operator's procedure \
                     (docs/runbooks/managed-filter-migration.md)"
                );
                // Only the ledger is read again (no connection) until the resolution lands.
                wait = settings.retry_cap;
            }
            Outcome::Retry { reason, converged } => {
                if converged {
                    wait = settings.retry_base;
                }
                tracing::warn!(%reason, retry_in = ?wait, "the session run ended; retrying");
                status.send_modify(|s| {
                    s.level = SessionLevel::Starting;
                    s.reason = Some(reason);
                });
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(|stopped| *stopped) => return,
        }
        wait = (wait * 2).min(settings.retry_cap);
    }
}

/// Why a session at `level` is below Full, as its status says (None at Full).
pub(super) fn level_reason(level: SessionLevel, machine: &Reconciler) -> Option<String> {
    match level {
        SessionLevel::Full => None,
        // The machine is terminal by the time its actions are carried out: its reason, not a
        // placeholder until the ledger write lands.
        SessionLevel::MigrationRequired => machine.last_failure().map(str::to_owned),
        SessionLevel::Subscribed if !machine.pending_stale().is_empty() => {
            Some("stale filters await removal".to_owned())
        }
        other => Some(format!("reconciling ({other})")),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use wharf_domain::session::{
        Action, ExactFilter, FilterRecord, Input, ReconcileSettings, Reconciler,
    };

    use super::*;

    /// A machine that removed `$share/g/a/#` and then saw its replay: terminal.
    fn migrated() -> (Reconciler, Vec<Action>) {
        let shared = ExactFilter::parse_field("filter", "$share/g/a/#").expect("valid");
        let history = BTreeMap::from([(shared.clone(), FilterRecord::default())]);
        let settings = ReconcileSettings::new(Duration::from_secs(1));
        let mut machine = Reconciler::new(Vec::new(), history, settings).expect("valid");
        let at = Duration::ZERO;
        let feed = |machine: &mut Reconciler, input| machine.handle(input, at);
        feed(
            &mut machine,
            Input::Connected {
                generation: 1,
                session_present: true,
            },
        );
        let unsuback = Input::UnsubAck {
            generation: 1,
            outcomes: vec![(shared, 0)],
        };
        feed(&mut machine, unsuback);
        feed(&mut machine, Input::Disconnected { generation: 1 });
        feed(
            &mut machine,
            Input::Connected {
                generation: 2,
                session_present: true,
            },
        );
        let replay = Input::Delivery {
            id: 1,
            generation: 2,
            topic: "a/x".to_owned(),
            dup: true,
            subscription_ids: Vec::new(),
        };
        let actions = feed(&mut machine, replay);
        (machine, actions)
    }

    #[test]
    fn a_migration_required_session_gives_the_migration_reason() {
        let (machine, actions) = migrated();
        assert!(actions.contains(&Action::Level(SessionLevel::MigrationRequired)));
        let reason = level_reason(SessionLevel::MigrationRequired, &machine).expect("a reason");
        assert!(reason.contains("$share/g/a/#"), "{reason}");
        assert_eq!(Some(reason.as_str()), machine.last_failure());
    }
}
