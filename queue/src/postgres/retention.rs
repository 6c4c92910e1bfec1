//! Retention on Postgres: delete, in bounded batches, log messages that every group is done
//! with, and messages older than the retention that no live group still needs.
//!
//! "Done" for a group means routed past and not waiting in its deliveries. A group is live when
//! it has an instance with a fresh heartbeat. Deletes touch only old rows: publishers append at
//! the head and claimers lock delivery rows, so neither waits on the pruner.

use std::time::Duration;

use wharf_store::PgStore;

use crate::error::QueueError;
use crate::message::RetentionReport;

/// The lowest position each topic must keep, for all groups and for live groups only.
const FLOORS: &str = "\
    SELECT t.name, t.head, \
      LEAST(t.head + 1, \
        (SELECT MIN(g.routed_position) + 1 FROM consumer_group g WHERE g.topic = t.name), \
        (SELECT MIN(d.position) FROM delivery d WHERE d.topic = t.name)) AS done_floor, \
      LEAST(t.head + 1, \
        (SELECT MIN(g.routed_position) + 1 FROM consumer_group g WHERE g.topic = t.name \
           AND EXISTS (SELECT 1 FROM worker_instance w WHERE w.group_name = g.group_name \
             AND w.heartbeat_at > clock_timestamp() - make_interval(secs => $1))), \
        (SELECT MIN(d.position) FROM delivery d WHERE d.topic = t.name \
           AND EXISTS (SELECT 1 FROM worker_instance w WHERE w.group_name = d.group_name \
             AND w.heartbeat_at > clock_timestamp() - make_interval(secs => $1)))) AS live_floor \
    FROM topic t ORDER BY t.name";

/// Runs one retention pass over every topic.
pub(crate) async fn retain(
    store: &PgStore,
    retention: Duration,
    instance_ttl: Duration,
    batch: i64,
) -> Result<RetentionReport, QueueError> {
    let floors: Vec<(String, i64, i64, i64)> = sqlx::query_as(FLOORS)
        .bind(instance_ttl.as_secs_f64())
        .fetch_all(store.pool())
        .await?;
    let mut report = RetentionReport::default();
    for (topic, _head, done_floor, live_floor) in floors {
        report.messages +=
            delete_batches(store, &topic, done_floor, live_floor, retention, batch).await?;
        report.orphaned_deliveries += drop_orphans(store, &topic, live_floor).await?;
    }
    Ok(report)
}

async fn delete_batches(
    store: &PgStore,
    topic: &str,
    done_floor: i64,
    live_floor: i64,
    retention: Duration,
    batch: i64,
) -> Result<u64, QueueError> {
    let mut deleted = 0;
    loop {
        let removed = sqlx::query(
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
        .execute(store.pool())
        .await?
        .rows_affected();
        deleted += removed;
        if (removed as i64) < batch {
            return Ok(deleted);
        }
    }
}

/// Deliveries of groups with no live instance whose messages aged out of the log: they can
/// never be handed out again. (Live groups' deliveries are below no deleted position.)
async fn drop_orphans(store: &PgStore, topic: &str, live_floor: i64) -> Result<u64, QueueError> {
    Ok(sqlx::query(
        "DELETE FROM delivery d WHERE d.topic = $1 AND d.position < $2 \
         AND NOT EXISTS (SELECT 1 FROM message m WHERE m.topic = d.topic AND m.position = d.position)",
    )
    .bind(topic)
    .bind(live_floor)
    .execute(store.pool())
    .await?
    .rows_affected())
}
