//! Projection rebuild and verification on Postgres (see [`crate::rebuild`]).

use std::sync::Arc;

use sqlx::PgConnection;

use super::events::{lock_appends, lock_checkpoint, read_after_in_tx, set_checkpoint};
use super::PgStore;
use crate::error::StoreError;
use crate::projector::PgProjector;
use crate::rebuild::{
    snapshot_table, Progress, RebuildMode, RebuildReport, TableDifference, REPLAY_PAGE,
};

impl PgStore {
    /// Rebuilds the inline projectors and the given catch-up projectors from the whole log,
    /// holding the append lock so no event lands mid-replay. Readers keep the old rows until
    /// commit (MVCC); Verify rolls back.
    pub async fn rebuild(
        &self,
        catch_up: Vec<Arc<dyn PgProjector>>,
        mode: RebuildMode,
        progress: Progress,
    ) -> Result<RebuildReport, StoreError> {
        let mut tx = self.pool.begin().await?;
        lock_appends(&mut tx).await?;
        for projector in &catch_up {
            let from = lock_checkpoint(&mut tx, projector.name()).await?;
            replay(&mut tx, std::slice::from_ref(projector), from, &|_| {}).await?;
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
        let done = std::sync::atomic::AtomicU64::new(0);
        let last_position = replay(&mut tx, &all, 0, &|n| {
            let so_far = done.fetch_add(n, std::sync::atomic::Ordering::Relaxed) + n;
            progress(so_far, total as u64);
        })
        .await?;
        for projector in &catch_up {
            set_checkpoint(&mut tx, projector.name(), last_position).await?;
        }
        let differences = match mode {
            RebuildMode::Apply => Vec::new(),
            RebuildMode::Verify => compare(&mut tx, &tables).await?,
        };
        match mode {
            RebuildMode::Apply => tx.commit().await?,
            RebuildMode::Verify => tx.rollback().await?,
        }
        Ok(RebuildReport {
            events: total as u64,
            last_position,
            differences,
            applied: mode == RebuildMode::Apply,
        })
    }
}

async fn replay(
    conn: &mut PgConnection,
    projectors: &[Arc<dyn PgProjector>],
    from: i64,
    on_page: &(dyn Fn(u64) + Sync),
) -> Result<i64, StoreError> {
    let mut position = from;
    loop {
        let page = read_after_in_tx(conn, position, REPLAY_PAGE).await?;
        for event in &page {
            for projector in projectors {
                projector
                    .apply(conn, event)
                    .await
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
