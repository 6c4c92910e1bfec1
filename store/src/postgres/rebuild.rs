//! Projection rebuild and verification on Postgres (see [`crate::rebuild`]).

use std::sync::Arc;

use chrono::{DateTime, SecondsFormat, Utc};
use sqlx::{Executor, PgConnection};

use super::events::{
    close_rebuild_cursor, custom_plans, fetch_rebuild_cursor, lock_appends, lock_checkpoint,
    open_rebuild_cursor, set_checkpoint,
};
use super::PgStore;
use crate::error::StoreError;
use crate::event::RecordedEvent;
use crate::projector::{PgProjector, Value};
use crate::rebuild::{
    fold_page, snapshot_table, Image, Progress, RebuildMode, RebuildReport, ReplayApply,
    ReplayTarget, TableDifference, REBUILD_PAGE,
};

impl PgStore {
    /// Rebuilds the inline projectors and the given catch-up projectors from the whole log,
    /// holding the append lock so no event lands mid-replay. Readers keep the old rows until
    /// commit (MVCC); Verify rolls back. Row projectors fold their changes into an image of
    /// their tables in memory, written in bulk at the end (on Verify into unindexed temporary
    /// copies of their tables, compared with the untouched live rows); the others apply event
    /// by event into their reset tables (on Verify after a copy of the live rows is kept).
    pub async fn rebuild(
        &self,
        catch_up: Vec<Arc<dyn PgProjector>>,
        mode: RebuildMode,
        progress: Progress,
    ) -> Result<RebuildReport, StoreError> {
        let mut tx = self.pool.begin().await?;
        custom_plans(&mut tx).await?;
        lock_appends(&mut tx).await?;
        let head: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(position), 0) FROM events")
            .fetch_one(&mut *tx)
            .await?;
        for projector in &catch_up {
            // Locked, so catch-up runners wait for the rebuild instead of racing its reset.
            let from = lock_checkpoint(&mut tx, projector.name()).await?;
            if mode == RebuildMode::Verify {
                // The live rows may lag the log: bring them to its head first, so that Verify
                // compares like with like.
                let mut steps = vec![Step::Apply(projector.clone())];
                replay(&mut tx, &mut steps, from, head, &|_| {}).await?;
            }
        }
        let all: Vec<Arc<dyn PgProjector>> = self
            .projectors
            .iter()
            .cloned()
            .chain(catch_up.iter().cloned())
            .collect();
        let mut steps: Vec<Step> = all.iter().map(Step::of).collect();
        let target = match mode {
            RebuildMode::Apply => ReplayTarget::Live,
            RebuildMode::Verify => ReplayTarget::Aside,
        };
        // What Verify compares, per table: (table, live rows, replayed rows).
        let mut compared: Vec<(&str, String, String)> = Vec::new();
        for (projector, step) in all.iter().zip(&steps) {
            let folded_aside = mode == RebuildMode::Verify && matches!(step, Step::Image(..));
            for &table in projector.tables() {
                let copy = snapshot_table(table);
                if folded_aside {
                    // The fold writes into an unindexed copy and the live rows stay as they
                    // are: no delete, no index upkeep, no copy of the live table.
                    let create = format!(
                        "CREATE TEMP TABLE {copy} \
                         (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS) ON COMMIT DROP"
                    );
                    tx.execute(create.as_str()).await?;
                    compared.push((table, table.to_owned(), copy));
                } else if mode == RebuildMode::Verify {
                    // Applied event by event into its own tables: keep the live rows aside.
                    let create =
                        format!("CREATE TEMP TABLE {copy} ON COMMIT DROP AS SELECT * FROM {table}");
                    tx.execute(create.as_str()).await?;
                    compared.push((table, copy, table.to_owned()));
                }
            }
            if !folded_aside {
                projector.reset(&mut tx).await?;
            }
        }
        let total: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM events")
            .fetch_one(&mut *tx)
            .await?;
        let done = std::sync::atomic::AtomicU64::new(0);
        replay(&mut tx, &mut steps, 0, head, &|n| {
            let so_far = done.fetch_add(n, std::sync::atomic::Ordering::Relaxed) + n;
            progress(so_far, total as u64);
        })
        .await?;
        for step in steps {
            write_step(&mut tx, step, target).await?;
        }
        for projector in &catch_up {
            set_checkpoint(&mut tx, projector.name(), head).await?;
        }
        let differences = match mode {
            RebuildMode::Apply => Vec::new(),
            RebuildMode::Verify => {
                // Room to hash the comparison: with the default 4 MB, `EXCEPT ALL` over a
                // large projection sorts on disk and grows faster than the table.
                sqlx::query("SET LOCAL work_mem = '256MB'")
                    .execute(&mut *tx)
                    .await?;
                compare(&mut tx, &compared).await?
            }
        };
        match mode {
            RebuildMode::Apply => tx.commit().await?,
            RebuildMode::Verify => tx.rollback().await?,
        }
        Ok(RebuildReport {
            events: total as u64,
            last_position: head,
            differences,
            applied: mode == RebuildMode::Apply,
        })
    }
}

type Step = crate::rebuild::Step<dyn PgProjector>;

/// Writes a row projector's image into `target` (nothing for a projector applied event by
/// event).
async fn write_step(
    conn: &mut PgConnection,
    step: Step,
    target: ReplayTarget,
) -> Result<(), StoreError> {
    match step.into_image() {
        Some((projector, image)) => write_image(conn, image, target)
            .await
            .map_err(|e| StoreError::in_projector(projector.name(), e)),
        None => Ok(()),
    }
}

/// Applies projectors event by event on the replay's connection, between cursor pages.
struct PgApply<'c>(&'c mut PgConnection);

impl ReplayApply for PgApply<'_> {
    type Projector = dyn PgProjector;

    async fn apply(
        &mut self,
        projector: &(dyn PgProjector + 'static),
        event: &RecordedEvent,
    ) -> Result<(), StoreError> {
        projector.apply(self.0, event).await
    }
}

/// Writes an image's rows into `target`'s tables, each by one `COPY ... FROM STDIN`.
async fn write_image(
    conn: &mut PgConnection,
    image: Image,
    target: ReplayTarget,
) -> Result<(), StoreError> {
    for table in image.into_tables() {
        let into = format!(
            "{} ({})",
            target.table(table.name),
            table.columns().join(", ")
        );
        let mut rows = CopyText::default();
        table.write_rows(|row| {
            for value in row {
                rows.value(value)?;
            }
            rows.end_row();
            Ok(())
        })?;
        copy(conn, &into, rows).await?;
    }
    Ok(())
}

/// Rows of one `COPY ... FROM STDIN` in text format.
#[derive(Default)]
struct CopyText {
    text: String,
    fields: usize,
}

impl CopyText {
    /// Appends a value as its field.
    fn value(&mut self, value: &Value) -> Result<(), StoreError> {
        match value {
            Value::Null => self.null(),
            Value::Text(text) => self.field(text),
            Value::Const(text) => self.field(text),
            Value::Int(n) => self.field(&n.to_string()),
            Value::Time(at) => self.time(*at),
            Value::TextList(list) => self.array(list),
            Value::Position | Value::EachText(_) | Value::EachInt(_) => {
                return Err(StoreError::Task(
                    "a rebuild's image holds a value it should have settled".to_owned(),
                ))
            }
        }
        Ok(())
    }

    /// Appends a field, escaped for COPY (`\`, tab, newline, carriage return).
    fn field(&mut self, value: &str) {
        self.separate();
        for c in value.chars() {
            match c {
                '\\' => self.text.push_str("\\\\"),
                '\t' => self.text.push_str("\\t"),
                '\n' => self.text.push_str("\\n"),
                '\r' => self.text.push_str("\\r"),
                c => self.text.push(c),
            }
        }
    }

    fn null(&mut self) {
        self.separate();
        self.text.push_str("\\N");
    }

    /// A `text[]` as an array literal, every element quoted.
    fn array(&mut self, list: &[String]) {
        let mut literal = String::from("{");
        for (i, item) in list.iter().enumerate() {
            if i > 0 {
                literal.push(',');
            }
            literal.push('"');
            for c in item.chars() {
                if c == '"' || c == '\\' {
                    literal.push('\\');
                }
                literal.push(c);
            }
            literal.push('"');
        }
        literal.push('}');
        self.field(&literal);
    }

    /// A timestamptz exactly as sqlx binds one: microseconds, truncated.
    fn time(&mut self, at: DateTime<Utc>) {
        let micros = at.timestamp_micros();
        let exact = DateTime::from_timestamp_micros(micros).unwrap_or(at);
        self.field(&exact.to_rfc3339_opts(SecondsFormat::Micros, true));
    }

    fn end_row(&mut self) {
        self.text.push('\n');
        self.fields = 0;
    }

    fn separate(&mut self) {
        if self.fields > 0 {
            self.text.push('\t');
        }
        self.fields += 1;
    }
}

/// Sends `rows` through `COPY {target} FROM STDIN`, in chunks.
async fn copy(conn: &mut PgConnection, target: &str, rows: CopyText) -> Result<(), StoreError> {
    if rows.text.is_empty() {
        return Ok(());
    }
    let mut copy = conn
        .copy_in_raw(&format!("COPY {target} FROM STDIN"))
        .await?;
    for chunk in rows.text.as_bytes().chunks(1 << 20) {
        copy.send(chunk).await?;
    }
    copy.finish().await?;
    Ok(())
}

/// Replays the events with `after < position <= head` into `steps`, through one cursor read
/// a page at a time (so that projectors applied event by event can write between pages on
/// the same connection).
async fn replay(
    conn: &mut PgConnection,
    steps: &mut [Step],
    after: i64,
    head: i64,
    on_page: &(dyn Fn(u64) + Sync),
) -> Result<(), StoreError> {
    if after >= head {
        return Ok(());
    }
    open_rebuild_cursor(conn, after, head).await?;
    loop {
        let page = fetch_rebuild_cursor(conn, REBUILD_PAGE).await?;
        if page.is_empty() {
            break;
        }
        fold_page(steps, &page, &mut PgApply(&mut *conn)).await?;
        on_page(page.len() as u64);
    }
    close_rebuild_cursor(conn).await
}

/// Counts, per compared table, the rows only the live side holds and those only the replay
/// produced (multisets: a duplicated row counts).
async fn compare(
    conn: &mut PgConnection,
    compared: &[(&str, String, String)],
) -> Result<Vec<TableDifference>, StoreError> {
    let mut differences = Vec::new();
    for (table, live, rebuilt) in compared {
        let only_live: i64 = sqlx::query_scalar(&format!(
            "SELECT COUNT(*) FROM (SELECT * FROM {live} EXCEPT ALL SELECT * FROM {rebuilt}) d"
        ))
        .fetch_one(&mut *conn)
        .await?;
        let only_rebuilt: i64 = sqlx::query_scalar(&format!(
            "SELECT COUNT(*) FROM (SELECT * FROM {rebuilt} EXCEPT ALL SELECT * FROM {live}) d"
        ))
        .fetch_one(&mut *conn)
        .await?;
        if only_live + only_rebuilt > 0 {
            differences.push(TableDifference {
                table: (*table).to_owned(),
                only_live: only_live as u64,
                only_rebuilt: only_rebuilt as u64,
            });
        }
    }
    Ok(differences)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_text_escapes_fields_and_array_elements() {
        let mut rows = CopyText::default();
        rows.field("a\tb\\c\nd");
        rows.array(&["x\"y".to_owned(), "p\\q".to_owned(), "plain".to_owned()]);
        rows.null();
        rows.end_row();
        assert_eq!(
            rows.text,
            "a\\tb\\\\c\\nd\t{\"x\\\\\"y\",\"p\\\\\\\\q\",\"plain\"}\t\\N\n"
        );
    }
}
