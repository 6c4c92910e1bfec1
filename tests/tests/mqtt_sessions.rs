//! Managed MQTT sessions end to end, on a real Mosquitto and both store backends: startup fails
//! closed on an unknown history (nothing connects), a seeded session reaches Full and ingests
//! what is published into the message log (acked only after the commit), and a removed filter
//! is unsubscribed exactly, recycled, verified and forgotten.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use wharf::config::{SessionConfig, SubscriptionConfig};
use wharf::domain::session::{SessionLevel, MANAGED_SESSION_AGGREGATE};
use wharf::sessions::{SessionRuntime, SessionStatus};
use wharf::{Config, Wharf};
use wharf_mqtt::{ConnectOptions, QoS, Session};
use wharf_tests::fixtures::{declare, group};
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

fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        rand_suffix()
    )
}

fn rand_suffix() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0)
}

/// A config with one persistent session `plant` feeding log topic `sensors`.
fn config(ts: &TestStore, client_id: &str, filters: &[&str]) -> Config {
    let mut config = ts.config();
    config.mqtt.unmatched_grace = Duration::from_millis(300);
    config.mqtt.connect_timeout = Duration::from_secs(5);
    config.mqtt.subscribe_timeout = Duration::from_secs(5);
    config.mqtt.sessions.insert(
        "plant".to_owned(),
        SessionConfig {
            session_expiry: Some(Duration::from_secs(300)),
            subscriptions: filters
                .iter()
                .map(|f| SubscriptionConfig {
                    filter: (*f).to_owned(),
                    qos: 1,
                    topic: "sensors".to_owned(),
                })
                .collect(),
            ..SessionConfig::new(&format!("mqtt://127.0.0.1:{}", broker_port()), client_id)
        },
    );
    config
}

fn session_id(config: &Config) -> String {
    config.mqtt.resolve().expect("valid sessions")[0]
        .identity
        .id()
        .to_owned()
}

async fn wait_status(
    runtime: &SessionRuntime,
    what: &str,
    condition: impl Fn(&SessionStatus) -> bool,
) -> SessionStatus {
    let mut watch = runtime.watch();
    let found = tokio::time::timeout(DEADLINE, async {
        watch.wait_for(|s| condition(s)).await.map(|s| s.clone())
    })
    .await;
    match found {
        Ok(Ok(status)) => status,
        _ => panic!(
            "timed out waiting for {what}; status: {:?}",
            runtime.status()
        ),
    }
}

async fn publish(topic: &str, payload: &str) {
    let mut options = ConnectOptions::new("127.0.0.1", broker_port(), unique("pub"));
    options.connect_timeout = DEADLINE;
    let (handle, _deliveries) = Session::connect(options).await.expect("publisher connects");
    handle
        .publish(topic, payload.as_bytes().to_vec(), QoS::AtLeastOnce, false)
        .await
        .expect("publish QoS 1");
    let _ = handle
        .disconnect(wharf_mqtt::DisconnectReason::Normal)
        .await;
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
