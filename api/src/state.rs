//! What every handler shares: the read model, the message queue, the readiness probe and the
//! metrics.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use wharf_projections::ReadModel;
use wharf_queue::{Queue, QueueSettings};
use wharf_store::Store;

use crate::metrics::{Metrics, DEFAULT_SCRAPE_TIMEOUT};
use crate::sessions::SessionSource;

/// The future a readiness probe returns: `Ok(())` when ready, else the reason it is not.
pub type ReadyFuture<'a> = Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>>;

/// The future [`ReadinessProbe::checks`] returns.
pub type ChecksFuture<'a> = Pin<Box<dyn Future<Output = Vec<HealthCheck>> + Send + 'a>>;

/// A check's status, as in the `application/health+json` draft.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HealthStatus {
    /// Healthy.
    Pass,
    /// Serving, degraded: `/readyz` stays 200.
    Warn,
    /// Not serving: `/readyz` is 503.
    Fail,
}

/// One check of a readiness answer, keyed `component:measurement` (e.g. `store:schema`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    /// `component:measurement`.
    pub key: String,
    /// Its status.
    pub status: HealthStatus,
    /// Why it warns or fails (absent when it passes).
    pub output: Option<String>,
}

impl HealthCheck {
    /// A passing check.
    pub fn pass(key: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            status: HealthStatus::Pass,
            output: None,
        }
    }

    /// A degraded-but-serving check with its reason.
    pub fn warn(key: impl Into<String>, output: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            status: HealthStatus::Warn,
            output: Some(output.into()),
        }
    }

    /// A failing check with its reason.
    pub fn fail(key: impl Into<String>, output: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            status: HealthStatus::Fail,
            output: Some(output.into()),
        }
    }
}

/// Decides whether the service can take traffic (`GET /readyz`).
///
/// Any `Fn() -> impl Future<Output = Result<(), String>>` closure is a probe (reported as the
/// one check `readiness:probe`); the default, [`StoreReadiness`], checks that the store
/// answers with a schema this build can read and that the catch-up projections apply.
pub trait ReadinessProbe: Send + Sync + 'static {
    /// `Ok(())` when ready; otherwise a short, human-readable reason.
    fn ready(&self) -> ReadyFuture<'_>;

    /// The checks `/readyz` reports; by default the one check `readiness:probe` from
    /// [`ReadinessProbe::ready`].
    fn checks(&self) -> ChecksFuture<'_> {
        Box::pin(async move {
            vec![match self.ready().await {
                Ok(()) => HealthCheck::pass("readiness:probe"),
                Err(reason) => HealthCheck::fail("readiness:probe", reason),
            }]
        })
    }
}

impl<F, Fut> ReadinessProbe for F
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    fn ready(&self) -> ReadyFuture<'_> {
        Box::pin(self())
    }
}

/// The default probe: the store can serve the listing. Checks, in order:
/// - `store:schema`: reachable and migrated to what this build needs (`warn` when a newer
///   build migrated it: reads work, maintenance refuses);
/// - `projections:catch-up`: the catch-up projectors apply what the log holds, the same step
///   every listing read takes first (a damaged file or table fails here).
#[derive(Clone)]
pub struct StoreReadiness {
    read_model: ReadModel,
}

impl StoreReadiness {
    /// A probe of `store`.
    pub fn new(store: Store) -> Self {
        Self {
            read_model: ReadModel::new(store, Duration::from_secs(60)),
        }
    }

    async fn run_checks(&self) -> Vec<HealthCheck> {
        let store = self.read_model.store();
        let backend = store.backend();
        let schema = match store.ensure_migrated().await {
            Err(e) => {
                return vec![HealthCheck::fail(
                    "store:schema",
                    format!("{backend} store: {e}"),
                )]
            }
            Ok(()) => match store.schema_version().await {
                Ok(found) if found > store.known_version() => HealthCheck::warn(
                    "store:schema",
                    format!(
                        "{backend} store: schema version {found} is newer than this build \
                         knows ({}); reads work, maintenance refuses",
                        store.known_version()
                    ),
                ),
                Ok(_) => HealthCheck::pass("store:schema"),
                Err(e) => HealthCheck::fail("store:schema", format!("{backend} store: {e}")),
            },
        };
        let catch_up = match self.read_model.catch_up().await {
            Ok(_) => HealthCheck::pass("projections:catch-up"),
            Err(e) => HealthCheck::fail(
                "projections:catch-up",
                format!("{backend} store: catch-up projection failed: {e}"),
            ),
        };
        vec![schema, catch_up]
    }
}

impl ReadinessProbe for StoreReadiness {
    fn ready(&self) -> ReadyFuture<'_> {
        Box::pin(async move {
            let checks = self.run_checks().await;
            match checks.into_iter().find(|c| c.status == HealthStatus::Fail) {
                Some(failed) => Err(failed.output.unwrap_or_default()),
                None => Ok(()),
            }
        })
    }

    fn checks(&self) -> ChecksFuture<'_> {
        Box::pin(self.run_checks())
    }
}

/// How long `/readyz` waits for the probe before answering "fail".
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(5);

/// The state the router hands to every handler. Cheap to clone.
#[derive(Clone)]
pub struct ApiState {
    read_model: ReadModel,
    /// The read model the state was made with, which the probes read through: on Postgres the
    /// store's own pool, never the API's (ADR 0067), so a probe does not wait behind reads.
    probe_reads: ReadModel,
    queue: Queue,
    readiness: Arc<dyn ReadinessProbe>,
    ready_timeout: Duration,
    metrics: Metrics,
    scrape_timeout: Duration,
    sessions: Option<crate::sessions::SharedSessionSource>,
    deep: Option<crate::deephealth::SharedDeepHealthSource>,
}

impl ApiState {
    /// State over `read_model`, ready when its store is reachable and migrated.
    ///
    /// Queue figures and dead letters are read through a [`Queue`] over the read model's store
    /// with default settings. The listing reads depend on no setting, so this answers as the
    /// application's own queue would; [`ApiState::with_queue`] passes that one instead.
    pub fn new(read_model: ReadModel) -> Self {
        let probe = StoreReadiness::new(read_model.store().clone());
        Self::with_readiness(read_model, probe)
    }

    /// State over `read_model` with a custom readiness probe (and a default queue, as in
    /// [`ApiState::new`]).
    pub fn with_readiness(read_model: ReadModel, probe: impl ReadinessProbe) -> Self {
        let queue = Queue::new(read_model.store().clone(), QueueSettings::default());
        Self {
            probe_reads: read_model.clone(),
            read_model,
            queue,
            readiness: Arc::new(probe),
            ready_timeout: DEFAULT_READY_TIMEOUT,
            metrics: Metrics::new(),
            scrape_timeout: DEFAULT_SCRAPE_TIMEOUT,
            sessions: None,
            deep: None,
        }
    }

    /// Serves `metrics` at `GET /metrics` (by default a fresh [`Metrics`] of its own, which
    /// shows the store's figures but none of the process's counters): pass the application's
    /// (`Wharf::metrics`) so its consumers', publishers' and pruner's counters are served too.
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Replaces how long a `/metrics` scrape waits for the store's figures (default
    /// [`DEFAULT_SCRAPE_TIMEOUT`]); past it `wharf_store_up` is 0 and the rest is served.
    pub fn scrape_timeout(mut self, timeout: Duration) -> Self {
        self.scrape_timeout = timeout;
        self
    }

    /// The metrics `/metrics` serves.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// How long a scrape waits for the store.
    pub fn scrape_timeout_value(&self) -> Duration {
        self.scrape_timeout
    }

    /// Replaces how long `/readyz` waits for the probe (default [`DEFAULT_READY_TIMEOUT`]).
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }

    /// The same state with its reads (the read model's, the queue's figures and dead letters,
    /// the scrape's) on `store`, a handle on the same store: [`crate::bounded_router`] passes
    /// the API's own pool on Postgres (ADR 0067). The readiness probe keeps the store it was
    /// made with.
    pub(crate) fn reading_through(mut self, store: Store) -> Self {
        self.read_model = ReadModel::new(store.clone(), self.read_model.instance_ttl());
        self.queue = Queue::new(store, *self.queue.settings());
        self
    }

    /// The read model the probes (the deep health report) read through: the one the state was
    /// made with.
    pub(crate) fn probe_read_model(&self) -> &ReadModel {
        &self.probe_reads
    }

    /// Replaces the queue the topic and group figures and the dead letters are read through.
    ///
    /// It must sit over the same store as the read model: the group listing joins the two by
    /// group name, and nothing here can check that they agree.
    pub fn with_queue(mut self, queue: Queue) -> Self {
        self.queue = queue;
        self
    }

    /// Reports this process's MQTT session runtimes at `/api/v1/sessions`, and makes `/readyz`
    /// fail until every one of them is at `full`.
    pub fn with_sessions(mut self, source: impl crate::sessions::SessionSource) -> Self {
        self.sessions = Some(Arc::new(source));
        self
    }

    /// Reports the supervisor's state, the sessions' leases and this process's consumers at
    /// `/api/v1/monitor/deephealth` (without it, deep health shows the session source's
    /// sessions and the store).
    pub fn with_deep_health(mut self, source: impl crate::deephealth::DeepHealthSource) -> Self {
        self.deep = Some(Arc::new(source));
        self
    }

    /// The deep-health source, when set.
    pub fn deep_health_source(&self) -> Option<&crate::deephealth::SharedDeepHealthSource> {
        self.deep.as_ref()
    }

    /// How long a probe of the store may take (`/readyz`, deep health).
    pub fn ready_timeout_value(&self) -> Duration {
        self.ready_timeout
    }

    /// The session runtimes' source, when set.
    pub fn session_source(&self) -> Option<&crate::sessions::SharedSessionSource> {
        self.sessions.as_ref()
    }

    /// The read model the handlers query.
    pub fn read_model(&self) -> &ReadModel {
        &self.read_model
    }

    /// The queue the handlers read topic and group figures and dead letters from.
    pub fn queue(&self) -> &Queue {
        &self.queue
    }

    /// Runs the readiness probe, bounded by the ready timeout.
    pub async fn check_ready(&self) -> Result<(), String> {
        let checks = self.check_health().await;
        match checks.into_iter().find(|c| c.status == HealthStatus::Fail) {
            Some(failed) => Err(failed.output.unwrap_or_default()),
            None => Ok(()),
        }
    }

    /// Runs the readiness probe's checks, bounded by the ready timeout (a probe that does not
    /// finish is the failing check `readiness:duration`).
    pub async fn check_health(&self) -> Vec<HealthCheck> {
        // Past the timeout the probe goes on to its end in its task: a store call dropped
        // mid-statement can cost the pool its connection for good (ADR 0068).
        let readiness = self.readiness.clone();
        let probe = async move { readiness.checks().await };
        match wharf_store::finish_within(self.ready_timeout, probe).await {
            Ok(mut checks) => {
                if let Some(source) = &self.sessions {
                    checks.push(sessions_readiness(source.as_ref()));
                }
                checks
            }
            Err(_) => vec![HealthCheck::fail(
                "readiness:duration",
                format!(
                    "readiness check did not finish within {:?}",
                    self.ready_timeout
                ),
            )],
        }
    }
}

/// `mqtt:sessions`: passes when every session runs at `full` (or none is configured).
fn sessions_readiness(source: &dyn SessionSource) -> HealthCheck {
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
