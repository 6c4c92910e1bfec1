//! The lock every write about one managed MQTT session takes, and the lease fence.
//!
//! A session has two streams under one durable identity: its managed-filter ledger and its HA
//! lease. Every attempt on either takes the **same** lock (the session ledger's row in
//! `aggregate_lock`), so an ownership change of the lease and a ledger write on behalf of an
//! owner never interleave: a new owner's Acquire waits for a stale owner's write in flight, and
//! the new owner's first read of the ledger sees it.
//!
//! An attempt made on behalf of an exclusive session's owner carries its claim ([`LeaseClaim`]);
//! the guard then checks, in the lock statement itself (no extra round trip on Postgres), that
//! the `session_lease` row names that holder and token with an expiry after the store's clock.
//! Otherwise the write is refused with [`StoreError::GuardRefused`] and nothing lands.

use crate::error::StoreError;
use crate::executor::{LockedAggregate, PgGuard, PgLock};
use crate::projector::CteStatement;

/// A lease owner's claim: who and with which fencing token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseClaim {
    /// The holder (one process incarnation).
    pub holder: String,
    /// Its fencing token.
    pub token: i64,
}

/// An attempt on one of a session's streams (`stream_type`), locked by the session's lock row.
#[derive(Debug, Clone)]
pub struct SessionLock {
    /// The stream's aggregate type (the ledger's or the lease's).
    pub stream_type: &'static str,
    /// The aggregate type whose `aggregate_lock` row is the session's lock (the ledger's).
    pub lock_type: &'static str,
    /// The durable session identity (both streams' aggregate id).
    pub session_id: String,
    /// Load only events with a greater sequence (0 loads everything).
    pub after_sequence: i64,
    /// The owner's claim the write must be fenced by, if any.
    pub fence: Option<LeaseClaim>,
}

impl SessionLock {
    /// The refusal's text when the claim does not hold.
    fn refusal(claim: &LeaseClaim) -> String {
        format!(
            "the lease claim of {} with token {} no longer holds by the store's clock \
             (released, expired, or another holder took over)",
            claim.holder, claim.token
        )
    }
}

#[async_trait::async_trait]
impl LockedAggregate for SessionLock {
    type Observed = ();
    type Extra = ();

    fn aggregate_type(&self) -> &'static str {
        self.stream_type
    }

    fn aggregate_id(&self) -> &str {
        &self.session_id
    }

    fn after_sequence(&self) -> i64 {
        self.after_sequence
    }

    fn pg_lock(&self, args: &mut CteStatement) -> Result<PgLock, StoreError> {
        let lock_type = args.bind(self.lock_type)?;
        Ok(PgLock {
            upsert: format!(
                "INSERT INTO aggregate_lock (aggregate_type, aggregate_id) VALUES ({lock_type}, $1) \
                 ON CONFLICT (aggregate_type, aggregate_id) \
                 DO UPDATE SET version = aggregate_lock.version + 1"
            ),
            written: "aggregate_lock.version".to_owned(),
            seen: format!(
                "(SELECT l.version FROM aggregate_lock l \
                 WHERE l.aggregate_type = {lock_type} AND l.aggregate_id = $1)"
            ),
            bump: Some(format!(
                "UPDATE aggregate_lock SET version = version + 1 \
                 WHERE aggregate_type = {lock_type} AND aggregate_id = $1 RETURNING version"
            )),
        })
    }

    fn pg_guard(&self, args: &mut CteStatement) -> Result<Option<PgGuard>, StoreError> {
        let Some(claim) = &self.fence else {
            return Ok(None);
        };
        let holder = args.bind(claim.holder.clone())?;
        let token = args.bind(claim.token)?;
        Ok(Some(PgGuard {
            condition: format!(
                "EXISTS (SELECT 1 FROM session_lease WHERE session_id = $1 \
                 AND holder = {holder} AND token = {token} AND expires_at > clock_timestamp())"
            ),
            refusal: Self::refusal(claim),
        }))
    }

    fn sqlite_observe(&self, _tx: &rusqlite::Transaction<'_>, _now: i64) -> Result<(), StoreError> {
        Ok(())
    }

    fn sqlite_guard(
        &self,
        tx: &rusqlite::Transaction<'_>,
        now: i64,
    ) -> Result<Option<String>, StoreError> {
        let Some(claim) = &self.fence else {
            return Ok(None);
        };
        let holds: bool = tx
            .prepare_cached(
                "SELECT EXISTS (SELECT 1 FROM session_lease WHERE session_id = ?1 \
                 AND holder = ?2 AND token = ?3 AND expires_at > ?4)",
            )?
            .query_row(
                rusqlite::params![self.session_id, claim.holder, claim.token, now],
                |row| row.get(0),
            )?;
        Ok((!holds).then(|| Self::refusal(claim)))
    }
}
