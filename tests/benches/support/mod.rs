//! What the queue benchmarks share: the bench topic and group, message builders, the plain
//! `SKIP LOCKED` queue baseline, and the figures of one timed claim loop. Each bench uses a
//! part of it.
#![allow(dead_code)]

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use wharf::domain::{GroupName, TopicName};
use wharf::store::Store;
use wharf::Registration;
use wharf_queue::{Headers, OutgoingMessage, Queue};
use wharf_tests::TestStore;

pub const TOPIC: &str = "telemetry";
pub const GROUP: &str = "thermostats";
pub const PATTERNS: usize = 100;
/// Alternating rounds of the routed-vs-plain comparison.
pub const ROUNDS: usize = 3;
pub const CONSUMERS: usize = 2;
pub const FETCH_MAX: u32 = 10;
pub const PAYLOAD_BYTES: usize = 64;
pub const PUBLISH_BATCH: usize = 1_000;
pub const BACKLOG_BATCH: usize = 10_000;
/// A timed loop that takes longer than this is a hang, not a figure.
pub const DEADLINE: Duration = Duration::from_secs(240);

pub fn scale() -> f64 {
    std::env::var("WHARF_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .unwrap_or(1.0)
}

pub fn scaled(n: usize) -> usize {
    ((n as f64 * scale()).round() as usize).max(1)
}

pub fn sql_backlog_load() -> bool {
    std::env::var("WHARF_BENCH_BACKLOG_LOAD").is_ok_and(|v| v == "sql")
}

pub fn payload() -> Vec<u8> {
    (0..PAYLOAD_BYTES).map(|i| b'a' + (i % 26) as u8).collect()
}

pub fn headers() -> Headers {
    Headers::from([("source".to_owned(), "bench".to_owned())])
}

pub fn message(subject: &str) -> OutgoingMessage {
    OutgoingMessage::new(subject, payload(), headers()).expect("a valid bench message")
}

pub fn topic() -> TopicName {
    TopicName::parse("topic", TOPIC).expect("topic name")
}

pub fn group() -> GroupName {
    GroupName::parse("group", GROUP).expect("group name")
}

/// Declares the bench group with `sensors/{i}/+` for i in 0..100.
pub async fn declare(test: &TestStore) {
    let patterns: Vec<String> = (0..PATTERNS).map(|i| format!("sensors/{i}/+")).collect();
    let registration = Registration::new(GROUP, TOPIC, "1", &patterns).expect("registration");
    let outcome = test
        .wharf()
        .register(&registration)
        .await
        .expect("declaring the bench group");
    assert!(
        matches!(outcome, wharf::domain::RegisterOutcome::Installed { .. }),
        "the bench group must install: {outcome:?}"
    );
}

/// Publishes `matched` matching and as many non-matching messages, interleaved, in batches.
pub async fn publish_half_matching(queue: &Queue, matched: usize) {
    let topic = topic();
    let mut batch = Vec::with_capacity(PUBLISH_BATCH);
    for i in 0..matched * 2 {
        let prefix = if i % 2 == 0 { "sensors" } else { "metrics" };
        batch.push(message(&format!("{prefix}/{}/temp", (i / 2) % PATTERNS)));
        if batch.len() == PUBLISH_BATCH || i + 1 == matched * 2 {
            queue.publish(&topic, &batch).await.expect("publishing");
            batch.clear();
        }
    }
}

/// What a timed claim loop did.
pub struct ClaimRun {
    pub acked: usize,
    pub elapsed: Duration,
    pub calls: usize,
    pub empty_calls: usize,
}

impl ClaimRun {
    pub fn rate(&self) -> f64 {
        self.acked as f64 / self.elapsed.as_secs_f64()
    }

    pub fn line(&self, label: &str) -> String {
        format!(
            "{label:<44} {:>7} acked in {:>6.2} s = {:>7.0} msg/s  ({} claim calls, {} empty)",
            self.acked,
            self.elapsed.as_secs_f64(),
            self.rate(),
            self.calls,
            self.empty_calls
        )
    }
}

/// Creates and fills `plain_queue` with `n` matching rows.
pub async fn plain_fill(store: &Store, n: usize) {
    let n = i64::try_from(n).expect("count");
    match store {
        Store::Postgres(s) => {
            for statement in [
                "CREATE TABLE IF NOT EXISTS plain_queue (id BIGSERIAL PRIMARY KEY, subject TEXT, \
                   payload BYTEA, visible_at TIMESTAMPTZ, attempts INT)",
                "TRUNCATE plain_queue",
            ] {
                sqlx::query(statement).execute(s.pool()).await.unwrap();
            }
            sqlx::query(
                "INSERT INTO plain_queue (subject, payload, visible_at, attempts) \
                 SELECT 'sensors/' || (g % 100) || '/temp', $1, now(), 0 \
                 FROM generate_series(0, $2 - 1) g",
            )
            .bind(payload())
            .bind(n)
            .execute(s.pool())
            .await
            .unwrap();
            sqlx::query("ANALYZE plain_queue")
                .execute(s.pool())
                .await
                .unwrap();
        }
        Store::Sqlite(s) => {
            s.write(move |ctx| {
                ctx.tx.execute_batch(
                    "CREATE TABLE IF NOT EXISTS plain_queue (id INTEGER PRIMARY KEY, subject TEXT, \
                       payload BLOB, visible_at INTEGER, attempts INTEGER); \
                     DELETE FROM plain_queue;",
                )?;
                let mut insert = ctx.tx.prepare(
                    "INSERT INTO plain_queue (subject, payload, visible_at, attempts) \
                     VALUES (?1, ?2, 0, 0)",
                )?;
                for i in 0..n {
                    insert.execute(rusqlite::params![
                        format!("sensors/{}/temp", i % 100),
                        payload()
                    ])?;
                }
                Ok(())
            })
            .await
            .unwrap();
        }
    }
}

/// Claims up to 10 rows of `plain_queue`; returns their ids.
pub async fn plain_claim(store: &Store) -> Vec<i64> {
    match store {
        Store::Postgres(s) => {
            let rows: Vec<(i64, String, Vec<u8>)> = sqlx::query_as(
                "WITH picked AS (SELECT id FROM plain_queue WHERE visible_at <= now() \
                   ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) \
                 UPDATE plain_queue q SET visible_at = now() + interval '30 seconds', \
                   attempts = q.attempts + 1 \
                 FROM picked WHERE q.id = picked.id RETURNING q.id, q.subject, q.payload",
            )
            .bind(i64::from(FETCH_MAX))
            .fetch_all(s.pool())
            .await
            .unwrap();
            rows.into_iter().map(|(id, _, _)| id).collect()
        }
        Store::Sqlite(s) => s
            .write(|ctx| {
                let now = ctx.now.timestamp_micros();
                let mut claim = ctx.tx.prepare_cached(
                    "UPDATE plain_queue SET visible_at = ?1 + 30000000, attempts = attempts + 1 \
                     WHERE id IN (SELECT id FROM plain_queue WHERE visible_at <= ?1 \
                       ORDER BY id LIMIT ?2) RETURNING id, subject, payload",
                )?;
                let rows = claim
                    .query_map(rusqlite::params![now, FETCH_MAX], |row| {
                        let _: (String, Vec<u8>) = (row.get(1)?, row.get(2)?);
                        row.get::<_, i64>(0)
                    })?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
            .unwrap(),
    }
}

/// Acks one plain row; true when it was there.
pub async fn plain_ack(store: &Store, id: i64) -> bool {
    match store {
        Store::Postgres(s) => {
            sqlx::query("DELETE FROM plain_queue WHERE id = $1")
                .bind(id)
                .execute(s.pool())
                .await
                .unwrap()
                .rows_affected()
                == 1
        }
        Store::Sqlite(s) => s
            .write(move |ctx| {
                let mut delete = ctx
                    .tx
                    .prepare_cached("DELETE FROM plain_queue WHERE id = ?1")?;
                Ok(delete.execute([id])? == 1)
            })
            .await
            .unwrap(),
    }
}

/// Fills `plain_queue` with `n` rows, then two tasks claim 10 and ack each until all are acked.
pub async fn plain_claim_and_ack(store: &Store, n: usize) -> ClaimRun {
    plain_drain(store, n, |store| async move {
        let claimed = plain_claim(&store).await;
        for &id in &claimed {
            assert!(plain_ack(&store, id).await, "plain row {id} acked once");
        }
        claimed
    })
    .await
}

/// The plain queue's one statement on Postgres: claims and deletes up to `$1` rows.
const PLAIN_CLAIM_DELETE: &str = "DELETE FROM plain_queue WHERE id = ANY(ARRAY( \
       SELECT id FROM plain_queue WHERE visible_at <= now() \
       ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)) \
     RETURNING id, subject, payload";

/// Runs [`PLAIN_CLAIM_DELETE`] on `connection`; returns the ids.
async fn plain_claim_delete_on(connection: &mut sqlx::PgConnection) -> Vec<i64> {
    let rows: Vec<(i64, String, Vec<u8>)> = sqlx::query_as(PLAIN_CLAIM_DELETE)
        .bind(i64::from(FETCH_MAX))
        .fetch_all(connection)
        .await
        .unwrap();
    rows.into_iter().map(|(id, _, _)| id).collect()
}

/// Claims and deletes up to 10 rows of `plain_queue` in one statement (no separate ack), on
/// Postgres on a connection from the pool for each statement; returns their ids.
pub async fn plain_claim_delete(store: &Store) -> Vec<i64> {
    match store {
        Store::Postgres(s) => {
            let mut connection = s.pool().acquire().await.unwrap();
            plain_claim_delete_on(&mut connection).await
        }
        Store::Sqlite(s) => s
            .write(|ctx| {
                let now = ctx.now.timestamp_micros();
                let mut claim = ctx.tx.prepare_cached(
                    "DELETE FROM plain_queue WHERE id IN (SELECT id FROM plain_queue \
                       WHERE visible_at <= ?1 ORDER BY id LIMIT ?2) RETURNING id, subject, payload",
                )?;
                let rows = claim
                    .query_map(rusqlite::params![now, FETCH_MAX], |row| {
                        let _: (String, Vec<u8>) = (row.get(1)?, row.get(2)?);
                        row.get::<_, i64>(0)
                    })?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
            .unwrap(),
    }
}

/// Fills `plain_queue` with `n` rows, then two tasks claim-and-delete 10 at a time in one
/// statement until all are gone: the strongest plain baseline (issue 8).
pub async fn plain_claim_delete_all(store: &Store, n: usize) -> ClaimRun {
    plain_drain(
        store,
        n,
        |store| async move { plain_claim_delete(&store).await },
    )
    .await
}

/// Like [`plain_claim_delete_all`], each task on Postgres on one connection it keeps for the
/// whole loop (as `pgbench` runs it): no pool checkout, and no ping on every return to the
/// pool. The strongest plain baseline (ADR 0051). On SQLite the same as the pooled loop (one
/// writer connection either way).
pub async fn plain_claim_delete_all_held(store: &Store, n: usize) -> ClaimRun {
    let Store::Postgres(s) = store else {
        return plain_claim_delete_all(store, n).await;
    };
    plain_fill(store, n).await;
    let done = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..CONSUMERS)
        .map(|_| {
            let (pool, done) = (s.pool().clone(), done.clone());
            tokio::spawn(async move {
                let connection = pool.acquire().await.unwrap();
                let settle = |mut connection: sqlx::pool::PoolConnection<sqlx::Postgres>| async move {
                    let settled = plain_claim_delete_on(&mut connection).await;
                    (connection, settled)
                };
                drain_task(connection, settle, &done, start, n).await
            })
        })
        .collect();
    join_claim_tasks(tasks, start, n).await
}

/// Fills `plain_queue` with `n` rows, then [`CONSUMERS`] tasks call `settle` (which claims a
/// batch, settles it and returns its ids) until all `n` are settled.
async fn plain_drain<F, Fut>(store: &Store, n: usize, settle: F) -> ClaimRun
where
    F: Fn(Store) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Vec<i64>> + Send,
{
    plain_fill(store, n).await;
    let done = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..CONSUMERS)
        .map(|_| {
            let (store, done, settle) = (store.clone(), done.clone(), settle.clone());
            tokio::spawn(async move {
                let settle = move |store: Store| {
                    let settling = settle(store.clone());
                    async move { (store, settling.await) }
                };
                drain_task(store, settle, &done, start, n).await
            })
        })
        .collect();
    join_claim_tasks(tasks, start, n).await
}

/// One task of a timed plain loop: calls `settle` (which claims a batch on `state`, settles it
/// and hands `state` back with the batch's ids) until `n` are settled by all tasks together;
/// returns the ids it settled, its calls and its empty calls.
async fn drain_task<S, F, Fut>(
    mut state: S,
    settle: F,
    done: &AtomicUsize,
    start: Instant,
    n: usize,
) -> (Vec<i64>, usize, usize)
where
    F: Fn(S) -> Fut,
    Fut: std::future::Future<Output = (S, Vec<i64>)>,
{
    let (mut ids, mut calls, mut empty) = (Vec::new(), 0usize, 0usize);
    while done.load(Ordering::SeqCst) < n {
        assert!(start.elapsed() < DEADLINE, "plain queue loop hung");
        let (next, settled) = settle(state).await;
        state = next;
        calls += 1;
        if settled.is_empty() {
            empty += 1;
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        }
        ids.extend_from_slice(&settled);
        done.fetch_add(settled.len(), Ordering::SeqCst);
    }
    (ids, calls, empty)
}

/// Joins the consumer tasks of one timed loop, each returning (the ids or positions it acked,
/// its claim calls, its empty calls), and checks that `expected` distinct ones were acked.
pub async fn join_claim_tasks(
    tasks: Vec<tokio::task::JoinHandle<(Vec<i64>, usize, usize)>>,
    start: Instant,
    expected: usize,
) -> ClaimRun {
    let mut run = ClaimRun {
        acked: 0,
        elapsed: Duration::ZERO,
        calls: 0,
        empty_calls: 0,
    };
    let mut seen = HashSet::new();
    for task in tasks {
        let (acked, calls, empty) = task.await.expect("consumer task");
        run.acked += acked.len();
        run.calls += calls;
        run.empty_calls += empty;
        seen.extend(acked);
    }
    run.elapsed = start.elapsed();
    assert_eq!(run.acked, expected, "every message acked once");
    assert_eq!(seen.len(), expected, "no message acked twice");
    run
}

/// Appends `count` non-matching messages to the topic (on Postgres with
/// `WHARF_BENCH_BACKLOG_LOAD=sql`, one `INSERT ... SELECT` and a head bump).
pub async fn load_backlog(test: &TestStore, queue: &Queue, count: usize) {
    let topic = topic();
    if let (true, Store::Postgres(s)) = (sql_backlog_load(), &test.store) {
        let mut tx = s.pool().begin().await.unwrap();
        let head: i64 = sqlx::query_scalar(
            "INSERT INTO topic (name) VALUES ($1) ON CONFLICT (name) DO UPDATE SET head = topic.head \
             RETURNING head",
        )
        .bind(TOPIC)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO message (topic, position, subject, payload, headers) \
             SELECT $1, $2 + g, 'metrics/' || (g % 100) || '/temp', $3, $4 \
             FROM generate_series(1, $5) g",
        )
        .bind(TOPIC)
        .bind(head)
        .bind(payload())
        .bind(serde_json::to_value(headers()).unwrap())
        .bind(count as i64)
        .execute(&mut *tx)
        .await
        .unwrap();
        sqlx::query("UPDATE topic SET head = head + $2 WHERE name = $1")
            .bind(TOPIC)
            .bind(count as i64)
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        return;
    }
    let mut published = 0;
    while published < count {
        let n = BACKLOG_BATCH.min(count - published);
        let batch: Vec<OutgoingMessage> = (published..published + n)
            .map(|i| message(&format!("metrics/{}/temp", i % PATTERNS)))
            .collect();
        queue
            .publish(&topic, &batch)
            .await
            .expect("publishing backlog");
        published += n;
    }
}
