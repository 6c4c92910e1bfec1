//! `GET /metrics`: Prometheus text exposition format 0.0.4 (ADR 0021).
//!
//! The process's counters come from the [`Metrics`] handle the state carries (the library's
//! consumers, publishes, pruner and retention count into it); the store's figures are read at
//! scrape time by [`StoreCollector`], through the read model and the queue's listing reads (the
//! same reads as `/api/v1/groups` and `/api/v1/topics`), all within the scrape timeout. When the
//! store does not answer in time or fails, `wharf_store_up` is 0, what could not be read is
//! left out, and the answer is still 200 with every process counter.

use std::time::{Duration, Instant};

use tracing::Instrument;
use wharf_metrics::prometheus::core::Collector;
use wharf_metrics::prometheus::proto::MetricFamily;
use wharf_metrics::prometheus::{Gauge, GaugeVec, IntCounterVec, Opts, Registry};
use wharf_metrics::{CollectFuture, ScrapeCollector, StoreOperation};
use wharf_projections::{GroupView, ProjectionLag, ReadModel, WaiterView};
use wharf_queue::{GroupQueueStats, Queue, TopicStats};

pub use wharf_metrics::{Metrics, CONTENT_TYPE};

/// How long a scrape waits for the store's figures by default.
pub const DEFAULT_SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// Reads the store's figures at scrape time: per group (declaration, waiters, instances, queue),
/// per topic, and the catch-up projectors' lag.
#[derive(Clone)]
pub struct StoreCollector {
    read_model: ReadModel,
    queue: Queue,
    metrics: Metrics,
}

impl StoreCollector {
    /// A collector over `read_model` and `queue` (which must sit over the same store), counting
    /// its own store failures into `metrics`.
    pub fn new(read_model: ReadModel, queue: Queue, metrics: Metrics) -> Self {
        Self {
            read_model,
            queue,
            metrics,
        }
    }
}

/// What one scrape read; `None` where the read failed or did not finish.
#[derive(Default)]
struct StoreReading {
    groups: Option<Vec<GroupView>>,
    lag: Option<Vec<ProjectionLag>>,
    queues: Option<Vec<GroupQueueStats>>,
    topics: Option<Vec<TopicStats>>,
}

impl StoreReading {
    fn complete(&self) -> bool {
        self.groups.is_some()
            && self.lag.is_some()
            && self.queues.is_some()
            && self.topics.is_some()
    }
}

fn ok<T, E: std::fmt::Display>(what: &str, result: Result<T, E>) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(e) => {
            tracing::warn!(error = %e, read = what, "a /metrics store read failed");
            None
        }
    }
}

impl StoreCollector {
    async fn read(&self, timeout: Duration) -> StoreReading {
        // The listing catches up first; the lag read after it shows what catch-up left behind.
        let (read_model, queue) = (self.read_model.clone(), self.queue.clone());
        let declarations = async move {
            let groups = ok("groups", read_model.groups().await);
            let lag = ok("projection lag", read_model.projection_lag().await);
            (groups, lag)
        };
        let reads = async move {
            tokio::join!(
                declarations,
                async { ok("group queues", queue.group_stats(None).await) },
                async { ok("topics", queue.topic_stats().await) },
            )
        };
        // Past the scrape timeout the reads go on to their end in their task, so none is
        // dropped mid-statement holding its connection (ADR 0067).
        let reads = tokio::spawn(reads.instrument(tracing::Span::current()));
        match tokio::time::timeout(timeout, reads).await {
            Ok(Ok(((groups, lag), queues, topics))) => StoreReading {
                groups,
                lag,
                queues,
                topics,
            },
            Ok(Err(failed)) => {
                tracing::warn!(error = %failed, "the /metrics store reads failed");
                StoreReading::default()
            }
            Err(_) => {
                tracing::warn!(
                    timeout = ?timeout,
                    "the /metrics store reads did not finish within the scrape timeout"
                );
                StoreReading::default()
            }
        }
    }
}

impl ScrapeCollector for StoreCollector {
    fn collect(&self, timeout: Duration) -> CollectFuture<'_> {
        Box::pin(async move {
            let started = Instant::now();
            let reading = self.read(timeout).await;
            if !reading.complete() {
                self.metrics.store_errors().inc(StoreOperation::Scrape);
            }
            let ttl = self.read_model.instance_ttl().as_secs_f64();
            families(&reading, ttl, started.elapsed())
        })
    }
}

/// The MQTT session runtimes' figures, read from their reports at scrape time (no store
/// read): the level as a state set, readiness, and the ingest counters. Labelled by the
/// configured session name, a handful per process.
pub struct SessionCollector {
    source: crate::sessions::SharedSessionSource,
}

impl SessionCollector {
    /// A collector over this process's session runtimes.
    pub fn new(source: crate::sessions::SharedSessionSource) -> Self {
        Self { source }
    }
}

/// The levels a session reports, in order (the state set's `level` label values).
pub const SESSION_LEVELS: [&str; 5] = [
    "starting",
    "connected",
    "subscribed",
    "full",
    "migration_required",
];

impl ScrapeCollector for SessionCollector {
    fn collect(&self, _timeout: Duration) -> CollectFuture<'_> {
        let sessions = self.source.sessions();
        Box::pin(async move { session_families(&sessions) })
    }
}

fn session_families(sessions: &[crate::sessions::LiveSession]) -> Vec<MetricFamily> {
    let sheet = Sheet(Registry::new());
    let level = sheet.gauges(
        "wharf_mqtt_session_level",
        "The session's readiness level as a state set: 1 for the level it is at, 0 for the others.",
        &["session", "level"],
    );
    let ready = sheet.gauges(
        "wharf_mqtt_session_ready",
        "1 while the session is at full (history equals desired, every filter granted).",
        &["session"],
    );
    let pending = sheet.gauges(
        "wharf_mqtt_session_pending_stale_filters",
        "History filters not desired, awaiting removal.",
        &["session"],
    );
    let held = sheet.gauges(
        "wharf_mqtt_session_held_deliveries",
        "Deliveries held unacked (coverage protection, replays after a removal) since start.",
        &["session"],
    );
    let ingested = sheet.counters(
        "wharf_mqtt_session_ingested_total",
        "Messages handled and acked to the broker after the handler (the log append) succeeded.",
        &["session"],
    );
    let dropped = sheet.counters(
        "wharf_mqtt_session_dropped_unmatched_total",
        "Deliveries that matched no filter, acked and dropped after mqtt.unmatched_grace.",
        &["session"],
    );
    let lease_held = sheet.gauges(
        "wharf_mqtt_session_lease_held",
        "1 while this process holds the exclusive session's HA lease (and may act on it).",
        &["session"],
    );
    let lease_token = sheet.gauges(
        "wharf_mqtt_session_lease_token",
        "The fencing token of the lease holder this process last saw (itself when held).",
        &["session"],
    );
    let transitions = sheet.counters(
        "wharf_mqtt_session_lease_transitions_total",
        "Times this process became or stopped being the exclusive session's lease holder.",
        &["session"],
    );
    for s in sessions {
        let name = s.name.as_str();
        if let Some(lease) = &s.lease {
            lease_held
                .with_label_values(&[name])
                .set(f64::from(u8::from(lease.held)));
            if let Some(token) = lease.token {
                lease_token.with_label_values(&[name]).set(token as f64);
            }
            transitions
                .with_label_values(&[name])
                .inc_by(lease.transitions);
        }
        for l in SESSION_LEVELS {
            level
                .with_label_values(&[name, l])
                .set(if s.level == l { 1.0 } else { 0.0 });
        }
        ready
            .with_label_values(&[name])
            .set(f64::from(u8::from(s.ready)));
        pending
            .with_label_values(&[name])
            .set(s.pending_stale.len() as f64);
        held.with_label_values(&[name]).set(s.held as f64);
        ingested.with_label_values(&[name]).inc_by(s.ingested);
        dropped
            .with_label_values(&[name])
            .inc_by(s.dropped_unmatched);
    }
    sheet.0.gather()
}

/// A per-scrape registry: the families of one reading.
struct Sheet(Registry);

impl Sheet {
    fn add<C: Collector + Clone + 'static>(&self, family: C) -> C {
        if let Err(e) = self.0.register(Box::new(family.clone())) {
            tracing::error!(error = %e, "a /metrics family could not be registered");
        }
        family
    }

    // The definitions are this module's constants, all rendered by its tests: a malformed one
    // is a programming error.
    fn gauge(&self, name: &str, help: &str) -> Gauge {
        let gauge = Gauge::with_opts(Opts::new(name, help))
            .unwrap_or_else(|e| panic!("metric {name} is malformed: {e}"));
        self.add(gauge)
    }

    fn gauges(&self, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
        let gauges = GaugeVec::new(Opts::new(name, help), labels)
            .unwrap_or_else(|e| panic!("metric {name} is malformed: {e}"));
        self.add(gauges)
    }

    fn counters(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        let counters = IntCounterVec::new(Opts::new(name, help), labels)
            .unwrap_or_else(|e| panic!("metric {name} is malformed: {e}"));
        self.add(counters)
    }
}

const GROUP: &[&str] = &["group", "topic"];

/// A per-group queue gauge: its name, help, and how to read it from the group's figures.
type QueueFigure = (&'static str, &'static str, fn(&GroupQueueStats) -> i64);

fn families(reading: &StoreReading, ttl: f64, took: Duration) -> Vec<MetricFamily> {
    let sheet = Sheet(Registry::new());
    sheet
        .gauge(
            "wharf_store_up",
            "1 when every store read of this scrape answered within the scrape timeout, else 0.",
        )
        .set(if reading.complete() { 1.0 } else { 0.0 });
    sheet
        .gauge(
            "wharf_store_scrape_duration_seconds",
            "How long this scrape's store reads took.",
        )
        .set(took.as_secs_f64());

    if let Some(groups) = &reading.groups {
        sheet
            .gauge("wharf_groups", "Declared consumer groups.")
            .set(groups.len() as f64);
        let waiters = sheet.gauges(
            "wharf_group_waiters",
            "Open waiting declarations: a different set, still retrying (newest attempt within \
             the instance TTL), waiting on a live incumbent.",
            GROUP,
        );
        let silent = sheet.gauges(
            "wharf_group_silent_waiters",
            "Waiting declarations whose newest attempt is older than the instance TTL (their \
             process stopped retrying or died); listed until resolved.",
            GROUP,
        );
        let oldest_wait = sheet.gauges(
            "wharf_group_oldest_wait_age_seconds",
            "How long the group's oldest open (still retrying) waiting declaration has waited \
             (absent with none).",
            GROUP,
        );
        let live = sheet.gauges(
            "wharf_group_live_instances",
            "Instances with a heartbeat fresher than the instance TTL.",
            GROUP,
        );
        let installs = sheet.counters(
            "wharf_group_installs_total",
            "Binding sets installed for the group (first install and swaps), from the ledger.",
            GROUP,
        );
        for view in groups {
            let labels = [view.group.as_str(), view.topic.as_str()];
            let (open, stopped): (Vec<&WaiterView>, Vec<&WaiterView>) =
                view.waiters.iter().partition(|w| w.silent_seconds <= ttl);
            waiters.with_label_values(&labels).set(open.len() as f64);
            silent.with_label_values(&labels).set(stopped.len() as f64);
            let oldest = open.iter().map(|w| w.waiting_seconds).reduce(f64::max);
            if let Some(seconds) = oldest {
                oldest_wait.with_label_values(&labels).set(seconds.max(0.0));
            }
            let live_count = view.instances.iter().filter(|i| i.live).count();
            live.with_label_values(&labels).set(live_count as f64);
            installs
                .with_label_values(&labels)
                .inc_by(u64::try_from(view.effective.installs).unwrap_or(0));
        }
    }

    if let Some(queues) = &reading.queues {
        let figures: [QueueFigure; 7] = [
            (
                "wharf_group_claimable_messages",
                "Routed messages claimable now.",
                |q| q.claimable,
            ),
            (
                "wharf_group_in_flight_messages",
                "Messages claimed and neither acked nor expired.",
                |q| q.in_flight,
            ),
            (
                "wharf_group_backing_off_messages",
                "Nacked messages waiting out their backoff.",
                |q| q.backing_off,
            ),
            (
                "wharf_group_dead_letters",
                "Messages in the group's dead letters now.",
                |q| q.dead_letters,
            ),
            (
                "wharf_group_set_aside_deliveries",
                "Unacked deliveries set aside by swaps: the set in effect does not match them \
                 (a rollback restores them; retention drops them when they age out).",
                |q| q.set_aside,
            ),
            (
                "wharf_group_rescan_remaining_positions",
                "Log positions the install in effect still has to rescan after its swap.",
                |q| q.rescan_remaining,
            ),
            (
                "wharf_group_routing_lag_positions",
                "Topic positions published but not yet routed for the group.",
                |q| q.routed_lag,
            ),
        ];
        for (name, help, value) in figures {
            let family = sheet.gauges(name, help, GROUP);
            for q in queues {
                family
                    .with_label_values(&[q.group.as_str(), q.topic.as_str()])
                    .set(value(q) as f64);
            }
        }
        let oldest = sheet.gauges(
            "wharf_group_oldest_unacked_age_seconds",
            "Seconds since the oldest routed but unacked message was published (absent when \
             none is unacked).",
            GROUP,
        );
        for q in queues {
            if let Some(seconds) = q.oldest_unacked_seconds {
                oldest
                    .with_label_values(&[q.group.as_str(), q.topic.as_str()])
                    .set(seconds.max(0.0));
            }
        }
    }

    if let Some(topics) = &reading.topics {
        let head = sheet.gauges(
            "wharf_topic_head_position",
            "The topic's last assigned log position (0 when nothing was published).",
            &["topic"],
        );
        let size = sheet.gauges(
            "wharf_topic_retained_messages",
            "Messages the topic's log retains now.",
            &["topic"],
        );
        for t in topics {
            head.with_label_values(&[t.topic.as_str()])
                .set(t.head as f64);
            size.with_label_values(&[t.topic.as_str()])
                .set(t.size as f64);
        }
    }

    if let Some(lags) = &reading.lag {
        let lag = sheet.gauges(
            "wharf_projection_lag_events",
            "Events in the ledger a catch-up projector has not applied, read after this \
             scrape's own catch-up: above 0 for long means the projector fails or falls behind.",
            &["projector"],
        );
        for l in lags {
            lag.with_label_values(&[l.projector]).set(l.behind as f64);
        }
    }
    sheet.0.gather()
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Utc};
    use wharf_projections::{EffectiveView, InstanceView};

    use super::*;

    fn view() -> GroupView {
        let at = DateTime::<Utc>::UNIX_EPOCH;
        GroupView {
            group: "billing".into(),
            topic: "orders".into(),
            effective: EffectiveView {
                patterns: vec!["orders/+".into()],
                whole_topic: false,
                declarer: "h:1:aa/1".into(),
                version: "1".into(),
                declared_at: at,
                installed_at: at,
                position: 3,
                installs: 2,
                previous: None,
            },
            waiters: [(120.0, 1.0), (7.5, 2.0), (900.0, 600.0)]
                .into_iter()
                .map(|(waiting_seconds, silent_seconds)| WaiterView {
                    declarer: "h:2:bb/1".into(),
                    version: "2".into(),
                    patterns: vec!["orders/#".into()],
                    incumbent: vec!["orders/+".into()],
                    declared_at: at,
                    last_attempt_at: at,
                    waiting_seconds,
                    silent_seconds,
                })
                .collect(),
            waiters_next_after: None,
            instances: [true, false]
                .into_iter()
                .map(|live| InstanceView {
                    declarer: "h:1:aa/1".into(),
                    version: "1".into(),
                    patterns: vec!["orders/+".into()],
                    started_at: at,
                    heartbeat_at: at,
                    live,
                })
                .collect(),
            instances_next_after: None,
        }
    }

    fn queue() -> GroupQueueStats {
        GroupQueueStats {
            group: "billing".into(),
            topic: "orders".into(),
            routed_position: 9,
            routed_lag: 1,
            claimable: 4,
            in_flight: 2,
            backing_off: 1,
            dead_letters: 3,
            oldest_unacked_seconds: None,
            set_aside: 5,
            rescan_remaining: 6,
        }
    }

    #[test]
    fn a_complete_reading_renders_every_family() {
        let reading = StoreReading {
            groups: Some(vec![view()]),
            lag: Some(vec![ProjectionLag {
                projector: "declarer_attempts",
                behind: 0,
            }]),
            queues: Some(vec![queue()]),
            topics: Some(vec![TopicStats {
                topic: "orders".into(),
                head: 10,
                size: 8,
            }]),
        };
        let text = wharf_metrics::encode(&families(&reading, 30.0, Duration::from_millis(5)));
        let g = "{group=\"billing\",topic=\"orders\"}";
        for line in [
            "wharf_store_up 1".to_owned(),
            "wharf_groups 1".to_owned(),
            format!("wharf_group_waiters{g} 2"),
            format!("wharf_group_silent_waiters{g} 1"),
            format!("wharf_group_oldest_wait_age_seconds{g} 120"),
            format!("wharf_group_live_instances{g} 1"),
            format!("wharf_group_installs_total{g} 2"),
            format!("wharf_group_claimable_messages{g} 4"),
            format!("wharf_group_in_flight_messages{g} 2"),
            format!("wharf_group_backing_off_messages{g} 1"),
            format!("wharf_group_dead_letters{g} 3"),
            format!("wharf_group_set_aside_deliveries{g} 5"),
            format!("wharf_group_rescan_remaining_positions{g} 6"),
            format!("wharf_group_routing_lag_positions{g} 1"),
            "wharf_topic_head_position{topic=\"orders\"} 10".to_owned(),
            "wharf_topic_retained_messages{topic=\"orders\"} 8".to_owned(),
            "wharf_projection_lag_events{projector=\"declarer_attempts\"} 0".to_owned(),
        ] {
            assert!(
                text.contains(&format!("{line}\n")),
                "{line} missing:\n{text}"
            );
        }
        assert!(text.contains("# TYPE wharf_group_installs_total counter\n"));
        assert!(
            !text.contains("wharf_group_oldest_unacked_age_seconds"),
            "{text}"
        );
    }

    #[test]
    fn a_failed_reading_is_store_up_0_and_nothing_else_from_the_store() {
        let reading = StoreReading {
            topics: Some(Vec::new()),
            ..StoreReading::default()
        };
        let text = wharf_metrics::encode(&families(&reading, 30.0, Duration::from_millis(5)));
        assert!(text.contains("wharf_store_up 0\n"), "{text}");
        assert!(!text.contains("wharf_groups"), "{text}");
    }
}
