//! The optimistic form of the locked executor on Postgres (ADR 0037; the contract is in
//! [`crate::executor`]).
//!
//! The locked form is four round trips: BEGIN, the lock statement with its snapshot, the
//! event's insert with its fused projections, COMMIT. This form is two autocommit statements:
//! 1. the snapshot, read without the lock, with the lock row's version;
//! 2. after the decision, the write: a CTE bumps the lock row's version, a second one calls
//!    `wharf_expect_version`, which raises (SQLSTATE `WH409`) unless the bumped version is the
//!    read one plus one, and the event's insert, its fused projections and the aggregate's
//!    extra write all read from that check, so they happen after it or, the statement being
//!    one transaction, not at all.
//!
//! The bump takes the row lock, so a locked attempt in flight is waited for and then seen as a
//! moved version. A moved version is [`StoreError::Conflict`]: the caller runs the attempt
//! again, locked. A write that cannot be one statement (several events, a projector that does
//! not fuse, an extra write with no CTE form) runs the same check first inside a transaction.
//! An aggregate whose row does not exist yet, or whose [`PgLock::bump`] is `None`, runs locked.

use std::sync::Arc;

use sqlx::{Connection, PgConnection, Row};

use super::events::{append_in_tx, conflict_or, insert_ctes};
use super::executor::{base_args, fetch, snapshot_columns, snapshot_of};
use super::PgStore;
use crate::error::StoreError;
use crate::event::{EventRef, NewEvent};
use crate::executor::{Decision, LockedAggregate, PgLock, Snapshot, Write};
use crate::projector::{CteStatement, PgProjector};

/// The SQLSTATE `wharf_expect_version` raises (migration 0011).
const VERSION_MOVED: &str = "WH409";

impl PgStore {
    /// Runs one attempt on `target`'s aggregate optimistically: an unlocked read, the
    /// decision, and a version-checked write. [`StoreError::Conflict`] means another attempt
    /// committed in between and nothing was written: run it again with [`PgStore::execute`].
    pub async fn execute_optimistic<A, T, E, F>(
        &self,
        target: A,
        decide: F,
    ) -> Result<Result<T, E>, StoreError>
    where
        A: LockedAggregate,
        T: Send,
        E: Send,
        F: FnOnce(&Snapshot<A::Observed>) -> Decision<T, E, A::Extra> + Send,
    {
        let mut conn = self.pool.acquire().await?;
        let Some(read) = read_unlocked(&mut conn, &target).await? else {
            drop(conn);
            return self.execute(target, decide).await;
        };
        let (write, value) = match decide(&read.snapshot) {
            Ok(decided) => decided,
            Err(e) => return Ok(Err(e)),
        };
        if !write.events.is_empty() || write.extra.is_some() {
            let checked = CheckedWrite {
                target: &target,
                projectors: &self.projectors,
                version: read.version,
                last_sequence: read.snapshot.last_sequence(),
            };
            checked.run(&mut conn, write).await?;
        }
        Ok(Ok(value))
    }
}

/// The unlocked snapshot read an optimistic attempt on `target` sends: its text and its
/// parameters, exactly as [`PgStore::execute_optimistic`] builds them, so that a plan test (or
/// an operator chasing a slow attempt) can `EXPLAIN` it on a connection of its own. `None` when
/// the aggregate always runs locked (no [`PgLock::bump`]).
#[doc(hidden)]
pub fn snapshot_read_statement<A: LockedAggregate>(
    target: &A,
) -> Result<Option<(String, sqlx::postgres::PgArguments)>, StoreError> {
    Ok(unlocked_read_statement(target)?.map(|(sql, args, _)| args.finish(&sql)))
}

/// The unlocked read's select, its parameters and the guard's refusal; `None` without a bump.
fn unlocked_read_statement<A: LockedAggregate>(
    target: &A,
) -> Result<Option<(String, CteStatement, Option<String>)>, StoreError> {
    let mut args = base_args(target)?;
    let lock: PgLock = target.pg_lock(&mut args)?;
    if lock.bump.is_none() {
        return Ok(None);
    }
    let (columns, refusal) = snapshot_columns(target, &mut args)?;
    let sql = format!("SELECT ({})::bigint, {columns}", lock.seen);
    Ok(Some((sql, args, refusal)))
}

/// A snapshot read without the lock, and the version of the lock row it was read at.
struct UnlockedRead<O> {
    version: i64,
    snapshot: Snapshot<O>,
}

/// Reads the snapshot and the lock row's version in one statement; `None` when the aggregate
/// must run locked (its row does not exist yet, or it has no bump).
async fn read_unlocked<A: LockedAggregate>(
    conn: &mut PgConnection,
    target: &A,
) -> Result<Option<UnlockedRead<A::Observed>>, StoreError> {
    let Some((sql, args, refusal)) = unlocked_read_statement(target)? else {
        return Ok(None);
    };
    let row = fetch(conn, &sql, args).await?;
    let Some(version) = row.try_get::<Option<i64>, _>(0)? else {
        return Ok(None);
    };
    let snapshot = snapshot_of(target, &row, 1, refusal)?;
    Ok(Some(UnlockedRead { version, snapshot }))
}

/// The write of a decision taken on an unlocked read.
struct CheckedWrite<'a, A> {
    target: &'a A,
    projectors: &'a [Arc<dyn PgProjector>],
    version: i64,
    last_sequence: i64,
}

impl<A: LockedAggregate> CheckedWrite<'_, A> {
    async fn run(&self, conn: &mut PgConnection, write: Write<A::Extra>) -> Result<(), StoreError> {
        if let Some((sql, args)) = self.one_statement(&write)? {
            sqlx::query_with(&sql, args)
                .execute(&mut *conn)
                .await
                .map_err(|e| self.conflict_or(e))?;
            return Ok(());
        }
        let mut tx = conn.begin().await?;
        let (sql, args) = self
            .version_check()?
            .finish("SELECT checked FROM version_checked");
        sqlx::query_with(&sql, args)
            .execute(&mut *tx)
            .await
            .map_err(|e| self.conflict_or(e))?;
        append_in_tx(
            &mut tx,
            self.projectors,
            self.target.aggregate_type(),
            self.target.aggregate_id(),
            self.last_sequence,
            write.events,
        )
        .await?;
        if let Some(extra) = &write.extra {
            self.target.pg_write_extra(&mut tx, extra).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The version bump and its check, as the first CTEs of a statement; `version_checked`
    /// has one row once the check passed.
    fn version_check(&self) -> Result<CteStatement, StoreError> {
        let mut statement = base_args(self.target)?;
        let lock = self.target.pg_lock(&mut statement)?;
        let bump = lock.bump.ok_or_else(|| {
            StoreError::decode(
                0,
                "an optimistic write on an aggregate without a version bump",
            )
        })?;
        let expected = statement.bind(self.version + 1)?;
        statement.cte("version_bump", &bump);
        statement.cte(
            "version_checked",
            &format!(
                "SELECT wharf_expect_version((SELECT version FROM version_bump), {expected}) \
                 AS checked"
            ),
        );
        Ok(statement)
    }

    /// The whole write as one statement, or `None` when it cannot be one.
    fn one_statement(
        &self,
        write: &Write<A::Extra>,
    ) -> Result<Option<(String, sqlx::postgres::PgArguments)>, StoreError> {
        if write.events.len() > 1 {
            return Ok(None);
        }
        let mut statement = self.version_check()?;
        if let Some(event) = write.events.first() {
            let pending = self.pending(event);
            let deferred = insert_ctes(
                self.projectors,
                &pending,
                event,
                &mut statement,
                Some("version_checked"),
            )?;
            if !deferred.is_empty() {
                return Ok(None);
            }
        }
        if let Some(extra) = &write.extra {
            let Some(body) = self
                .target
                .pg_extra_cte(&mut statement, extra, "version_checked")?
            else {
                return Ok(None);
            };
            statement.cte("extra_write", &body);
        }
        Ok(Some(
            statement.finish("SELECT checked FROM version_checked"),
        ))
    }

    fn pending<'e>(&'e self, event: &'e NewEvent) -> EventRef<'e> {
        EventRef {
            position: None,
            aggregate_type: self.target.aggregate_type(),
            aggregate_id: self.target.aggregate_id(),
            sequence: self.last_sequence + 1,
            event_type: &event.event_type,
            payload: &event.payload,
        }
    }

    /// A moved version or a taken sequence is a conflict; anything else is itself.
    fn conflict_or(&self, e: sqlx::Error) -> StoreError {
        let moved =
            matches!(&e, sqlx::Error::Database(db) if db.code().as_deref() == Some(VERSION_MOVED));
        if moved {
            return StoreError::Conflict {
                aggregate_type: self.target.aggregate_type().to_owned(),
                aggregate_id: self.target.aggregate_id().to_owned(),
                sequence: self.last_sequence + 1,
            };
        }
        conflict_or(
            e,
            self.target.aggregate_type(),
            self.target.aggregate_id(),
            self.last_sequence + 1,
        )
    }
}
