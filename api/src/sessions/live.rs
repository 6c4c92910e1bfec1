//! What this process's session runtimes report, as the API shows it, and the source the
//! composition root reports it through. The API state holds the source; the session handlers
//! (`sessions.rs`), `/metrics` and `/readyz` read it.

use std::sync::Arc;

use serde::Serialize;

/// One running session, as its runtime reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct LiveSession {
    /// The configured name.
    pub name: String,
    /// The durable identity.
    pub session_id: String,
    /// The identity for people (broker, client id, mode, clean start, expiry; no credentials).
    pub identity: String,
    /// `starting`, `connected`, `subscribed`, `full` or `migration_required`.
    #[schema(value_type = String, schema_with = crate::schemas::session_level)]
    pub level: String,
    /// True only at `full`.
    pub ready: bool,
    /// Why it is below `full`.
    #[schema(required = true)]
    pub reason: Option<String>,
    /// The newest connection's generation.
    #[schema(required = true)]
    pub generation: Option<u64>,
    /// History filters not desired, awaiting removal.
    pub pending_stale: Vec<String>,
    /// Whether the newest reconcile converged, and what happened.
    #[schema(required = true)]
    pub last_reconcile: Option<ReconcileReport>,
    /// Messages handled and acked to the broker after the handler succeeded.
    pub ingested: u64,
    /// Deliveries held unacked (coverage protection, replays after a removal).
    pub held: u64,
    /// Deliveries that matched no filter, acked and dropped after `mqtt.unmatched_grace`.
    pub dropped_unmatched: u64,
    /// An exclusive session's HA lease as this process sees it; null for other modes.
    #[schema(required = true)]
    pub lease: Option<LiveLease>,
}

/// An exclusive session's lease as the runtime sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct LiveLease {
    /// True while this process holds it (and may act on the session).
    pub held: bool,
    /// The holder it last saw (itself when `held`).
    #[schema(required = true)]
    pub holder: Option<String>,
    /// That holder's fencing token.
    #[schema(required = true)]
    pub token: Option<u64>,
    /// When that ownership lapses unless renewed (store clock).
    #[schema(required = true)]
    pub expires_at: Option<chrono::DateTime<chrono::Utc>>,
    /// How many times the runtime became or stopped being the holder.
    pub transitions: u64,
}

/// A reconcile attempt's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
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
