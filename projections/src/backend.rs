//! The seam between the read model and a backend.
//!
//! [`ReadModel`](crate::ReadModel) keeps what is the same on both backends: input checks,
//! paging keys, the catch-up retry of a read that found the projector behind, and building
//! views from rows. It holds one [`ReadBackend`], chosen by [`for_store`], which supplies each
//! read in its own dialect and under its own transaction: the reads of several statements are
//! written once in [`crate::reads`], and the catch-up loops here.
//!
//! Architecture invariant: nothing above this module names a backend; the one place that
//! picks one is [`for_store`].

mod postgres;
mod sqlite;

use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use wharf_store::{Progress, RebuildMode, RebuildReport, Store, StoreError};

use crate::declaration::DeclarerAttempts;
use crate::lease::RawLease;
use crate::listing::{CarriedFigures, MemberKeys, PageRows, Snapshot};
use crate::rows::PageKeys;
use crate::session_views::{FilterRow, SessionRow};
use crate::summary::SummaryRow;
use crate::ProjectionLag;

/// How many events a catch-up transaction applies at most.
const CATCH_UP_BATCH: i64 = 500;

/// What a backend supplies to the read model: each read as one transaction (or one
/// statement) in its dialect.
#[async_trait]
pub(crate) trait ReadBackend: Send + Sync {
    /// Applies every event the catch-up projectors have not seen; how many.
    async fn catch_up(&self) -> Result<u64, StoreError>;

    /// How many events each catch-up projector has not applied yet.
    async fn projection_lag(&self) -> Result<Vec<ProjectionLag>, StoreError>;

    /// Rebuilds every projection from the log (or, with Verify, compares).
    async fn rebuild(
        &self,
        mode: RebuildMode,
        progress: Progress,
    ) -> Result<RebuildReport, StoreError>;

    /// True when a summary page can carry its groups' queue figures in the same read.
    fn carries_figures(&self) -> bool;

    /// One summary page with the catch-up check (and, when asked and carried, the groups'
    /// queue figures); `ttl_micros` decides which instances count as live.
    async fn summaries(
        &self,
        page: &PageKeys,
        ttl_micros: i64,
        figures: bool,
    ) -> Result<Snapshot<Vec<SummaryRow>>, StoreError>;

    /// A page of groups with the first page of each one's members ([`crate::reads::page_rows`]).
    async fn page(&self, page: PageKeys, keys: MemberKeys) -> Result<PageRows, StoreError>;

    /// One group (no rows when never declared) with a page of its members, the store's clock
    /// and the catch-up check, in one snapshot; with `figures` its queue figures where carried.
    async fn group(
        &self,
        group: String,
        keys: &MemberKeys,
        figures: bool,
    ) -> Result<(Snapshot<PageRows>, CarriedFigures), StoreError>;

    /// True when the group has an effective declaration.
    async fn is_declared(&self, group: String) -> Result<bool, StoreError>;

    /// The group's effective binding rows (empty = whole topic).
    async fn bindings(&self, group: String) -> Result<Vec<String>, StoreError>;

    /// The managed sessions (one, or all) and their filters, in one snapshot.
    async fn sessions(
        &self,
        id: Option<String>,
    ) -> Result<(Vec<SessionRow>, Vec<FilterRow>), StoreError>;

    /// The session lease rows (one session's, or all), by session id.
    async fn leases(&self, id: Option<String>) -> Result<Vec<RawLease>, StoreError>;
}

/// The backend of `store`.
pub(crate) fn for_store(store: &Store) -> Arc<dyn ReadBackend> {
    match store {
        Store::Sqlite(s) => Arc::new(sqlite::SqliteBackend { store: s.clone() }),
        Store::Postgres(s) => Arc::new(postgres::PgBackend { store: s.clone() }),
    }
}

/// The catch-up projectors, as the projector type `as_projector` makes of each.
fn catch_up_projectors<P: ?Sized>(
    as_projector: fn(Arc<DeclarerAttempts>) -> Arc<P>,
) -> Vec<Arc<P>> {
    vec![as_projector(Arc::new(DeclarerAttempts))]
}

/// Catches up each of `projectors` in turn with `apply`; how many events in all.
async fn catch_up_each<P: ?Sized, F, Applied>(
    projectors: Vec<Arc<P>>,
    mut apply: F,
) -> Result<u64, StoreError>
where
    F: FnMut(Arc<P>) -> Applied,
    Applied: Future<Output = Result<u64, StoreError>>,
{
    let mut applied = 0;
    for projector in projectors {
        applied += apply(projector).await?;
    }
    Ok(applied)
}

/// The lag of each projector `names` lists, each counted by `behind`.
async fn lag_each<F, Counted>(
    names: Vec<&'static str>,
    mut behind: F,
) -> Result<Vec<ProjectionLag>, StoreError>
where
    F: FnMut(&'static str) -> Counted,
    Counted: Future<Output = Result<i64, StoreError>>,
{
    let mut lags = Vec::with_capacity(names.len());
    for projector in names {
        lags.push(ProjectionLag {
            projector,
            behind: behind(projector).await?,
        });
    }
    Ok(lags)
}
