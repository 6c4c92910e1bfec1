//! Benchmark: claim-and-ack throughput of the routed path (per-group routing through a declared
//! binding set, then a `SKIP LOCKED` claim over the group's deliveries) against a plain
//! `SKIP LOCKED` queue table with no routing at all, on the same Postgres, in the same run.
//!
//! - **Routed.** One group declares 100 patterns (`sensors/{i}/+`). The topic carries a stream
//!   where every other subject matches (`sensors/{i}/temp`) and the rest do not
//!   (`metrics/{i}/temp`). Two consumer tasks loop `fetch(group, instance, 10)` and ack each
//!   message. The clock covers routing, claiming and acking; publishing happens before it.
//! - **Plain.** `plain_queue` holds the same number of (matching-only) rows; two tasks claim 10
//!   with one `WITH picked AS (... FOR UPDATE SKIP LOCKED) UPDATE ... RETURNING` statement and
//!   ack each row with a `DELETE` by id. It is measured before and after the routed run and the
//!   mean is the baseline (this machine has 2 cores and drifts).
//! - **Flatness.** The routed run again, in a fresh schema, after an unmatched backlog of 10k and
//!   of 1M messages was published into the group's routing range. Routing past the backlog is
//!   timed on its own (a one-off skip rate in rows/s); then a fresh half-matching batch is timed
//!   like the routed run above. Goal: the two claim rates within 20% (ratio 0.80..1.25).
//! - **SQLite.** The routed run and the plain queue (through the same `SqliteStore::write`
//!   path), at a quarter of the message count: every SQLite commit is fsynced.
//!
//! Figures are ratios against baselines measured in the same run; only counts are asserted.
//!
//! Run: `cargo bench -p wharf-tests --bench queue_claim`. `WHARF_BENCH_SCALE` (default 1.0)
//! scales every message count (20k matched messages per timed batch; backlogs 10k and 1M).
//! `WHARF_BENCH_BACKLOG_LOAD=sql` loads the backlogs with one `INSERT ... SELECT
//! generate_series` plus a `topic.head` bump instead of `Queue::publish` in batches of 10k.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use wharf::domain::{GroupName, TopicName};
use wharf::store::Store;
use wharf::Registration;
use wharf_queue::{AckOutcome, Headers, OutgoingMessage, Queue, QueueSettings};
use wharf_tests::{Backend, TestStore};

const TOPIC: &str = "telemetry";
const GROUP: &str = "thermostats";
const PATTERNS: usize = 100;
/// Alternating rounds of the routed-vs-plain comparison.
const ROUNDS: usize = 3;
const CONSUMERS: usize = 2;
const FETCH_MAX: u32 = 10;
const PAYLOAD_BYTES: usize = 64;
const PUBLISH_BATCH: usize = 1_000;
const BACKLOG_BATCH: usize = 10_000;
/// A timed loop that takes longer than this is a hang, not a figure.
const DEADLINE: Duration = Duration::from_secs(240);

fn scale() -> f64 {
    std::env::var("WHARF_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .unwrap_or(1.0)
}

fn scaled(n: usize) -> usize {
    ((n as f64 * scale()).round() as usize).max(1)
}

fn sql_backlog_load() -> bool {
    std::env::var("WHARF_BENCH_BACKLOG_LOAD").is_ok_and(|v| v == "sql")
}

fn payload() -> Vec<u8> {
    (0..PAYLOAD_BYTES).map(|i| b'a' + (i % 26) as u8).collect()
}

fn headers() -> Headers {
    Headers::from([("source".to_owned(), "bench".to_owned())])
}

fn message(subject: &str) -> OutgoingMessage {
    OutgoingMessage::new(subject, payload(), headers()).expect("a valid bench message")
}

fn topic() -> TopicName {
    TopicName::parse("topic", TOPIC).expect("topic name")
}

fn group() -> GroupName {
    GroupName::parse("group", GROUP).expect("group name")
}

/// Declares the bench group with `sensors/{i}/+` for i in 0..100.
async fn declare(test: &TestStore) {
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
async fn publish_half_matching(queue: &Queue, matched: usize) {
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
struct ClaimRun {
    acked: usize,
    elapsed: Duration,
    calls: usize,
    empty_calls: usize,
}

impl ClaimRun {
    fn rate(&self) -> f64 {
        self.acked as f64 / self.elapsed.as_secs_f64()
    }

    fn line(&self, label: &str) -> String {
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

/// Two consumer tasks `fetch` 10 and ack each until `expected` messages are acked.
async fn routed_claim_and_ack(queue: &Queue, expected: usize) -> ClaimRun {
    let acked = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..CONSUMERS)
        .map(|k| {
            let (queue, acked) = (queue.clone(), acked.clone());
            tokio::spawn(async move {
                let (group, instance) = (group(), format!("bench-{k}"));
                let (mut positions, mut calls, mut empty) = (Vec::new(), 0usize, 0usize);
                while acked.load(Ordering::SeqCst) < expected {
                    assert!(start.elapsed() < DEADLINE, "routed claim loop hung");
                    let claimed = queue.fetch(&group, &instance, FETCH_MAX).await.unwrap();
                    calls += 1;
                    if claimed.is_empty() {
                        empty += 1;
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        continue;
                    }
                    for message in &claimed {
                        assert!(message.subject.starts_with("sensors/"), "{message:?}");
                        assert_eq!(queue.ack(message).await.unwrap(), AckOutcome::Acked);
                        positions.push(message.position);
                    }
                    acked.fetch_add(claimed.len(), Ordering::SeqCst);
                }
                (positions, calls, empty)
            })
        })
        .collect();
    let mut run = ClaimRun {
        acked: 0,
        elapsed: Duration::ZERO,
        calls: 0,
        empty_calls: 0,
    };
    let mut seen = HashSet::new();
    for task in tasks {
        let (positions, calls, empty) = task.await.expect("consumer task");
        run.acked += positions.len();
        run.calls += calls;
        run.empty_calls += empty;
        seen.extend(positions);
    }
    run.elapsed = start.elapsed();
    assert_eq!(run.acked, expected, "every matching message acked once");
    assert_eq!(seen.len(), expected, "no message acked twice");
    let stats = queue.group_stats(Some(&group())).await.unwrap();
    assert_eq!(stats[0].routed_lag, 0, "routed up to the head: {stats:?}");
    assert_eq!(stats[0].claimable + stats[0].in_flight, 0, "{stats:?}");
    run
}

/// Creates and fills `plain_queue` with `n` matching rows.
async fn plain_fill(store: &Store, n: usize) {
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
async fn plain_claim(store: &Store) -> Vec<i64> {
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
async fn plain_ack(store: &Store, id: i64) -> bool {
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
async fn plain_claim_and_ack(store: &Store, n: usize) -> ClaimRun {
    plain_fill(store, n).await;
    let acked = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..CONSUMERS)
        .map(|_| {
            let (store, acked) = (store.clone(), acked.clone());
            tokio::spawn(async move {
                let (mut ids, mut calls, mut empty) = (Vec::new(), 0usize, 0usize);
                while acked.load(Ordering::SeqCst) < n {
                    assert!(start.elapsed() < DEADLINE, "plain claim loop hung");
                    let claimed = plain_claim(&store).await;
                    calls += 1;
                    if claimed.is_empty() {
                        empty += 1;
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        continue;
                    }
                    for &id in &claimed {
                        assert!(plain_ack(&store, id).await, "plain row {id} acked once");
                    }
                    ids.extend_from_slice(&claimed);
                    acked.fetch_add(claimed.len(), Ordering::SeqCst);
                }
                (ids, calls, empty)
            })
        })
        .collect();
    let mut run = ClaimRun {
        acked: 0,
        elapsed: Duration::ZERO,
        calls: 0,
        empty_calls: 0,
    };
    let mut seen = HashSet::new();
    for task in tasks {
        let (ids, calls, empty) = task.await.expect("plain consumer task");
        run.acked += ids.len();
        run.calls += calls;
        run.empty_calls += empty;
        seen.extend(ids);
    }
    run.elapsed = start.elapsed();
    assert_eq!(run.acked, n, "every plain row acked once");
    assert_eq!(seen.len(), n, "no plain row acked twice");
    run
}

/// Routed vs plain on one backend, in one store.
async fn routed_vs_plain(backend: Backend, matched: usize) {
    let test = TestStore::new(backend).await;
    declare(&test).await;
    let queue = Queue::new(test.store.clone(), QueueSettings::default());
    // Warm up both paths (connections, statement caches, the matcher cache).
    plain_claim_and_ack(&test.store, 50).await;
    publish_half_matching(&queue, 50).await;
    routed_claim_and_ack(&queue, 50).await;

    // Alternate the two paths over several rounds (plain first and last) and compare means:
    // one routed run between two plain ones was at the mercy of whatever the machine did then.
    let mut plain = Vec::new();
    let mut routed = Vec::new();
    for _ in 0..ROUNDS {
        plain.push(plain_claim_and_ack(&test.store, matched).await);
        publish_half_matching(&queue, matched).await;
        routed.push(routed_claim_and_ack(&queue, matched).await);
    }
    plain.push(plain_claim_and_ack(&test.store, matched).await);
    println!(
        "{backend:?}: claim 10 + ack each, {CONSUMERS} consumer tasks, {ROUNDS} alternating rounds"
    );
    for (round, run) in plain.iter().enumerate() {
        println!(
            "  {}",
            run.line(&format!("plain SKIP LOCKED queue (run {})", round + 1))
        );
        if let Some(run) = routed.get(round) {
            println!(
                "  {}",
                run.line(&format!(
                    "routed ({PATTERNS} patterns, 50% of {} match) (run {})",
                    matched * 2,
                    round + 1
                ))
            );
        }
    }
    let mean = |runs: &[ClaimRun]| runs.iter().map(ClaimRun::rate).sum::<f64>() / runs.len() as f64;
    let (baseline, routed_rate) = (mean(&plain), mean(&routed));
    println!(
        "  ratio routed / plain (means: {routed_rate:.0} / {baseline:.0} msg/s): {:.2} (goal >= 0.80)",
        routed_rate / baseline
    );
}

/// Appends `count` non-matching messages to the topic.
async fn load_backlog(test: &TestStore, queue: &Queue, count: usize) {
    let topic = topic();
    if sql_backlog_load() {
        let Store::Postgres(s) = &test.store else {
            unreachable!("the flatness runs are on Postgres")
        };
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

/// What one flatness scenario measured.
struct Flatness {
    backlog: usize,
    load: Duration,
    skip: Duration,
    claim: ClaimRun,
}

/// A fresh schema: declare, publish an unmatched backlog, route past it (timed), then time the
/// routed claim loop over a fresh half-matching batch.
async fn flatness(backlog: usize, matched: usize) -> Flatness {
    let test = TestStore::new(Backend::Postgres).await;
    declare(&test).await;
    let queue = Queue::new(test.store.clone(), QueueSettings::default());
    let group = group();
    publish_half_matching(&queue, 50).await;
    routed_claim_and_ack(&queue, 50).await;

    let start = Instant::now();
    load_backlog(&test, &queue, backlog).await;
    let load = start.elapsed();
    let lag = queue.group_stats(Some(&group)).await.unwrap()[0].routed_lag;
    assert_eq!(
        lag, backlog as i64,
        "the backlog is in the group's routing range"
    );

    // Skip by routing alone: one caller, as routing is serialized per group anyway.
    let start = Instant::now();
    let (mut scanned, mut routed) = (0u64, 0u64);
    loop {
        assert!(start.elapsed() < DEADLINE, "routing past the backlog hung");
        let report = queue.route(&group).await.unwrap();
        scanned += report.scanned;
        routed += report.routed;
        if report.scanned == 0 {
            break;
        }
    }
    let skip = start.elapsed();
    assert_eq!(
        (scanned, routed),
        (backlog as u64, 0),
        "all backlog scanned, none routed"
    );

    // Keep the bulk load's after-effects (autovacuum of the fresh rows, a checkpoint) out of
    // the timed window; done identically for every backlog size.
    let Store::Postgres(s) = &test.store else {
        unreachable!("the flatness runs are on Postgres")
    };
    for statement in ["VACUUM (ANALYZE) message", "CHECKPOINT"] {
        sqlx::query(statement).execute(s.pool()).await.unwrap();
    }

    publish_half_matching(&queue, matched).await;
    let claim = routed_claim_and_ack(&queue, matched).await;
    Flatness {
        backlog,
        load,
        skip,
        claim,
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let matched = scaled(20_000);
    let backlogs = [scaled(10_000), scaled(1_000_000)];
    println!(
        "queue_claim: scale {} -> {matched} matched messages per timed batch (+ as many unmatched)",
        scale()
    );
    runtime.block_on(async {
        routed_vs_plain(Backend::Postgres, matched).await;

        let load_method = if sql_backlog_load() {
            "one INSERT ... SELECT generate_series + topic.head bump"
        } else {
            "Queue::publish in batches of 10k"
        };
        println!("Postgres flatness: unmatched backlog loaded by {load_method}, routed past by route() (1 caller), then VACUUM (ANALYZE) message + CHECKPOINT, then a fresh batch claimed by {CONSUMERS} consumers");
        let mut runs = Vec::new();
        for backlog in backlogs {
            let run = flatness(backlog, matched).await;
            println!(
                "  backlog {:>8}: load {:>6.1} s ({:>7.0} msg/s) | skip {:>6.2} s = {:>8.0} rows/s | {}",
                run.backlog,
                run.load.as_secs_f64(),
                run.backlog as f64 / run.load.as_secs_f64(),
                run.skip.as_secs_f64(),
                run.backlog as f64 / run.skip.as_secs_f64(),
                run.claim.line("fresh batch")
            );
            runs.push(run);
        }
        println!(
            "  ratio claim rate {} / {} backlog: {:.2} (goal 0.80..1.25)",
            runs[1].backlog,
            runs[0].backlog,
            runs[1].claim.rate() / runs[0].claim.rate()
        );

        routed_vs_plain(Backend::Sqlite, (matched / 4).max(1)).await;
    });
}
