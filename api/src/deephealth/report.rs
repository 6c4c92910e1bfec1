//! What the composition root reports for deep health (its sessions with their leases, the
//! supervisor's state, its consumers) and the source it reports through. The API state holds
//! the source; `render` and the handler in `deephealth.rs` read the report.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;

/// An exclusive session's HA lease as this process sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[schema(as = Lease)]
pub struct LeaseReport {
    /// True while this process holds it.
    pub held: bool,
    /// The holder last seen.
    #[schema(required = true)]
    pub holder: Option<String>,
    /// Its fencing token.
    #[schema(required = true)]
    pub token: Option<u64>,
    /// When it lapses unless renewed (the store's clock).
    #[schema(required = true)]
    pub expires_at: Option<DateTime<Utc>>,
}

/// One session in deep health.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct DeepSession {
    /// The configured name.
    pub name: String,
    /// The durable identity.
    pub session_id: String,
    /// `starting`, `connected`, `subscribed`, `full` or `migration_required`.
    #[schema(value_type = String, schema_with = crate::schemas::session_level)]
    pub level: String,
    /// Why it is below `full`.
    #[schema(required = true)]
    pub reason: Option<String>,
    /// The newest connection's generation.
    #[schema(required = true)]
    pub generation: Option<u64>,
    /// The HA lease (exclusive sessions only).
    #[schema(required = true)]
    pub lease: Option<LeaseReport>,
}

/// The newest reload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct ReloadSummary {
    /// `applied`, `unchanged`, `refused` or `failed`.
    #[schema(value_type = String, schema_with = crate::schemas::reload_outcome)]
    pub outcome: String,
    /// The generation in effect after it.
    pub generation: u64,
    /// What asked for it.
    pub trigger: String,
    /// Why it was refused or failed.
    #[schema(required = true)]
    pub reason: Option<String>,
    /// When it finished.
    pub at: DateTime<Utc>,
}

/// Applied versus converged: a reload is applied once the new runtimes started; converged once
/// every session reached subscribed. Degraded past the activation budget unconverged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[schema(as = ConfigWatch)]
pub struct ConfigWatchReport {
    /// The generation in effect.
    #[schema(minimum = 1)]
    pub applied_generation: u64,
    /// The newest generation whose sessions all reached `subscribed` (0: none yet).
    pub converged_generation: u64,
    /// True past the activation budget unconverged.
    pub degraded: bool,
    /// Why.
    #[schema(required = true)]
    pub reason: Option<String>,
    /// `direct` or `debounced`.
    #[schema(value_type = String, schema_with = crate::schemas::reload_strategy)]
    pub strategy: String,
    /// The newest reload since start.
    #[schema(required = true)]
    pub last_reload: Option<ReloadSummary>,
}

/// One consumer of this process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[schema(as = ConsumerHealth)]
pub struct ConsumerReport {
    /// Its group.
    pub group: String,
    /// Its instance identity.
    pub declarer: String,
    /// `declaring`, `waiting`, `consuming`, `stalled`, `failed` or `stopped`.
    #[schema(value_type = String, schema_with = crate::schemas::consumer_state)]
    pub state: String,
    /// Why it is stalled or failed.
    #[schema(required = true)]
    pub reason: Option<String>,
    /// When its heartbeat was last confirmed, if known.
    #[schema(required = true)]
    pub last_heartbeat: Option<DateTime<Utc>>,
}

/// What the composition root reports, read at each request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DeepReport {
    /// The sessions, in configuration order.
    pub sessions: Vec<DeepSession>,
    /// The supervisor's state (absent without one).
    pub config_watch: Option<ConfigWatchReport>,
    /// This process's consumers.
    pub consumers: Vec<ConsumerReport>,
}

/// Supplies [`DeepReport`]s.
pub trait DeepHealthSource: Send + Sync + 'static {
    /// The report now.
    fn report(&self) -> DeepReport;
}

impl<F> DeepHealthSource for F
where
    F: Fn() -> DeepReport + Send + Sync + 'static,
{
    fn report(&self) -> DeepReport {
        self()
    }
}

/// A shared source.
pub type SharedDeepHealthSource = Arc<dyn DeepHealthSource>;
