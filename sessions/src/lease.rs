//! The HA lease of an exclusive session as the library writes it: each lease command is one
//! locked attempt on the session's `session_lease` stream, judged by the store's clock
//! (ADR 0028, ADR 0030).
//!
//! The attempt takes the session's one lock (the managed-filter ledger's; see
//! `wharf_store::session_lock`), so an ownership change never interleaves with a fenced ledger
//! write. The decision starts from the `session_lease` row (the stream's fold up to its
//! `last_sequence`) and folds only the events after it, so a renew costs the same after a
//! million renews as after one; the state after each command is cached for the next.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use cqrs_es::Aggregate;
use serde_json::json;
use wharf_domain::lease::{
    FencingToken, Lease, LeaseCommand, LeaseError, LeaseEvent, LeaseHolder, Staleness,
    LEASE_AGGREGATE,
};
use wharf_domain::session::MANAGED_SESSION_AGGREGATE;
use wharf_projections::{session_leases, LeaseRow};
use wharf_store::{NewEvent, RecordedEvent, SessionLock, Store, StoreError, Write};

use crate::error::SessionError;

/// An acquired ownership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquired {
    /// The new owner's fencing token.
    pub token: FencingToken,
    /// When it lapses unless renewed (store time).
    pub expires_at: DateTime<Utc>,
}

/// What a renew came to. A renew that cannot extend anything is a definitive loss, recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenewVerdict {
    /// Extended to `expires_at` (store time).
    Renewed {
        /// The new expiry.
        expires_at: DateTime<Utc>,
    },
    /// The claim is stale (the ledger appended `LeaseLost`, after `LeaseExpired` if it expired).
    Lost(Staleness),
}

/// The lease ledger on a store, with a per-session cache of the newest state it decided on.
#[derive(Clone)]
pub struct LeaseLedger {
    store: Store,
    cache: Arc<Mutex<HashMap<String, (Lease, i64)>>>,
}

/// Why an attempt decided nothing.
enum Refusal {
    Domain(LeaseError),
    Corrupt(StoreError),
    /// The cached state is ahead of the stream (another ledger, say a restored backup).
    CacheAhead,
}

impl LeaseLedger {
    /// The lease ledger on `store`.
    pub fn new(store: Store) -> Self {
        Self {
            store,
            cache: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Becomes the owner of `session_id`'s lease for `ttl`, when it is free or expired.
    pub async fn acquire(
        &self,
        session_id: &str,
        holder: &LeaseHolder,
        ttl: Duration,
    ) -> Result<Acquired, SessionError> {
        let holder = holder.clone();
        let (events, _) = self
            .run(session_id, move |now| LeaseCommand::Acquire {
                holder: holder.clone(),
                ttl,
                now,
            })
            .await?;
        match events.last() {
            Some(LeaseEvent::Acquired {
                token, expires_at, ..
            }) => Ok(Acquired {
                token: *token,
                expires_at: *expires_at,
            }),
            other => Err(StoreError::Task(format!(
                "an acquire decided {other:?} instead of LeaseAcquired"
            ))
            .into()),
        }
    }

    /// Extends (holder, token) by its TTL; anything else is a definitive, recorded loss.
    pub async fn renew(
        &self,
        session_id: &str,
        holder: &LeaseHolder,
        token: FencingToken,
    ) -> Result<RenewVerdict, SessionError> {
        let holder = holder.clone();
        let (events, _) = self
            .run(session_id, move |now| LeaseCommand::Renew {
                holder: holder.clone(),
                token,
                now,
            })
            .await?;
        match events.last() {
            Some(LeaseEvent::Renewed { expires_at, .. }) => Ok(RenewVerdict::Renewed {
                expires_at: *expires_at,
            }),
            Some(LeaseEvent::Lost { reason, .. }) => Ok(RenewVerdict::Lost(reason.clone())),
            other => Err(StoreError::Task(format!(
                "a renew decided {other:?} instead of LeaseRenewed or LeaseLost"
            ))
            .into()),
        }
    }

    /// Gives (holder, token) up; a stale claim is refused ([`LeaseError::StaleRelease`]).
    pub async fn release(
        &self,
        session_id: &str,
        holder: &LeaseHolder,
        token: FencingToken,
    ) -> Result<(), SessionError> {
        let holder = holder.clone();
        self.run(session_id, move |now| LeaseCommand::Release {
            holder: holder.clone(),
            token,
            now,
        })
        .await
        .map(|_| ())
    }

    /// Records the owner's expiry if it has passed by the store's clock; the lease as it is
    /// after that.
    pub async fn observe_expiry(&self, session_id: &str) -> Result<Lease, SessionError> {
        self.run(session_id, |now| LeaseCommand::ObserveExpiry { now })
            .await
            .map(|(_, state)| state)
    }

    /// The session's lease row, if its lease stream has any event (a plain read).
    pub async fn row(&self, session_id: &str) -> Result<Option<LeaseRow>, SessionError> {
        Ok(session_leases(&self.store, Some(session_id))
            .await?
            .into_iter()
            .next())
    }

    /// Runs one command built from the store's time; returns its events and the state after.
    async fn run(
        &self,
        session_id: &str,
        command: impl Fn(DateTime<Utc>) -> LeaseCommand + Send + Clone + 'static,
    ) -> Result<(Vec<LeaseEvent>, Lease), SessionError> {
        for _ in 0..2 {
            let (state, after) = self.start_state(session_id).await?;
            let lock = SessionLock {
                stream_type: LEASE_AGGREGATE,
                lock_type: MANAGED_SESSION_AGGREGATE,
                session_id: session_id.to_owned(),
                after_sequence: after,
                fence: None,
            };
            let command = command.clone();
            let decided = self
                .store
                .execute(lock, move |snapshot| {
                    if snapshot.stream_head < after {
                        return Err(Refusal::CacheAhead);
                    }
                    let mut state = state;
                    apply_recorded(&mut state, &snapshot.events).map_err(Refusal::Corrupt)?;
                    let events = state
                        .decide(&command(snapshot.now))
                        .map_err(Refusal::Domain)?;
                    let metadata = json!({ "wharf_version": env!("CARGO_PKG_VERSION") });
                    let new = events
                        .iter()
                        .map(|e| NewEvent::from_domain(e, metadata.clone()))
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(Refusal::Corrupt)?;
                    for event in &events {
                        state.apply(event.clone());
                    }
                    let sequence = snapshot.last_sequence() + events.len() as i64;
                    Ok((Write::events(new), (events, state, sequence)))
                })
                .await?;
            match decided {
                Ok((events, state, sequence)) => {
                    self.remember(session_id, state.clone(), sequence);
                    return Ok((events, state));
                }
                Err(Refusal::CacheAhead) => self.forget(session_id),
                Err(Refusal::Domain(e)) => return Err(SessionError::Lease(e)),
                Err(Refusal::Corrupt(e)) => return Err(e.into()),
            }
        }
        Err(StoreError::Task(format!(
            "the lease stream of {session_id} is behind its projected row twice in a row"
        ))
        .into())
    }

    /// The state to decide from and the sequence it folds up to: the cache, else the row.
    async fn start_state(&self, session_id: &str) -> Result<(Lease, i64), SessionError> {
        if let Some(cached) = self.lock_cache().get(session_id).cloned() {
            return Ok(cached);
        }
        match self.row(session_id).await? {
            Some(row) => Ok((row.state()?, row.last_sequence)),
            None => Ok((Lease::default(), 0)),
        }
    }

    fn remember(&self, session_id: &str, state: Lease, sequence: i64) {
        self.lock_cache()
            .insert(session_id.to_owned(), (state, sequence));
    }

    fn forget(&self, session_id: &str) {
        self.lock_cache().remove(session_id);
    }

    fn lock_cache(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Lease, i64)>> {
        // A panic while holding it cannot leave a half-written entry: entries are replaced
        // whole, so the map is usable after a poison.
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Folds stored lease events onto `state`.
fn apply_recorded(state: &mut Lease, events: &[RecordedEvent]) -> Result<(), StoreError> {
    for event in events {
        let decoded = LeaseEvent::decode(&event.event_type, event.payload.get())
            .map_err(|e| StoreError::decode(event.position, e))?;
        state.apply(decoded);
    }
    Ok(())
}
