//! Publishing: positions come from the topic row, locked until commit, so they are gapless and
//! become visible in order (a router reading `position > cursor` can never skip one).

use sqlx::PgConnection;
use wharf_domain::TopicName;
use wharf_store::PgStore;

use crate::error::QueueError;
use crate::message::OutgoingMessage;
use crate::wakeups::PUBLISH_CHANNEL;

/// Appends `messages` to `topic` in one transaction; returns their positions.
pub(crate) async fn publish(
    store: &PgStore,
    topic: &TopicName,
    messages: &[OutgoingMessage],
) -> Result<Vec<i64>, QueueError> {
    let count = messages.len() as i64;
    let mut tx = store.pool().begin().await?;
    let head = reserve(&mut tx, topic.as_str(), count).await?;
    let first = head - count + 1;
    let positions: Vec<i64> = (first..=head).collect();
    let subjects: Vec<&str> = messages.iter().map(|m| m.subject.as_str()).collect();
    let payloads: Vec<&[u8]> = messages.iter().map(|m| m.payload.as_slice()).collect();
    let headers: Vec<serde_json::Value> = messages
        .iter()
        .map(|m| serde_json::to_value(&m.headers))
        .collect::<Result<_, _>>()?;
    sqlx::query(
        "INSERT INTO message (topic, position, subject, payload, headers) \
         SELECT $1, * FROM unnest($2::bigint[], $3::text[], $4::bytea[], $5::jsonb[])",
    )
    .bind(topic.as_str())
    .bind(&positions)
    .bind(&subjects)
    .bind(&payloads)
    .bind(&headers)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(positions)
}

/// Advances the topic's head by `count` (creating the topic at 0), queues the publish
/// notification (`wakeups::PUBLISH_CHANNEL`) and returns the new head. The row stays locked
/// until the caller's transaction ends.
async fn reserve(conn: &mut PgConnection, topic: &str, count: i64) -> Result<i64, QueueError> {
    // The notification is sent at commit (and dropped on rollback); identical ones within one
    // transaction are folded into one by Postgres.
    let bump = "UPDATE topic SET head = head + $2 WHERE name = $1 \
         RETURNING head, pg_notify($3, current_schema() || ':' || $1)::text";
    if let Some((head, _)) = sqlx::query_as::<_, (i64, String)>(bump)
        .bind(topic)
        .bind(count)
        .bind(PUBLISH_CHANNEL)
        .fetch_optional(&mut *conn)
        .await?
    {
        return Ok(head);
    }
    sqlx::query("INSERT INTO topic (name) VALUES ($1) ON CONFLICT DO NOTHING")
        .bind(topic)
        .execute(&mut *conn)
        .await?;
    let (head, _) = sqlx::query_as::<_, (i64, String)>(bump)
        .bind(topic)
        .bind(count)
        .bind(PUBLISH_CHANNEL)
        .fetch_one(conn)
        .await?;
    Ok(head)
}
