//! Managed MQTT sessions end to end, on a real Mosquitto and both store backends: startup fails
//! closed on an unknown history (nothing connects), a seeded session reaches Full and ingests
//! what is published into the message log (acked only after the commit), and a removed filter
//! is unsubscribed exactly, recycled, verified and forgotten.

use std::time::Duration;
use wharf_tests::WharfSessions;

use wharf::domain::session::{
    Qos, ReconcileSettings, SessionLevel, SubAckEntry, MANAGED_SESSION_AGGREGATE,
};
use wharf::Wharf;
use wharf_server::Config;
use wharf_tests::fixtures::{declare, group};
use wharf_tests::sessions::{self, session_config, session_id, unique, wait_status};
use wharf_tests::{on_both_backends, Backend, TestStore};

const DEADLINE: Duration = Duration::from_secs(20);

fn broker_port() -> u16 {
    let url =
        std::env::var("WHARF_TEST_MQTT_URL").unwrap_or_else(|_| "mqtt://127.0.0.1:1883".into());
    url.rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .unwrap_or(1883)
}

/// A config with one persistent session `plant` on the shared broker feeding log topic
/// `sensors` (QoS 1 each), with a short `mqtt.unmatched_grace`.
fn config(ts: &TestStore, client_id: &str, filters: &[&str]) -> Config {
    let broker = format!("mqtt://127.0.0.1:{}", broker_port());
    let subscriptions: Vec<(&str, u8)> = filters.iter().map(|f| (*f, 1)).collect();
    session_config(
        ts,
        &broker,
        client_id,
        &subscriptions,
        Duration::from_millis(300),
    )
}

async fn publish(topic: &str, payload: &str) {
    sessions::publish(broker_port(), topic, payload).await;
}

/// Every message a whole-topic group on `sensors` can claim within the deadline, acked.
async fn drain_log(wharf: &Wharf, expected: usize) -> Vec<(String, String)> {
    let g = group("reader");
    let mut seen = Vec::new();
    let start = std::time::Instant::now();
    while seen.len() < expected && start.elapsed() < DEADLINE {
        let claimed = wharf
            .queue()
            .fetch(&g, "reader/1", 100)
            .await
            .expect("fetch");
        for c in &claimed {
            seen.push((
                c.subject.clone(),
                String::from_utf8_lossy(&c.payload).into_owned(),
            ));
            wharf.queue().ack(c).await.expect("ack");
        }
        if claimed.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    seen
}

async fn an_unseeded_session_never_connects(backend: Backend) {
    let ts = TestStore::new(backend).await;
    let config = config(
        &ts,
        &unique("wharf-unseeded"),
        &[&format!("{}/+/temp", unique("plant"))],
    );
    let wharf = ts.wharf();
    let runtimes = wharf.start_sessions(&config).expect("starts");
    let status = wait_status(&runtimes[0], "the unknown-history refusal", |s| {
        s.reason
            .as_deref()
            .is_some_and(|r| r.contains("is unknown"))
    })
    .await;
    assert_eq!(status.level, SessionLevel::Starting);
    assert!(status
        .reason
        .as_deref()
        .unwrap_or_default()
        .contains("wharf sessions seed"));
    assert_eq!(status.generation, None, "nothing connected");
    for runtime in runtimes {
        runtime.shutdown().await;
    }
}

on_both_backends!(
    an_unseeded_session_never_connects,
    an_unseeded_session_never_connects
);

async fn a_seeded_session_reaches_full_and_ingests(backend: Backend) {
    let ts = TestStore::new(backend).await;
    declare(&ts, "reader", "sensors", &[]).await;
    // Tests share the broker: each uses topics under a root of its own.
    let root = unique("plant");
    let config = config(&ts, &unique("wharf-ingest"), &[&format!("{root}/+/temp")]);
    let wharf = ts.wharf();
    wharf
        .seed_session_baseline(&session_id(&config), &[])
        .await
        .expect("seed empty");
    let runtimes = wharf.start_sessions(&config).expect("starts");
    wait_status(&runtimes[0], "Full", |s| s.level == SessionLevel::Full).await;

    publish(&format!("{root}/a/temp"), "21.5").await;
    publish(&format!("{root}/a/humidity"), "40").await; // matches nothing desired
    publish(&format!("{root}/b/temp"), "19.0").await;
    let got = drain_log(&wharf, 2).await;
    assert_eq!(
        got,
        [
            (format!("{root}/a/temp"), "21.5".to_owned()),
            (format!("{root}/b/temp"), "19.0".to_owned())
        ]
    );
    let status = wait_status(&runtimes[0], "two ingested", |s| s.ingested == 2).await;
    assert!(status.last_reconcile.is_some_and(|r| r.converged));
    for runtime in runtimes {
        runtime.shutdown().await;
    }
}

on_both_backends!(
    a_seeded_session_reaches_full_and_ingests,
    a_seeded_session_reaches_full_and_ingests
);

async fn a_removed_filter_is_unsubscribed_verified_and_forgotten(backend: Backend) {
    let ts = TestStore::new(backend).await;
    declare(&ts, "reader", "sensors", &[]).await;
    let client = unique("wharf-removal");
    let (legacy, plant) = (unique("legacy"), unique("plant"));
    let (legacy_filter, plant_filter) = (format!("{legacy}/#"), format!("{plant}/+/temp"));
    // The broker session holds `LEGACY/#` from before; the ledger's baseline says so.
    let old = config(&ts, &client, &[&legacy_filter]);
    let wharf = ts.wharf();
    let id = session_id(&old);
    wharf
        .seed_session_baseline(&id, &[&legacy_filter])
        .await
        .expect("seed");
    let first = wharf.start_sessions(&old).expect("starts");
    wait_status(&first[0], "Full on legacy/#", |s| {
        s.level == SessionLevel::Full
    })
    .await;
    for runtime in first {
        runtime.shutdown().await;
    }

    let new = config(&ts, &client, &[&plant_filter]);
    assert_eq!(
        session_id(&new),
        id,
        "the filters are not part of the identity"
    );
    let runtimes = wharf.start_sessions(&new).expect("starts");
    let full = wait_status(&runtimes[0], "Full after the removal", |s| {
        s.level == SessionLevel::Full
    })
    .await;
    assert!(full.pending_stale.is_empty());
    assert!(full.generation.is_some());

    let state = wharf.session_ledger().load(&id).await.expect("ledger");
    let history: Vec<String> = state
        .history_filters()
        .iter()
        .map(|f| f.as_str().to_owned())
        .collect();
    assert_eq!(history, [plant_filter.as_str()]);
    let events = ts
        .store
        .load(MANAGED_SESSION_AGGREGATE, &id)
        .await
        .expect("events");
    let types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
    assert!(types.contains(&"FiltersForgotten"), "{types:?}");
    let forgotten = types.iter().position(|t| *t == "FiltersForgotten");
    let remembered = types.iter().rposition(|t| *t == "FiltersRemembered");
    assert!(
        remembered < forgotten,
        "the new filter was remembered before the old one was forgotten: {types:?}"
    );

    // The broker no longer delivers what only the legacy filter covered.
    publish(&format!("{legacy}/x"), "old").await;
    publish(&format!("{plant}/c/temp"), "new").await;
    let got = drain_log(&wharf, 1).await;
    assert_eq!(got, [(format!("{plant}/c/temp"), "new".to_owned())]);
    for runtime in runtimes {
        runtime.shutdown().await;
    }
}

on_both_backends!(
    a_removed_filter_is_unsubscribed_verified_and_forgotten,
    a_removed_filter_is_unsubscribed_verified_and_forgotten
);

/// A reconcile of more filters than the first Remember wave carries (ADR 0041): the ledger gets
/// one `FiltersRemembered` per wave, in order, the first at most `first_wave` and each later
/// one at most twice the one before; every filter's SUBACK outcome is recorded before the level
/// is Full; and a filter of the last wave delivers.
async fn a_reconcile_larger_than_a_wave_remembers_in_waves(backend: Backend) {
    const FILTERS: usize = 2_500;
    let ts = TestStore::new(backend).await;
    declare(&ts, "reader", "sensors", &[]).await;
    let root = unique("waves");
    let filters: Vec<String> = (0..FILTERS).map(|i| format!("{root}/{i}/#")).collect();
    let refs: Vec<&str> = filters.iter().map(String::as_str).collect();
    let config = config(&ts, &unique("wharf-waves"), &refs);
    let id = session_id(&config);
    let wharf = ts.wharf();
    wharf.seed_session_baseline(&id, &[]).await.expect("seed");
    let runtimes = wharf.start_sessions(&config).expect("starts");
    wait_status(&runtimes[0], "Full", |s| s.level == SessionLevel::Full).await;

    let events = sessions::ledger_events(&ts, &id).await;
    let waves: Vec<usize> = events
        .iter()
        .filter(|(t, _)| t == "FiltersRemembered")
        .map(|(_, p)| p["filters"].as_array().expect("filters").len())
        .collect();
    assert_eq!(waves.iter().sum::<usize>(), FILTERS, "{waves:?}");
    assert!(waves.len() >= 2, "{waves:?}");
    assert!(
        waves[0] <= ReconcileSettings::DEFAULT_FIRST_WAVE,
        "{waves:?}"
    );
    assert!(waves.windows(2).all(|w| w[1] <= 2 * w[0]), "{waves:?}");
    let granted: usize = events
        .iter()
        .filter(|(t, _)| t == "SubscribesAcknowledged")
        .flat_map(|(_, p)| p["outcomes"].as_array().expect("outcomes").clone())
        .map(|o| serde_json::from_value::<SubAckEntry>(o).expect("an outcome"))
        .filter(|o| o.outcome.satisfies(Qos::AtLeastOnce))
        .count();
    assert_eq!(granted, FILTERS, "every outcome recorded before Full");
    let state = wharf.session_ledger().load(&id).await.expect("ledger");
    assert_eq!(state.history_filters().len(), FILTERS);

    let last = &filters[FILTERS - 1];
    let topic = last.replace('#', "x");
    publish(&topic, "from the last wave").await;
    let got = drain_log(&wharf, 1).await;
    assert_eq!(got, [(topic, "from the last wave".to_owned())]);
    for runtime in runtimes {
        runtime.shutdown().await;
    }
}

on_both_backends!(
    a_reconcile_larger_than_a_wave_remembers_in_waves,
    a_reconcile_larger_than_a_wave_remembers_in_waves
);

/// Records each batch it is handed: its messages and payload bytes.
#[derive(Default)]
struct Batches(std::sync::Mutex<Vec<(usize, usize)>>);

#[async_trait::async_trait]
impl wharf_sessions::MqttHandler for Batches {
    async fn handle(
        &self,
        batch: &[wharf_sessions::MqttMessage],
    ) -> Result<(), wharf::HandlerError> {
        let bytes = batch.iter().map(|m| m.message.payload.len()).sum();
        self.0
            .lock()
            .expect("the batches")
            .push((batch.len(), bytes));
        Ok(())
    }
}

/// A backlog the broker kept for the offline session arrives at once (some of it before the
/// SUBACK): it is committed in batches of at most `mqtt.ingest_batch` deliveries, each
/// stopping once its payloads reach `mqtt.ingest_batch_bytes`, and every delivery is handled.
async fn a_backlog_is_committed_in_batches_bounded_by_count_and_bytes(backend: Backend) {
    let ts = TestStore::new(backend).await;
    let root = unique("backlog");
    let mut config = config(&ts, &unique("wharf-backlog"), &[&format!("{root}/#")]);
    config.mqtt.ingest_batch = 3;
    config.mqtt.ingest_batch_bytes = 1024;
    let id = session_id(&config);
    let wharf = ts.wharf();
    wharf.seed_session_baseline(&id, &[]).await.expect("seed");
    // Subscribed once, then offline: the broker keeps what is published meanwhile.
    let first = wharf.start_sessions(&config).expect("starts");
    wait_status(&first[0], "Full", |s| s.level == SessionLevel::Full).await;
    sessions::shutdown(first).await;
    let big = "x".repeat(600);
    for i in 0..6 {
        publish(&format!("{root}/big/{i}"), &big).await;
    }
    for i in 0..6 {
        publish(&format!("{root}/small/{i}"), "s").await;
    }

    let batches = std::sync::Arc::new(Batches::default());
    let runtimes = wharf
        .start_sessions_with(&config, batches.clone())
        .expect("starts");
    wait_status(&runtimes[0], "the backlog handled", |s| s.ingested == 12).await;
    let seen = batches.0.lock().expect("the batches").clone();
    assert_eq!(seen.iter().map(|b| b.0).sum::<usize>(), 12, "{seen:?}");
    for (count, bytes) in &seen {
        assert!(*count <= 3, "a commit above ingest_batch: {seen:?}");
        // A batch stops once it reached 1,024 bytes: two of the 600-byte messages at most.
        assert!(
            *bytes <= 1200,
            "a commit far above ingest_batch_bytes: {seen:?}"
        );
    }
    assert!(
        seen.len() >= 5,
        "six large and six small need five commits: {seen:?}"
    );
    sessions::shutdown(runtimes).await;
}

on_both_backends!(
    a_backlog_is_committed_in_batches_bounded_by_count_and_bytes,
    a_backlog_is_committed_in_batches_bounded_by_count_and_bytes
);
