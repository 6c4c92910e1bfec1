//! The read model on Postgres: its [`ReadDialect`] on the pool or on a transaction, the
//! decoding of Postgres's columns (lists as arrays, times as `timestamptz`) into the shared
//! rows, and the [`ReadBackend`] whose one-statement reads (the summary page, the one-group
//! read) are calls of the functions the migrations install (ADRs 0046, 0065, 0071, 0072).
//! Statements whose plan must follow the values given run unnamed (`persistent(false)`).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgArguments, PgConnection, PgPool, PgRow};
use sqlx::query::QueryAs;
use sqlx::Postgres;
use sqlx::Row;
use wharf_store::event::from_micros;
use wharf_store::{
    GroupFiguresRow, InstanceRecord, PgProjector, PgStore, Progress, RebuildMode, RebuildReport,
    StoreError,
};

use super::{catch_up_each, catch_up_projectors, lag_each, ReadBackend, CATCH_UP_BATCH};
use crate::declaration::DeclarerAttempts;
use crate::group_rows::{decode_group_rows, PG_GROUP_READ_CALL, PG_GROUP_ROWS_CALL};
use crate::lease::{RawLease, LEASE_COLUMNS};
use crate::listing::{CarriedFigures, MemberKeys, PageRows, Snapshot};
use crate::reads::{self, Members, ReadDialect};
use crate::rows::{page_sql, PageKeys, PG_BINDINGS, PG_INSTANCES, PG_IS_DECLARED, PG_WAITERS};
use crate::session_views::{FilterRow, SessionRow, FILTERS_SQL, SESSIONS_SQL};
use crate::summary::{SummaryRow, PG_PAGE_CALL, PG_SUMMARIES_CALL};
use crate::views::{EffectiveRow, WaitingRow};
use crate::ProjectionLag;

/// Events after a projector's checkpoint, bounded on both ends (checkpoint, head): an index
/// range whatever the plan.
const BEHIND_COUNT: &str = "SELECT COUNT(*) FROM events WHERE position > COALESCE( \
       (SELECT position FROM projection_checkpoint WHERE projector = $1), 0) \
       AND position <= (SELECT MAX(position) FROM events)";

/// The column where a summary page row's queue figures start ([`crate::summary::pg_page_sql`]).
const FIGURES_FROM: usize = 22;

/// The read model on a Postgres store.
pub(super) struct PgBackend {
    pub store: PgStore,
}

/// Where the dialect's statements run: the pool (each statement on whichever connection it
/// gets) or one transaction's connection.
enum PgOn<'a> {
    Pool(&'a PgPool),
    Connection(&'a mut PgConnection),
}

/// The read model's statements on Postgres, run on `on`.
struct PgReads<'a> {
    on: PgOn<'a>,
}

impl PgReads<'_> {
    /// Runs `query` where the dialect's statements run; every row it answers.
    async fn fetch_all<T>(
        &mut self,
        query: QueryAs<'_, Postgres, T, PgArguments>,
    ) -> Result<Vec<T>, StoreError>
    where
        T: Send + Unpin + for<'r> sqlx::FromRow<'r, PgRow>,
    {
        Ok(match &mut self.on {
            PgOn::Pool(pool) => query.fetch_all(*pool).await?,
            PgOn::Connection(conn) => query.fetch_all(&mut **conn).await?,
        })
    }
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

fn effective_row(r: PgEffective) -> EffectiveRow {
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

/// The effective row of `group` from a summary row's columns 4 to 12 (topic, declarer,
/// version, patterns, previous, declared and attempt times, position, installs), after the
/// clock, the head and the checkpoint (0-2) and the group's name (3).
fn effective_columns(row: &PgRow, group: String) -> Result<EffectiveRow, StoreError> {
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

/// The summary page's rows ([`crate::summary::pg_summary_sql`], with `figures`
/// [`crate::summary::pg_page_sql`]): the first row's clock and catch-up check, then one row
/// per group (none on an empty page).
fn decode_summaries(
    rows: Vec<PgRow>,
    figures: bool,
) -> Result<Snapshot<Vec<SummaryRow>>, StoreError> {
    let first = rows
        .first()
        .ok_or_else(|| StoreError::decode(0, "the listing statement answered no row"))?;
    let now: DateTime<Utc> = first.try_get(0)?;
    let (head, checkpoint): (i64, i64) = (first.try_get(1)?, first.try_get(2)?);
    let mut out = Vec::with_capacity(rows.len());
    for row in &rows {
        let Some(group) = row.try_get::<Option<String>, _>(3)? else {
            continue;
        };
        let effective = effective_columns(row, group.clone())?;
        let oldest = match row.try_get::<Option<String>, _>(14)? {
            Some(declarer) => Some(WaitingRow {
                group,
                declarer,
                version: row.try_get(15)?,
                patterns: row.try_get(16)?,
                incumbent: row
                    .try_get::<Option<Vec<String>>, _>(17)?
                    .unwrap_or_default(),
                declared_at: row.try_get(18)?,
                attempt_at: row.try_get(19)?,
            }),
            None => None,
        };
        out.push(SummaryRow {
            effective,
            waiters: row.try_get(13)?,
            oldest,
            instances: row.try_get(20)?,
            live: row.try_get(21)?,
            figures: if figures {
                GroupFiguresRow::from_pg(row, FIGURES_FROM)?
            } else {
                None
            },
        });
    }
    Ok(Snapshot {
        rows: out,
        now,
        behind: reads::behind(head, checkpoint),
    })
}

/// The waiter key as Postgres binds it: NULLs to read from the first.
fn waiter_key(keys: &MemberKeys) -> (Option<DateTime<Utc>>, Option<String>) {
    keys.waiters_after
        .clone()
        .map(|(at, declarer)| (Some(from_micros(at)), Some(declarer)))
        .unwrap_or((None, None))
}

impl ReadDialect for PgReads<'_> {
    async fn effective_page(&mut self, page: &PageKeys) -> Result<Vec<EffectiveRow>, StoreError> {
        let sql = page_sql('$', page.topic.is_some(), page.waiting);
        let mut query = sqlx::query_as::<_, PgEffective>(&sql)
            .bind(&page.after)
            .bind(page.fetch);
        if let Some(topic) = &page.topic {
            query = query.bind(topic);
        }
        let rows = self.fetch_all(query.persistent(false)).await?;
        Ok(rows.into_iter().map(effective_row).collect())
    }

    /// Two statements for all the groups at once ([`PG_WAITERS`], [`PG_INSTANCES`]).
    async fn members(
        &mut self,
        groups: &[String],
        keys: &MemberKeys,
    ) -> Result<Members, StoreError> {
        let (after_at, after_declarer) = waiter_key(keys);
        let waiting: Vec<PgWaiting> = self
            .fetch_all(
                sqlx::query_as(PG_WAITERS)
                    .bind(groups)
                    .bind(after_at)
                    .bind(after_declarer)
                    .bind(keys.fetch)
                    .persistent(false),
            )
            .await?;
        let instances: Vec<PgInstance> = self
            .fetch_all(
                sqlx::query_as(PG_INSTANCES)
                    .bind(groups)
                    .bind(&keys.instances_after)
                    .bind(keys.fetch)
                    .persistent(false),
            )
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

    async fn sessions(&mut self, id: Option<&str>) -> Result<Vec<SessionRow>, StoreError> {
        let sql = SESSIONS_SQL.replace("{id}", "$1::text");
        self.fetch_all(sqlx::query_as(&sql).bind(id)).await
    }

    async fn filters(&mut self, id: Option<&str>) -> Result<Vec<FilterRow>, StoreError> {
        let sql = FILTERS_SQL.replace("{id}", "$1::text");
        self.fetch_all(sqlx::query_as(&sql).bind(id)).await
    }
}

#[async_trait]
impl ReadBackend for PgBackend {
    async fn catch_up(&self) -> Result<u64, StoreError> {
        let projectors = catch_up_projectors::<dyn PgProjector>(|p| p);
        catch_up_each(projectors, |p| self.store.catch_up(p, CATCH_UP_BATCH)).await
    }

    async fn projection_lag(&self) -> Result<Vec<ProjectionLag>, StoreError> {
        let projectors = catch_up_projectors::<dyn PgProjector>(|p| p);
        let names = projectors.iter().map(|p| p.name()).collect();
        lag_each(names, |name| async move {
            Ok(sqlx::query_scalar(BEHIND_COUNT)
                .bind(name)
                .persistent(false)
                .fetch_one(self.store.pool())
                .await?)
        })
        .await
    }

    async fn rebuild(
        &self,
        mode: RebuildMode,
        progress: Progress,
    ) -> Result<RebuildReport, StoreError> {
        let projectors = catch_up_projectors::<dyn PgProjector>(|p| p);
        self.store.rebuild(projectors, mode, progress).await
    }

    fn carries_figures(&self) -> bool {
        true
    }

    /// One statement: the call of `wharf_group_summaries` (with `figures`, `wharf_group_page`),
    /// which each connection prepares once (ADR 0046); the function plans the page's statement
    /// once per connection, by key whatever the statistics (ADR 0058).
    async fn summaries(
        &self,
        page: &PageKeys,
        ttl_micros: i64,
        figures: bool,
    ) -> Result<Snapshot<Vec<SummaryRow>>, StoreError> {
        let call = if figures {
            PG_PAGE_CALL
        } else {
            PG_SUMMARIES_CALL
        };
        let rows = sqlx::query(call)
            .bind(&page.after)
            .bind(page.fetch)
            .bind(&page.topic)
            .bind(page.waiting)
            .bind(DeclarerAttempts::NAME)
            .bind(ttl_micros)
            .fetch_all(self.store.pool())
            .await?;
        decode_summaries(rows, figures)
    }

    async fn page(&self, page: PageKeys, keys: MemberKeys) -> Result<PageRows, StoreError> {
        reads::page_rows(
            &mut PgReads {
                on: PgOn::Pool(self.store.pool()),
            },
            &page,
            &keys,
        )
        .await
    }

    /// One statement: the call of `wharf_group_rows` (with `figures`, `wharf_group_read`),
    /// which each connection prepares once (ADR 0046); the function plans its statement once
    /// per connection, by key whatever the statistics (ADR 0058).
    async fn group(
        &self,
        group: String,
        keys: &MemberKeys,
        figures: bool,
    ) -> Result<(Snapshot<PageRows>, CarriedFigures), StoreError> {
        let (after_at, after_declarer) = waiter_key(keys);
        let call = if figures {
            PG_GROUP_READ_CALL
        } else {
            PG_GROUP_ROWS_CALL
        };
        let found = sqlx::query(call)
            .bind(&group)
            .bind(after_at)
            .bind(after_declarer)
            .bind(keys.fetch)
            .bind(&keys.instances_after)
            .bind(DeclarerAttempts::NAME)
            .fetch_all(self.store.pool())
            .await?;
        let (read, carried) = decode_group_rows(found, figures)?;
        let carried = if figures {
            CarriedFigures::Read(carried.map(|row| (group, row)).into_iter().collect())
        } else {
            CarriedFigures::NotRead
        };
        Ok((read, carried))
    }

    /// [`PG_IS_DECLARED`].
    async fn is_declared(&self, group: String) -> Result<bool, StoreError> {
        Ok(sqlx::query_scalar(PG_IS_DECLARED)
            .bind(group)
            .fetch_one(self.store.pool())
            .await?)
    }

    /// [`PG_BINDINGS`].
    async fn bindings(&self, group: String) -> Result<Vec<String>, StoreError> {
        Ok(sqlx::query_scalar(PG_BINDINGS)
            .bind(group)
            .fetch_all(self.store.pool())
            .await?)
    }

    /// One `REPEATABLE READ READ ONLY` transaction, so the sessions and their filters are one
    /// snapshot.
    async fn sessions(
        &self,
        id: Option<String>,
    ) -> Result<(Vec<SessionRow>, Vec<FilterRow>), StoreError> {
        let mut tx = self.store.pool().begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .execute(&mut *tx)
            .await?;
        let rows = reads::session_rows(
            &mut PgReads {
                on: PgOn::Connection(&mut tx),
            },
            id.as_deref(),
        )
        .await?;
        tx.commit().await?;
        Ok(rows)
    }

    async fn leases(&self, id: Option<String>) -> Result<Vec<RawLease>, StoreError> {
        Ok(sqlx::query_as(&format!(
            "SELECT {LEASE_COLUMNS} FROM session_lease \
             WHERE $1::text IS NULL OR session_id = $1 ORDER BY session_id"
        ))
        .bind(&id)
        .fetch_all(self.store.pool())
        .await?)
    }
}
