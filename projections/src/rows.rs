//! Reading projection rows on each backend: pages of groups and one group's members.
//!
//! Every statement here is keyed: a group page walks `effective_declaration` by name (or by
//! `(topic, group_name)`), waiters come from the partial index of waiting attempts
//! `(group_name, declared_at, declarer)`, instances from `worker_instance`'s key. The SQL
//! constants are public so the plan tests EXPLAIN exactly what runs. On Postgres no plan whose
//! shape came from a table while it was empty serves them (see
//! `docs/adr/0024-paged-listing.md`): the one-group read (`group_rows.rs`) runs inside
//! `wharf_group_rows` (ADRs 0046, 0065), planned once per connection with every path but an
//! index's off (ADR 0058); the others are unnamed statements, planned on every call with the
//! values given.

use chrono::{DateTime, Utc};
use rusqlite::{params, Connection};
use wharf_store::event::from_micros;
use wharf_store::{InstanceRecord, PgStore, SqliteStore, StoreError};

use sqlx::Row;

use crate::declaration::DeclarerAttempts;
use crate::listing::{MemberKeys, PageRows, Snapshot};
use crate::views::{EffectiveRow, WaitingRow};

pub use crate::group_rows::{PG_GROUP_READ, PG_GROUP_READ_CALL, PG_GROUP_ROWS, PG_GROUP_ROWS_CALL};

fn parse_list(text: &str) -> Result<Vec<String>, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::decode(0, e))
}

/// A waiting attempt's columns as SQLite stores them: declarer, version, patterns and incumbent
/// (JSON text), first statement and newest attempt (microseconds).
pub(crate) type RawWaiter = (String, String, String, Option<String>, i64, i64);

/// A SQLite waiting attempt of `group`, its lists and times decoded.
pub(crate) fn sqlite_waiting_row(group: String, raw: RawWaiter) -> Result<WaitingRow, StoreError> {
    let (declarer, version, patterns, incumbent, declared, attempt) = raw;
    Ok(WaitingRow {
        group,
        declarer,
        version,
        patterns: parse_list(&patterns)?,
        incumbent: incumbent
            .as_deref()
            .map(parse_list)
            .transpose()?
            .unwrap_or_default(),
        declared_at: from_micros(declared),
        attempt_at: from_micros(attempt),
    })
}

/// A page of groups as the backends read it.
#[derive(Debug, Clone)]
pub(crate) struct PageKeys {
    /// After this group name (`""`: from the first).
    pub after: String,
    /// How many effective rows to read (one more than the page).
    pub fetch: i64,
    /// Only this topic.
    pub topic: Option<String>,
    /// Only groups with an open waiter.
    pub waiting: bool,
}

pub use crate::walks::page_sql;
use crate::walks::EFFECTIVE_COLUMNS;

/// One group's effective row (`?1`/`$1` the group).
pub fn one_sql(p: char) -> String {
    format!("SELECT {EFFECTIVE_COLUMNS} FROM effective_declaration e WHERE e.group_name = {p}1")
}

/// One group's open waiters after a key, by that key: 1 the group, 2 and 3 the key, 4 the count.
pub const SQLITE_WAITERS: &str = "SELECT a.group_name, a.declarer, a.version, a.patterns, \
     a.incumbent, a.declared_at, a.attempt_at FROM declarer_attempt a \
     WHERE a.group_name = ?1 AND a.status = 'waiting' \
     AND a.patterns <> (SELECT e.patterns FROM effective_declaration e WHERE e.group_name = ?1) \
     AND (a.declared_at, a.declarer) > (?2, ?3) ORDER BY a.declared_at, a.declarer LIMIT ?4";

/// One group's instances after a declarer, by declarer: 1 the group, 2 the key, 3 the count.
pub const SQLITE_INSTANCES: &str = "SELECT group_name, declarer, topic, version, patterns, \
     started_at, heartbeat_at FROM worker_instance WHERE group_name = ?1 AND declarer > ?2 \
     ORDER BY declarer LIMIT ?3";

/// The open waiters of each listed group after a key: `$1` the groups, `$2`, `$3` the key
/// (NULL: from the first), `$4` the count per group.
pub const PG_WAITERS: &str = "SELECT g.name, w.declarer, w.version, w.patterns, w.incumbent, \
     w.declared_at, w.attempt_at FROM unnest($1::text[]) AS g(name) CROSS JOIN LATERAL ( \
       SELECT a.declarer, a.version, a.patterns, a.incumbent, a.declared_at, a.attempt_at \
       FROM declarer_attempt a JOIN effective_declaration e ON e.group_name = a.group_name \
       WHERE a.group_name = g.name AND a.status = 'waiting' AND a.patterns <> e.patterns \
       AND (a.declared_at, a.declarer) > \
           (COALESCE($2::timestamptz, '-infinity'), COALESCE($3::text, '')) \
       ORDER BY a.declared_at, a.declarer LIMIT $4) w \
     ORDER BY g.name, w.declared_at, w.declarer";

/// The instances of each listed group after a declarer: `$1` the groups, `$2` the key, `$3`
/// the count per group.
pub const PG_INSTANCES: &str = "SELECT g.name, i.declarer, i.topic, i.version, i.patterns, \
     i.started_at, i.heartbeat_at FROM unnest($1::text[]) AS g(name) CROSS JOIN LATERAL ( \
       SELECT w.declarer, w.topic, w.version, w.patterns, w.started_at, w.heartbeat_at \
       FROM worker_instance w WHERE w.group_name = g.name AND w.declarer > $2 \
       ORDER BY w.declarer LIMIT $3) i \
     ORDER BY g.name, i.declarer";

// ---------------------------------------------------------------------------------------------
// SQLite
// ---------------------------------------------------------------------------------------------

/// The effective row from a SQLite page's first ten columns.
pub(crate) fn sqlite_effective_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawEffective> {
    Ok(RawEffective {
        names: (r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?),
        sets: (r.get(4)?, r.get(5)?),
        times: (r.get(6)?, r.get(7)?),
        counts: (r.get(8)?, r.get(9)?),
    })
}

/// An effective row as SQLite stores it, before its lists and times are decoded.
pub(crate) struct RawEffective {
    names: (String, String, String, String),
    sets: (String, Option<String>),
    times: (i64, i64),
    counts: (i64, i64),
}

impl RawEffective {
    pub(crate) fn decode(self) -> Result<EffectiveRow, StoreError> {
        let (group, topic, declarer, version) = self.names;
        Ok(EffectiveRow {
            group,
            topic,
            declarer,
            version,
            patterns: parse_list(&self.sets.0)?,
            previous: self.sets.1.as_deref().map(parse_list).transpose()?,
            declared_at: from_micros(self.times.0),
            attempt_at: from_micros(self.times.1),
            position: self.counts.0,
            installs: self.counts.1,
        })
    }
}

fn sqlite_members(
    conn: &Connection,
    groups: &[String],
    keys: &MemberKeys,
) -> Result<(Vec<WaitingRow>, Vec<InstanceRecord>), StoreError> {
    let (after_at, after_declarer) = keys
        .waiters_after
        .clone()
        .unwrap_or((i64::MIN, String::new()));
    let mut waiting = Vec::new();
    let mut instances = Vec::new();
    let mut waiters = conn.prepare_cached(SQLITE_WAITERS)?;
    let mut members = conn.prepare_cached(SQLITE_INSTANCES)?;
    for group in groups {
        let rows =
            waiters.query_map(params![group, after_at, after_declarer, keys.fetch], |r| {
                let raw: RawWaiter = (
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                    r.get(6)?,
                );
                Ok((r.get::<_, String>(0)?, raw))
            })?;
        for row in rows {
            let (group, raw) = row?;
            waiting.push(sqlite_waiting_row(group, raw)?);
        }
        let rows = members.query_map(params![group, keys.instances_after, keys.fetch], |r| {
            Ok((
                (r.get::<_, String>(0)?, r.get::<_, String>(1)?),
                (r.get::<_, String>(2)?, r.get::<_, String>(3)?),
                r.get::<_, String>(4)?,
                (r.get::<_, i64>(5)?, r.get::<_, i64>(6)?),
            ))
        })?;
        for row in rows {
            let ((group, declarer), (topic, version), patterns, (started, beat)) = row?;
            instances.push(InstanceRecord {
                group,
                declarer,
                topic,
                version,
                patterns: parse_list(&patterns)?,
                started_at: from_micros(started),
                heartbeat_at: from_micros(beat),
            });
        }
    }
    Ok((waiting, instances))
}

/// A page of groups with the first page of each one's members, in one read snapshot.
pub(crate) async fn sqlite_page(
    store: &SqliteStore,
    page: PageKeys,
    keys: MemberKeys,
) -> Result<PageRows, StoreError> {
    store
        .read(move |conn| {
            let sql = page_sql('?', page.topic.is_some(), page.waiting);
            let effective = {
                let mut stmt = conn.prepare_cached(&sql)?;
                let rows = match &page.topic {
                    Some(topic) => stmt
                        .query_map(params![page.after, page.fetch, topic], sqlite_effective_row)?,
                    None => {
                        stmt.query_map(params![page.after, page.fetch], sqlite_effective_row)?
                    }
                };
                rows.map(|row| row?.decode())
                    .collect::<Result<Vec<_>, StoreError>>()?
            };
            let groups: Vec<String> = effective.iter().map(|e| e.group.clone()).collect();
            let (waiting, instances) = sqlite_members(conn, &groups, &keys)?;
            Ok(PageRows {
                effective,
                waiting,
                instances,
            })
        })
        .await
}

/// Whether the catch-up projector is behind the log, on a connection inside a read.
pub(crate) fn sqlite_behind(conn: &Connection) -> Result<bool, StoreError> {
    let (head, checkpoint) = conn
        .prepare_cached(wharf_store::sqlite::CATCH_UP_CHECK)?
        .query_row([DeclarerAttempts::NAME], |row| {
            Ok((row.get::<_, i64>(0)?, row.get::<_, i64>(1)?))
        })?;
    Ok(head > checkpoint)
}

/// One group (no rows when it was never declared) with a page of its members, in one read
/// transaction that also answers the catch-up check; `now` is the store's clock.
pub(crate) async fn sqlite_group_snapshot(
    store: &SqliteStore,
    group: String,
    keys: MemberKeys,
    now: DateTime<Utc>,
) -> Result<Snapshot<PageRows>, StoreError> {
    store
        .read(move |conn| {
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Deferred)?;
            let behind = sqlite_behind(&tx)?;
            let effective = tx
                .prepare_cached(&one_sql('?'))?
                .query_map([&group], sqlite_effective_row)?
                .map(|row| row?.decode())
                .collect::<Result<Vec<_>, StoreError>>()?;
            let groups: Vec<String> = effective.iter().map(|e| e.group.clone()).collect();
            let (waiting, instances) = sqlite_members(&tx, &groups, &keys)?;
            tx.commit()?;
            Ok(Snapshot {
                rows: PageRows {
                    effective,
                    waiting,
                    instances,
                },
                now,
                behind,
            })
        })
        .await
}

/// True when the group has an effective declaration.
pub(crate) async fn sqlite_is_declared(
    store: &SqliteStore,
    group: String,
) -> Result<bool, StoreError> {
    store
        .read(move |conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT EXISTS (SELECT 1 FROM effective_declaration WHERE group_name = ?1)",
                )?
                .query_row([group], |r| r.get::<_, bool>(0))?)
        })
        .await
}

/// The effective binding rows of a group (empty = whole topic), from the `binding` view over its
/// effective declaration's patterns (ADR 0064).
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

// ---------------------------------------------------------------------------------------------
// Postgres
// ---------------------------------------------------------------------------------------------

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

fn pg_effective_row(r: PgEffective) -> EffectiveRow {
    EffectiveRow {
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
    }
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

type PgInstance = (
    String,
    String,
    String,
    String,
    Vec<String>,
    DateTime<Utc>,
    DateTime<Utc>,
);

async fn pg_members(
    store: &PgStore,
    groups: Vec<String>,
    keys: &MemberKeys,
) -> Result<(Vec<WaitingRow>, Vec<InstanceRecord>), StoreError> {
    if groups.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let (after_at, after_declarer) = keys
        .waiters_after
        .clone()
        .map(|(at, declarer)| (Some(from_micros(at)), Some(declarer)))
        .unwrap_or((None, None));
    let waiting: Vec<PgWaiting> = sqlx::query_as(PG_WAITERS)
        .bind(&groups)
        .bind(after_at)
        .bind(after_declarer)
        .bind(keys.fetch)
        .persistent(false)
        .fetch_all(store.pool())
        .await?;
    let instances: Vec<PgInstance> = sqlx::query_as(PG_INSTANCES)
        .bind(&groups)
        .bind(&keys.instances_after)
        .bind(keys.fetch)
        .persistent(false)
        .fetch_all(store.pool())
        .await?;
    let waiting = waiting
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
        .collect();
    let instances = instances
        .into_iter()
        .map(|r| InstanceRecord {
            group: r.0,
            declarer: r.1,
            topic: r.2,
            version: r.3,
            patterns: r.4,
            started_at: r.5,
            heartbeat_at: r.6,
        })
        .collect();
    Ok((waiting, instances))
}

/// A page of groups with the first page of each one's members.
pub(crate) async fn pg_page(
    store: &PgStore,
    page: PageKeys,
    keys: MemberKeys,
) -> Result<PageRows, StoreError> {
    let sql = page_sql('$', page.topic.is_some(), page.waiting);
    let mut query = sqlx::query_as::<_, PgEffective>(&sql)
        .bind(&page.after)
        .bind(page.fetch);
    if let Some(topic) = &page.topic {
        query = query.bind(topic);
    }
    let effective: Vec<EffectiveRow> = query
        .persistent(false)
        .fetch_all(store.pool())
        .await?
        .into_iter()
        .map(pg_effective_row)
        .collect();
    let groups = effective.iter().map(|e| e.group.clone()).collect();
    let (waiting, instances) = pg_members(store, groups, &keys).await?;
    Ok(PageRows {
        effective,
        waiting,
        instances,
    })
}

/// The effective row of `group` from a one-read statement's columns 4 to 12 (topic, declarer,
/// version, patterns, previous, declared and attempt times, position, installs), the layout
/// the page statements share after the clock, the head and the checkpoint (0-2) and the
/// group's name (3).
pub(crate) fn pg_effective_columns(
    row: &sqlx::postgres::PgRow,
    group: String,
) -> Result<EffectiveRow, StoreError> {
    Ok(EffectiveRow {
        group,
        topic: row.try_get(4)?,
        declarer: row.try_get(5)?,
        version: row.try_get(6)?,
        patterns: row.try_get(7)?,
        previous: row.try_get(8)?,
        declared_at: row.try_get(9)?,
        attempt_at: row.try_get(10)?,
        position: row.try_get(11)?,
        installs: row.try_get(12)?,
    })
}

/// Whether group `$1` has an effective declaration on Postgres. Read by group and topic (the
/// topic from the group's row), which both of `effective_declaration`'s indexes hold whole
/// (ADR 0066): by the name alone, statistics that count the table's pages but not its rows let
/// the planner walk the whole `(topic, group_name)` index.
pub const PG_IS_DECLARED: &str = "SELECT EXISTS (SELECT 1 FROM effective_declaration e \
     WHERE e.group_name = $1 \
     AND e.topic = (SELECT g.topic FROM consumer_group g WHERE g.group_name = $1))";

/// True when the group has an effective declaration: [`PG_IS_DECLARED`].
pub(crate) async fn pg_is_declared(store: &PgStore, group: String) -> Result<bool, StoreError> {
    Ok(sqlx::query_scalar(PG_IS_DECLARED)
        .bind(group)
        .fetch_one(store.pool())
        .await?)
}

/// The effective binding rows of group `$1` on Postgres: its effective declaration's patterns,
/// one row each, as the `binding` view derives them (ADR 0064), the row read by group and
/// topic as [`PG_IS_DECLARED`] reads it (ADR 0066).
pub const PG_BINDINGS: &str = "SELECT p.pattern FROM effective_declaration e \
     CROSS JOIN LATERAL unnest(e.patterns) AS p (pattern) \
     WHERE e.group_name = $1 \
     AND e.topic = (SELECT g.topic FROM consumer_group g WHERE g.group_name = $1) \
     ORDER BY p.pattern";

/// The effective binding rows of a group (empty = whole topic): [`PG_BINDINGS`].
pub(crate) async fn pg_bindings(store: &PgStore, group: String) -> Result<Vec<String>, StoreError> {
    Ok(sqlx::query_scalar(PG_BINDINGS)
        .bind(group)
        .fetch_all(store.pool())
        .await?)
}
