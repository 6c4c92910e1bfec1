//! Retention's statements on Postgres (the pass and its rules: `retention.rs`). Each batch runs
//! under a per-topic retention lock that a dead-letter replay also takes, so a message replayed
//! mid-pass raises the floor before the next batch looks. Publishers (topic row lock) and
//! claimers (delivery row locks) never take that lock, so neither waits on retention.

use std::time::Duration;

use sqlx::PgConnection;
use wharf_store::PgStore;

use crate::error::QueueError;
use crate::retention::{
    self, BatchDeleted, OrphanTable, RetentionBatch, RetentionLimits, RetentionRunner,
};

/// The lowest position the topic must keep for its live groups: what each has not routed (or,
/// after a swap, not rescanned) and what waits in its deliveries.
const LIVE_FLOOR: &str = "\
    SELECT \
      LEAST(t.head + 1, \
        (SELECT MIN(LEAST(g.routed_position + 1, \
            CASE WHEN g.rescan_position <= g.rescan_until THEN g.rescan_position END)) \
         FROM consumer_group g WHERE g.topic = t.name \
           AND EXISTS (SELECT 1 FROM worker_instance w WHERE w.group_name = g.group_name \
             AND w.heartbeat_at > clock_timestamp() - make_interval(secs => $2))), \
        (SELECT MIN(d.position) FROM delivery d WHERE d.topic = t.name \
           AND EXISTS (SELECT 1 FROM worker_instance w WHERE w.group_name = d.group_name \
             AND w.heartbeat_at > clock_timestamp() - make_interval(secs => $2)))) \
    FROM topic t WHERE t.name = $1";

/// Serializes retention batches with dead-letter replays of the same topic.
pub(crate) async fn lock_retention(conn: &mut PgConnection, topic: &str) -> Result<(), QueueError> {
    sqlx::query(
        "SELECT pg_advisory_xact_lock(hashtext(current_schema() || ':wharf.retain:' || $1))",
    )
    .bind(topic)
    .execute(conn)
    .await?;
    Ok(())
}

/// A retention pass on a Postgres store.
pub(super) struct PgRetention<'s>(pub &'s PgStore);

impl RetentionRunner for PgRetention<'_> {
    async fn topics(&self) -> Result<Vec<String>, QueueError> {
        Ok(sqlx::query_scalar("SELECT name FROM topic ORDER BY name")
            .fetch_all(self.0.pool())
            .await?)
    }

    async fn batch(
        &self,
        topic: &str,
        limits: RetentionLimits,
    ) -> Result<BatchDeleted, QueueError> {
        let mut tx = self.0.pool().begin().await?;
        lock_retention(&mut tx, topic).await?;
        let deleted = retention::batch(&mut PgBatch(&mut tx), topic, limits).await?;
        tx.commit().await?;
        Ok(deleted)
    }
}

/// One batch's statements on its transaction, under the topic's retention lock.
struct PgBatch<'c>(&'c mut PgConnection);

impl RetentionBatch for PgBatch<'_> {
    async fn live_floor(&mut self, topic: &str, instance_ttl: Duration) -> Result<i64, QueueError> {
        Ok(sqlx::query_scalar(LIVE_FLOOR)
            .bind(topic)
            .bind(instance_ttl.as_secs_f64())
            .fetch_one(&mut *self.0)
            .await?)
    }

    async fn delete_aged(
        &mut self,
        topic: &str,
        floor: i64,
        retention: Duration,
        batch: i64,
    ) -> Result<u64, QueueError> {
        Ok(sqlx::query(
            "DELETE FROM message WHERE topic = $1 AND position IN ( \
               SELECT position FROM message WHERE topic = $1 AND position < $2 \
                 AND published_at < clock_timestamp() - make_interval(secs => $3) \
               ORDER BY position LIMIT $4)",
        )
        .bind(topic)
        .bind(floor)
        .bind(retention.as_secs_f64())
        .bind(batch)
        .execute(&mut *self.0)
        .await?
        .rows_affected())
    }

    async fn drop_orphans(
        &mut self,
        table: OrphanTable,
        topic: &str,
        floor: i64,
    ) -> Result<u64, QueueError> {
        let table = table.name();
        Ok(sqlx::query(&format!(
            "DELETE FROM {table} o WHERE o.topic = $1 AND o.position < $2 \
             AND NOT EXISTS (SELECT 1 FROM message m \
               WHERE m.topic = o.topic AND m.position = o.position)"
        ))
        .bind(topic)
        .bind(floor)
        .execute(&mut *self.0)
        .await?
        .rows_affected())
    }
}
