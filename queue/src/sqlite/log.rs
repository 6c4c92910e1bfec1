//! Publishing and listing figures on SQLite.

use rusqlite::params;
use wharf_domain::TopicName;
use wharf_store::event::from_micros;
use wharf_store::SqliteStore;

use crate::error::QueueError;
use crate::message::{GroupQueueStats, OutgoingMessage, SwapRecord, TopicStats};

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

/// The queue figures of the groups a `WHERE` clause picks (`?1`; `?2` is the time), by name.
pub(crate) fn group_stats_sql(filter: &str) -> String {
    format!(
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
              WHERE d.group_name = g.group_name ORDER BY d.position LIMIT 1), \
           (SELECT COUNT(*) FROM set_aside s WHERE s.group_name = g.group_name), \
           MAX(g.rescan_until - g.rescan_position + 1, 0) \
         FROM consumer_group g WHERE {filter} ORDER BY g.group_name"
    )
}

fn stats_row(row: &rusqlite::Row<'_>, now: i64) -> rusqlite::Result<GroupQueueStats> {
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
        set_aside: row.get(9)?,
        rescan_remaining: row.get(10)?,
    })
}

/// Queue figures of every group.
pub(crate) async fn all_group_stats(
    store: &SqliteStore,
) -> Result<Vec<GroupQueueStats>, QueueError> {
    let now = store.now().await?.timestamp_micros();
    Ok(store
        .read(move |conn| {
            let mut stmt = conn.prepare_cached(&group_stats_sql("?1 IS NULL"))?;
            let rows = stmt
                .query_map(params![None::<String>, now], |row| stats_row(row, now))?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await?)
}

/// Queue figures of the groups named, by name, in one statement (a listing page's: ADR 0046;
/// each group's rows by key; a group without a queue row is left out). The names go in as one
/// JSON array.
pub(crate) async fn group_stats_of(
    store: &SqliteStore,
    groups: Vec<String>,
) -> Result<Vec<GroupQueueStats>, QueueError> {
    let now = store.now().await?.timestamp_micros();
    let names = serde_json::to_string(&groups)?;
    Ok(store
        .read(move |conn| {
            let mut stmt = conn.prepare_cached(&group_stats_sql(GROUPS_NAMED))?;
            let rows = stmt
                .query_map(params![names, now], |row| stats_row(row, now))?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await?)
}

/// The filter of [`group_stats_of`]: the groups the JSON array `?1` names.
pub(crate) const GROUPS_NAMED: &str = "g.group_name IN (SELECT value FROM json_each(?1))";

/// The installs the group's routing applied, newest first.
pub(crate) async fn swaps(
    store: &SqliteStore,
    group: &wharf_domain::GroupName,
    limit: i64,
) -> Result<Vec<SwapRecord>, QueueError> {
    let group = group.to_string();
    let rows = store
        .read(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT install, patterns, applied_at, kept, set_aside, restored, rescan_from, \
                   from_position - 1 FROM route_generation WHERE group_name = ?1 \
                 ORDER BY install DESC LIMIT ?2",
            )?;
            let rows = stmt
                .query_map(params![group, limit], |row| {
                    Ok((
                        row.get::<_, i64>(0)?,
                        row.get::<_, String>(1)?,
                        row.get::<_, i64>(2)?,
                        [
                            row.get(3)?,
                            row.get(4)?,
                            row.get(5)?,
                            row.get(6)?,
                            row.get(7)?,
                        ],
                    ))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await?;
    rows.into_iter()
        .map(
            |(install, patterns, applied_at, [kept, set_aside, restored, from, until])| {
                Ok(SwapRecord {
                    install,
                    patterns: serde_json::from_str(&patterns)?,
                    applied_at: from_micros(applied_at),
                    kept,
                    set_aside,
                    restored,
                    rescan_from: from,
                    rescan_until: until,
                })
            },
        )
        .collect()
}
