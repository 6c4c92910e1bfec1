//! Wharf's Prometheus metrics (ADR 0021), served by the API at `GET /metrics` in the text
//! exposition format 0.0.4.
//!
//! One [`Metrics`] per process (cheap to clone, no global registry) holds a
//! [`prometheus::Registry`] and one set of families per area:
//!
//! - [`ConsumerFamilies`]: what this process's consumers did (claims, acks, nacks, dead
//!   letters, lost claims), per group. A consumer resolves its group's series once, at start
//!   ([`ConsumerFamilies::for_group`]), so counting on the hot path is one atomic increment.
//! - [`PublishFamilies`]: messages this process published, per topic.
//! - [`MaintenanceFamilies`]: what this process's pruner and retention deleted.
//! - [`ConfigFamilies`]: the reload supervisor's (configuration degraded, last reload,
//!   generations, reload and reconcile outcomes), registered when a supervisor first uses them.
//! - [`StoreErrorFamilies`]: store calls of this process that failed, per operation (a short
//!   fixed list, never a message or a subject).
//!
//! Figures that live in the store (queue depth, waiters, projection lag) are not kept here:
//! a [`ScrapeCollector`] reads them when Prometheus scrapes, bounded by a timeout (the API's
//! store collector is one). A later area (MQTT sessions, leases, reloads) adds its own families
//! with [`Metrics::register`] and, when it reads at scrape time, its own collector with
//! [`Metrics::add_collector`].
//!
//! Naming: the `wharf_` prefix, base units (`_seconds`, counts), `_total` on counters; labels
//! are only ever a group, a topic, a projector, an operation or another name from a short
//! declared list, never a message, a subject or a declarer instance.

mod config;
mod consumer;
mod maintenance;
mod register;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use prometheus::core::Collector;
use prometheus::proto::MetricFamily;
use prometheus::{Encoder as _, IntCounterVec, Registry, TextEncoder};

use register::counter_vec;

pub use config::{ConfigFamilies, RECONCILE_OUTCOMES, RELOAD_OUTCOMES};
pub use consumer::{ConsumerFamilies, GroupCounters, PublishFamilies};
pub use maintenance::MaintenanceFamilies;

pub use prometheus;

/// The content type of [`Metrics::render`]'s output: the text exposition format 0.0.4.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The future a [`ScrapeCollector`] returns.
pub type CollectFuture<'a> = Pin<Box<dyn Future<Output = Vec<MetricFamily>> + Send + 'a>>;

/// Reads figures at scrape time (from the store, say) and returns them as metric families.
///
/// It must answer within `timeout` and must not fail: when its source does not answer, it says
/// so in its own families (the store collector sets `wharf_store_up` to 0) and leaves out what
/// it could not read.
pub trait ScrapeCollector: Send + Sync + 'static {
    /// The families read now.
    fn collect(&self, timeout: Duration) -> CollectFuture<'_>;
}

/// The process's metrics: a registry with every area's families, and the scrape-time
/// collectors. Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    collectors: RwLock<Vec<Arc<dyn ScrapeCollector>>>,
    consumers: ConsumerFamilies,
    publish: PublishFamilies,
    maintenance: MaintenanceFamilies,
    store_errors: StoreErrorFamilies,
    config: OnceLock<ConfigFamilies>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// A fresh registry with every area's families registered (and no series yet).
    pub fn new() -> Self {
        let registry = Registry::new();
        let consumers = ConsumerFamilies::new(&registry);
        let publish = PublishFamilies::new(&registry);
        let maintenance = MaintenanceFamilies::new(&registry);
        let store_errors = StoreErrorFamilies::new(&registry);
        Self {
            inner: Arc::new(Inner {
                registry,
                collectors: RwLock::default(),
                consumers,
                publish,
                maintenance,
                store_errors,
                config: OnceLock::new(),
            }),
        }
    }

    /// The consumers' counters.
    pub fn consumers(&self) -> &ConsumerFamilies {
        &self.inner.consumers
    }

    /// The publish counters.
    pub fn publish(&self) -> &PublishFamilies {
        &self.inner.publish
    }

    /// The pruner's and retention's counters.
    pub fn maintenance(&self) -> &MaintenanceFamilies {
        &self.inner.maintenance
    }

    /// The store-error counters.
    pub fn store_errors(&self) -> &StoreErrorFamilies {
        &self.inner.store_errors
    }

    /// The reload supervisor's families, registered on first use.
    pub fn config(&self) -> &ConfigFamilies {
        self.inner
            .config
            .get_or_init(|| ConfigFamilies::new(&self.inner.registry))
    }

    /// Registers another area's family (a counter or gauge vector, say). Fails on a name
    /// already registered.
    pub fn register(&self, family: Box<dyn Collector>) -> prometheus::Result<()> {
        self.inner.registry.register(family)
    }

    /// Adds a collector that runs at every scrape.
    pub fn add_collector(&self, collector: Arc<dyn ScrapeCollector>) {
        self.inner
            .collectors
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(collector);
    }

    /// Renders every registered family, then what the registered collectors and `extra` read
    /// now (each bounded by `timeout`), in the text exposition format 0.0.4.
    pub async fn render(&self, extra: &[&dyn ScrapeCollector], timeout: Duration) -> String {
        let registered: Vec<Arc<dyn ScrapeCollector>> = self
            .inner
            .collectors
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut families = Vec::new();
        for collector in &registered {
            families.push(collector.collect(timeout).await);
        }
        for collector in extra {
            families.push(collector.collect(timeout).await);
        }
        let mut text = encode(&self.inner.registry.gather());
        for read in &families {
            text.push_str(&encode(read));
        }
        text
    }
}

/// Encodes `families` in the text format; a family with no series is left out, and one the
/// encoder refuses is logged and left out.
pub fn encode(families: &[MetricFamily]) -> String {
    let encoder = TextEncoder::new();
    let mut text = String::new();
    for family in families.iter().filter(|f| !f.get_metric().is_empty()) {
        let mut one = Vec::new();
        match encoder.encode(std::slice::from_ref(family), &mut one) {
            Ok(()) => text.push_str(&String::from_utf8_lossy(&one)),
            Err(e) => tracing::error!(error = %e, "a metric family could not be encoded"),
        }
    }
    text
}

/// Store calls of this process that failed, by operation.
#[derive(Clone)]
pub struct StoreErrorFamilies {
    errors: IntCounterVec,
}

/// The operations [`StoreErrorFamilies`] counts failures of: a fixed list, so the label stays
/// low-cardinality.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOperation {
    /// A consumer's fetch (claim, with routing).
    Fetch,
    /// An ack.
    Ack,
    /// A nack.
    Nack,
    /// A publish.
    Publish,
    /// The deferred pruner.
    Prune,
    /// Message log retention.
    Retention,
    /// The catch-up projection loop.
    CatchUp,
    /// The `/metrics` scrape's own store reads.
    Scrape,
}

impl StoreOperation {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fetch => "fetch",
            Self::Ack => "ack",
            Self::Nack => "nack",
            Self::Publish => "publish",
            Self::Prune => "prune",
            Self::Retention => "retention",
            Self::CatchUp => "catch_up",
            Self::Scrape => "scrape",
        }
    }
}

impl StoreErrorFamilies {
    fn new(registry: &Registry) -> Self {
        let errors = counter_vec(
            registry,
            "wharf_store_errors_total",
            "Store calls of this process that failed or missed their deadline, by operation.",
            &["operation"],
        );
        Self { errors }
    }

    /// Counts one failed store call.
    pub fn inc(&self, operation: StoreOperation) {
        self.errors.with_label_values(&[operation.as_str()]).inc();
    }

    /// The counter of one operation, resolved once (one atomic increment per count).
    pub fn counter(&self, operation: StoreOperation) -> prometheus::IntCounter {
        self.errors.with_label_values(&[operation.as_str()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn families_appear_once_they_have_a_series_and_name_the_format() {
        let metrics = Metrics::new();
        let fresh = metrics.render(&[], Duration::from_secs(1)).await;
        assert!(
            fresh.contains("wharf_retention_messages_deleted_total 0\n"),
            "{fresh}"
        );
        assert!(!fresh.contains("wharf_claims_total"), "{fresh}");
        let group = metrics.consumers().for_group("billing", "orders");
        group.claimed(3);
        group.acked();
        metrics.publish().published("orders", 2);
        metrics.store_errors().inc(StoreOperation::Fetch);
        let text = metrics.render(&[], Duration::from_secs(1)).await;
        assert!(
            text.contains("# TYPE wharf_claims_total counter\n"),
            "{text}"
        );
        assert!(
            text.contains("wharf_claims_total{group=\"billing\",topic=\"orders\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("wharf_published_messages_total{topic=\"orders\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("wharf_store_errors_total{operation=\"fetch\"} 1\n"),
            "{text}"
        );
    }
}
