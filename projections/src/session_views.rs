//! Reading the managed-session projection: each durable session identity's exact history, as
//! the listing API and `wharf sessions list/show` show it.

use serde::Serialize;
use wharf_store::{Store, StoreError};

/// One filter that may exist at the broker for a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = ManagedFilter))]
pub struct ManagedFilterView {
    /// The exact filter, shared forms included.
    pub filter: String,
    /// `seeded`, `remembered` (SUBSCRIBE sent or about to be), `granted` or `refused`.
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = String, schema_with = crate::openapi::filter_state)
    )]
    pub state: String,
    /// The QoS last requested (none for a seeded filter never subscribed by Wharf).
    #[cfg_attr(feature = "openapi", schema(required = true, minimum = 0, maximum = 2))]
    pub requested_qos: Option<i16>,
    /// The QoS the broker granted, for `granted`.
    #[cfg_attr(feature = "openapi", schema(required = true, minimum = 0, maximum = 2))]
    pub granted_qos: Option<i16>,
    /// The SUBACK reason code, for `refused`.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub reason_code: Option<i16>,
    /// The ledger position that first put it in the history.
    pub since_position: i64,
    /// The ledger position of its newest change.
    pub updated_position: i64,
}

/// A session whose history is known (its baseline was seeded).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = ManagedSession))]
pub struct ManagedSessionView {
    /// The durable session identity (`ms-...`).
    pub session_id: String,
    /// Who seeded the baseline (`cli`, `init`, `builder`, ...).
    pub baseline_source: String,
    /// Why the session requires a managed-filter migration, when it does (terminal).
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub migration_required: Option<String>,
    /// The ledger position of its newest event.
    pub last_position: i64,
    /// Its history, by filter.
    pub filters: Vec<ManagedFilterView>,
}

/// A managed session's row: id, baseline source, migration required, last position.
pub(crate) type SessionRow = (String, String, Option<String>, i64);
/// A managed filter's row: session, filter, state, the three codes, since and updated positions.
pub(crate) type FilterRow = (
    String,
    String,
    String,
    Option<i16>,
    Option<i16>,
    Option<i16>,
    i64,
    i64,
);

/// Known sessions (one, or all), by id, each with its filters by filter string.
pub async fn managed_sessions(
    store: &Store,
    session_id: Option<&str>,
) -> Result<Vec<ManagedSessionView>, StoreError> {
    let id = session_id.map(str::to_owned);
    let (sessions, filters) = crate::backend::for_store(store).sessions(id).await?;
    let mut views: Vec<ManagedSessionView> = sessions
        .into_iter()
        .map(
            |(session_id, baseline_source, migration_required, last_position)| ManagedSessionView {
                session_id,
                baseline_source,
                migration_required,
                last_position,
                filters: Vec::new(),
            },
        )
        .collect();
    for (session, filter, state, requested, granted, reason, since, updated) in filters {
        if let Some(view) = views.iter_mut().find(|v| v.session_id == session) {
            view.filters.push(ManagedFilterView {
                filter,
                state,
                requested_qos: requested,
                granted_qos: granted,
                reason_code: reason,
                since_position: since,
                updated_position: updated,
            });
        }
    }
    Ok(views)
}

/// The managed sessions, one (`{id}`) or all (`{id}` NULL), by id.
pub(crate) const SESSIONS_SQL: &str =
    "SELECT session_id, baseline_source, migration_required, last_position \
     FROM managed_session WHERE {id} IS NULL OR session_id = {id} ORDER BY session_id";
/// The managed filters of one session (`{id}`) or of all, by session and filter.
pub(crate) const FILTERS_SQL: &str =
    "SELECT session_id, filter, state, requested_qos, granted_qos, \
     reason_code, since_position, updated_position FROM managed_filter \
     WHERE {id} IS NULL OR session_id = {id} ORDER BY session_id, filter";

/// One event of a session's managed-filter ledger, as audit shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = SessionEvent))]
pub struct SessionHistoryEntry {
    /// Global ledger position.
    pub position: i64,
    /// When the store recorded it (the store's clock).
    pub recorded_at: chrono::DateTime<chrono::Utc>,
    /// `BaselineSeeded`, `BaselineExtended`, `FiltersRemembered`, `SubscribesAcknowledged`,
    /// `FiltersForgotten`, `MigrationRequired` or `MigrationResolved`; on the lease stream
    /// `LeaseAcquired`, `LeaseRenewed`, `LeaseReleased`, `LeaseLost` or `LeaseExpired`.
    pub event: String,
    /// The event's fields (filters, QoS, SUBACK outcome, UNSUBACK reason, seed source, lease
    /// holder, token and expiry...).
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub detail: serde_json::Value,
    /// Who wrote it: the Wharf version and, for an exclusive owner's writes, its lease claim
    /// (`lease_holder`, `lease_token`).
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub metadata: serde_json::Value,
}

/// One of a session's two streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SessionStream {
    /// The managed-filter ledger (seed, Remember, SUBACK outcomes, Forget, migration).
    #[default]
    Filters,
    /// The HA lease (acquire, renew, release, loss, expiry) of an exclusive session.
    Lease,
}

impl SessionStream {
    /// Its name in the CLI and the API: `filters` or `lease`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Filters => "filters",
            Self::Lease => "lease",
        }
    }

    /// Parses `filters` or `lease`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "filters" => Some(Self::Filters),
            "lease" => Some(Self::Lease),
            _ => None,
        }
    }

    fn aggregate(self) -> &'static str {
        match self {
            Self::Filters => wharf_domain::session::MANAGED_SESSION_AGGREGATE,
            Self::Lease => wharf_domain::lease::LEASE_AGGREGATE,
        }
    }
}

/// A page of one session's managed-filter ledger after `after` (a position), oldest first.
pub async fn session_history(
    store: &Store,
    session_id: &str,
    after: i64,
    limit: u32,
) -> Result<Vec<SessionHistoryEntry>, StoreError> {
    session_stream_history(store, SessionStream::Filters, session_id, after, limit).await
}

/// A page of one of a session's streams after `after` (a position), oldest first. Each entry
/// carries who wrote it (`metadata`: an exclusive owner's writes name its lease claim).
pub async fn session_stream_history(
    store: &Store,
    stream: SessionStream,
    session_id: &str,
    after: i64,
    limit: u32,
) -> Result<Vec<SessionHistoryEntry>, StoreError> {
    let query = wharf_store::EventQuery {
        after_position: after,
        since: None,
        until: None,
        payload_field: None,
        limit: i64::from(limit),
    };
    let events = store
        .query_events(stream.aggregate(), session_id, query)
        .await?;
    Ok(events
        .into_iter()
        .map(|e| SessionHistoryEntry {
            position: e.position,
            recorded_at: e.recorded_at,
            event: e.event_type,
            detail: e.payload.to_value(),
            metadata: e.metadata,
        })
        .collect())
}
