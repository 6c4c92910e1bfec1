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
use crate::message::RouteReport;

/// Routes up to `batch` log positions for `group`.
pub(crate) async fn route(
    store: &PgStore,
    matchers: &Matchers,
    group: &GroupName,
    batch: i64,
) -> Result<RouteReport, QueueError> {
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
    let set: Vec<(i64, Option<String>)> = sqlx::query_as(
        "SELECT e.position, b.pattern FROM effective_declaration e \
         LEFT JOIN binding b ON b.group_name = e.group_name WHERE e.group_name = $1",
    )
    .bind(group.as_str())
    .fetch_all(&mut *tx)
    .await?;
    let Some(&(generation, _)) = set.first() else {
        return Err(QueueError::UnknownGroup(group.to_string()));
    };
    let matcher = matchers.get(group, generation, set.into_iter().filter_map(|(_, p)| p))?;
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
    sqlx::query("UPDATE consumer_group SET routed_position = $2 WHERE group_name = $1")
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
