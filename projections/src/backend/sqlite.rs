//! The read model on SQLite: its [`ReadDialect`] over a reader connection, the decoding of
//! SQLite's columns (lists as JSON text, times as microseconds) into the shared rows, and the
//! [`ReadBackend`] that opens each read on a reader (inside an explicit deferred transaction
//! where the read must be one snapshot). Every statement completes at once, so the shared
//! reads run inside the `read` closure through `run_ready`.

use async_trait::async_trait;
use rusqlite::{params, Connection, TransactionBehavior};
use wharf_store::event::from_micros;
use wharf_store::{
    run_ready, InstanceRecord, Progress, RebuildMode, RebuildReport, SqliteProjector, SqliteStore,
    StoreError,
};

use super::{catch_up_each, catch_up_projectors, lag_each, ReadBackend, CATCH_UP_BATCH};
use crate::declaration::DeclarerAttempts;
use crate::lease::{RawLease, LEASE_COLUMNS};
use crate::listing::{CarriedFigures, MemberKeys, PageRows, Snapshot};
use crate::reads::{self, Members, ReadDialect};
use crate::rows::{one_sql, page_sql, PageKeys, SQLITE_INSTANCES, SQLITE_WAITERS};
use crate::session_views::{FilterRow, SessionRow, FILTERS_SQL, SESSIONS_SQL};
use crate::summary::{sqlite_summary_sql, SummaryRow};
use crate::views::{EffectiveRow, WaitingRow};
use crate::ProjectionLag;

/// Events after a projector's checkpoint, bounded on both ends (checkpoint, head): an index
/// range whatever the plan.
const BEHIND_COUNT: &str = "SELECT COUNT(*) FROM events WHERE position > COALESCE( \
       (SELECT position FROM projection_checkpoint WHERE projector = ?1), 0) \
       AND position <= (SELECT MAX(position) FROM events)";

/// The read model on a SQLite store.
pub(super) struct SqliteBackend {
    pub store: SqliteStore,
}

/// The read model's statements on one SQLite connection (or a transaction on it).
struct SqliteReads<'c> {
    conn: &'c Connection,
}

fn parse_list(text: &str) -> Result<Vec<String>, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::decode(0, e))
}

/// A waiting attempt's columns as SQLite stores them: declarer, version, patterns and incumbent
/// (JSON text), first statement and newest attempt (microseconds).
type RawWaiter = (String, String, String, Option<String>, i64, i64);

/// A waiting attempt of `group`, its lists and times decoded.
fn waiting_row(group: String, raw: RawWaiter) -> Result<WaitingRow, StoreError> {
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

/// An effective row as SQLite stores it, before its lists and times are decoded.
struct RawEffective {
    names: (String, String, String, String),
    sets: (String, Option<String>),
    times: (i64, i64),
    counts: (i64, i64),
}

/// The effective row from a page row's first ten columns.
fn effective_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawEffective> {
    Ok(RawEffective {
        names: (r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?),
        sets: (r.get(4)?, r.get(5)?),
        times: (r.get(6)?, r.get(7)?),
        counts: (r.get(8)?, r.get(9)?),
    })
}

impl RawEffective {
    fn decode(self) -> Result<EffectiveRow, StoreError> {
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

/// A summary row as SQLite answers it, before its lists and times are decoded.
struct RawSummary {
    effective: RawEffective,
    waiters: i64,
    oldest: Option<RawWaiter>,
    instances: i64,
    live: i64,
}

/// A row of [`sqlite_summary_sql`]: the effective row, then the summary's columns 10 to 18.
fn summary_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawSummary> {
    let oldest = match r.get::<_, Option<String>>(11)? {
        Some(declarer) => Some((
            declarer,
            r.get(12)?,
            r.get(13)?,
            r.get(14)?,
            r.get(15)?,
            r.get(16)?,
        )),
        None => None,
    };
    Ok(RawSummary {
        effective: effective_row(r)?,
        waiters: r.get(10)?,
        oldest,
        instances: r.get(17)?,
        live: r.get(18)?,
    })
}

impl RawSummary {
    fn decode(self) -> Result<SummaryRow, StoreError> {
        let effective = self.effective.decode()?;
        let oldest = self
            .oldest
            .map(|raw| waiting_row(effective.group.clone(), raw))
            .transpose()?;
        Ok(SummaryRow {
            effective,
            waiters: self.waiters,
            oldest,
            instances: self.instances,
            live: self.live,
            figures: None,
        })
    }
}

impl SqliteReads<'_> {
    /// The catch-up check, on the connection's snapshot.
    fn behind(&self) -> Result<bool, StoreError> {
        let (head, checkpoint) = self
            .conn
            .prepare_cached(wharf_store::sqlite::CATCH_UP_CHECK)?
            .query_row([DeclarerAttempts::NAME], |row| {
                Ok((row.get::<_, i64>(0)?, row.get::<_, i64>(1)?))
            })?;
        Ok(reads::behind(head, checkpoint))
    }

    /// The effective row of `group` ([`one_sql`]; none when it was never declared).
    fn effective_one(&self, group: &str) -> Result<Vec<EffectiveRow>, StoreError> {
        self.conn
            .prepare_cached(&one_sql('?'))?
            .query_map([group], effective_row)?
            .map(|row| row?.decode())
            .collect()
    }
}

impl ReadDialect for SqliteReads<'_> {
    async fn effective_page(&mut self, page: &PageKeys) -> Result<Vec<EffectiveRow>, StoreError> {
        let sql = page_sql('?', page.topic.is_some(), page.waiting);
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let rows = match &page.topic {
            Some(topic) => stmt.query_map(params![page.after, page.fetch, topic], effective_row)?,
            None => stmt.query_map(params![page.after, page.fetch], effective_row)?,
        };
        rows.map(|row| row?.decode()).collect()
    }

    /// One statement per group and list ([`SQLITE_WAITERS`], [`SQLITE_INSTANCES`]), group by
    /// group.
    async fn members(
        &mut self,
        groups: &[String],
        keys: &MemberKeys,
    ) -> Result<Members, StoreError> {
        let (after_at, after_declarer) = keys
            .waiters_after
            .clone()
            .unwrap_or((i64::MIN, String::new()));
        let mut waiting = Vec::new();
        let mut instances = Vec::new();
        let mut waiters = self.conn.prepare_cached(SQLITE_WAITERS)?;
        let mut members = self.conn.prepare_cached(SQLITE_INSTANCES)?;
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
                waiting.push(waiting_row(group, raw)?);
            }
            let rows =
                members.query_map(params![group, keys.instances_after, keys.fetch], |r| {
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

    async fn sessions(&mut self, id: Option<&str>) -> Result<Vec<SessionRow>, StoreError> {
        let mut sessions = self
            .conn
            .prepare_cached(&SESSIONS_SQL.replace("{id}", "?1"))?;
        let rows = sessions
            .query_map([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
            .collect::<Result<Vec<SessionRow>, _>>()?;
        Ok(rows)
    }

    async fn filters(&mut self, id: Option<&str>) -> Result<Vec<FilterRow>, StoreError> {
        let mut filters = self
            .conn
            .prepare_cached(&FILTERS_SQL.replace("{id}", "?1"))?;
        let rows = filters
            .query_map([id], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                    r.get(6)?,
                    r.get(7)?,
                ))
            })?
            .collect::<Result<Vec<FilterRow>, _>>()?;
        Ok(rows)
    }
}

#[async_trait]
impl ReadBackend for SqliteBackend {
    async fn catch_up(&self) -> Result<u64, StoreError> {
        let projectors = catch_up_projectors::<dyn SqliteProjector>(|p| p);
        catch_up_each(projectors, |p| self.store.catch_up(p, CATCH_UP_BATCH)).await
    }

    async fn projection_lag(&self) -> Result<Vec<ProjectionLag>, StoreError> {
        let projectors = catch_up_projectors::<dyn SqliteProjector>(|p| p);
        let names = projectors.iter().map(|p| p.name()).collect();
        lag_each(names, |name| {
            self.store.read(move |conn| {
                Ok(conn
                    .prepare_cached(BEHIND_COUNT)?
                    .query_row([name], |row| row.get::<_, i64>(0))?)
            })
        })
        .await
    }

    async fn rebuild(
        &self,
        mode: RebuildMode,
        progress: Progress,
    ) -> Result<RebuildReport, StoreError> {
        let projectors = catch_up_projectors::<dyn SqliteProjector>(|p| p);
        self.store.rebuild(projectors, mode, progress).await
    }

    fn carries_figures(&self) -> bool {
        false
    }

    /// One deferred read transaction: the catch-up check, then [`sqlite_summary_sql`]; the
    /// clock is the store's, read before.
    async fn summaries(
        &self,
        page: &PageKeys,
        ttl_micros: i64,
        _figures: bool,
    ) -> Result<Snapshot<Vec<SummaryRow>>, StoreError> {
        let now = self.store.now().await?;
        let live_after = now.timestamp_micros().saturating_sub(ttl_micros);
        let page = page.clone();
        self.store
            .read(move |conn| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Deferred)?;
                let behind = SqliteReads { conn: &tx }.behind()?;
                let raw = {
                    let mut stmt =
                        tx.prepare_cached(&sqlite_summary_sql(page.topic.is_some(), page.waiting))?;
                    let rows = stmt.query_map(
                        params![page.after, page.fetch, page.topic, live_after],
                        summary_row,
                    )?;
                    rows.collect::<Result<Vec<_>, _>>()?
                };
                tx.commit()?;
                let rows = raw
                    .into_iter()
                    .map(RawSummary::decode)
                    .collect::<Result<_, _>>()?;
                Ok(Snapshot { rows, now, behind })
            })
            .await
    }

    async fn page(&self, page: PageKeys, keys: MemberKeys) -> Result<PageRows, StoreError> {
        self.store
            .read(move |conn| run_ready(reads::page_rows(&mut SqliteReads { conn }, &page, &keys)))
            .await
    }

    /// One deferred read transaction: the catch-up check, the group's effective row, then its
    /// members; the clock is the store's, read before. No queue figures.
    async fn group(
        &self,
        group: String,
        keys: &MemberKeys,
        _figures: bool,
    ) -> Result<(Snapshot<PageRows>, CarriedFigures), StoreError> {
        let now = self.store.now().await?;
        let keys = keys.clone();
        let read = self
            .store
            .read(move |conn| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Deferred)?;
                let mut reads = SqliteReads { conn: &tx };
                let behind = reads.behind()?;
                let effective = reads.effective_one(&group)?;
                let (waiting, instances) =
                    run_ready(reads::members_of(&mut reads, &effective, &keys))?;
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
            .await?;
        Ok((read, CarriedFigures::NotRead))
    }

    async fn is_declared(&self, group: String) -> Result<bool, StoreError> {
        self.store
            .read(move |conn| {
                Ok(conn
                    .prepare_cached(
                        "SELECT EXISTS (SELECT 1 FROM effective_declaration WHERE group_name = ?1)",
                    )?
                    .query_row([group], |r| r.get::<_, bool>(0))?)
            })
            .await
    }

    /// From the `binding` view over the effective declaration's patterns (ADR 0064).
    async fn bindings(&self, group: String) -> Result<Vec<String>, StoreError> {
        self.store
            .read(move |conn| {
                let mut stmt = conn.prepare_cached(
                    "SELECT pattern FROM binding WHERE group_name = ?1 ORDER BY pattern",
                )?;
                let rows = stmt.query_map([group], |r| r.get::<_, String>(0))?;
                Ok(rows.collect::<Result<Vec<_>, _>>()?)
            })
            .await
    }

    async fn sessions(
        &self,
        id: Option<String>,
    ) -> Result<(Vec<SessionRow>, Vec<FilterRow>), StoreError> {
        self.store
            .read(move |conn| {
                run_ready(reads::session_rows(
                    &mut SqliteReads { conn },
                    id.as_deref(),
                ))
            })
            .await
    }

    async fn leases(&self, id: Option<String>) -> Result<Vec<RawLease>, StoreError> {
        self.store
            .read(move |conn| {
                let sql = format!(
                    "SELECT {LEASE_COLUMNS} FROM session_lease \
                     WHERE ?1 IS NULL OR session_id = ?1 ORDER BY session_id"
                );
                let mut statement = conn.prepare_cached(&sql)?;
                let rows = statement
                    .query_map([&id], |r| {
                        let micros: Option<i64> = r.get(4)?;
                        Ok((
                            r.get(0)?,
                            r.get(1)?,
                            r.get(2)?,
                            r.get(3)?,
                            micros.and_then(chrono::DateTime::from_timestamp_micros),
                            r.get(5)?,
                            r.get(6)?,
                        ))
                    })?
                    .collect::<Result<Vec<RawLease>, _>>()?;
                Ok(rows)
            })
            .await
    }
}
