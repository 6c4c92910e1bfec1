//! Reading projection rows on each backend.

use chrono::{DateTime, Utc};
use rusqlite::params;
use wharf_store::event::from_micros;
use wharf_store::{PgStore, SqliteStore, StoreError};

use crate::views::{EffectiveRow, WaitingRow};

fn parse_list(text: &str) -> Result<Vec<String>, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::decode(0, e))
}

/// Effective declarations (one group, or all), by group name.
pub(crate) async fn sqlite_effective(
    store: &SqliteStore,
    group: Option<String>,
) -> Result<Vec<EffectiveRow>, StoreError> {
    store
        .read(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT group_name, topic, declarer, version, patterns, previous, declared_at, \
                 attempt_at, position, installs FROM effective_declaration \
                 WHERE ?1 IS NULL OR group_name = ?1 ORDER BY group_name",
            )?;
            let rows = stmt.query_map(params![group], |r| {
                Ok((
                    (r.get::<_, String>(0)?, r.get::<_, String>(1)?),
                    (r.get::<_, String>(2)?, r.get::<_, String>(3)?),
                    (r.get::<_, String>(4)?, r.get::<_, Option<String>>(5)?),
                    (r.get::<_, i64>(6)?, r.get::<_, i64>(7)?),
                    (r.get::<_, i64>(8)?, r.get::<_, i64>(9)?),
                ))
            })?;
            rows.map(|row| {
                let ((group, topic), (declarer, version), (patterns, previous), times, counts) =
                    row?;
                Ok(EffectiveRow {
                    group,
                    topic,
                    declarer,
                    version,
                    patterns: parse_list(&patterns)?,
                    previous: previous.as_deref().map(parse_list).transpose()?,
                    declared_at: from_micros(times.0),
                    attempt_at: from_micros(times.1),
                    position: counts.0,
                    installs: counts.1,
                })
            })
            .collect()
        })
        .await
}

/// Waiting attempts (of one group, or all).
pub(crate) async fn sqlite_waiting(
    store: &SqliteStore,
    group: Option<String>,
) -> Result<Vec<WaitingRow>, StoreError> {
    store
        .read(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT group_name, declarer, version, patterns, incumbent, declared_at, attempt_at \
                 FROM declarer_attempt WHERE status = 'waiting' AND (?1 IS NULL OR group_name = ?1) \
                 ORDER BY group_name, declared_at, declarer",
            )?;
            let rows = stmt.query_map(params![group], |r| {
                Ok((
                    (r.get::<_, String>(0)?, r.get::<_, String>(1)?),
                    r.get::<_, String>(2)?,
                    (r.get::<_, String>(3)?, r.get::<_, Option<String>>(4)?),
                    (r.get::<_, i64>(5)?, r.get::<_, i64>(6)?),
                ))
            })?;
            rows.map(|row| {
                let ((group, declarer), version, (patterns, incumbent), times) = row?;
                Ok(WaitingRow {
                    group,
                    declarer,
                    version,
                    patterns: parse_list(&patterns)?,
                    incumbent: incumbent.as_deref().map(parse_list).transpose()?.unwrap_or_default(),
                    declared_at: from_micros(times.0),
                    attempt_at: from_micros(times.1),
                })
            })
            .collect()
        })
        .await
}

/// The effective binding rows of a group (empty = whole topic).
pub(crate) async fn sqlite_bindings(
    store: &SqliteStore,
    group: String,
) -> Result<Vec<String>, StoreError> {
    store
        .read(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT pattern FROM binding WHERE group_name = ?1 ORDER BY pattern",
            )?;
            let rows = stmt.query_map([group], |r| r.get::<_, String>(0))?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
}

type PgEffective = (
    String,
    String,
    String,
    String,
    Vec<String>,
    Option<Vec<String>>,
    DateTime<Utc>,
    DateTime<Utc>,
    i64,
    i64,
);

/// Effective declarations (one group, or all), by group name.
pub(crate) async fn pg_effective(
    store: &PgStore,
    group: Option<String>,
) -> Result<Vec<EffectiveRow>, StoreError> {
    let rows: Vec<PgEffective> = sqlx::query_as(
        "SELECT group_name, topic, declarer, version, patterns, previous, declared_at, attempt_at, \
         position, installs FROM effective_declaration \
         WHERE $1::text IS NULL OR group_name = $1 ORDER BY group_name",
    )
    .bind(group)
    .fetch_all(store.pool())
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| EffectiveRow {
            group: r.0,
            topic: r.1,
            declarer: r.2,
            version: r.3,
            patterns: r.4,
            previous: r.5,
            declared_at: r.6,
            attempt_at: r.7,
            position: r.8,
            installs: r.9,
        })
        .collect())
}

type PgWaiting = (
    String,
    String,
    String,
    Vec<String>,
    Option<Vec<String>>,
    DateTime<Utc>,
    DateTime<Utc>,
);

/// Waiting attempts (of one group, or all).
pub(crate) async fn pg_waiting(
    store: &PgStore,
    group: Option<String>,
) -> Result<Vec<WaitingRow>, StoreError> {
    let rows: Vec<PgWaiting> = sqlx::query_as(
        "SELECT group_name, declarer, version, patterns, incumbent, declared_at, attempt_at \
         FROM declarer_attempt WHERE status = 'waiting' AND ($1::text IS NULL OR group_name = $1) \
         ORDER BY group_name, declared_at, declarer",
    )
    .bind(group)
    .fetch_all(store.pool())
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| WaitingRow {
            group: r.0,
            declarer: r.1,
            version: r.2,
            patterns: r.3,
            incumbent: r.4.unwrap_or_default(),
            declared_at: r.5,
            attempt_at: r.6,
        })
        .collect())
}

/// The effective binding rows of a group (empty = whole topic).
pub(crate) async fn pg_bindings(store: &PgStore, group: String) -> Result<Vec<String>, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT pattern FROM binding WHERE group_name = $1 ORDER BY pattern")
            .bind(group)
            .fetch_all(store.pool())
            .await?,
    )
}
