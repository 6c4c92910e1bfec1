//! Projection rebuild and verification on SQLite (see [`crate::rebuild`]).

use std::sync::Arc;

use super::events::{checkpoint_in_tx, read_after_in_tx, set_checkpoint_in_tx};
use super::SqliteStore;
use crate::error::StoreError;
use crate::projector::SqliteProjector;
use crate::rebuild::{
    snapshot_table, Progress, RebuildMode, RebuildReport, TableDifference, REPLAY_PAGE,
};

impl SqliteStore {
    /// Rebuilds the inline projectors and the given catch-up projectors from the whole log.
    pub async fn rebuild(
        &self,
        catch_up: Vec<Arc<dyn SqliteProjector>>,
        mode: RebuildMode,
        progress: Progress,
    ) -> Result<RebuildReport, StoreError> {
        self.write_or_rollback(move |ctx| {
            let tx = ctx.tx;
            // Live catch-up projections may lag the log; bring them to its head first so that
            // Verify compares like with like. Nothing can append meanwhile: we hold the writer.
            for projector in &catch_up {
                let from = checkpoint_in_tx(tx, projector.name())?;
                replay(tx, std::slice::from_ref(projector), from, &|_| {})?;
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
            let done = std::cell::Cell::new(0u64);
            let last_position = replay(tx, &all, 0, &|n| {
                done.set(done.get() + n);
                progress(done.get(), total as u64);
            })?;
            for projector in &catch_up {
                set_checkpoint_in_tx(tx, projector.name(), last_position)?;
            }
            let differences = match mode {
                RebuildMode::Apply => Vec::new(),
                RebuildMode::Verify => compare(tx, &tables)?,
            };
            let report = RebuildReport {
                events: total as u64,
                last_position,
                differences,
                applied: mode == RebuildMode::Apply,
            };
            Ok((report, mode == RebuildMode::Apply))
        })
        .await
    }
}

/// Applies every event after `from` to `projectors`; returns the last position seen.
fn replay(
    tx: &rusqlite::Transaction<'_>,
    projectors: &[Arc<dyn SqliteProjector>],
    from: i64,
    on_page: &dyn Fn(u64),
) -> Result<i64, StoreError> {
    let mut position = from;
    loop {
        let page = read_after_in_tx(tx, position, REPLAY_PAGE)?;
        for event in &page {
            for projector in projectors {
                projector
                    .apply(tx, event)
                    .map_err(|e| StoreError::in_projector(projector.name(), e))?;
            }
        }
        let Some(last) = page.last() else {
            return Ok(position);
        };
        position = last.position;
        on_page(page.len() as u64);
        if (page.len() as i64) < REPLAY_PAGE {
            return Ok(position);
        }
    }
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
