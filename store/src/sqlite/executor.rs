//! The locked executor on SQLite (the contract is in [`crate::executor`]).
//!
//! The one writer connection and `BEGIN IMMEDIATE` serialize every attempt, so the lock hook
//! only creates the aggregate's own row where it has one; the snapshot is read inside the same
//! transaction, after it.

use rusqlite::params;

use super::events::{append_in_tx, load_after_in_tx};
use super::SqliteStore;
use crate::error::StoreError;
use crate::executor::{Decide, LockedAggregate, Snapshot};

impl SqliteStore {
    /// Runs one locked attempt on `target`'s aggregate as a single transaction.
    pub async fn execute<A, T, E, F>(
        &self,
        target: A,
        decide: F,
    ) -> Result<Result<T, E>, StoreError>
    where
        A: LockedAggregate,
        T: Send + 'static,
        E: Send + 'static,
        F: Decide<A, T, E> + 'static,
    {
        self.write_or_rollback(move |ctx| {
            let tx = ctx.tx;
            let now = ctx.now.timestamp_micros();
            target.sqlite_lock(tx, now)?;
            if let Some(reason) = target.sqlite_guard(tx, now)? {
                return Err(StoreError::GuardRefused {
                    aggregate_type: target.aggregate_type(),
                    aggregate_id: target.aggregate_id().to_owned(),
                    reason,
                });
            }
            let (kind, id) = (target.aggregate_type(), target.aggregate_id());
            let snapshot = Snapshot {
                events: load_after_in_tx(tx, kind, id, target.after_sequence())?,
                after_sequence: target.after_sequence(),
                stream_head: stream_head(tx, kind, id)?,
                observed: target.sqlite_observe(tx, now)?,
                now: ctx.now,
            };
            let (write, value) = match decide(&snapshot) {
                Ok(decided) => decided,
                Err(e) => return Ok((Err(e), false)),
            };
            if !write.events.is_empty() {
                append_in_tx(
                    tx,
                    ctx.projectors,
                    ctx.now,
                    kind,
                    id,
                    snapshot.last_sequence(),
                    write.events,
                )?;
            }
            if let Some(extra) = &write.extra {
                target.sqlite_write_extra(tx, extra, now)?;
            }
            Ok((Ok(value), true))
        })
        .await
    }
}

fn stream_head(
    tx: &rusqlite::Transaction<'_>,
    aggregate_type: &str,
    aggregate_id: &str,
) -> Result<i64, StoreError> {
    Ok(tx
        .prepare_cached(
            "SELECT COALESCE(MAX(sequence), 0) FROM events \
             WHERE aggregate_type = ?1 AND aggregate_id = ?2",
        )?
        .query_row(params![aggregate_type, aggregate_id], |row| row.get(0))?)
}
