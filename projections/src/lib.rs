//! Wharf's read side: projections of the ledger and the queries that serve them.
//!
//! - Inline projectors (run in the append transaction): [`EffectiveBindings`], each group's
//!   effective declaration, whose patterns claims read (the `binding` view unnests them);
//!   [`OpenWaitRows`], each group's open waits, which the register decision reads by key (ADR
//!   0049);
//!   [`ManagedSessions`], each durable MQTT session's exact managed-filter history;
//!   [`SessionLeases`], each exclusive session's HA lease (read by the fencing guard).
//! - Catch-up projectors (from a durable checkpoint): [`DeclarerAttempts`], the newest attempt
//!   per declarer, from which open waiters are listed.
//! - Reads: [`ReadModel`] lists groups, their waiters and instances, and pages audit history.
//! - Maintenance: rebuild (a replay, see `wharf_store::rebuild`), the group snapshots'
//!   re-derivation and verification ([`snapshots`]), and the deferred [`prune`] (the store's
//!   ledger maintenance, run with the rules that name what is superseded).
//!
//! Architecture invariant: projections only read events and write their own tables; nothing
//! here decides anything or appends an event.

pub mod audit;
mod backend;
pub mod cursor;
pub mod declaration;
pub mod error;
mod group_rows;
pub mod lease;
pub mod listing;
pub mod open_waits;
#[cfg(feature = "openapi")]
pub mod openapi;
pub mod prune;
mod reads;
mod rfc3339;
pub mod rows;
pub mod session;
pub mod session_views;
pub mod snapshots;
pub mod summary;
pub mod views;
mod walks;

use std::sync::Arc;

use backend::ReadBackend;
use listing::{MemberKeys, MAX_PAGE};
use wharf_domain::GroupName;
use wharf_store::{
    PgProjector, Progress, RebuildMode, RebuildReport, SqliteProjector, Store, StoreError,
};

pub use audit::{HistoryEntry, HistoryPage, HistoryQuery};
pub use cursor::{GroupCursor, InstanceCursor, WaiterCursor};
pub use declaration::{DeclarerAttempts, EffectiveBindings};
pub use error::ProjectionError;
pub use lease::{session_leases, LeaseRow, SessionLeases};
pub use listing::{CarriedFigures, GroupPage, GroupQuery, MemberQuery};
pub use open_waits::OpenWaitRows;
pub use prune::{prune, PruneOptions, PruneReport};
pub use session::ManagedSessions;
pub use session_views::{
    managed_sessions, session_history, session_stream_history, ManagedFilterView,
    ManagedSessionView, SessionHistoryEntry, SessionStream,
};
pub use snapshots::{SnapshotFinding, SnapshotReport};
pub use summary::{GroupSummary, MemberCount, SummaryPage};
pub use views::{EffectiveView, GroupView, InstanceView, WaiterView};

/// The member page of reads that list every waiter and instance.
const MEMBERS_ALL: u32 = u32::MAX - 1;

/// The inline projectors a SQLite store must run.
pub fn sqlite_inline() -> Vec<Arc<dyn SqliteProjector>> {
    vec![
        Arc::new(EffectiveBindings),
        Arc::new(OpenWaitRows),
        Arc::new(ManagedSessions),
        Arc::new(SessionLeases),
    ]
}

/// The inline projectors a Postgres store must run.
pub fn pg_inline() -> Vec<Arc<dyn PgProjector>> {
    vec![
        Arc::new(EffectiveBindings),
        Arc::new(OpenWaitRows),
        Arc::new(ManagedSessions),
        Arc::new(SessionLeases),
    ]
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
    /// The store's backend, chosen once.
    backend: Arc<dyn ReadBackend>,
    instance_ttl: chrono::Duration,
}

impl ReadModel {
    /// A read model over `store`; instances with a heartbeat older than `instance_ttl` show as
    /// not live.
    pub fn new(store: Store, instance_ttl: std::time::Duration) -> Self {
        Self {
            backend: backend::for_store(&store),
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
        self.backend.catch_up().await
    }

    /// How far each catch-up projector is behind the log: the events it has not applied yet.
    ///
    /// One indexed count per projector (events after its checkpoint), so it is cheap while the
    /// projector keeps up. It does not catch up: read after [`catch_up`](Self::catch_up) (or a
    /// listing, which catches up first), a value above zero means the projector cannot keep up
    /// or fails.
    pub async fn projection_lag(&self) -> Result<Vec<ProjectionLag>, StoreError> {
        self.backend.projection_lag().await
    }

    /// Every declared group with all its open waiters and instances, by name. Catches up
    /// first, so a caller reads its own writes. Reads page by page (see
    /// [`groups_page`](Self::groups_page)); a caller serving clients should page instead.
    pub async fn groups(&self) -> Result<Vec<GroupView>, ProjectionError> {
        self.catch_up().await?;
        let mut all = Vec::new();
        let mut after = String::new();
        loop {
            let page = rows::PageKeys {
                after,
                fetch: i64::from(MAX_PAGE) + 1,
                topic: None,
                waiting: false,
            };
            let page = self.read_page(page, MEMBERS_ALL).await?;
            all.extend(page.groups);
            if page.next_after.is_none() {
                return Ok(all);
            }
            after = all.last().map(|g| g.group.clone()).unwrap_or_default();
        }
    }

    /// One page of the group listing: groups by name after the cursor, filtered, each as a
    /// summary (its effective declaration, bounded counts of its waiters and instances, its
    /// oldest waiter; see [`summary`]). One read (on Postgres one statement) that also
    /// answers the catch-up check; when the projector was behind, it catches up and reads
    /// again, so a caller reads its own writes.
    pub async fn groups_page(&self, query: &GroupQuery) -> Result<SummaryPage, ProjectionError> {
        Ok(self.read_groups_page(query, false).await?.0)
    }

    /// [`Self::groups_page`] with the listed groups' queue figures where the same statement
    /// can carry them (Postgres, `wharf_group_page`, ADR 0072): the API's page, one snapshot
    /// and one round trip instead of two. On SQLite the figures are
    /// [`CarriedFigures::NotRead`].
    pub async fn groups_page_with_figures(
        &self,
        query: &GroupQuery,
    ) -> Result<(SummaryPage, CarriedFigures), ProjectionError> {
        self.read_groups_page(query, true).await
    }

    async fn read_groups_page(
        &self,
        query: &GroupQuery,
        figures: bool,
    ) -> Result<(SummaryPage, CarriedFigures), ProjectionError> {
        query.validate()?;
        let page = rows::PageKeys {
            after: query
                .after
                .as_ref()
                .map_or(String::new(), |c| c.0.to_string()),
            fetch: i64::from(query.limit) + 1,
            topic: query.topic.as_ref().map(ToString::to_string),
            waiting: query.waiting,
        };
        let mut read = self.read_summaries(&page, figures).await?;
        if read.behind {
            self.catch_up().await?;
            read = self.read_summaries(&page, figures).await?;
        }
        let carried = if figures && self.backend.carries_figures() {
            CarriedFigures::Read(summary::take_figures(&mut read, query.limit))
        } else {
            CarriedFigures::NotRead
        };
        Ok((summary::page(read, query.limit), carried))
    }

    /// The instance TTL in microseconds, at most a thousand years (a longer one would not fit
    /// a Postgres interval; every heartbeat is that fresh anyway).
    fn ttl_micros(&self) -> i64 {
        const THOUSAND_YEARS: i64 = 1_000 * 366 * 24 * 3_600 * 1_000_000;
        self.instance_ttl
            .num_microseconds()
            .unwrap_or(i64::MAX)
            .min(THOUSAND_YEARS)
    }

    async fn read_summaries(
        &self,
        page: &rows::PageKeys,
        figures: bool,
    ) -> Result<summary::Snapshot<Vec<summary::SummaryRow>>, StoreError> {
        self.backend
            .summaries(page, self.ttl_micros(), figures)
            .await
    }

    async fn read_page(
        &self,
        page: rows::PageKeys,
        members: u32,
    ) -> Result<GroupPage, ProjectionError> {
        let limit = (page.fetch - 1) as u32;
        let keys = MemberKeys::first(members);
        let rows = self.backend.page(page, keys).await?;
        let now = self.store.now().await?;
        Ok(listing::page(rows, limit, members, now, self.instance_ttl))
    }

    /// One group with all its waiters and instances, or `None` when it was never declared.
    pub async fn group(&self, group: &GroupName) -> Result<Option<GroupView>, ProjectionError> {
        let read = self
            .read_group(group, MemberKeys::first(MEMBERS_ALL), MEMBERS_ALL, false)
            .await?;
        Ok(read.map(|(view, _)| view))
    }

    /// One group with a page of its waiters and a page of its instances (each from its own
    /// cursor), or `None` when it was never declared. One read (on Postgres one statement)
    /// that also answers the catch-up check; when the projector was behind, it catches up and
    /// reads again.
    pub async fn group_members(
        &self,
        group: &GroupName,
        query: &MemberQuery,
    ) -> Result<Option<GroupView>, ProjectionError> {
        query.validate()?;
        let read = self
            .read_group(group, MemberKeys::new(query), query.limit, false)
            .await?;
        Ok(read.map(|(view, _)| view))
    }

    /// [`Self::group_members`] with the group's queue figures where the same statement can
    /// carry them (Postgres, `wharf_group_read`, ADR 0071): the API's one-group read, one
    /// round trip instead of two. On SQLite the figures are [`CarriedFigures::NotRead`].
    pub async fn group_members_with_figures(
        &self,
        group: &GroupName,
        query: &MemberQuery,
    ) -> Result<Option<(GroupView, CarriedFigures)>, ProjectionError> {
        query.validate()?;
        self.read_group(group, MemberKeys::new(query), query.limit, true)
            .await
    }

    async fn read_group(
        &self,
        group: &GroupName,
        keys: MemberKeys,
        members: u32,
        figures: bool,
    ) -> Result<Option<(GroupView, CarriedFigures)>, ProjectionError> {
        let (mut read, mut carried) = self.read_group_once(group, &keys, figures).await?;
        if read.behind {
            self.catch_up().await?;
            (read, carried) = self.read_group_once(group, &keys, figures).await?;
        }
        let view = listing::page(read.rows, 1, members, read.now, self.instance_ttl)
            .groups
            .into_iter()
            .next();
        Ok(view.map(|view| (view, carried)))
    }

    async fn read_group_once(
        &self,
        group: &GroupName,
        keys: &MemberKeys,
        figures: bool,
    ) -> Result<(summary::Snapshot<listing::PageRows>, CarriedFigures), StoreError> {
        self.backend.group(group.to_string(), keys, figures).await
    }

    /// True when the group has an effective declaration. One read of the inline projection,
    /// which is always current: no catch-up, no view assembled.
    pub async fn is_declared(&self, group: &GroupName) -> Result<bool, StoreError> {
        self.backend.is_declared(group.to_string()).await
    }

    /// The group's effective binding rows, as claims read them (empty = whole topic).
    pub async fn effective_bindings(&self, group: &GroupName) -> Result<Vec<String>, StoreError> {
        self.backend.bindings(group.to_string()).await
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
        self.backend.rebuild(mode, progress).await
    }

    /// Replaces every group snapshot with one re-derived from the events, for each group with
    /// at least `min_events` events (ADR 0034); returns how many were written. A rebuild runs
    /// it after the projections. Refused on a store migrated by a newer build.
    pub async fn rederive_snapshots(&self, min_events: u64) -> Result<u64, StoreError> {
        self.store.ensure_not_newer("projections rebuild").await?;
        snapshots::rederive(&self.store, min_events).await
    }

    /// Checks every group snapshot against its group's events (ADR 0034); changes nothing.
    pub async fn verify_snapshots(&self) -> Result<SnapshotReport, StoreError> {
        snapshots::verify(&self.store).await
    }

    /// Runs the deferred pruner once: the store's ledger maintenance with [`prune::RULES`]
    /// (ADR 0075). Refused on a store migrated by a newer build.
    pub async fn prune(&self, options: PruneOptions) -> Result<PruneReport, StoreError> {
        prune::prune(&self.store, options).await
    }
}
