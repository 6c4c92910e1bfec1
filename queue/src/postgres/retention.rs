//! Retention on Postgres: delete, in bounded batches, messages older than the retention that
//! no live group still needs (ADR 0014: being routed past is not being consumed, since a swap
//! applies to everything the log still holds; so age is the only limit).
//!
//! A live group (an instance with a fresh heartbeat) needs what it has not routed or, after a
//! swap, not rescanned, and what waits in its deliveries. Each batch recomputes the floors in its own
//! transaction, under a per-topic retention lock that a dead-letter replay also takes, so a
//! message replayed mid-pass raises the floor before the next batch looks. Publishers (topic row
//! lock) and claimers (delivery row locks) never take that lock, so neither waits on retention.

use std::time::Duration;

use sqlx::PgConnection;
use wharf_store::PgStore;

use crate::error::QueueError;
use crate::message::RetentionReport;

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

/// Runs one retention pass over every topic.
pub(crate) async fn retain(
    store: &PgStore,
    retention: Duration,
    instance_ttl: Duration,
    batch: i64,
) -> Result<RetentionReport, QueueError> {
    let topics: Vec<String> = sqlx::query_scalar("SELECT name FROM topic ORDER BY name")
        .fetch_all(store.pool())
        .await?;
    let mut report = RetentionReport::default();
    for topic in topics {
        loop {
            let (messages, orphans, parked) =
                retain_batch(store, &topic, retention, instance_ttl, batch).await?;
            report.messages += messages;
            report.orphaned_deliveries += orphans;
            report.set_aside_dropped += parked;
            if (messages as i64) < batch {
                break;
            }
        }
    }
    Ok(report)
}

/// One batch: a fresh floor, up to `batch` deleted messages, and the deliveries (and set-aside
/// deliveries) whose messages aged out: they can never be handed out again.
async fn retain_batch(
    store: &PgStore,
    topic: &str,
    retention: Duration,
    instance_ttl: Duration,
    batch: i64,
) -> Result<(u64, u64, u64), QueueError> {
    let mut tx = store.pool().begin().await?;
    lock_retention(&mut tx, topic).await?;
    let live_floor: i64 = sqlx::query_scalar(LIVE_FLOOR)
        .bind(topic)
        .bind(instance_ttl.as_secs_f64())
        .fetch_one(&mut *tx)
        .await?;
    let messages = sqlx::query(
        "DELETE FROM message WHERE topic = $1 AND position IN ( \
           SELECT position FROM message WHERE topic = $1 AND position < $2 \
             AND published_at < clock_timestamp() - make_interval(secs => $3) \
           ORDER BY position LIMIT $4)",
    )
    .bind(topic)
    .bind(live_floor)
    .bind(retention.as_secs_f64())
    .bind(batch)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    let orphans = sqlx::query(
        "DELETE FROM delivery d WHERE d.topic = $1 AND d.position < $2 \
         AND NOT EXISTS (SELECT 1 FROM message m WHERE m.topic = d.topic AND m.position = d.position)",
    )
    .bind(topic)
    .bind(live_floor)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    let parked = sqlx::query(
        "DELETE FROM set_aside s WHERE s.topic = $1 AND s.position < $2 \
         AND NOT EXISTS (SELECT 1 FROM message m WHERE m.topic = s.topic AND m.position = s.position)",
    )
    .bind(topic)
    .bind(live_floor)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    tx.commit().await?;
    Ok((messages, orphans, parked))
}
