//! Exclusive MQTT sessions in one process, on a real Mosquitto and both store backends: two
//! runtimes of one exclusive session (as during a reload) contend for its HA lease; exactly one
//! holds it and reaches Full while the other stands by; when the holder shuts down it releases,
//! and the standby takes over with the next fencing token. Every managed-filter write names the
//! claim it was fenced by.

use std::time::Duration;
use wharf_tests::WharfSessions;

use wharf::domain::lease::LEASE_AGGREGATE;
use wharf::domain::session::{SessionLevel, SessionMode, MANAGED_SESSION_AGGREGATE};
use wharf_server::config::LeaseConfig;
use wharf_server::Config;
use wharf_sessions::{SessionRuntime, SessionStatus};
use wharf_tests::sessions::{session_config, session_id, unique, wait_status};
use wharf_tests::{on_both_backends, Backend, TestStore};

fn broker_url() -> String {
    std::env::var("WHARF_TEST_MQTT_URL").unwrap_or_else(|_| "mqtt://127.0.0.1:1883".into())
}

/// An exclusive session `plant` with a short lease (2 s TTL, renew every 250 ms, step down
/// after 1 s without a successful renew).
fn exclusive_config(ts: &TestStore, client_id: &str, filters: &[&str]) -> Config {
    let subscriptions: Vec<(&str, u8)> = filters.iter().map(|f| (*f, 1)).collect();
    let mut config = session_config(
        ts,
        &broker_url(),
        client_id,
        &subscriptions,
        Duration::from_millis(300),
    );
    let session = config.mqtt.sessions.get_mut("plant").expect("plant");
    session.mode = SessionMode::Exclusive;
    config.lease = LeaseConfig {
        ttl: Duration::from_secs(2),
        renew_interval: Duration::from_millis(250),
        renew_deadline: Duration::from_secs(1),
    };
    config
}

/// The session's lease events by type, renewals left out.
async fn lease_history(ts: &TestStore, id: &str) -> Vec<String> {
    ts.store
        .load(LEASE_AGGREGATE, id)
        .await
        .expect("lease events")
        .into_iter()
        .map(|e| e.event_type)
        .filter(|t| t != "LeaseRenewed")
        .collect()
}

fn holds(status: &SessionStatus) -> bool {
    status.lease.as_ref().is_some_and(|l| l.held)
}

fn stands_by(status: &SessionStatus) -> bool {
    !holds(status)
        && status
            .reason
            .as_deref()
            .is_some_and(|r| r.starts_with("standby"))
}

async fn start(ts: &TestStore, config: &Config) -> SessionRuntime {
    let mut runtimes = ts.wharf().start_sessions(config).expect("starts");
    assert_eq!(runtimes.len(), 1);
    runtimes.remove(0)
}

async fn one_holder_at_a_time(backend: Backend) {
    let ts = TestStore::new(backend).await;
    let root = unique("exclusive");
    let config = exclusive_config(&ts, &unique("wharf-excl"), &[&format!("{root}/+")]);
    let id = session_id(&config);
    ts.wharf()
        .seed_session_baseline(&id, &[])
        .await
        .expect("seed empty");
    let first = start(&ts, &config).await;
    wait_status(&first, "the first runtime at Full", |s| {
        s.level == SessionLevel::Full && holds(s)
    })
    .await;
    let second = start(&ts, &config).await;
    let standby = wait_status(&second, "the second runtime standing by", stands_by).await;
    assert_eq!(standby.generation, None, "a standby never connects");
    let owner = first.status().lease.expect("a lease view");
    assert_eq!(owner.token, Some(1));
    assert_eq!(
        standby.lease.as_ref().and_then(|l| l.holder.clone()),
        owner.holder,
        "the standby names the holder"
    );

    first.shutdown().await;
    let taken = wait_status(&second, "the standby taking over at Full", |s| {
        s.level == SessionLevel::Full && holds(s)
    })
    .await;
    assert_eq!(taken.lease.and_then(|l| l.token), Some(2));
    second.shutdown().await;

    let lease_events = lease_history(&ts, &id).await;
    assert_eq!(
        lease_events,
        [
            "LeaseAcquired",
            "LeaseReleased",
            "LeaseAcquired",
            "LeaseReleased"
        ]
    );
    // Every write after the seed was made by an owner and names its claim.
    let ledger = ts
        .store
        .load(MANAGED_SESSION_AGGREGATE, &id)
        .await
        .expect("ledger events");
    assert!(ledger.len() > 1, "the owners wrote the reconcile");
    for event in &ledger[1..] {
        let token = event.metadata.get("lease_token").and_then(|t| t.as_i64());
        assert!(
            matches!(token, Some(1 | 2)),
            "{} carries no claim: {}",
            event.event_type,
            event.metadata
        );
    }
}

on_both_backends!(
    two_runtimes_of_one_exclusive_session_hold_it_one_at_a_time,
    one_holder_at_a_time
);

async fn an_unseeded_exclusive_session_never_connects(backend: Backend) {
    let ts = TestStore::new(backend).await;
    let config = exclusive_config(&ts, &unique("wharf-excl-unseeded"), &["never/+"]);
    let runtime = start(&ts, &config).await;
    let status = wait_status(&runtime, "the unknown-history refusal", |s| {
        s.reason
            .as_deref()
            .is_some_and(|r| r.contains("is unknown"))
    })
    .await;
    assert_eq!(status.generation, None, "nothing connected");
    runtime.shutdown().await;
    let id = session_id(&config);
    let released = lease_history(&ts, &id)
        .await
        .iter()
        .any(|t| t == "LeaseReleased");
    assert!(released, "a round that failed closed gives the lease back");
}

on_both_backends!(
    an_unseeded_exclusive_session_fails_closed_and_releases,
    an_unseeded_exclusive_session_never_connects
);

/// One permanently refused SUBSCRIBE fails the whole reconcile of an exclusive session: each
/// round releases the lease, supervision retries with backoff and readiness stays below Full;
/// once the broker allows the filter, the next round converges and keeps the lease.
async fn a_refused_subscribe_releases_the_lease_each_round(backend: Backend) {
    use wharf_tests::broker::{anonymous_dynsec, Broker, BrokerConfig};
    let ts = TestStore::new(backend).await;
    let root = unique("excl-deny");
    let (allowed, denied) = (format!("{root}/ok/#"), format!("{root}/denied/#"));
    let only_allowed = anonymous_dynsec(&[("subscribePattern", &allowed, true)]);
    let mut broker = Broker::start(BrokerConfig::dynsec(only_allowed).persistent());
    let mut config = exclusive_config(&ts, &unique("wharf-excl-deny"), &[]);
    let session = config.mqtt.sessions.get_mut("plant").expect("plant");
    session.brokers = vec![broker.url()];
    session.subscriptions = [&allowed, &denied]
        .into_iter()
        .map(|filter| wharf_server::config::SubscriptionConfig {
            filter: filter.clone(),
            qos: 1,
            topic: "sensors".to_owned(),
        })
        .collect();
    let id = session_id(&config);
    ts.wharf()
        .seed_session_baseline(&id, &[])
        .await
        .expect("seed");
    let runtime = start(&ts, &config).await;
    let refusal = format!("\"{denied}\" refused with reason 0x87");
    let failed = wait_status(&runtime, "the refused SUBSCRIBE", |s| {
        s.reason.as_deref().is_some_and(|r| r.contains(&refusal)) && !holds(s)
    })
    .await;
    assert!(failed.level < SessionLevel::Full, "{failed:?}");
    // A second round fails the same way and gives the lease back again.
    wait_status(&runtime, "a second acquire", |s| {
        s.lease.as_ref().and_then(|l| l.token) == Some(2)
    })
    .await;
    let again = wait_status(&runtime, "the second refusal", |s| {
        s.reason.as_deref().is_some_and(|r| r.contains(&refusal)) && !holds(s)
    })
    .await;
    assert!(again.level < SessionLevel::Full);
    let rounds: Vec<String> = lease_history(&ts, &id).await.into_iter().take(4).collect();
    assert_eq!(
        rounds,
        [
            "LeaseAcquired",
            "LeaseReleased",
            "LeaseAcquired",
            "LeaseReleased"
        ]
    );

    let both = anonymous_dynsec(&[
        ("subscribePattern", &allowed, true),
        ("subscribePattern", &denied, true),
    ]);
    wharf_tests::sessions::blocking(|| {
        broker.restart_with(BrokerConfig::dynsec(both).persistent())
    });
    wait_status(&runtime, "Full once allowed, holding the lease", |s| {
        s.level == SessionLevel::Full && holds(s)
    })
    .await;
    runtime.shutdown().await;
}

on_both_backends!(
    a_refused_subscribe_releases_an_exclusive_lease_each_round,
    a_refused_subscribe_releases_the_lease_each_round
);

/// A handler that never returns once called: the run it is called from cannot quiesce.
#[derive(Default)]
struct Stuck {
    called: tokio::sync::Notify,
}

#[async_trait::async_trait]
impl wharf_sessions::MqttHandler for Stuck {
    async fn handle(
        &self,
        _batch: &[wharf_sessions::MqttMessage],
    ) -> Result<(), wharf::HandlerError> {
        self.called.notify_one();
        std::future::pending().await
    }
}

/// A runtime that cannot stop within the drain bound is aborted; its lease, never released,
/// expires by the TTL and the next runtime takes over with the next token.
async fn an_aborted_holder_leaves_its_lease_to_expire(backend: Backend) {
    let ts = TestStore::new(backend).await;
    let root = unique("excl-stuck");
    let config = exclusive_config(&ts, &unique("wharf-excl-stuck"), &[&format!("{root}/+")]);
    let id = session_id(&config);
    let wharf = ts.wharf();
    wharf.seed_session_baseline(&id, &[]).await.expect("seed");
    let handler = std::sync::Arc::new(Stuck::default());
    let stuck = wharf
        .start_sessions_with(&config, handler.clone())
        .expect("starts")
        .remove(0);
    wait_status(&stuck, "Full", |s| {
        s.level == SessionLevel::Full && holds(s)
    })
    .await;
    wharf_tests::sessions::publish(broker_port(), &format!("{root}/a"), "1").await;
    tokio::time::timeout(Duration::from_secs(20), handler.called.notified())
        .await
        .expect("the delivery reaches the handler");
    let drained = stuck.shutdown_within(Duration::from_millis(300)).await;
    assert!(!drained, "a handler that never returns cannot be drained");
    let next = start(&ts, &config).await;
    let taken = wait_status(&next, "the next runtime at Full after the TTL", |s| {
        s.level == SessionLevel::Full && holds(s)
    })
    .await;
    assert_eq!(taken.lease.and_then(|l| l.token), Some(2));
    next.shutdown().await;
    let events = lease_history(&ts, &id).await;
    assert_eq!(
        events[..3],
        ["LeaseAcquired", "LeaseExpired", "LeaseAcquired"],
        "the aborted holder released nothing"
    );
}

fn broker_port() -> u16 {
    broker_url()
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .unwrap_or(1883)
}

on_both_backends!(
    an_aborted_exclusive_holder_leaves_its_lease_to_expire,
    an_aborted_holder_leaves_its_lease_to_expire
);

/// A migration-required exclusive session stays down and keeps its lease until the lease
/// expires naturally: nothing releases it, and another holder can only take it after the TTL.
async fn a_migration_required_holder_keeps_the_lease_until_it_expires(backend: Backend) {
    use wharf::domain::lease::{LeaseError, LeaseHolder};
    let ts = TestStore::new(backend).await;
    let config = exclusive_config(&ts, &unique("wharf-excl-migr"), &["plant/+"]);
    let id = session_id(&config);
    let wharf = ts.wharf();
    wharf.seed_session_baseline(&id, &[]).await.expect("seed");
    wharf
        .session_ledger()
        .require_migration(&id, "a test's migration".to_owned(), Vec::new())
        .await
        .expect("migration required");
    let runtime = start(&ts, &config).await;
    let terminal = wait_status(&runtime, "MigrationRequired, not acting", |s| {
        s.level == SessionLevel::MigrationRequired
            && s.lease
                .as_ref()
                .is_some_and(|l| !l.held && l.token == Some(1))
    })
    .await;
    assert_eq!(terminal.generation, None, "nothing connected");
    let leases = wharf_sessions::LeaseLedger::new(ts.store.clone());
    let other = LeaseHolder::parse("holder", "operator-check:1").unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut refused_while_held = false;
    let taken = loop {
        match leases.acquire(&id, &other, Duration::from_secs(30)).await {
            Ok(acquired) => break acquired,
            Err(wharf_sessions::SessionError::Lease(LeaseError::Held { token, .. })) => {
                assert_eq!(token.get(), 1);
                refused_while_held = true;
                assert!(
                    std::time::Instant::now() < deadline,
                    "the lease never expired"
                );
                tokio::task::yield_now().await;
            }
            Err(e) => panic!("acquire: {e}"),
        }
    };
    assert!(
        refused_while_held,
        "the kept lease was held until its expiry"
    );
    assert_eq!(taken.token.get(), 2);
    runtime.shutdown().await;
    let events = lease_history(&ts, &id).await;
    assert_eq!(
        events[..3],
        ["LeaseAcquired", "LeaseExpired", "LeaseAcquired"],
        "expired, never released"
    );
}

on_both_backends!(
    a_migration_required_exclusive_holder_keeps_the_lease_until_it_expires,
    a_migration_required_holder_keeps_the_lease_until_it_expires
);
