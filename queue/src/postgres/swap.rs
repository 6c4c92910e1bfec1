//! Applying a swap to a group's routing state on Postgres (the rule: `generations.rs`,
//! ADR 0014). Runs inside the first routing step after the swap, under the group row lock.

use std::sync::Arc;

use sqlx::PgConnection;
use wharf_domain::{BindingMatcher, GroupName};

use crate::error::QueueError;
use crate::generations::{rescan_start, restorable, split_pending, Generation, History};
use crate::matchers::Matchers;
use crate::message::{EffectiveInstall, SwapReport};

/// A group's routing state, read under its row lock.
pub(crate) struct Cursor {
    pub topic: String,
    /// The topic's committed head when the row was locked.
    pub head: i64,
    pub routed_position: i64,
    pub routed_install: i64,
    pub start_position: Option<i64>,
    pub rescan_position: i64,
    pub rescan_until: i64,
}

/// How a routing step takes the group row lock when another step or a swap holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnLocked {
    /// Skip: the step does nothing and reports the group busy.
    Skip,
    /// Wait for the holder to commit (bounded by the transaction's `lock_timeout`).
    Wait,
}

/// The group's routing state, its row locked `FOR UPDATE`: `$1` group.
macro_rules! lock_cursor_sql {
    () => {
        "SELECT g.topic, g.routed_position, g.routed_install, g.start_position, \
           g.rescan_position, g.rescan_until, \
           COALESCE((SELECT t.head FROM topic t WHERE t.name = g.topic), 0) \
         FROM consumer_group g WHERE g.group_name = $1 FOR UPDATE OF g"
    };
}

/// Locks the group row and reads its routing state; `None` when it does not exist, or when
/// someone else holds it and `on_locked` is [`OnLocked::Skip`].
pub(crate) async fn lock_cursor(
    conn: &mut PgConnection,
    group: &GroupName,
    on_locked: OnLocked,
) -> Result<Option<Cursor>, QueueError> {
    type Row = (String, i64, i64, Option<i64>, i64, i64, i64);
    let sql = match on_locked {
        OnLocked::Skip => concat!(lock_cursor_sql!(), " SKIP LOCKED"),
        OnLocked::Wait => lock_cursor_sql!(),
    };
    let row: Option<Row> = sqlx::query_as(sql)
        .bind(group.as_str())
        .fetch_optional(conn)
        .await?;
    Ok(row.map(|row| Cursor {
        topic: row.0,
        routed_position: row.1,
        routed_install: row.2,
        start_position: row.3,
        rescan_position: row.4,
        rescan_until: row.5,
        head: row.6,
    }))
}

/// Aligns the group's routing with `install`: closes the previous install's ranges, keeps or
/// sets aside its pending deliveries, restores set-aside ones the new set matches, and starts
/// the new install's rescan. Updates `cursor` to the new state.
pub(crate) async fn apply(
    conn: &mut PgConnection,
    group: &GroupName,
    cursor: &mut Cursor,
    install: &EffectiveInstall,
    matcher: &BindingMatcher,
) -> Result<SwapReport, QueueError> {
    let g = group.as_str();
    let start = cursor.start_position.unwrap_or(cursor.routed_position + 1);
    sqlx::query(
        "UPDATE route_generation SET through_position = $3, rescan_through = $4 \
         WHERE group_name = $1 AND install = $2 AND through_position IS NULL",
    )
    .bind(g)
    .bind(cursor.routed_install)
    .bind(cursor.routed_position)
    .bind((cursor.rescan_position - 1).min(cursor.rescan_until))
    .execute(&mut *conn)
    .await?;
    let pending: Vec<(i64, Option<String>)> = sqlx::query_as(
        "SELECT d.position, m.subject FROM delivery d \
         LEFT JOIN message m ON m.topic = d.topic AND m.position = d.position \
         WHERE d.group_name = $1 AND d.routed_by <> $2",
    )
    .bind(g)
    .bind(install.position)
    .fetch_all(&mut *conn)
    .await?;
    let (kept, aside) = split_pending(matcher, &pending);
    let kept = at_positions(conn, RESTAMP, g, &kept, install.position).await?;
    let set_aside = at_positions(conn, SET_ASIDE, g, &aside, install.position).await?;
    let parked: Vec<(i64, String)> = sqlx::query_as(
        "SELECT s.position, m.subject FROM set_aside s \
         JOIN message m ON m.topic = s.topic AND m.position = s.position \
         WHERE s.group_name = $1",
    )
    .bind(g)
    .fetch_all(&mut *conn)
    .await?;
    let restore = restorable(matcher, &parked);
    let restored = at_positions(conn, RESTORE, g, &restore, install.position).await?;
    let oldest: Option<i64> =
        sqlx::query_scalar("SELECT MIN(position) FROM message WHERE topic = $1")
            .bind(&cursor.topic)
            .fetch_one(&mut *conn)
            .await?;
    let report = SwapReport {
        install: install.position,
        kept,
        set_aside,
        restored,
        rescan_from: rescan_start(start, oldest, cursor.routed_position),
        rescan_until: cursor.routed_position,
    };
    sqlx::query(
        "INSERT INTO route_generation (group_name, install, patterns, from_position, \
           rescan_from, set_aside, restored, kept, applied_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, clock_timestamp()) ON CONFLICT DO NOTHING",
    )
    .bind(g)
    .bind(install.position)
    .bind(&install.patterns)
    .bind(cursor.routed_position + 1)
    .bind(report.rescan_from)
    .bind(set_aside as i64)
    .bind(restored as i64)
    .bind(kept as i64)
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "UPDATE consumer_group SET start_position = $2, routed_install = $3, \
           rescan_position = $4, rescan_until = $5, claim_floor = COALESCE( \
             (SELECT MIN(position) FROM delivery WHERE group_name = $1), $5 + 1) \
         WHERE group_name = $1",
    )
    .bind(g)
    .bind(start)
    .bind(install.position)
    .bind(report.rescan_from)
    .bind(report.rescan_until)
    .execute(&mut *conn)
    .await?;
    report.log(g);
    cursor.start_position = Some(start);
    cursor.routed_install = install.position;
    cursor.rescan_position = report.rescan_from;
    cursor.rescan_until = report.rescan_until;
    Ok(report)
}

/// Re-stamps kept deliveries with the new install.
const RESTAMP: &str =
    "UPDATE delivery SET routed_by = $3 WHERE group_name = $1 AND position = ANY($2)";

/// Moves deliveries the new install does not match to `set_aside`.
const SET_ASIDE: &str = "\
    WITH moved AS (DELETE FROM delivery WHERE group_name = $1 AND position = ANY($2) \
      RETURNING *) \
    INSERT INTO set_aside (group_name, topic, position, routed_by, routed_at, attempts, \
      visible_at, claimed_by, claim_token, last_error, set_aside_by, set_aside_at) \
    SELECT group_name, topic, position, routed_by, routed_at, attempts, visible_at, \
      claimed_by, claim_token, last_error, $3, clock_timestamp() FROM moved \
    ON CONFLICT DO NOTHING";

/// Moves set-aside deliveries the new install matches back, stamped with it.
const RESTORE: &str = "\
    WITH back AS (DELETE FROM set_aside WHERE group_name = $1 AND position = ANY($2) \
      RETURNING *) \
    INSERT INTO delivery (group_name, topic, position, routed_by, routed_at, attempts, \
      visible_at, claimed_by, claim_token, last_error) \
    SELECT group_name, topic, position, $3, routed_at, attempts, visible_at, claimed_by, \
      claim_token, last_error FROM back \
    ON CONFLICT DO NOTHING";

/// Runs one of the statements above for `positions` of `group`; returns the rows it wrote.
async fn at_positions(
    conn: &mut PgConnection,
    sql: &'static str,
    group: &str,
    positions: &[i64],
    install: i64,
) -> Result<u64, QueueError> {
    if positions.is_empty() {
        return Ok(0);
    }
    Ok(sqlx::query(sql)
        .bind(group)
        .bind(positions)
        .bind(install)
        .execute(conn)
        .await?
        .rows_affected())
}

/// The earlier installs whose ranges overlap `first..=last`, with their compiled sets.
pub(crate) async fn history(
    conn: &mut PgConnection,
    matchers: &Matchers,
    group: &GroupName,
    current: i64,
    first: i64,
    last: i64,
) -> Result<History, QueueError> {
    type Row = (i64, Vec<String>, i64, i64, i64, i64);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT install, patterns, from_position, through_position, rescan_from, \
           rescan_through FROM route_generation \
         WHERE group_name = $1 AND install <> $2 AND through_position IS NOT NULL \
           AND ((from_position <= $4 AND through_position >= $3) \
             OR (rescan_from <= $4 AND rescan_through >= $3))",
    )
    .bind(group.as_str())
    .bind(current)
    .bind(first)
    .bind(last)
    .fetch_all(conn)
    .await?;
    let mut generations = Vec::with_capacity(rows.len());
    for (install, patterns, from, through, rescan_from, rescan_through) in rows {
        let matcher: Arc<BindingMatcher> = matchers.get(group, install, patterns.into_iter())?;
        generations.push(Generation {
            forward: (from, through),
            rescan: (rescan_from, rescan_through),
            matcher,
        });
    }
    Ok(History(generations))
}
