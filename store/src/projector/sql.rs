//! The SQL of a row change of one row, as both backends write it (SQLite executes it as it
//! is, Postgres makes it one CTE of the event's insert, ADR 0010): `INSERT ... ON CONFLICT`,
//! `UPDATE`, `DELETE`, the conditions, each value placed by the backend.

use super::{Column, OnConflict, RowChange, Test, Value};
use crate::error::StoreError;

/// Text as a SQL string literal.
pub(crate) fn literal(text: &str) -> String {
    let mut sql = String::with_capacity(text.len() + 2);
    push_literal(&mut sql, text);
    sql
}

/// Appends text as a SQL string literal.
pub(crate) fn push_literal(sql: &mut String, text: &str) {
    sql.push('\'');
    for c in text.chars() {
        if c == '\'' {
            sql.push('\'');
        }
        sql.push(c);
    }
    sql.push('\'');
}

/// Appends a value's SQL: a placeholder the caller binds, or a literal; called in the order
/// the values appear in the text.
pub(crate) type Place<'c, 'p> = dyn FnMut(&'c Value, &mut String) -> Result<(), StoreError> + 'p;

/// The SQL of a change of one row (or, on SQLite, of each row of a change over many), written
/// into one buffer (a statement a register sends is built per event: a few thousand
/// instructions, not the tens of thousands small strings joined took).
pub(crate) fn row_sql<'c>(
    change: &'c RowChange,
    place: &mut Place<'c, '_>,
) -> Result<String, StoreError> {
    change.check_width()?;
    let mut sql = String::with_capacity(320);
    match change {
        RowChange::Upsert {
            table,
            key,
            columns,
            values,
            on_conflict,
        } => {
            sql.push_str("INSERT INTO ");
            sql.push_str(table);
            sql.push_str(" (");
            list(
                &mut sql,
                key.iter().chain(columns.iter()),
                ", ",
                |sql, c| sql.push_str(c),
            );
            let counter = match on_conflict {
                OnConflict::Update {
                    counter: Some(counter),
                    ..
                } => Some(*counter),
                _ => None,
            };
            if let Some(counter) = counter {
                sql.push_str(", ");
                sql.push_str(counter);
            }
            sql.push_str(") VALUES (");
            for (i, value) in values.iter().enumerate() {
                if i > 0 {
                    sql.push_str(", ");
                }
                place(value, &mut sql)?;
            }
            if counter.is_some() {
                sql.push_str(", 1");
            }
            sql.push(')');
            on_conflict_sql(&mut sql, table, key, columns, on_conflict);
        }
        RowChange::Update {
            table,
            key,
            columns,
            values,
        } => {
            let (by_key, set) = values.split_at(key.len());
            sql.push_str("UPDATE ");
            sql.push_str(table);
            sql.push_str(" SET ");
            assignments(&mut sql, columns, set, place)?;
            sql.push_str(" WHERE ");
            equalities(&mut sql, "", key, by_key, place)?;
        }
        RowChange::Delete { table, key, values } => {
            sql.push_str("DELETE FROM ");
            sql.push_str(table);
            sql.push_str(" WHERE ");
            equalities(&mut sql, "", key, values, place)?;
        }
        RowChange::UpdateWhere {
            table,
            within,
            tests,
            columns,
            values,
        } => {
            sql.push_str("UPDATE ");
            sql.push_str(table);
            sql.push_str(" SET ");
            assignments(&mut sql, columns, values, place)?;
            sql.push_str(" WHERE ");
            conditions(&mut sql, "", within, tests, place)?;
        }
        RowChange::DeleteWhere {
            table,
            within,
            tests,
        } => {
            sql.push_str("DELETE FROM ");
            sql.push_str(table);
            sql.push_str(" WHERE ");
            conditions(&mut sql, "", within, tests, place)?;
        }
        RowChange::DeleteUnless {
            table,
            key,
            values,
            unless,
        } => {
            sql.push_str("DELETE FROM ");
            sql.push_str(table);
            sql.push_str(" WHERE ");
            equalities(&mut sql, "", key, values, place)?;
            sql.push_str(" AND NOT EXISTS (SELECT 1 FROM ");
            sql.push_str(unless.table);
            sql.push_str(" a WHERE ");
            conditions(&mut sql, "a.", &unless.within, &unless.tests, place)?;
            sql.push(')');
        }
    }
    Ok(sql)
}

/// Appends the items, separated.
fn list<T>(
    sql: &mut String,
    items: impl IntoIterator<Item = T>,
    separator: &str,
    mut each: impl FnMut(&mut String, T),
) {
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            sql.push_str(separator);
        }
        each(sql, item);
    }
}

/// Appends ` ON CONFLICT (key) DO ...` of an upsert.
pub(crate) fn on_conflict_sql(
    sql: &mut String,
    table: &str,
    key: &[Column],
    columns: &[Column],
    on_conflict: &OnConflict,
) {
    sql.push_str(" ON CONFLICT (");
    list(sql, key, ", ", |sql, c| sql.push_str(c));
    sql.push(')');
    let (keep, counter, if_greater) = match on_conflict {
        OnConflict::Update {
            keep,
            counter,
            if_greater,
        } if counter.is_some() || columns.iter().any(|c| !keep.contains(c)) => {
            (*keep, *counter, *if_greater)
        }
        _ => {
            sql.push_str(" DO NOTHING");
            return;
        }
    };
    sql.push_str(" DO UPDATE SET ");
    let set = columns.iter().filter(|c| !keep.contains(c));
    list(sql, set, ", ", |sql, c| {
        sql.push_str(c);
        sql.push_str(" = excluded.");
        sql.push_str(c);
    });
    if let Some(counter) = counter {
        if columns.iter().any(|c| !keep.contains(c)) {
            sql.push_str(", ");
        }
        sql.push_str(counter);
        sql.push_str(" = ");
        sql.push_str(table);
        sql.push('.');
        sql.push_str(counter);
        sql.push_str(" + 1");
    }
    if let Some(column) = if_greater {
        sql.push_str(" WHERE excluded.");
        sql.push_str(column);
        sql.push_str(" > ");
        sql.push_str(table);
        sql.push('.');
        sql.push_str(column);
    }
}

fn assignments<'c>(
    sql: &mut String,
    columns: &[Column],
    values: &'c [Value],
    place: &mut Place<'c, '_>,
) -> Result<(), StoreError> {
    for (i, (column, value)) in columns.iter().zip(values).enumerate() {
        if i > 0 {
            sql.push_str(", ");
        }
        sql.push_str(column);
        sql.push_str(" = ");
        place(value, sql)?;
    }
    Ok(())
}

fn equalities<'c>(
    sql: &mut String,
    alias: &str,
    key: &[Column],
    values: &'c [Value],
    place: &mut Place<'c, '_>,
) -> Result<(), StoreError> {
    for (i, (column, value)) in key.iter().zip(values).enumerate() {
        if i > 0 {
            sql.push_str(" AND ");
        }
        sql.push_str(alias);
        sql.push_str(column);
        sql.push_str(" = ");
        place(value, sql)?;
    }
    Ok(())
}

/// Appends `within` and the tests, joined by `AND`, the columns prefixed by `alias`.
fn conditions<'c>(
    sql: &mut String,
    alias: &str,
    within: &'c (Column, Value),
    tests: &'c [Test],
    place: &mut Place<'c, '_>,
) -> Result<(), StoreError> {
    sql.push_str(alias);
    sql.push_str(within.0);
    sql.push_str(" = ");
    place(&within.1, sql)?;
    for test in tests {
        sql.push_str(" AND ");
        test_sql(sql, alias, test, place)?;
    }
    Ok(())
}

fn test_sql<'c>(
    sql: &mut String,
    alias: &str,
    test: &'c Test,
    place: &mut Place<'c, '_>,
) -> Result<(), StoreError> {
    match test {
        Test::Eq(column, value) | Test::Ne(column, value) => {
            sql.push_str(alias);
            sql.push_str(column);
            let equal = matches!(test, Test::Eq(..));
            match (value, equal) {
                (Value::Null, true) => sql.push_str(" IS NULL"),
                (Value::Null, false) => sql.push_str(" IS NOT NULL"),
                (value, equal) => {
                    sql.push_str(if equal { " = " } else { " <> " });
                    place(value, sql)?;
                }
            }
        }
        Test::Any(tests) => {
            sql.push('(');
            for (i, test) in tests.iter().enumerate() {
                if i > 0 {
                    sql.push_str(" OR ");
                }
                test_sql(sql, alias, test, place)?;
            }
            sql.push(')');
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::projector::Exists;

    fn placeholders() -> impl FnMut(&Value, &mut String) -> Result<(), StoreError> {
        let mut n = 0;
        move |value, sql| {
            match value {
                Value::Null => sql.push_str("NULL"),
                Value::Const(text) => push_literal(sql, text),
                Value::Position => sql.push_str("pos"),
                _ => {
                    n += 1;
                    sql.push_str(&format!("${n}"));
                }
            }
            Ok(())
        }
    }

    #[test]
    fn an_upsert_with_a_counter_and_a_guard_reads_as_sql() {
        let change = RowChange::Upsert {
            table: "t",
            key: &["k"],
            columns: &["a", "b", "position"],
            values: vec![
                Value::text("x"),
                Value::Const("it's"),
                Value::Null,
                Value::Position,
            ],
            on_conflict: OnConflict::Update {
                keep: &["a"],
                counter: Some("n"),
                if_greater: Some("position"),
            },
        };
        assert_eq!(
            row_sql(&change, &mut placeholders()).unwrap(),
            "INSERT INTO t (k, a, b, position, n) VALUES ($1, 'it''s', NULL, pos, 1) \
             ON CONFLICT (k) DO UPDATE SET b = excluded.b, position = excluded.position, \
             n = t.n + 1 WHERE excluded.position > t.position"
        );
    }

    #[test]
    fn conditions_read_as_sql() {
        let change = RowChange::DeleteUnless {
            table: "w",
            key: &["g"],
            values: vec![Value::text("g")],
            unless: Exists {
                table: "a",
                within: ("g", Value::text("g")),
                tests: vec![
                    Test::Eq("s", Value::Const("waiting")),
                    Test::Any(vec![
                        Test::Ne("d", Value::text("d")),
                        Test::Eq("x", Value::Null),
                    ]),
                ],
            },
        };
        assert_eq!(
            row_sql(&change, &mut placeholders()).unwrap(),
            "DELETE FROM w WHERE g = $1 AND NOT EXISTS (SELECT 1 FROM a a WHERE a.g = $2 \
             AND a.s = 'waiting' AND (a.d <> $3 OR a.x IS NULL))"
        );
    }

    #[test]
    fn a_change_with_one_value_too_few_is_refused() {
        let change = RowChange::Update {
            table: "t",
            key: &["k"],
            columns: &["a"],
            values: vec![Value::Int(1)],
        };
        assert!(row_sql(&change, &mut placeholders()).is_err());
    }

    #[test]
    fn per_row_values_of_different_lengths_are_refused() {
        let change = RowChange::Delete {
            table: "t",
            key: &["k", "l"],
            values: vec![
                Value::EachText(vec!["a".into()]),
                Value::EachInt(vec![Some(1), None]),
            ],
        };
        assert!(change.rows().is_err());
    }
}
