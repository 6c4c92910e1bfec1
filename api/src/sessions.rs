//! Managed MQTT sessions in the API: what this process's session runtimes report (through a
//! [`SessionSource`] the composition root supplies), beside each session's exact history from
//! the ledger's projection.
//!
//! - `GET /api/v1/sessions`: every session this process runs or the ledger records;
//! - `GET /api/v1/sessions/{session}`: one, by configured name or durable identity (`ms-...`);
//! - `GET /api/v1/sessions/{session}/events`: a page of one of its streams, for the audit
//!   (`stream=filters`, the managed-filter ledger, or `stream=lease`, the HA lease);
//! - `/readyz` gains the check `mqtt:sessions` (`state.rs`): it fails until every session is
//!   at `full`.

use axum::extract::{Path, State};
use axum::Json;
use serde::Serialize;
use wharf_projections::{
    session_leases, session_stream_history, LeaseRow, ManagedSessionView, SessionHistoryEntry,
};

use crate::error::ApiError;
use crate::state::ApiState;

mod live;

pub use live::{LiveLease, LiveSession, ReconcileReport, SessionSource, SharedSessionSource};

/// One session in a listing: what runs here, what the ledger records, or both.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct SessionDetail {
    /// The durable identity.
    pub session_id: String,
    /// The runtime's report, when this process runs the session.
    #[schema(required = true)]
    pub live: Option<LiveSession>,
    /// The exact managed-filter history; null while unknown (never seeded).
    #[schema(required = true)]
    pub history: Option<ManagedSessionView>,
    /// The HA lease as the store records it; null when never acquired (not exclusive).
    #[schema(required = true)]
    pub lease: Option<LeaseRow>,
}

/// `GET /api/v1/sessions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct SessionList {
    /// Every session, running ones first in configuration order, then recorded ones by id.
    pub sessions: Vec<SessionDetail>,
}

async fn details(state: &ApiState) -> Result<Vec<SessionDetail>, ApiError> {
    let recorded = state.read_model().managed_sessions(None).await?;
    let leases = session_leases(state.read_model().store(), None).await?;
    let lease_of = |id: &str| leases.iter().find(|l| l.session_id == id).cloned();
    let live = state
        .session_source()
        .map(|s| s.sessions())
        .unwrap_or_default();
    let mut details: Vec<SessionDetail> = live
        .into_iter()
        .map(|live| SessionDetail {
            session_id: live.session_id.clone(),
            lease: lease_of(&live.session_id),
            history: recorded
                .iter()
                .find(|r| r.session_id == live.session_id)
                .cloned(),
            live: Some(live),
        })
        .collect();
    for view in recorded {
        if !details.iter().any(|d| d.session_id == view.session_id) {
            details.push(SessionDetail {
                lease: lease_of(&view.session_id),
                session_id: view.session_id.clone(),
                live: None,
                history: Some(view),
            });
        }
    }
    Ok(details)
}

#[utoipa::path(
    get,
    path = "/api/v1/sessions",
    operation_id = "listSessions",
    tag = "sessions",
    summary = "Managed MQTT sessions",
    description = "Every MQTT session this process runs (its runtime's report: level, why it is below full, the newest reconcile outcome, ingest counters) and every session whose managed-filter history the ledger records (its exact filters). A session this process runs whose history is unknown (never seeded) has `history` null. Takes no query parameters.",
    responses(
        (status = 200, description = "The sessions.", body = SessionList),
        (status = 500, description = "The server failed; the message is generic and the details are in the server log.", body = crate::error::ErrorBody),
        (status = 503, description = "The store cannot be reached or is not migrated; retry later.", body = crate::error::ErrorBody)
    )
)]
pub(crate) async fn list_sessions(
    State(state): State<ApiState>,
) -> Result<Json<SessionList>, ApiError> {
    Ok(Json(SessionList {
        sessions: details(&state).await?,
    }))
}

#[utoipa::path(
    get,
    path = "/api/v1/sessions/{session}",
    operation_id = "oneSession",
    tag = "sessions",
    summary = "One managed MQTT session",
    description = "One session, named by its configured name (for sessions this process runs) or its durable identity (`ms-` and 32 hex digits).",
    params(crate::params::SessionPathDoc),
    responses(
        (status = 200, description = "The session.", body = SessionDetail),
        (status = 404, description = "No session of that name or identity runs in this process or is recorded in the ledger.", body = crate::error::ErrorBody),
        (status = 500, description = "The server failed; the message is generic and the details are in the server log.", body = crate::error::ErrorBody),
        (status = 503, description = "The store cannot be reached or is not migrated; retry later.", body = crate::error::ErrorBody)
    )
)]
pub(crate) async fn one_session(
    State(state): State<ApiState>,
    Path(session): Path<String>,
) -> Result<Json<SessionDetail>, ApiError> {
    details(&state)
        .await?
        .into_iter()
        .find(|d| d.session_id == session || d.live.as_ref().is_some_and(|l| l.name == session))
        .map(Json)
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "no session {session:?} runs in this process or is recorded in the ledger"
            ))
        })
}

/// `GET /api/v1/sessions/{session}/events`: a page of one stream.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct SessionEventPage {
    /// The durable identity.
    pub session_id: String,
    /// `filters` or `lease`.
    #[schema(value_type = String, schema_with = crate::schemas::session_stream)]
    pub stream: &'static str,
    /// The entries, oldest first.
    pub events: Vec<SessionHistoryEntry>,
    /// The `after` of the next page, when this one was full.
    #[schema(required = true)]
    pub next_after: Option<i64>,
}

#[utoipa::path(
    get,
    path = "/api/v1/sessions/{session}/events",
    operation_id = "sessionEvents",
    tag = "sessions",
    summary = "A page of one managed MQTT session's events",
    description = "The audit of a session: its managed-filter ledger (`stream=filters`, the default) or its HA lease (`stream=lease`), oldest first, after the `after` position. Each event's metadata says who wrote it; an exclusive owner's writes name its lease claim. Any other query parameter, or one given twice, is refused with 400.",
    params(crate::params::SessionPathDoc, crate::params::SessionEventParamsDoc),
    responses(
        (status = 200, description = "A page of events.", body = SessionEventPage),
        (status = 400, description = "A path or query parameter is malformed or out of range; `error.field` names it and `error.message` quotes the value.", body = crate::error::ErrorBody),
        (status = 404, description = "No session of that name or identity runs in this process or is recorded in the ledger.", body = crate::error::ErrorBody),
        (status = 500, description = "The server failed; the message is generic and the details are in the server log.", body = crate::error::ErrorBody),
        (status = 503, description = "The store cannot be reached or is not migrated; retry later.", body = crate::error::ErrorBody)
    )
)]
pub(crate) async fn session_events(
    State(state): State<ApiState>,
    Path(session): Path<String>,
    query: Result<
        axum::extract::Query<Vec<(String, String)>>,
        axum::extract::rejection::QueryRejection,
    >,
) -> Result<Json<SessionEventPage>, ApiError> {
    let axum::extract::Query(pairs) =
        query.map_err(|rejection| ApiError::invalid("query", "", rejection.body_text()))?;
    let page = crate::params::session_events_query(&pairs)?;
    let session_id = details(&state)
        .await?
        .into_iter()
        .find(|d| d.session_id == session || d.live.as_ref().is_some_and(|l| l.name == session))
        .map(|d| d.session_id)
        .or_else(|| is_identity(&session).then(|| session.clone()))
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "no session {session:?} runs in this process or is recorded in the ledger"
            ))
        })?;
    let events = session_stream_history(
        state.read_model().store(),
        page.stream,
        &session_id,
        page.after,
        page.limit,
    )
    .await?;
    let next_after = (events.len() == page.limit as usize)
        .then(|| events.last().map(|e| e.position))
        .flatten();
    Ok(Json(SessionEventPage {
        session_id,
        stream: page.stream.as_str(),
        events,
        next_after,
    }))
}

/// `ms-` and 32 hex digits: a durable identity, which may have events without a row (a lease
/// acquired for a session never seeded).
fn is_identity(text: &str) -> bool {
    text.strip_prefix("ms-")
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}
