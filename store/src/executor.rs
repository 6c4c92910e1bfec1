//! The locked executor's contract: one load-decide-append-project transaction for any aggregate.
//!
//! An attempt on an aggregate runs as one transaction on either backend:
//! 1. take the aggregate's lock (a row lock: the aggregate's own row when it has one, such as a
//!    consumer group's, else its row in `aggregate_lock`);
//! 2. in the same round trip on Postgres, read the store's time, the aggregate's events after the
//!    caller's cached sequence, its newest sequence, what the aggregate observes beside its
//!    events (a group's live instances), and the guard (a condition such as a fencing token that
//!    must hold for the write to land);
//! 3. refuse with [`StoreError::GuardRefused`] when the guard does not hold;
//! 4. decide (a pure closure over the [`Snapshot`]);
//! 5. append what the decision returns, with inline projection, and write its extra state (a
//!    group's heartbeat);
//! 6. commit. A decision error rolls everything back and is returned as the inner `Err`.
//!
//! Concurrent attempts on one aggregate serialize on its lock.
//!
//! The optimistic form (`execute_optimistic`, ADR 0037) gives the same outcome in fewer round
//! trips on Postgres: the snapshot is read without the lock (one autocommit statement that also
//! reads the lock row's version), the decision runs, and the write is one autocommit statement
//! whose first CTE bumps the version and raises unless it is the one the read saw, so nothing
//! lands when any other attempt committed in between: the caller gets
//! [`StoreError::Conflict`] and runs the attempt again, locked. What every attempt writes bumps
//! the version, so a decision is never applied over a snapshot another attempt has moved.
//! SQLite has one writer and no round trips: there the optimistic form is the locked one.
//!
//! The speculative form ([`AttemptForm::Speculative`], ADR 0052) takes one round trip: the
//! caller says what it knows of the aggregate from its own last attempt ([`Assumed`]: the
//! version, the observation); the decision runs on that with no new events and the store's
//! time estimated from its last answer, and the write's statement checks, beside the version,
//! that the stream head, the observation and the time still hold, else it is a conflict and
//! nothing was written. An aggregate with a guard never runs speculatively.
//!
//! What is aggregate-specific (which
//! row is the lock, what to observe, the guard, the extra write) is a [`LockedAggregate`]; the
//! executor itself exists once per backend (`sqlite/executor.rs`, `postgres/executor.rs`).
//!
//! Architecture invariant: the executor never interprets events; an aggregate's hooks may read
//! and write its own tables, never the events table.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use crate::error::StoreError;
use crate::event::{NewEvent, RecordedEvent};
use crate::projector::CteStatement;

/// What the decision sees: the aggregate's events, what it observes, and the store's time.
#[derive(Debug, Clone)]
pub struct Snapshot<O> {
    /// The aggregate's events after [`LockedAggregate::after_sequence`], in sequence order.
    pub events: Vec<RecordedEvent>,
    /// The sequence the load started after.
    pub after_sequence: i64,
    /// The aggregate's newest sequence in the ledger (0 when none). Below `after_sequence`
    /// means the caller's cached state is from another ledger (say, before a restore) and must
    /// be dropped.
    pub stream_head: i64,
    /// What the aggregate observes beside its events, read under the lock.
    pub observed: O,
    /// The store's time for this transaction.
    pub now: DateTime<Utc>,
}

impl<O> Snapshot<O> {
    /// The sequence of the aggregate's newest event (0 when none).
    pub fn last_sequence(&self) -> i64 {
        self.events
            .last()
            .map_or(self.after_sequence.max(0), |e| e.sequence)
    }
}

/// What a caller knows of an aggregate from its own previous attempt: enough to run the next
/// one speculatively (ADR 0052), deciding without a read and sending the decision as one
/// statement that checks these inputs still hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assumed<O> {
    /// The lock row's version after that attempt.
    pub version: i64,
    /// What the aggregate observed then, with that attempt's own writes applied. The write
    /// compares it with [`LockedAggregate::pg_observe`] as JSON, so its serialized form must be
    /// the one that expression yields.
    pub observed: O,
    /// The time of the aggregate's last decision: the speculative one is timed no earlier,
    /// so an aggregate's decisions stay in time order.
    pub not_before: DateTime<Utc>,
}

/// Which form an attempt runs in; a conflict moves it one step down the list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptForm<O> {
    /// Postgres: no read; decide on [`Assumed`] inputs (and the store's time as estimated from
    /// its last answer), write in one statement that checks them. One round trip.
    Speculative(Assumed<O>),
    /// Postgres: an unlocked read, then a version-checked write (ADR 0037). Two round trips.
    Optimistic,
    /// The locked transaction: cannot conflict.
    Locked,
}

impl<O> AttemptForm<O> {
    /// The form to run after a conflict in this one.
    pub fn after_conflict(&self) -> Self {
        match self {
            Self::Speculative(_) => Self::Optimistic,
            Self::Optimistic | Self::Locked => Self::Locked,
        }
    }
}

/// An attempt's result, and the aggregate's lock-row version once it ran (Postgres; `None` on
/// SQLite, which never runs speculatively).
#[derive(Debug, Clone)]
pub struct Attempted<R> {
    /// What the decision returned.
    pub outcome: R,
    /// The lock row's version after the attempt, for [`Assumed::version`].
    pub version: Option<i64>,
}

/// What the decision asks the executor to write.
#[derive(Debug, Clone)]
pub struct Write<X> {
    /// Events to append (may be empty).
    pub events: Vec<NewEvent>,
    /// Aggregate-specific state to write in the same transaction, through
    /// [`LockedAggregate::pg_write_extra`] / [`LockedAggregate::sqlite_write_extra`].
    pub extra: Option<X>,
}

impl<X> Default for Write<X> {
    fn default() -> Self {
        Self {
            events: Vec::new(),
            extra: None,
        }
    }
}

impl<X> Write<X> {
    /// Appends `events` and writes nothing else.
    pub fn events(events: Vec<NewEvent>) -> Self {
        Self {
            events,
            extra: None,
        }
    }
}

/// A decision: what to write, and what to tell the caller.
pub type Decision<T, E, X> = Result<(Write<X>, T), E>;

/// The pure closure every form of an attempt on `A` runs: the snapshot in, the decision out.
pub trait Decide<A: LockedAggregate, T, E>:
    FnOnce(&Snapshot<A::Observed>) -> Decision<T, E, A::Extra> + Send
{
}

impl<A, T, E, F> Decide<A, T, E> for F
where
    A: LockedAggregate,
    F: FnOnce(&Snapshot<A::Observed>) -> Decision<T, E, A::Extra> + Send,
{
}

/// The Postgres statement parts that lock an aggregate: an upsert that takes the row lock and
/// bumps a `version` column, and two expressions the executor adds to its `RETURNING` list to
/// tell whether the statement's snapshot (taken before any wait on the lock) is still current.
#[derive(Debug, Clone)]
pub struct PgLock {
    /// `INSERT ... ON CONFLICT (...) DO UPDATE SET version = <table>.version + 1`, without a
    /// `RETURNING` clause. `$1` is the aggregate id, `$2` its type.
    pub upsert: String,
    /// The version the upsert wrote (`<table>.version`).
    pub written: String,
    /// The version the statement's snapshot saw: a subquery, NULL when the row was new.
    pub seen: String,
    /// For the optimistic write ([`LockedAggregate::optimistic`]): an `UPDATE` of the existing
    /// row that bumps its version and returns the new one as `version`. `None`: the aggregate
    /// is always run locked.
    pub bump: Option<String>,
}

impl PgLock {
    /// The lock for an aggregate with no row of its own: its row in `aggregate_lock`.
    pub fn aggregate_row() -> Self {
        Self {
            upsert: "INSERT INTO aggregate_lock (aggregate_type, aggregate_id) VALUES ($2, $1) \
                     ON CONFLICT (aggregate_type, aggregate_id) \
                     DO UPDATE SET version = aggregate_lock.version + 1"
                .to_owned(),
            written: "aggregate_lock.version".to_owned(),
            seen: "(SELECT l.version FROM aggregate_lock l \
                   WHERE l.aggregate_type = $2 AND l.aggregate_id = $1)"
                .to_owned(),
            bump: Some(
                "UPDATE aggregate_lock SET version = version + 1 \
                 WHERE aggregate_type = $2 AND aggregate_id = $1 RETURNING version"
                    .to_owned(),
            ),
        }
    }
}

/// An aggregate the locked executor can run attempts on: which stream, which lock, what to
/// observe, the guard, and the extra write. Parameters `$1` (aggregate id), `$2` (aggregate
/// type) and `$3` (after-sequence) are bound by the executor; a hook binds its own through the
/// [`CteStatement`] it is given and uses the placeholders that returns.
#[async_trait]
pub trait LockedAggregate: Send + Sync + 'static {
    /// What the decision observes beside the events; decoded from JSON on Postgres.
    type Observed: serde::de::DeserializeOwned + serde::Serialize + Send + 'static;
    /// Aggregate-specific state a decision may write beside its events.
    type Extra: Send + Sync + 'static;

    /// The aggregate type of the stream (the events' `aggregate_type`).
    fn aggregate_type(&self) -> &'static str;
    /// The aggregate id of the stream.
    fn aggregate_id(&self) -> &str;
    /// Load only events with a greater sequence (0 loads everything).
    fn after_sequence(&self) -> i64;

    /// Postgres: the lock statement parts (default: the aggregate's `aggregate_lock` row).
    fn pg_lock(&self, _args: &mut CteStatement) -> Result<PgLock, StoreError> {
        Ok(PgLock::aggregate_row())
    }
    /// Postgres: a JSON-valued expression read in the lock statement (default: `null`).
    fn pg_observe(&self, _args: &mut CteStatement) -> Result<String, StoreError> {
        Ok("'null'::json".to_owned())
    }
    /// Postgres: a boolean expression true exactly when what [`LockedAggregate::pg_observe`]
    /// yields equals `observed`, for a speculative write (ADR 0052) to check. `None` (the
    /// default): the write builds that JSON and compares it as `jsonb`. An aggregate overrides
    /// it where probes by key cost less than building the JSON (ADR 0056).
    fn pg_observed_is(
        &self,
        _args: &mut CteStatement,
        _observed: &Self::Observed,
    ) -> Result<Option<String>, StoreError> {
        Ok(None)
    }
    /// Postgres: a boolean expression that must be true for the write to land, read in the
    /// lock statement (no round trip of its own), and why it refused when false.
    fn pg_guard(&self, _args: &mut CteStatement) -> Result<Option<PgGuard>, StoreError> {
        Ok(None)
    }
    /// Postgres: the decision's extra state as the body of one data-modifying CTE that reads
    /// its rows `FROM source` (a one-row relation that exists only once the version check
    /// passed), so the optimistic write stays one statement. `None` (the default): written by
    /// [`LockedAggregate::pg_write_extra`] inside a transaction instead.
    fn pg_extra_cte(
        &self,
        _args: &mut CteStatement,
        _extra: &Self::Extra,
        _source: &str,
    ) -> Result<Option<String>, StoreError> {
        Ok(None)
    }
    /// Postgres: writes the decision's extra state inside the transaction.
    async fn pg_write_extra(
        &self,
        _conn: &mut PgConnection,
        _extra: &Self::Extra,
    ) -> Result<(), StoreError> {
        Ok(())
    }

    /// SQLite: takes the lock. The writer is single and every write is `BEGIN IMMEDIATE`, so
    /// the default does nothing; an aggregate with a row of its own creates it here.
    fn sqlite_lock(&self, _tx: &rusqlite::Transaction<'_>, _now: i64) -> Result<(), StoreError> {
        Ok(())
    }
    /// SQLite: what the decision observes (`now` in microseconds of the store's clock).
    fn sqlite_observe(
        &self,
        tx: &rusqlite::Transaction<'_>,
        now: i64,
    ) -> Result<Self::Observed, StoreError>;
    /// SQLite: `Some(reason)` when the guard refuses the write.
    fn sqlite_guard(
        &self,
        _tx: &rusqlite::Transaction<'_>,
        _now: i64,
    ) -> Result<Option<String>, StoreError> {
        Ok(None)
    }
    /// SQLite: writes the decision's extra state inside the transaction.
    fn sqlite_write_extra(
        &self,
        _tx: &rusqlite::Transaction<'_>,
        _extra: &Self::Extra,
        _now: i64,
    ) -> Result<(), StoreError> {
        Ok(())
    }
}

/// A Postgres guard: the condition and the refusal's reason.
#[derive(Debug, Clone)]
pub struct PgGuard {
    /// A boolean SQL expression.
    pub condition: String,
    /// What [`StoreError::GuardRefused`] says when it is false.
    pub refusal: String,
}

/// An aggregate with nothing to observe and nothing to write beside its events: its lock is
/// its `aggregate_lock` row. Managed MQTT sessions run their ledger commands on it.
#[derive(Debug, Clone)]
pub struct StreamLock {
    /// The aggregate type.
    pub aggregate_type: &'static str,
    /// The aggregate id.
    pub aggregate_id: String,
    /// Load only events with a greater sequence (0 loads everything).
    pub after_sequence: i64,
}

#[async_trait]
impl LockedAggregate for StreamLock {
    type Observed = ();
    type Extra = ();

    fn aggregate_type(&self) -> &'static str {
        self.aggregate_type
    }

    fn aggregate_id(&self) -> &str {
        &self.aggregate_id
    }

    fn after_sequence(&self) -> i64 {
        self.after_sequence
    }

    fn sqlite_observe(&self, _tx: &rusqlite::Transaction<'_>, _now: i64) -> Result<(), StoreError> {
        Ok(())
    }
}
