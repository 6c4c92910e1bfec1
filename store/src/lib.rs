//! Wharf's event store: an append-only ledger with a global position, on SQLite (the embedded
//! default) and on Postgres (cluster mode).
//!
//! What it guarantees, on both backends:
//! - every event gets a global `position` (commit order) and `recorded_at` from the store's clock;
//! - appends are optimistic per aggregate (a taken sequence is [`StoreError::Conflict`]);
//! - inline projectors run inside the append transaction, and their error rolls it back;
//! - the locked executor loads, decides, appends and projects in one transaction, serialized
//!   per aggregate, with an optional guard checked in the same transaction (`executor`);
//! - catch-up projectors advance a durable checkpoint in the same transaction as their writes,
//!   and can never skip an event that committed late;
//! - worker-instance heartbeats are state, judged fresh by the store's clock;
//! - the deferred pruner deletes the events its caller's rules name as superseded ([`prune`]).
//!
//! Architecture invariant: this crate knows nothing of what events mean. It never parses a
//! payload; the domain decides, the projections interpret. (The pruner's one look into a
//! payload compares a top-level field its caller names between two events of a stream, ADR
//! 0075.)

mod catch_up;
pub mod deadline;
pub mod error;
pub mod event;
pub mod executor;
pub mod figures;
pub mod group;
pub mod group_state;
pub mod migrate;
pub mod postgres;
pub mod projector;
pub mod prune;
pub mod ready;
pub mod rebuild;
pub mod session_lock;
pub mod sqlite;

use chrono::{DateTime, Utc};

pub use deadline::{finish_by, finish_within, Finishing, Unanswered};
pub use error::StoreError;
pub use event::{
    EventQuery, EventRef, Heartbeat, InstanceRecord, NewEvent, Payload, RecordedEvent,
};
pub use executor::{
    Assumed, AttemptForm, Attempted, Decide, Decision, LockedAggregate, PgGuard, PgLock, Snapshot,
    StreamLock, Write,
};
pub use figures::GroupFiguresRow;
pub use group::{
    GroupDecision, GroupExtra, GroupLock, GroupObserved, GroupSnapshot, GroupWrite,
    LiveInstanceRow, OpenWaitRow,
};
pub use group_state::{SavedGroupState, StreamHead};
pub use postgres::{PgSettings, PgStore};
pub use projector::{CteStatement, PgProjector, SqliteProjector};
pub use prune::{PruneOptions, PruneReport, Superseded, SupersededBy};
pub use ready::run_ready;
pub use rebuild::{Progress, RebuildMode, RebuildReport, TableDifference};
pub use session_lock::{LeaseClaim, SessionLock};
pub use sqlite::SqliteStore;

/// Where a store lives, parsed from a URL: `sqlite://PATH` (also `sqlite:PATH`) or
/// `postgres://...` (also `postgresql://...`). Anything else, a bare path included, is refused
/// naming the value, so a typo never becomes a new SQLite file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreLocation {
    /// A SQLite file.
    Sqlite(std::path::PathBuf),
    /// A Postgres database URL.
    Postgres(String),
}

/// The accepted store URL forms, for error messages.
pub const STORE_URL_FORMS: &str =
    "use sqlite://PATH (e.g. sqlite://wharf.db) or postgres://USER@HOST/DB";

impl StoreLocation {
    /// Parses a store URL, naming the value when it is not usable.
    pub fn parse(url: &str) -> Result<Self, StoreError> {
        let refuse = |reason: &str| StoreError::Url {
            url: postgres::redact(url),
            reason: reason.to_owned(),
        };
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(Self::Postgres(url.to_owned()));
        }
        let Some(path) = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
        else {
            return Err(refuse(&format!("not a store URL: {STORE_URL_FORMS}")));
        };
        if path.is_empty() {
            return Err(refuse(&format!(
                "a SQLite store needs a file path: {STORE_URL_FORMS}"
            )));
        }
        if path.contains("://") {
            return Err(refuse(&format!("unknown scheme: {STORE_URL_FORMS}")));
        }
        Ok(Self::Sqlite(path.into()))
    }
}

/// Either backend, behind one API for what does not depend on the backend's transaction type.
#[derive(Clone)]
pub enum Store {
    /// The embedded SQLite store.
    Sqlite(SqliteStore),
    /// The cluster Postgres store.
    Postgres(PgStore),
}

macro_rules! dispatch {
    ($self:ident, $store:ident => $body:expr) => {
        match $self {
            Store::Sqlite($store) => $body,
            Store::Postgres($store) => $body,
        }
    };
}

impl Store {
    /// Applies pending migrations; returns the names applied now.
    pub async fn migrate(&self) -> Result<Vec<&'static str>, StoreError> {
        dispatch!(self, s => s.migrate().await)
    }

    /// Fails unless the schema is migrated to what this build needs (or to a newer version
    /// that builds knowing this one may still read: see [`migrate::check_readable`]).
    pub async fn ensure_migrated(&self) -> Result<(), StoreError> {
        dispatch!(self, s => s.ensure_migrated().await)
    }

    /// The schema version recorded in the store (0 when never migrated).
    pub async fn schema_version(&self) -> Result<i64, StoreError> {
        dispatch!(self, s => s.schema_version().await)
    }

    /// This backend's migration scripts, oldest first.
    pub fn migrations(&self) -> &'static [migrate::Migration] {
        match self {
            Store::Sqlite(_) => migrate::SQLITE,
            Store::Postgres(_) => migrate::POSTGRES,
        }
    }

    /// The newest schema version this build knows.
    pub fn known_version(&self) -> i64 {
        migrate::needed(self.migrations())
    }

    /// Fails with [`StoreError::NewerSchema`] when a newer build migrated the store: what
    /// rewrites or deletes data (`migrate`, `prune`, retention, `projections rebuild`) must not
    /// run on rows whose newer meaning this build does not know.
    pub async fn ensure_not_newer(&self, operation: &'static str) -> Result<(), StoreError> {
        let found = self.schema_version().await?;
        let known = self.known_version();
        if found > known {
            return Err(StoreError::NewerSchema {
                found,
                known,
                operation,
            });
        }
        Ok(())
    }

    /// The store's current time.
    pub async fn now(&self) -> Result<DateTime<Utc>, StoreError> {
        dispatch!(self, s => s.now().await)
    }

    /// Appends with optimistic concurrency and inline projection.
    pub async fn append(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
        last_sequence: i64,
        events: Vec<NewEvent>,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        dispatch!(self, s => s.append(aggregate_type, aggregate_id, last_sequence, events).await)
    }

    /// Loads one aggregate's events.
    pub async fn load(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        dispatch!(self, s => s.load(aggregate_type, aggregate_id).await)
    }

    /// Reads events after a position, in commit order.
    pub async fn read_after(
        &self,
        position: i64,
        limit: i64,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        dispatch!(self, s => s.read_after(position, limit).await)
    }

    /// Reads one aggregate's events matching `query`, in position order.
    pub async fn query_events(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
        query: EventQuery,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        dispatch!(self, s => s.query_events(aggregate_type, aggregate_id, query).await)
    }

    /// Runs one locked attempt on any aggregate (see [`executor`]).
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
        dispatch!(self, s => s.execute(target, decide).await)
    }

    /// Runs one attempt on any aggregate in the optimistic form (see [`executor`]): on
    /// Postgres an unlocked read and a version-checked write, two round trips where the locked
    /// form takes four. [`StoreError::Conflict`] means another attempt committed in between
    /// and nothing was written: run it again with [`Store::execute`]. On SQLite the same as
    /// [`Store::execute`].
    pub async fn execute_optimistic<A, T, E, F>(
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
        match self {
            Store::Sqlite(s) => s.execute(target, decide).await,
            Store::Postgres(s) => s.execute_optimistic(target, decide).await,
        }
    }

    /// One attempt, optimistic unless `*locked` (see [`Store::execute_optimistic`]). A conflict
    /// (another attempt committed between the read and the write; nothing was written) sets
    /// `*locked` and returns `None`: the caller decides again from a fresh state and calls
    /// this again, which then runs locked and cannot conflict.
    pub async fn attempt<A, T, E, F>(
        &self,
        target: A,
        decide: F,
        locked: &mut bool,
    ) -> Result<Option<Result<T, E>>, StoreError>
    where
        A: LockedAggregate,
        T: Send + 'static,
        E: Send + 'static,
        F: Decide<A, T, E> + 'static,
    {
        let mut form = if *locked {
            AttemptForm::Locked
        } else {
            AttemptForm::Optimistic
        };
        let attempted = self.attempt_in(target, decide, &mut form).await?;
        if attempted.is_none() {
            *locked = true;
        }
        Ok(attempted.map(|attempted| attempted.outcome))
    }

    /// One attempt in `*form` (see [`AttemptForm`]), which the call consumes: afterwards
    /// `*form` holds [`AttemptForm::after_conflict`] of it. A conflict (what the decision read
    /// or assumed moved before its write; nothing was written) returns `None`: the caller
    /// decides again from a fresh state and calls this again, in that next form. SQLite runs
    /// every form locked (one writer, no round trips to save) and reports no version.
    pub async fn attempt_in<A, T, E, F>(
        &self,
        target: A,
        decide: F,
        form: &mut AttemptForm<A::Observed>,
    ) -> Result<Option<Attempted<Result<T, E>>>, StoreError>
    where
        A: LockedAggregate,
        T: Send + 'static,
        E: Send + 'static,
        F: Decide<A, T, E> + 'static,
    {
        let next = form.after_conflict();
        let this = std::mem::replace(form, next);
        let attempted = match self {
            Store::Sqlite(s) => s.execute(target, decide).await.map(|outcome| Attempted {
                outcome,
                version: None,
            }),
            Store::Postgres(s) => s.attempt_in(target, decide, this).await,
        };
        match attempted {
            Err(StoreError::Conflict { .. }) => Ok(None),
            other => other.map(Some),
        }
    }

    /// Runs one locked declaration attempt (see [`group`]).
    pub async fn execute_group<T, E, F>(
        &self,
        lock: GroupLock,
        decide: F,
    ) -> Result<Result<T, E>, StoreError>
    where
        T: Send + 'static,
        E: Send + 'static,
        F: FnOnce(&GroupSnapshot) -> GroupDecision<T, E> + Send + 'static,
    {
        self.execute(lock, decide).await
    }

    /// Refreshes an instance's heartbeat; `false` when it has no row.
    pub async fn heartbeat(&self, group: &str, declarer: &str) -> Result<bool, StoreError> {
        dispatch!(self, s => s.heartbeat(group, declarer).await)
    }

    /// Removes an instance on graceful shutdown.
    pub async fn leave(&self, group: &str, declarer: &str) -> Result<bool, StoreError> {
        dispatch!(self, s => s.leave(group, declarer).await)
    }

    /// Recorded worker instances.
    pub async fn instances(
        &self,
        group: Option<String>,
    ) -> Result<Vec<InstanceRecord>, StoreError> {
        dispatch!(self, s => s.instances(group).await)
    }

    /// A catch-up projector's checkpoint.
    pub async fn checkpoint(&self, projector: &'static str) -> Result<i64, StoreError> {
        dispatch!(self, s => s.checkpoint(projector).await)
    }

    /// A short name of the backend, for logs and health output.
    pub fn backend(&self) -> &'static str {
        match self {
            Store::Sqlite(_) => "sqlite",
            Store::Postgres(_) => "postgres",
        }
    }
}
