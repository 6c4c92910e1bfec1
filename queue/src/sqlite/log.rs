//! Publishing, routing, retention and listing figures on SQLite.

use std::sync::Arc;
use std::time::Duration;

use rusqlite::{params, OptionalExtension};
use wharf_domain::{GroupName, TopicName};
use wharf_store::event::from_micros;
use wharf_store::SqliteStore;

use crate::error::QueueError;
use crate::matchers::Matchers;
use crate::message::{
    EffectiveInstall, GroupQueueStats, OutgoingMessage, RetentionReport, RouteReport, TopicStats,
};

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// Appends `messages` to `topic` in one transaction; returns their positions.
pub(crate) async fn publish(
    store: &SqliteStore,
    topic: &TopicName,
    messages: Vec<OutgoingMessage>,
) -> Result<Vec<i64>, QueueError> {
    let topic = topic.to_string();
    Ok(store
        .write(move |ctx| {
            let now = ctx.now.timestamp_micros();
            ctx.tx
                .prepare_cached(
                    "INSERT OR IGNORE INTO topic (name, head, created_at) VALUES (?1, 0, ?2)",
                )?
                .execute(params![topic, now])?;
            let head: i64 = ctx
                .tx
                .prepare_cached("UPDATE topic SET head = head + ?2 WHERE name = ?1 RETURNING head")?
                .query_row(params![topic, messages.len() as i64], |row| row.get(0))?;
            let first = head - messages.len() as i64 + 1;
            let mut insert = ctx.tx.prepare_cached(
                "INSERT INTO message (topic, position, subject, payload, headers, published_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?;
            for (offset, message) in messages.iter().enumerate() {
                insert.execute(params![
                    topic,
                    first + offset as i64,
                    message.subject.as_str(),
                    message.payload,
                    serde_json::to_string(&message.headers)?,
                    now,
                ])?;
            }
            Ok((first..=head).collect())
        })
        .await?)
}

/// Routes up to `batch` log positions for `group` (see the Postgres twin for the rules).
pub(crate) async fn route(
    store: &SqliteStore,
    matchers: Arc<Matchers>,
    group: &GroupName,
    batch: i64,
) -> Result<RouteReport, QueueError> {
    if let Some(position) = caught_up(store, group).await? {
        return Ok(RouteReport {
            position,
            ..RouteReport::default()
        });
    }
    let group = group.clone();
    store
        .write(move |ctx| {
            let tx = ctx.tx;
            let cursor: Option<(String, i64)> = tx
                .query_row(
                    "SELECT topic, routed_position FROM consumer_group WHERE group_name = ?1",
                    [group.as_str()],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )
                .optional()?;
            let Some((topic, routed)) = cursor else {
                return Ok(Err(QueueError::UnknownGroup(group.to_string())));
            };
            let mut stmt = tx.prepare_cached(
                "SELECT e.position, b.pattern FROM effective_declaration e \
                 LEFT JOIN binding b ON b.group_name = e.group_name WHERE e.group_name = ?1",
            )?;
            let set = stmt
                .query_map([group.as_str()], |row| {
                    Ok((row.get::<_, i64>(0)?, row.get::<_, Option<String>>(1)?))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            let Some(&(generation, _)) = set.first() else {
                return Ok(Err(QueueError::UnknownGroup(group.to_string())));
            };
            let matcher = match matchers.get(&group, generation, set.into_iter().filter_map(|(_, p)| p)) {
                Ok(matcher) => matcher,
                Err(e) => return Ok(Err(e)),
            };
            let mut slice_stmt = tx.prepare_cached(
                "SELECT position, subject FROM message WHERE topic = ?1 AND position > ?2 \
                 ORDER BY position LIMIT ?3",
            )?;
            let slice = slice_stmt
                .query_map(params![topic, routed, batch], |row| {
                    Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            let Some(&(last, _)) = slice.last() else {
                return Ok(Ok(RouteReport {
                    position: routed,
                    ..RouteReport::default()
                }));
            };
            let now = ctx.now.timestamp_micros();
            let mut insert = tx.prepare_cached(
                "INSERT OR IGNORE INTO delivery (group_name, topic, position, routed_by, routed_at, visible_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?5)",
            )?;
            let mut routed_count = 0u64;
            for (position, subject) in &slice {
                if matcher.matches_str(subject) {
                    insert.execute(params![group.as_str(), topic, position, generation, now])?;
                    routed_count += 1;
                }
            }
            tx.prepare_cached(
                "UPDATE consumer_group SET routed_position = ?2 WHERE group_name = ?1",
            )?
            .execute(params![group.as_str(), last])?;
            Ok(Ok(RouteReport {
                scanned: slice.len() as u64,
                routed: routed_count,
                position: last,
                busy: false,
            }))
        })
        .await?
}

/// The group's cursor when it has routed up to its topic's head: a reader-side look that spares
/// an idle consumer's poll the single writer. An unknown group is not "caught up", so the write
/// path reports it.
async fn caught_up(store: &SqliteStore, group: &GroupName) -> Result<Option<i64>, QueueError> {
    let group = group.clone();
    Ok(store
        .read(move |conn| {
            let row: Option<(i64, i64)> = conn
                .query_row(
                    "SELECT g.routed_position, COALESCE(t.head, 0) FROM consumer_group g \
                     LEFT JOIN topic t ON t.name = g.topic WHERE g.group_name = ?1",
                    [group.as_str()],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )
                .optional()?;
            Ok(row.and_then(|(routed, head)| (routed >= head).then_some(routed)))
        })
        .await?)
}

/// The lowest position a topic must keep, for every group and for live groups only.
const FLOORS: &str = "SELECT \
       MIN(t.head + 1, \
         COALESCE((SELECT MIN(g.routed_position) + 1 FROM consumer_group g WHERE g.topic = t.name), t.head + 1), \
         COALESCE((SELECT MIN(d.position) FROM delivery d WHERE d.topic = t.name), t.head + 1)), \
       MIN(t.head + 1, \
         COALESCE((SELECT MIN(g.routed_position) + 1 FROM consumer_group g WHERE g.topic = t.name \
           AND EXISTS (SELECT 1 FROM worker_instance w WHERE w.group_name = g.group_name AND w.heartbeat_at > ?2)), t.head + 1), \
         COALESCE((SELECT MIN(d.position) FROM delivery d WHERE d.topic = t.name \
           AND EXISTS (SELECT 1 FROM worker_instance w WHERE w.group_name = d.group_name AND w.heartbeat_at > ?2)), t.head + 1)) \
     FROM topic t WHERE t.name = ?1";

/// One retention pass over every topic (see the Postgres twin for the rules). Each batch
/// computes its floors inside its own write transaction, so a replay between batches counts.
pub(crate) async fn retain(
    store: &SqliteStore,
    retention: Duration,
    instance_ttl: Duration,
    batch: i64,
) -> Result<RetentionReport, QueueError> {
    let topics: Vec<String> = store
        .read(|conn| {
            let mut stmt = conn.prepare_cached("SELECT name FROM topic ORDER BY name")?;
            let names = stmt
                .query_map([], |row| row.get(0))?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(names)
        })
        .await?;
    let mut report = RetentionReport::default();
    for topic in topics {
        loop {
            let topic = topic.clone();
            let (messages, orphans) = store
                .write(move |ctx| {
                    let now = ctx.now.timestamp_micros();
                    let (done_floor, live_floor): (i64, i64) = ctx.tx.query_row(
                        FLOORS,
                        params![topic, now - micros(instance_ttl)],
                        |row| Ok((row.get(0)?, row.get(1)?)),
                    )?;
                    let messages = ctx.tx.execute(
                        "DELETE FROM message WHERE topic = ?1 AND position IN ( \
                           SELECT position FROM message WHERE topic = ?1 AND (position < ?2 \
                             OR (position < ?3 AND published_at < ?4)) ORDER BY position LIMIT ?5)",
                        params![topic, done_floor, live_floor, now - micros(retention), batch],
                    )?;
                    let orphans = ctx.tx.execute(
                        "DELETE FROM delivery WHERE topic = ?1 AND position < ?2 AND NOT EXISTS \
                         (SELECT 1 FROM message m WHERE m.topic = delivery.topic AND m.position = delivery.position)",
                        params![topic, live_floor],
                    )?;
                    Ok((messages as u64, orphans as u64))
                })
                .await?;
            report.messages += messages;
            report.orphaned_deliveries += orphans;
            if (messages as i64) < batch {
                break;
            }
        }
    }
    Ok(report)
}

/// Every topic's head and retained size.
pub(crate) async fn topic_stats(store: &SqliteStore) -> Result<Vec<TopicStats>, QueueError> {
    Ok(store
        .read(|conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT t.name, t.head, (SELECT COUNT(*) FROM message m WHERE m.topic = t.name) \
                 FROM topic t ORDER BY t.name",
            )?;
            let rows = stmt
                .query_map([], |row| {
                    Ok(TopicStats {
                        topic: row.get(0)?,
                        head: row.get(1)?,
                        size: row.get(2)?,
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await?)
}

/// Queue figures of every group, or of one.
pub(crate) async fn group_stats(
    store: &SqliteStore,
    group: Option<String>,
) -> Result<Vec<GroupQueueStats>, QueueError> {
    let now = store.now().await?.timestamp_micros();
    Ok(store
        .read(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT g.group_name, g.topic, g.routed_position, \
                   COALESCE((SELECT head FROM topic t WHERE t.name = g.topic), 0), \
                   (SELECT COUNT(*) FROM delivery d WHERE d.group_name = g.group_name AND d.visible_at <= ?2), \
                   (SELECT COUNT(*) FROM delivery d WHERE d.group_name = g.group_name \
                      AND d.visible_at > ?2 AND d.claim_token IS NOT NULL), \
                   (SELECT COUNT(*) FROM delivery d WHERE d.group_name = g.group_name \
                      AND d.visible_at > ?2 AND d.claim_token IS NULL), \
                   (SELECT COUNT(*) FROM dead_letter x WHERE x.group_name = g.group_name), \
                   (SELECT m.published_at FROM delivery d JOIN message m \
                      ON m.topic = d.topic AND m.position = d.position \
                      WHERE d.group_name = g.group_name ORDER BY d.position LIMIT 1) \
                 FROM consumer_group g WHERE ?1 IS NULL OR g.group_name = ?1 ORDER BY g.group_name",
            )?;
            let rows = stmt
                .query_map(params![group, now], |row| {
                    let routed: i64 = row.get(2)?;
                    let head: i64 = row.get(3)?;
                    let oldest: Option<i64> = row.get(8)?;
                    Ok(GroupQueueStats {
                        group: row.get(0)?,
                        topic: row.get(1)?,
                        routed_position: routed,
                        routed_lag: (head - routed).max(0),
                        claimable: row.get(4)?,
                        in_flight: row.get(5)?,
                        backing_off: row.get(6)?,
                        dead_letters: row.get(7)?,
                        oldest_unacked_seconds: oldest
                            .map(|at| (now - from_micros(at).timestamp_micros()) as f64 / 1e6),
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await?)
}

/// The install in effect for `group`.
pub(crate) async fn effective_install(
    store: &SqliteStore,
    group: &GroupName,
) -> Result<Option<EffectiveInstall>, QueueError> {
    let group = group.clone();
    let row: Option<(i64, String)> = store
        .read(move |conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT position, patterns FROM effective_declaration WHERE group_name = ?1",
                )?
                .query_row([group.as_str()], |row| Ok((row.get(0)?, row.get(1)?)))
                .optional()?)
        })
        .await?;
    row.map(|(position, patterns)| {
        Ok(EffectiveInstall {
            position,
            patterns: serde_json::from_str(&patterns)?,
        })
    })
    .transpose()
}
