//! A routing step's statements on Postgres: the group's row lock and the [`RouteDialect`]
//! the step and its swap run on (the logic: `routing.rs`; the rules: `generations.rs`, ADR
//! 0014). Every statement runs inside the step's transaction, under the group row lock.

use sqlx::PgConnection;
use wharf_domain::GroupName;

use super::route::{as_install, INSTALL_ON_TOPIC, SLICE};
use crate::backend::OnLocked;
use crate::error::QueueError;
use crate::message::{EffectiveInstall, SwapReport};
use crate::routing::{Cursor, GenerationRow, RouteDialect};

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

/// Records deliveries of `$3` positions for group `$1` on topic `$2`, stamped with `$4`.
const DELIVER: &str = "INSERT INTO delivery (group_name, topic, position, routed_by, routed_at, \
       visible_at) \
     SELECT $1, $2, p, $4, clock_timestamp(), clock_timestamp() FROM unnest($3::bigint[]) p \
     ON CONFLICT DO NOTHING";

/// Moves the cursor (`$2` routed, `$3` rescan position). The claim floor moves up to the lowest
/// delivery still waiting (or past the routed range when none is): acked deliveries below it
/// are never walked by a claim again. A rescan inserts below the floor, so the floor first
/// comes down to what it inserted (`$4`, the lowest position delivered).
const ADVANCE: &str = "UPDATE consumer_group SET routed_position = $2, rescan_position = $3, \
       claim_floor = COALESCE( \
         (SELECT MIN(d.position) FROM delivery d \
          WHERE d.group_name = $1 AND d.position >= LEAST(consumer_group.claim_floor, $4)), \
         $2 + 1) \
     WHERE group_name = $1";

/// The closed generations of `$1` other than `$2` overlapping `$3..=$4`.
const GENERATIONS: &str = "SELECT install, patterns, from_position, through_position, \
       rescan_from, rescan_through FROM route_generation \
     WHERE group_name = $1 AND install <> $2 AND through_position IS NOT NULL \
       AND ((from_position <= $4 AND through_position >= $3) \
         OR (rescan_from <= $4 AND rescan_through >= $3))";

/// A routing step's statements on its transaction's connection.
pub(crate) struct PgRoute<'c>(pub &'c mut PgConnection);

impl RouteDialect for PgRoute<'_> {
    async fn install(
        &mut self,
        group: &GroupName,
        topic: &str,
    ) -> Result<Option<EffectiveInstall>, QueueError> {
        let row: Option<(i64, Vec<String>)> = sqlx::query_as(INSTALL_ON_TOPIC)
            .bind(group.as_str())
            .bind(topic)
            .fetch_optional(&mut *self.0)
            .await?;
        Ok(row.map(as_install))
    }

    async fn slice(
        &mut self,
        topic: &str,
        from: i64,
        to: i64,
    ) -> Result<Vec<(i64, String)>, QueueError> {
        Ok(sqlx::query_as(SLICE)
            .bind(topic)
            .bind(from)
            .bind(to)
            .fetch_all(&mut *self.0)
            .await?)
    }

    async fn generations(
        &mut self,
        group: &GroupName,
        current: i64,
        first: i64,
        last: i64,
    ) -> Result<Vec<GenerationRow>, QueueError> {
        type Row = (i64, Vec<String>, i64, i64, i64, i64);
        let rows: Vec<Row> = sqlx::query_as(GENERATIONS)
            .bind(group.as_str())
            .bind(current)
            .bind(first)
            .bind(last)
            .fetch_all(&mut *self.0)
            .await?;
        Ok(rows
            .into_iter()
            .map(
                |(install, patterns, from, through, rescan_from, rescan_through)| GenerationRow {
                    install,
                    patterns,
                    forward: (from, through),
                    rescan: (rescan_from, rescan_through),
                },
            )
            .collect())
    }

    async fn deliver(
        &mut self,
        group: &GroupName,
        topic: &str,
        positions: &[i64],
        install: i64,
    ) -> Result<(), QueueError> {
        sqlx::query(DELIVER)
            .bind(group.as_str())
            .bind(topic)
            .bind(positions)
            .bind(install)
            .execute(&mut *self.0)
            .await?;
        Ok(())
    }

    async fn advance(
        &mut self,
        group: &GroupName,
        routed_position: i64,
        rescan_position: i64,
        lowest_delivered: Option<i64>,
    ) -> Result<(), QueueError> {
        sqlx::query(ADVANCE)
            .bind(group.as_str())
            .bind(routed_position)
            .bind(rescan_position)
            .bind(lowest_delivered.unwrap_or(i64::MAX))
            .execute(&mut *self.0)
            .await?;
        Ok(())
    }

    async fn close_generation(
        &mut self,
        group: &GroupName,
        install: i64,
        through: i64,
        rescan_through: i64,
    ) -> Result<(), QueueError> {
        sqlx::query(
            "UPDATE route_generation SET through_position = $3, rescan_through = $4 \
             WHERE group_name = $1 AND install = $2 AND through_position IS NULL",
        )
        .bind(group.as_str())
        .bind(install)
        .bind(through)
        .bind(rescan_through)
        .execute(&mut *self.0)
        .await?;
        Ok(())
    }

    async fn pending(
        &mut self,
        group: &GroupName,
        install: i64,
    ) -> Result<Vec<(i64, Option<String>)>, QueueError> {
        Ok(sqlx::query_as(
            "SELECT d.position, m.subject FROM delivery d \
             LEFT JOIN message m ON m.topic = d.topic AND m.position = d.position \
             WHERE d.group_name = $1 AND d.routed_by <> $2",
        )
        .bind(group.as_str())
        .bind(install)
        .fetch_all(&mut *self.0)
        .await?)
    }

    async fn restamp(
        &mut self,
        group: &GroupName,
        positions: &[i64],
        install: i64,
    ) -> Result<u64, QueueError> {
        at_positions(self.0, RESTAMP, group.as_str(), positions, install).await
    }

    async fn set_aside(
        &mut self,
        group: &GroupName,
        positions: &[i64],
        install: i64,
    ) -> Result<u64, QueueError> {
        at_positions(self.0, SET_ASIDE, group.as_str(), positions, install).await
    }

    async fn parked(&mut self, group: &GroupName) -> Result<Vec<(i64, String)>, QueueError> {
        Ok(sqlx::query_as(
            "SELECT s.position, m.subject FROM set_aside s \
             JOIN message m ON m.topic = s.topic AND m.position = s.position \
             WHERE s.group_name = $1",
        )
        .bind(group.as_str())
        .fetch_all(&mut *self.0)
        .await?)
    }

    async fn restore(
        &mut self,
        group: &GroupName,
        positions: &[i64],
        install: i64,
    ) -> Result<u64, QueueError> {
        at_positions(self.0, RESTORE, group.as_str(), positions, install).await
    }

    async fn oldest(&mut self, topic: &str) -> Result<Option<i64>, QueueError> {
        Ok(
            sqlx::query_scalar("SELECT MIN(position) FROM message WHERE topic = $1")
                .bind(topic)
                .fetch_one(&mut *self.0)
                .await?,
        )
    }

    async fn open_generation(
        &mut self,
        group: &GroupName,
        install: &EffectiveInstall,
        from_position: i64,
        swap: &SwapReport,
    ) -> Result<(), QueueError> {
        sqlx::query(
            "INSERT INTO route_generation (group_name, install, patterns, from_position, \
               rescan_from, set_aside, restored, kept, applied_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, clock_timestamp()) ON CONFLICT DO NOTHING",
        )
        .bind(group.as_str())
        .bind(install.position)
        .bind(&install.patterns)
        .bind(from_position)
        .bind(swap.rescan_from)
        .bind(swap.set_aside as i64)
        .bind(swap.restored as i64)
        .bind(swap.kept as i64)
        .execute(&mut *self.0)
        .await?;
        Ok(())
    }

    async fn realign(
        &mut self,
        group: &GroupName,
        start: i64,
        swap: &SwapReport,
    ) -> Result<(), QueueError> {
        sqlx::query(
            "UPDATE consumer_group SET start_position = $2, routed_install = $3, \
               rescan_position = $4, rescan_until = $5, claim_floor = COALESCE( \
                 (SELECT MIN(position) FROM delivery WHERE group_name = $1), $5 + 1) \
             WHERE group_name = $1",
        )
        .bind(group.as_str())
        .bind(start)
        .bind(swap.install)
        .bind(swap.rescan_from)
        .bind(swap.rescan_until)
        .execute(&mut *self.0)
        .await?;
        Ok(())
    }
}
