//! Routing: match the next slice of the log against the group's effective binding set and
//! record deliveries for the matches.
//!
//! The group row is locked `FOR UPDATE SKIP LOCKED`: one router per group at a time (others
//! skip and go claim), and the declaration swap takes the same lock, so a batch is matched
//! against exactly the set in effect when it was routed, never a mixture.

use wharf_domain::GroupName;
use wharf_store::PgStore;

use crate::error::QueueError;
use crate::matchers::Matchers;
use crate::message::{EffectiveInstall, RouteReport};

/// Routes up to `batch` log positions for `group`.
pub(crate) async fn route(
    store: &PgStore,
    matchers: &Matchers,
    group: &GroupName,
    batch: i64,
) -> Result<RouteReport, QueueError> {
    // An unlocked look first: a caught-up group (the idle case) costs one read, not a locked
    // transaction. A missing group falls through to the locked path, which reports it.
    let position: Option<(i64, i64)> = sqlx::query_as(
        "SELECT g.routed_position, COALESCE(t.head, 0) FROM consumer_group g \
         LEFT JOIN topic t ON t.name = g.topic WHERE g.group_name = $1",
    )
    .bind(group.as_str())
    .fetch_optional(store.pool())
    .await?;
    if let Some((routed, head)) = position {
        if routed >= head {
            return Ok(RouteReport {
                position: routed,
                ..RouteReport::default()
            });
        }
    }
    let mut tx = store.pool().begin().await?;
    let cursor: Option<(String, i64)> = sqlx::query_as(
        "SELECT topic, routed_position FROM consumer_group WHERE group_name = $1 \
         FOR UPDATE SKIP LOCKED",
    )
    .bind(group.as_str())
    .fetch_optional(&mut *tx)
    .await?;
    let Some((topic, routed)) = cursor else {
        return busy_or_unknown(&mut tx, group).await;
    };
    let generation: Option<i64> =
        sqlx::query_scalar("SELECT position FROM effective_declaration WHERE group_name = $1")
            .bind(group.as_str())
            .fetch_optional(&mut *tx)
            .await?;
    let Some(generation) = generation else {
        return Err(QueueError::UnknownGroup(group.to_string()));
    };
    // The patterns are read only when this install's set is not compiled yet. Both reads run
    // under the group row lock, which the swap also takes, so they see the same install.
    let matcher = match matchers.cached(group, generation) {
        Some(matcher) => matcher,
        None => {
            let patterns: Vec<String> =
                sqlx::query_scalar("SELECT pattern FROM binding WHERE group_name = $1")
                    .bind(group.as_str())
                    .fetch_all(&mut *tx)
                    .await?;
            matchers.get(group, generation, patterns.into_iter())?
        }
    };
    let slice: Vec<(i64, String)> = sqlx::query_as(
        "SELECT position, subject FROM message WHERE topic = $1 AND position > $2 \
         ORDER BY position LIMIT $3",
    )
    .bind(&topic)
    .bind(routed)
    .bind(batch)
    .fetch_all(&mut *tx)
    .await?;
    let Some(&(last, _)) = slice.last() else {
        return Ok(RouteReport {
            position: routed,
            ..RouteReport::default()
        });
    };
    let matched: Vec<i64> = slice
        .iter()
        .filter(|(_, subject)| matcher.matches_str(subject))
        .map(|(position, _)| *position)
        .collect();
    if !matched.is_empty() {
        sqlx::query(
            "INSERT INTO delivery (group_name, topic, position, routed_by, routed_at, visible_at) \
             SELECT $1, $2, p, $4, clock_timestamp(), clock_timestamp() FROM unnest($3::bigint[]) p \
             ON CONFLICT DO NOTHING",
        )
        .bind(group.as_str())
        .bind(&topic)
        .bind(&matched)
        .bind(generation)
        .execute(&mut *tx)
        .await?;
    }
    // The claim floor moves up to the lowest delivery still waiting (or past the routed range
    // when none is): acked deliveries below it are never walked by a claim again.
    sqlx::query(
        "UPDATE consumer_group SET routed_position = $2, claim_floor = COALESCE( \
           (SELECT MIN(d.position) FROM delivery d \
            WHERE d.group_name = $1 AND d.position >= consumer_group.claim_floor), $2 + 1) \
         WHERE group_name = $1",
    )
    .bind(group.as_str())
    .bind(last)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(RouteReport {
        scanned: slice.len() as u64,
        routed: matched.len() as u64,
        position: last,
        busy: false,
    })
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
    let row: Option<(i64, Vec<String>)> = sqlx::query_as(
        "SELECT position, patterns FROM effective_declaration WHERE group_name = $1",
    )
    .bind(group.as_str())
    .fetch_optional(store.pool())
    .await?;
    Ok(row.map(|(position, patterns)| EffectiveInstall { position, patterns }))
}
