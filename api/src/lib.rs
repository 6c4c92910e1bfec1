//! Wharf's read-only REST listing API: topics, consumer groups with their queue figures, their
//! declaration history and dead letters, probes and the OpenAPI document, served as JSON with
//! axum.
//!
//! | route | answers |
//! | --- | --- |
//! | `GET /api/v1/topics` | `{"topics": [{"topic", "head", "size"}...]}` |
//! | `GET /api/v1/groups` | `{"groups": [GroupDetail...]}`: each `GroupView` plus `"queue"` |
//! | `GET /api/v1/groups/{group}` | one `GroupDetail`; 400 for a bad name, 404 if never declared |
//! | `GET /api/v1/groups/{group}/declarations` | a `HistoryPage`, filtered and paged |
//! | `GET /api/v1/groups/{group}/dead-letters` | a `DeadLetterPage`, paged by position |
//! | `GET /api/v1/openapi.json` | the OpenAPI 3.1 document |
//! | `GET /healthz` | liveness: always `{"status":"pass"}` |
//! | `GET /api/v1/groups/{group}/swaps` | a `SwapList`: what each install's swap did, newest first |
//! | `GET /readyz` | readiness (`application/health+json`): the store can serve the listing |
//! | `GET /metrics` | Prometheus text format 0.0.4: process counters and store figures (ADR 0021) |
//! | `GET /api/v1/sessions` | `{"sessions": [SessionDetail...]}`: each MQTT session's runtime report and exact history |
//! | `GET /api/v1/sessions/{session}` | one `SessionDetail`, by name or durable identity; 404 if unknown |
//! | `GET /api/v1/monitor/deephealth` | `application/health+json`: sessions (level, lease), `config_watch`, consumers, store; `warn` is 200, `fail` 503 |
//!
//! Every error is JSON (`{"error": {"code", "message", "field"?}}`, see [`ApiError`]),
//! including unknown paths. Every request runs in a tracing span naming its method and path.
//!
//! Architecture invariant: this crate only reads. It calls [`wharf_projections::ReadModel`]
//! and the listing reads of [`wharf_queue::Queue`] (`topic_stats`, `group_stats`,
//! `dead_letters`, `swaps`), and nothing that decides, appends, routes or claims; `/metrics`
//! reads the same, and `/healthz` reads nothing.

pub mod deephealth;
pub mod error;
mod handlers;
pub mod metrics;
pub mod openapi;
pub mod params;
mod routes;
mod schemas;
mod server;
pub mod sessions;
pub mod state;
pub mod views;

use std::future::Future;

pub use deephealth::{
    ConfigWatchReport, ConsumerReport, DeepHealthSource, DeepReport, DeepSession, LeaseReport,
    ReloadSummary,
};
pub use error::ApiError;
pub use handlers::{
    DEAD_LETTERS_PATH, DECLARATIONS_PATH, DEEPHEALTH_PATH, GROUPS_PATH, GROUP_PATH, HEALTHZ_PATH,
    METRICS_PATH, OPENAPI_PATH, READYZ_PATH, SESSIONS_PATH, SESSION_PATH, SWAPS_PATH, TOPICS_PATH,
};
pub use metrics::{Metrics, StoreCollector};
pub use routes::router;
pub use server::{bounded_router, default_max_concurrent_reads, serve_with, HttpLimits};
pub use sessions::{
    LiveLease, LiveSession, ReconcileReport, SessionDetail, SessionEventPage, SessionList,
    SessionSource,
};
pub use state::{
    ApiState, ChecksFuture, HealthCheck, HealthStatus, ReadinessProbe, ReadyFuture, StoreReadiness,
};

/// Serves the API on `listener` with the default [`HttpLimits`] until `shutdown` completes,
/// then lets in-flight requests finish. See [`serve_with`].
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: ApiState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, state, HttpLimits::default(), shutdown).await
}

#[cfg(test)]
mod tests {
    use std::fmt::Write as _;
    use std::sync::{Arc, Mutex};

    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;
    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id};
    use tracing_subscriber::layer::{Context, SubscriberExt};
    use tracing_subscriber::Layer;
    use wharf_projections::ReadModel;
    use wharf_store::{SqliteStore, Store};

    use super::*;

    /// Records every new span as `name field=value ...`.
    #[derive(Clone, Default)]
    struct SpanLog(Arc<Mutex<Vec<String>>>);

    struct FieldText(String);

    impl Visit for FieldText {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            let _ = write!(self.0, " {}={:?}", field.name(), value);
        }
    }

    impl<S: tracing::Subscriber> Layer<S> for SpanLog {
        fn on_new_span(&self, attrs: &Attributes<'_>, _id: &Id, _ctx: Context<'_, S>) {
            let mut text = FieldText(attrs.metadata().name().to_owned());
            attrs.record(&mut text);
            self.0.lock().unwrap().push(text.0);
        }
    }

    #[tokio::test]
    async fn every_request_runs_in_a_span_naming_method_and_path() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("w.db"), wharf_projections::sqlite_inline())
            .await
            .unwrap();
        let state = ApiState::new(ReadModel::new(
            Store::Sqlite(store),
            std::time::Duration::from_secs(60),
        ));
        let log = SpanLog::default();
        let _guard =
            tracing::subscriber::set_default(tracing_subscriber::registry().with(log.clone()));

        for path in ["/healthz", "/no/such/path?x=1"] {
            let request = Request::get(path).body(Body::empty()).unwrap();
            router(state.clone()).oneshot(request).await.unwrap();
        }

        let spans = log.0.lock().unwrap().clone();
        assert!(
            spans.contains(&"http_request method=GET path=/healthz".to_owned()),
            "{spans:?}"
        );
        assert!(
            spans.contains(&"http_request method=GET path=/no/such/path".to_owned()),
            "{spans:?}"
        );
    }
}
