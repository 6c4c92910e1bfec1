//! `GET /metrics` (ADR 0021) on real stores, both backends: the listing API is started on an
//! ephemeral port over the application's `Wharf` (its metrics handle included), a workload
//! runs (a consumer with a handler, a waiting declaration, publishes, claims, acks, a nack to
//! the dead letters, a swap that sets deliveries aside), and the scrape is parsed strictly as
//! the text exposition format 0.0.4 and checked series by series while the consumer still
//! runs. A store that does not answer is `wharf_store_up 0` with a 200 and the process's
//! counters, within the scrape timeout.

use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use wharf::config::QueueConfig;
use wharf::domain::{DeclarerId, RegisterOutcome};
use wharf::handler::{handler_fn, HandlerError};
use wharf::projections::ReadModel;
use wharf::queue::{Claimed, Headers};
use wharf::store::{PgSettings, PgStore, Store};
use wharf::{Metrics, Registration, Wharf};
use wharf_api::ApiState;
use wharf_tests::fixtures::group;
use wharf_tests::prometheus_text::{self, Scrape};
use wharf_tests::{on_both_backends, wait_until, Backend, TestStore};

/// Every response these tests receive is held to the generated OpenAPI document (ADR 0033).
#[path = "../../api/tests/support/contract.rs"]
#[allow(dead_code)]
mod contract;

const DEADLINE: Duration = Duration::from_secs(20);

/// The API on an ephemeral loopback port.
struct App {
    base: String,
    client: reqwest::Client,
    stop: oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
}

impl App {
    async fn start(state: ApiState) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(wharf_api::serve(listener, state, async move {
            let _ = stopped.await;
        }));
        Self {
            base,
            client: reqwest::Client::new(),
            stop,
            task,
        }
    }

    /// GETs `/metrics`, checks the status and content type, and parses the body strictly.
    async fn scrape(&self) -> Scrape {
        let response = self
            .client
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200);
        let content_type = response.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(
            content_type.starts_with("text/plain; version=0.0.4"),
            "content-type {content_type:?}"
        );
        let text = response.text().await.unwrap();
        contract::assert_conforms("GET", "/metrics", 200, &content_type, &text);
        let scrape = prometheus_text::parse(&text)
            .unwrap_or_else(|e| panic!("not the text format 0.0.4: {e}\n{text}"));
        check_conventions(&scrape);
        scrape
    }

    async fn get_status(&self, path: &str) -> u16 {
        let response = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let text = response.text().await.unwrap();
        contract::assert_conforms("GET", path, status, &content_type, &text);
        status
    }

    async fn shut_down(self) {
        self.stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the server did not stop")
            .unwrap()
            .unwrap();
    }
}

/// Prometheus naming and cardinality: the `wharf_` prefix, `_total` on (and only on)
/// counters, help on every family, and labels only from a short declared list (never a
/// message, a subject, a position or a declarer instance).
fn check_conventions(scrape: &Scrape) {
    const LABELS: [&str; 7] = [
        "group",
        "topic",
        "projector",
        "operation",
        "task",
        "session",
        "level",
    ];
    for (name, family) in &scrape.families {
        assert!(name.starts_with("wharf_"), "{name}: no wharf_ prefix");
        assert_eq!(
            family.kind == "counter",
            name.ends_with("_total"),
            "{name} ({}): counters, and only they, end in _total",
            family.kind
        );
        assert!(
            family.help.as_deref().is_some_and(|h| !h.is_empty()),
            "{name} has no help"
        );
        for sample in &family.samples {
            for label in sample.labels.keys() {
                assert!(LABELS.contains(&label.as_str()), "{name}: label {label}");
            }
        }
    }
}

fn message(subject: &str) -> (String, Vec<u8>, Headers) {
    (
        subject.to_owned(),
        subject.as_bytes().to_vec(),
        Headers::new(),
    )
}

fn other(wharf: &Wharf, name: &str) -> Wharf {
    wharf.as_declarer(DeclarerId::parse("declarer", name).unwrap())
}

async fn a_scrape_shows_the_workload(backend: Backend) {
    let store = TestStore::new(backend).await;
    let mut config = store.config();
    // A long TTL: the waiting declaration below must see the consumer live however loaded the
    // machine is. One attempt: a failed handler's nack dead-letters at once.
    config.declarations.instance_ttl = Duration::from_secs(30);
    config.declarations.heartbeat_interval = Duration::from_secs(1);
    config.queue = QueueConfig {
        max_attempts: 1,
        poll_interval: Duration::from_millis(20),
        ..QueueConfig::default()
    };
    let wharf = Wharf::with_store(store.store.clone(), &config.settings());
    let read = ReadModel::new(store.store.clone(), config.declarations.instance_ttl);
    let state = ApiState::new(read)
        .with_queue(wharf.queue().clone())
        .with_metrics(wharf.metrics().clone());
    let app = App::start(state).await;

    // Before anything: the store answers, nothing is declared, the log is empty.
    let empty = app.scrape().await;
    assert_eq!(empty.expect("wharf_store_up", &[]), 1.0);
    assert_eq!(empty.expect("wharf_groups", &[]), 0.0);
    assert_eq!(
        empty.expect(
            "wharf_projection_lag_events",
            &[("projector", "declarer_attempts")]
        ),
        0.0
    );

    // billing: a consumer of orders/eu/+ that fails orders/eu/bad.
    let registration = Registration::new("billing", "orders", "1", &["orders/eu/+"]).unwrap();
    let consumer = wharf.consume_with(
        registration,
        handler_fn(|message: Claimed| async move {
            if message.subject.ends_with("/bad") {
                Err(HandlerError::new("refused"))
            } else {
                Ok(())
            }
        }),
    );
    let mut state = consumer.watch();
    tokio::time::timeout(DEADLINE, state.wait_for(|s| s.is_ready()))
        .await
        .expect("the consumer did not start consuming")
        .unwrap();
    // A different set for billing waits on the live consumer.
    let wider = Registration::new("billing", "orders", "2", &["orders/#"]).unwrap();
    let outcome = other(&wharf, "deploy-2:1:aa")
        .register(&wider)
        .await
        .unwrap();
    assert!(
        matches!(outcome, RegisterOutcome::Waiting { .. }),
        "{outcome:?}"
    );

    // audit: declared with no live instance, so a new set swaps in at once.
    let audit = Registration::new("audit", "orders", "1", &["orders/+/paid"]).unwrap();
    other(&wharf, "audit-1:1:aa")
        .register(&audit)
        .await
        .unwrap();

    let published = wharf
        .publish(
            "orders",
            vec![
                message("orders/eu/paid"),
                message("orders/eu/paid"),
                message("orders/eu/bad"),
                message("orders/us/paid"),
                message("orders/us/paid"),
            ],
        )
        .await
        .unwrap();
    assert_eq!(published, [1, 2, 3, 4, 5]);

    // billing handles 1, 2 (acked) and 3 (nacked, dead-lettered).
    wait_until("billing handled its three messages", DEADLINE, || {
        let stats = consumer.stats();
        async move { stats.handled_ok == 2 && stats.handled_err == 1 }
    })
    .await;

    // audit: the first fetch routes 1, 2, 4, 5 and claims 1 and 2 (in flight).
    let queue = wharf.queue();
    let claimed = queue
        .fetch(&group("audit"), "auditor:1:aa/1", 2)
        .await
        .unwrap();
    let positions: Vec<i64> = claimed.iter().map(|c| c.position).collect();
    assert_eq!(positions, [1, 2]);
    // The swap to orders/us/+: its first routing step sets the claimed orders/eu/paid aside
    // and keeps 4 and 5; route until its rescan is done.
    let narrower = Registration::new("audit", "orders", "2", &["orders/us/+"]).unwrap();
    let outcome = other(&wharf, "audit-2:1:aa")
        .register(&narrower)
        .await
        .unwrap();
    assert!(
        matches!(outcome, RegisterOutcome::Installed { .. }),
        "{outcome:?}"
    );
    loop {
        let report = queue.route(&group("audit")).await.unwrap();
        if !report.more(queue.settings().route_batch) {
            break;
        }
    }

    let scrape = app.scrape().await;
    let billing = [("group", "billing"), ("topic", "orders")];
    let audit = [("group", "audit"), ("topic", "orders")];
    assert_eq!(scrape.expect("wharf_store_up", &[]), 1.0);
    assert_eq!(scrape.expect("wharf_groups", &[]), 2.0);

    // The declarations.
    assert_eq!(scrape.expect("wharf_group_waiters", &billing), 1.0);
    assert_eq!(scrape.expect("wharf_group_silent_waiters", &billing), 0.0);
    assert!(scrape.expect("wharf_group_oldest_wait_age_seconds", &billing) >= 0.0);
    assert_eq!(
        scrape.value("wharf_group_oldest_wait_age_seconds", &audit),
        None
    );
    assert_eq!(scrape.expect("wharf_group_waiters", &audit), 0.0);
    assert_eq!(scrape.expect("wharf_group_live_instances", &billing), 1.0);
    assert_eq!(scrape.expect("wharf_group_live_instances", &audit), 0.0);
    assert_eq!(scrape.kind("wharf_group_installs_total"), Some("counter"));
    assert_eq!(scrape.expect("wharf_group_installs_total", &billing), 1.0);
    assert_eq!(scrape.expect("wharf_group_installs_total", &audit), 2.0);

    // The queues.
    assert_eq!(
        scrape.expect("wharf_group_claimable_messages", &billing),
        0.0
    );
    assert_eq!(
        scrape.expect("wharf_group_in_flight_messages", &billing),
        0.0
    );
    assert_eq!(scrape.expect("wharf_group_dead_letters", &billing), 1.0);
    assert_eq!(
        scrape.expect("wharf_group_set_aside_deliveries", &billing),
        0.0
    );
    assert_eq!(
        scrape.expect("wharf_group_routing_lag_positions", &billing),
        0.0
    );
    assert_eq!(
        scrape.expect("wharf_group_set_aside_deliveries", &audit),
        2.0
    );
    assert_eq!(scrape.expect("wharf_group_claimable_messages", &audit), 2.0);
    assert_eq!(scrape.expect("wharf_group_in_flight_messages", &audit), 0.0);
    assert_eq!(
        scrape.expect("wharf_group_backing_off_messages", &audit),
        0.0
    );
    assert_eq!(scrape.expect("wharf_group_dead_letters", &audit), 0.0);
    assert_eq!(
        scrape.expect("wharf_group_rescan_remaining_positions", &audit),
        0.0
    );
    assert!(scrape.expect("wharf_group_oldest_unacked_age_seconds", &audit) >= 0.0);
    assert_eq!(
        scrape.value("wharf_group_oldest_unacked_age_seconds", &billing),
        None
    );

    // The log.
    let orders = [("topic", "orders")];
    assert_eq!(scrape.expect("wharf_topic_head_position", &orders), 5.0);
    assert_eq!(scrape.expect("wharf_topic_retained_messages", &orders), 5.0);
    assert_eq!(
        scrape.expect(
            "wharf_projection_lag_events",
            &[("projector", "declarer_attempts")]
        ),
        0.0
    );

    // This process's counters: the consumer's (audit was claimed through the queue directly,
    // which the library's consumers do not see), the publish, no store error.
    assert_eq!(scrape.expect("wharf_claims_total", &billing), 3.0);
    assert_eq!(scrape.expect("wharf_acks_total", &billing), 2.0);
    assert_eq!(scrape.expect("wharf_nacks_total", &billing), 1.0);
    assert_eq!(scrape.expect("wharf_dead_lettered_total", &billing), 1.0);
    assert_eq!(scrape.expect("wharf_claims_lost_total", &billing), 0.0);
    assert_eq!(scrape.value("wharf_claims_total", &audit), None);
    assert_eq!(
        scrape.expect("wharf_published_messages_total", &orders),
        5.0
    );
    assert_eq!(
        scrape.kind("wharf_published_messages_total"),
        Some("counter")
    );
    // The consumer resolved its error series at start: present, and zero.
    let errors = &scrape.families["wharf_store_errors_total"];
    assert!(!errors.samples.is_empty());
    assert!(errors.samples.iter().all(|s| s.value == 0.0), "{errors:?}");
    assert_eq!(
        scrape.expect("wharf_retention_messages_deleted_total", &[]),
        0.0
    );

    // Retention and pruning count what they delete (nothing is old enough here).
    let report = wharf.retain_messages().await.unwrap();
    assert_eq!(report.messages, 0);
    let after = app.scrape().await;
    assert_eq!(
        after.expect("wharf_maintenance_runs_total", &[("task", "retention")]),
        1.0
    );
    assert_eq!(
        after.expect("wharf_retention_set_aside_dropped_total", &[]),
        0.0
    );

    // Liveness stays store-free and unaffected.
    assert_eq!(app.get_status("/healthz").await, 200);
    consumer.shutdown().await;
    app.shut_down().await;
}

on_both_backends!(scrape_during_a_workload, a_scrape_shows_the_workload);

/// A Postgres nobody listens on, with a pool that would wait 30 s for a connection: the scrape
/// answers 200 within its timeout, with `wharf_store_up 0`, none of the store's figures, and
/// the process's counters. Needs no running Postgres.
#[tokio::test]
async fn an_unreachable_store_is_store_up_0_and_the_counters_are_still_served() {
    let closed_port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let settings = PgSettings {
        acquire_timeout: Duration::from_secs(30),
        ..PgSettings::new(format!("postgres://postgres@127.0.0.1:{closed_port}/test"))
    };
    let store =
        Store::Postgres(PgStore::connect(&settings, wharf::projections::pg_inline()).unwrap());
    let metrics = Metrics::new();
    metrics.publish().published("orders", 3);
    let state = ApiState::new(ReadModel::new(store, Duration::from_secs(30)))
        .with_metrics(metrics.clone())
        .scrape_timeout(Duration::from_millis(300));
    let app = App::start(state).await;

    let started = Instant::now();
    let scrape = app.scrape().await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the scrape took {:?}",
        started.elapsed()
    );
    assert_eq!(scrape.expect("wharf_store_up", &[]), 0.0);
    assert_eq!(
        scrape.expect("wharf_published_messages_total", &[("topic", "orders")]),
        3.0
    );
    assert_eq!(
        scrape.expect("wharf_store_errors_total", &[("operation", "scrape")]),
        1.0
    );
    for figure in [
        "wharf_groups",
        "wharf_group_waiters",
        "wharf_topic_head_position",
        "wharf_projection_lag_events",
    ] {
        assert!(
            !scrape.families.contains_key(figure),
            "{figure} without a store"
        );
    }
    assert_eq!(app.get_status("/healthz").await, 200);
    assert_eq!(app.get_status("/readyz").await, 503);
    app.shut_down().await;
}

/// The MQTT sessions' figures come from their runtimes' reports: the level as a state set (one
/// series per level, exactly one at 1), readiness, pending removals and the ingest counters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_scraped_as_a_state_set_and_counters() {
    let ts = TestStore::new(Backend::Sqlite).await;
    let report = |name: &str, level: &str, ingested: u64| wharf_api::LiveSession {
        name: name.into(),
        session_id: format!("ms-{name}"),
        identity: "mqtt://127.0.0.1:1883".into(),
        level: level.into(),
        ready: level == "full",
        reason: None,
        generation: Some(1),
        pending_stale: vec!["old/#".into()],
        last_reconcile: None,
        ingested,
        held: 2,
        dropped_unmatched: 1,
        lease: (name == "plant").then(|| wharf_api::LiveLease {
            held: true,
            holder: Some("host:1:a:s1".into()),
            token: Some(3),
            expires_at: None,
            transitions: 5,
        }),
    };
    let state = ApiState::new(ts.wharf().read_model().clone())
        .with_sessions(move || vec![report("plant", "full", 42), report("yard", "subscribed", 0)]);
    let app = App::start(state).await;
    let scrape = app.scrape().await;
    assert_eq!(scrape.kind("wharf_mqtt_session_level"), Some("gauge"));
    // Only the exclusive session (with a lease) has lease series.
    assert_eq!(
        scrape.expect("wharf_mqtt_session_lease_held", &[("session", "plant")]),
        1.0
    );
    assert_eq!(
        scrape.expect("wharf_mqtt_session_lease_token", &[("session", "plant")]),
        3.0
    );
    assert_eq!(
        scrape.kind("wharf_mqtt_session_lease_transitions_total"),
        Some("counter")
    );
    assert_eq!(
        scrape.expect(
            "wharf_mqtt_session_lease_transitions_total",
            &[("session", "plant")]
        ),
        5.0
    );
    assert_eq!(
        scrape.value("wharf_mqtt_session_lease_held", &[("session", "yard")]),
        None
    );
    for (session, at) in [("plant", "full"), ("yard", "subscribed")] {
        for level in [
            "starting",
            "connected",
            "subscribed",
            "full",
            "migration_required",
        ] {
            let expected = if level == at { 1.0 } else { 0.0 };
            assert_eq!(
                scrape.expect(
                    "wharf_mqtt_session_level",
                    &[("session", session), ("level", level)]
                ),
                expected,
                "{session} {level}"
            );
        }
    }
    assert_eq!(
        scrape.expect("wharf_mqtt_session_ready", &[("session", "plant")]),
        1.0
    );
    assert_eq!(
        scrape.expect("wharf_mqtt_session_ready", &[("session", "yard")]),
        0.0
    );
    assert_eq!(
        scrape.kind("wharf_mqtt_session_ingested_total"),
        Some("counter")
    );
    assert_eq!(
        scrape.expect("wharf_mqtt_session_ingested_total", &[("session", "plant")]),
        42.0
    );
    assert_eq!(
        scrape.expect(
            "wharf_mqtt_session_pending_stale_filters",
            &[("session", "yard")]
        ),
        1.0
    );
    assert_eq!(
        scrape.expect("wharf_mqtt_session_held_deliveries", &[("session", "yard")]),
        2.0
    );
    app.shut_down().await;
}
