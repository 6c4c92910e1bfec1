//! Projection rebuild and verification on SQLite (see [`crate::rebuild`]).

use std::sync::Arc;

use super::events::{checkpoint_in_tx, read_raw_range_in_tx, set_checkpoint_in_tx, Cell};
use super::SqliteStore;
use crate::error::StoreError;
use crate::projector::{EventView, RowChange, SqliteProjector};
use crate::rebuild::{
    snapshot_table, wants, Decoded, Image, Progress, RebuildMode, RebuildReport, TableDifference,
    REBUILD_PAGE,
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
                step.write(tx)?;
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

/// How one projector takes part in a replay.
enum Step {
    /// A row projector: its changes folded into an image of its tables, written at the end
    /// (the buffer of an event's changes is reused from one event to the next).
    Image(Arc<dyn SqliteProjector>, Image, Vec<RowChange>),
    /// Applied event by event.
    Apply(Arc<dyn SqliteProjector>),
}

impl Step {
    fn of(projector: &Arc<dyn SqliteProjector>) -> Self {
        match projector.rows() {
            Some(_) => Self::Image(projector.clone(), Image::default(), Vec::new()),
            None => Self::Apply(projector.clone()),
        }
    }

    fn write(self, tx: &rusqlite::Transaction<'_>) -> Result<(), StoreError> {
        match self {
            Self::Image(projector, image, _) => {
                write_image(tx, image).map_err(|e| StoreError::in_projector(projector.name(), e))
            }
            Self::Apply(_) => Ok(()),
        }
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
        for row in &page {
            let event = row.replay();
            let mut decoded = Decoded::default();
            let mut recorded = None;
            for step in steps.iter_mut() {
                match step {
                    Step::Image(projector, image, changes) => {
                        let Some(rows) = projector.rows() else {
                            continue;
                        };
                        if !wants(rows.aggregate_types(), event.aggregate_type) {
                            continue;
                        }
                        rows.changes(&EventView::of_replay(&event), &mut decoded, changes)
                            .and_then(|()| image.apply(changes, event.position))
                            .map_err(|e| StoreError::in_projector(projector.name(), e))?;
                    }
                    Step::Apply(projector) => {
                        if !wants(projector.aggregate_types(), event.aggregate_type) {
                            continue;
                        }
                        if recorded.is_none() {
                            recorded = Some(row.recorded()?);
                        }
                        if let Some(recorded) = &recorded {
                            projector
                                .apply(tx, recorded)
                                .map_err(|e| StoreError::in_projector(projector.name(), e))?;
                        }
                    }
                }
            }
        }
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
