//! The locked executor on Postgres (the contract is in [`crate::executor`]).
//!
//! The lock, the snapshot and the guard are one statement: the aggregate's lock upsert with a
//! `RETURNING` list that reads the store's time, the observed value, the events after the
//! caller's sequence, the stream head and the guard. That snapshot was taken when the statement
//! started, possibly before a wait for the lock; it is used only when the version it saw is one
//! below the version written (no other attempt committed in between), else it is read again
//! under the lock in a second statement.

use sqlx::postgres::PgArguments;
use sqlx::types::Json;
use sqlx::{PgConnection, Row};

use super::events::append_in_tx;
use super::PgStore;
use crate::error::StoreError;
use crate::event::RecordedEvent;
use crate::executor::{Attempted, Decide, LockedAggregate, Snapshot, Write};
use crate::projector::CteStatement;

impl PgStore {
    /// Runs one locked attempt on `target`'s aggregate as a single transaction.
    pub async fn execute<A, T, E, F>(
        &self,
        target: A,
        decide: F,
    ) -> Result<Result<T, E>, StoreError>
    where
        A: LockedAggregate,
        T: Send,
        E: Send,
        F: Decide<A, T, E>,
    {
        Ok(self.execute_locked(target, decide).await?.outcome)
    }

    /// [`PgStore::execute`], also telling the lock row's version after it.
    pub(super) async fn execute_locked<A, T, E, F>(
        &self,
        target: A,
        decide: F,
    ) -> Result<Attempted<Result<T, E>>, StoreError>
    where
        A: LockedAggregate,
        T: Send,
        E: Send,
        F: Decide<A, T, E>,
    {
        let mut tx = self.pool.begin().await?;
        let (version, snapshot) = match lock_and_read(&mut tx, &target).await? {
            (version, Some(snapshot)) => (version, snapshot),
            (version, None) => (version, read_again(&mut tx, &target).await?),
        };
        self.clock.heard(snapshot.now);
        let (Write { events, extra }, value) = match decide(&snapshot) {
            Ok(decided) => decided,
            Err(e) => {
                tx.rollback().await?;
                return Ok(Attempted {
                    outcome: Err(e),
                    version: None,
                });
            }
        };
        append_in_tx(
            &mut tx,
            &self.projectors,
            target.aggregate_type(),
            target.aggregate_id(),
            snapshot.last_sequence(),
            events,
        )
        .await?;
        if let Some(extra) = &extra {
            target.pg_write_extra(&mut tx, extra).await?;
        }
        tx.commit().await?;
        Ok(Attempted {
            outcome: Ok(value),
            version: Some(version),
        })
    }
}

/// The statement's parameters so far: `$1` id, `$2` type, `$3` after-sequence.
pub(super) fn base_args<A: LockedAggregate>(target: &A) -> Result<CteStatement, StoreError> {
    let mut args = CteStatement::default();
    args.bind(target.aggregate_id().to_owned())?;
    args.bind(target.aggregate_type())?;
    args.bind(target.after_sequence())?;
    Ok(args)
}

/// The snapshot's select list: time, observed, events, head, guard (in that order). The head is
/// the newest sequence by a backward walk of the key (`ORDER BY sequence DESC LIMIT 1`): written
/// as `MAX(sequence)`, Postgres 15 read every key entry of the stream (and its heap row) on each
/// attempt, 30-50 ms for a group of 100k events, so warm registers grew with the group's ledger.
pub(super) fn snapshot_columns<A: LockedAggregate>(
    target: &A,
    args: &mut CteStatement,
) -> Result<(String, Option<String>), StoreError> {
    let observe = target.pg_observe(args)?;
    let guard = target.pg_guard(args)?;
    let condition = guard.as_ref().map_or("true", |g| g.condition.as_str());
    let columns = format!(
        "clock_timestamp(), ({observe})::json, \
         COALESCE((SELECT json_agg(json_build_object('position', position, \
             'aggregate_type', aggregate_type, 'aggregate_id', aggregate_id, \
             'sequence', sequence, 'event_type', event_type, \
             'event_version', event_version, 'payload', payload, 'metadata', metadata, \
             'recorded_at', recorded_at) ORDER BY sequence) \
           FROM events WHERE aggregate_type = $2 AND aggregate_id = $1 AND sequence > $3), \
           '[]'::json), \
         COALESCE((SELECT sequence FROM events \
           WHERE aggregate_type = $2 AND aggregate_id = $1 ORDER BY sequence DESC LIMIT 1), 0), \
         ({condition})::bool"
    );
    Ok((columns, guard.map(|g| g.refusal)))
}

/// Takes the lock and reads the snapshot in one round trip: the version the lock wrote, and the
/// snapshot, `None` when it may be older than the lock and must be read again.
async fn lock_and_read<A: LockedAggregate>(
    conn: &mut PgConnection,
    target: &A,
) -> Result<(i64, Option<Snapshot<A::Observed>>), StoreError> {
    let mut args = base_args(target)?;
    let lock = target.pg_lock(&mut args)?;
    let (columns, refusal) = snapshot_columns(target, &mut args)?;
    let sql = format!(
        "{} RETURNING ({})::bigint, ({})::bigint, {columns}",
        lock.upsert, lock.written, lock.seen
    );
    let row = fetch(conn, &sql, args).await?;
    let written: i64 = row.try_get(0)?;
    let seen: Option<i64> = row.try_get(1)?;
    let consistent = match seen {
        None => written == 0,
        Some(seen) => seen + 1 == written,
    };
    if !consistent {
        return Ok((written, None));
    }
    Ok((written, Some(snapshot_of(target, &row, 2, refusal)?)))
}

/// Reads the snapshot again, now under the lock.
async fn read_again<A: LockedAggregate>(
    conn: &mut PgConnection,
    target: &A,
) -> Result<Snapshot<A::Observed>, StoreError> {
    let mut args = base_args(target)?;
    // The lock statement's own parameters are bound again (unused here) so that the observed
    // and guard expressions get the same placeholders as in the first statement.
    target.pg_lock(&mut args)?;
    let (columns, refusal) = snapshot_columns(target, &mut args)?;
    let row = fetch(conn, &format!("SELECT {columns}"), args).await?;
    snapshot_of(target, &row, 0, refusal)
}

pub(super) async fn fetch(
    conn: &mut PgConnection,
    sql: &str,
    args: CteStatement,
) -> Result<sqlx::postgres::PgRow, StoreError> {
    let (sql, args): (String, PgArguments) = args.finish(sql);
    Ok(sqlx::query_with(&sql, args).fetch_one(conn).await?)
}

/// Decodes the snapshot columns starting at `first`, refusing when the guard is false.
pub(super) fn snapshot_of<A: LockedAggregate>(
    target: &A,
    row: &sqlx::postgres::PgRow,
    first: usize,
    refusal: Option<String>,
) -> Result<Snapshot<A::Observed>, StoreError> {
    let guard_holds: bool = row.try_get(first + 4)?;
    if !guard_holds {
        return Err(StoreError::GuardRefused {
            aggregate_type: target.aggregate_type(),
            aggregate_id: target.aggregate_id().to_owned(),
            reason: refusal.unwrap_or_default(),
        });
    }
    let observed: Json<A::Observed> = row
        .try_get(first + 1)
        .map_err(|e| StoreError::decode(0, e))?;
    let events: Json<Vec<RecordedEvent>> = row.try_get(first + 2)?;
    Ok(Snapshot {
        now: row.try_get(first)?,
        observed: observed.0,
        events: events.0,
        stream_head: row.try_get(first + 3)?,
        after_sequence: target.after_sequence(),
    })
}
