//! Helpers for managed-session tests: a persistent session's config against any broker, waiting
//! on a runtime's status with a deadline, the ledger's stored events, and plain MQTT clients
//! (a publisher, and a client that takes over a session's client id to see what the broker
//! still holds for it), supervision's reconnects, and a handler that always fails.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use wharf::domain::session::MANAGED_SESSION_AGGREGATE;
use wharf::HandlerError;
use wharf::Wharf;
use wharf_mqtt::SessionHandle;
use wharf_mqtt::{ConnectOptions, Deliveries, Delivery, DisconnectReason, QoS, Session};
use wharf_server::config::{SessionConfig, SubscriptionConfig};
use wharf_server::Config;
use wharf_sessions::{
    LogIngest, MqttHandler, MqttMessage, SessionError, SessionLedger, SessionRuntime, SessionStatus,
};

use crate::TestStore;

/// A [`Wharf`]'s MQTT sessions as the `wharf` server starts them
/// ([`wharf_server::supervisor::start_sessions`]): the library knows no MQTT, so the tests
/// reach the sessions of a Wharf through this.
pub trait WharfSessions {
    /// Starts every session `config.mqtt` names, appending to this Wharf's message log.
    fn start_sessions(&self, config: &Config) -> Result<Vec<SessionRuntime>, SessionError>;
    /// Starts every session `config.mqtt` names, delivering to `handler`.
    fn start_sessions_with(
        &self,
        config: &Config,
        handler: Arc<dyn MqttHandler>,
    ) -> Result<Vec<SessionRuntime>, SessionError>;
    /// The managed-filter ledger on this Wharf's store.
    fn session_ledger(&self) -> SessionLedger;
    /// Seeds `session_id`'s baseline with `filters` (as an application's composition root).
    fn seed_session_baseline(
        &self,
        session_id: &str,
        filters: &[&str],
    ) -> impl std::future::Future<Output = Result<(), SessionError>> + Send;
}

impl WharfSessions for Wharf {
    fn start_sessions(&self, config: &Config) -> Result<Vec<SessionRuntime>, SessionError> {
        self.start_sessions_with(config, Arc::new(LogIngest::new(self.queue().clone())))
    }

    fn start_sessions_with(
        &self,
        config: &Config,
        handler: Arc<dyn MqttHandler>,
    ) -> Result<Vec<SessionRuntime>, SessionError> {
        wharf_server::supervisor::start_sessions(self, config, handler)
    }

    fn session_ledger(&self) -> SessionLedger {
        wharf_server::supervisor::session_ledger(self)
    }

    fn seed_session_baseline(
        &self,
        session_id: &str,
        filters: &[&str],
    ) -> impl std::future::Future<Output = Result<(), SessionError>> + Send {
        let ledger = self.session_ledger();
        let session_id = session_id.to_owned();
        let filters: Vec<String> = filters.iter().map(|f| (*f).to_owned()).collect();
        async move {
            let filters: Vec<&str> = filters.iter().map(String::as_str).collect();
            ledger.seed_baseline(&session_id, &filters).await
        }
    }
}

/// How long any single wait of a session test may take (retries back off from 1 s).
pub const SESSION_DEADLINE: Duration = Duration::from_secs(30);

/// The session expiry every test session asks for.
pub const EXPIRY_SECS: u32 = 300;

/// A name no other test, run or process uses (client ids, topic roots).
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}-{}-{}-{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A config on `ts` with one persistent session `plant` on `broker_url`, subscribing
/// `(filter, qos)` pairs into log topic `sensors`, with `grace` as `mqtt.unmatched_grace`.
pub fn session_config(
    ts: &TestStore,
    broker_url: &str,
    client_id: &str,
    subscriptions: &[(&str, u8)],
    grace: Duration,
) -> Config {
    let mut config = ts.config();
    config.mqtt.unmatched_grace = grace;
    config.mqtt.connect_timeout = Duration::from_secs(5);
    config.mqtt.subscribe_timeout = Duration::from_secs(5);
    let session = SessionConfig {
        session_expiry: Some(Duration::from_secs(u64::from(EXPIRY_SECS))),
        subscriptions: subscriptions
            .iter()
            .map(|(filter, qos)| SubscriptionConfig {
                filter: (*filter).to_owned(),
                qos: *qos,
                topic: "sensors".to_owned(),
            })
            .collect(),
        ..SessionConfig::new(broker_url, client_id)
    };
    config.mqtt.sessions.insert("plant".to_owned(), session);
    config
}

/// The durable identity of the config's only session.
pub fn session_id(config: &Config) -> String {
    config.mqtt.resolve().expect("valid sessions")[0]
        .identity
        .id()
        .to_owned()
}

/// The first status satisfying `condition`, failing the test past [`SESSION_DEADLINE`].
pub async fn wait_status(
    runtime: &SessionRuntime,
    what: &str,
    condition: impl Fn(&SessionStatus) -> bool,
) -> SessionStatus {
    let mut watch = runtime.watch();
    let found = tokio::time::timeout(SESSION_DEADLINE, async {
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

/// The session's stored ledger events: `(event_type, payload)`, in order.
pub async fn ledger_events(ts: &TestStore, session_id: &str) -> Vec<(String, serde_json::Value)> {
    ts.store
        .load(MANAGED_SESSION_AGGREGATE, session_id)
        .await
        .expect("the ledger's events")
        .into_iter()
        .map(|e| (e.event_type, e.payload.to_value()))
        .collect()
}

/// Options for a plain client on the loopback broker at `port`.
pub fn plain_options(port: u16, client_id: &str) -> ConnectOptions {
    let mut options = ConnectOptions::new("127.0.0.1", port, client_id);
    options.connect_timeout = SESSION_DEADLINE;
    options.operation_timeout = SESSION_DEADLINE;
    options
}

/// A plain client resuming (or creating) the persistent session `client_id`, as Wharf's
/// session would: clean start off, the same expiry. It acks nothing unless told to.
pub async fn resume_session(port: u16, client_id: &str) -> (SessionHandle, Deliveries) {
    let mut options = plain_options(port, client_id);
    options.clean_start = false;
    options.session_expiry = EXPIRY_SECS;
    Session::connect(options)
        .await
        .expect("a plain client resumes the session")
}

/// Publishes one QoS 1 message from a fresh client.
pub async fn publish(port: u16, topic: &str, payload: &str) {
    let (handle, _deliveries) = Session::connect(plain_options(port, &unique("pub")))
        .await
        .expect("the publisher connects");
    handle
        .publish(topic, payload.as_bytes().to_vec(), QoS::AtLeastOnce, false)
        .await
        .expect("publish QoS 1");
    let _ = handle.disconnect(DisconnectReason::Normal).await;
}

/// The next delivery, failing the test past [`SESSION_DEADLINE`].
pub async fn next_delivery(deliveries: &mut Deliveries) -> Delivery {
    match tokio::time::timeout(SESSION_DEADLINE, deliveries.next()).await {
        Ok(Ok(delivery)) => delivery,
        Ok(Err(cause)) => panic!("the deliveries ended: {cause}"),
        Err(_) => panic!("no delivery within {SESSION_DEADLINE:?}"),
    }
}

/// Publishes `count` QoS 1 messages (`m0`, `m1`, ...) to `topic` over one connection
/// (`mosquitto_pub -l`), returning once the broker acknowledged them all.
pub fn publish_many(port: u16, topic: &str, count: usize) {
    use std::io::Write;
    let lines: String = (0..count).map(|i| format!("m{i}\n")).collect();
    let mut child = std::process::Command::new("mosquitto_pub")
        .args(["-V", "5", "-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-q", "1", "-l", "-t", topic])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("run mosquitto_pub");
    let mut stdin = child.stdin.take().expect("mosquitto_pub's stdin");
    stdin
        .write_all(lines.as_bytes())
        .expect("feed mosquitto_pub");
    drop(stdin);
    let status = child.wait().expect("wait for mosquitto_pub");
    assert!(status.success(), "mosquitto_pub failed: {status}");
}

/// Blocking broker control (stop, start) off the async workers.
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// Shuts every runtime down, in order.
pub async fn shutdown(runtimes: Vec<SessionRuntime>) {
    for runtime in runtimes {
        runtime.shutdown().await;
    }
}

/// Waits for `count` connection generations after `last`, returning when each was
/// first seen: supervision reconnects after each failed run with a growing wait.
pub async fn next_generations(
    runtime: &SessionRuntime,
    mut last: Option<u64>,
    count: usize,
) -> Vec<Instant> {
    let mut seen = Vec::new();
    for _ in 0..count {
        let status = wait_status(runtime, "a new connection generation", |s| {
            s.generation.is_some() && s.generation != last
        })
        .await;
        seen.push(Instant::now());
        last = status.generation;
    }
    seen
}

/// Fails every batch, counting the messages it was offered.
#[derive(Default)]
pub struct Refusing {
    /// How many messages it was offered.
    pub offered: AtomicU32,
}

#[async_trait]
impl MqttHandler for Refusing {
    async fn handle(&self, batch: &[MqttMessage]) -> Result<(), HandlerError> {
        self.offered.fetch_add(batch.len() as u32, Ordering::SeqCst);
        Err(HandlerError::new("refusing on purpose"))
    }
}
