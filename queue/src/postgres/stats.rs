//! Listing figures for topics and groups on Postgres.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::Row;
use wharf_store::{GroupFiguresRow, PgStore};

use crate::error::QueueError;
use crate::message::{GroupQueueStats, SwapRecord, TopicStats};

/// Every topic's head and retained size.
pub(crate) async fn topic_stats(store: &PgStore) -> Result<Vec<TopicStats>, QueueError> {
    let rows: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT t.name, t.head, (SELECT COUNT(*) FROM message m WHERE m.topic = t.name) \
         FROM topic t ORDER BY t.name",
    )
    .fetch_all(store.pool())
    .await?;
    Ok(rows
        .into_iter()
        .map(|(topic, head, size)| TopicStats { topic, head, size })
        .collect())
}

/// Every group's routing lag, claimable, in-flight, backing-off and dead-letter counts, and the
/// age of its oldest unacked message.
pub(crate) async fn all_group_stats(store: &PgStore) -> Result<Vec<GroupQueueStats>, QueueError> {
    stats_rows(store, ALL_GROUP_FIGURES_SQL).await
}

/// The figures' statement with `$filter` (a `WHERE` clause and a space, or nothing) before its
/// order: one text for a page's groups and for every group, its columns those the listing's
/// page inlines too (`wharf_store::pg_figures_columns!`).
macro_rules! figures_sql {
    ($filter:literal) => {
        concat!(
            "WITH clock AS (SELECT clock_timestamp() AS now) SELECT g.group_name, ",
            wharf_store::pg_figures_columns!("clock.now"),
            " FROM clock CROSS JOIN consumer_group g CROSS JOIN LATERAL ( ",
            wharf_store::pg_figures_deliveries!("clock.now"),
            ") d ",
            $filter,
            "ORDER BY g.group_name"
        )
    };
}

/// The figures of the groups `$1` names (a listing page's, or one group's), by name: what
/// `wharf_group_figures` (Postgres migration 0015, ADR 0046) runs, planned once per connection
/// with every path but an index's off and JIT compilation off (migration 0022, ADR 0058).
/// Each group's queue rows are read by key: its deliveries once, for the three counts and the
/// first position among them, whose message, read by the whole `message` key, is the oldest
/// unacked one; its dead letters and set-aside rows counted.
pub const GROUP_FIGURES_SQL: &str = figures_sql!("WHERE g.group_name = ANY($1::text[]) ");

/// The same figures of every group (`/metrics`, the CLI), planned on every call.
const ALL_GROUP_FIGURES_SQL: &str = figures_sql!("");

/// The figures of the groups named, by name (a group without a queue row is left out): one
/// call of a statement each connection prepares once.
pub(crate) async fn group_stats_of(
    store: &PgStore,
    groups: &[String],
) -> Result<Vec<GroupQueueStats>, QueueError> {
    let rows = sqlx::query("SELECT * FROM wharf_group_figures($1)")
        .bind(groups)
        .fetch_all(store.pool())
        .await?;
    stats_from(&rows)
}

async fn stats_rows(store: &PgStore, sql: &str) -> Result<Vec<GroupQueueStats>, QueueError> {
    // Planned on every call: a plan cached while `delivery` was empty would count by a
    // sequential scan of it forever.
    let rows = sqlx::query(sql)
        .persistent(false)
        .fetch_all(store.pool())
        .await?;
    stats_from(&rows)
}

/// Each row's group (column 0) and its figures (the columns after it).
fn stats_from(rows: &[PgRow]) -> Result<Vec<GroupQueueStats>, QueueError> {
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let group: String = row.try_get(0)?;
        if let Some(figures) = GroupFiguresRow::from_pg(row, 1)? {
            out.push(GroupQueueStats::from_figures(group, figures));
        }
    }
    Ok(out)
}

type SwapRow = (i64, Vec<String>, DateTime<Utc>, i64, i64, i64, i64, i64);

/// The installs the group's routing applied, newest first.
pub(crate) async fn swaps(
    store: &PgStore,
    group: &wharf_domain::GroupName,
    limit: i64,
) -> Result<Vec<SwapRecord>, QueueError> {
    let rows: Vec<SwapRow> = sqlx::query_as(
        "SELECT install, patterns, applied_at, kept, set_aside, restored, rescan_from, \
           from_position - 1 FROM route_generation WHERE group_name = $1 \
         ORDER BY install DESC LIMIT $2",
    )
    .bind(group.as_str())
    .bind(limit)
    .fetch_all(store.pool())
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| SwapRecord {
            install: r.0,
            patterns: r.1,
            applied_at: r.2,
            kept: r.3,
            set_aside: r.4,
            restored: r.5,
            rescan_from: r.6,
            rescan_until: r.7,
        })
        .collect())
}
