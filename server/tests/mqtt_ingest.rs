//! MQTT ingest as real processes, on both backends: `wharf serve` runs a persistent session on
//! a private Mosquitto (persistence on, so a broker restart keeps the session and its queue),
//! and every QoS 1 message a plain client published reaches the message log at least once
//! across a broker restart and across SIGKILLs of `serve` mid-stream (duplicates are counted
//! and printed; none is lost, so none was acked before its commit). `/readyz` and
//! `GET /api/v1/sessions` follow the session's level; an unseeded session never connects
//! (the broker's own log says so); and SIGKILLs at random points of a 2,000-filter reconcile
//! still converge to Full with the ledger history exactly the desired set.

#![allow(clippy::unwrap_used)]

mod support;

/// Every response these tests receive is held to the generated OpenAPI document (ADR 0033).
#[path = "../../api/tests/support/contract.rs"]
#[allow(dead_code)]
mod contract;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use support::broker::Broker;
use support::{Backend, Running, TestStore};
use tokio::time::Instant;
use wharf::domain::GroupName;
use wharf::{Registration, Wharf};
use wharf_mqtt::{ConnectOptions, QoS, Session, SessionHandle};

macro_rules! on_both_backends {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name(super::Backend::Sqlite).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name(super::Backend::Postgres).await;
            }
        }
    };
}

/// The longest any one wait of these tests may take.
const DEADLINE: Duration = Duration::from_secs(60);
const SUBJECT: &str = "plant/line1/temp";

/// The `wharf.toml` of a session `plant` on `broker`, feeding log topic `sensors`.
fn config_toml(broker: &Broker, client_id: &str, filters: &[String], grace: &str) -> String {
    let subscriptions: String = filters
        .iter()
        .map(|f| format!("  {{ filter = \"{f}\", qos = 1, topic = \"sensors\" }},\n"))
        .collect();
    format!(
        "[http]\nlisten = \"127.0.0.1:0\"\n\n\
         [mqtt]\nunmatched_grace = \"{grace}\"\nconnect_timeout = \"5s\"\nsubscribe_timeout = \"30s\"\n\n\
         [mqtt.sessions.plant]\nbrokers = [\"{}\"]\nclient_id = \"{client_id}\"\n\
         session_expiry = \"10m\"\nsubscriptions = [\n{subscriptions}]\n",
        broker.url()
    )
}

fn write_config(store: &TestStore, text: &str) {
    std::fs::write(store.dir.path().join("wharf.toml"), text).unwrap();
}

fn client_id(what: &str) -> String {
    format!("wharf-{what}-{:08x}", rand::random::<u32>())
}

/// `wharf serve` on the store's `wharf.toml` (the harness's 5s instance TTL: ledger calls get
/// 1.67s per 500 filters); returns it with its listen address.
async fn serve(store: &TestStore) -> (Running, SocketAddr) {
    serve_with_ttl(store, "5s").await
}

/// `serve` with `declarations.instance_ttl` = `ttl` (its ledger calls get a third of it).
async fn serve_with_ttl(store: &TestStore, ttl: &str) -> (Running, SocketAddr) {
    let mut command = store.command();
    command.env("WHARF_DECLARATIONS__INSTANCE_TTL", ttl);
    let mut serve = Running::start("serve", command, &["--config", "wharf.toml", "serve"]);
    let address = serve.serving_address().await;
    (serve, address)
}

async fn get(address: SocketAddr, path: &str) -> (u16, Value) {
    let response = reqwest::get(format!("http://{address}{path}"))
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let text = response.text().await.unwrap();
    contract::assert_conforms("GET", path, status, &content_type, &text);
    (status, serde_json::from_str(&text).unwrap())
}

/// Polls `path` until `condition` holds on its (status, body); returns that body.
async fn wait_for(
    address: SocketAddr,
    path: &str,
    what: &str,
    condition: impl Fn(u16, &Value) -> bool,
) -> Value {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let (status, body) = get(address, path).await;
        if condition(status, &body) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {DEADLINE:?}; last {path}: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The `live` report of session `plant` in `GET /api/v1/sessions`.
fn live(body: &Value) -> &Value {
    &body["sessions"][0]["live"]
}

async fn wait_full(address: SocketAddr) -> Value {
    wait_for(address, "/readyz", "readiness", |status, _| status == 200).await;
    wait_for(address, "/api/v1/sessions", "level full", |_, body| {
        live(body)["level"] == "full"
    })
    .await
}

/// The ledger's exact history of `plant`, read by `wharf sessions show --json`.
async fn recorded_history(store: &TestStore) -> Option<Vec<(String, String)>> {
    let run = store
        .run(&[
            "--config",
            "wharf.toml",
            "sessions",
            "show",
            "plant",
            "--json",
        ])
        .await;
    let shown: Value = serde_json::from_str(run.success()).unwrap();
    let filters = shown["recorded"]["filters"].as_array()?;
    Some(
        filters
            .iter()
            .map(|f| {
                (
                    f["filter"].as_str().unwrap().to_owned(),
                    f["state"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect(),
    )
}

async fn seed(store: &TestStore, spec: &str) {
    store
        .run(&["--config", "wharf.toml", "sessions", "seed", spec])
        .await
        .success();
}

/// A QoS 1 publisher that reconnects and republishes until the broker acknowledged (a message
/// whose PUBACK was lost is published again: a duplicate, counted as such).
struct Publisher {
    port: u16,
    id: String,
    handle: Option<(SessionHandle, wharf_mqtt::Deliveries)>,
}

impl Publisher {
    fn new(port: u16) -> Self {
        Self {
            port,
            id: client_id("pub"),
            handle: None,
        }
    }

    async fn publish(&mut self, payload: String) {
        let deadline = Instant::now() + DEADLINE;
        loop {
            assert!(
                Instant::now() < deadline,
                "{payload}: not acknowledged by the broker within {DEADLINE:?}"
            );
            if self.handle.is_none() {
                let mut options = ConnectOptions::new("127.0.0.1", self.port, self.id.clone());
                options.connect_timeout = Duration::from_secs(2);
                options.operation_timeout = Duration::from_secs(2);
                match Session::connect(options).await {
                    Ok(connected) => self.handle = Some(connected),
                    Err(_) => {
                        // The broker is restarting: retry at a steady pace.
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                }
            }
            let (handle, _) = self.handle.as_ref().unwrap();
            let published = handle
                .publish(
                    SUBJECT,
                    payload.clone().into_bytes(),
                    QoS::AtLeastOnce,
                    false,
                )
                .await;
            match published {
                Ok(_) => return,
                Err(_) => self.handle = None,
            }
        }
    }
}

/// Publishes `msg-0` .. `msg-{n-1}`, one every `every`, counting what the broker acknowledged.
fn stream(
    port: u16,
    n: usize,
    every: Duration,
    acked: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut publisher = Publisher::new(port);
        let mut tick = tokio::time::interval(every);
        for i in 0..n {
            tick.tick().await;
            publisher.publish(format!("msg-{i}")).await;
            acked.store(i + 1, Ordering::SeqCst);
        }
    })
}

/// A whole-topic reader of `sensors`, declared before anything is ingested (a group is handed
/// what is published from its first declaration on).
struct Reader {
    wharf: Wharf,
    group: GroupName,
    /// Every payload read from the log, with how often.
    seen: BTreeMap<String, usize>,
}

impl Reader {
    async fn declare(store: &TestStore) -> Self {
        let wharf = store.wharf().await;
        let registration = Registration::new::<&str>("reader", "sensors", "1", &[]).unwrap();
        wharf.register(&registration).await.unwrap();
        Self {
            wharf,
            group: registration.group,
            seen: BTreeMap::new(),
        }
    }

    /// Claims and acks whatever the log holds now; returns how many.
    async fn drain(&mut self) -> usize {
        let mut total = 0;
        loop {
            let read = self.read_batch().await;
            if read == 0 {
                return total;
            }
            total += read;
        }
    }

    /// Claims and acks one batch; returns how many.
    async fn read_batch(&mut self) -> usize {
        let claimed = self
            .wharf
            .queue()
            .fetch(&self.group, "reader/1", 500)
            .await
            .unwrap();
        for message in &claimed {
            assert_eq!(message.subject, SUBJECT);
            let payload = String::from_utf8(message.payload.to_vec()).unwrap();
            *self.seen.entry(payload).or_default() += 1;
        }
        if !claimed.is_empty() {
            self.wharf.queue().ack_many(&claimed).await.unwrap();
        }
        claimed.len()
    }

    /// Drains until at least `distinct` different payloads were read.
    async fn until_distinct(&mut self, distinct: usize, serve: &Running) {
        let deadline = Instant::now() + DEADLINE;
        while self.seen.len() < distinct {
            if self.drain().await == 0 {
                assert!(
                    Instant::now() < deadline,
                    "{} of {distinct} messages reached the log within {DEADLINE:?}\n{}",
                    self.seen.len(),
                    serve.transcript()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    /// Drains until the publisher has had `published` messages acknowledged and the log holds
    /// more than `read` distinct ones (ingest is running), while the stream is still going.
    async fn mid_stream(
        &mut self,
        acked: &AtomicUsize,
        published: usize,
        read: usize,
        n: usize,
        serve: &Running,
    ) -> usize {
        let deadline = Instant::now() + DEADLINE;
        loop {
            self.read_batch().await;
            let now = acked.load(Ordering::SeqCst);
            if now >= published && self.seen.len() > read {
                assert!(
                    now < n,
                    "the stream ended before the disruption; slow it down\n{}",
                    serve.transcript()
                );
                return now;
            }
            assert!(
                Instant::now() < deadline,
                "{now} published, {} read: not mid-stream within {DEADLINE:?}\n{}",
                self.seen.len(),
                serve.transcript()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Asserts `msg-0..msg-{n-1}` were all read, and nothing else; returns the duplicates.
    fn check_complete(&self, n: usize) -> usize {
        let expected: BTreeSet<String> = (0..n).map(|i| format!("msg-{i}")).collect();
        let got: BTreeSet<String> = self.seen.keys().cloned().collect();
        let missing: Vec<_> = expected.difference(&got).take(10).collect();
        assert!(missing.is_empty(), "lost: {missing:?} (and maybe more)");
        assert_eq!(got, expected, "only what was published");
        self.seen.values().map(|count| count - 1).sum()
    }
}

/// Everything `serve` committed, after it stopped: nothing more can arrive.
async fn stop_and_drain(mut serve: Running, reader: &mut Reader) {
    assert_eq!(serve.terminate().await, Some(0), "{}", serve.transcript());
    reader.drain().await;
}

async fn broker_restart_mid_stream_loses_nothing(backend: Backend) {
    let Some(store) = TestStore::migrated(backend).await else {
        return;
    };
    let mut broker = Broker::start();
    write_config(
        &store,
        &config_toml(
            &broker,
            &client_id("restart"),
            &["plant/+/temp".into()],
            "500ms",
        ),
    );
    seed(&store, "plant").await;
    let mut reader = Reader::declare(&store).await;
    let (serve, address) = serve(&store).await;
    wait_full(address).await;

    const N: usize = 1500;
    let acked = Arc::new(AtomicUsize::new(0));
    let publisher = stream(broker.port, N, Duration::from_millis(2), acked.clone());
    let at_restart = reader.mid_stream(&acked, N / 3, 0, N, &serve).await;
    broker.restart();
    // The session comes back from the broker's persistence, with what queued meanwhile.
    publisher.await.unwrap();
    wait_full(address).await;
    reader.until_distinct(N, &serve).await;
    stop_and_drain(serve, &mut reader).await;
    let duplicates = reader.check_complete(N);
    println!(
        "{backend:?}: broker restarted after {at_restart} of {N} acknowledged publishes; \
         all {N} in the log, {duplicates} duplicate(s)"
    );
}

on_both_backends!(broker_restart_mid_stream_loses_nothing);

async fn sigkill_of_serve_mid_stream_loses_nothing(backend: Backend) {
    let Some(store) = TestStore::migrated(backend).await else {
        return;
    };
    let broker = Broker::start();
    write_config(
        &store,
        &config_toml(
            &broker,
            &client_id("kill"),
            &["plant/+/temp".into()],
            "500ms",
        ),
    );
    seed(&store, "plant").await;
    let mut reader = Reader::declare(&store).await;
    let (mut serve, address) = serve(&store).await;
    wait_full(address).await;

    const N: usize = 2000;
    let acked = Arc::new(AtomicUsize::new(0));
    let publisher = stream(broker.port, N, Duration::from_millis(2), acked.clone());
    let mut kills = Vec::new();
    for part in [4, 2] {
        // Kill it while it ingests: the stream is running and the log is growing.
        let before = reader.seen.len();
        let at_kill = reader.mid_stream(&acked, N / part, before, N, &serve).await;
        serve.kill().await;
        kills.push((at_kill, reader.seen.len()));
        let (next, address) = self::serve(&store).await;
        serve = next;
        wait_full(address).await;
    }
    publisher.await.unwrap();
    reader.until_distinct(N, &serve).await;
    stop_and_drain(serve, &mut reader).await;
    let duplicates = reader.check_complete(N);
    println!(
        "{backend:?}: serve SIGKILLed at (acknowledged publishes, messages read) {kills:?}; \
         all {N} in the log, {duplicates} duplicate(s)"
    );
}

on_both_backends!(sigkill_of_serve_mid_stream_loses_nothing);

async fn readiness_follows_the_session_and_unseeded_never_connects(backend: Backend) {
    let Some(store) = TestStore::migrated(backend).await else {
        return;
    };
    let broker = Broker::start();
    let client = client_id("ready");
    write_config(
        &store,
        &config_toml(&broker, &client, &["plant/+/temp".into()], "2s"),
    );
    let (mut serve, address) = serve(&store).await;

    // Unseeded: not ready, naming the session and the seed command; it never connects.
    let body = wait_for(address, "/api/v1/sessions", "the refusal", |_, body| {
        live(body)["reason"]
            .as_str()
            .is_some_and(|r| r.contains("is unknown"))
    })
    .await;
    assert_eq!(live(&body)["level"], "starting", "{body}");
    assert!(body["sessions"][0]["history"].is_null(), "{body}");
    serve.expect_err("the session run ended; retrying").await;
    serve.expect_err("the session run ended; retrying").await;
    let (status, ready) = get(address, "/readyz").await;
    assert_eq!(status, 503, "{ready}");
    let text = ready.to_string();
    assert!(text.contains("plant is starting"), "{text}");
    assert!(text.contains("wharf sessions seed plant"), "{text}");
    assert!(
        !broker.saw_connect_from(&client),
        "an unseeded session connected:\n{}",
        broker.log()
    );

    // Seeded with a filter the broker session supposedly holds: it subscribes the desired one,
    // removes the stale one, watches the recycled connection for the grace, then forgets it.
    seed(&store, "plant=legacy/#").await;
    let pending = wait_for(
        address,
        "/api/v1/sessions",
        "a pending removal",
        |_, body| live(body)["pending_stale"] == serde_json::json!(["legacy/#"]),
    )
    .await;
    assert_ne!(live(&pending)["level"], "full", "{pending}");
    let (status, ready) = get(address, "/readyz").await;
    assert_eq!(status, 503, "not ready while a removal is pending: {ready}");

    let full = wait_full(address).await;
    let session = &full["sessions"][0];
    assert_eq!(session["live"]["pending_stale"], serde_json::json!([]));
    assert_eq!(
        session["live"]["last_reconcile"]["converged"], true,
        "{full}"
    );
    let history: Vec<&str> = session["history"]["filters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["filter"].as_str().unwrap())
        .collect();
    assert_eq!(history, ["plant/+/temp"], "{full}");
    assert!(broker.saw_connect_from(&client), "{}", broker.log());
    assert_eq!(serve.terminate().await, Some(0), "{}", serve.transcript());
}

on_both_backends!(readiness_follows_the_session_and_unseeded_never_connects);

fn window(round: usize) -> Vec<String> {
    (round * 100..round * 100 + 2000)
        .map(|i| format!("fleet/{i}/+/state"))
        .collect()
}

async fn sigkill_during_a_large_reconcile_converges(backend: Backend) {
    let Some(store) = TestStore::migrated(backend).await else {
        return;
    };
    let broker = Broker::start();
    let client = client_id("large");
    write_config(&store, &config_toml(&broker, &client, &window(0), "300ms"));
    seed(&store, "plant").await;
    // How long one undisturbed reconcile of 2,000 filters takes here, from "wharf serving".
    let (mut first, address) = serve(&store).await;
    let started = Instant::now();
    wait_full(address).await;
    let span = started.elapsed();
    assert_eq!(first.terminate().await, Some(0), "{}", first.transcript());
    // Each round desires a window shifted by 100 filters (100 added, 100 removed), and is
    // killed at a random point of its reconcile.
    const ROUNDS: usize = 5;
    let mut points = Vec::new();
    for round in 1..=ROUNDS {
        write_config(
            &store,
            &config_toml(&broker, &client, &window(round), "300ms"),
        );
        let (mut serve, _) = serve(&store).await;
        let range = u64::try_from(span.as_millis()).unwrap().max(1);
        let delay = Duration::from_millis(rand::random::<u64>() % range);
        tokio::time::sleep(delay).await;
        serve.kill().await;
        let history = recorded_history(&store).await.unwrap_or_default();
        let mut states: BTreeMap<String, usize> = BTreeMap::new();
        for (_, state) in &history {
            *states.entry(state.clone()).or_default() += 1;
        }
        points.push(format!(
            "round {round}: killed after {delay:?}, history {states:?}"
        ));
    }
    let desired = window(ROUNDS + 1);
    write_config(&store, &config_toml(&broker, &client, &desired, "300ms"));
    let (mut serve, address) = serve(&store).await;
    let full = wait_full(address).await;
    assert_eq!(
        live(&full)["pending_stale"],
        serde_json::json!([]),
        "{full}"
    );
    let history: BTreeSet<String> = recorded_history(&store)
        .await
        .unwrap()
        .into_iter()
        .map(|(filter, _)| filter)
        .collect();
    let desired: BTreeSet<String> = desired.into_iter().collect();
    assert_eq!(
        history.len(),
        desired.len(),
        "extra: {:?}; missing: {:?}",
        history.difference(&desired).take(5).collect::<Vec<_>>(),
        desired.difference(&history).take(5).collect::<Vec<_>>()
    );
    assert_eq!(history, desired);
    assert_eq!(serve.terminate().await, Some(0), "{}", serve.transcript());
    println!(
        "{backend:?}: undisturbed reconcile {span:?}; {}",
        points.join("; ")
    );
}

on_both_backends!(sigkill_during_a_large_reconcile_converges);

/// The README's example bridge configuration stays valid: one persistent session `bridge`,
/// unseeded until someone seeds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_bridge_config_is_valid() {
    let store = TestStore::migrated(Backend::Sqlite).await.unwrap();
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/mqtt-bridge.toml");
    let run = store
        .run(&["--config", example, "sessions", "list", "--json"])
        .await;
    let listed: Value = serde_json::from_str(run.success()).unwrap();
    assert_eq!(listed[0]["name"], "bridge", "{listed}");
    assert!(listed[0]["history"].is_null(), "{listed}");
    assert!(
        listed[0]["identity"]
            .as_str()
            .unwrap()
            .contains("mqtt://127.0.0.1:1883 client=wharf-bridge-example mode=persistent"),
        "{listed}"
    );
}

/// A reconcile whose ledger writes, taken whole, outlast the store deadline still converges:
/// 3,000 filters under a 300ms deadline per ledger call (instance TTL 900ms).
async fn a_large_reconcile_converges_under_a_short_store_deadline(backend: Backend) {
    let Some(store) = TestStore::migrated(backend).await else {
        return;
    };
    let broker = Broker::start();
    let filters: Vec<String> = (0..3000).map(|i| format!("fleet/{i}/+/state")).collect();
    write_config(
        &store,
        &config_toml(&broker, &client_id("deadline"), &filters, "300ms"),
    );
    seed(&store, "plant").await;
    let (mut serve, address) = serve_with_ttl(&store, "900ms").await;
    wait_full(address).await;
    let history = recorded_history(&store).await.unwrap();
    assert_eq!(history.len(), filters.len());
    assert!(
        history.iter().all(|(_, state)| state == "granted"),
        "{history:?}"
    );
    assert_eq!(serve.terminate().await, Some(0), "{}", serve.transcript());
}

on_both_backends!(a_large_reconcile_converges_under_a_short_store_deadline);
