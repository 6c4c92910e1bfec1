//! Projection rebuild and verification on Postgres (see [`crate::rebuild`]).

use std::sync::Arc;

use sqlx::PgConnection;

use super::events::{
    custom_plans, lock_appends, lock_checkpoint, read_raw_range_in_tx, set_checkpoint,
};
use super::PgStore;
use crate::error::StoreError;
use crate::projector::{PgProjector, PgReplay};
use crate::rebuild::{
    snapshot_table, Decoded, Progress, RebuildMode, RebuildReport, TableDifference, REBUILD_PAGE,
};

impl PgStore {
    /// Rebuilds the inline projectors and the given catch-up projectors from the whole log,
    /// holding the append lock so no event lands mid-replay. Readers keep the old rows until
    /// commit (MVCC); Verify rolls back. Projectors with a set-based replay fold the log in
    /// memory and write their rows in bulk at the end; the others apply event by event.
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
        let tables: Vec<&str> = all
            .iter()
            .flat_map(|p| p.tables().iter().copied())
            .collect();
        if mode == RebuildMode::Verify {
            for table in &tables {
                sqlx::raw_sql(&format!(
                    "CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT * FROM {table}",
                    snapshot_table(table)
                ))
                .execute(&mut *tx)
                .await?;
            }
        }
        let total: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM events")
            .fetch_one(&mut *tx)
            .await?;
        for projector in &all {
            projector.reset(&mut tx).await?;
        }
        let mut steps: Vec<Step> = all.iter().map(Step::of).collect();
        let done = std::sync::atomic::AtomicU64::new(0);
        replay(&mut tx, &mut steps, 0, head, &|n| {
            let so_far = done.fetch_add(n, std::sync::atomic::Ordering::Relaxed) + n;
            progress(so_far, total as u64);
        })
        .await?;
        for step in steps {
            step.write(&mut tx).await?;
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
                compare(&mut tx, &tables).await?
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

/// How one projector takes part in a replay.
enum Step {
    /// Folded in memory, written at the end.
    Fold(&'static str, Box<dyn PgReplay>),
    /// Applied event by event.
    Apply(Arc<dyn PgProjector>),
}

impl Step {
    fn of(projector: &Arc<dyn PgProjector>) -> Self {
        match projector.replay() {
            Some(fold) => Self::Fold(projector.name(), fold),
            None => Self::Apply(projector.clone()),
        }
    }

    async fn write(self, conn: &mut PgConnection) -> Result<(), StoreError> {
        match self {
            Self::Fold(name, fold) => fold
                .write(conn)
                .await
                .map_err(|e| StoreError::in_projector(name, e)),
            Self::Apply(_) => Ok(()),
        }
    }
}

/// Replays the events with `after < position <= head` into `steps`, a bounded range of
/// positions per read.
async fn replay(
    conn: &mut PgConnection,
    steps: &mut [Step],
    after: i64,
    head: i64,
    on_page: &(dyn Fn(u64) + Sync),
) -> Result<(), StoreError> {
    let mut from = after;
    while from < head {
        let through = head.min(from.saturating_add(REBUILD_PAGE));
        let page = read_raw_range_in_tx(conn, from, through).await?;
        for row in &page {
            let event = row.replay();
            let mut decoded = Decoded::default();
            let mut recorded = None;
            for step in steps.iter_mut() {
                match step {
                    Step::Fold(name, fold) => fold
                        .fold(&event, &mut decoded)
                        .map_err(|e| StoreError::in_projector(name, e))?,
                    Step::Apply(projector) => {
                        if recorded.is_none() {
                            recorded = Some(row.recorded()?);
                        }
                        if let Some(recorded) = &recorded {
                            projector
                                .apply(conn, recorded)
                                .await
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

async fn compare(
    conn: &mut PgConnection,
    tables: &[&str],
) -> Result<Vec<TableDifference>, StoreError> {
    let mut differences = Vec::new();
    for table in tables {
        let snapshot = snapshot_table(table);
        let only_live: i64 = sqlx::query_scalar(&format!(
            "SELECT COUNT(*) FROM (SELECT * FROM {snapshot} EXCEPT ALL SELECT * FROM {table}) d"
        ))
        .fetch_one(&mut *conn)
        .await?;
        let only_rebuilt: i64 = sqlx::query_scalar(&format!(
            "SELECT COUNT(*) FROM (SELECT * FROM {table} EXCEPT ALL SELECT * FROM {snapshot}) d"
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
