//! What every handler shares: the read model, the message queue and the readiness probe.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use wharf_projections::ReadModel;
use wharf_queue::{Queue, QueueSettings};
use wharf_store::Store;

/// The future a readiness probe returns: `Ok(())` when ready, else the reason it is not.
pub type ReadyFuture<'a> = Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>>;

/// Decides whether the service can take traffic (`GET /readyz`).
///
/// Any `Fn() -> impl Future<Output = Result<(), String>>` closure is a probe; the default,
/// [`StoreReadiness`], checks that the store answers and is migrated.
pub trait ReadinessProbe: Send + Sync + 'static {
    /// `Ok(())` when ready; otherwise a short, human-readable reason.
    fn ready(&self) -> ReadyFuture<'_>;
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

/// The default probe: the store is reachable and its schema is what this build needs.
#[derive(Clone)]
pub struct StoreReadiness {
    store: Store,
}

impl StoreReadiness {
    /// A probe of `store`.
    pub fn new(store: Store) -> Self {
        Self { store }
    }
}

impl ReadinessProbe for StoreReadiness {
    fn ready(&self) -> ReadyFuture<'_> {
        Box::pin(async move {
            self.store
                .ensure_migrated()
                .await
                .map_err(|e| format!("{} store: {e}", self.store.backend()))
        })
    }
}

/// How long `/readyz` waits for the probe before answering "fail".
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(5);

/// The state the router hands to every handler. Cheap to clone.
#[derive(Clone)]
pub struct ApiState {
    read_model: ReadModel,
    queue: Queue,
    readiness: Arc<dyn ReadinessProbe>,
    ready_timeout: Duration,
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
            read_model,
            queue,
            readiness: Arc::new(probe),
            ready_timeout: DEFAULT_READY_TIMEOUT,
        }
    }

    /// Replaces how long `/readyz` waits for the probe (default [`DEFAULT_READY_TIMEOUT`]).
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }

    /// Replaces the queue the topic and group figures and the dead letters are read through.
    ///
    /// It must sit over the same store as the read model: the group listing joins the two by
    /// group name, and nothing here can check that they agree.
    pub fn with_queue(mut self, queue: Queue) -> Self {
        self.queue = queue;
        self
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
        match tokio::time::timeout(self.ready_timeout, self.readiness.ready()).await {
            Ok(result) => result,
            Err(_) => Err(format!(
                "readiness check did not finish within {:?}",
                self.ready_timeout
            )),
        }
    }
}
