//! Audit queries on the declaration ledger: who declared what, when, filtered and paged.
//!
//! These read the ledger itself (the `events` table), not a projection: the ledger is the
//! record of proof. Pruned superseded retries are gone; everything else is here.

use chrono::{DateTime, Utc};
use serde::Serialize;
use wharf_domain::declaration::AGGREGATE_TYPE;
use wharf_domain::{BindingSet, DeclarationEvent, GroupName};
use wharf_store::{EventQuery, RecordedEvent, Store};

use crate::error::ProjectionError;

/// The most entries one page may hold.
pub const MAX_PAGE: u32 = 1_000;

/// Filters for a group's declaration history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryQuery {
    /// The group.
    pub group: GroupName,
    /// Only entries recorded at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Only entries recorded before this time.
    pub until: Option<DateTime<Utc>>,
    /// Only this declarer's entries.
    pub declarer: Option<String>,
    /// Only entries after this ledger position (the previous page's `next_after`).
    pub after: i64,
    /// At most this many entries (1 to [`MAX_PAGE`]).
    pub limit: u32,
}

impl HistoryQuery {
    /// A query for the whole history of `group`, first page of 100.
    pub fn all(group: GroupName) -> Self {
        Self {
            group,
            since: None,
            until: None,
            declarer: None,
            after: 0,
            limit: 100,
        }
    }

    /// Checks the parameters, naming the first one out of range.
    pub fn validate(&self) -> Result<(), ProjectionError> {
        if self.limit == 0 || self.limit > MAX_PAGE {
            return Err(ProjectionError::InvalidParameter {
                field: "limit",
                value: self.limit.to_string(),
                reason: "must be between 1 and 1000",
            });
        }
        if self.after < 0 {
            return Err(ProjectionError::InvalidParameter {
                field: "after",
                value: self.after.to_string(),
                reason: "must be a ledger position (0 or more)",
            });
        }
        if let (Some(since), Some(until)) = (self.since, self.until) {
            if until <= since {
                return Err(ProjectionError::InvalidParameter {
                    field: "until",
                    value: until.to_rfc3339(),
                    reason: "must be later than since",
                });
            }
        }
        Ok(())
    }
}

/// One declaration attempt in the ledger.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HistoryEntry {
    /// Global ledger position.
    pub position: i64,
    /// Sequence within the group, from 1.
    pub sequence: i64,
    /// When the ledger recorded it (store clock).
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub recorded_at: DateTime<Utc>,
    /// `installed` (a set change) or `waiting` (blocked on a live incumbent).
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = String, schema_with = crate::openapi::history_status)
    )]
    pub status: &'static str,
    /// Who attempted.
    pub declarer: String,
    /// Its application version.
    pub version: String,
    /// The requested set (empty = whole topic).
    pub patterns: Vec<String>,
    /// When the declarer first stated the set.
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub declared_at: DateTime<Utc>,
    /// When this attempt ran.
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub attempt_at: DateTime<Utc>,
    /// For an install: the set it replaced (null on the first install and for waits).
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub previous: Option<Vec<String>>,
    /// For a wait: the set it waited on (null for installs).
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub incumbent: Option<Vec<String>>,
    /// For a wait: the live instances that still declared the incumbent set.
    pub live_declarers: Vec<String>,
}

/// A page of history.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HistoryPage {
    /// The entries, in ledger order.
    pub entries: Vec<HistoryEntry>,
    /// Pass as `after` for the next page. `null` when this page was not full; a full last
    /// page still names a cursor, whose page then comes back empty (cursor paging never
    /// counts ahead).
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub next_after: Option<i64>,
}

/// Reads a page of a group's declaration history.
pub async fn history(store: &Store, query: &HistoryQuery) -> Result<HistoryPage, ProjectionError> {
    query.validate()?;
    let events = store
        .query_events(
            AGGREGATE_TYPE,
            query.group.as_str(),
            EventQuery {
                after_position: query.after,
                since: query.since,
                until: query.until,
                payload_field: query.declarer.clone().map(|d| ("declarer".to_owned(), d)),
                limit: i64::from(query.limit),
            },
        )
        .await?;
    let full = events.len() == query.limit as usize;
    let entries = events
        .iter()
        .map(entry)
        .collect::<Result<Vec<_>, ProjectionError>>()?;
    let next_after = if full {
        entries.last().map(|e| e.position)
    } else {
        None
    };
    Ok(HistoryPage {
        entries,
        next_after,
    })
}

fn entry(event: &RecordedEvent) -> Result<HistoryEntry, ProjectionError> {
    let declared: DeclarationEvent = event.decode()?;
    let attempt = declared.attempt().clone();
    let (status, previous, incumbent, live_declarers) = match &declared {
        DeclarationEvent::Installed { previous, .. } => (
            "installed",
            previous.as_ref().map(BindingSet::patterns),
            None,
            Vec::new(),
        ),
        DeclarationEvent::Waiting {
            incumbent,
            live_declarers,
            ..
        } => (
            "waiting",
            None,
            Some(incumbent.patterns()),
            live_declarers.iter().map(|d| d.to_string()).collect(),
        ),
    };
    Ok(HistoryEntry {
        position: event.position,
        sequence: event.sequence,
        recorded_at: event.recorded_at,
        status,
        declarer: attempt.declarer.to_string(),
        version: attempt.version.to_string(),
        patterns: attempt.patterns.patterns(),
        declared_at: attempt.declared_at,
        attempt_at: attempt.attempt_at,
        previous,
        incumbent,
        live_declarers,
    })
}
