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

use tokio::sync::watch;
use tokio::task::JoinHandle;
use wharf_domain::session::{SessionLevel, SessionMode};

use super::ingest::MqttHandler;
use super::run::{Outcome, Run};
use super::settings::RuntimeSettings;
use super::status::SessionStatus;
use super::SessionLedger;
use crate::config::ResolvedSession;

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
