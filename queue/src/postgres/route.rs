//! Routing: match the next slice of the log against the group's effective binding set and
//! record deliveries for the matches.
//!
//! The group row is locked `FOR UPDATE SKIP LOCKED`: one router per group at a time (others
//! skip and go claim), and the declaration swap takes the same lock, so a batch is matched
//! against exactly the set in effect when it was routed, never a mixture. The first step after
//! a swap applies it first (`swap.rs`, ADR 0014).

use wharf_domain::GroupName;
use wharf_store::{PgStore, StoreError};

use super::swap::{self, OnLocked};
use crate::error::QueueError;
use crate::generations::{forward_matches, rescan_matches, StepRanges};
use crate::matchers::Matchers;
use crate::message::{EffectiveInstall, RouteReport};

/// How long a waiting step ([`OnLocked::Wait`]) waits for the group row before it reports the
/// group busy. Holders are routing steps (one batch) and swaps: milliseconds.
const WAIT_FOR_ROUTER: &str = "2s";

/// A routing step's unlocked first look (`$1` the group): how far it has routed, the topic's
/// head, the install its routing is aligned with, whether its rescan is done, and the install
/// in effect. That install is read by group and topic, which both of `effective_declaration`'s
/// indexes hold whole (ADR 0066): by the name alone, statistics that count the table's pages
/// but not its rows let the planner walk the whole `(topic, group_name)` index instead.
pub(crate) const SETTLED_LOOK: &str = "SELECT g.routed_position, COALESCE(t.head, 0), \
       g.routed_install, g.rescan_position > g.rescan_until, \
       (SELECT e.position FROM effective_declaration e \
        WHERE e.group_name = $1 AND e.topic = g.topic) \
     FROM consumer_group g LEFT JOIN topic t ON t.name = g.topic \
     WHERE g.group_name = $1";

/// The install in effect for group `$1` on topic `$2`: its position and patterns, read by
/// group and topic (ADR 0066). A routing step passes the topic of the group row it holds.
pub(crate) const INSTALL_ON_TOPIC: &str = "SELECT position, patterns \
     FROM effective_declaration WHERE group_name = $1 AND topic = $2";

/// The install in effect for group `$1`, for a caller that does not hold the group's row:
/// [`INSTALL_ON_TOPIC`] with the topic read from it.
pub(crate) const INSTALL_IN_EFFECT: &str = "SELECT e.position, e.patterns \
     FROM effective_declaration e WHERE e.group_name = $1 \
     AND e.topic = (SELECT g.topic FROM consumer_group g WHERE g.group_name = $1)";

/// Routes up to `batch` log positions for `group`; `on_locked` says whether a step that finds
/// another one (or a swap) holding the group skips or waits for it to commit.
pub(crate) async fn route(
    store: &PgStore,
    matchers: &Matchers,
    group: &GroupName,
    batch: i64,
    fence: Option<i64>,
    on_locked: OnLocked,
) -> Result<RouteReport, QueueError> {
    // An unlocked look first: a caught-up group whose routing is aligned with its install (the
    // idle case) costs one read, not a locked transaction. A missing group falls through to the
    // locked path, which reports it.
    let position: Option<(i64, i64, i64, bool, Option<i64>)> = sqlx::query_as(SETTLED_LOOK)
        .bind(group.as_str())
        .fetch_optional(store.pool())
        .await?;
    if let Some((routed, head, routed_install, rescanned, install)) = position {
        QueueError::check_fence(group.as_str(), fence, install)?;
        let aligned = install.is_none_or(|install| install == routed_install);
        if aligned && rescanned && routed >= head {
            return Ok(RouteReport {
                position: routed,
                ..RouteReport::default()
            });
        }
    }
    let mut tx = store.pool().begin().await?;
    if on_locked == OnLocked::Wait {
        sqlx::query("SELECT set_config('lock_timeout', $1, true)")
            .bind(WAIT_FOR_ROUTER)
            .execute(&mut *tx)
            .await?;
    }
    let cursor = match swap::lock_cursor(&mut tx, group, on_locked).await {
        // The row exists (its lock was waited for); its holder outlasted the wait.
        Err(QueueError::Store(StoreError::Postgres(e))) if is_lock_timeout(&e) => {
            tx.rollback().await?;
            return Ok(RouteReport {
                busy: true,
                ..RouteReport::default()
            });
        }
        other => other?,
    };
    let Some(mut cursor) = cursor else {
        return busy_or_unknown(&mut tx, group).await;
    };
    // Read under the group row lock, which the swap also takes: the install cannot change
    // until this step commits.
    let install: Option<(i64, Vec<String>)> = sqlx::query_as(INSTALL_ON_TOPIC)
        .bind(group.as_str())
        .bind(&cursor.topic)
        .fetch_optional(&mut *tx)
        .await?;
    let Some(install) = install.map(as_install) else {
        return Err(QueueError::UnknownGroup(group.to_string()));
    };
    QueueError::check_fence(group.as_str(), fence, Some(install.position))?;
    let matcher = matchers.get(group, install.position, install.patterns.iter().cloned())?;
    let mut report = RouteReport::default();
    if cursor.routed_install != install.position {
        report.swap = Some(swap::apply(&mut tx, group, &mut cursor, &install, &matcher).await?);
    }
    let ranges = StepRanges::new(
        cursor.routed_position,
        cursor.head,
        cursor.rescan_position,
        cursor.rescan_until,
        batch,
    );
    let mut matched = Vec::new();
    let mut routed_position = cursor.routed_position;
    if let Some((from, to)) = ranges.forward {
        let slice = read_range(&mut tx, &cursor.topic, from, to).await?;
        matched = forward_matches(&matcher, &slice);
        routed_position = to;
        report.scanned = (to - from + 1) as u64;
    }
    let mut rescan_position = cursor.rescan_position;
    if let Some((from, to)) = ranges.rescan {
        let slice = read_range(&mut tx, &cursor.topic, from, to).await?;
        if !slice.is_empty() {
            let history =
                swap::history(&mut tx, matchers, group, install.position, from, to).await?;
            matched.extend(rescan_matches(&matcher, &history, &slice));
        }
        rescan_position = to + 1;
        report.rescanned = (to - from + 1) as u64;
        report.rescan_pending = to < cursor.rescan_until;
    }
    if !matched.is_empty() {
        sqlx::query(
            "INSERT INTO delivery (group_name, topic, position, routed_by, routed_at, visible_at) \
             SELECT $1, $2, p, $4, clock_timestamp(), clock_timestamp() FROM unnest($3::bigint[]) p \
             ON CONFLICT DO NOTHING",
        )
        .bind(group.as_str())
        .bind(&cursor.topic)
        .bind(&matched)
        .bind(install.position)
        .execute(&mut *tx)
        .await?;
    }
    // The claim floor moves up to the lowest delivery still waiting (or past the routed range
    // when none is): acked deliveries below it are never walked by a claim again. A rescan
    // inserts below the floor, so the floor first comes down to what it inserted.
    sqlx::query(
        "UPDATE consumer_group SET routed_position = $2, rescan_position = $3, \
           claim_floor = COALESCE( \
             (SELECT MIN(d.position) FROM delivery d \
              WHERE d.group_name = $1 AND d.position >= LEAST(consumer_group.claim_floor, $4)), \
             $2 + 1) \
         WHERE group_name = $1",
    )
    .bind(group.as_str())
    .bind(routed_position)
    .bind(rescan_position)
    .bind(matched.iter().copied().min().unwrap_or(i64::MAX))
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    report.routed = matched.len() as u64;
    report.position = routed_position;
    Ok(report)
}

/// A routing step's read of the log: `$1` topic, positions `$2..=$3` (at most a batch).
pub(crate) const SLICE: &str = "SELECT position, subject FROM message \
    WHERE topic = $1 AND position >= $2 AND position <= $3 ORDER BY position";

/// The log rows of `topic` in `from..=until` (a range of at most one batch of positions), in
/// position order.
///
/// Bounded by position on both sides, never by a row count: with statistics from when
/// `message` was small (autovacuum off, or a bulk load not yet analyzed), Postgres plans
/// `position >= $2 ORDER BY position LIMIT n` as a bitmap scan of every later row plus a sort
/// (measured: 280 ms per step at 1M rows). A range of a batch of positions reads at most a batch
/// of rows whatever the plan (`tests/tests/queue_plans.rs`).
async fn read_range(
    conn: &mut sqlx::PgConnection,
    topic: &str,
    from: i64,
    until: i64,
) -> Result<Vec<(i64, String)>, QueueError> {
    Ok(sqlx::query_as(SLICE)
        .bind(topic)
        .bind(from)
        .bind(until)
        .fetch_all(conn)
        .await?)
}

/// An install read as `(position, patterns)`.
fn as_install((position, patterns): (i64, Vec<String>)) -> EffectiveInstall {
    EffectiveInstall { position, patterns }
}

/// Postgres gave up waiting for a lock (`lock_timeout`, SQLSTATE 55P03).
fn is_lock_timeout(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|code| code == "55P03")
}

/// The group row was not returned: either someone else holds it, or it does not exist. Asked on
/// the routing transaction's own connection, so a router never holds two.
async fn busy_or_unknown(
    conn: &mut sqlx::PgConnection,
    group: &GroupName,
) -> Result<RouteReport, QueueError> {
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM consumer_group WHERE group_name = $1)")
            .bind(group.as_str())
            .fetch_one(conn)
            .await?;
    if exists {
        Ok(RouteReport {
            busy: true,
            ..RouteReport::default()
        })
    } else {
        Err(QueueError::UnknownGroup(group.to_string()))
    }
}

/// The install in effect for `group`.
pub(crate) async fn effective_install(
    store: &PgStore,
    group: &GroupName,
) -> Result<Option<EffectiveInstall>, QueueError> {
    let row: Option<(i64, Vec<String>)> = sqlx::query_as(INSTALL_IN_EFFECT)
        .bind(group.as_str())
        .fetch_optional(store.pool())
        .await?;
    Ok(row.map(as_install))
}
