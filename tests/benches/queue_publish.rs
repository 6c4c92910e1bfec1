//! Benchmark: batched publish (`Queue::publish`, batches of 100 and of 1000 messages with a
//! 64-byte payload and one header) against a raw multi-row insert of the same rows into an
//! identical plain table, one transaction per batch, on the same store, in the same run.
//!
//! - **Postgres raw:** `BEGIN; INSERT INTO plain_message SELECT $1, * FROM unnest(...); COMMIT`
//!   with client-side positions (no topic row), into `plain_message (LIKE message INCLUDING
//!   ALL)`.
//! - **SQLite raw:** one multi-row `INSERT ... VALUES (...), (...), ...` inside
//!   `SqliteStore::write` (the same single-writer, `BEGIN IMMEDIATE`, fsynced commit path
//!   `Queue::publish` uses), into a table declared like `message`.
//!
//! One publisher, sequential batches (publishers to one topic serialize on its row anyway). The
//! raw path is measured before and after the publish path and the mean is the baseline. Both
//! paths turn the same `OutgoingMessage` batch into rows inside the timed loop. Prints
//! messages/s and publish / raw ratios; only counts are asserted.
//!
//! Run: `cargo bench -p wharf-tests --bench queue_publish`. `WHARF_BENCH_SCALE` (default 1.0)
//! scales the 100k messages each path writes per batch size.

use std::time::Instant;

use wharf::domain::TopicName;
use wharf::store::Store;
use wharf_queue::{Headers, OutgoingMessage, Queue, QueueSettings};
use wharf_tests::{Backend, TestStore};

const TOPIC: &str = "telemetry";
const PAYLOAD_BYTES: usize = 64;
const BATCHES: [usize; 2] = [100, 1_000];

fn scale() -> f64 {
    std::env::var("WHARF_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .unwrap_or(1.0)
}

/// Messages per path and batch size, rounded to whole batches.
fn total(batch: usize) -> usize {
    let n = (100_000.0 * scale()).round() as usize;
    (n / batch).max(1) * batch
}

/// One batch of `size` messages with distinct subjects, a 64-byte payload and one header.
fn batch(size: usize, seed: usize) -> Vec<OutgoingMessage> {
    (0..size)
        .map(|i| {
            let n = seed * size + i;
            let payload: Vec<u8> = (0..PAYLOAD_BYTES)
                .map(|j| b'a' + ((n + j) % 26) as u8)
                .collect();
            let headers = Headers::from([("source".to_owned(), format!("bench-{}", n % 8))]);
            OutgoingMessage::new(&format!("sensors/{}/temp", n % 100), payload, headers)
                .expect("a valid bench message")
        })
        .collect()
}

async fn create_plain_table(store: &Store) {
    match store {
        Store::Postgres(s) => {
            for statement in [
                "DROP TABLE IF EXISTS plain_message",
                "CREATE TABLE plain_message (LIKE message INCLUDING ALL)",
            ] {
                sqlx::query(statement).execute(s.pool()).await.unwrap();
            }
        }
        Store::Sqlite(s) => s
            .write(|ctx| {
                ctx.tx.execute_batch(
                    "DROP TABLE IF EXISTS plain_message; \
                     CREATE TABLE plain_message ( \
                       topic TEXT NOT NULL, position INTEGER NOT NULL, subject TEXT NOT NULL, \
                       payload BLOB NOT NULL, headers TEXT NOT NULL DEFAULT '{}', \
                       published_at INTEGER NOT NULL, PRIMARY KEY (topic, position) \
                     ) WITHOUT ROWID;",
                )?;
                Ok(())
            })
            .await
            .unwrap(),
    }
}

/// Writes `messages` into `plain_message` at positions from `first`, in one transaction.
async fn raw_insert(store: &Store, first: i64, messages: &[OutgoingMessage]) {
    match store {
        Store::Postgres(s) => {
            let positions: Vec<i64> = (first..first + messages.len() as i64).collect();
            let subjects: Vec<&str> = messages.iter().map(|m| m.subject.as_str()).collect();
            let payloads: Vec<&[u8]> = messages.iter().map(|m| m.payload.as_slice()).collect();
            let headers: Vec<serde_json::Value> = messages
                .iter()
                .map(|m| serde_json::to_value(&m.headers).unwrap())
                .collect();
            let mut tx = s.pool().begin().await.unwrap();
            let inserted = sqlx::query(
                "INSERT INTO plain_message (topic, position, subject, payload, headers) \
                 SELECT $1, * FROM unnest($2::bigint[], $3::text[], $4::bytea[], $5::jsonb[])",
            )
            .bind(TOPIC)
            .bind(&positions)
            .bind(&subjects)
            .bind(&payloads)
            .bind(&headers)
            .execute(&mut *tx)
            .await
            .unwrap()
            .rows_affected();
            tx.commit().await.unwrap();
            assert_eq!(inserted as usize, messages.len());
        }
        Store::Sqlite(s) => {
            let rows: Vec<(String, Vec<u8>, String)> = messages
                .iter()
                .map(|m| {
                    (
                        m.subject.as_str().to_owned(),
                        m.payload.clone(),
                        serde_json::to_string(&m.headers).unwrap(),
                    )
                })
                .collect();
            let inserted = s
                .write(move |ctx| {
                    let now = ctx.now.timestamp_micros();
                    let values = vec!["(?, ?, ?, ?, ?, ?)"; rows.len()].join(", ");
                    let mut insert = ctx.tx.prepare_cached(&format!(
                        "INSERT INTO plain_message (topic, position, subject, payload, headers, \
                           published_at) VALUES {values}"
                    ))?;
                    let mut params: Vec<rusqlite::types::Value> =
                        Vec::with_capacity(rows.len() * 6);
                    for (offset, (subject, payload, headers)) in rows.into_iter().enumerate() {
                        params.extend([
                            TOPIC.to_owned().into(),
                            (first + offset as i64).into(),
                            subject.into(),
                            payload.into(),
                            headers.into(),
                            now.into(),
                        ]);
                    }
                    Ok(insert.execute(rusqlite::params_from_iter(params))?)
                })
                .await
                .unwrap();
            assert_eq!(inserted, messages.len());
        }
    }
}

/// Raw inserts of `total` messages in batches of `size`; returns messages/s.
async fn raw_rate(store: &Store, size: usize, total: usize, next: &mut i64) -> f64 {
    let start = Instant::now();
    for seed in 0..total / size {
        let messages = batch(size, seed);
        raw_insert(store, *next, &messages).await;
        *next += size as i64;
    }
    total as f64 / start.elapsed().as_secs_f64()
}

/// `Queue::publish` of `total` messages in batches of `size`; returns messages/s.
async fn publish_rate(queue: &Queue, size: usize, total: usize, head: &mut i64) -> f64 {
    let topic = TopicName::parse("topic", TOPIC).expect("topic name");
    let start = Instant::now();
    for seed in 0..total / size {
        let messages = batch(size, seed);
        let positions = queue.publish(&topic, &messages).await.unwrap();
        let expected: Vec<i64> = (*head + 1..=*head + size as i64).collect();
        assert_eq!(positions, expected, "gapless positions in order");
        *head += size as i64;
    }
    total as f64 / start.elapsed().as_secs_f64()
}

async fn plain_count(store: &Store) -> i64 {
    match store {
        Store::Postgres(s) => sqlx::query_scalar("SELECT COUNT(*) FROM plain_message")
            .fetch_one(s.pool())
            .await
            .unwrap(),
        Store::Sqlite(s) => s
            .read(|conn| {
                Ok(conn.query_row("SELECT COUNT(*) FROM plain_message", [], |row| row.get(0))?)
            })
            .await
            .unwrap(),
    }
}

async fn bench(backend: Backend) {
    let test = TestStore::new(backend).await;
    let queue = Queue::new(test.store.clone(), QueueSettings::default());
    create_plain_table(&test.store).await;
    let (mut next, mut head) = (1i64, 0i64);
    // Warm up connections and statement caches on both paths.
    for size in BATCHES {
        raw_rate(&test.store, size, size, &mut next).await;
        publish_rate(&queue, size, size, &mut head).await;
    }
    println!(
        "{backend:?}: one publisher, sequential batches, {PAYLOAD_BYTES}-byte payload, 1 header"
    );
    for size in BATCHES {
        let total = total(size);
        let raw_before = raw_rate(&test.store, size, total, &mut next).await;
        let publish = publish_rate(&queue, size, total, &mut head).await;
        let raw_after = raw_rate(&test.store, size, total, &mut next).await;
        let raw = (raw_before + raw_after) / 2.0;
        println!(
            "  batch {size:>5}: raw multi-row insert {raw_before:>8.0} / {raw_after:>8.0} msg/s (before/after, mean {raw:>8.0}) | Queue::publish {publish:>8.0} msg/s | ratio {:.2} [{total} msgs per path]",
            publish / raw
        );
    }
    assert_eq!(
        plain_count(&test.store).await,
        next - 1,
        "every raw row written"
    );
    let topics = queue.topic_stats().await.unwrap();
    assert_eq!(
        (topics[0].head, topics[0].size),
        (head, head),
        "every message published"
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    println!("queue_publish: scale {}", scale());
    runtime.block_on(async {
        bench(Backend::Postgres).await;
        bench(Backend::Sqlite).await;
    });
}
