//! Retention's statements on SQLite (the pass and its rules: `retention.rs`). Each batch is a
//! write transaction on the single writer, so nothing (a dead-letter replay included) runs
//! between its floor and its deletes; times are the store clock's microseconds.

use std::time::Duration;

use rusqlite::{params, Transaction};
use wharf_store::{run_ready, SqliteStore};

use super::claim::micros;
use crate::error::QueueError;
use crate::retention::{
    self, BatchDeleted, OrphanTable, RetentionBatch, RetentionLimits, RetentionRunner,
};

/// The lowest position a topic must keep for its live groups: what each has not routed (or,
/// after a swap, not rescanned) and what waits in its deliveries.
const LIVE_FLOOR: &str = "SELECT \
       MIN(t.head + 1, \
         COALESCE((SELECT MIN(MIN(g.routed_position + 1, \
             CASE WHEN g.rescan_position <= g.rescan_until THEN g.rescan_position \
                  ELSE g.routed_position + 1 END)) \
           FROM consumer_group g WHERE g.topic = t.name \
           AND EXISTS (SELECT 1 FROM worker_instance w WHERE w.group_name = g.group_name AND w.heartbeat_at > ?2)), t.head + 1), \
         COALESCE((SELECT MIN(d.position) FROM delivery d WHERE d.topic = t.name \
           AND EXISTS (SELECT 1 FROM worker_instance w WHERE w.group_name = d.group_name AND w.heartbeat_at > ?2)), t.head + 1)) \
     FROM topic t WHERE t.name = ?1";

/// A retention pass on a SQLite store.
pub(super) struct SqliteRetention<'s>(pub &'s SqliteStore);

impl RetentionRunner for SqliteRetention<'_> {
    async fn topics(&self) -> Result<Vec<String>, QueueError> {
        Ok(self
            .0
            .read(|conn| {
                let mut stmt = conn.prepare_cached("SELECT name FROM topic ORDER BY name")?;
                let names = stmt
                    .query_map([], |row| row.get(0))?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(names)
            })
            .await?)
    }

    async fn batch(
        &self,
        topic: &str,
        limits: RetentionLimits,
    ) -> Result<BatchDeleted, QueueError> {
        let topic = topic.to_owned();
        self.0
            .write_or_rollback(move |ctx| {
                let mut db = SqliteBatch {
                    tx: ctx.tx,
                    now: ctx.now.timestamp_micros(),
                };
                let deleted = run_ready(retention::batch(&mut db, &topic, limits));
                let commit = deleted.is_ok();
                Ok((deleted, commit))
            })
            .await?
    }
}

/// One batch's statements on its write transaction, at the store's time `now`.
struct SqliteBatch<'a, 't> {
    tx: &'a Transaction<'t>,
    now: i64,
}

impl RetentionBatch for SqliteBatch<'_, '_> {
    async fn live_floor(&mut self, topic: &str, instance_ttl: Duration) -> Result<i64, QueueError> {
        let fresh_after = self.now - micros(instance_ttl);
        Ok(self
            .tx
            .query_row(LIVE_FLOOR, params![topic, fresh_after], |row| row.get(0))?)
    }

    async fn delete_aged(
        &mut self,
        topic: &str,
        floor: i64,
        retention: Duration,
        batch: i64,
    ) -> Result<u64, QueueError> {
        let published_before = self.now - micros(retention);
        let deleted = self.tx.execute(
            "DELETE FROM message WHERE topic = ?1 AND position IN ( \
               SELECT position FROM message WHERE topic = ?1 AND position < ?2 \
                 AND published_at < ?3 ORDER BY position LIMIT ?4)",
            params![topic, floor, published_before, batch],
        )?;
        Ok(deleted as u64)
    }

    async fn drop_orphans(
        &mut self,
        table: OrphanTable,
        topic: &str,
        floor: i64,
    ) -> Result<u64, QueueError> {
        let table = table.name();
        let dropped = self
            .tx
            .prepare_cached(&format!(
                "DELETE FROM {table} WHERE topic = ?1 AND position < ?2 AND NOT EXISTS \
             (SELECT 1 FROM message m WHERE m.topic = {table}.topic \
               AND m.position = {table}.position)"
            ))?
            .execute(params![topic, floor])?;
        Ok(dropped as u64)
    }
}
