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

use chrono::{DateTime, Utc};
use sqlx::{Connection, PgConnection, Row};

use super::events::{append_in_tx, conflict_or, insert_ctes};
use super::executor::{base_args, fetch, snapshot_columns, snapshot_of};
use super::PgStore;
use crate::error::StoreError;
use crate::event::{EventRef, NewEvent};
use crate::executor::{
    Assumed, AttemptForm, Attempted, Decide, LockedAggregate, PgLock, Snapshot, Write,
};
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
        F: Decide<A, T, E>,
    {
        Ok(self.attempt_optimistic(target, decide).await?.outcome)
    }

    /// One attempt in `form` (see [`AttemptForm`]); [`StoreError::Conflict`] when it must run
    /// again in [`AttemptForm::after_conflict`]. A speculative attempt with no fresh estimate
    /// of the store's time runs optimistically instead.
    pub async fn attempt_in<A, T, E, F>(
        &self,
        target: A,
        decide: F,
        form: AttemptForm<A::Observed>,
    ) -> Result<Attempted<Result<T, E>>, StoreError>
    where
        A: LockedAggregate,
        T: Send,
        E: Send,
        F: Decide<A, T, E>,
    {
        match form {
            AttemptForm::Locked => self.execute_locked(target, decide).await,
            AttemptForm::Optimistic => self.attempt_optimistic(target, decide).await,
            // A guard is checked by the read (it can refuse, not only conflict): a guarded
            // aggregate never runs speculatively.
            AttemptForm::Speculative(_) if has_guard(&target)? => {
                self.attempt_optimistic(target, decide).await
            }
            AttemptForm::Speculative(assumed) => match self.clock.estimate() {
                Some(now) => {
                    let now = now.max(assumed.not_before);
                    self.attempt_speculative(target, decide, assumed, now).await
                }
                None => self.attempt_optimistic(target, decide).await,
            },
        }
    }

    async fn attempt_optimistic<A, T, E, F>(
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
        let mut conn = self.kept.take(&self.pool).await?;
        let Some(read) = read_unlocked(&mut conn, &target).await? else {
            drop(conn);
            return self.execute_locked(target, decide).await;
        };
        self.clock.heard(read.snapshot.now);
        let (write, value) = match decide(&read.snapshot) {
            Ok(decided) => decided,
            Err(e) => {
                return Ok(Attempted {
                    outcome: Err(e),
                    version: None,
                })
            }
        };
        let mut version = read.version;
        if !write.events.is_empty() || write.extra.is_some() {
            let checked = CheckedWrite {
                target: &target,
                projectors: &self.projectors,
                version: read.version,
                last_sequence: read.snapshot.last_sequence(),
                assumed: None,
            };
            checked.run(&mut conn, write).await?;
            version += 1;
        }
        self.kept.keep(&self.pool, conn);
        Ok(Attempted {
            outcome: Ok(value),
            version: Some(version),
        })
    }

    /// The speculative form (ADR 0052): decide on `assumed` at the estimated store time `now`
    /// with no events after the caller's sequence, then one statement that checks the version,
    /// the stream head, the observed value and the time before it writes. A decision that
    /// writes nothing is checked the same way, without the version bump; a refusal is not
    /// trusted (it was decided on inputs nobody checked) and is a conflict too.
    async fn attempt_speculative<A, T, E, F>(
        &self,
        target: A,
        decide: F,
        assumed: Assumed<A::Observed>,
        now: DateTime<Utc>,
    ) -> Result<Attempted<Result<T, E>>, StoreError>
    where
        A: LockedAggregate,
        T: Send,
        E: Send,
        F: Decide<A, T, E>,
    {
        let head = target.after_sequence();
        let snapshot = Snapshot {
            events: Vec::new(),
            after_sequence: head,
            stream_head: head,
            observed: assumed.observed,
            now,
        };
        let Ok((write, value)) = decide(&snapshot) else {
            return Err(conflict(
                &target,
                head,
                "a refusal decided on assumed inputs",
            ));
        };
        let inputs = AssumedInputs {
            observed: &snapshot.observed,
            now,
        };
        let mut conn = self.kept.take(&self.pool).await?;
        let mut version = assumed.version;
        let store_time = if write.events.is_empty() && write.extra.is_none() {
            check_unwritten(&mut conn, &target, assumed.version, &inputs).await?
        } else {
            let checked = CheckedWrite {
                target: &target,
                projectors: &self.projectors,
                version: assumed.version,
                last_sequence: head,
                assumed: Some(&inputs),
            };
            version += 1;
            checked.run(&mut conn, write).await?
        };
        if let Some(store_time) = store_time {
            self.clock.heard(store_time);
        }
        self.kept.keep(&self.pool, conn);
        Ok(Attempted {
            outcome: Ok(value),
            version: Some(version),
        })
    }
}

/// Whether `target` has a guard its writes must pass.
fn has_guard<A: LockedAggregate>(target: &A) -> Result<bool, StoreError> {
    Ok(target.pg_guard(&mut CteStatement::default())?.is_some())
}

/// What a speculative decision took for granted beside the version and the stream head.
struct AssumedInputs<'a, O> {
    /// The observed value.
    observed: &'a O,
    /// The decision's time.
    now: DateTime<Utc>,
}

/// Adds the checks of a speculative decision's inputs to `statement` and returns them as one
/// boolean expression that is true or raises `WH409` naming the input that moved: the stream
/// head is still the caller's sequence (`$3`), the observed value is the assumed one, and the
/// decision's time is not ahead of the store's clock.
fn assumed_checks<A: LockedAggregate>(
    target: &A,
    statement: &mut CteStatement,
    inputs: &AssumedInputs<'_, A::Observed>,
) -> Result<String, StoreError> {
    let observed = match target.pg_observed_is(statement, inputs.observed)? {
        Some(check) => check,
        None => {
            let observe = target.pg_observe(statement)?;
            let value = serde_json::to_value(inputs.observed)?;
            let expected = statement.bind(sqlx::types::Json(value))?;
            format!("({observe})::jsonb = {expected}::jsonb")
        }
    };
    let now = statement.bind(inputs.now)?;
    Ok(format!(
        "wharf_expect_assumed(COALESCE((SELECT sequence FROM events \
           WHERE aggregate_type = $2 AND aggregate_id = $1 ORDER BY sequence DESC LIMIT 1), 0) \
           = $3, 'stream head') \
         AND wharf_expect_assumed({observed}, 'observed') \
         AND wharf_expect_assumed(clock_timestamp() >= {now}, 'decision time')"
    ))
}

/// Checks a speculative decision that writes nothing: the version unmoved (no bump, no lock)
/// and its inputs as assumed, in one statement; the store's time it answered with.
async fn check_unwritten<A: LockedAggregate>(
    conn: &mut PgConnection,
    target: &A,
    version: i64,
    inputs: &AssumedInputs<'_, A::Observed>,
) -> Result<Option<DateTime<Utc>>, StoreError> {
    let mut statement = base_args(target)?;
    let lock = target.pg_lock(&mut statement)?;
    let expected = statement.bind(version)?;
    let checks = assumed_checks(target, &mut statement, inputs)?;
    let (sql, args) = statement.finish(&format!(
        "SELECT wharf_expect_version(({})::bigint, {expected}) AND {checks}, clock_timestamp()",
        lock.seen
    ));
    let row = sqlx::query_with(&sql, args)
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| conflict_or_moved(e, target, target.after_sequence()))?;
    Ok(Some(row.try_get(1)?))
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

/// The write of a decision taken on an unlocked read, or on assumed inputs.
struct CheckedWrite<'a, A: LockedAggregate> {
    target: &'a A,
    projectors: &'a [Arc<dyn PgProjector>],
    version: i64,
    last_sequence: i64,
    /// A speculative decision's inputs, checked with the version.
    assumed: Option<&'a AssumedInputs<'a, A::Observed>>,
}

impl<A: LockedAggregate> CheckedWrite<'_, A> {
    /// Writes, or fails with [`StoreError::Conflict`] having written nothing; the store's time
    /// when the write was one statement (which answers with it).
    async fn run(
        &self,
        conn: &mut PgConnection,
        write: Write<A::Extra>,
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        if let Some((sql, args)) = self.one_statement(&write)? {
            let row = sqlx::query_with(&sql, args)
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| self.conflict_or(e))?;
            return Ok(Some(row.try_get(1)?));
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
        Ok(None)
    }

    /// The version bump and its check (with a speculative decision's, its inputs' checks), as
    /// the first CTEs of a statement; `version_checked` has one row once the checks passed.
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
        let assumed = match self.assumed {
            Some(inputs) => format!(
                " AND {}",
                assumed_checks(self.target, &mut statement, inputs)?
            ),
            None => String::new(),
        };
        statement.cte("version_bump", &bump);
        statement.cte(
            "version_checked",
            &format!(
                "SELECT wharf_expect_version((SELECT version FROM version_bump), {expected}) \
                 {assumed} AS checked"
            ),
        );
        Ok(statement)
    }

    /// The whole write as one statement answering with the store's time, or `None` when it
    /// cannot be one.
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
        Ok(Some(statement.finish(
            "SELECT checked, clock_timestamp() FROM version_checked",
        )))
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

    fn conflict_or(&self, e: sqlx::Error) -> StoreError {
        conflict_or_moved(e, self.target, self.last_sequence + 1)
    }
}

/// A moved version or input (`WH409`) or a taken sequence is a conflict at `sequence`;
/// anything else is itself.
fn conflict_or_moved<A: LockedAggregate>(e: sqlx::Error, target: &A, sequence: i64) -> StoreError {
    let moved = match &e {
        sqlx::Error::Database(db) if db.code().as_deref() == Some(VERSION_MOVED) => {
            Some(db.message().to_owned())
        }
        _ => None,
    };
    match moved {
        Some(why) => conflict(target, sequence, &why),
        None => conflict_or(e, target.aggregate_type(), target.aggregate_id(), sequence),
    }
}

/// The conflict an attempt on `target` at `sequence` reports, and why (traced at debug).
fn conflict<A: LockedAggregate>(target: &A, sequence: i64, why: &str) -> StoreError {
    tracing::debug!(
        aggregate_type = target.aggregate_type(),
        aggregate_id = target.aggregate_id(),
        sequence,
        why,
        "attempt conflicted; it runs again in the next form"
    );
    StoreError::Conflict {
        aggregate_type: target.aggregate_type().to_owned(),
        aggregate_id: target.aggregate_id().to_owned(),
        sequence,
    }
}
