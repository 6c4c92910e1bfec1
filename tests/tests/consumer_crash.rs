//! At-least-once through a crash, with the runtime's batched claims and acks (ADR 0035), on
//! both backends, with real processes.
//!
//! A consumer process with 8 handlers and claim batches of 16 handles a stream of 120 messages
//! (each handler sleeps, then records its message durably and returns; acks ride on the next
//! fetch or go alone). It is killed with `kill -9` mid-stream. Then:
//!
//! - **none acked before its handler returned**: every message whose delivery is gone (acked)
//!   had been recorded by the killed process's handler;
//! - **none lost**: a second process, once the killed one's claims expired, handles exactly the
//!   messages that were not acked (those the killed process handled without its ack committing
//!   included), and the group ends with nothing left to claim and no dead letters.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use tokio::process::Command;
use wharf::store::Store;
use wharf_queue::{Headers, Queue, QueueSettings};
use wharf_tests::fixtures::group;
use wharf_tests::worker::{complete_lines, WorkerProcess};
use wharf_tests::{on_both_backends, wait_until, Backend, TestStore};

const DEADLINE: Duration = Duration::from_secs(60);
const MESSAGES: i64 = 120;

/// Starts a `swap_consumer` process.
async fn start(store: &TestStore, dir: &Path, name: &str) -> WorkerProcess {
    let config = store.config();
    let out = dir.join(format!("{name}.out"));
    let mut url = config.store.url.clone();
    if url.starts_with("postgres") {
        // Named, so the test can tell when the killed process's sessions are gone.
        url = wharf_tests::pg_url_named(&application_name(name));
    }
    let mut command = Command::new(env!("CARGO_BIN_EXE_swap_consumer"));
    command
        .arg(&url)
        .arg(store.schema().unwrap_or("-"))
        .args(["g", "orders", "40"])
        .arg(&out)
        .arg("a/+")
        .env("WHARF_DECLARATIONS__INSTANCE_TTL", "2s")
        .env("WHARF_DECLARATIONS__HEARTBEAT_INTERVAL", "300ms")
        .env("WHARF_DECLARATIONS__RETRY_INTERVAL", "200ms")
        .env("WHARF_QUEUE__CONCURRENCY", "8")
        .env("WHARF_QUEUE__CLAIM_BATCH", "16")
        .env("WHARF_QUEUE__VISIBILITY_TIMEOUT", "2s")
        .env("WHARF_QUEUE__POLL_INTERVAL", "20ms");
    WorkerProcess::spawn(command, out)
}

/// The positions a process's handlers recorded.
fn handled(out: &Path) -> Vec<i64> {
    complete_lines(out)
        .iter()
        .map(|line| line.split(' ').next().unwrap().parse().unwrap())
        .collect()
}

fn application_name(process: &str) -> String {
    format!("wharf_crash_{process}")
}

/// Waits until no session of the named process is left on the server. A statement the
/// process sent before it was killed still runs to its commit (the server notices the closed
/// socket only afterwards): an ack in flight can land after the kill.
async fn sessions_gone(store: &Store, process: &str) {
    let Store::Postgres(s) = store else {
        return; // SQLite: the killed process's transaction either committed or never will.
    };
    let name = application_name(process);
    wait_until("the killed process's sessions end", DEADLINE, || async {
        let left: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
                .bind(&name)
                .fetch_one(s.pool())
                .await
                .unwrap();
        left == 0
    })
    .await;
}

/// The positions of the group's delivery rows still there (not acked).
async fn unacked(store: &Store) -> BTreeSet<i64> {
    let sql = "SELECT position FROM delivery WHERE group_name = 'g' \
               UNION ALL SELECT position FROM set_aside WHERE group_name = 'g'";
    match store {
        Store::Postgres(s) => sqlx::query_scalar::<_, i64>(sql)
            .fetch_all(s.pool())
            .await
            .unwrap()
            .into_iter()
            .collect(),
        Store::Sqlite(s) => s
            .read(move |conn| {
                let mut statement = conn.prepare(sql)?;
                let rows = statement
                    .query_map([], |row| row.get::<_, i64>(0))?
                    .collect::<Result<BTreeSet<_>, _>>()?;
                Ok(rows)
            })
            .await
            .unwrap(),
    }
}

async fn crash_mid_batch(backend: Backend) {
    let store = TestStore::new(backend).await;
    let wharf = store.wharf();
    let queue = Queue::new(store.store.clone(), QueueSettings::default());
    let dir = tempfile::tempdir().unwrap();

    let mut first = start(&store, dir.path(), "first").await;
    first.reached("consuming").await;
    let batch = (1..=MESSAGES)
        .map(|i| {
            let subject = format!("a/{i}");
            (subject.clone(), subject.into_bytes(), Headers::new())
        })
        .collect();
    let published: BTreeSet<i64> = wharf
        .publish("orders", batch)
        .await
        .unwrap()
        .into_iter()
        .collect();
    wait_until("the first process handled a third", DEADLINE, || async {
        handled(first.out()).len() as i64 >= MESSAGES / 3
    })
    .await;
    let first_out = first.out().to_path_buf();
    first.kill().await;
    sessions_gone(&store.store, "first").await;

    // The process and its sessions are gone: nothing acks any more. Routed deliveries still there are unacked;
    // the rest of what was routed was acked, and must have been handled first.
    let by_first: BTreeSet<i64> = handled(&first_out).into_iter().collect();
    let left = unacked(&store.store).await;
    let routed_up_to = queue
        .group_stats(Some(&group("g")))
        .await
        .unwrap()
        .remove(0)
        .routed_position;
    let acked: BTreeSet<i64> = published
        .iter()
        .copied()
        .filter(|p| *p <= routed_up_to && !left.contains(p))
        .collect();
    assert!(!acked.is_empty(), "the first process acked something");
    let early: Vec<&i64> = acked.difference(&by_first).collect();
    assert!(
        early.is_empty(),
        "acked before its handler returned: {early:?} (handled {by_first:?})"
    );

    // A second process gets everything not acked, once the dead process's claims expire.
    let mut second = start(&store, dir.path(), "second").await;
    second.reached("consuming").await;
    let wanted: BTreeSet<i64> = published.difference(&acked).copied().collect();
    let start = std::time::Instant::now();
    loop {
        let got: BTreeSet<i64> = handled(second.out()).into_iter().collect();
        if got.is_superset(&wanted) {
            break;
        }
        if start.elapsed() > DEADLINE {
            let missing: Vec<&i64> = wanted.difference(&got).collect();
            let stats = queue.group_stats(Some(&group("g"))).await.unwrap();
            panic!(
                "timed out: the second process has not handled {missing:?}; still unacked \
                 {:?}; {stats:?}; its states {:?}",
                unacked(&store.store).await,
                second.states()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_until("the group settles", DEADLINE, || async {
        let s = queue
            .group_stats(Some(&group("g")))
            .await
            .unwrap()
            .remove(0);
        s.routed_lag == 0 && s.claimable + s.in_flight + s.backing_off == 0
    })
    .await;
    let by_second: BTreeSet<i64> = handled(second.out()).into_iter().collect();
    second.terminate().await;
    assert_eq!(
        by_second, wanted,
        "exactly what was not acked is handled again: nothing acked comes back, nothing is lost"
    );
    let handled_unacked: Vec<&i64> = by_first.difference(&acked).collect();
    println!(
        "{backend:?}: first handled {}, acked {}, handled but unacked at the kill {}",
        by_first.len(),
        acked.len(),
        handled_unacked.len()
    );
    let stats = queue
        .group_stats(Some(&group("g")))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(stats.dead_letters, 0, "{stats:?}");
    let all: BTreeSet<i64> = by_first.union(&by_second).copied().collect();
    assert_eq!(all, published, "every message handled at least once");
}

on_both_backends!(kill_9_mid_batch, crash_mid_batch);
