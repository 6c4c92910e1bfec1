//! Benchmark: failover of an exclusive MQTT session (issue 10). Two `wharf serve` processes on
//! one Postgres and a private Mosquitto configure one exclusive session; each round SIGKILLs the
//! holder once it is at Full and times how long the other takes to be at Full (`/readyz` 200),
//! and separately how long its reconcile took once it had acquired (lease row to `/readyz`).
//! Prints each round and the figures as multiples of the lease TTL (goal: failover at most
//! 1.5 x TTL + one reconcile). The killed process is restarted as the next round's standby.
//!
//! Run: `cargo bench -p wharf-server --bench failover` (WHARF_BENCH_ROUNDS, default 5;
//! WHARF_BENCH_TTL_MS, default 3000, with the renew interval and deadline at 2/15 and 2/3 of it,
//! as the 45 s defaults have them; WHARF_BENCH_N filters, default 100).

#![allow(clippy::unwrap_used)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::time::Duration;

use sqlx::Row;
use support::broker::Broker;
use support::{Backend, Server, TestStore};
use tokio::time::Instant;

const DEADLINE: Duration = Duration::from_secs(120);

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// At Full: the session's live level in `GET /api/v1/sessions` (a standby is ready but never
/// at Full).
async fn at_full(address: SocketAddr) -> bool {
    let Ok(response) = reqwest::get(format!("http://{address}/api/v1/sessions")).await else {
        return false;
    };
    let body: serde_json::Value = response.json().await.unwrap_or_default();
    body["sessions"][0]["live"]["level"] == "full"
}

/// The lease row's (holder, token) when someone holds it.
async fn owner(conn: &mut sqlx::PgConnection) -> Option<(String, i64)> {
    sqlx::query("SELECT holder, token FROM session_lease WHERE holder IS NOT NULL")
        .fetch_optional(&mut *conn)
        .await
        .unwrap()
        .map(|r| (r.get(0), r.get(1)))
}

fn config(broker: &Broker, ttl_ms: u64, filters: u64) -> String {
    let subscriptions: String = (0..filters)
        .map(|i| format!("  {{ filter = \"failover/{i}/+\", qos = 1, topic = \"sensors\" }},\n"))
        .collect();
    format!(
        "[http]\nlisten = \"127.0.0.1:0\"\n\n\
         [lease]\nttl = \"{ttl_ms}ms\"\nrenew_interval = \"{}ms\"\nrenew_deadline = \"{}ms\"\n\n\
         [mqtt]\nconnect_timeout = \"5s\"\nsubscribe_timeout = \"10s\"\n\n\
         [mqtt.sessions.plant]\nbrokers = [\"{}\"]\nclient_id = \"wharf-failover-{:08x}\"\n\
         mode = \"exclusive\"\nsession_expiry = \"10m\"\nsubscriptions = [\n{subscriptions}]\n",
        ttl_ms * 2 / 15,
        ttl_ms * 2 / 3,
        broker.url(),
        rand::random::<u32>()
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rounds = env_or("WHARF_BENCH_ROUNDS", 5) as usize;
    let ttl_ms = env_or("WHARF_BENCH_TTL_MS", 3000);
    let filters = env_or("WHARF_BENCH_N", 100);
    let store = TestStore::migrated(Backend::Postgres).await.unwrap();
    let broker = Broker::start();
    std::fs::write(
        store.dir.path().join("wharf.toml"),
        config(&broker, ttl_ms, filters),
    )
    .unwrap();
    store
        .run(&["--config", "wharf.toml", "sessions", "seed", "plant"])
        .await
        .success();
    let mut conn = support::pg_connect().await.unwrap();
    let schema = store.schema.clone().unwrap();
    sqlx::raw_sql(&format!("SET search_path TO \"{schema}\""))
        .execute(&mut conn)
        .await
        .unwrap();

    let mut servers = vec![
        Server::start(&store, "a").await,
        Server::start(&store, "b").await,
    ];
    let ttl = Duration::from_millis(ttl_ms);
    let (mut failovers, mut reconciles) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        // The holder, once it is at Full.
        let deadline = Instant::now() + DEADLINE;
        let (i, token) = loop {
            if let Some((name, token)) = owner(&mut conn).await {
                let holder = servers
                    .iter()
                    .position(|s| name.contains(&format!(":{}:", s.running.pid())));
                if let Some(i) = holder {
                    if at_full(servers[i].address).await {
                        break (i, token);
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "no holder at Full within {DEADLINE:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let other = 1 - i;
        let killed_at = Instant::now();
        servers[i].running.kill().await;
        let mut acquired_at = None;
        let deadline = Instant::now() + DEADLINE;
        let full_at = loop {
            if acquired_at.is_none() {
                if let Some((_, t)) = owner(&mut conn).await {
                    if t > token {
                        acquired_at = Some(Instant::now());
                    }
                }
            }
            if at_full(servers[other].address).await {
                break Instant::now();
            }
            assert!(Instant::now() < deadline, "no takeover within {DEADLINE:?}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        let failover = full_at - killed_at;
        let reconcile = full_at - acquired_at.unwrap_or(full_at);
        println!(
            "round {round}: failover {:>6} ms ({:.2} x TTL), of which reconcile after acquire {:>5} ms",
            failover.as_millis(),
            failover.as_secs_f64() / ttl.as_secs_f64(),
            reconcile.as_millis()
        );
        failovers.push(failover);
        reconciles.push(reconcile);
        servers[i] = Server::start(&store, &format!("restart-{round}")).await;
    }
    failovers.sort();
    reconciles.sort();
    let median = |v: &[Duration]| v[v.len() / 2];
    let (failover, reconcile) = (median(&failovers), median(&reconciles));
    let goal = ttl.mul_f64(1.5) + reconcile;
    println!(
        "exclusive failover (Postgres, TTL {ttl_ms} ms, {filters} filters, {rounds} rounds): median {} ms = {:.2} x TTL; \
         median reconcile {} ms; goal <= 1.5 x TTL + one reconcile = {} ms: {}",
        failover.as_millis(),
        failover.as_secs_f64() / ttl.as_secs_f64(),
        reconcile.as_millis(),
        goal.as_millis(),
        if failover <= goal { "met" } else { "NOT met" }
    );
    for server in &mut servers {
        server.running.terminate().await;
    }
}
