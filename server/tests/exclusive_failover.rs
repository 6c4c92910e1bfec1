//! Exclusive MQTT sessions as real processes on one Postgres (cluster mode) and a private
//! Mosquitto: two `wharf serve` contend for one exclusive session and exactly one is active;
//! a holder stopped with SIGSTOP past the TTL is replaced, and once resumed it steps down
//! without releasing what it no longer owns; and SIGKILLs of the holder at random points of
//! its activation (50 of them) never let a write with a stale token land: every managed-filter
//! event names the claim that owned the lease when it was appended, the other process takes
//! over, and the history ends exactly the desired set.

#![allow(clippy::unwrap_used)]

mod support;

/// Every response these tests receive is held to the generated OpenAPI document (ADR 0033).
#[path = "../../api/tests/support/contract.rs"]
#[allow(dead_code)]
mod contract;

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;
use sqlx::Row;
use support::broker::Broker;
use support::{Backend, Server, TestStore};
use tokio::time::Instant;

/// The longest any one wait of these tests may take.
const DEADLINE: Duration = Duration::from_secs(60);

/// The `wharf.toml` of an exclusive session `plant` on `broker` with a short lease.
fn config_toml(broker: &Broker, client_id: &str, filters: &[String], lease: [&str; 3]) -> String {
    let subscriptions: String = filters
        .iter()
        .map(|f| format!("  {{ filter = \"{f}\", qos = 1, topic = \"sensors\" }},\n"))
        .collect();
    let [ttl, interval, deadline] = lease;
    format!(
        "[http]\nlisten = \"127.0.0.1:0\"\n\n\
         [lease]\nttl = \"{ttl}\"\nrenew_interval = \"{interval}\"\nrenew_deadline = \"{deadline}\"\n\n\
         [mqtt]\nunmatched_grace = \"300ms\"\nconnect_timeout = \"5s\"\nsubscribe_timeout = \"10s\"\n\n\
         [mqtt.sessions.plant]\nbrokers = [\"{}\"]\nclient_id = \"{client_id}\"\nmode = \"exclusive\"\n\
         session_expiry = \"10m\"\nsubscriptions = [\n{subscriptions}]\n",
        broker.url()
    )
}

async fn ready(address: SocketAddr) -> bool {
    let Ok(response) = reqwest::get(format!("http://{address}/readyz")).await else {
        return false;
    };
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let Ok(text) = response.text().await else {
        return false;
    };
    contract::assert_conforms("GET", "/readyz", status, &content_type, &text);
    status == 200
}

/// The session's live level as `GET /api/v1/sessions` reports it.
async fn level(address: SocketAddr) -> String {
    let Ok(response) = reqwest::get(format!("http://{address}/api/v1/sessions")).await else {
        return String::new();
    };
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let Ok(text) = response.text().await else {
        return String::new();
    };
    contract::assert_conforms("GET", "/api/v1/sessions", status, &content_type, &text);
    let body: Value = serde_json::from_str(&text).unwrap_or_default();
    body["sessions"][0]["live"]["level"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// At Full (holding the lease: a standby never gets there).
async fn full(address: SocketAddr) -> bool {
    level(address).await == "full" && ready(address).await
}

/// A connection to the test's Postgres schema.
async fn connect(store: &TestStore) -> sqlx::PgConnection {
    let mut conn = support::pg_connect().await.unwrap();
    let schema = store.schema.clone().unwrap();
    sqlx::raw_sql(&format!("SET search_path TO \"{schema}\""))
        .execute(&mut conn)
        .await
        .unwrap();
    conn
}

/// The lease row's (holder, token), if someone holds it.
async fn owner(conn: &mut sqlx::PgConnection) -> Option<(String, i64)> {
    let row = sqlx::query("SELECT holder, token FROM session_lease WHERE holder IS NOT NULL")
        .fetch_optional(&mut *conn)
        .await
        .unwrap()?;
    Some((row.get(0), row.get(1)))
}

/// Whether `holder` (`host:pid:random:sN`) is a holder of process `pid`.
fn holder_of(holder: &str, pid: u32) -> bool {
    holder.contains(&format!(":{pid}:"))
}

/// Polls until `condition` holds, failing past [`DEADLINE`] with `what`.
async fn wait_until<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + DEADLINE;
    while !condition().await {
        assert!(Instant::now() < deadline, "{what}: not within {DEADLINE:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The owner whose holder names a process of `servers`, waited for.
async fn wait_owner(conn: &mut sqlx::PgConnection, servers: &[&Server]) -> (usize, String, i64) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some((holder, token)) = owner(conn).await {
            if let Some(i) = servers
                .iter()
                .position(|s| holder_of(&holder, s.running.pid()))
            {
                return (i, holder, token);
            }
        }
        assert!(
            Instant::now() < deadline,
            "no live owner within {DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every event of the session's two streams, in ledger order: (position, type, event type,
/// payload, metadata).
async fn history(conn: &mut sqlx::PgConnection) -> Vec<(i64, String, String, Value, Value)> {
    sqlx::query(
        "SELECT position, aggregate_type, event_type, payload, metadata FROM events \
         WHERE aggregate_type IN ('managed_session', 'session_lease') ORDER BY position",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap()
    .into_iter()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
    .collect()
}

/// Checks that every managed-filter write made on behalf of a claim names the claim that
/// owned the lease when it was appended (after the seed, every write is an owner's).
fn assert_no_stale_write(events: &[(i64, String, String, Value, Value)]) {
    let mut current: Option<(String, i64)> = None;
    let mut owned_writes = 0;
    for (position, kind, event_type, payload, metadata) in events {
        if kind == "session_lease" {
            match event_type.as_str() {
                "LeaseAcquired" => {
                    current = Some((
                        payload["holder"].as_str().unwrap().to_owned(),
                        payload["token"].as_i64().unwrap(),
                    ))
                }
                "LeaseReleased" | "LeaseExpired" => current = None,
                _ => {}
            }
            continue;
        }
        if event_type == "BaselineSeeded" {
            continue;
        }
        let claim = (
            metadata["lease_holder"].as_str().map(str::to_owned),
            metadata["lease_token"].as_i64(),
        );
        let (Some(holder), Some(token)) = claim else {
            panic!("{event_type} at {position} names no claim: {metadata}");
        };
        assert_eq!(
            current.as_ref(),
            Some(&(holder.clone(), token)),
            "{event_type} at {position} was written by {holder} with token {token} while the \
             lease was {current:?}"
        );
        owned_writes += 1;
    }
    assert!(owned_writes > 0, "the owners wrote the reconciles");
}

fn filters(root: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{root}/{i}/+")).collect()
}

async fn setup(lease: [&str; 3], n: usize) -> (TestStore, Broker, Vec<String>) {
    let store = TestStore::migrated(Backend::Postgres).await.unwrap();
    let broker = Broker::start();
    let root = format!("excl{:08x}", rand::random::<u32>());
    let desired = filters(&root, n);
    let client = format!("wharf-excl-{:08x}", rand::random::<u32>());
    let text = config_toml(&broker, &client, &desired, lease);
    std::fs::write(store.dir.path().join("wharf.toml"), text).unwrap();
    store
        .run(&["--config", "wharf.toml", "sessions", "seed", "plant"])
        .await
        .success();
    (store, broker, desired)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_holder_is_replaced_and_steps_down_when_resumed() {
    let (store, _broker, _) = setup(["3s", "300ms", "1500ms"], 5).await;
    let mut conn = connect(&store).await;
    let a = Server::start(&store, "serve-a").await;
    let b = Server::start(&store, "serve-b").await;
    let (first, holder, token) = wait_owner(&mut conn, &[&a, &b]).await;
    assert_eq!(token, 1);
    let (mut stale, mut other) = if first == 0 { (a, b) } else { (b, a) };
    wait_until("the holder at Full", || full(stale.address)).await;
    assert_ne!(
        level(other.address).await,
        "full",
        "the standby is not active"
    );
    assert!(
        ready(other.address).await,
        "a standby is ready: it is doing its part (a rolling deploy must not stall on it)"
    );

    stale.running.signal("STOP");
    let (now, new_holder, new_token) = wait_owner(&mut conn, &[&other]).await;
    assert_eq!(now, 0);
    assert_eq!(new_token, 2, "the next owner takes the next token");
    assert_ne!(new_holder, holder);
    wait_until("the new holder at Full", || full(other.address)).await;

    stale.running.signal("CONT");
    // Whichever it notices first, the missed renew deadline or the broker's takeover of its
    // connection, the resumed holder's round ends.
    wait_until("the resumed holder's round ending", || {
        let lines = stale.running.out_so_far_err();
        async move {
            lines
                .iter()
                .any(|l| l.contains("stepped down") || l.contains("the exclusive round ended"))
        }
    })
    .await;
    wait_until("the resumed process standing by", || async {
        level(stale.address).await == "starting"
    })
    .await;
    assert_eq!(
        owner(&mut conn).await,
        Some((new_holder.clone(), 2)),
        "the resumed holder released nothing it no longer owns"
    );
    assert!(full(other.address).await, "the new holder stays at Full");
    let events = history(&mut conn).await;
    let released_by_stale = events
        .iter()
        .any(|(_, _, t, p, _)| t == "LeaseReleased" && p["holder"] == holder.as_str());
    assert!(!released_by_stale, "the stale holder's release was refused");
    assert_no_stale_write(&events);
    let audit = store
        .run(&[
            "--config",
            "wharf.toml",
            "audit",
            "sessions",
            "--session",
            "plant",
            "--lease",
            "--json",
        ])
        .await;
    let audit: Value = serde_json::from_str(audit.success()).unwrap();
    let kinds: Vec<&str> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .filter(|e| *e != "LeaseRenewed")
        .collect();
    assert_eq!(
        kinds[..3],
        ["LeaseAcquired", "LeaseExpired", "LeaseAcquired"],
        "the audit shows the takeover: {audit}"
    );
    other.running.terminate().await;
    stale.running.terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkills_during_activation_never_land_a_stale_write() {
    const RUNS: usize = 50;
    let (store, _broker, desired) = setup(["1500ms", "150ms", "900ms"], 40).await;
    let mut conn = connect(&store).await;
    let mut servers = vec![
        Server::start(&store, "serve-0").await,
        Server::start(&store, "serve-1").await,
    ];
    let mut last_token = 0;
    for run in 0..RUNS {
        let refs: Vec<&Server> = servers.iter().collect();
        let (i, _, token) = wait_owner(&mut conn, &refs).await;
        assert!(
            token > last_token,
            "run {run}: tokens grow ({last_token} then {token})"
        );
        last_token = token;
        // A random point of the activation that just began: from at once to past Full.
        let delay = rand::random::<u64>() % 400;
        tokio::time::sleep(Duration::from_millis(delay)).await;
        servers[i].running.kill().await;
        servers[i] = Server::start(&store, &format!("serve-{i}-{run}")).await;
    }
    let refs: Vec<&Server> = servers.iter().collect();
    let (i, _, _) = wait_owner(&mut conn, &refs).await;
    let address = servers[i].address;
    wait_until("the last holder at Full", || full(address)).await;
    let events = history(&mut conn).await;
    assert_no_stale_write(&events);
    let shown = store
        .run(&[
            "--config",
            "wharf.toml",
            "sessions",
            "show",
            "plant",
            "--json",
        ])
        .await;
    let shown: Value = serde_json::from_str(shown.success()).unwrap();
    let mut recorded: Vec<String> = shown["recorded"]["filters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["filter"].as_str().unwrap().to_owned())
        .collect();
    recorded.sort();
    assert!(
        shown["lease"]["holder"].is_string(),
        "show names the holder: {shown}"
    );
    let mut expected = desired.clone();
    expected.sort();
    assert_eq!(recorded, expected, "the history is exactly the desired set");
    for server in &mut servers {
        server.running.terminate().await;
    }
}
