//! Appending, loading and paging events on SQLite, and catch-up from a checkpoint.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use rusqlite::types::{ToSql, ToSqlOutput, ValueRef};
use rusqlite::{params, OptionalExtension, Row, Transaction};

use super::SqliteStore;
use crate::catch_up::{self, CatchUpBatch, CatchUpRunner};
use crate::error::StoreError;
use crate::event::{from_micros, EventQuery, NewEvent, Payload, RecordedEvent};
use crate::projector::{
    push_literal, row_sql, EventView, RowChange, RowProjector, SqliteProjector, Value,
};
use crate::ready::run_ready;
use crate::rebuild::{wants, Decoded, RawRow};

const SELECT_EVENT: &str = "SELECT position, aggregate_type, aggregate_id, sequence, event_type, \
     event_version, payload, metadata, recorded_at FROM events";

/// Appends `events` to an aggregate whose last sequence the caller saw as `last_sequence`, then
/// runs every inline projector on them, all inside `tx`. A taken sequence is a
/// [`StoreError::Conflict`]; a projector error aborts the caller's transaction.
pub fn append_in_tx(
    tx: &Transaction<'_>,
    projectors: &[Arc<dyn SqliteProjector>],
    now: DateTime<Utc>,
    aggregate_type: &str,
    aggregate_id: &str,
    last_sequence: i64,
    events: Vec<NewEvent>,
) -> Result<Vec<RecordedEvent>, StoreError> {
    let mut recorded = Vec::with_capacity(events.len());
    let mut insert = tx.prepare_cached(
        "INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, event_version, \
         payload, metadata, recorded_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?;
    for (offset, event) in events.into_iter().enumerate() {
        let sequence = last_sequence + 1 + offset as i64;
        let result = insert.execute(params![
            aggregate_type,
            aggregate_id,
            sequence,
            event.event_type,
            event.event_version,
            event.payload.get(),
            event.metadata.to_string(),
            now.timestamp_micros(),
        ]);
        if let Err(rusqlite::Error::SqliteFailure(e, _)) = &result {
            if e.code == rusqlite::ErrorCode::ConstraintViolation {
                return Err(StoreError::Conflict {
                    aggregate_type: aggregate_type.to_owned(),
                    aggregate_id: aggregate_id.to_owned(),
                    sequence,
                });
            }
        }
        result?;
        recorded.push(RecordedEvent {
            position: tx.last_insert_rowid(),
            aggregate_type: aggregate_type.to_owned(),
            aggregate_id: aggregate_id.to_owned(),
            sequence,
            event_type: event.event_type,
            event_version: event.event_version,
            payload: event.payload,
            metadata: event.metadata,
            recorded_at: from_micros(now.timestamp_micros()),
        });
    }
    for event in &recorded {
        // One scratch per event: its payload is decoded once for every row projector.
        let mut decoded = Decoded::default();
        for projector in projectors {
            let applied = match projector.rows() {
                Some(rows) => apply_rows(tx, rows, event, &mut decoded),
                None => projector.apply(tx, event),
            };
            applied.map_err(|e| StoreError::in_projector(projector.name(), e))?;
        }
    }
    Ok(recorded)
}

/// Applies a row projector to one recorded event: its changes, executed in order.
fn apply_rows(
    tx: &Transaction<'_>,
    rows: &dyn RowProjector,
    event: &RecordedEvent,
    decoded: &mut Decoded,
) -> Result<(), StoreError> {
    if !wants(rows.aggregate_types(), &event.aggregate_type) {
        return Ok(());
    }
    let mut changes = Vec::new();
    rows.changes(&EventView::of(&event.as_ref()), decoded, &mut changes)?;
    execute_changes(tx, &changes, event.position)
}

/// A row projector on SQLite: its changes run as statements in the caller's transaction.
impl<T: RowProjector> SqliteProjector for T {
    fn name(&self) -> &'static str {
        RowProjector::name(self)
    }

    fn tables(&self) -> &'static [&'static str] {
        RowProjector::tables(self)
    }

    fn apply(&self, tx: &Transaction<'_>, event: &RecordedEvent) -> Result<(), StoreError> {
        apply_rows(tx, self, event, &mut Decoded::default())
    }

    fn rows(&self) -> Option<&dyn RowProjector> {
        Some(self)
    }

    fn aggregate_types(&self) -> Option<&'static [&'static str]> {
        RowProjector::aggregate_types(self)
    }
}

/// Executes row changes in `tx`, in order, each as one cached statement (run once per row of a
/// change over many rows); `position` is the event's. Constants and `NULL` are literals of the
/// statement, every other value a parameter.
pub(crate) fn execute_changes(
    tx: &Transaction<'_>,
    changes: &[RowChange],
    position: i64,
) -> Result<(), StoreError> {
    for change in changes {
        let mut params: Vec<&Value> = Vec::new();
        let sql = row_sql(change, &mut |value, sql| {
            match value {
                Value::Null => sql.push_str("NULL"),
                Value::Const(text) => push_literal(sql, text),
                other => {
                    params.push(other);
                    sql.push('?');
                    sql.push_str(&params.len().to_string());
                }
            }
            Ok(())
        })?;
        let mut statement = tx.prepare_cached(&sql)?;
        for row in 0..change.rows()?.unwrap_or(1) {
            statement.execute(rusqlite::params_from_iter(
                params.iter().map(|value| Cell::new(value, row, position)),
            ))?;
        }
    }
    Ok(())
}

/// A value as a SQLite parameter: text and integers as themselves, a time as microseconds, a
/// list as the text of a JSON array, a per-row value as its `row`'s.
pub(crate) struct Cell<'a> {
    value: &'a Value,
    row: usize,
    position: i64,
}

impl<'a> Cell<'a> {
    /// The value as row `row`'s parameter, `position` the event's.
    pub(crate) fn new(value: &'a Value, row: usize, position: i64) -> Self {
        Self {
            value,
            row,
            position,
        }
    }
}

impl ToSql for Cell<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        use rusqlite::types::Value as Owned;
        let missing = || {
            rusqlite::Error::ToSqlConversionFailure(
                format!("a per-row value has no row {}", self.row).into(),
            )
        };
        Ok(match self.value {
            Value::Null => ToSqlOutput::Owned(Owned::Null),
            Value::Text(text) => ToSqlOutput::Borrowed(ValueRef::Text(text.as_bytes())),
            Value::Const(text) => ToSqlOutput::Borrowed(ValueRef::Text(text.as_bytes())),
            Value::Int(n) => ToSqlOutput::Owned(Owned::Integer(*n)),
            Value::Time(at) => ToSqlOutput::Owned(Owned::Integer(at.timestamp_micros())),
            Value::TextList(list) => ToSqlOutput::Owned(Owned::Text(json_list(list))),
            Value::Position => ToSqlOutput::Owned(Owned::Integer(self.position)),
            Value::EachText(list) => {
                let text = list.get(self.row).ok_or_else(missing)?;
                ToSqlOutput::Borrowed(ValueRef::Text(text.as_bytes()))
            }
            Value::EachInt(list) => match list.get(self.row).ok_or_else(missing)? {
                Some(n) => ToSqlOutput::Owned(Owned::Integer(*n)),
                None => ToSqlOutput::Owned(Owned::Null),
            },
        })
    }
}

/// A list as the text of a JSON array, as SQLite's projection tables hold it.
fn json_list(list: &[String]) -> String {
    serde_json::to_string(list).unwrap_or_default()
}

/// Loads one aggregate's events in sequence order.
pub fn load_in_tx(
    conn: &rusqlite::Connection,
    aggregate_type: &str,
    aggregate_id: &str,
) -> Result<Vec<RecordedEvent>, StoreError> {
    load_after_in_tx(conn, aggregate_type, aggregate_id, 0)
}

/// Loads one aggregate's events after sequence `after`, in sequence order.
pub fn load_after_in_tx(
    conn: &rusqlite::Connection,
    aggregate_type: &str,
    aggregate_id: &str,
    after: i64,
) -> Result<Vec<RecordedEvent>, StoreError> {
    let mut stmt = conn.prepare_cached(&format!(
        "{SELECT_EVENT} WHERE aggregate_type = ?1 AND aggregate_id = ?2 AND sequence > ?3 \
         ORDER BY sequence"
    ))?;
    let rows = stmt.query_map(params![aggregate_type, aggregate_id, after], raw_event)?;
    rows.map(|row| row?.decode()).collect()
}

/// Reads up to `limit` events after `position`, in position (= commit) order.
pub fn read_after_in_tx(
    conn: &rusqlite::Connection,
    position: i64,
    limit: i64,
) -> Result<Vec<RecordedEvent>, StoreError> {
    let mut stmt = conn.prepare_cached(&format!(
        "{SELECT_EVENT} WHERE position > ?1 ORDER BY position LIMIT ?2"
    ))?;
    let rows = stmt.query_map(params![position, limit], raw_event)?;
    rows.map(|row| row?.decode()).collect()
}

/// The catch-up check: the log's head (0 when empty) and the projector's checkpoint (0 when it
/// never ran), `?1` the projector. Both are single index lookups (the rowid's end, the
/// checkpoint's key), so the check costs the same at any ledger size.
pub const CATCH_UP_CHECK: &str = "SELECT COALESCE((SELECT MAX(position) FROM events), 0), \
     COALESCE((SELECT position FROM projection_checkpoint WHERE projector = ?1), 0)";

/// One aggregate's events after a position, filtered, in position order: `?1` type, `?2` id,
/// `?3` the position to start after, `?4`/`?5` the recorded-at bounds (micros), `?6`/`?7` a
/// payload field and its value (each NULL: no filter), `?8` the count.
///
/// Within one aggregate, sequence order is position order (one writer; an append reads the
/// aggregate's last sequence), so the read walks the aggregate's key `(type, id, sequence)` in
/// order from the sequence of the event at `?3` (one keyed look-up; 0 when that position is
/// not this aggregate's, where `position > ?3` alone bounds the walk): a page costs its own
/// rows however long the aggregate's ledger is. Ordering by position sorted every event of
/// the aggregate.
pub const QUERY_EVENTS: &str = "SELECT position, aggregate_type, aggregate_id, sequence, \
     event_type, event_version, payload, metadata, recorded_at FROM events \
     WHERE aggregate_type = ?1 AND aggregate_id = ?2 \
     AND sequence > COALESCE((SELECT c.sequence FROM events c WHERE c.position = ?3 \
       AND c.aggregate_type = ?1 AND c.aggregate_id = ?2), 0) \
     AND position > ?3 \
     AND (?4 IS NULL OR recorded_at >= ?4) AND (?5 IS NULL OR recorded_at < ?5) \
     AND (?6 IS NULL OR json_extract(payload, '$.' || ?6) = ?7) \
     ORDER BY sequence LIMIT ?8";

/// The events of a bounded position range, `?1 < position <= ?2`, in position order (a range
/// of the rowid).
pub const EVENTS_IN_RANGE: &str = "SELECT position, aggregate_type, aggregate_id, sequence, \
     event_type, event_version, payload, metadata, recorded_at FROM events \
     WHERE position > ?1 AND position <= ?2 ORDER BY position";

/// Reads the events with `after < position <= through`, in position (= commit) order.
pub fn read_range_in_tx(
    conn: &rusqlite::Connection,
    after: i64,
    through: i64,
) -> Result<Vec<RecordedEvent>, StoreError> {
    let mut stmt = conn.prepare_cached(EVENTS_IN_RANGE)?;
    let rows = stmt.query_map(params![after, through], raw_event)?;
    rows.map(|row| row?.decode()).collect()
}

/// Reads the rows with `after < position <= through` for a rebuild, JSON unparsed.
pub(crate) fn read_raw_range_in_tx(
    conn: &rusqlite::Connection,
    after: i64,
    through: i64,
) -> Result<Vec<RawRow>, StoreError> {
    let mut stmt = conn.prepare_cached(EVENTS_IN_RANGE)?;
    let rows = stmt.query_map(params![after, through], raw_event)?;
    rows.map(|row| {
        let raw = row?;
        Ok(RawRow {
            position: raw.position,
            aggregate_type: raw.aggregate_type,
            aggregate_id: raw.aggregate_id,
            sequence: raw.sequence,
            event_type: raw.event_type,
            event_version: raw.event_version,
            payload: raw.payload,
            metadata: raw.metadata,
            recorded_at: from_micros(raw.recorded_at),
        })
    })
    .collect()
}

/// A row as read, before its JSON is parsed (so a bad payload is a decode error, not a panic).
struct RawEvent {
    position: i64,
    aggregate_type: String,
    aggregate_id: String,
    sequence: i64,
    event_type: String,
    event_version: String,
    payload: String,
    metadata: String,
    recorded_at: i64,
}

fn raw_event(row: &Row<'_>) -> rusqlite::Result<RawEvent> {
    Ok(RawEvent {
        position: row.get(0)?,
        aggregate_type: row.get(1)?,
        aggregate_id: row.get(2)?,
        sequence: row.get(3)?,
        event_type: row.get(4)?,
        event_version: row.get(5)?,
        payload: row.get(6)?,
        metadata: row.get(7)?,
        recorded_at: row.get(8)?,
    })
}

impl RawEvent {
    fn decode(self) -> Result<RecordedEvent, StoreError> {
        let parse = |text: &str| {
            serde_json::from_str(text).map_err(|e| StoreError::decode(self.position, e))
        };
        Ok(RecordedEvent {
            payload: Payload::from_text(self.payload)
                .map_err(|e| StoreError::decode(self.position, e))?,
            metadata: parse(&self.metadata)?,
            position: self.position,
            aggregate_type: self.aggregate_type,
            aggregate_id: self.aggregate_id,
            sequence: self.sequence,
            event_type: self.event_type,
            event_version: self.event_version,
            recorded_at: from_micros(self.recorded_at),
        })
    }
}

/// Reads a catch-up projector's checkpoint inside `tx` (0 when it never ran).
pub(crate) fn checkpoint_in_tx(
    conn: &rusqlite::Connection,
    projector: &str,
) -> Result<i64, StoreError> {
    Ok(conn
        .query_row(
            "SELECT position FROM projection_checkpoint WHERE projector = ?1",
            [projector],
            |row| row.get(0),
        )
        .optional()?
        .unwrap_or(0))
}

/// Stores a catch-up projector's checkpoint inside `tx`.
pub(crate) fn set_checkpoint_in_tx(
    conn: &rusqlite::Connection,
    projector: &str,
    position: i64,
) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO projection_checkpoint (projector, position) VALUES (?1, ?2) \
         ON CONFLICT (projector) DO UPDATE SET position = excluded.position",
        params![projector, position],
    )?;
    Ok(())
}

impl SqliteStore {
    /// Appends to an aggregate with optimistic concurrency and inline projection, in one
    /// transaction. `last_sequence` is the sequence the caller last saw (0 for a new aggregate).
    pub async fn append(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
        last_sequence: i64,
        events: Vec<NewEvent>,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        let (kind, id) = (aggregate_type.to_owned(), aggregate_id.to_owned());
        self.write(move |ctx| {
            append_in_tx(
                ctx.tx,
                ctx.projectors,
                ctx.now,
                &kind,
                &id,
                last_sequence,
                events,
            )
        })
        .await
    }

    /// Loads one aggregate's events in sequence order.
    pub async fn load(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        let (kind, id) = (aggregate_type.to_owned(), aggregate_id.to_owned());
        self.read(move |conn| load_in_tx(conn, &kind, &id)).await
    }

    /// Reads up to `limit` events after `position`, in commit order.
    pub async fn read_after(
        &self,
        position: i64,
        limit: i64,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        self.read(move |conn| read_after_in_tx(conn, position, limit))
            .await
    }

    /// Reads one aggregate's events matching `query`, in position order.
    pub async fn query_events(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
        query: EventQuery,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        let (kind, id) = (aggregate_type.to_owned(), aggregate_id.to_owned());
        self.read(move |conn| {
            let (field, value) = query.payload_field.unzip();
            let mut stmt = conn.prepare_cached(QUERY_EVENTS)?;
            let rows = stmt.query_map(
                params![
                    kind,
                    id,
                    query.after_position,
                    query.since.map(|t| t.timestamp_micros()),
                    query.until.map(|t| t.timestamp_micros()),
                    field,
                    value,
                    query.limit,
                ],
                raw_event,
            )?;
            rows.map(|row| row?.decode()).collect()
        })
        .await
    }

    /// The last position a catch-up projector has applied.
    pub async fn checkpoint(&self, projector: &'static str) -> Result<i64, StoreError> {
        self.read(move |conn| checkpoint_in_tx(conn, projector))
            .await
    }

    /// Brings a catch-up projector up to the head of the log, `batch` events per transaction;
    /// each batch and its checkpoint commit together (the steps: `catch_up.rs`). Returns how
    /// many events it applied.
    pub async fn catch_up(
        &self,
        projector: Arc<dyn SqliteProjector>,
        batch: i64,
    ) -> Result<u64, StoreError> {
        let runner = SqliteCatchUp {
            store: self,
            projector,
        };
        catch_up::catch_up(&runner, batch).await
    }
}

/// Catching one projector up on SQLite: the look on a reader connection (with nothing new,
/// the writer is not taken at all), each batch a write transaction.
struct SqliteCatchUp<'s> {
    store: &'s SqliteStore,
    projector: Arc<dyn SqliteProjector>,
}

impl CatchUpRunner for SqliteCatchUp<'_> {
    async fn look(&self) -> Result<(i64, i64), StoreError> {
        let name = self.projector.name();
        self.store
            .read(move |conn| {
                Ok(conn
                    .prepare_cached(CATCH_UP_CHECK)?
                    .query_row([name], |row| Ok((row.get(0)?, row.get(1)?)))?)
            })
            .await
    }

    async fn batch(&self, head: i64, batch: i64) -> Result<Option<u64>, StoreError> {
        let projector = self.projector.clone();
        self.store
            .write(move |ctx| {
                let mut db = SqliteBatch {
                    tx: ctx.tx,
                    projector,
                };
                run_ready(catch_up::batch(&mut db, head, batch))
            })
            .await
    }
}

/// One catch-up batch's statements on its write transaction (the single writer holds the
/// checkpoint against other runners).
struct SqliteBatch<'a, 't> {
    tx: &'a Transaction<'t>,
    projector: Arc<dyn SqliteProjector>,
}

impl CatchUpBatch for SqliteBatch<'_, '_> {
    fn projector(&self) -> &'static str {
        self.projector.name()
    }

    async fn hold_checkpoint(&mut self) -> Result<i64, StoreError> {
        checkpoint_in_tx(self.tx, self.projector.name())
    }

    async fn events(&mut self, after: i64, through: i64) -> Result<Vec<RecordedEvent>, StoreError> {
        read_range_in_tx(self.tx, after, through)
    }

    async fn apply(&mut self, event: &RecordedEvent) -> Result<(), StoreError> {
        self.projector.apply(self.tx, event)
    }

    async fn set_checkpoint(&mut self, through: i64) -> Result<(), StoreError> {
        set_checkpoint_in_tx(self.tx, self.projector.name(), through)
    }
}
