//! Managed MQTT sessions in the API: what this process's session runtimes report (through a
//! [`SessionSource`] the composition root supplies), beside each session's exact history from
//! the ledger's projection.
//!
//! - `GET /api/v1/sessions`: every session this process runs or the ledger records;
//! - `GET /api/v1/sessions/{session}`: one, by configured name or durable identity (`ms-...`);
//! - `/readyz` gains the check `mqtt:sessions`: it fails until every session is at `full`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Json;
use serde::Serialize;
use wharf_projections::ManagedSessionView;

use crate::error::ApiError;
use crate::state::{ApiState, HealthCheck};

/// One running session, as its runtime reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LiveSession {
    /// The configured name.
    pub name: String,
    /// The durable identity.
    pub session_id: String,
    /// The identity for people (broker, client id, mode, clean start, expiry; no credentials).
    pub identity: String,
    /// `starting`, `connected`, `subscribed`, `full` or `migration_required`.
    pub level: String,
    /// True only at `full`.
    pub ready: bool,
    /// Why it is below `full`.
    pub reason: Option<String>,
    /// The newest connection's generation.
    pub generation: Option<u64>,
    /// History filters not desired, awaiting removal.
    pub pending_stale: Vec<String>,
    /// Whether the newest reconcile converged, and what happened.
    pub last_reconcile: Option<ReconcileReport>,
    /// Messages handled and acked to the broker after the handler succeeded.
    pub ingested: u64,
    /// Deliveries held unacked (coverage protection, replays after a removal).
    pub held: u64,
    /// Deliveries that matched no filter, acked and dropped after `mqtt.unmatched_grace`.
    pub dropped_unmatched: u64,
}

/// A reconcile attempt's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReconcileReport {
    /// Every desired filter granted and the history equal to the desired set.
    pub converged: bool,
    /// What happened.
    pub detail: String,
}

/// What this process's session runtimes report, read at each request.
pub trait SessionSource: Send + Sync + 'static {
    /// The sessions, in configuration order.
    fn sessions(&self) -> Vec<LiveSession>;
}

impl<F> SessionSource for F
where
    F: Fn() -> Vec<LiveSession> + Send + Sync + 'static,
{
    fn sessions(&self) -> Vec<LiveSession> {
        self()
    }
}

/// A shared source.
pub type SharedSessionSource = Arc<dyn SessionSource>;

/// One session in a listing: what runs here, what the ledger records, or both.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SessionDetail {
    /// The durable identity.
    pub session_id: String,
    /// The runtime's report, when this process runs the session.
    pub live: Option<LiveSession>,
    /// The exact history, when a baseline was seeded (absent: the history is unknown).
    pub history: Option<ManagedSessionView>,
}

/// `GET /api/v1/sessions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SessionList {
    /// Every session, running ones first in configuration order, then recorded ones by id.
    pub sessions: Vec<SessionDetail>,
}

async fn details(state: &ApiState) -> Result<Vec<SessionDetail>, ApiError> {
    let recorded = state.read_model().managed_sessions(None).await?;
    let live = state
        .session_source()
        .map(|s| s.sessions())
        .unwrap_or_default();
    let mut details: Vec<SessionDetail> = live
        .into_iter()
        .map(|live| SessionDetail {
            session_id: live.session_id.clone(),
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
                session_id: view.session_id.clone(),
                live: None,
                history: Some(view),
            });
        }
    }
    Ok(details)
}

pub(crate) async fn list_sessions(
    State(state): State<ApiState>,
) -> Result<Json<SessionList>, ApiError> {
    Ok(Json(SessionList {
        sessions: details(&state).await?,
    }))
}

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

/// `mqtt:sessions`: passes when every session runs at `full` (or none is configured).
pub(crate) fn readiness(source: &dyn SessionSource) -> HealthCheck {
    let waiting: Vec<String> = source
        .sessions()
        .into_iter()
        .filter(|s| !s.ready)
        .map(|s| match &s.reason {
            Some(reason) => format!("{} is {}: {reason}", s.name, s.level),
            None => format!("{} is {}", s.name, s.level),
        })
        .collect();
    if waiting.is_empty() {
        HealthCheck::pass("mqtt:sessions")
    } else {
        HealthCheck::fail("mqtt:sessions", waiting.join("; "))
    }
}
