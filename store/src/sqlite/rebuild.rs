//! Projection rebuild and verification on SQLite (see [`crate::rebuild`]).

use std::sync::Arc;

use super::events::{checkpoint_in_tx, read_raw_range_in_tx, set_checkpoint_in_tx, Cell};
use super::SqliteStore;
use crate::error::StoreError;
use crate::event::RecordedEvent;
use crate::projector::SqliteProjector;
use crate::ready::run_ready;
use crate::rebuild::{
    fold_page, snapshot_table, Image, Progress, RebuildMode, RebuildReport, ReplayApply,
    TableDifference, REBUILD_PAGE,
};

impl SqliteStore {
    /// Rebuilds the inline projectors and the given catch-up projectors from the whole log.
    /// Row projectors fold their changes into an image of their tables in memory, written in
    /// bulk at the end; the others apply event by event.
    pub async fn rebuild(
        &self,
        catch_up: Vec<Arc<dyn SqliteProjector>>,
        mode: RebuildMode,
        progress: Progress,
    ) -> Result<RebuildReport, StoreError> {
        self.write_or_rollback(move |ctx| {
            let tx = ctx.tx;
            let head: i64 =
                tx.query_row("SELECT COALESCE(MAX(position), 0) FROM events", [], |row| {
                    row.get(0)
                })?;
            if mode == RebuildMode::Verify {
                // Live catch-up projections may lag the log; bring them to its head first so
                // that Verify compares like with like. Nothing can append meanwhile: we hold
                // the writer.
                for projector in &catch_up {
                    let from = checkpoint_in_tx(tx, projector.name())?;
                    let mut steps = vec![Step::Apply(projector.clone())];
                    replay(tx, &mut steps, from, head, &|_| {})?;
                }
            }
            let all: Vec<Arc<dyn SqliteProjector>> = ctx
                .projectors
                .iter()
                .cloned()
                .chain(catch_up.iter().cloned())
                .collect();
            let tables: Vec<&str> = all
                .iter()
                .flat_map(|p| p.tables().iter().copied())
                .collect();
            if mode == RebuildMode::Verify {
                for table in &tables {
                    tx.execute_batch(&format!(
                        "CREATE TEMP TABLE {} AS SELECT * FROM main.{table}",
                        snapshot_table(table)
                    ))?;
                }
            }
            let total: i64 = tx.query_row("SELECT COUNT(*) FROM events", [], |row| row.get(0))?;
            for projector in &all {
                projector.reset(tx)?;
            }
            let mut steps: Vec<Step> = all.iter().map(Step::of).collect();
            let done = std::cell::Cell::new(0u64);
            replay(tx, &mut steps, 0, head, &|n| {
                done.set(done.get() + n);
                progress(done.get(), total as u64);
            })?;
            for step in steps {
                write_step(tx, step)?;
            }
            for projector in &catch_up {
                set_checkpoint_in_tx(tx, projector.name(), head)?;
            }
            let differences = match mode {
                RebuildMode::Apply => Vec::new(),
                RebuildMode::Verify => compare(tx, &tables)?,
            };
            let report = RebuildReport {
                events: total as u64,
                last_position: head,
                differences,
                applied: mode == RebuildMode::Apply,
            };
            Ok((report, mode == RebuildMode::Apply))
        })
        .await
    }
}

type Step = crate::rebuild::Step<dyn SqliteProjector>;

/// Writes a row projector's image (nothing for a projector applied event by event).
fn write_step(tx: &rusqlite::Transaction<'_>, step: Step) -> Result<(), StoreError> {
    match step.into_image() {
        Some((projector, image)) => {
            write_image(tx, image).map_err(|e| StoreError::in_projector(projector.name(), e))
        }
        None => Ok(()),
    }
}

/// Applies projectors event by event on the replay's write transaction.
struct SqliteApply<'a, 't>(&'a rusqlite::Transaction<'t>);

impl ReplayApply for SqliteApply<'_, '_> {
    type Projector = dyn SqliteProjector;

    async fn apply(
        &mut self,
        projector: &(dyn SqliteProjector + 'static),
        event: &RecordedEvent,
    ) -> Result<(), StoreError> {
        projector.apply(self.0, event)
    }
}

/// Writes an image's rows into its (reset) tables, one prepared insert per table.
fn write_image(tx: &rusqlite::Transaction<'_>, image: Image) -> Result<(), StoreError> {
    for table in image.into_tables() {
        let columns = table.columns();
        let placeholders: Vec<String> = (1..=columns.len()).map(|i| format!("?{i}")).collect();
        let mut insert = tx.prepare(&format!(
            "INSERT INTO {} ({}) VALUES ({})",
            table.name,
            columns.join(", "),
            placeholders.join(", ")
        ))?;
        table.write_rows(|row| {
            insert.execute(rusqlite::params_from_iter(
                row.iter().map(|value| Cell::new(value, 0, 0)),
            ))?;
            Ok(())
        })?;
    }
    Ok(())
}

/// Replays the events with `after < position <= head` into `steps`, a bounded range of
/// positions per read.
fn replay(
    tx: &rusqlite::Transaction<'_>,
    steps: &mut [Step],
    after: i64,
    head: i64,
    on_page: &dyn Fn(u64),
) -> Result<(), StoreError> {
    let mut from = after;
    while from < head {
        let through = head.min(from.saturating_add(REBUILD_PAGE));
        let page = read_raw_range_in_tx(tx, from, through)?;
        run_ready(fold_page(steps, &page, &mut SqliteApply(tx)))?;
        on_page(page.len() as u64);
        from = through;
    }
    Ok(())
}

fn compare(
    tx: &rusqlite::Transaction<'_>,
    tables: &[&str],
) -> Result<Vec<TableDifference>, StoreError> {
    let mut differences = Vec::new();
    for table in tables {
        let snapshot = snapshot_table(table);
        let count = |sql: String| -> Result<u64, StoreError> {
            Ok(tx.query_row(&sql, [], |row| row.get::<_, i64>(0))? as u64)
        };
        let only_live = count(format!(
            "SELECT COUNT(*) FROM (SELECT * FROM temp.{snapshot} EXCEPT SELECT * FROM main.{table})"
        ))?;
        let only_rebuilt = count(format!(
            "SELECT COUNT(*) FROM (SELECT * FROM main.{table} EXCEPT SELECT * FROM temp.{snapshot})"
        ))?;
        if only_live + only_rebuilt > 0 {
            differences.push(TableDifference {
                table: (*table).to_owned(),
                only_live,
                only_rebuilt,
            });
        }
    }
    Ok(differences)
}
