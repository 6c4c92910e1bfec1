//! The managed-filter ledger as the library writes it: each command is one locked attempt on
//! the session's stream (fold its events, decide with the domain, append what it returns).
//!
//! Loads are strong (the ledger itself, by the session's durable identity) and fail closed:
//! a store error is an error, never an empty history.
//!
//! A ledger handle keeps each session's folded state as of a sequence (in memory, per process),
//! so a command reads only the events appended since, not the whole stream again: a SUBACK
//! record after a Remember of 10,000 filters would otherwise read that Remember back and decode
//! it under the lock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cqrs_es::Aggregate;
use serde_json::json;
use wharf_domain::session::{
    ExactFilter, ManagedFilterEvent, ManagedSession, ManagedSessionCommand, ManagedSessionError,
    Qos, SubscribeOutcome, MANAGED_SESSION_AGGREGATE,
};
use wharf_store::{
    LeaseClaim, NewEvent, RecordedEvent, SessionLock, Snapshot, Store, StoreError, Write,
};

use crate::error::SessionError;

/// A managed session's ledger on a store.
#[derive(Clone)]
pub struct SessionLedger {
    store: Store,
    /// An exclusive session owner's lease claim: every write is fenced by it.
    fence: Option<LeaseClaim>,
    states: SessionStates,
}

/// Why a ledger command did not land.
#[derive(Debug)]
enum Refusal {
    Domain(ManagedSessionError),
    Corrupt(StoreError),
    /// The cached state is ahead of the ledger (it was restored or replaced): drop it, reload.
    Stale,
}

/// Each session's folded state as of a ledger sequence, shared by the clones of one ledger
/// handle (fenced or not). Events never change once appended, so the fold of events `1..=n`
/// stays exact and a command folds into it only the events after `n`, read under the session's
/// lock (whoever appended them: another process, another owner); a ledger whose head is below
/// `n` moved backwards (a restore) and the state is read again in full. A command takes the
/// state out while it runs, so a concurrent command on the same session reads the whole stream.
#[derive(Clone, Default)]
struct SessionStates(Arc<Mutex<HashMap<String, (i64, ManagedSession)>>>);

impl SessionStates {
    fn take(&self, session_id: &str) -> (i64, ManagedSession) {
        self.lock().remove(session_id).unwrap_or_default()
    }

    fn put(&self, session_id: &str, sequence: i64, state: ManagedSession) {
        let mut states = self.lock();
        let newer = states
            .get(session_id)
            .is_none_or(|(held, _)| *held <= sequence);
        if newer {
            states.insert(session_id.to_owned(), (sequence, state));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (i64, ManagedSession)>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// What a landed command hands back: its events, the state after them, and its sequence.
type Landed = (Vec<ManagedFilterEvent>, ManagedSession, i64);

impl SessionLedger {
    /// The ledger on `store`.
    pub fn new(store: Store) -> Self {
        Self {
            store,
            fence: None,
            states: SessionStates::default(),
        }
    }

    /// The HA lease ledger on the same store (exclusive sessions).
    pub fn leases(&self) -> super::LeaseLedger {
        super::LeaseLedger::new(self.store.clone())
    }

    /// The same ledger with every write fenced by `claim` (an exclusive session's owner): a
    /// write is refused with [`SessionError::Fenced`], in its own transaction, once the claim no
    /// longer holds by the store's clock.
    pub fn fenced(&self, claim: LeaseClaim) -> Self {
        Self {
            store: self.store.clone(),
            fence: Some(claim),
            states: self.states.clone(),
        }
    }

    /// The session's state, folded from its whole stream (unknown when never seeded).
    pub async fn load(&self, session_id: &str) -> Result<ManagedSession, SessionError> {
        let events = self
            .store
            .load(MANAGED_SESSION_AGGREGATE, session_id)
            .await?;
        let mut state = ManagedSession::default();
        fold(&mut state, &events)?;
        let sequence = events.last().map_or(0, |e| e.sequence);
        self.states.put(session_id, sequence, state.clone());
        Ok(state)
    }

    /// Seeds a managed session's baseline as an embedding application's composition root
    /// does (the CLI's `wharf sessions seed` writes the same events, with its own source):
    /// `filters` are the exact filters that exist at the broker for `session_id`, possibly
    /// none; each is checked and a bad one is named (`filters`). Idempotent: an established
    /// baseline is kept and the listed filters are added to it. Seed empty only when the broker
    /// session holds no filter: the ledger would otherwise never remove them.
    pub async fn seed_baseline(
        &self,
        session_id: &str,
        filters: &[&str],
    ) -> Result<(), SessionError> {
        let filters = filters
            .iter()
            .map(|f| ExactFilter::parse_field("filters", f))
            .collect::<Result<Vec<_>, _>>()?;
        self.seed(session_id, filters, "builder").await.map(|_| ())
    }

    /// Seeds the baseline (`filters` may be empty) or adds listed filters missing from it.
    /// Idempotent. Returns the events appended (none when everything was already there).
    pub async fn seed(
        &self,
        session_id: &str,
        filters: Vec<ExactFilter>,
        source: &str,
    ) -> Result<Vec<ManagedFilterEvent>, SessionError> {
        let command = ManagedSessionCommand::Seed {
            filters,
            source: source.to_owned(),
        };
        self.run(session_id, command).await
    }

    /// Records filters about to be SUBSCRIBEd. Refused while the history is unknown.
    pub async fn remember(
        &self,
        session_id: &str,
        filters: Vec<(ExactFilter, Qos)>,
    ) -> Result<Vec<ManagedFilterEvent>, SessionError> {
        self.run(session_id, ManagedSessionCommand::Remember { filters })
            .await
    }

    /// Records a SUBACK's outcomes.
    pub async fn record_suback(
        &self,
        session_id: &str,
        outcomes: Vec<(ExactFilter, Qos, SubscribeOutcome)>,
    ) -> Result<Vec<ManagedFilterEvent>, SessionError> {
        self.run(session_id, ManagedSessionCommand::RecordSubAck { outcomes })
            .await
    }

    /// Removes filters an UNSUBACK proved gone (0x00 or 0x11) and a recycle verified.
    pub async fn forget(
        &self,
        session_id: &str,
        filters: Vec<(ExactFilter, u8)>,
    ) -> Result<Vec<ManagedFilterEvent>, SessionError> {
        self.run(session_id, ManagedSessionCommand::Forget { filters })
            .await
    }

    /// Leaves the migration-required state: the operator restored the old configuration and
    /// drained what the removed filter had pinned (runbook `managed-filter-migration.md`).
    pub async fn resolve_migration(
        &self,
        session_id: &str,
        source: &str,
    ) -> Result<Vec<ManagedFilterEvent>, SessionError> {
        let command = ManagedSessionCommand::ResolveMigration {
            source: source.to_owned(),
        };
        self.run(session_id, command).await
    }

    /// Enters the terminal migration-required state (the history is kept).
    pub async fn require_migration(
        &self,
        session_id: &str,
        reason: String,
        filters: Vec<ExactFilter>,
    ) -> Result<Vec<ManagedFilterEvent>, SessionError> {
        self.run(
            session_id,
            ManagedSessionCommand::RequireMigration { reason, filters },
        )
        .await
    }

    async fn run(
        &self,
        session_id: &str,
        command: ManagedSessionCommand,
    ) -> Result<Vec<ManagedFilterEvent>, SessionError> {
        // Who wrote it: an exclusive owner's writes name its claim, for the audit.
        let metadata = match &self.fence {
            None => json!({ "wharf_version": env!("CARGO_PKG_VERSION") }),
            Some(claim) => json!({
                "wharf_version": env!("CARGO_PKG_VERSION"),
                "lease_holder": claim.holder,
                "lease_token": claim.token,
            }),
        };
        // Unfenced writes go optimistic first (ADR 0037: on Postgres two round trips where
        // the locked form takes four); another writer in between is a conflict, and the
        // command runs again locked. A fenced write always runs locked, its guard checked
        // under the lock.
        let mut locked = self.fence.is_some();
        let mut stale = 0;
        while stale < 2 {
            let (after_sequence, state) = self.states.take(session_id);
            let lock = SessionLock {
                stream_type: MANAGED_SESSION_AGGREGATE,
                lock_type: MANAGED_SESSION_AGGREGATE,
                session_id: session_id.to_owned(),
                after_sequence,
                fence: self.fence.clone(),
            };
            let decide = decision(state, command.clone(), metadata.clone());
            let attempt = self.store.attempt(lock, decide, &mut locked).await;
            let decided = match attempt {
                Ok(Some(decided)) => decided,
                Ok(None) => continue,
                Err(StoreError::GuardRefused { reason, .. }) => {
                    return Err(SessionError::Fenced {
                        session_id: session_id.to_owned(),
                        reason,
                    })
                }
                Err(other) => return Err(other.into()),
            };
            match decided {
                Ok((events, state, sequence)) => {
                    self.states.put(session_id, sequence, state);
                    return Ok(events);
                }
                Err(Refusal::Stale) => stale += 1,
                Err(Refusal::Domain(e)) => return Err(SessionError::Session(e)),
                Err(Refusal::Corrupt(e)) => return Err(e.into()),
            }
        }
        Err(StoreError::decode(
            0,
            "the session's ledger moved backwards twice under one command",
        )
        .into())
    }
}

/// The pure closure the locked executor runs: fold the events after the cached state's
/// sequence into it, decide, and say what to append and the state that results.
fn decision(
    mut state: ManagedSession,
    command: ManagedSessionCommand,
    metadata: serde_json::Value,
) -> impl FnOnce(&Snapshot<()>) -> Result<(Write<()>, Landed), Refusal> + Send + 'static {
    move |snapshot| {
        if snapshot.stream_head < snapshot.after_sequence {
            return Err(Refusal::Stale);
        }
        fold(&mut state, &snapshot.events).map_err(Refusal::Corrupt)?;
        let events = state.decide(&command).map_err(Refusal::Domain)?;
        let new = events
            .iter()
            .map(|e| NewEvent::from_domain(e, metadata.clone()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(Refusal::Corrupt)?;
        let sequence = snapshot.last_sequence() + events.len() as i64;
        for event in &events {
            state.apply(event.clone());
        }
        Ok((Write::events(new), (events, state, sequence)))
    }
}

/// Folds stored events into the session's state.
fn fold(state: &mut ManagedSession, events: &[RecordedEvent]) -> Result<(), StoreError> {
    for event in events {
        let decoded = ManagedFilterEvent::decode(&event.event_type, event.payload.get())
            .map_err(|e| StoreError::decode(event.position, e))?;
        state.apply(decoded);
    }
    Ok(())
}
