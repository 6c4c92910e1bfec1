//! Retention on Postgres: delete, in bounded batches, log messages that every group is done
//! with, and messages older than the retention that no live group still needs.
//!
//! "Done" for a group means routed past and not waiting in its deliveries. A group is live when
//! it has an instance with a fresh heartbeat. Each batch recomputes the floors in its own
//! transaction, under a per-topic retention lock that a dead-letter replay also takes, so a
//! message replayed mid-pass raises the floor before the next batch looks. Publishers (topic row
//! lock) and claimers (delivery row locks) never take that lock, so neither waits on retention.

use std::time::Duration;

use sqlx::PgConnection;
use wharf_store::PgStore;

use crate::error::QueueError;
use crate::message::RetentionReport;

/// The lowest position the topic must keep: for every group, and for live groups only.
const FLOORS: &str = "\
    SELECT \
      LEAST(t.head + 1, \
        (SELECT MIN(g.routed_position) + 1 FROM consumer_group g WHERE g.topic = t.name), \
        (SELECT MIN(d.position) FROM delivery d WHERE d.topic = t.name)), \
      LEAST(t.head + 1, \
        (SELECT MIN(g.routed_position) + 1 FROM consumer_group g WHERE g.topic = t.name \
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
            let (messages, orphans) =
                retain_batch(store, &topic, retention, instance_ttl, batch).await?;
            report.messages += messages;
            report.orphaned_deliveries += orphans;
            if (messages as i64) < batch {
                break;
            }
        }
    }
    Ok(report)
}

/// One batch: fresh floors, up to `batch` deleted messages, and the deliveries of groups with
/// no live instance whose messages aged out (they can never be handed out again).
async fn retain_batch(
    store: &PgStore,
    topic: &str,
    retention: Duration,
    instance_ttl: Duration,
    batch: i64,
) -> Result<(u64, u64), QueueError> {
    let mut tx = store.pool().begin().await?;
    lock_retention(&mut tx, topic).await?;
    let (done_floor, live_floor): (i64, i64) = sqlx::query_as(FLOORS)
        .bind(topic)
        .bind(instance_ttl.as_secs_f64())
        .fetch_one(&mut *tx)
        .await?;
    let messages = sqlx::query(
        "DELETE FROM message WHERE topic = $1 AND position IN ( \
           SELECT position FROM message WHERE topic = $1 AND (position < $2 \
             OR (position < $3 AND published_at < clock_timestamp() - make_interval(secs => $4))) \
           ORDER BY position LIMIT $5)",
    )
    .bind(topic)
    .bind(done_floor)
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
    tx.commit().await?;
    Ok((messages, orphans))
}
