//! Routing: match the next slice of the log against the group's effective binding set and
//! record deliveries for the matches.
//!
//! The group row is locked `FOR UPDATE SKIP LOCKED`: one router per group at a time (others
//! skip and go claim), and the declaration swap takes the same lock, so a batch is matched
//! against exactly the set in effect when it was routed, never a mixture. The first step after
//! a swap applies it first (the step: `routing.rs`; its statements: `route_sql.rs`; ADR 0014).

use wharf_domain::GroupName;
use wharf_store::{PgStore, StoreError};

use super::route_sql::{self, PgRoute};
use crate::backend::OnLocked;
use crate::error::QueueError;
use crate::fence::InstallFence;
use crate::matchers::Matchers;
use crate::message::{EffectiveInstall, RouteReport};
use crate::routing::{self, Look};

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
    fence: Option<InstallFence>,
    on_locked: OnLocked,
) -> Result<RouteReport, QueueError> {
    // An unlocked look first: a caught-up group whose routing is aligned with its install (the
    // idle case) costs one read, not a locked transaction. A missing group falls through to the
    // locked path, which reports it.
    let look: Option<(i64, i64, i64, bool, Option<i64>)> = sqlx::query_as(SETTLED_LOOK)
        .bind(group.as_str())
        .fetch_optional(store.pool())
        .await?;
    if let Some((routed_position, head, routed_install, rescanned, install)) = look {
        let look = Look {
            routed_position,
            head,
            routed_install,
            rescanned,
            install,
        };
        if let Some(position) = look.settled(group, fence)? {
            return Ok(RouteReport {
                position,
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
    let cursor = match route_sql::lock_cursor(&mut tx, group, on_locked).await {
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
    let Some(cursor) = cursor else {
        return busy_or_unknown(&mut tx, group).await;
    };
    // Under the group row lock, which the swap also takes: the install the step reads cannot
    // change until it commits.
    let report =
        routing::step(&mut PgRoute(&mut tx), matchers, group, cursor, batch, fence).await?;
    tx.commit().await?;
    Ok(report)
}

/// A routing step's read of the log: `$1` topic, positions `$2..=$3` (at most a batch), in
/// position order.
///
/// Bounded by position on both sides, never by a row count: with statistics from when
/// `message` was small (autovacuum off, or a bulk load not yet analyzed), Postgres plans
/// `position >= $2 ORDER BY position LIMIT n` as a bitmap scan of every later row plus a sort
/// (measured: 280 ms per step at 1M rows). A range of a batch of positions reads at most a batch
/// of rows whatever the plan (`tests/tests/queue_plans.rs`).
pub(crate) const SLICE: &str = "SELECT position, subject FROM message \
    WHERE topic = $1 AND position >= $2 AND position <= $3 ORDER BY position";

/// An install read as `(position, patterns)`.
pub(super) fn as_install((position, patterns): (i64, Vec<String>)) -> EffectiveInstall {
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
