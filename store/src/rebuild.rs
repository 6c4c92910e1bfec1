//! Projection rebuild: a replay of the whole log, in position order, into the projection
//! tables, inside one transaction that holds the append lock. The transaction is the shadow:
//! readers keep seeing the old rows until the rebuilt ones commit in one step.
//! `Verify` rebuilds the same way, compares against the live rows, and rolls back.

use std::any::Any;
use std::collections::{btree_map, BTreeMap, HashMap};
use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::error::StoreError;
use crate::event::{Payload, RecordedEvent};
use crate::projector::{Column, OnConflict, RowChange, Test, Value};

/// Whether a rebuild replaces the live projections or only compares against them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RebuildMode {
    /// Replace the live projection rows with the replayed ones.
    Apply,
    /// Replay aside, compare with the live rows, change nothing.
    Verify,
}

/// Called as the replay progresses with (events replayed, events in the log).
pub type Progress = Arc<dyn Fn(u64, u64) + Send + Sync>;

/// How a projection table differs between the live rows and a replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableDifference {
    /// The table.
    pub table: String,
    /// Rows the live table holds that the replay does not produce.
    pub only_live: u64,
    /// Rows the replay produces that the live table lacks.
    pub only_rebuilt: u64,
}

/// What a rebuild did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RebuildReport {
    /// How many events were replayed.
    pub events: u64,
    /// The position of the last replayed event.
    pub last_position: i64,
    /// Differences found (Verify only; empty when clean).
    pub differences: Vec<TableDifference>,
    /// Whether the rebuilt rows were committed.
    pub applied: bool,
}

impl RebuildReport {
    /// True when verification found no difference.
    pub fn is_clean(&self) -> bool {
        self.differences.is_empty()
    }
}

/// How many positions a rebuild reads per page (a bounded range of the position index).
pub(crate) const REBUILD_PAGE: i64 = 10_000;

/// Whether a projector that acts on `types` (`None`: any) acts on an event of `aggregate_type`.
pub(crate) fn wants(types: Option<&[&str]>, aggregate_type: &str) -> bool {
    types.is_none_or(|types| types.contains(&aggregate_type))
}

/// The name of the copy of `table` Verify compares with it.
pub(crate) fn snapshot_table(table: &str) -> String {
    format!("wharf_verify_{table}")
}

/// Where a rebuild's image of a row projector's tables is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayTarget {
    /// Into the projector's own (reset) tables: a rebuild.
    Live,
    /// Into an unindexed temporary copy of each table, beside the untouched live rows: a
    /// verify, which compares the two and keeps neither.
    Aside,
}

impl ReplayTarget {
    /// The table the replay writes `table`'s rows into.
    pub fn table(self, table: &str) -> String {
        match self {
            Self::Live => table.to_owned(),
            Self::Aside => snapshot_table(table),
        }
    }
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

/// An event row as a rebuild reads it: every column, the JSON as text.
pub(crate) struct RawRow {
    pub position: i64,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub sequence: i64,
    pub event_type: String,
    pub event_version: String,
    pub payload: String,
    pub metadata: String,
    pub recorded_at: DateTime<Utc>,
}

impl RawRow {
    /// The row as a rebuild's fold sees it.
    pub fn replay(&self) -> ReplayEvent<'_> {
        ReplayEvent {
            position: self.position,
            aggregate_type: &self.aggregate_type,
            aggregate_id: &self.aggregate_id,
            sequence: self.sequence,
            event_type: &self.event_type,
            payload: &self.payload,
        }
    }

    /// The row as a projector's `apply` sees it (its JSON parsed).
    pub fn recorded(&self) -> Result<RecordedEvent, StoreError> {
        let parse = |text: &str| {
            serde_json::from_str(text).map_err(|e| StoreError::decode(self.position, e))
        };
        Ok(RecordedEvent {
            position: self.position,
            aggregate_type: self.aggregate_type.clone(),
            aggregate_id: self.aggregate_id.clone(),
            sequence: self.sequence,
            event_type: self.event_type.clone(),
            event_version: self.event_version.clone(),
            payload: Payload::from_text(self.payload.clone())
                .map_err(|e| StoreError::decode(self.position, e))?,
            metadata: parse(&self.metadata)?,
            recorded_at: self.recorded_at,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The image a rebuild folds row changes into (ADR 0077)
// ---------------------------------------------------------------------------------------------

/// A row projector's tables as its changes leave them, in memory: a rebuild folds every
/// event's changes into it, in position order, and writes its rows into the (reset) tables in
/// bulk at the end (ADR 0025). It applies each change as the backends' statements do, in
/// order; the memory it takes is the size of the projection, not of the log. A column no
/// change named is `NULL` (the tables of row projectors default nothing else).
#[derive(Default)]
pub struct Image {
    tables: Vec<TableImage>,
}

/// One table of an [`Image`], keyed by its primary key: by the first key column's value, then
/// by the rest of the key, in order.
pub(crate) struct TableImage {
    /// The table.
    pub(crate) name: &'static str,
    key: &'static [Column],
    /// The columns other than the key's, in the order changes first named them.
    columns: Vec<Column>,
    rows: HashMap<Value, BTreeMap<Vec<Value>, Vec<Value>>>,
    /// Where each column list a change named (by address and length) lands in `columns`.
    shapes: Vec<(usize, usize, Vec<usize>)>,
}

static NULL: Value = Value::Null;

impl Image {
    /// Applies one event's changes, in order; `position` is the event's.
    pub fn apply(&mut self, changes: Vec<RowChange>, position: i64) -> Result<(), StoreError> {
        for change in changes {
            change.check_width()?;
            let rows = change.rows()?;
            match change {
                RowChange::Upsert {
                    table,
                    key,
                    columns,
                    values,
                    on_conflict,
                } => {
                    let image = self.table_for_upsert(table, key)?;
                    each_row(values, rows, position, |row| {
                        image.upsert(row, columns, &on_conflict)
                    })?;
                }
                RowChange::Update {
                    table,
                    key,
                    columns,
                    values,
                } => {
                    let Some(image) = self.table_mut(table, key)? else {
                        continue;
                    };
                    let shape = image.shape(columns);
                    each_row(values, rows, position, |row| {
                        image.update(row, shape);
                        Ok(())
                    })?;
                }
                RowChange::Delete { table, key, values } => {
                    let Some(image) = self.table_mut(table, key)? else {
                        continue;
                    };
                    each_row(values, rows, position, |row| {
                        image.delete(row);
                        Ok(())
                    })?;
                }
                RowChange::UpdateWhere {
                    table,
                    within,
                    tests,
                    columns,
                    values,
                } => {
                    let Some(image) = self.table_within(table, within.0)? else {
                        continue;
                    };
                    let within = settled(within.1, position);
                    let tests = settled_tests(tests, position);
                    let values: Vec<Value> =
                        values.into_iter().map(|v| settled(v, position)).collect();
                    let shape = image.shape(columns);
                    image.update_where(&within, &tests, shape, &values);
                }
                RowChange::DeleteWhere {
                    table,
                    within,
                    tests,
                } => {
                    let Some(image) = self.table_within(table, within.0)? else {
                        continue;
                    };
                    let within = settled(within.1, position);
                    let tests = settled_tests(tests, position);
                    image.delete_where(&within, &tests);
                }
                RowChange::DeleteUnless {
                    table,
                    key,
                    values,
                    unless,
                } => {
                    let found = match self.table_within(unless.table, unless.within.0)? {
                        Some(other) => other.any(
                            &settled(unless.within.1, position),
                            &settled_tests(unless.tests, position),
                        ),
                        None => false,
                    };
                    if found {
                        continue;
                    }
                    if let Some(image) = self.table_mut(table, key)? {
                        each_row(values, rows, position, |row| {
                            image.delete(row);
                            Ok(())
                        })?;
                    }
                }
            }
        }
        Ok(())
    }

    /// The tables, in the order changes first named them.
    pub(crate) fn into_tables(self) -> Vec<TableImage> {
        self.tables
    }

    fn position(&self, table: &str) -> Option<usize> {
        self.tables.iter().position(|t| t.name == table)
    }

    fn table_for_upsert(
        &mut self,
        table: &'static str,
        key: &'static [Column],
    ) -> Result<&mut TableImage, StoreError> {
        let at = match self.position(table) {
            Some(at) => at,
            None => {
                if key.is_empty() {
                    return Err(StoreError::Task(format!(
                        "{table}: a row change without a key"
                    )));
                }
                self.tables.push(TableImage {
                    name: table,
                    key,
                    columns: Vec::new(),
                    rows: HashMap::new(),
                    shapes: Vec::new(),
                });
                self.tables.len() - 1
            }
        };
        let image = &mut self.tables[at];
        image.check_key(key)?;
        Ok(image)
    }

    /// The table's image, or `None` when no row was ever put in it.
    fn table_mut(
        &mut self,
        table: &str,
        key: &[Column],
    ) -> Result<Option<&mut TableImage>, StoreError> {
        let Some(at) = self.position(table) else {
            return Ok(None);
        };
        let image = &mut self.tables[at];
        image.check_key(key)?;
        Ok(Some(image))
    }

    fn table_within(
        &mut self,
        table: &str,
        within: Column,
    ) -> Result<Option<&mut TableImage>, StoreError> {
        let Some(at) = self.position(table) else {
            return Ok(None);
        };
        let image = &mut self.tables[at];
        if image.key.first() != Some(&within) {
            return Err(StoreError::Task(format!(
                "{table}: a condition within {within}, which is not its first key column"
            )));
        }
        Ok(Some(image))
    }
}

/// Calls `row` with each row's values of a change (`rows`: how many its per-row values give,
/// `None` for one), the event's position in place of [`Value::Position`].
fn each_row(
    values: Vec<Value>,
    rows: Option<usize>,
    position: i64,
    mut row: impl FnMut(Vec<Value>) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let Some(rows) = rows else {
        return row(values.into_iter().map(|v| settled(v, position)).collect());
    };
    enum Source {
        One(Value),
        Text(std::vec::IntoIter<String>),
        Int(std::vec::IntoIter<Option<i64>>),
    }
    let mut sources: Vec<Source> = values
        .into_iter()
        .map(|v| match v {
            Value::EachText(list) => Source::Text(list.into_iter()),
            Value::EachInt(list) => Source::Int(list.into_iter()),
            other => Source::One(settled(other, position)),
        })
        .collect();
    for _ in 0..rows {
        let values = sources
            .iter_mut()
            .map(|source| match source {
                Source::One(value) => value.clone(),
                Source::Text(list) => list.next().map_or(Value::Null, Value::Text),
                Source::Int(list) => list.next().flatten().map_or(Value::Null, Value::Int),
            })
            .collect();
        row(values)?;
    }
    Ok(())
}

fn settled(value: Value, position: i64) -> Value {
    match value {
        Value::Position => Value::Int(position),
        other => other,
    }
}

fn settled_tests(tests: Vec<Test>, position: i64) -> Vec<Test> {
    tests
        .into_iter()
        .map(|test| match test {
            Test::Eq(column, value) => Test::Eq(column, settled(value, position)),
            Test::Ne(column, value) => Test::Ne(column, settled(value, position)),
            Test::Any(tests) => Test::Any(settled_tests(tests, position)),
        })
        .collect()
}

/// Equal as SQL compares two non-`NULL` values (a constant equals the same text).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Text(x), Value::Const(y)) | (Value::Const(y), Value::Text(x)) => x == y,
        _ => a == b,
    }
}

/// `new > old` as SQL has it: false when either is `NULL`.
fn greater(new: &Value, old: &Value) -> bool {
    !matches!(new, Value::Null) && !matches!(old, Value::Null) && new > old
}

impl TableImage {
    fn check_key(&self, key: &[Column]) -> Result<(), StoreError> {
        if self.key != key {
            return Err(StoreError::Task(format!(
                "{}: changes name two different keys ({:?}, {key:?})",
                self.name, self.key
            )));
        }
        Ok(())
    }

    /// Every column, the key's first, as the bulk write names them.
    pub(crate) fn columns(&self) -> Vec<Column> {
        self.key.iter().chain(&self.columns).copied().collect()
    }

    /// The index of `shapes` that maps the change's `columns` into `self.columns`.
    fn shape(&mut self, columns: &'static [Column]) -> usize {
        let id = (columns.as_ptr() as usize, columns.len());
        if let Some(at) = self
            .shapes
            .iter()
            .position(|(ptr, len, _)| (*ptr, *len) == id)
        {
            return at;
        }
        let indices = columns
            .iter()
            .map(|c| column_index(&mut self.columns, c))
            .collect();
        self.shapes.push((id.0, id.1, indices));
        self.shapes.len() - 1
    }

    /// Splits a row's values into its first key value, the rest of the key, and the columns'.
    fn split(&self, row: Vec<Value>) -> (Value, Vec<Value>, std::vec::IntoIter<Value>) {
        let mut values = row.into_iter();
        let first = values.next().unwrap_or(Value::Null);
        let rest = values.by_ref().take(self.key.len() - 1).collect();
        (first, rest, values)
    }

    fn upsert(
        &mut self,
        row: Vec<Value>,
        columns: &'static [Column],
        on_conflict: &OnConflict,
    ) -> Result<(), StoreError> {
        let shape = self.shape(columns);
        let counter = match on_conflict {
            OnConflict::Update {
                counter: Some(counter),
                ..
            } => Some(column_index(&mut self.columns, counter)),
            _ => None,
        };
        let (first, rest, values) = self.split(row);
        let width = self.columns.len();
        let indices = &self.shapes[shape].2;
        let part = self.rows.entry(first).or_default();
        match part.entry(rest) {
            btree_map::Entry::Vacant(vacant) => {
                let mut stored = vec![Value::Null; width];
                for (&i, value) in indices.iter().zip(values) {
                    stored[i] = value;
                }
                if let Some(counter) = counter {
                    stored[counter] = Value::Int(1);
                }
                vacant.insert(stored);
            }
            btree_map::Entry::Occupied(occupied) => {
                let OnConflict::Update {
                    keep, if_greater, ..
                } = on_conflict
                else {
                    return Ok(());
                };
                let stored = occupied.into_mut();
                if stored.len() < width {
                    stored.resize(width, Value::Null);
                }
                let values: Vec<Value> = values.collect();
                if let Some(column) = if_greater {
                    let Some(j) = columns.iter().position(|c| c == column) else {
                        return Err(StoreError::Task(format!(
                            "{}: an upsert guarded by {column}, which it does not write",
                            self.name
                        )));
                    };
                    if !greater(&values[j], &stored[indices[j]]) {
                        return Ok(());
                    }
                }
                for (j, value) in values.into_iter().enumerate() {
                    if !keep.contains(&columns[j]) {
                        stored[indices[j]] = value;
                    }
                }
                if let Some(counter) = counter {
                    stored[counter] = match stored[counter] {
                        Value::Int(n) => Value::Int(n + 1),
                        _ => Value::Int(1),
                    };
                }
            }
        }
        Ok(())
    }

    fn update(&mut self, row: Vec<Value>, shape: usize) {
        let (first, rest, values) = self.split(row);
        let width = self.columns.len();
        let Some(stored) = self.rows.get_mut(&first).and_then(|p| p.get_mut(&rest)) else {
            return;
        };
        if stored.len() < width {
            stored.resize(width, Value::Null);
        }
        for (&i, value) in self.shapes[shape].2.iter().zip(values) {
            stored[i] = value;
        }
    }

    fn delete(&mut self, row: Vec<Value>) {
        let (first, rest, _) = self.split(row);
        if let Some(part) = self.rows.get_mut(&first) {
            part.remove(&rest);
            if part.is_empty() {
                self.rows.remove(&first);
            }
        }
    }

    fn update_where(&mut self, within: &Value, tests: &[Test], shape: usize, values: &[Value]) {
        let width = self.columns.len();
        let Some(part) = self.rows.get_mut(within) else {
            return;
        };
        let indices = &self.shapes[shape].2;
        for (rest, stored) in part.iter_mut() {
            if passes(self.key, &self.columns, within, rest, stored, tests) {
                if stored.len() < width {
                    stored.resize(width, Value::Null);
                }
                for (&i, value) in indices.iter().zip(values) {
                    stored[i] = value.clone();
                }
            }
        }
    }

    fn delete_where(&mut self, within: &Value, tests: &[Test]) {
        let Some(part) = self.rows.get_mut(within) else {
            return;
        };
        let (key, columns) = (self.key, &self.columns);
        part.retain(|rest, stored| !passes(key, columns, within, rest, stored, tests));
        if part.is_empty() {
            self.rows.remove(within);
        }
    }

    fn any(&self, within: &Value, tests: &[Test]) -> bool {
        self.rows.get(within).is_some_and(|part| {
            part.iter()
                .any(|(rest, stored)| passes(self.key, &self.columns, within, rest, stored, tests))
        })
    }

    /// Calls `write` with each row's values (every column of [`columns`](Self::columns)), in
    /// key order (by bytes, which the database's collation may order a little differently): a
    /// bulk load in about the primary key's order fills the key's B-tree page by page instead of
    /// touching a random page per row.
    pub(crate) fn write_rows(
        self,
        mut write: impl FnMut(&[&Value]) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let width = self.key.len() + self.columns.len();
        let mut parts: Vec<_> = self.rows.into_iter().collect();
        parts.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let mut row: Vec<&Value> = Vec::with_capacity(width);
        for (first, part) in &parts {
            for (rest, stored) in part {
                row.clear();
                row.push(first);
                row.extend(rest);
                row.extend(stored);
                row.resize(width, &NULL);
                write(&row)?;
            }
        }
        Ok(())
    }
}

fn column_index(columns: &mut Vec<Column>, column: Column) -> usize {
    match columns.iter().position(|c| *c == column) {
        Some(at) => at,
        None => {
            columns.push(column);
            columns.len() - 1
        }
    }
}

/// Whether a row passes every test, as SQL would find.
fn passes(
    key: &[Column],
    columns: &[Column],
    first: &Value,
    rest: &[Value],
    stored: &[Value],
    tests: &[Test],
) -> bool {
    let cell = |column: Column| -> &Value {
        match key.iter().position(|c| *c == column) {
            Some(0) => first,
            Some(k) => rest.get(k - 1).unwrap_or(&NULL),
            None => columns
                .iter()
                .position(|c| *c == column)
                .and_then(|i| stored.get(i))
                .unwrap_or(&NULL),
        }
    };
    fn holds<'v>(test: &Test, cell: &dyn Fn(Column) -> &'v Value) -> bool {
        match test {
            Test::Eq(column, Value::Null) => matches!(cell(column), Value::Null),
            Test::Ne(column, Value::Null) => !matches!(cell(column), Value::Null),
            Test::Eq(column, value) => {
                let found = cell(column);
                !matches!(found, Value::Null) && same(found, value)
            }
            Test::Ne(column, value) => {
                let found = cell(column);
                !matches!(found, Value::Null) && !same(found, value)
            }
            Test::Any(tests) => tests.iter().any(|t| holds(t, cell)),
        }
    }
    tests.iter().all(|test| holds(test, &cell))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::projector::Exists;

    const ATTEMPT_KEY: &[Column] = &["group_name", "declarer"];
    const ATTEMPT_COLUMNS: &[Column] = &["status", "patterns", "position"];

    fn text(s: &str) -> Value {
        Value::Text(s.to_owned())
    }

    fn attempt(declarer: &str, status: &'static str, set: &[&str]) -> RowChange {
        RowChange::Upsert {
            table: "attempt",
            key: ATTEMPT_KEY,
            columns: ATTEMPT_COLUMNS,
            values: vec![
                text("g"),
                text(declarer),
                Value::Const(status),
                Value::TextList(set.iter().map(|s| (*s).to_owned()).collect()),
                Value::Position,
            ],
            on_conflict: OnConflict::Update {
                keep: &[],
                counter: None,
                if_greater: Some("position"),
            },
        }
    }

    fn rows(image: Image) -> Vec<(String, Vec<String>)> {
        let mut out = Vec::new();
        for table in image.into_tables() {
            let name = table.name.to_owned();
            table
                .write_rows(|row| {
                    out.push((name.clone(), row.iter().map(|v| format!("{v:?}")).collect()));
                    Ok(())
                })
                .unwrap();
        }
        out
    }

    #[test]
    fn an_image_applies_upserts_conditions_and_guards_as_sql_does() {
        let mut image = Image::default();
        image
            .apply(vec![attempt("b", "waiting", &["x"])], 1)
            .unwrap();
        image
            .apply(vec![attempt("c", "waiting", &["y"])], 2)
            .unwrap();
        // An older event's upsert is not newer: nothing changes.
        image
            .apply(vec![attempt("b", "installed", &["z"])], 1)
            .unwrap();
        image
            .apply(
                vec![
                    attempt("a", "installed", &["x"]),
                    RowChange::UpdateWhere {
                        table: "attempt",
                        within: ("group_name", text("g")),
                        tests: vec![
                            Test::Eq("status", text("waiting")),
                            Test::Eq("patterns", Value::TextList(vec!["x".into()])),
                            Test::Ne("declarer", text("a")),
                        ],
                        columns: &["status"],
                        values: vec![Value::Const("resolved")],
                    },
                ],
                3,
            )
            .unwrap();
        let rows = rows(image);
        let statuses: Vec<_> = rows
            .iter()
            .map(|(_, r)| (r[1].clone(), r[2].clone()))
            .collect();
        assert_eq!(
            statuses,
            vec![
                ("Text(\"a\")".into(), "Const(\"installed\")".into()),
                ("Text(\"b\")".into(), "Const(\"resolved\")".into()),
                ("Text(\"c\")".into(), "Const(\"waiting\")".into()),
            ]
        );
        assert_eq!(rows[0].1[4], "Int(3)");
    }

    #[test]
    fn a_counter_counts_and_kept_columns_stay() {
        let upsert = |source: &str| RowChange::Upsert {
            table: "t",
            key: &["k"],
            columns: &["source", "at"],
            values: vec![text("k"), text(source), Value::Position],
            on_conflict: OnConflict::Update {
                keep: &["source"],
                counter: Some("n"),
                if_greater: None,
            },
        };
        let mut image = Image::default();
        image.apply(vec![upsert("first")], 5).unwrap();
        image.apply(vec![upsert("second")], 6).unwrap();
        let rows = rows(image);
        assert_eq!(
            rows[0].1,
            vec!["Text(\"k\")", "Text(\"first\")", "Int(6)", "Int(2)"]
        );
    }

    #[test]
    fn per_row_values_expand_and_delete_unless_reads_the_other_table() {
        let mut image = Image::default();
        image
            .apply(
                vec![
                    RowChange::Upsert {
                        table: "f",
                        key: &["s", "f"],
                        columns: &["q"],
                        values: vec![
                            text("s"),
                            Value::EachText(vec!["b".into(), "a".into()]),
                            Value::EachInt(vec![Some(1), None]),
                        ],
                        on_conflict: OnConflict::Nothing,
                    },
                    RowChange::Upsert {
                        table: "w",
                        key: &["g"],
                        columns: &[],
                        values: vec![text("s")],
                        on_conflict: OnConflict::Nothing,
                    },
                ],
                1,
            )
            .unwrap();
        let unless = |q: i64| RowChange::DeleteUnless {
            table: "w",
            key: &["g"],
            values: vec![text("s")],
            unless: Exists {
                table: "f",
                within: ("s", text("s")),
                tests: vec![Test::Eq("q", Value::Int(q))],
            },
        };
        image.apply(vec![unless(1)], 2).unwrap();
        assert_eq!(rows_named(&mut image, "w"), 1, "a row with q = 1 keeps it");
        image
            .apply(
                vec![RowChange::Delete {
                    table: "f",
                    key: &["s", "f"],
                    values: vec![text("s"), Value::EachText(vec!["b".into()])],
                }],
                3,
            )
            .unwrap();
        image.apply(vec![unless(1)], 4).unwrap();
        let rows = rows(image);
        assert_eq!(
            rows,
            vec![(
                "f".to_owned(),
                vec!["Text(\"s\")".into(), "Text(\"a\")".into(), "Null".into()]
            )]
        );
    }

    fn rows_named(image: &mut Image, table: &str) -> usize {
        image
            .tables
            .iter()
            .find(|t| t.name == table)
            .map_or(0, |t| t.rows.values().map(BTreeMap::len).sum())
    }
}
