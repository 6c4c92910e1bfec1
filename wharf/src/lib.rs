//! Wharf as an embeddable library: declare a consumer group's binding set, wait visibly while a
//! live incumbent declares a different one, publish to the message log, handle the messages
//! the group's set routes to it, and read the ledger's projections.
//!
//! ```no_run
//! # async fn example() -> Result<(), wharf::WharfError> {
//! use wharf::{Registration, Settings, Wharf};
//!
//! let wharf = Wharf::open(&Settings::default()).await?; // ./wharf.db, migrated on open
//! let registration = Registration::new("billing", "orders", "2.4.1", &["orders/+/paid"])?;
//! let consumer = wharf.consume(registration);
//! // ... report `consumer.is_ready()` from your readiness probe ...
//! consumer.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! With a handler, the consumer also claims and handles messages while its declaration is in
//! effect, acking what succeeds and nacking what fails:
//!
//! ```no_run
//! # async fn example() -> Result<(), wharf::WharfError> {
//! use wharf::handler::handler_fn;
//! use wharf::queue::{Claimed, Headers};
//! use wharf::{Registration, Settings, Wharf};
//!
//! let wharf = Wharf::open(&Settings::default()).await?;
//! let registration = Registration::new("billing", "orders", "2.4.1", &["orders/+/paid"])?;
//! // A group is routed what is published once it exists: declare it before publishing.
//! wharf.register(&registration).await?;
//! let consumer = wharf.consume_with(
//!     registration,
//!     handler_fn(|message: Claimed| async move {
//!         println!("{} at {}", message.subject, message.position);
//!         Ok(())
//!     }),
//! );
//! wharf
//!     .publish("orders", vec![("orders/eu/paid".into(), b"{}".to_vec(), Headers::new())])
//!     .await?;
//! // ... on SIGTERM: stop claiming, drain running handlers, leave.
//! consumer.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! MQTT sessions live in `wharf-sessions`, the `wharf` binary (CLI, configuration file,
//! supervisor, HTTP server) in `wharf-server`: an application that embeds this crate compiles
//! neither.
//!
//! Architecture invariant: this crate wires the store, the projections, the queue and the
//! domain together for an embedding application and owns the consumers' clocks and timers; the
//! decisions themselves stay in `wharf-domain`. It knows nothing of MQTT, of configuration
//! files or of the command line.

mod acker;
mod claim_keeper;
pub mod config;
pub mod consumer;
pub mod declare;
pub mod declarer;
pub mod error;
mod fetch_retry;
pub mod handler;
pub mod health;
mod publish_listener;
mod route_ahead;
mod runtime;
mod slots;

use std::sync::Arc;

use wharf_domain::{ConsumerGroup, DeclarerId, GroupName, RegisterOutcome, TopicName};
use wharf_projections::ReadModel;
use wharf_queue::{Headers, Queue, RetentionReport};
use wharf_store::{PgSettings, PgStore, SqliteStore, Store, StoreLocation};

pub use config::Settings;
pub use consumer::{Consumer, ConsumerState};
pub use declare::Registration;
pub use error::WharfError;
pub use handler::{handler_fn, Handler, HandlerError};
pub use runtime::ConsumerStats;
pub use wharf_domain as domain;
pub use wharf_metrics as metrics;
pub use wharf_metrics::Metrics;
pub use wharf_projections as projections;
pub use wharf_queue as queue;
pub use wharf_store as store;

/// An open Wharf: a store with its projections and message log, and this process's declarer
/// identity (each consumer it starts is an instance with its own identity derived from it).
#[derive(Clone)]
pub struct Wharf {
    store: Store,
    read: ReadModel,
    queue: Queue,
    settings: config::DeclarationConfig,
    queue_config: config::QueueConfig,
    declarer: DeclarerId,
    instances: declarer::InstanceCounter,
    states: declare::GroupStates,
    listener: Arc<publish_listener::PublishListener>,
    metrics: Metrics,
    consumers: health::Registry,
}

impl Wharf {
    /// Opens the configured store, migrating it when `store.auto_migrate` is set and failing
    /// closed otherwise (an unreachable or unmigrated store is an error, never a fallback).
    ///
    /// Any number of processes may open one fresh store at once: schema creation and
    /// migration are serialized across processes (a Postgres advisory lock; SQLite's write
    /// lock). With `auto_migrate` off nothing is created. A store migrated by a newer build is
    /// opened without migrating, for reads and consumers, unless that build recorded that
    /// older builds must not read it (ADR 0017).
    pub async fn open(config: &Settings) -> Result<Self, WharfError> {
        let store = if config.store.auto_migrate {
            let store = open_store(&config.store).await?;
            if store.schema_version().await? > store.known_version() {
                store.ensure_migrated().await?;
                tracing::warn!(
                    found = store.schema_version().await?,
                    known = store.known_version(),
                    "the store was migrated by a newer build: reading and consuming only; \
                     migrate, prune, retention and rebuild refuse until this build is upgraded"
                );
            } else {
                store.migrate().await?;
            }
            store
        } else {
            let store = open_existing_store(&config.store).await?;
            store.ensure_migrated().await?;
            store
        };
        Ok(Self::with_store(store, config))
    }

    /// Wraps an already-open, migrated store.
    pub fn with_store(store: Store, config: &Settings) -> Self {
        let read = ReadModel::new(store.clone(), config.declarations.instance_ttl);
        let queue = Queue::new(store.clone(), config.queue.settings());
        Self {
            store,
            read,
            queue,
            settings: config.declarations.clone(),
            queue_config: config.queue.clone(),
            declarer: declarer::process_declarer(),
            instances: declarer::InstanceCounter::new(
                declarer::process_declarer(),
                declarer::process_instances(),
            ),
            states: declare::GroupStates::default(),
            listener: Arc::default(),
            metrics: Metrics::new(),
            consumers: health::Registry::default(),
        }
    }

    /// The same Wharf counting into `metrics` (for instance one shared by several `Wharf`s of
    /// one process, or one the application registers its own families on). Consumers started
    /// afterwards count there.
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// This Wharf's Prometheus metrics: what its consumers, publishes, pruner and retention
    /// did. Serve them with the listing API (`ApiState::with_metrics`), which adds the store's
    /// figures at scrape time (ADR 0021).
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The same Wharf acting as another declarer (tests that simulate several processes): its
    /// `register` uses `declarer`, and its consumers are the instances `declarer/1`,
    /// `declarer/2`, ... (numbered afresh for each call, as a new process would).
    pub fn as_declarer(&self, declarer: DeclarerId) -> Self {
        Self {
            instances: declarer::InstanceCounter::new(declarer.clone(), Arc::default()),
            declarer,
            ..self.clone()
        }
    }

    /// This process's declarer identity: what `register` records. Each consumer declares as its
    /// own instance, this identity plus `/N` ([`Consumer::declarer`]).
    pub fn declarer(&self) -> &DeclarerId {
        &self.declarer
    }

    /// The store underneath.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The read model: listing, audit, rebuild, prune.
    pub fn read_model(&self) -> &ReadModel {
        &self.read
    }

    /// The message log with the configured claim settings: publish, fetch, ack, dead letters,
    /// statistics.
    pub fn queue(&self) -> &Queue {
        &self.queue
    }

    /// Publishes a batch of `(subject, payload, headers)` to `topic` in one transaction, durable
    /// on return; returns the messages' positions in the topic. The whole batch is validated
    /// first: a bad message is named by its index (`messages[2].subject`) and nothing is
    /// written.
    #[tracing::instrument(skip_all, fields(topic = %topic, count = messages.len()))]
    pub async fn publish(
        &self,
        topic: &str,
        messages: Vec<(String, Vec<u8>, Headers)>,
    ) -> Result<Vec<i64>, WharfError> {
        let topic = TopicName::parse("topic", topic)?;
        let messages = wharf_queue::validate_batch(messages)?;
        match self.queue.publish(&topic, &messages).await {
            Ok(positions) => {
                self.metrics
                    .publish()
                    .published(topic.as_str(), positions.len() as u64);
                Ok(positions)
            }
            Err(e) => {
                if matches!(e, wharf_queue::QueueError::Store(_)) {
                    self.metrics
                        .store_errors()
                        .inc(wharf_metrics::StoreOperation::Publish);
                }
                Err(e.into())
            }
        }
    }

    /// One retention pass over the message log with the configured `queue.retention` and
    /// `queue.retention_batch`: deletes what every group is done with, and what aged out and
    /// no live group needs.
    /// Refused on a store migrated by a newer build.
    pub async fn retain_messages(&self) -> Result<RetentionReport, WharfError> {
        self.store.ensure_not_newer("message log retention").await?;
        let report = self
            .queue
            .retain(
                self.queue_config.retention,
                self.settings.instance_ttl,
                self.queue_config.retention_batch,
            )
            .await;
        match report {
            Ok(report) => {
                self.metrics.maintenance().retained(
                    report.messages,
                    report.orphaned_deliveries,
                    report.set_aside_dropped,
                );
                Ok(report)
            }
            Err(e) => {
                self.metrics
                    .store_errors()
                    .inc(wharf_metrics::StoreOperation::Retention);
                Err(e.into())
            }
        }
    }

    /// Runs the deferred pruner of the declaration ledger once (superseded waiting attempts
    /// older than `options.retention`), counting what it deleted in [`Wharf::metrics`].
    /// Refused on a store migrated by a newer build.
    pub async fn prune_declarations(
        &self,
        options: wharf_projections::PruneOptions,
    ) -> Result<wharf_projections::PruneReport, WharfError> {
        match self.read.prune(options).await {
            Ok(report) => {
                self.metrics.maintenance().pruned(report.deleted);
                Ok(report)
            }
            Err(e) => {
                self.metrics
                    .store_errors()
                    .inc(wharf_metrics::StoreOperation::Prune);
                Err(e.into())
            }
        }
    }

    /// The group's folded state as this `Wharf` holds it after its last attempt on the group,
    /// and the ledger sequence it folds up to (`None` before any attempt, or after one that
    /// failed). A copy, for diagnostics and tests: the next attempt decides on exactly this.
    pub async fn held_group_state(&self, group: &GroupName) -> Option<(i64, ConsumerGroup)> {
        self.states.held(group.as_str()).await
    }

    /// Attempts the declaration once and returns the outcome: joined, installed, or waiting
    /// (with the incumbent set and its live declarers). Records no heartbeat: only `consume`
    /// makes this instance a live declarer.
    #[tracing::instrument(skip_all, fields(group = %registration.group, declarer = %self.declarer))]
    pub async fn register(
        &self,
        registration: &Registration,
    ) -> Result<RegisterOutcome, WharfError> {
        let outcome = self.attempter().attempt(registration, false, None).await?;
        tracing::info!(?outcome, bindings = %registration.bindings, "register attempted");
        Ok(outcome)
    }

    /// Declares the static set of a seeded system group (e.g. the alert consumers). Its
    /// consumers join at their own `register`/`consume` with the same set.
    #[tracing::instrument(skip_all, fields(group = %registration.group))]
    pub async fn register_system(
        &self,
        registration: &Registration,
    ) -> Result<RegisterOutcome, WharfError> {
        self.register(registration).await
    }

    /// Starts a consumer: it re-attempts the declaration every `retry_interval` until it joins
    /// or installs, then heartbeats. Not ready while waiting. No timeout.
    ///
    /// Each consumer is its own instance, with its own declarer identity and heartbeat row: two
    /// consumers of one group in one process behave like two processes (with different sets,
    /// the second waits). A consumer whose heartbeat goes unconfirmed for `instance_ttl` stops
    /// being ready and re-declares before it claims again.
    ///
    /// This consumer only declares and heartbeats; see [`Wharf::consume_with`] to also handle
    /// messages.
    pub fn consume(&self, registration: Registration) -> Consumer {
        let group = registration.group.as_str().to_owned();
        let consumer = consumer::start(self.lifecycle(registration), None);
        self.consumers.track(&group, &consumer);
        consumer
    }

    /// Every consumer this Wharf (or a clone) started that still runs, with its state: what
    /// deep health reports as this process's consumers.
    pub fn consumer_health(&self) -> Vec<health::ConsumerHealth> {
        self.consumers.report()
    }

    /// Starts a consumer like [`Wharf::consume`] that also handles the group's messages while
    /// its declaration is in effect (never while it waits): it claims up to
    /// `queue.concurrency` messages at a time, runs `handler` on each, acks on success and
    /// nacks with the error on failure or panic. [`Consumer::shutdown`] stops claiming, drains
    /// running handlers within `queue.drain_timeout`, and then leaves the group.
    pub fn consume_with(&self, registration: Registration, handler: impl Handler) -> Consumer {
        let lifecycle = self.lifecycle(registration);
        let runtime = runtime::Runtime {
            queue: self.queue.clone(),
            store: self.store.clone(),
            listener: self.listener.clone(),
            group: lifecycle.registration.group.clone(),
            topic: lifecycle.registration.topic.clone(),
            instance: lifecycle.declarer.to_string(),
            handler: Arc::new(handler),
            config: self.queue_config.clone(),
            call_deadline: self.settings.call_deadline(),
            counters: Arc::default(),
            metrics: runtime::RuntimeMetrics::new(
                &self.metrics,
                lifecycle.registration.group.as_str(),
                lifecycle.registration.topic.as_str(),
            ),
        };
        let group = lifecycle.registration.group.as_str().to_owned();
        let consumer = consumer::start(lifecycle, Some(runtime));
        self.consumers.track(&group, &consumer);
        consumer
    }

    fn attempter(&self) -> declare::Attempter<'_> {
        declare::Attempter {
            store: &self.store,
            states: &self.states,
            declarer: &self.declarer,
            instance_ttl: self.settings.instance_ttl,
            snapshot_every: self.settings.snapshot_every,
        }
    }

    fn lifecycle(&self, registration: Registration) -> consumer::Lifecycle {
        consumer::Lifecycle {
            states: self.states.clone(),
            store: self.store.clone(),
            queue: self.queue.clone(),
            declarer: self.instances.next(),
            registration,
            settings: self.settings.clone(),
        }
    }
}

/// Opens (without migrating) the store a configuration names, creating the SQLite file or the
/// Postgres schema when missing (under a cross-process lock on Postgres).
pub async fn open_store(config: &config::StoreConfig) -> Result<Store, WharfError> {
    open_store_with(config, true).await
}

/// Opens the store a configuration names only if it exists: a missing SQLite file or Postgres
/// schema is [`wharf_store::StoreError::Missing`], and nothing is created. Read-only and
/// maintenance commands use this.
pub async fn open_existing_store(config: &config::StoreConfig) -> Result<Store, WharfError> {
    open_store_with(config, false).await
}

async fn open_store_with(config: &config::StoreConfig, create: bool) -> Result<Store, WharfError> {
    match StoreLocation::parse(&config.url)? {
        StoreLocation::Sqlite(path) => {
            let projectors = wharf_projections::sqlite_inline();
            let store = if create {
                SqliteStore::open(path, projectors).await?
            } else {
                SqliteStore::open_existing(path, projectors).await?
            };
            Ok(Store::Sqlite(store))
        }
        StoreLocation::Postgres(url) => {
            let settings = PgSettings {
                schema: (!config.schema.is_empty()).then(|| config.schema.clone()),
                max_connections: config.max_connections,
                ..PgSettings::new(url)
            };
            if create {
                PgStore::create_schema(&settings).await?;
            } else {
                PgStore::require_schema(&settings).await?;
            }
            Ok(Store::Postgres(PgStore::connect(
                &settings,
                wharf_projections::pg_inline(),
            )?))
        }
    }
}
