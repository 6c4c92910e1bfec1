//! Wharf's read side: projections of the ledger and the queries that serve them.
//!
//! - Inline projectors (run in the append transaction): [`EffectiveBindings`], the effective
//!   binding rows that claims read, and each group's effective declaration;
//!   [`ManagedSessions`], each durable MQTT session's exact managed-filter history.
//! - Catch-up projectors (from a durable checkpoint): [`DeclarerAttempts`], the newest attempt
//!   per declarer, from which open waiters are listed.
//! - Reads: [`ReadModel`] lists groups, their waiters and instances, and pages audit history.
//! - Maintenance: rebuild (a replay, see `wharf_store::rebuild`) and the deferred [`prune`].
//!
//! Architecture invariant: projections only read events and write their own tables; nothing
//! here decides anything or appends an event.

pub mod audit;
pub mod declaration;
pub mod error;
mod fused;
pub mod prune;
mod rows;
pub mod session;
pub mod session_views;
pub mod views;

use std::sync::Arc;

use wharf_domain::GroupName;
use wharf_store::{
    PgProjector, Progress, RebuildMode, RebuildReport, SqliteProjector, Store, StoreError,
};

pub use audit::{HistoryEntry, HistoryPage, HistoryQuery};
pub use declaration::{DeclarerAttempts, EffectiveBindings};
pub use error::ProjectionError;
pub use prune::{prune, PruneOptions, PruneReport};
pub use session::ManagedSessions;
pub use session_views::{
    managed_sessions, session_history, ManagedFilterView, ManagedSessionView, SessionHistoryEntry,
};
pub use views::{EffectiveView, GroupView, InstanceView, WaiterView};

/// How many events a catch-up transaction applies at most.
const CATCH_UP_BATCH: i64 = 500;

/// The inline projectors a SQLite store must run.
pub fn sqlite_inline() -> Vec<Arc<dyn SqliteProjector>> {
    vec![Arc::new(EffectiveBindings), Arc::new(ManagedSessions)]
}

/// The inline projectors a Postgres store must run.
pub fn pg_inline() -> Vec<Arc<dyn PgProjector>> {
    vec![Arc::new(EffectiveBindings), Arc::new(ManagedSessions)]
}

fn sqlite_catch_up() -> Vec<Arc<dyn SqliteProjector>> {
    vec![Arc::new(DeclarerAttempts)]
}

fn pg_catch_up() -> Vec<Arc<dyn PgProjector>> {
    vec![Arc::new(DeclarerAttempts)]
}

/// How far one catch-up projector is behind the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectionLag {
    /// The projector's name (its checkpoint key).
    pub projector: &'static str,
    /// Events in the log after its checkpoint.
    pub behind: i64,
}

/// The read model over a store: listing, audit, catch-up, rebuild, prune.
#[derive(Clone)]
pub struct ReadModel {
    store: Store,
    instance_ttl: chrono::Duration,
}

impl ReadModel {
    /// A read model over `store`; instances with a heartbeat older than `instance_ttl` show as
    /// not live.
    pub fn new(store: Store, instance_ttl: std::time::Duration) -> Self {
        Self {
            store,
            instance_ttl: chrono::Duration::from_std(instance_ttl).unwrap_or(chrono::Duration::MAX),
        }
    }

    /// Each known managed MQTT session (one, or all) with its exact history.
    pub async fn managed_sessions(
        &self,
        session_id: Option<&str>,
    ) -> Result<Vec<ManagedSessionView>, StoreError> {
        managed_sessions(&self.store, session_id).await
    }

    /// The store underneath.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The instance TTL: instances (and waiters) whose newest heartbeat (attempt) is older are
    /// not live.
    pub fn instance_ttl(&self) -> std::time::Duration {
        self.instance_ttl
            .to_std()
            .unwrap_or(std::time::Duration::MAX)
    }

    /// Applies every event the catch-up projectors have not seen; returns how many.
    pub async fn catch_up(&self) -> Result<u64, StoreError> {
        let mut applied = 0;
        match &self.store {
            Store::Sqlite(s) => {
                for projector in sqlite_catch_up() {
                    applied += s.catch_up(projector, CATCH_UP_BATCH).await?;
                }
            }
            Store::Postgres(s) => {
                for projector in pg_catch_up() {
                    applied += s.catch_up(projector, CATCH_UP_BATCH).await?;
                }
            }
        }
        Ok(applied)
    }

    /// How far each catch-up projector is behind the log: the events it has not applied yet.
    ///
    /// One indexed count per projector (events after its checkpoint), so it is cheap while the
    /// projector keeps up. It does not catch up: read after [`catch_up`](Self::catch_up) (or a
    /// listing, which catches up first), a value above zero means the projector cannot keep up
    /// or fails.
    pub async fn projection_lag(&self) -> Result<Vec<ProjectionLag>, StoreError> {
        const SQLITE_BEHIND: &str = "SELECT COUNT(*) FROM events WHERE position > COALESCE( \
               (SELECT position FROM projection_checkpoint WHERE projector = ?1), 0)";
        const PG_BEHIND: &str = "SELECT COUNT(*) FROM events WHERE position > COALESCE( \
               (SELECT position FROM projection_checkpoint WHERE projector = $1), 0)";
        let mut lags = Vec::new();
        match &self.store {
            Store::Sqlite(s) => {
                for projector in sqlite_catch_up() {
                    let name = projector.name();
                    let behind = s
                        .read(move |conn| {
                            Ok(conn
                                .prepare_cached(SQLITE_BEHIND)?
                                .query_row([name], |row| row.get::<_, i64>(0))?)
                        })
                        .await?;
                    lags.push(ProjectionLag {
                        projector: name,
                        behind,
                    });
                }
            }
            Store::Postgres(s) => {
                for projector in pg_catch_up() {
                    let name = projector.name();
                    let behind: i64 = sqlx::query_scalar(PG_BEHIND)
                        .bind(name)
                        .fetch_one(s.pool())
                        .await?;
                    lags.push(ProjectionLag {
                        projector: name,
                        behind,
                    });
                }
            }
        }
        Ok(lags)
    }

    /// Every declared group with its effective set, open waiters and instances. Catches up
    /// first, so a caller reads its own writes.
    pub async fn groups(&self) -> Result<Vec<GroupView>, ProjectionError> {
        self.catch_up().await?;
        self.assemble(None).await
    }

    /// One group, or `None` when it was never declared.
    pub async fn group(&self, group: &GroupName) -> Result<Option<GroupView>, ProjectionError> {
        self.catch_up().await?;
        Ok(self
            .assemble(Some(group.to_string()))
            .await?
            .into_iter()
            .next())
    }

    async fn assemble(&self, group: Option<String>) -> Result<Vec<GroupView>, ProjectionError> {
        let (effective, waiting) = match &self.store {
            Store::Sqlite(s) => (
                rows::sqlite_effective(s, group.clone()).await?,
                rows::sqlite_waiting(s, group.clone()).await?,
            ),
            Store::Postgres(s) => (
                rows::pg_effective(s, group.clone()).await?,
                rows::pg_waiting(s, group.clone()).await?,
            ),
        };
        let instances = self.store.instances(group).await?;
        let now = self.store.now().await?;
        Ok(views::assemble(
            effective,
            waiting,
            instances,
            now,
            self.instance_ttl,
        ))
    }

    /// True when the group has an effective declaration. One read of the inline projection,
    /// which is always current: no catch-up, no view assembled.
    pub async fn is_declared(&self, group: &GroupName) -> Result<bool, StoreError> {
        let rows = match &self.store {
            Store::Sqlite(s) => rows::sqlite_effective(s, Some(group.to_string())).await?,
            Store::Postgres(s) => rows::pg_effective(s, Some(group.to_string())).await?,
        };
        Ok(!rows.is_empty())
    }

    /// The group's effective binding rows, as claims read them (empty = whole topic).
    pub async fn effective_bindings(&self, group: &GroupName) -> Result<Vec<String>, StoreError> {
        match &self.store {
            Store::Sqlite(s) => rows::sqlite_bindings(s, group.to_string()).await,
            Store::Postgres(s) => rows::pg_bindings(s, group.to_string()).await,
        }
    }

    /// A page of a group's declaration history from the ledger.
    pub async fn history(&self, query: &HistoryQuery) -> Result<HistoryPage, ProjectionError> {
        audit::history(&self.store, query).await
    }

    /// Rebuilds every projection from the log (or, with Verify, compares without changing).
    /// Refused on a store migrated by a newer build.
    pub async fn rebuild(
        &self,
        mode: RebuildMode,
        progress: Progress,
    ) -> Result<RebuildReport, StoreError> {
        self.store.ensure_not_newer("projections rebuild").await?;
        match &self.store {
            Store::Sqlite(s) => s.rebuild(sqlite_catch_up(), mode, progress).await,
            Store::Postgres(s) => s.rebuild(pg_catch_up(), mode, progress).await,
        }
    }

    /// Runs the deferred pruner once. Refused on a store migrated by a newer build.
    pub async fn prune(&self, options: PruneOptions) -> Result<PruneReport, StoreError> {
        self.store.ensure_not_newer("prune").await?;
        prune::prune(&self.store, options).await
    }
}
