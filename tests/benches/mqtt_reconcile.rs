//! Benchmark: the session runtime reconciling 10,000 filters (a persistent session seeded empty,
//! from `start_sessions` to level Full) against a bare `rumqttc::v5::AsyncClient` subscribing the
//! same 10,000 filters (one per `subscribe` call, counting SUBACKs), on the same private
//! Mosquitto in the same run; goal: at most 2x.
//!
//! The runtime Remembers the filters in growing waves (ADR 0041: 250, then each up to twice the
//! one before): each wave's SUBSCRIBEs (100 filters per packet) go out once its
//! FiltersRemembered committed, while the next wave is written, and the SUBACK outcomes are
//! recorded as they come in, before the level is Full. Each part is also timed on its own: one
//! Remember and one SUBACK record of all the filters on a fresh identity of the same store, the
//! same two in the runtime's waves one after the other (the ledger's share of the runtime,
//! which the waves cannot overlap with itself),
//! one-per-filter SUBSCRIBEs with identifiers on the wharf-mqtt driver, the driver's batched
//! form (100 per SUBSCRIBE) for comparison, and the runtime on an ephemeral session (no ledger
//! writes).
//!
//! Run: `cargo bench -p wharf-tests --bench mqtt_reconcile` (`WHARF_BENCH_N` changes the 10,000).

use std::time::{Duration, Instant};
use wharf_tests::WharfSessions;

use rumqttc::v5::mqttbytes::v5::Packet;
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use wharf::domain::session::SessionMode;
use wharf::domain::session::{
    subscription_id, ExactFilter, Qos, ReconcileSettings, SessionLevel, SubscribeOutcome,
};
use wharf::Wharf;
use wharf_mqtt::{ConnectOptions, DisconnectReason, QoS, Session, SubscribeReason};
use wharf_server::config::{SessionConfig, SubscriptionConfig};
use wharf_tests::{Backend, TestStore};

mod broker;
use broker::Broker;

const DEADLINE: Duration = Duration::from_secs(120);

fn count() -> usize {
    std::env::var("WHARF_BENCH_N")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000)
}

fn filters(run: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("bench/{run}/{}/{i}/#", i % 97))
        .collect()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn unique(what: &str) -> String {
    format!(
        "{what}-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

/// The runtime, from `start_sessions` to Full, on a persistent session seeded empty (or an
/// ephemeral one, which keeps no ledger: the reconcile without its two writes).
async fn runtime(
    test: &TestStore,
    broker: &Broker,
    filters: &[String],
    mode: SessionMode,
) -> Duration {
    let mut config = test.config();
    // The production deadline of each ledger call (a third of the 30s instance TTL): the
    // harness's 400ms TTL would give the 10,000-filter writes 133ms.
    config.declarations = Default::default();
    config.mqtt.connect_timeout = Duration::from_secs(10);
    config.mqtt.subscribe_timeout = Duration::from_secs(60);
    let session = SessionConfig {
        mode,
        session_expiry: (mode == SessionMode::Persistent).then_some(Duration::from_secs(10)),
        subscriptions: filters
            .iter()
            .map(|f| SubscriptionConfig {
                filter: f.clone(),
                qos: 1,
                topic: "bench".to_owned(),
            })
            .collect(),
        ..SessionConfig::new(&broker.url(), &unique("bench-runtime"))
    };
    config.mqtt.sessions.insert("bench".to_owned(), session);
    let wharf = Wharf::with_store(test.store.clone(), &config.settings());
    let id = config.mqtt.resolve().expect("valid session")[0]
        .identity
        .id()
        .to_owned();
    if mode == SessionMode::Persistent {
        wharf.seed_session_baseline(&id, &[]).await.expect("seed");
    }
    let started = Instant::now();
    let runtimes = wharf.start_sessions(&config).expect("start");
    let mut watch = runtimes[0].watch();
    let full = tokio::time::timeout(DEADLINE, watch.wait_for(|s| s.level == SessionLevel::Full))
        .await
        .is_ok();
    let elapsed = started.elapsed();
    assert!(
        full,
        "no Full within {DEADLINE:?}: {:?}",
        runtimes[0].status()
    );
    for runtime in runtimes {
        runtime.shutdown().await;
    }
    elapsed
}

fn exact(filters: &[String]) -> Vec<ExactFilter> {
    filters
        .iter()
        .map(|f| ExactFilter::parse_field("filter", f).expect("valid filter"))
        .collect()
}

/// The two ledger writes of the reconcile, alone, on a fresh identity of the same store: each
/// in writes of the sizes `waves` gives, one after the other.
async fn ledger_parts(
    test: &TestStore,
    filters: &[String],
    waves: &[usize],
) -> (Duration, Duration) {
    let wharf = Wharf::with_store(test.store.clone(), &test.config().settings());
    let ledger = wharf.session_ledger();
    let id = format!("ms-{:032x}", rand::random::<u128>());
    ledger.seed(&id, Vec::new(), "bench").await.expect("seed");
    let exact = exact(filters);
    let started = Instant::now();
    for chunk in chunks(&exact, waves) {
        let remembered = chunk
            .iter()
            .map(|f| (f.clone(), Qos::AtLeastOnce))
            .collect();
        ledger.remember(&id, remembered).await.expect("remember");
    }
    let remember = started.elapsed();
    let granted = SubscribeOutcome::Granted {
        qos: Qos::AtLeastOnce,
    };
    let started = Instant::now();
    for chunk in chunks(&exact, waves) {
        let outcomes = chunk
            .iter()
            .map(|f| (f.clone(), Qos::AtLeastOnce, granted))
            .collect();
        ledger.record_suback(&id, outcomes).await.expect("record");
    }
    (remember, started.elapsed())
}

/// `items` cut into consecutive pieces of the sizes `sizes` gives.
fn chunks<'a, T>(items: &'a [T], sizes: &[usize]) -> Vec<&'a [T]> {
    let mut rest = items;
    let mut pieces = Vec::new();
    for size in sizes {
        let (piece, tail) = rest.split_at((*size).min(rest.len()));
        pieces.push(piece);
        rest = tail;
    }
    pieces
}

/// The wave sizes the runtime Remembers `n` new filters in: the first wave, then each up to
/// twice the one before.
fn wave_sizes(n: usize) -> Vec<usize> {
    let (mut sizes, mut next, mut left) = (Vec::new(), ReconcileSettings::DEFAULT_FIRST_WAVE, n);
    while left > 0 {
        sizes.push(next.min(left));
        left -= next.min(left);
        next *= 2;
    }
    sizes
}

/// The driver alone: one SUBSCRIBE per filter with its identifier (what the runtime sends), or
/// `batch` filters per SUBSCRIBE without identifiers.
async fn driver(broker: &Broker, filters: &[String], batch: Option<usize>) -> Duration {
    let mut options = ConnectOptions::new("127.0.0.1", broker.port, unique("bench-driver"));
    options.operation_timeout = Duration::from_secs(60);
    let (handle, _deliveries) = Session::connect(options).await.expect("connect");
    let started = Instant::now();
    let replies: Vec<_> = match batch {
        None => {
            let requests = exact(filters).into_iter().map(|f| {
                let handle = handle.clone();
                async move {
                    let id = subscription_id(&f);
                    handle
                        .subscribe(vec![(f.as_str().to_owned(), QoS::AtLeastOnce)], Some(id))
                        .await
                }
            });
            futures::future::join_all(requests).await
        }
        Some(batch) => {
            let requests = filters.chunks(batch).map(|chunk| {
                let handle = handle.clone();
                let chunk: Vec<_> = chunk
                    .iter()
                    .map(|f| (f.clone(), QoS::AtLeastOnce))
                    .collect();
                async move { handle.subscribe(chunk, None).await }
            });
            futures::future::join_all(requests).await
        }
    };
    let elapsed = started.elapsed();
    let granted: usize = replies
        .into_iter()
        .map(|r| {
            r.expect("subscribe")
                .into_iter()
                .filter(|r| *r == SubscribeReason::Granted(QoS::AtLeastOnce))
                .count()
        })
        .sum();
    assert_eq!(granted, filters.len(), "every filter granted");
    let _ = handle.disconnect(DisconnectReason::Normal).await;
    elapsed
}

/// A bare rumqttc v5 client: one `subscribe` per filter, timed until the last SUBACK.
async fn rumqttc(broker: &Broker, filters: &[String]) -> Duration {
    let mut options = MqttOptions::new(unique("bench-rumqttc"), "127.0.0.1", broker.port);
    options.set_keep_alive(Duration::from_secs(30));
    options.set_clean_start(true);
    let (client, mut eventloop) = AsyncClient::new(options, 1024);
    loop {
        if let Event::Incoming(Packet::ConnAck(_)) = eventloop.poll().await.expect("connect") {
            break;
        }
    }
    let started = Instant::now();
    let expected = filters.len();
    let counter = tokio::spawn(async move {
        let mut subacks = 0;
        while subacks < expected {
            if let Event::Incoming(Packet::SubAck(_)) = eventloop.poll().await.expect("poll") {
                subacks += 1;
            }
        }
        (started.elapsed(), eventloop)
    });
    for filter in filters {
        client
            .subscribe(filter.clone(), rumqttc::v5::mqttbytes::QoS::AtLeastOnce)
            .await
            .expect("subscribe");
    }
    let (elapsed, mut eventloop) = counter.await.expect("counter");
    client.disconnect().await.expect("disconnect");
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while eventloop.poll().await.is_ok() {}
    })
    .await;
    elapsed
}

async fn bench(backend: Backend, broker: &Broker, n: usize) {
    let test = TestStore::new(backend).await;
    let run = format!("{:08x}", rand::random::<u32>());
    let filters = filters(&run, n);
    let before = rumqttc(broker, &filters).await;
    let ours = runtime(&test, broker, &filters, SessionMode::Persistent).await;
    let after = rumqttc(broker, &filters).await;
    let theirs = (before + after) / 2;
    let (remember, record) = ledger_parts(&test, &filters, &[n]).await;
    let waves = wave_sizes(n);
    let (remember_waves, record_waves) = ledger_parts(&test, &filters, &waves).await;
    let each = driver(broker, &filters, None).await;
    let batched = driver(broker, &filters, Some(100)).await;
    let ephemeral = runtime(&test, broker, &filters, SessionMode::Ephemeral).await;
    println!(
        "{backend:?}: reconcile {n} filters, runtime start->Full {:.0} ms; bare rumqttc {:.0} ms \
         (mean of {:.0} and {:.0}); ratio runtime/rumqttc {:.2} (goal <= 2.00)",
        ms(ours),
        ms(theirs),
        ms(before),
        ms(after),
        ours.as_secs_f64() / theirs.as_secs_f64()
    );
    println!(
        "{backend:?}:   parts alone: Remember {n} {:.0} ms; one SUBSCRIBE per filter with ids \
         (driver) {:.0} ms; record {n} SUBACK outcomes {:.0} ms; sum {:.0} ms (batched 100 per \
         SUBSCRIBE, no ids: {:.0} ms); the runtime on an ephemeral session (no ledger) {:.0} ms",
        ms(remember),
        ms(each),
        ms(record),
        ms(remember + each + record),
        ms(batched),
        ms(ephemeral)
    );
    println!(
        "{backend:?}:   the ledger in the runtime's waves {waves:?}: Remember {:.0} ms, SUBACK \
         record {:.0} ms, sum {:.0} ms (one after the other: the runtime's floor from its ledger)",
        ms(remember_waves),
        ms(record_waves),
        ms(remember_waves + record_waves)
    );
}

#[tokio::main]
async fn main() {
    let n = count();
    let broker = broker::start();
    for backend in [Backend::Sqlite, Backend::Postgres] {
        bench(backend, &broker, n).await;
    }
}
