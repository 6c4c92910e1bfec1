//! The read model's multi-statement reads, written once over a [`ReadDialect`].
//!
//! A listing page reads the page's effective rows first and then, for the groups it found, a
//! page of each one's waiters and instances; a session listing reads the sessions and then
//! their filters. Which statements do that, and how their rows decode into the shared row
//! types, is each backend's [`ReadDialect`]: Postgres awaits its statements on the pool or on
//! a transaction; SQLite runs them on the connection its `read` closure holds, so its methods
//! complete on their first poll and `wharf_store::run_ready` drives these functions there.

use wharf_store::{InstanceRecord, StoreError};

use crate::listing::{MemberKeys, PageRows};
use crate::rows::PageKeys;
use crate::session_views::{FilterRow, SessionRow};
use crate::views::{EffectiveRow, WaitingRow};

/// The open waiters and the instances of a page's groups.
pub(crate) type Members = (Vec<WaitingRow>, Vec<InstanceRecord>);

/// A backend's statements for the reads below, each one read, decoded into the shared rows.
pub(crate) trait ReadDialect {
    /// The effective rows of one page of groups ([`crate::rows::page_sql`]'s walk).
    async fn effective_page(&mut self, page: &PageKeys) -> Result<Vec<EffectiveRow>, StoreError>;

    /// A page of the open waiters and of the instances of each of `groups` (never empty),
    /// each page after its key in `keys`.
    async fn members(
        &mut self,
        groups: &[String],
        keys: &MemberKeys,
    ) -> Result<Members, StoreError>;

    /// The managed sessions (the one named, or all), by id.
    async fn sessions(&mut self, id: Option<&str>) -> Result<Vec<SessionRow>, StoreError>;

    /// The managed filters of those sessions, by session and filter.
    async fn filters(&mut self, id: Option<&str>) -> Result<Vec<FilterRow>, StoreError>;
}

/// A page of groups with the first page of each one's members: the effective rows, then the
/// members of the groups found (no member read when none was).
pub(crate) async fn page_rows(
    dialect: &mut impl ReadDialect,
    page: &PageKeys,
    keys: &MemberKeys,
) -> Result<PageRows, StoreError> {
    let effective = dialect.effective_page(page).await?;
    let (waiting, instances) = members_of(dialect, &effective, keys).await?;
    Ok(PageRows {
        effective,
        waiting,
        instances,
    })
}

/// The members of the groups of `effective`, each list after its key in `keys`.
pub(crate) async fn members_of(
    dialect: &mut impl ReadDialect,
    effective: &[EffectiveRow],
    keys: &MemberKeys,
) -> Result<Members, StoreError> {
    if effective.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let groups: Vec<String> = effective.iter().map(|e| e.group.clone()).collect();
    dialect.members(&groups, keys).await
}

/// The managed sessions (one, or all) and then their filters.
pub(crate) async fn session_rows(
    dialect: &mut impl ReadDialect,
    id: Option<&str>,
) -> Result<(Vec<SessionRow>, Vec<FilterRow>), StoreError> {
    let sessions = dialect.sessions(id).await?;
    let filters = dialect.filters(id).await?;
    Ok((sessions, filters))
}

/// The catch-up check: the projector is behind when the log's head is past its checkpoint.
pub(crate) fn behind(head: i64, checkpoint: i64) -> bool {
    head > checkpoint
}
