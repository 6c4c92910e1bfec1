//! The image a rebuild folds row changes into (ADR 0077): a row projector's tables in
//! memory, keyed by primary key, written in bulk at the end (ADR 0025).

use std::collections::{BTreeMap, HashMap};

use crate::error::StoreError;
use crate::projector::{Column, OnConflict, RowChange, Test, Value};

/// A row projector's tables as its changes leave them, in memory: a rebuild folds every
/// event's changes into it, in position order, and writes its rows into the (reset) tables in
/// bulk at the end (ADR 0025). It applies each change as the backends' statements do, in
/// order; the memory it takes is the size of the projection, not of the log. A column no
/// change named is `NULL` (the tables of row projectors default nothing else).
#[derive(Default)]
pub struct Image {
    tables: Vec<TableImage>,
}

/// One table of an [`Image`], keyed by its primary key: by the first key column's value (a
/// group, a session), then by the rest of the key, in order. A row holds the values of the
/// columns other than the key's.
pub(crate) struct TableImage {
    /// The table.
    pub(crate) name: &'static str,
    key: &'static [Column],
    /// The columns other than the key's, in the order changes first named them.
    columns: Vec<Column>,
    rows: HashMap<Value, Part, KeyHash>,
    /// Where each column list a change named lands in `columns`.
    shapes: Vec<Shape>,
}

/// Where a change's columns land in a table's: `indices[j]` is the change's `j`th column's
/// place (`in_order`: the places are 0, 1, 2, ..., so a new row's values are its row as given).
struct Shape {
    id: (usize, usize),
    indices: Vec<usize>,
    in_order: bool,
}

static NULL: Value = Value::Null;

impl Image {
    /// Applies one event's changes, in order, and empties `changes`; `position` is the
    /// event's.
    pub fn apply(&mut self, changes: &mut Vec<RowChange>, position: i64) -> Result<(), StoreError> {
        for change in changes.drain(..) {
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
                    let upsert = image.upsert_of(columns, &on_conflict)?;
                    each_row(values, rows, |row| {
                        image.upsert(row, &upsert, columns, &on_conflict, position);
                        Ok(())
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
                    each_row(values, rows, |row| {
                        image.update(row, shape, position);
                        Ok(())
                    })?;
                }
                RowChange::Delete { table, key, values } => {
                    let Some(image) = self.table_mut(table, key)? else {
                        continue;
                    };
                    each_row(values, rows, |row| {
                        image.delete(row, position);
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
                        each_row(values, rows, |row| {
                            image.delete(row, position);
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
        self.tables.iter().position(|t| same_name(t.name, table))
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
                    rows: HashMap::default(),
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
/// `None` for one). A [`Value::Position`] stays one: the table's methods put the event's
/// position in its place where they keep or compare a value.
fn each_row(
    values: Vec<Value>,
    rows: Option<usize>,
    mut row: impl FnMut(Vec<Value>) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let Some(rows) = rows else {
        return row(values);
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
            other => Source::One(other),
        })
        .collect();
    for _ in 0..rows {
        let values = sources
            .iter_mut()
            .map(|source| match source {
                Source::One(value) => value.clone(),
                Source::Text(list) => list.next().map_or(Value::Null, |t| Value::Text(t.into())),
                Source::Int(list) => list.next().flatten().map_or(Value::Null, Value::Int),
            })
            .collect();
        row(values)?;
    }
    Ok(())
}

/// A key's values with the event's position in place of [`Value::Position`].
fn settle_key(key: &mut [Value], position: i64) {
    for value in key {
        if matches!(value, Value::Position) {
            *value = Value::Int(position);
        }
    }
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
        (Value::Text(x), Value::Const(y)) | (Value::Const(y), Value::Text(x)) => **x == **y,
        _ => a == b,
    }
}

/// `new > old` as SQL has it: false when either is `NULL`.
fn greater(new: &Value, old: &Value) -> bool {
    !matches!(new, Value::Null) && !matches!(old, Value::Null) && new > old
}

/// What an upsert of one column list does to a table's rows: its shape, and the places of its
/// counter and of its guard's column among the change's.
struct UpsertOf {
    shape: usize,
    counter: Option<usize>,
    guard: Option<usize>,
}

impl TableImage {
    fn check_key(&self, key: &[Column]) -> Result<(), StoreError> {
        if !std::ptr::eq(self.key, key) && self.key != key {
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
        if let Some(at) = self.shapes.iter().position(|s| s.id == id) {
            return at;
        }
        let indices: Vec<usize> = columns
            .iter()
            .map(|c| column_index(&mut self.columns, c))
            .collect();
        let in_order = indices.iter().enumerate().all(|(j, &i)| i == j);
        self.shapes.push(Shape {
            id,
            indices,
            in_order,
        });
        self.shapes.len() - 1
    }

    fn upsert_of(
        &mut self,
        columns: &'static [Column],
        on_conflict: &OnConflict,
    ) -> Result<UpsertOf, StoreError> {
        let shape = self.shape(columns);
        let (counter, guard) = match on_conflict {
            OnConflict::Nothing => (None, None),
            OnConflict::Update {
                counter,
                if_greater,
                ..
            } => {
                let guard = match if_greater {
                    Some(column) => Some(
                        columns
                            .iter()
                            .position(|c| same_name(c, column))
                            .ok_or_else(|| {
                                StoreError::Task(format!(
                                    "{}: an upsert guarded by {column}, which it does not write",
                                    self.name
                                ))
                            })?,
                    ),
                    None => None,
                };
                (counter.map(|c| column_index(&mut self.columns, c)), guard)
            }
        };
        Ok(UpsertOf {
            shape,
            counter,
            guard,
        })
    }

    fn upsert(
        &mut self,
        mut row: Vec<Value>,
        upsert: &UpsertOf,
        columns: &[Column],
        on_conflict: &OnConflict,
        position: i64,
    ) {
        let k = self.key.len();
        settle_key(&mut row[..k], position);
        let width = self.columns.len();
        let shape = &self.shapes[upsert.shape];
        let found = self
            .rows
            .get_mut(&row[0])
            .and_then(|part| part.get_mut(&row[1..k]));
        if let Some(stored) = found {
            let OnConflict::Update { keep, .. } = on_conflict else {
                return;
            };
            if stored.len() < width {
                stored.resize(width, Value::Null);
            }
            if let Some(j) = upsert.guard {
                let new = match &row[k + j] {
                    Value::Position => &Value::Int(position),
                    other => other,
                };
                if !greater(new, &stored[shape.indices[j]]) {
                    return;
                }
            }
            for (j, value) in row.drain(k..).enumerate() {
                if keep.is_empty() || !keep.contains(&columns[j]) {
                    stored[shape.indices[j]] = settled(value, position);
                }
            }
            if let Some(counter) = upsert.counter {
                stored[counter] = match stored[counter] {
                    Value::Int(n) => Value::Int(n + 1),
                    _ => Value::Int(1),
                };
            }
            return;
        }
        // A new row: the key's values leave `row`, which keeps the columns'.
        let mut key = row.drain(..k);
        let first = key.next().unwrap_or(Value::Null);
        let rest: Vec<Value> = key.collect();
        let mut stored = if shape.in_order {
            for value in &mut row {
                if matches!(value, Value::Position) {
                    *value = Value::Int(position);
                }
            }
            row
        } else {
            let mut stored = vec![Value::Null; width];
            for (&i, value) in shape.indices.iter().zip(row) {
                stored[i] = settled(value, position);
            }
            stored
        };
        stored.resize(width, Value::Null);
        if let Some(counter) = upsert.counter {
            stored[counter] = Value::Int(1);
        }
        match self.rows.get_mut(&first) {
            Some(part) => {
                part.insert(rest, stored);
            }
            None => {
                self.rows.insert(first, Part::Few(vec![(rest, stored)]));
            }
        }
    }

    fn update(&mut self, mut row: Vec<Value>, shape: usize, position: i64) {
        let k = self.key.len();
        settle_key(&mut row[..k], position);
        let width = self.columns.len();
        let Some(stored) = self
            .rows
            .get_mut(&row[0])
            .and_then(|part| part.get_mut(&row[1..k]))
        else {
            return;
        };
        if stored.len() < width {
            stored.resize(width, Value::Null);
        }
        for (&i, value) in self.shapes[shape].indices.iter().zip(row.drain(k..)) {
            stored[i] = settled(value, position);
        }
    }

    fn delete(&mut self, mut row: Vec<Value>, position: i64) {
        let k = self.key.len();
        settle_key(&mut row[..k], position);
        if let Some(part) = self.rows.get_mut(&row[0]) {
            part.remove(&row[1..k]);
            if part.is_empty() {
                self.rows.remove(&row[0]);
            }
        }
    }

    /// The tests with each column resolved to its place in a row.
    fn checks<'t>(&self, tests: &'t [Test]) -> Vec<Check<'t>> {
        tests.iter().map(|test| self.check(test)).collect()
    }

    fn check<'t>(&self, test: &'t Test) -> Check<'t> {
        let slot = |column: Column| match self.key.iter().position(|c| *c == column) {
            Some(0) => Slot::First,
            Some(k) => Slot::Rest(k - 1),
            None => self
                .columns
                .iter()
                .position(|c| *c == column)
                .map_or(Slot::Missing, Slot::Column),
        };
        match test {
            Test::Eq(column, Value::Null) => Check::IsNull(slot(column)),
            Test::Ne(column, Value::Null) => Check::NotNull(slot(column)),
            Test::Eq(column, value) => Check::Eq(slot(column), value),
            Test::Ne(column, value) => Check::Ne(slot(column), value),
            Test::Any(tests) => Check::Any(self.checks(tests)),
        }
    }

    fn update_where(&mut self, within: &Value, tests: &[Test], shape: usize, values: &[Value]) {
        let checks = self.checks(tests);
        let width = self.columns.len();
        let Some(part) = self.rows.get_mut(within) else {
            return;
        };
        let indices = &self.shapes[shape].indices;
        part.for_each_mut(|rest, stored| {
            if passes(&checks, within, rest, stored) {
                if stored.len() < width {
                    stored.resize(width, Value::Null);
                }
                for (&i, value) in indices.iter().zip(values) {
                    stored[i] = value.clone();
                }
            }
        });
    }

    fn delete_where(&mut self, within: &Value, tests: &[Test]) {
        let checks = self.checks(tests);
        let Some(part) = self.rows.get_mut(within) else {
            return;
        };
        part.retain(|rest, stored| !passes(&checks, within, rest, stored));
        if part.is_empty() {
            self.rows.remove(within);
        }
    }

    fn any(&self, within: &Value, tests: &[Test]) -> bool {
        let checks = self.checks(tests);
        self.rows.get(within).is_some_and(|part| {
            part.iter()
                .any(|(rest, stored)| passes(&checks, within, rest, stored))
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
            for (rest, stored) in part.iter() {
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

/// The rows of one first key value, by the rest of the key (values of the other columns):
/// a short sorted list while there are few (a group's declarers; the one row of a table keyed
/// by one column), a B-tree once there are many (a session's filters). Most parts hold a row
/// or a few, and a B-tree's first node is a few hundred bytes: a fold over many groups stays
/// in a fraction of the memory, and of the cache misses, that way.
enum Part {
    Few(Vec<(Vec<Value>, Vec<Value>)>),
    Many(BTreeMap<Vec<Value>, Vec<Value>>),
}

/// How many rows a [`Part::Few`] holds before it becomes a [`Part::Many`].
const FEW: usize = 32;

impl Part {
    fn len(&self) -> usize {
        match self {
            Self::Few(rows) => rows.len(),
            Self::Many(rows) => rows.len(),
        }
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn get_mut(&mut self, rest: &[Value]) -> Option<&mut Vec<Value>> {
        match self {
            // A few rows: a scan by equality is cheaper than a search by order.
            Self::Few(rows) => rows
                .iter_mut()
                .find(|(key, _)| key.as_slice() == rest)
                .map(|(_, stored)| stored),
            Self::Many(rows) => rows.get_mut(rest),
        }
    }

    /// Adds a row whose key is not in the part.
    fn insert(&mut self, rest: Vec<Value>, row: Vec<Value>) {
        match self {
            Self::Few(rows) => {
                match rows.binary_search_by(|(key, _)| key.as_slice().cmp(&rest)) {
                    Ok(at) => rows[at].1 = row,
                    Err(at) => rows.insert(at, (rest, row)),
                }
                if rows.len() > FEW {
                    *self = Self::Many(std::mem::take(rows).into_iter().collect());
                }
            }
            Self::Many(rows) => {
                rows.insert(rest, row);
            }
        }
    }

    fn remove(&mut self, rest: &[Value]) {
        match self {
            Self::Few(rows) => {
                if let Ok(at) = rows.binary_search_by(|(key, _)| key.as_slice().cmp(rest)) {
                    rows.remove(at);
                }
            }
            Self::Many(rows) => {
                rows.remove(rest);
            }
        }
    }

    fn retain(&mut self, mut keep: impl FnMut(&[Value], &[Value]) -> bool) {
        match self {
            Self::Few(rows) => rows.retain(|(rest, stored)| keep(rest, stored)),
            Self::Many(rows) => rows.retain(|rest, stored| keep(rest, stored)),
        }
    }

    /// The rows in key order.
    fn iter(&self) -> Box<dyn Iterator<Item = (&[Value], &Vec<Value>)> + '_> {
        match self {
            Self::Few(rows) => {
                Box::new(rows.iter().map(|(rest, stored)| (rest.as_slice(), stored)))
            }
            Self::Many(rows) => {
                Box::new(rows.iter().map(|(rest, stored)| (rest.as_slice(), stored)))
            }
        }
    }

    fn for_each_mut(&mut self, mut each: impl FnMut(&[Value], &mut Vec<Value>)) {
        match self {
            Self::Few(rows) => rows
                .iter_mut()
                .for_each(|(rest, stored)| each(rest, stored)),
            Self::Many(rows) => rows
                .iter_mut()
                .for_each(|(rest, stored)| each(rest, stored)),
        }
    }
}

/// Two names the same: most often the same literal, compared by address first.
fn same_name(a: &str, b: &str) -> bool {
    std::ptr::eq(a, b) || a == b
}

fn column_index(columns: &mut Vec<Column>, column: Column) -> usize {
    match columns.iter().position(|c| same_name(c, column)) {
        Some(at) => at,
        None => {
            columns.push(column);
            columns.len() - 1
        }
    }
}

/// Where a column's value is in a row of a [`TableImage`].
#[derive(Clone, Copy)]
enum Slot {
    First,
    Rest(usize),
    Column(usize),
    /// A column no change wrote: `NULL` in every row.
    Missing,
}

/// A [`Test`] with its column resolved.
enum Check<'t> {
    Eq(Slot, &'t Value),
    Ne(Slot, &'t Value),
    IsNull(Slot),
    NotNull(Slot),
    Any(Vec<Check<'t>>),
}

/// Whether a row passes every check, as SQL would find (a comparison with `NULL` fails).
fn passes(checks: &[Check<'_>], first: &Value, rest: &[Value], stored: &[Value]) -> bool {
    let cell = |slot: Slot| -> &Value {
        match slot {
            Slot::First => first,
            Slot::Rest(k) => rest.get(k).unwrap_or(&NULL),
            Slot::Column(i) => stored.get(i).unwrap_or(&NULL),
            Slot::Missing => &NULL,
        }
    };
    fn holds<'v>(check: &Check<'_>, cell: &dyn Fn(Slot) -> &'v Value) -> bool {
        match check {
            Check::IsNull(slot) => matches!(cell(*slot), Value::Null),
            Check::NotNull(slot) => !matches!(cell(*slot), Value::Null),
            Check::Eq(slot, value) => {
                let found = cell(*slot);
                !matches!(found, Value::Null) && same(found, value)
            }
            Check::Ne(slot, value) => {
                let found = cell(*slot);
                !matches!(found, Value::Null) && !same(found, value)
            }
            Check::Any(checks) => checks.iter().any(|c| holds(c, cell)),
        }
    }
    checks.iter().all(|check| holds(check, &cell))
}

/// The hash of an image's first key values (names it wrote itself, not input an adversary
/// picks): a multiply-and-rotate hash a word at a time, several times cheaper than SipHash on
/// a short name, which a rebuild computes a few times per event.
#[derive(Default, Clone, Copy)]
struct KeyHash;

impl std::hash::BuildHasher for KeyHash {
    type Hasher = KeyHasher;

    fn build_hasher(&self) -> KeyHasher {
        KeyHasher(0)
    }
}

struct KeyHasher(u64);

impl KeyHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl std::hash::Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let tail = chunks.remainder();
        if !tail.is_empty() {
            let mut word = [0u8; 8];
            word[..tail.len()].copy_from_slice(tail);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    /// The product's high bits are its best mixed; the table indexes by the low ones, which
    /// on their own would tell apart only about 1 in 15 of names that differ in a few digits.
    fn finish(&self) -> u64 {
        self.0.rotate_left(26)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::projector::Exists;

    const ATTEMPT_KEY: &[Column] = &["group_name", "declarer"];
    const ATTEMPT_COLUMNS: &[Column] = &["status", "patterns", "position"];

    fn text(s: &str) -> Value {
        Value::text(s)
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
                Value::list(set.iter().map(|s| (*s).to_owned()).collect()),
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
            .apply(&mut vec![attempt("b", "waiting", &["x"])], 1)
            .unwrap();
        image
            .apply(&mut vec![attempt("c", "waiting", &["y"])], 2)
            .unwrap();
        // An older event's upsert is not newer: nothing changes.
        image
            .apply(&mut vec![attempt("b", "installed", &["z"])], 1)
            .unwrap();
        image
            .apply(
                &mut vec![
                    attempt("a", "installed", &["x"]),
                    RowChange::UpdateWhere {
                        table: "attempt",
                        within: ("group_name", text("g")),
                        tests: vec![
                            Test::Eq("status", text("waiting")),
                            Test::Eq("patterns", Value::list(vec!["x".into()])),
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
        image.apply(&mut vec![upsert("first")], 5).unwrap();
        image.apply(&mut vec![upsert("second")], 6).unwrap();
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
                &mut vec![
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
        image.apply(&mut vec![unless(1)], 2).unwrap();
        assert_eq!(rows_named(&mut image, "w"), 1, "a row with q = 1 keeps it");
        image
            .apply(
                &mut vec![RowChange::Delete {
                    table: "f",
                    key: &["s", "f"],
                    values: vec![text("s"), Value::EachText(vec!["b".into()])],
                }],
                3,
            )
            .unwrap();
        image.apply(&mut vec![unless(1)], 4).unwrap();
        let rows = rows(image);
        assert_eq!(
            rows,
            vec![(
                "f".to_owned(),
                vec!["Text(\"s\")".into(), "Text(\"a\")".into(), "Null".into()]
            )]
        );
    }

    #[test]
    fn a_part_of_many_rows_keeps_them_in_key_order() {
        let names: Vec<String> = (0..40).rev().map(|i| format!("f{i:02}")).collect();
        let mut image = Image::default();
        image
            .apply(
                &mut vec![RowChange::Upsert {
                    table: "f",
                    key: &["s", "f"],
                    columns: &["q"],
                    values: vec![
                        text("s"),
                        Value::EachText(names.clone()),
                        Value::EachInt(vec![Some(0); 40]),
                    ],
                    on_conflict: OnConflict::Nothing,
                }],
                1,
            )
            .unwrap();
        image
            .apply(
                &mut vec![
                    RowChange::Update {
                        table: "f",
                        key: &["s", "f"],
                        columns: &["q"],
                        values: vec![
                            text("s"),
                            Value::EachText(vec!["f07".into()]),
                            Value::EachInt(vec![Some(7)]),
                        ],
                    },
                    RowChange::Delete {
                        table: "f",
                        key: &["s", "f"],
                        values: vec![text("s"), Value::EachText(vec!["f00".into(), "f39".into()])],
                    },
                ],
                2,
            )
            .unwrap();
        let rows = rows(image);
        assert_eq!(rows.len(), 38);
        assert_eq!(rows[0].1[1], "Text(\"f01\")");
        assert_eq!(rows[6].1, vec!["Text(\"s\")", "Text(\"f07\")", "Int(7)"]);
        assert_eq!(rows[37].1[1], "Text(\"f38\")");
    }

    fn rows_named(image: &mut Image, table: &str) -> usize {
        image
            .tables
            .iter()
            .find(|t| t.name == table)
            .map_or(0, |t| t.rows.values().map(Part::len).sum())
    }
}
