//! Projector contracts: how read models follow the ledger on each backend.
//!
//! One projector type serves three roles: inline (run inside the append transaction, its error
//! rolls the events back), catch-up (run from a durable checkpoint) and rebuild (a replay of
//! the whole log in position order after `reset`). Every value a projector writes must be
//! derived from events alone, so a rebuild reproduces its tables exactly.
//!
//! A [`RowProjector`] states what an event does to its tables once, as values ([`RowChange`]),
//! and the store does the rest (ADR 0077): SQLite executes the changes in the append
//! transaction, Postgres renders them as data-modifying CTEs of the event's own insert (ADR
//! 0010), and a rebuild folds the very same changes into an in-memory image of the tables,
//! written in bulk at the end (ADR 0025). Every row projector is a [`SqliteProjector`] and a
//! [`PgProjector`]; a projector that writes by hand implements those two instead, and a
//! rebuild applies it event by event.

use std::any::Any;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::PgArguments;
use sqlx::{Arguments, Encode, PgConnection, Postgres, Type};

use crate::error::StoreError;
use crate::event::{EventRef, RecordedEvent};

mod sql;

pub(crate) use sql::{literal, on_conflict_sql, push_literal, row_sql};

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
    /// The projector as row changes, or `None` (the default) for one that writes by hand: a
    /// rebuild folds a row projector's changes in memory and writes its tables in bulk, and
    /// applies the others event by event.
    fn rows(&self) -> Option<&dyn RowProjector> {
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
    /// (ADR 0037). An implementation must write exactly what `apply` writes: `rebuild
    /// --verify` compares the two. (A [`RowProjector`] always fuses: its changes are rendered
    /// as the statement's CTEs.)
    fn fuse(
        &self,
        _event: &EventRef<'_>,
        _position: &str,
        _statement: &mut CteStatement,
    ) -> Result<bool, StoreError> {
        Ok(false)
    }
    /// The projector as row changes; see [`SqliteProjector::rows`].
    fn rows(&self) -> Option<&dyn RowProjector> {
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

    /// A CTE name from `stem` that no CTE added so far has (`stem_n`, n the CTEs before it).
    pub fn next_name(&self, stem: &str) -> String {
        format!("{stem}_{}", self.ctes.len())
    }

    /// True when no CTE was added.
    pub fn is_empty(&self) -> bool {
        self.ctes.is_empty()
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

// ---------------------------------------------------------------------------------------------
// Row changes (ADR 0077)
// ---------------------------------------------------------------------------------------------

/// A projector whose every write is a [`RowChange`] it states from the event alone. The store
/// executes the changes on SQLite, renders them as CTEs of the event's insert on Postgres, and
/// folds them into an image of the tables on a rebuild, so the three cannot drift apart.
///
/// **One event's changes must not depend on one another's effects.** SQLite and a rebuild
/// apply them in order; on Postgres they are CTEs of one statement, which all see the rows as
/// they were before it (ADR 0010). So no two changes of one event may touch the same row, and
/// a change whose condition reads rows another change of the event writes must name a
/// condition that holds either way (see [`RowChange::DeleteUnless`]).
pub trait RowProjector: Send + Sync {
    /// A stable name: the checkpoint key and the name in errors.
    fn name(&self) -> &'static str;
    /// The tables it owns (compared by `rebuild --verify`), which its changes name.
    fn tables(&self) -> &'static [&'static str];
    /// The aggregate types whose events change anything, or `None` for "any": the others are
    /// not handed to [`changes`](Self::changes) at all.
    fn aggregate_types(&self) -> Option<&'static [&'static str]>;
    /// Appends to `changes` what `event` does to the projector's tables, in order (nothing,
    /// for an event it ignores). `decoded` is the event's scratch, shared with the other
    /// projectors of the same event, so its payload is decoded once ([`EventView::decode`]);
    /// `changes` is the caller's, so a rebuild reuses one buffer for the whole log.
    fn changes(
        &self,
        event: &EventView<'_>,
        decoded: &mut Decoded,
        changes: &mut Vec<RowChange>,
    ) -> Result<(), StoreError>;
}

/// An event as a rebuild reads it: the payload is the JSON text the ledger holds, unparsed, so
/// a projector decodes it once, straight into its own type.
#[derive(Debug, Clone, Copy)]
pub struct ReplayEvent<'a> {
    /// The global position.
    pub position: i64,
    /// The aggregate's type.
    pub aggregate_type: &'a str,
    /// The aggregate's id.
    pub aggregate_id: &'a str,
    /// Per-aggregate sequence.
    pub sequence: i64,
    /// The event's type name.
    pub event_type: &'a str,
    /// The event body, as JSON text.
    pub payload: &'a str,
}

/// Scratch shared by the projectors of one event: the first to decode the payload leaves its
/// decoded form here, and a later one that wants the same type takes it instead of decoding
/// again. The store never looks inside.
#[derive(Default)]
pub struct Decoded(Option<Box<dyn Any + Send>>);

impl Decoded {
    /// The decoded `T`, from the scratch when an earlier replay left one, else from `decode`
    /// (which then replaces whatever the scratch held).
    pub fn get_or_decode<T, F>(&mut self, decode: F) -> Result<&T, StoreError>
    where
        T: Any + Send,
        F: FnOnce() -> Result<T, StoreError>,
    {
        let held = self.0.as_ref().is_some_and(|b| b.is::<T>());
        if !held {
            self.0 = Some(Box::new(decode()?));
        }
        self.0
            .as_ref()
            .and_then(|b| b.downcast_ref::<T>())
            .ok_or_else(|| StoreError::Task("replay scratch lost its value".to_owned()))
    }
}

/// An event as a [`RowProjector`] reads it: the payload is its JSON text. The event's position
/// is not known while Postgres inserts it: a change names it as [`Value::Position`].
#[derive(Debug, Clone, Copy)]
pub struct EventView<'a> {
    /// The global position, for error messages (`None` while the event is inserted).
    pub position: Option<i64>,
    /// The aggregate's type.
    pub aggregate_type: &'a str,
    /// The aggregate's id.
    pub aggregate_id: &'a str,
    /// Per-aggregate sequence.
    pub sequence: i64,
    /// The event's type name.
    pub event_type: &'a str,
    /// The event body, as JSON text.
    pub payload: &'a str,
}

impl<'a> EventView<'a> {
    /// The view of an event being inserted or recorded.
    pub fn of(event: &EventRef<'a>) -> Self {
        Self {
            position: event.position,
            aggregate_type: event.aggregate_type,
            aggregate_id: event.aggregate_id,
            sequence: event.sequence,
            event_type: event.event_type,
            payload: event.payload.get(),
        }
    }

    /// The view of an event a rebuild reads.
    pub fn of_replay(event: &ReplayEvent<'a>) -> Self {
        Self {
            position: Some(event.position),
            aggregate_type: event.aggregate_type,
            aggregate_id: event.aggregate_id,
            sequence: event.sequence,
            event_type: event.event_type,
            payload: event.payload,
        }
    }

    /// The payload as `T`, decoded by `decode(event_type, payload)` unless an earlier
    /// projector of the same event left one in `decoded`.
    pub fn decode_with<'d, T, E, F>(
        &self,
        decoded: &'d mut Decoded,
        decode: F,
    ) -> Result<&'d T, StoreError>
    where
        T: std::any::Any + Send,
        E: std::fmt::Display,
        F: FnOnce(&str, &str) -> Result<T, E>,
    {
        let view = *self;
        decoded.get_or_decode(move || {
            decode(view.event_type, view.payload).map_err(|e| {
                let at = format!(
                    "{}/{}#{}",
                    view.aggregate_type, view.aggregate_id, view.sequence
                );
                StoreError::decode(view.position.unwrap_or(0), format!("{at}: {e}"))
            })
        })
    }

    /// The payload deserialized as `T`, once per event (see [`decode_with`](Self::decode_with)).
    pub fn decode<'d, T>(&self, decoded: &'d mut Decoded) -> Result<&'d T, StoreError>
    where
        T: serde::de::DeserializeOwned + std::any::Any + Send,
    {
        self.decode_with(decoded, |_, payload| serde_json::from_str::<T>(payload))
    }
}

/// A column's name.
pub type Column = &'static str;

/// A column value as a projector states it; each backend writes it in its own type.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Value {
    /// SQL `NULL` (written as the literal).
    Null,
    /// Text (shared: a projector that names the same text in several changes clones it for
    /// nothing).
    Text(Arc<str>),
    /// Text the projector names as a constant (a state, a status): written as a literal, so
    /// that a partial index whose predicate names it can serve the statement. Equal to the
    /// same [`Value::Text`] in a condition.
    Const(&'static str),
    /// An integer (every integer column: SQLite `INTEGER`, Postgres `BIGINT` or `SMALLINT`).
    Int(i64),
    /// A time: Postgres `TIMESTAMPTZ`, SQLite microseconds since the epoch.
    Time(DateTime<Utc>),
    /// A list of text: Postgres `TEXT[]`, SQLite the text of a JSON array (shared, as text is).
    TextList(Arc<[String]>),
    /// The event's own position (on Postgres, the inserted row's, known inside the statement).
    Position,
    /// One text per row of a change over many rows.
    EachText(Vec<String>),
    /// One integer (or `NULL`) per row of a change over many rows.
    EachInt(Vec<Option<i64>>),
}

impl Value {
    /// The number of rows a per-row value holds; `None` for a value of every row.
    pub fn rows(&self) -> Option<usize> {
        match self {
            Self::EachText(list) => Some(list.len()),
            Self::EachInt(list) => Some(list.len()),
            _ => None,
        }
    }

    /// Text.
    pub fn text(text: &str) -> Self {
        Self::Text(text.into())
    }

    /// A list of text.
    pub fn list(list: Vec<String>) -> Self {
        Self::TextList(list.into())
    }

    /// A list of text, or `NULL` for `None`.
    pub fn list_or_null(list: Option<Vec<String>>) -> Self {
        list.map_or(Self::Null, Self::list)
    }
}

/// A condition on a row's column, as SQL reads it (`NULL` compares equal only to [`Value::Null`],
/// through `IS NULL`; any other comparison with a `NULL` column fails).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Test {
    /// The column equals the value.
    Eq(Column, Value),
    /// The column differs from the value.
    Ne(Column, Value),
    /// Any of the conditions holds.
    Any(Vec<Test>),
}

/// What an upsert does when a row with its key exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnConflict {
    /// Keeps the row as it is.
    Nothing,
    /// Sets the row's columns to the change's values.
    Update {
        /// Columns written by the insert only, kept on a conflict.
        keep: &'static [Column],
        /// A column (not among the change's columns) that counts the row's upserts: 1 on the
        /// insert, one more on each conflict.
        counter: Option<Column>,
        /// Updates only when the change's value of this column is greater than the row's.
        if_greater: Option<Column>,
    },
}

impl OnConflict {
    /// Sets every column the change names.
    pub const SET: Self = Self::Update {
        keep: &[],
        counter: None,
        if_greater: None,
    };
}

/// Whether a table holds a row within a key and passing some conditions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exists {
    /// The table read.
    pub table: &'static str,
    /// Its first key column, and the value the rows must have there.
    pub within: (Column, Value),
    /// The conditions the row must pass.
    pub tests: Vec<Test>,
}

/// One change to a projection table, as a value. `values` hold the key's values and then the
/// columns', in the order the change names them; a [`Value::EachText`] or [`Value::EachInt`]
/// among them makes the change one over many rows, one per element (every per-row value of a
/// change has as many; the other values are every row's). Conditions (`within`, tests) take
/// single values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowChange {
    /// Inserts the row, or does what `on_conflict` says when its key exists.
    Upsert {
        /// The table.
        table: &'static str,
        /// Its primary key's columns.
        key: &'static [Column],
        /// The other columns written.
        columns: &'static [Column],
        /// The key's values, then the columns'.
        values: Vec<Value>,
        /// What a row with the same key gets.
        on_conflict: OnConflict,
    },
    /// Sets columns of the row with the key, if there is one.
    Update {
        /// The table.
        table: &'static str,
        /// Its primary key's columns.
        key: &'static [Column],
        /// The columns set.
        columns: &'static [Column],
        /// The key's values, then the columns'.
        values: Vec<Value>,
    },
    /// Deletes the row with the key, if there is one.
    Delete {
        /// The table.
        table: &'static str,
        /// Its primary key's columns.
        key: &'static [Column],
        /// The key's values.
        values: Vec<Value>,
    },
    /// Sets columns of every row with the value in the first key column that passes the tests.
    UpdateWhere {
        /// The table.
        table: &'static str,
        /// Its first key column, and the rows' value there.
        within: (Column, Value),
        /// The conditions a row must pass.
        tests: Vec<Test>,
        /// The columns set.
        columns: &'static [Column],
        /// Their values.
        values: Vec<Value>,
    },
    /// Deletes every row with the value in the first key column that passes the tests.
    DeleteWhere {
        /// The table.
        table: &'static str,
        /// Its first key column, and the rows' value there.
        within: (Column, Value),
        /// The conditions a row must pass.
        tests: Vec<Test>,
    },
    /// Deletes the row with the key unless `unless` finds a row. Its tests must find what is
    /// left after the event's other changes whether or not it sees them (they may run in the
    /// same statement, ADR 0010).
    DeleteUnless {
        /// The table.
        table: &'static str,
        /// Its primary key's columns.
        key: &'static [Column],
        /// The key's values.
        values: Vec<Value>,
        /// The rows whose existence keeps it.
        unless: Exists,
    },
}

impl RowChange {
    /// The table it changes.
    pub fn table(&self) -> &'static str {
        match self {
            Self::Upsert { table, .. }
            | Self::Update { table, .. }
            | Self::Delete { table, .. }
            | Self::UpdateWhere { table, .. }
            | Self::DeleteWhere { table, .. }
            | Self::DeleteUnless { table, .. } => table,
        }
    }

    /// The values it writes or finds rows by: the key's and the columns'.
    pub fn values(&self) -> &[Value] {
        match self {
            Self::Upsert { values, .. }
            | Self::Update { values, .. }
            | Self::Delete { values, .. }
            | Self::UpdateWhere { values, .. }
            | Self::DeleteUnless { values, .. } => values,
            Self::DeleteWhere { .. } => &[],
        }
    }

    /// How many rows its per-row values give (`None`: a change of one row); an error when
    /// they disagree or a change by condition has one.
    pub fn rows(&self) -> Result<Option<usize>, StoreError> {
        let mut rows = None;
        for n in self.values().iter().filter_map(Value::rows) {
            if rows.is_some_and(|m| m != n) {
                return Err(self.malformed("per-row values of different lengths"));
            }
            rows = Some(n);
        }
        if rows.is_some()
            && matches!(
                self,
                Self::UpdateWhere { .. } | Self::DeleteWhere { .. } | Self::DeleteUnless { .. }
            )
        {
            return Err(self.malformed("per-row values in a change by condition"));
        }
        Ok(rows)
    }

    /// The error for a change the store cannot write.
    pub(crate) fn malformed(&self, why: &str) -> StoreError {
        StoreError::Task(format!(
            "a row change of {} is malformed: {why}",
            self.table()
        ))
    }

    /// Checks that `values` has one value per named column.
    pub(crate) fn check_width(&self) -> Result<(), StoreError> {
        let wanted = match self {
            Self::Upsert { key, columns, .. } | Self::Update { key, columns, .. } => {
                key.len() + columns.len()
            }
            Self::Delete { key, .. } | Self::DeleteUnless { key, .. } => key.len(),
            Self::UpdateWhere { columns, .. } => columns.len(),
            Self::DeleteWhere { .. } => 0,
        };
        if self.values().len() != wanted {
            return Err(self.malformed("not one value per column"));
        }
        Ok(())
    }
}
