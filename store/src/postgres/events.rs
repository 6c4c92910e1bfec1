//! Appending, loading and paging events on Postgres, and catch-up from a checkpoint.

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::postgres::PgRow;
use sqlx::{Executor, PgConnection, Row};

use super::PgStore;
use crate::catch_up::{self, CatchUpBatch, CatchUpRunner};
use crate::error::StoreError;
use crate::event::{EventQuery, EventRef, NewEvent, Payload, RecordedEvent};
use crate::projector::{
    literal, on_conflict_sql, row_sql, CteStatement, EventView, OnConflict, PgProjector, RowChange,
    RowProjector, Value,
};
use crate::rebuild::{wants, Decoded, RawRow};

const SELECT_EVENT: &str = "SELECT position, aggregate_type, aggregate_id, sequence, event_type, \
     event_version, payload, metadata, recorded_at FROM events";

/// Takes the append lock for the rest of the transaction. Every append takes it right before
/// its first insert, so positions become visible in the order they were assigned.
pub async fn lock_appends(conn: &mut PgConnection) -> Result<(), StoreError> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext(current_schema() || ':wharf.events'))")
        .execute(conn)
        .await?;
    Ok(())
}

/// Appends `events` after `last_sequence` and runs every inline projector on them, inside the
/// caller's transaction. Takes the append lock. A taken sequence is [`StoreError::Conflict`].
/// The events are taken by value: each payload moves into its recorded event, it is not copied
/// (a copy of a 10,000-filter payload tree was a fifth of a large ledger write's client time).
///
/// Each event is one statement: the append lock, the insert, and the projections of every
/// projector that can [fuse](PgProjector::fuse) them; the others apply theirs afterwards.
pub async fn append_in_tx(
    conn: &mut PgConnection,
    projectors: &[Arc<dyn PgProjector>],
    aggregate_type: &str,
    aggregate_id: &str,
    last_sequence: i64,
    events: Vec<NewEvent>,
) -> Result<Vec<RecordedEvent>, StoreError> {
    let mut recorded = Vec::with_capacity(events.len());
    let mut apply_after: Vec<(usize, &Arc<dyn PgProjector>)> = Vec::new();
    for (offset, event) in events.into_iter().enumerate() {
        let sequence = last_sequence + 1 + offset as i64;
        let pending = EventRef {
            position: None,
            aggregate_type,
            aggregate_id,
            sequence,
            event_type: &event.event_type,
            payload: &event.payload,
        };
        let mut statement = CteStatement::default();
        let deferred = insert_ctes(projectors, &pending, &event, &mut statement, None)?;
        apply_after.extend(deferred.into_iter().map(|p| (offset, p)));
        let (sql, args) = statement.finish("SELECT position, recorded_at FROM appended");
        let row = sqlx::query_with(&sql, args)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| conflict_or(e, aggregate_type, aggregate_id, sequence))?;
        recorded.push(RecordedEvent {
            position: row.try_get("position")?,
            recorded_at: row.try_get("recorded_at")?,
            aggregate_type: aggregate_type.to_owned(),
            aggregate_id: aggregate_id.to_owned(),
            sequence,
            event_type: event.event_type,
            event_version: event.event_version,
            payload: event.payload,
            metadata: event.metadata,
        });
    }
    for (offset, projector) in apply_after {
        projector
            .apply(conn, &recorded[offset])
            .await
            .map_err(|e| StoreError::in_projector(projector.name(), e))?;
    }
    Ok(recorded)
}

/// Adds one event's insert to `statement` as the CTEs `append_lock` and `appended`, and lets
/// each projector fuse its writes after them; returns the projectors that did not fuse, to
/// apply after the statement, in order. The append lock is taken inside the insert, before the
/// row (and its position) is formed: the same guarantee as [`lock_appends`], one round trip
/// fewer. Re-taking it for a later event of the same append is a no-op.
///
/// With `after` (a one-row relation of `statement`, the optimistic executor's version check),
/// the lock, and so the insert, come after it.
pub(super) fn insert_ctes<'p>(
    projectors: &'p [Arc<dyn PgProjector>],
    pending: &EventRef<'_>,
    event: &NewEvent,
    statement: &mut CteStatement,
    after: Option<&str>,
) -> Result<Vec<&'p Arc<dyn PgProjector>>, StoreError> {
    let from = after
        .map(|source| format!(" FROM {source}"))
        .unwrap_or_default();
    statement.cte(
        "append_lock",
        &format!(
            "SELECT pg_advisory_xact_lock(hashtext(current_schema() || ':wharf.events')){from}"
        ),
    );
    let values = [
        statement.bind(pending.aggregate_type)?,
        statement.bind(pending.aggregate_id)?,
        statement.bind(pending.sequence)?,
        statement.bind(event.event_type.as_str())?,
        statement.bind(event.event_version.as_str())?,
        format!("{}::json", statement.bind(event.payload.get().to_owned())?),
        json_text(statement, &event.metadata)?,
    ];
    statement.cte(
        "appended",
        &format!(
            "INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, \
             event_version, payload, metadata) SELECT {} FROM append_lock \
             RETURNING position, recorded_at",
            values.join(", ")
        ),
    );
    let mut deferred = Vec::new();
    // One scratch for the event: its payload is decoded once for every row projector.
    let mut decoded = Decoded::default();
    for projector in projectors {
        let position = "(SELECT position FROM appended)";
        let fused = match projector.rows() {
            Some(rows) => {
                render_rows(rows, pending, position, statement, &mut decoded).map(|()| true)
            }
            None => projector.fuse(pending, position, statement),
        }
        .map_err(|e| StoreError::in_projector(projector.name(), e))?;
        if !fused {
            deferred.push(projector);
        }
    }
    Ok(deferred)
}

/// Adds a row projector's changes for `event` to `statement` as CTEs (none, for an event it
/// ignores); `position` is the SQL of the event's position.
fn render_rows(
    rows: &dyn RowProjector,
    event: &EventRef<'_>,
    position: &str,
    statement: &mut CteStatement,
    decoded: &mut Decoded,
) -> Result<(), StoreError> {
    if !wants(rows.aggregate_types(), event.aggregate_type) {
        return Ok(());
    }
    let mut changes = Vec::new();
    rows.changes(&EventView::of(event), decoded, &mut changes)?;
    render_changes(statement, &changes, position)
}

/// A row projector on Postgres: its changes are CTEs of the statement that inserts the event
/// (ADR 0010), or, applied to a recorded event (a catch-up, a rebuild's verify of a catch-up
/// projector), CTEs of one statement of their own with the position bound.
#[async_trait]
impl<T: RowProjector> PgProjector for T {
    fn name(&self) -> &'static str {
        RowProjector::name(self)
    }

    fn tables(&self) -> &'static [&'static str] {
        RowProjector::tables(self)
    }

    async fn apply(
        &self,
        conn: &mut PgConnection,
        event: &RecordedEvent,
    ) -> Result<(), StoreError> {
        let mut statement = CteStatement::default();
        let position = statement.bind(event.position)?;
        render_rows(
            self,
            &event.as_ref(),
            &position,
            &mut statement,
            &mut Decoded::default(),
        )?;
        if !statement.is_empty() {
            let (sql, args) = statement.finish("SELECT 1");
            sqlx::query_with(&sql, args).execute(conn).await?;
        }
        Ok(())
    }

    fn fuse(
        &self,
        event: &EventRef<'_>,
        position: &str,
        statement: &mut CteStatement,
    ) -> Result<bool, StoreError> {
        render_rows(self, event, position, statement, &mut Decoded::default())?;
        Ok(true)
    }

    fn rows(&self) -> Option<&dyn RowProjector> {
        Some(self)
    }

    fn aggregate_types(&self) -> Option<&'static [&'static str]> {
        RowProjector::aggregate_types(self)
    }
}

/// Adds row changes to `statement` as CTEs, in order; `position` is the SQL of the event's
/// position. A change of one row is its one statement (`INSERT ... ON CONFLICT`, `UPDATE`,
/// `DELETE`); a change over many rows binds each per-row value as one array and reads the
/// rows from `unnest` (see [`render_many`]). Constants and `NULL` are literals, every other
/// value a parameter.
pub(crate) fn render_changes(
    statement: &mut CteStatement,
    changes: &[RowChange],
    position: &str,
) -> Result<(), StoreError> {
    for change in changes {
        let name = statement.next_name(change.table());
        let body = match change.rows()? {
            None => row_sql(change, &mut |value, sql| {
                sql.push_str(&place(statement, value, position)?);
                Ok(())
            })?,
            Some(_) => {
                render_many(statement, change, position, &name)?;
                continue;
            }
        };
        statement.cte(&name, &body);
    }
    Ok(())
}

/// A value's SQL in `statement`: a literal for a constant or `NULL`, the position's SQL, or a
/// bound parameter.
fn place(
    statement: &mut CteStatement,
    value: &Value,
    position: &str,
) -> Result<String, StoreError> {
    match value {
        Value::Null => Ok("NULL".to_owned()),
        Value::Const(text) => Ok(literal(text)),
        Value::Position => Ok(position.to_owned()),
        Value::Text(text) => statement.bind(&**text),
        Value::Int(n) => statement.bind(*n),
        Value::Time(at) => statement.bind(*at),
        Value::TextList(list) => statement.bind(&list[..]),
        Value::EachText(list) => statement.bind(list.as_slice()),
        Value::EachInt(list) => statement.bind(list.as_slice()),
    }
}

/// A change over many rows as CTEs named from `name`. Each per-row value is one bound array;
/// `unnest` of the arrays is the rows, `u(c0, c1, ...)`, and every other value is every row's.
///
/// - An upsert that keeps existing rows: `INSERT ... SELECT ... FROM unnest(...) ON CONFLICT
///   DO NOTHING`.
/// - An upsert that updates them: the listed rows with whether each key exists, looked up
///   once (`{name}_listed`); the existing ones updated by key (`{name}`; an empty array reads
///   no index page, so a wave of new rows costs no lookups there) and the others inserted
///   without a second lookup (`{name}_new`). Neither sees the other's rows.
/// - An update: `UPDATE ... FROM unnest(...)` by key.
/// - A delete by one per-row key column: `= ANY(array)`; by several, `USING unnest(...)`.
fn render_many(
    statement: &mut CteStatement,
    change: &RowChange,
    position: &str,
    name: &str,
) -> Result<(), StoreError> {
    // Each value's SQL as a row reads it: `u.cN` (per-row, `alias` its relation) or its own.
    struct Placed {
        each: Vec<String>,
        arrays: Vec<String>,
        sql: Vec<Option<String>>,
    }
    let place_all =
        |statement: &mut CteStatement, values: &[Value]| -> Result<Placed, StoreError> {
            let mut placed = Placed {
                each: Vec::new(),
                arrays: Vec::new(),
                sql: Vec::new(),
            };
            for value in values {
                let sql = place(statement, value, position)?;
                if value.rows().is_some() {
                    placed.each.push(format!("c{}", placed.arrays.len()));
                    placed.arrays.push(sql);
                    placed.sql.push(None);
                } else {
                    placed.sql.push(Some(sql));
                }
            }
            Ok(placed)
        };
    // The SQL of value `i` as read from relation `alias` (per-row values by their name there).
    fn read(placed: &Placed, alias: &str, i: usize) -> String {
        match &placed.sql[i] {
            Some(sql) => sql.clone(),
            None => {
                let nth = placed.sql[..i].iter().filter(|s| s.is_none()).count();
                format!("{alias}{}", placed.each[nth])
            }
        }
    }
    let unnest = |placed: &Placed| {
        format!(
            "unnest({}) AS u({})",
            placed.arrays.join(", "),
            placed.each.join(", ")
        )
    };
    match change {
        RowChange::Upsert {
            table,
            key,
            columns,
            values,
            on_conflict,
        } => {
            let placed = place_all(statement, values)?;
            let names: Vec<&str> = key.iter().chain(columns.iter()).copied().collect();
            let all = |alias: &str| {
                (0..values.len())
                    .map(|i| read(&placed, alias, i))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let OnConflict::Update {
                keep,
                counter: None,
                if_greater: None,
            } = on_conflict
            else {
                if *on_conflict != OnConflict::Nothing {
                    return Err(change.malformed("a counter or a guard on many rows"));
                }
                let mut body = format!(
                    "INSERT INTO {table} ({}) SELECT {} FROM {}",
                    names.join(", "),
                    all("u."),
                    unnest(&placed),
                );
                on_conflict_sql(&mut body, table, key, columns, on_conflict);
                statement.cte(name, &body);
                return Ok(());
            };
            // The first per-row key column: the existing rows' key values are read by it.
            let Some(lead) = (0..key.len()).find(|&i| placed.sql[i].is_none()) else {
                return Err(change.malformed("per-row values outside the key of an upsert"));
            };
            let lead_name = read(&placed, "", lead);
            let listed = format!("{name}_listed");
            let known = (0..key.len())
                .map(|i| format!("m.{} = {}", key[i], read(&placed, "u.", i)))
                .collect::<Vec<_>>()
                .join(" AND ");
            statement.cte(
                &listed,
                &format!(
                    "SELECT {}, EXISTS (SELECT 1 FROM {table} m WHERE {known}) AS known FROM {}",
                    placed
                        .each
                        .iter()
                        .map(|c| format!("u.{c}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    unnest(&placed)
                ),
            );
            let set = columns
                .iter()
                .enumerate()
                .filter(|(_, c)| !keep.contains(c))
                .map(|(j, c)| format!("{c} = {}", read(&placed, "l.", key.len() + j)))
                .collect::<Vec<_>>()
                .join(", ");
            let by_key = (0..key.len())
                .map(|i| format!("m.{} = {}", key[i], read(&placed, "l.", i)))
                .collect::<Vec<_>>()
                .join(" AND ");
            if !set.is_empty() {
                statement.cte(
                    name,
                    &format!(
                        "UPDATE {table} m SET {set} FROM {listed} l WHERE {by_key} AND l.known \
                         AND m.{} = ANY(ARRAY(SELECT {lead_name} FROM {listed} WHERE known))",
                        key[lead]
                    ),
                );
            }
            statement.cte(
                &format!("{name}_new"),
                &format!(
                    "INSERT INTO {table} ({}) SELECT {} FROM {listed} WHERE NOT known",
                    names.join(", "),
                    all("")
                ),
            );
        }
        RowChange::Update {
            table,
            key,
            columns,
            values,
        } => {
            let placed = place_all(statement, values)?;
            let set = columns
                .iter()
                .enumerate()
                .map(|(j, c)| format!("{c} = {}", read(&placed, "u.", key.len() + j)))
                .collect::<Vec<_>>()
                .join(", ");
            let by_key = (0..key.len())
                .map(|i| format!("m.{} = {}", key[i], read(&placed, "u.", i)))
                .collect::<Vec<_>>()
                .join(" AND ");
            statement.cte(
                name,
                &format!(
                    "UPDATE {table} m SET {set} FROM {} WHERE {by_key}",
                    unnest(&placed)
                ),
            );
        }
        RowChange::Delete { table, key, values } => {
            let placed = place_all(statement, values)?;
            let body = if placed.arrays.len() == 1 {
                let by_key = (0..key.len())
                    .map(|i| match &placed.sql[i] {
                        Some(sql) => format!("{} = {sql}", key[i]),
                        None => format!("{} = ANY({})", key[i], placed.arrays[0]),
                    })
                    .collect::<Vec<_>>()
                    .join(" AND ");
                format!("DELETE FROM {table} WHERE {by_key}")
            } else {
                let by_key = (0..key.len())
                    .map(|i| format!("m.{} = {}", key[i], read(&placed, "u.", i)))
                    .collect::<Vec<_>>()
                    .join(" AND ");
                format!(
                    "DELETE FROM {table} m USING {} WHERE {by_key}",
                    unnest(&placed)
                )
            };
            statement.cte(name, &body);
        }
        _ => return Err(change.malformed("per-row values in a change by condition")),
    }
    Ok(())
}

/// Binds a JSON value as its text, cast to `json` in the statement. `sqlx::types::Json` is
/// sent as `jsonb`, which the server parses into its binary form and then prints back to text
/// for the `json` column: for the 1 MB payload of a SUBACK record of 10,000 outcomes that was
/// 25-90 ms of the statement's bind on the benchmark machine (ADR 0031), and it stored the
/// keys re-ordered. `json` input only checks the text, which is stored as written.
fn json_text(
    statement: &mut CteStatement,
    value: &serde_json::Value,
) -> Result<String, StoreError> {
    let text = serde_json::to_string(value)
        .map_err(|e| StoreError::Postgres(sqlx::Error::Encode(Box::new(e))))?;
    Ok(format!("{}::json", statement.bind(text)?))
}

pub(super) fn conflict_or(
    e: sqlx::Error,
    aggregate_type: &str,
    aggregate_id: &str,
    sequence: i64,
) -> StoreError {
    match &e {
        // Only the ledger's own key means "someone appended first"; a unique violation in a
        // fused projection is that projector's failure.
        sqlx::Error::Database(db)
            if db.code().as_deref() == Some("23505") && db.constraint() == Some("events_pkey") =>
        {
            StoreError::Conflict {
                aggregate_type: aggregate_type.to_owned(),
                aggregate_id: aggregate_id.to_owned(),
                sequence,
            }
        }
        _ => e.into(),
    }
}

/// Loads one aggregate's events in sequence order.
pub async fn load_in_tx(
    conn: &mut PgConnection,
    aggregate_type: &str,
    aggregate_id: &str,
) -> Result<Vec<RecordedEvent>, StoreError> {
    let rows = sqlx::query(&format!(
        "{SELECT_EVENT} WHERE aggregate_type = $1 AND aggregate_id = $2 ORDER BY sequence"
    ))
    .bind(aggregate_type)
    .bind(aggregate_id)
    .fetch_all(conn)
    .await?;
    rows.iter().map(decode_event).collect()
}

/// Reads up to `limit` events after `position`, in position (= commit) order.
pub async fn read_after_in_tx(
    conn: &mut PgConnection,
    position: i64,
    limit: i64,
) -> Result<Vec<RecordedEvent>, StoreError> {
    let rows = sqlx::query(&format!(
        "{SELECT_EVENT} WHERE position > $1 ORDER BY position LIMIT $2"
    ))
    .bind(position)
    .bind(limit)
    .fetch_all(conn)
    .await?;
    rows.iter().map(decode_event).collect()
}

/// The catch-up check: the log's head (0 when empty) and the projector's checkpoint (0 when it
/// never ran), `$1` the projector. `MAX(position)` is one backward step of the position index
/// whatever the statistics say; a `position > (subquery)` test was planned as a sequential
/// scan of `events` (35 ms per read at 230k events).
pub const CATCH_UP_CHECK: &str = "SELECT COALESCE((SELECT MAX(position) FROM events), 0), \
     COALESCE((SELECT position FROM projection_checkpoint WHERE projector = $1), 0)";

/// One aggregate's events after a position, filtered, in position order: `$1` type, `$2` id,
/// `$3` the position to start after, `$4`/`$5` the recorded-at bounds, `$6`/`$7` a payload
/// field and its value (each NULL: no filter), `$8` the count.
///
/// Within one aggregate, sequence order is position order (an append reads the aggregate's
/// last sequence and takes its position under the append lock, after that event committed),
/// so the read walks the aggregate's key `(type, id, sequence)` in order from the sequence of
/// the event at `$3` (one keyed look-up; 0 when that position is not this aggregate's, where
/// `position > $3` alone bounds the walk): a page costs its own rows however long the
/// aggregate's ledger is. Ordering by position instead read and sorted every event of the
/// aggregate (a 100k-event group: 17k buffers, 0.4 s).
///
/// It runs unnamed (planned per call). On a store whose statistics were never taken (a bulk
/// load, a restore) the planner may still estimate a row or two for the aggregate and read
/// all of its events through a bitmap and a sort, as before: open in ADR 0036 (a range form
/// of the key made the scan of a short group run on past it, through the rest of the index).
pub const QUERY_EVENTS: &str = "SELECT position, aggregate_type, aggregate_id, sequence, \
     event_type, event_version, payload, metadata, recorded_at FROM events \
     WHERE aggregate_type = $1 AND aggregate_id = $2 \
     AND sequence > COALESCE((SELECT c.sequence FROM events c WHERE c.position = $3 \
       AND c.aggregate_type = $1 AND c.aggregate_id = $2), 0) \
     AND position > $3 \
     AND ($4::timestamptz IS NULL OR recorded_at >= $4) \
     AND ($5::timestamptz IS NULL OR recorded_at < $5) \
     AND ($6::text IS NULL OR payload->>$6 = $7) ORDER BY sequence LIMIT $8";

/// The events of a bounded position range, `$1 < position <= $2`, in position order. Both ends
/// bound the index scan, so neither a generic plan nor statistics taken while the table was
/// empty can turn it into a scan of every later row.
pub const EVENTS_IN_RANGE: &str = "SELECT position, aggregate_type, aggregate_id, sequence, \
     event_type, event_version, payload, metadata, recorded_at FROM events \
     WHERE position > $1 AND position <= $2 ORDER BY position";

/// Reads the events with `after < position <= through`, in position (= commit) order.
pub async fn read_range_in_tx(
    conn: &mut PgConnection,
    after: i64,
    through: i64,
) -> Result<Vec<RecordedEvent>, StoreError> {
    let rows = sqlx::query(EVENTS_IN_RANGE)
        .bind(after)
        .bind(through)
        .fetch_all(conn)
        .await?;
    rows.iter().map(decode_event).collect()
}

type RawTuple = (
    i64,
    String,
    String,
    i64,
    String,
    String,
    String,
    String,
    chrono::DateTime<chrono::Utc>,
);

/// The name of the cursor a rebuild reads the log through (one per transaction at a time).
const REBUILD_CURSOR: &str = "wharf_rebuild_events";

/// Opens the rebuild's cursor over the rows with `after < position <= through`, in position
/// (= commit) order, JSON as text. One ordered walk of the position key for the whole replay,
/// as a plain streamed read does, instead of a statement per range: each range read was
/// planned on the table's size (a bitmap scan, a sort, parallel workers per page), so it cost
/// more per page as the log grew. The plan is pinned to the key's order (no sort, no bitmap)
/// while the cursor is declared; the settings are put back before anything else runs.
pub(crate) async fn open_rebuild_cursor(
    conn: &mut PgConnection,
    after: i64,
    through: i64,
) -> Result<(), StoreError> {
    let declare = format!(
        "SET LOCAL enable_sort = off; SET LOCAL enable_bitmapscan = off; \
         DECLARE {REBUILD_CURSOR} NO SCROLL CURSOR FOR \
         SELECT position, aggregate_type, aggregate_id, sequence, event_type, event_version, \
         payload::text, metadata::text, recorded_at FROM events \
         WHERE position > {after} AND position <= {through} ORDER BY position; \
         RESET enable_sort; RESET enable_bitmapscan"
    );
    // Several statements, sent as one simple query (what `raw_sql` sends) through the
    // executor's boxed future, which stays `Send` for any borrow where `raw_sql`'s does not.
    conn.execute(declare.as_str()).await?;
    Ok(())
}

/// The next `limit` rows of the rebuild's cursor (fewer, or none, at its end).
pub(crate) async fn fetch_rebuild_cursor(
    conn: &mut PgConnection,
    limit: i64,
) -> Result<Vec<RawRow>, StoreError> {
    let rows: Vec<RawTuple> = sqlx::query_as(&format!("FETCH {limit} FROM {REBUILD_CURSOR}"))
        .fetch_all(conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| RawRow {
            position: r.0,
            aggregate_type: r.1,
            aggregate_id: r.2,
            sequence: r.3,
            event_type: r.4,
            event_version: r.5,
            payload: r.6,
            metadata: r.7,
            recorded_at: r.8,
        })
        .collect())
}

/// Closes the rebuild's cursor.
pub(crate) async fn close_rebuild_cursor(conn: &mut PgConnection) -> Result<(), StoreError> {
    conn.execute(format!("CLOSE {REBUILD_CURSOR}").as_str())
        .await?;
    Ok(())
}

fn decode_event(row: &PgRow) -> Result<RecordedEvent, StoreError> {
    let position: i64 = row.try_get("position")?;
    let json = |column: &str| -> Result<serde_json::Value, StoreError> {
        row.try_get::<sqlx::types::Json<serde_json::Value>, _>(column)
            .map(|j| j.0)
            .map_err(|e| StoreError::decode(position, e))
    };
    // The body stays text: checked as JSON, not built into a tree.
    let payload = row
        .try_get::<sqlx::types::Json<Box<serde_json::value::RawValue>>, _>("payload")
        .map(|j| Payload::from(j.0))
        .map_err(|e| StoreError::decode(position, e))?;
    Ok(RecordedEvent {
        position,
        aggregate_type: row.try_get("aggregate_type")?,
        aggregate_id: row.try_get("aggregate_id")?,
        sequence: row.try_get("sequence")?,
        event_type: row.try_get("event_type")?,
        event_version: row.try_get("event_version")?,
        payload,
        metadata: json("metadata")?,
        recorded_at: row.try_get("recorded_at")?,
    })
}

/// Reads and locks a catch-up projector's checkpoint (creating it at 0), so concurrent
/// runners of the same projector take turns instead of applying a batch twice.
pub(crate) async fn lock_checkpoint(
    conn: &mut PgConnection,
    projector: &str,
) -> Result<i64, StoreError> {
    sqlx::query("INSERT INTO projection_checkpoint (projector, position) VALUES ($1, 0) ON CONFLICT DO NOTHING")
        .bind(projector)
        .execute(&mut *conn)
        .await?;
    Ok(sqlx::query_scalar(
        "SELECT position FROM projection_checkpoint WHERE projector = $1 FOR UPDATE",
    )
    .bind(projector)
    .fetch_one(conn)
    .await?)
}

/// Plans every statement of the rest of the transaction for its own values, cached or not.
/// A projector's statements are prepared once per connection; a generic plan Postgres picked
/// while a projection table was empty (a fresh store, a rebuild's reset) would keep scanning
/// the whole table once it has grown: `UPDATE declarer_attempt ... 'resolved'` did, 25 ms per
/// event at 230k events. One round trip per batch.
pub(crate) async fn custom_plans(conn: &mut PgConnection) -> Result<(), StoreError> {
    sqlx::query("SET LOCAL plan_cache_mode = force_custom_plan")
        .execute(conn)
        .await?;
    Ok(())
}

/// Stores a catch-up projector's checkpoint inside the caller's transaction.
pub(crate) async fn set_checkpoint(
    conn: &mut PgConnection,
    projector: &str,
    position: i64,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE projection_checkpoint SET position = $2 WHERE projector = $1")
        .bind(projector)
        .bind(position)
        .execute(conn)
        .await?;
    Ok(())
}

impl PgStore {
    /// Appends to an aggregate with optimistic concurrency and inline projection, in one
    /// transaction. `last_sequence` is the sequence the caller last saw (0 for a new aggregate).
    pub async fn append(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
        last_sequence: i64,
        events: Vec<NewEvent>,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let recorded = append_in_tx(
            &mut tx,
            &self.projectors,
            aggregate_type,
            aggregate_id,
            last_sequence,
            events,
        )
        .await?;
        tx.commit().await?;
        Ok(recorded)
    }

    /// Loads one aggregate's events in sequence order.
    pub async fn load(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        load_in_tx(&mut conn, aggregate_type, aggregate_id).await
    }

    /// Reads up to `limit` events after `position`, in commit order.
    pub async fn read_after(
        &self,
        position: i64,
        limit: i64,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        read_after_in_tx(&mut conn, position, limit).await
    }

    /// Reads one aggregate's events matching `query`, in position order.
    pub async fn query_events(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
        query: EventQuery,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        let (field, value) = query.payload_field.unzip();
        let rows = sqlx::query(QUERY_EVENTS)
            .bind(aggregate_type)
            .bind(aggregate_id)
            .bind(query.after_position)
            .bind(query.since)
            .bind(query.until)
            .bind(field)
            .bind(value)
            .bind(query.limit)
            // Planned per call, for its values: a generic plan of this statement estimates a row
            // or two and sorts every event of the aggregate (see `QUERY_EVENTS`).
            .persistent(false)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(decode_event).collect()
    }

    /// The last position a catch-up projector has applied.
    pub async fn checkpoint(&self, projector: &str) -> Result<i64, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT position FROM projection_checkpoint WHERE projector = $1")
                .bind(projector)
                .fetch_optional(&self.pool)
                .await?
                .unwrap_or(0),
        )
    }

    /// Brings a catch-up projector up to the head of the log, `batch` events per transaction;
    /// each batch and its checkpoint commit together (the steps: `catch_up.rs`). Safe with
    /// concurrent runners (the checkpoint row is locked). Returns how many events this call
    /// applied.
    pub async fn catch_up(
        &self,
        projector: Arc<dyn PgProjector>,
        batch: i64,
    ) -> Result<u64, StoreError> {
        let runner = PgCatchUp {
            store: self,
            projector,
        };
        catch_up::catch_up(&runner, batch).await
    }
}

/// Catching one projector up on Postgres: an unlocked look (with nothing new, no transaction
/// and no checkpoint row lock at all), each batch a transaction planned per call.
struct PgCatchUp<'s> {
    store: &'s PgStore,
    projector: Arc<dyn PgProjector>,
}

impl CatchUpRunner for PgCatchUp<'_> {
    async fn look(&self) -> Result<(i64, i64), StoreError> {
        Ok(sqlx::query_as(CATCH_UP_CHECK)
            .bind(self.projector.name())
            .fetch_one(&self.store.pool)
            .await?)
    }

    async fn batch(&self, head: i64, batch: i64) -> Result<Option<u64>, StoreError> {
        let mut tx = self.store.pool.begin().await?;
        custom_plans(&mut tx).await?;
        let done = catch_up::batch(
            &mut PgBatch {
                conn: &mut tx,
                projector: &self.projector,
            },
            head,
            batch,
        )
        .await?;
        tx.commit().await?;
        Ok(done)
    }
}

/// One catch-up batch's statements on its transaction (the checkpoint row locked).
struct PgBatch<'a> {
    conn: &'a mut PgConnection,
    projector: &'a Arc<dyn PgProjector>,
}

impl CatchUpBatch for PgBatch<'_> {
    fn projector(&self) -> &'static str {
        self.projector.name()
    }

    async fn hold_checkpoint(&mut self) -> Result<i64, StoreError> {
        lock_checkpoint(self.conn, self.projector.name()).await
    }

    async fn events(&mut self, after: i64, through: i64) -> Result<Vec<RecordedEvent>, StoreError> {
        read_range_in_tx(self.conn, after, through).await
    }

    async fn apply(&mut self, event: &RecordedEvent) -> Result<(), StoreError> {
        self.projector.apply(self.conn, event).await
    }

    async fn set_checkpoint(&mut self, through: i64) -> Result<(), StoreError> {
        set_checkpoint(self.conn, self.projector.name(), through).await
    }
}
