//! Benchmark: MQTT ingest into the message log with manual acks (the session runtime's
//! `LogIngest`: append a batch, commit, then ack each message on its connection), in messages
//! per second at QoS 1, against `mosquitto_sub -q 1 -t T > /dev/null` draining the same load from
//! the same private Mosquitto in the same run; goal: at least 0.5.
//!
//! The load: N messages (64-byte payloads) published at QoS 1 by `mosquitto_pub -l` into a
//! persistent session that holds the subscription and is offline, so both sides drain the same
//! queued backlog. The clock starts when the consumer starts (process start for
//! `mosquitto_sub`, `start_sessions` for Wharf) and stops at the Nth message (`-C N`; the
//! runtime's `ingested` count, which moves after the commit and the acks). mosquitto_sub runs
//! before and after; the mean is the baseline.
//!
//! Run: `cargo bench -p wharf-tests --bench mqtt_ingest` (`WHARF_BENCH_N` changes the 60,000).

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use wharf_tests::WharfSessions;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use wharf::domain::session::SessionLevel;
use wharf_server::config::{SessionConfig, SubscriptionConfig};

use async_trait::async_trait;
use wharf::HandlerError;
use wharf::Wharf;
use wharf_sessions::{LogIngest, MqttHandler, MqttMessage, SessionRuntime};
use wharf_tests::{Backend, TestStore};

mod broker;
use broker::Broker;

const DEADLINE: Duration = Duration::from_secs(120);
const FILTER: &str = "load/#";
const SUBJECT: &str = "load/line1/temp";

fn count() -> usize {
    std::env::var("WHARF_BENCH_N")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(60_000)
}

fn unique(what: &str) -> String {
    format!(
        "{what}-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

fn mosquitto(program: &str, broker: &Broker, args: &[&str]) -> Command {
    let mut command = Command::new(program);
    command
        .args(["-V", "5", "-h", "127.0.0.1", "-p", &broker.port.to_string()])
        .args(args);
    command
}

/// Queues `n` QoS 1 messages for every session subscribed to the load.
fn load(broker: &Broker, n: usize) {
    let mut publisher = mosquitto("mosquitto_pub", broker, &["-q", "1", "-t", SUBJECT, "-l"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("mosquitto_pub");
    let mut lines = String::with_capacity(n * 65);
    for i in 0..n {
        lines.push_str(&format!("{i:0>64}\n"));
    }
    let mut stdin = publisher.stdin.take().expect("stdin");
    stdin.write_all(lines.as_bytes()).expect("write the load");
    drop(stdin);
    assert!(publisher.wait().expect("mosquitto_pub").success());
}

/// `mosquitto_sub -q 1` draining `n` queued messages to /dev/null.
fn mosquitto_sub(broker: &Broker, n: usize) -> Duration {
    let id = unique("bench-sub");
    let session = ["-i", &id, "-c", "-x", "60", "-q", "1", "-t", FILTER];
    let created = mosquitto("mosquitto_sub", broker, &session)
        .arg("-E")
        .status()
        .expect("mosquitto_sub -E");
    assert!(created.success());
    load(broker, n);
    let started = Instant::now();
    let drained = mosquitto("mosquitto_sub", broker, &session)
        .args(["-C", &n.to_string()])
        .stdout(Stdio::null())
        .status()
        .expect("mosquitto_sub -C");
    let elapsed = started.elapsed();
    assert!(drained.success());
    elapsed
}

fn config(test: &TestStore, broker: &Broker) -> wharf_server::Config {
    let mut config = test.config();
    // The production deadline of each ledger call (a third of the 30s instance TTL).
    config.declarations = Default::default();
    if let Some(batch) = std::env::var("WHARF_BENCH_INGEST_BATCH")
        .ok()
        .and_then(|b| b.parse().ok())
    {
        config.mqtt.ingest_batch = batch;
    }
    config.mqtt.sessions.insert(
        "ingest".to_owned(),
        SessionConfig {
            session_expiry: Some(Duration::from_secs(60)),
            subscriptions: vec![SubscriptionConfig {
                filter: FILTER.to_owned(),
                qos: 1,
                topic: "load".to_owned(),
            }],
            ..SessionConfig::new(&broker.url(), &unique("bench-wharf"))
        },
    );
    config
}

async fn wait(
    runtime: &SessionRuntime,
    what: &str,
    done: impl Fn(&wharf_sessions::SessionStatus) -> bool,
) {
    let mut watch = runtime.watch();
    let reached = tokio::time::timeout(DEADLINE, watch.wait_for(|s| done(s))).await;
    assert!(
        matches!(reached, Ok(Ok(_))),
        "{what} not within {DEADLINE:?}: {:?}",
        runtime.status()
    );
}

/// `LogIngest`, counting the batches it commits.
struct Counted {
    inner: LogIngest,
    batches: AtomicU64,
}

#[async_trait]
impl MqttHandler for Counted {
    async fn handle(&self, batch: &[MqttMessage]) -> Result<(), HandlerError> {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.inner.handle(batch).await
    }
}

/// The session runtime ingesting `n` queued messages into the log; also the batches committed.
async fn wharf_ingest(test: &TestStore, broker: &Broker, n: usize) -> (Duration, u64) {
    let config = config(test, broker);
    let wharf = Wharf::with_store(test.store.clone(), &config.settings());
    let id = config.mqtt.resolve().expect("valid")[0]
        .identity
        .id()
        .to_owned();
    wharf.seed_session_baseline(&id, &[]).await.expect("seed");
    // Subscribe once, go offline with the session kept, then queue the load.
    let first = wharf.start_sessions(&config).expect("start");
    wait(&first[0], "Full", |s| s.level == SessionLevel::Full).await;
    for runtime in first {
        runtime.shutdown().await;
    }
    load(broker, n);
    let handler = Arc::new(Counted {
        inner: LogIngest::new(wharf.queue().clone()),
        batches: AtomicU64::new(0),
    });
    let started = Instant::now();
    let runtimes = wharf
        .start_sessions_with(&config, handler.clone())
        .expect("start");
    let n64 = n as u64;
    wait(&runtimes[0], "every message ingested", |s| {
        s.ingested >= n64
    })
    .await;
    let elapsed = started.elapsed();
    for runtime in runtimes {
        runtime.shutdown().await;
    }
    let stats = wharf.queue().topic_stats().await.expect("stats");
    let size = stats
        .iter()
        .find(|t| t.topic == "load")
        .map_or(0, |t| t.size);
    assert!(size >= n as i64, "the log holds {size} of {n}");
    (elapsed, handler.batches.load(Ordering::Relaxed))
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

async fn bench(backend: Backend, broker: &Broker, n: usize) {
    let test = TestStore::new(backend).await;
    let before = mosquitto_sub(broker, n);
    let (ours, batches) = wharf_ingest(&test, broker, n).await;
    let after = mosquitto_sub(broker, n);
    let baseline = (rate(n, before) + rate(n, after)) / 2.0;
    let ingest = rate(n, ours);
    println!(
        "{backend:?}: ingest {n} QoS 1 messages: wharf {ingest:.0} msg/s ({:.0} ms); \
         mosquitto_sub -q 1 > /dev/null {baseline:.0} msg/s (mean of {:.0} and {:.0}); \
         ratio {:.2} (goal >= 0.50); {batches} commits, {:.1} messages each",
        ours.as_secs_f64() * 1e3,
        rate(n, before),
        rate(n, after),
        ingest / baseline,
        n as f64 / batches.max(1) as f64
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
