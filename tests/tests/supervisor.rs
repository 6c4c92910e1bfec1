//! The session supervisor's reloads against a private Mosquitto and both store backends: the
//! identity guard refuses an identity change (client id, mode, broker, removal; even with
//! `allow_destructive_reload`) and a restart-only key, and the old runtime keeps running
//! untouched; a credential change swaps; an ACL-denied filter is applied, then degraded, then
//! cleared by the fix; the debounced strategy folds rapid requests into one swap where the
//! direct one makes one per request. Swaps are counted by the supervisor's generation and
//! metrics, never by time.

/// Every response these tests receive is held to the generated OpenAPI document (ADR 0033).
#[path = "../../api/tests/support/contract.rs"]
#[allow(dead_code)]
mod contract;

use std::sync::{Arc, Mutex};
use std::time::Duration;
use wharf_tests::WharfSessions;

use tokio::sync::watch;
use wharf::domain::session::{SessionLevel, SessionMode};
use wharf_server::config::SessionConfig;
use wharf_server::supervisor::{ConfigLoader, ConfigWatch, ReloadOutcome, Supervisor};
use wharf_server::Config;
use wharf_server::ServerError;
use wharf_sessions::SessionStatus;
use wharf_tests::broker::{anonymous_dynsec, Broker, BrokerConfig};
use wharf_tests::sessions::{blocking, publish, session_config, session_id, unique};
use wharf_tests::{on_both_backends, Backend, TestStore};

/// The longest any wait of these tests may take.
const DEADLINE: Duration = Duration::from_secs(60);

/// The configuration the next reload loads: a test sets it, as an operator edits a file.
#[derive(Clone)]
struct Source(Arc<Mutex<Result<Config, String>>>);

impl Source {
    fn new(config: &Config) -> Self {
        Self(Arc::new(Mutex::new(Ok(config.clone()))))
    }

    fn set(&self, config: &Config) {
        *self.0.lock().unwrap() = Ok(config.clone());
    }

    fn fail(&self, why: &str) {
        *self.0.lock().unwrap() = Err(why.to_owned());
    }

    fn loader(&self) -> ConfigLoader {
        let source = self.0.clone();
        Arc::new(move || source.lock().unwrap().clone().map_err(ServerError::Config))
    }
}

/// Small timeouts, so the activation budget is a few seconds:
/// 2x1s + 2x1s + 1s + 1s (drain) + 2x200ms = 6.4s.
fn quick(mut config: Config) -> Config {
    config.mqtt.connect_timeout = Duration::from_secs(1);
    config.mqtt.subscribe_timeout = Duration::from_secs(1);
    config.mqtt.drain_timeout = Duration::from_secs(1);
    config.mqtt.unmatched_grace = Duration::from_millis(200);
    config
}

async fn wait_session(
    supervisor: &Supervisor,
    what: &str,
    condition: impl Fn(&SessionStatus) -> bool,
) -> SessionStatus {
    let mut watch = supervisor.session_watches().remove(0);
    let found = tokio::time::timeout(DEADLINE, async {
        watch.wait_for(|s| condition(s)).await.map(|s| s.clone())
    })
    .await;
    match found {
        Ok(Ok(status)) => status,
        _ => panic!("timed out waiting for {what}: {:?}", supervisor.sessions()),
    }
}

async fn wait_config(
    supervisor: &Supervisor,
    what: &str,
    condition: impl Fn(&ConfigWatch) -> bool,
) -> ConfigWatch {
    let mut watch: watch::Receiver<ConfigWatch> = supervisor.watch_config();
    let found = tokio::time::timeout(DEADLINE, async {
        watch.wait_for(|w| condition(w)).await.map(|w| w.clone())
    })
    .await;
    match found {
        Ok(Ok(state)) => state,
        _ => panic!(
            "timed out waiting for {what}: {:?}",
            supervisor.config_watch()
        ),
    }
}

/// The value of the series `line_prefix` (a name with its labels) in `/metrics` text.
async fn metric(wharf: &wharf::Wharf, series: &str) -> Option<f64> {
    let text = wharf.metrics().render(&[], Duration::from_secs(1)).await;
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

async fn identity_changes_are_refused_and_a_credential_change_reloads(backend: Backend) {
    let ts = TestStore::new(backend).await;
    let broker = Broker::start(BrokerConfig::default());
    let root = unique("sup-guard");
    let filter = format!("{root}/#");
    let config = quick(session_config(
        &ts,
        &broker.url(),
        &unique("wharf-guard"),
        &[(&filter, 1)],
        Duration::from_millis(200),
    ));
    let wharf = ts.wharf();
    wharf
        .seed_session_baseline(&session_id(&config), &[])
        .await
        .expect("seed");
    let source = Source::new(&config);
    let supervisor = Supervisor::start(&wharf, config.clone(), source.loader()).expect("starts");
    let full = wait_session(&supervisor, "full", |s| s.level == SessionLevel::Full).await;
    let generation = full.generation;

    let plant = |config: &mut Config| config.mqtt.sessions.get_mut("plant").unwrap().clone();
    let mut changes: Vec<(&str, Config)> = Vec::new();
    let mut client = config.clone();
    client.mqtt.sessions.get_mut("plant").unwrap().client_id = unique("renamed");
    changes.push(("client_id", client));
    let mut mode = config.clone();
    let session = mode.mqtt.sessions.get_mut("plant").unwrap();
    session.mode = SessionMode::Ephemeral;
    session.session_expiry = None;
    changes.push(("mode", mode));
    let mut moved = config.clone();
    moved.mqtt.sessions.get_mut("plant").unwrap().brokers = vec!["mqtt://127.0.0.1:1".into()];
    moved.mqtt.allow_destructive_reload = true;
    changes.push(("brokers", moved));
    let mut removed = config.clone();
    let kept = plant(&mut removed);
    removed.mqtt.sessions.clear();
    removed
        .mqtt
        .sessions
        .insert("other".into(), SessionConfig { ..kept });
    changes.push(("would be removed", removed));
    for (what, next) in &changes {
        source.set(next);
        let report = supervisor.reload("test").await.expect("a report");
        assert_eq!(report.outcome, ReloadOutcome::Refused, "{what}: {report:?}");
        let reason = report.reason.unwrap_or_default();
        assert!(reason.contains("identity guard"), "{what}: {reason}");
        assert!(reason.contains("mqtt.sessions.plant"), "{what}: {reason}");
        assert!(reason.contains(what), "{what}: {reason}");
        if next.mqtt.allow_destructive_reload {
            assert!(reason.contains("does not bypass"), "{reason}");
        }
    }
    // A key outside mqtt, and a file that does not load, are refused too, naming the key.
    let mut listen = config.clone();
    listen.http.listen = "127.0.0.1:1".parse().unwrap();
    source.set(&listen);
    let report = supervisor.reload("test").await.unwrap();
    assert_eq!(report.outcome, ReloadOutcome::Refused);
    assert!(
        report.reason.as_deref().unwrap().contains("http.listen"),
        "{report:?}"
    );
    source.fail("mqtt.ingest_batch must be between 1 and 10000, got 0");
    let report = supervisor.reload("test").await.unwrap();
    assert_eq!(report.outcome, ReloadOutcome::Refused);
    assert!(report
        .reason
        .as_deref()
        .unwrap()
        .contains("mqtt.ingest_batch"));
    assert_eq!(
        metric(&wharf, "wharf_config_reloads_total{outcome=\"refused\"}").await,
        Some(changes.len() as f64 + 2.0)
    );
    assert_eq!(
        metric(&wharf, "wharf_config_last_reload_successful").await,
        Some(0.0)
    );

    // The old runtime is untouched: the same connection, still Full, still ingesting.
    assert_eq!(supervisor.config_watch().applied_generation, 1);
    let now = supervisor.sessions().remove(0);
    assert_eq!(
        (now.generation, now.level),
        (generation, SessionLevel::Full)
    );
    publish(broker.port, &format!("{root}/a"), "after the refusals").await;
    let ingested = wait_session(&supervisor, "the message ingested", |s| s.ingested >= 1).await;
    assert_eq!(ingested.generation, generation, "no new connection");

    // A credential change is not identity: it swaps (generation 2) and the new runtime runs.
    let mut rotated = config.clone();
    let session = rotated.mqtt.sessions.get_mut("plant").unwrap();
    session.username = Some("ingest".into());
    session.password = Some("rotated-secret".into());
    source.set(&rotated);
    let report = supervisor.reload("test").await.unwrap();
    assert_eq!(report.outcome, ReloadOutcome::Applied, "{report:?}");
    assert_eq!(report.generation, 2);
    assert_eq!(supervisor.config_watch().applied_generation, 2);
    assert_eq!(
        metric(&wharf, "wharf_config_last_reload_successful").await,
        Some(1.0)
    );
    assert!(metric(&wharf, "wharf_config_last_reload_success_timestamp_seconds").await > Some(0.0));
    wait_session(&supervisor, "the new runtime at full", |s| {
        s.level == SessionLevel::Full && s.ingested == 0
    })
    .await;
    publish(broker.port, &format!("{root}/b"), "after the swap").await;
    wait_session(&supervisor, "the new runtime ingesting", |s| {
        s.ingested >= 1
    })
    .await;
    wait_config(&supervisor, "generation 2 converged", |w| {
        w.converged_generation == 2
    })
    .await;
    // The same file again changes nothing.
    let report = supervisor.reload("test").await.unwrap();
    assert_eq!(report.outcome, ReloadOutcome::Unchanged);
    assert_eq!(report.generation, 2);
    supervisor.shutdown().await;
}

on_both_backends!(
    identity_guard,
    identity_changes_are_refused_and_a_credential_change_reloads
);

async fn an_acl_denied_filter_is_applied_then_degraded_then_cleared(backend: Backend) {
    let ts = TestStore::new(backend).await;
    let root = unique("sup-acl");
    let (allowed, denied, fixed) = (
        format!("{root}/ok/#"),
        format!("{root}/denied/#"),
        format!("{root}/fixed/#"),
    );
    let rules = anonymous_dynsec(&[
        ("subscribePattern", &allowed, true),
        ("subscribePattern", &fixed, true),
    ]);
    let broker = blocking(|| Broker::start(BrokerConfig::dynsec(rules).persistent()));
    let config = quick(session_config(
        &ts,
        &broker.url(),
        &unique("wharf-acl"),
        &[(&allowed, 1)],
        Duration::from_millis(200),
    ));
    let wharf = ts.wharf();
    wharf
        .seed_session_baseline(&session_id(&config), &[])
        .await
        .expect("seed");
    let source = Source::new(&config);
    let supervisor = Supervisor::start(&wharf, config.clone(), source.loader()).expect("starts");
    wait_config(&supervisor, "generation 1 converged", |w| {
        w.converged_generation == 1
    })
    .await;

    let with_denied = {
        let mut c = config.clone();
        let subs = &mut c.mqtt.sessions.get_mut("plant").unwrap().subscriptions;
        subs.push(wharf_server::config::SubscriptionConfig {
            filter: denied.clone(),
            qos: 1,
            topic: "sensors".into(),
        });
        c
    };
    source.set(&with_denied);
    let report = supervisor.reload("test").await.unwrap();
    assert_eq!(
        report.outcome,
        ReloadOutcome::Applied,
        "applied first: {report:?}"
    );
    let degraded = wait_config(&supervisor, "degraded", |w| w.degraded).await;
    assert_eq!(
        (degraded.applied_generation, degraded.converged_generation),
        (2, 1)
    );
    let reason = degraded.reason.unwrap_or_default();
    assert!(reason.contains("applied but not converged"), "{reason}");
    assert!(reason.contains("plant"), "{reason}");
    assert!(
        reason.contains("0x87") || reason.contains(&denied),
        "{reason}"
    );
    assert_eq!(metric(&wharf, "wharf_config_degraded").await, Some(1.0));
    assert!(
        metric(
            &wharf,
            "wharf_mqtt_reconcile_outcomes_total{outcome=\"failed\",session=\"plant\"}"
        )
        .await
            >= Some(1.0)
    );

    // The fix: the denied filter replaced by an allowed one.
    let mut repaired = config.clone();
    repaired
        .mqtt
        .sessions
        .get_mut("plant")
        .unwrap()
        .subscriptions[0]
        .filter = fixed.clone();
    source.set(&repaired);
    let report = supervisor.reload("test").await.unwrap();
    assert_eq!(report.outcome, ReloadOutcome::Applied, "{report:?}");
    let cleared = wait_config(&supervisor, "converged again", |w| {
        w.converged_generation == 3
    })
    .await;
    assert!(!cleared.degraded && cleared.reason.is_none(), "{cleared:?}");
    assert_eq!(metric(&wharf, "wharf_config_degraded").await, Some(0.0));
    assert_eq!(
        metric(&wharf, "wharf_config_converged_generation").await,
        Some(3.0)
    );
    supervisor.shutdown().await;
}

on_both_backends!(
    acl_degraded,
    an_acl_denied_filter_is_applied_then_degraded_then_cleared
);

/// `requests` reload requests, each with a different `mqtt.ingest_batch`, made back to back;
/// returns the generation in effect once they were all answered.
async fn rapid_requests(strategy: &str, requests: u32) -> (u64, u64) {
    let ts = TestStore::new(Backend::Sqlite).await;
    let broker = Broker::start(BrokerConfig::default());
    let mut config = quick(ts.config());
    config.mqtt.reload_strategy = match strategy {
        "debounced" => wharf_server::config::ReloadStrategy::Debounced,
        _ => wharf_server::config::ReloadStrategy::Direct,
    };
    config.mqtt.reload_window = Duration::from_secs(2);
    let mut session = SessionConfig::new(&broker.url(), &unique("wharf-rapid"));
    session.mode = SessionMode::Ephemeral;
    config.mqtt.sessions.insert("live".into(), session);
    let wharf = ts.wharf();
    let source = Source::new(&config);
    let supervisor = Supervisor::start(&wharf, config.clone(), source.loader()).expect("starts");
    for i in 0..requests {
        let mut next = config.clone();
        next.mqtt.ingest_batch = 10 + i;
        source.set(&next);
        supervisor.request_reload("write");
    }
    // One more, answered after every earlier one (requests are handled in order).
    let last = supervisor.reload("write").await.expect("a report");
    let swaps = metric(&wharf, "wharf_config_reloads_total{outcome=\"applied\"}")
        .await
        .unwrap_or(0.0) as u64;
    assert_eq!(
        supervisor.config_watch().applied_generation,
        last.generation
    );
    supervisor.shutdown().await;
    (last.generation, swaps)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn debounced_folds_rapid_writes_into_one_swap_and_direct_makes_one_each() {
    let (generation, swaps) = rapid_requests("direct", 5).await;
    // Five distinct configurations, five swaps; the sixth request loads the fifth again.
    assert_eq!((generation, swaps), (6, 5));
    let (generation, swaps) = rapid_requests("debounced", 5).await;
    assert_eq!((generation, swaps), (2, 1));
}

/// Deep health shows this process's consumers (group, instance, state) with the heartbeat the
/// store confirmed, beside the supervisor's config watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deep_health_reports_the_consumers_of_this_process() {
    let ts = TestStore::new(Backend::Sqlite).await;
    let wharf = ts.wharf();
    let registration =
        wharf::Registration::new("billing", "orders", "1", &["orders/#"]).expect("valid");
    let consumer = wharf.consume(registration);
    let mut state = consumer.watch();
    tokio::time::timeout(DEADLINE, state.wait_for(|s| s.is_ready()))
        .await
        .expect("consuming in time")
        .expect("the consumer runs");
    let source = Source::new(&ts.config());
    let supervisor =
        Arc::new(Supervisor::start(&wharf, ts.config(), source.loader()).expect("starts"));
    wait_config(&supervisor, "no session: converged", |w| {
        w.converged_generation == 1
    })
    .await;
    let (of, consumers_of) = (supervisor.clone(), wharf.clone());
    let api = wharf_api::ApiState::new(wharf.read_model().clone()).with_deep_health(move || {
        let watch = of.config_watch();
        wharf_api::DeepReport {
            sessions: Vec::new(),
            config_watch: Some(wharf_api::ConfigWatchReport {
                applied_generation: watch.applied_generation,
                converged_generation: watch.converged_generation,
                degraded: watch.degraded,
                reason: watch.reason,
                strategy: watch.strategy.to_owned(),
                last_reload: None,
            }),
            consumers: consumers_of
                .consumer_health()
                .iter()
                .map(|c| wharf_api::ConsumerReport {
                    group: c.group.clone(),
                    declarer: c.declarer.clone(),
                    state: c.state_name().to_owned(),
                    reason: c.reason().map(str::to_owned),
                    last_heartbeat: None,
                })
                .collect(),
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(wharf_api::serve(listener, api, async move {
        let _ = stopped.await;
    }));
    let response = reqwest::get(format!("http://{address}/api/v1/monitor/deephealth"))
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let text = response.text().await.unwrap();
    let deep = "/api/v1/monitor/deephealth";
    contract::assert_conforms("GET", deep, 200, &content_type, &text);
    let body: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["status"], "pass", "{body}");
    let listed = &body["consumers"][0];
    assert_eq!(listed["group"], "billing", "{body}");
    assert_eq!(listed["declarer"], consumer.declarer().to_string());
    assert_eq!(listed["state"], "consuming");
    assert!(listed["last_heartbeat"].is_string(), "{body}");
    assert_eq!(body["checks"]["consumer:state"][0]["status"], "pass");
    assert_eq!(body["config_watch"]["converged_generation"], 1, "{body}");
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    consumer.shutdown().await;
    assert!(
        wharf.consumer_health().is_empty(),
        "a stopped consumer leaves the list"
    );
    Arc::try_unwrap(supervisor)
        .ok()
        .expect("one owner")
        .shutdown()
        .await;
}

/// A self-signed CA certificate (PEM) named `name` in `dir`, made with `openssl`.
fn make_ca(dir: &std::path::Path, name: &str) {
    let out = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-days",
            "2",
            "-subj",
            "/CN=wharf-reload-test",
        ])
        .args([
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ])
        .args(["-keyout", &format!("{name}.key"), "-out", name])
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A TLS file is read when a runtime starts, so a certificate rotated in place (same path,
/// same configuration text) is a change a reload applies; an unchanged file is not; and a
/// file that no longer parses is refused in the prepare, naming the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_certificate_rotated_in_place_reloads_and_a_broken_one_is_refused() {
    let ts = TestStore::new(Backend::Sqlite).await;
    let certs = tempfile::tempdir().unwrap();
    make_ca(certs.path(), "ca.crt");
    let mut config = quick(ts.config());
    let mut session = SessionConfig::new("mqtts://127.0.0.1:1", &unique("wharf-tls"));
    session.mode = SessionMode::Ephemeral;
    session.tls_ca_file = Some(certs.path().join("ca.crt"));
    config.mqtt.sessions.insert("secure".into(), session);
    let wharf = ts.wharf();
    let source = Source::new(&config);
    let supervisor = Supervisor::start(&wharf, config.clone(), source.loader()).expect("starts");
    let same = supervisor.reload("SIGHUP").await.unwrap();
    assert_eq!(same.outcome, ReloadOutcome::Unchanged, "{same:?}");

    make_ca(certs.path(), "ca.crt");
    let rotated = supervisor.reload("SIGHUP").await.unwrap();
    assert_eq!(rotated.outcome, ReloadOutcome::Applied, "{rotated:?}");
    assert_eq!(rotated.generation, 2);

    std::fs::write(certs.path().join("ca.crt"), "not a certificate").unwrap();
    let broken = supervisor.reload("SIGHUP").await.unwrap();
    assert_eq!(broken.outcome, ReloadOutcome::Refused, "{broken:?}");
    let reason = broken.reason.unwrap_or_default();
    assert!(reason.contains("mqtt.sessions.secure"), "{reason}");
    assert_eq!(supervisor.config_watch().applied_generation, 2);
    supervisor.shutdown().await;
}

/// Two supervisors (two processes of a cluster, here in one) run one exclusive session: the
/// holder converges, and the standby counts as converged too (nothing for it to do), so
/// neither is degraded; the identity guard covers exclusive sessions; when the holder's
/// supervisor shuts down, the standby's session takes over and reaches Full.
async fn exclusive_sessions_converge_on_the_holder_and_stand_by_elsewhere(backend: Backend) {
    let ts = TestStore::new(backend).await;
    let broker = Broker::start(BrokerConfig::default());
    let root = unique("sup-excl");
    let mut config = quick(session_config(
        &ts,
        &broker.url(),
        &unique("wharf-excl"),
        &[(&format!("{root}/#"), 1)],
        Duration::from_millis(200),
    ));
    config.mqtt.sessions.get_mut("plant").unwrap().mode = SessionMode::Exclusive;
    config.lease = wharf_server::config::LeaseConfig {
        ttl: Duration::from_secs(2),
        renew_interval: Duration::from_millis(250),
        renew_deadline: Duration::from_secs(1),
    };
    let (one, two) = (ts.wharf(), ts.wharf());
    one.seed_session_baseline(&session_id(&config), &[])
        .await
        .expect("seed");
    let source = Source::new(&config);
    let holder = Supervisor::start(&one, config.clone(), source.loader()).expect("starts");
    wait_session(&holder, "the holder at full", |s| {
        s.level == SessionLevel::Full && s.lease.as_ref().is_some_and(|l| l.held)
    })
    .await;
    wait_config(&holder, "the holder converged", |w| {
        w.converged_generation == 1
    })
    .await;
    let standby = Supervisor::start(&two, config.clone(), source.loader()).expect("starts");
    let waiting = wait_session(&standby, "the standby", |s| {
        s.reason
            .as_deref()
            .is_some_and(|r| r.starts_with("standby"))
    })
    .await;
    assert_eq!(waiting.generation, None, "a standby never connects");
    let state = wait_config(&standby, "the standby converged", |w| {
        w.converged_generation == 1
    })
    .await;
    assert!(!state.degraded, "{state:?}");

    let mut persistent = config.clone();
    persistent.mqtt.sessions.get_mut("plant").unwrap().mode = SessionMode::Persistent;
    source.set(&persistent);
    let report = standby.reload("test").await.unwrap();
    assert_eq!(report.outcome, ReloadOutcome::Refused, "{report:?}");
    assert!(report.reason.unwrap_or_default().contains("mode changed"));

    holder.shutdown().await;
    wait_session(&standby, "the takeover at full", |s| {
        s.level == SessionLevel::Full && s.lease.as_ref().is_some_and(|l| l.held)
    })
    .await;
    standby.shutdown().await;
}

on_both_backends!(
    exclusive_standby,
    exclusive_sessions_converge_on_the_holder_and_stand_by_elsewhere
);
