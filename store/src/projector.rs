//! Projector contracts: how read models follow the ledger on each backend.
//!
//! One projector type serves three roles: inline (run inside the append transaction, its error
//! rolls the events back), catch-up (run from a durable checkpoint) and rebuild (a replay of
//! the whole log in position order after `reset`). Every value a projector writes must be
//! derived from events alone, so a rebuild reproduces its tables exactly. A projector may offer
//! a set-based [`SqliteReplay`]/[`PgReplay`] for rebuilds: a fold of the log in memory whose
//! rows are written in bulk at the end (ADR 0025); without one, a rebuild applies it event by
//! event.

use async_trait::async_trait;
use sqlx::postgres::PgArguments;
use sqlx::{Arguments, Encode, PgConnection, Postgres, Type};

use crate::error::StoreError;
use crate::event::{EventRef, RecordedEvent};
use crate::rebuild::{Decoded, ReplayEvent, ReplayTarget};

/// A projector over a SQLite transaction.
pub trait SqliteProjector: Send + Sync {
    /// A stable name: the checkpoint key and the name in errors.
    fn name(&self) -> &'static str;
    /// The tables it owns (compared by `rebuild --verify`).
    fn tables(&self) -> &'static [&'static str];
    /// Empties its tables before a replay.
    fn reset(&self, tx: &rusqlite::Transaction<'_>) -> Result<(), StoreError> {
        for table in self.tables() {
            tx.execute(&format!("DELETE FROM {table}"), [])?;
        }
        Ok(())
    }
    /// Applies one event (ignoring events it does not care about).
    fn apply(
        &self,
        tx: &rusqlite::Transaction<'_>,
        event: &RecordedEvent,
    ) -> Result<(), StoreError>;
    /// A set-based replay for rebuilds, or `None` (the default) to be applied event by event.
    fn replay(&self) -> Option<Box<dyn SqliteReplay>> {
        None
    }
    /// The aggregate types whose events `apply` acts on, or `None` (the default) for "any".
    /// A rebuild hands a projector applied event by event only those, and skips building the
    /// event (parsing its JSON) for the others: `apply` must ignore every event of a type
    /// not listed.
    fn aggregate_types(&self) -> Option<&'static [&'static str]> {
        None
    }
}

/// A set-based replay of one SQLite projector: folds every event, in position order, in
/// memory, then writes the rows its tables end with into the (reset) tables. What it writes
/// must equal what `apply`, event by event, leaves.
pub trait SqliteReplay: Send {
    /// Folds one event (ignoring events the projector does not care about); `decoded` is the
    /// event's scratch, shared with the other replays.
    fn fold(&mut self, event: &ReplayEvent<'_>, decoded: &mut Decoded) -> Result<(), StoreError>;
    /// Writes the folded rows.
    fn write(self: Box<Self>, tx: &rusqlite::Transaction<'_>) -> Result<(), StoreError>;
}

/// The Postgres twin of [`SqliteReplay`].
#[async_trait]
pub trait PgReplay: Send {
    /// Folds one event (ignoring events the projector does not care about); `decoded` is the
    /// event's scratch, shared with the other replays.
    fn fold(&mut self, event: &ReplayEvent<'_>, decoded: &mut Decoded) -> Result<(), StoreError>;
    /// Writes the folded rows into `target`'s tables (each of its tables, by
    /// [`ReplayTarget::table`]).
    async fn write(
        self: Box<Self>,
        conn: &mut PgConnection,
        target: ReplayTarget,
    ) -> Result<(), StoreError>;
}

/// A projector over a Postgres transaction.
#[async_trait]
pub trait PgProjector: Send + Sync {
    /// A stable name: the checkpoint key and the name in errors.
    fn name(&self) -> &'static str;
    /// The tables it owns (compared by `rebuild --verify`).
    fn tables(&self) -> &'static [&'static str];
    /// Empties its tables before a replay.
    async fn reset(&self, conn: &mut PgConnection) -> Result<(), StoreError> {
        for table in self.tables() {
            sqlx::query(&format!("DELETE FROM {table}"))
                .execute(&mut *conn)
                .await?;
        }
        Ok(())
    }
    /// Applies one event (ignoring events it does not care about).
    async fn apply(&self, conn: &mut PgConnection, event: &RecordedEvent)
        -> Result<(), StoreError>;
    /// Writes this event's projection as data-modifying CTEs of the statement that inserts the
    /// event, instead of a statement of its own after it: one round trip fewer per append.
    /// `position` is the SQL expression of the event's position (the inserted row's, there).
    /// Returns true when the statement now holds everything the projector writes for the event
    /// (nothing, for an event it ignores), false, the default, for "apply me afterwards
    /// instead": the optimistic executor's one-statement write needs every projector to fuse
    /// (ADR 0037). An implementation must
    /// write exactly what `apply` writes: rebuilds replay through `apply` and
    /// `rebuild --verify` compares the two.
    fn fuse(
        &self,
        _event: &EventRef<'_>,
        _position: &str,
        _statement: &mut CteStatement,
    ) -> Result<bool, StoreError> {
        Ok(false)
    }
    /// A set-based replay for rebuilds, or `None` (the default) to be applied event by event.
    fn replay(&self) -> Option<Box<dyn PgReplay>> {
        None
    }
    /// The aggregate types whose events `apply` acts on, or `None` (the default) for "any";
    /// see [`SqliteProjector::aggregate_types`].
    fn aggregate_types(&self) -> Option<&'static [&'static str]> {
        None
    }
}

/// A Postgres statement built from data-modifying CTEs and numbered parameters: what
/// [`PgProjector::fuse`] adds to an append. CTEs run even when nothing reads them; they see
/// one snapshot, so two of them must never touch the same row.
#[derive(Default)]
pub struct CteStatement {
    ctes: Vec<String>,
    args: PgArguments,
}

impl CteStatement {
    /// Binds `value` as the next parameter and returns its placeholder (`$n`).
    pub fn bind<'q, T>(&mut self, value: T) -> Result<String, StoreError>
    where
        T: Encode<'q, Postgres> + Type<Postgres> + Send + 'q,
    {
        self.args
            .add(value)
            .map_err(|e| StoreError::Postgres(sqlx::Error::Encode(e)))?;
        Ok(format!("${}", self.args.len()))
    }

    /// Adds a CTE named `name` (unique within the statement) with `body`.
    pub fn cte(&mut self, name: &str, body: &str) {
        self.ctes.push(format!("{name} AS ({body})"));
    }

    /// The statement `WITH <ctes> <main>` and its arguments.
    pub fn finish(self, main: &str) -> (String, PgArguments) {
        let sql = if self.ctes.is_empty() {
            main.to_owned()
        } else {
            format!("WITH {} {main}", self.ctes.join(", "))
        };
        (sql, self.args)
    }
}
