//! The managed-filter ledger as the library writes it: each command is one locked attempt on
//! the session's stream (fold its events, decide with the domain, append what it returns).
//!
//! Loads are strong (the ledger itself, by the session's durable identity) and fail closed:
//! a store error is an error, never an empty history.

use serde_json::json;
use wharf_domain::session::{
    ExactFilter, ManagedFilterEvent, ManagedSession, ManagedSessionCommand, ManagedSessionError,
    Qos, SubscribeOutcome, MANAGED_SESSION_AGGREGATE,
};
use wharf_store::{LeaseClaim, NewEvent, RecordedEvent, SessionLock, Store, StoreError, Write};

use crate::error::WharfError;

/// A managed session's ledger on a store.
#[derive(Clone)]
pub struct SessionLedger {
    store: Store,
    /// An exclusive session owner's lease claim: every write is fenced by it.
    fence: Option<LeaseClaim>,
}

/// Why a ledger command did not land.
#[derive(Debug)]
enum Refusal {
    Domain(ManagedSessionError),
    Corrupt(StoreError),
}

impl SessionLedger {
    /// The ledger on `store`.
    pub fn new(store: Store) -> Self {
        Self { store, fence: None }
    }

    /// The HA lease ledger on the same store (exclusive sessions).
    pub fn leases(&self) -> super::LeaseLedger {
        super::LeaseLedger::new(self.store.clone())
    }

    /// The same ledger with every write fenced by `claim` (an exclusive session's owner): a
    /// write is refused with [`WharfError::Fenced`], in its own transaction, once the claim no
    /// longer holds by the store's clock.
    pub fn fenced(&self, claim: LeaseClaim) -> Self {
        Self {
            store: self.store.clone(),
            fence: Some(claim),
        }
    }

    /// The session's state, folded from its whole stream (unknown when never seeded).
    pub async fn load(&self, session_id: &str) -> Result<ManagedSession, WharfError> {
        let events = self
            .store
            .load(MANAGED_SESSION_AGGREGATE, session_id)
            .await?;
        Ok(fold(&events)?)
    }

    /// Seeds the baseline (`filters` may be empty) or adds listed filters missing from it.
    /// Idempotent. Returns the events appended (none when everything was already there).
    pub async fn seed(
        &self,
        session_id: &str,
        filters: Vec<ExactFilter>,
        source: &str,
    ) -> Result<Vec<ManagedFilterEvent>, WharfError> {
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
    ) -> Result<Vec<ManagedFilterEvent>, WharfError> {
        self.run(session_id, ManagedSessionCommand::Remember { filters })
            .await
    }

    /// Records a SUBACK's outcomes.
    pub async fn record_suback(
        &self,
        session_id: &str,
        outcomes: Vec<(ExactFilter, Qos, SubscribeOutcome)>,
    ) -> Result<Vec<ManagedFilterEvent>, WharfError> {
        self.run(session_id, ManagedSessionCommand::RecordSubAck { outcomes })
            .await
    }

    /// Removes filters an UNSUBACK proved gone (0x00 or 0x11) and a recycle verified.
    pub async fn forget(
        &self,
        session_id: &str,
        filters: Vec<(ExactFilter, u8)>,
    ) -> Result<Vec<ManagedFilterEvent>, WharfError> {
        self.run(session_id, ManagedSessionCommand::Forget { filters })
            .await
    }

    /// Leaves the migration-required state: the operator restored the old configuration and
    /// drained what the removed filter had pinned (runbook `managed-filter-migration.md`).
    pub async fn resolve_migration(
        &self,
        session_id: &str,
        source: &str,
    ) -> Result<Vec<ManagedFilterEvent>, WharfError> {
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
    ) -> Result<Vec<ManagedFilterEvent>, WharfError> {
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
    ) -> Result<Vec<ManagedFilterEvent>, WharfError> {
        let lock = SessionLock {
            stream_type: MANAGED_SESSION_AGGREGATE,
            lock_type: MANAGED_SESSION_AGGREGATE,
            session_id: session_id.to_owned(),
            after_sequence: 0,
            fence: self.fence.clone(),
        };
        // Who wrote it: an exclusive owner's writes name its claim, for the audit.
        let metadata = match &self.fence {
            None => json!({ "wharf_version": env!("CARGO_PKG_VERSION") }),
            Some(claim) => json!({
                "wharf_version": env!("CARGO_PKG_VERSION"),
                "lease_holder": claim.holder,
                "lease_token": claim.token,
            }),
        };
        let decided = self
            .store
            .execute(lock, move |snapshot| {
                let state = fold(&snapshot.events).map_err(Refusal::Corrupt)?;
                let events = state.decide(&command).map_err(Refusal::Domain)?;
                let metadata = metadata.clone();
                let new = events
                    .iter()
                    .map(|e| NewEvent::from_domain(e, metadata.clone()))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(Refusal::Corrupt)?;
                Ok((Write::events(new), events))
            })
            .await
            .map_err(|e| match e {
                StoreError::GuardRefused { reason, .. } => WharfError::Fenced {
                    session_id: session_id.to_owned(),
                    reason,
                },
                other => other.into(),
            })?;
        match decided {
            Ok(events) => Ok(events),
            Err(Refusal::Domain(e)) => Err(WharfError::Session(e)),
            Err(Refusal::Corrupt(e)) => Err(e.into()),
        }
    }
}

/// Folds stored events into the session's state.
fn fold(events: &[RecordedEvent]) -> Result<ManagedSession, StoreError> {
    let mut decoded = Vec::with_capacity(events.len());
    for event in events {
        decoded.push(
            ManagedFilterEvent::decode(&event.event_type, &event.payload)
                .map_err(|e| StoreError::decode(event.position, e))?,
        );
    }
    Ok(ManagedSession::fold(&decoded))
}
