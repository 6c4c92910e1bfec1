//! Benchmark: a register on one group with a long ledger, cold (a `Wharf` that holds nothing
//! of the group yet, as in a fresh process) and warm, at 1k, 10k and 100k events (ADR 0034).
//!
//! Each group's ledger is one install by an incumbent kept live, then waits behind it. The
//! first two events are written by the library; the rest are built with the domain's own
//! `DeclarationEvent::Waiting` and metadata, exactly as an attempt writes them, and inserted
//! with SQL in batches. Their inline projection, the group's `open_wait` rows (ADR 0049), is
//! then filled by the statement the migration backfills it with (`tests/tests/open_waits.rs`
//! shows it leaves the rows the appends leave); the catch-up projection is not on the
//! register path. Two shapes:
//! - `retrying`: ten waiters retry forever, so the folded state stays ten waiters long;
//! - `distinct`: every wait is a new declarer (each restart of a waiting deployment is one), so
//!   the state itself grows with the ledger.
//!
//! Per size, in one run and interleaved (old, new, old, new, ...): cold without a snapshot
//! (the old path: a fold of the whole stream), cold from a snapshot, and warm with saving on
//! (every 1000 events) and off, alternating (so each finds the other's event and reads first),
//! then warm alone (one `Wharf` in a row: ADR 0052's one statement). Each figure is a median.
//! The plain baseline is one single-row autocommit INSERT (one round trip), measured before
//! and after.
//!
//! Run: `cargo bench -p wharf-tests --bench cold_register` (WHARF_BENCH_SIZES=1000,10000 to
//! change the sizes; WHARF_BENCH_SHAPES=retrying to run one shape).

use std::time::{Duration, Instant};

use chrono::{TimeDelta, Utc};
use wharf::domain::{
    AppVersion, Attempt, BindingSet, DeclarationEvent, DeclarerId, GroupName, TopicName,
};
use wharf::store::{NewEvent, SavedGroupState, Store};
use wharf::{Registration, Wharf};
use wharf_tests::{backfill_open_waits, keep_live, Backend, TestStore};

const ROUNDS: usize = 3;
const COLD_PER_ROUND: usize = 4;
const WARM: usize = 40;
const EVERY: u64 = 1000;
const INCUMBENT_SET: &[&str] = &["orders/+/paid"];
const WAITER_SET: &[&str] = &["orders/eu/#", "orders/+/refunded"];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Shape {
    Retrying,
    Distinct,
}

fn sizes() -> Vec<usize> {
    std::env::var("WHARF_BENCH_SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1_000, 10_000, 100_000])
}

fn shapes() -> Vec<Shape> {
    match std::env::var("WHARF_BENCH_SHAPES").ok().as_deref() {
        Some("retrying") => vec![Shape::Retrying],
        Some("distinct") => vec![Shape::Distinct],
        _ => vec![Shape::Retrying, Shape::Distinct],
    }
}

fn wharf_for(test: &TestStore, every: u64) -> Wharf {
    let mut config = test.config();
    config.declarations.snapshot_every = every;
    Wharf::with_store(test.store.clone(), &config.settings())
}

async fn register(wharf: &Wharf, group: &str, declarer: &str, set: &[&str]) {
    let registration = Registration::new(group, "orders", "1", set).unwrap();
    wharf
        .as_declarer(DeclarerId::parse("declarer", declarer).unwrap())
        .register(&registration)
        .await
        .unwrap();
}

fn waiter(shape: Shape, i: usize) -> String {
    match shape {
        Shape::Retrying => format!("waiter-{}", i % 10),
        Shape::Distinct => format!("waiter-{i}"),
    }
}

/// The library writes the install and the first wait; the rest of the ledger is the same wait
/// event rebuilt for each further attempt, inserted with SQL.
async fn long_group(test: &TestStore, group: &str, events: usize, shape: Shape) {
    let wharf = wharf_for(test, 0);
    register(&wharf, group, "incumbent", INCUMBENT_SET).await;
    keep_live(&test.store, group, "incumbent", INCUMBENT_SET).await;
    register(&wharf, group, &waiter(shape, 0), WAITER_SET).await;
    let start = Utc::now();
    let attempt = |i: usize| Attempt {
        group: GroupName::parse("group", group).unwrap(),
        topic: TopicName::parse("topic", "orders").unwrap(),
        declarer: DeclarerId::parse("declarer", &waiter(shape, i)).unwrap(),
        version: AppVersion::parse("version", "1").unwrap(),
        patterns: BindingSet::parse(WAITER_SET).unwrap(),
        declared_at: start,
        attempt_at: start + TimeDelta::milliseconds(i as i64),
    };
    let rows: Vec<(i64, String, String)> = (1..events.saturating_sub(1))
        .map(|i| {
            let event = DeclarationEvent::Waiting {
                attempt: attempt(i),
                incumbent: BindingSet::parse(INCUMBENT_SET).unwrap(),
                live_declarers: vec![DeclarerId::parse("declarer", "incumbent").unwrap()],
            };
            let metadata = serde_json::json!({
                "declarer": waiter(shape, i),
                "wharf_version": env!("CARGO_PKG_VERSION"),
            });
            let new = NewEvent::from_domain(&event, metadata).unwrap();
            (
                i as i64 + 2,
                new.payload.to_string(),
                new.metadata.to_string(),
            )
        })
        .collect();
    for batch in rows.chunks(10_000) {
        insert_waits(&test.store, group, batch.to_vec()).await;
    }
    // The open waits the inserted events imply, by the migration's own backfill statement.
    backfill_open_waits(&test.store).await;
}

async fn insert_waits(store: &Store, group: &str, rows: Vec<(i64, String, String)>) {
    match store {
        Store::Sqlite(s) => {
            let group = group.to_owned();
            s.write(move |ctx| {
                let mut insert = ctx.tx.prepare_cached(
                    "INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, \
                     event_version, payload, metadata, recorded_at) \
                     VALUES ('consumer_group', ?1, ?2, 'DeclarationWaiting', '1.0', ?3, ?4, ?5)",
                )?;
                let now = ctx.now.timestamp_micros();
                for (sequence, payload, metadata) in &rows {
                    insert.execute(rusqlite::params![group, sequence, payload, metadata, now])?;
                }
                Ok(())
            })
            .await
            .unwrap();
        }
        Store::Postgres(s) => {
            let (sequences, rest): (Vec<i64>, Vec<(String, String)>) =
                rows.into_iter().map(|(s, p, m)| (s, (p, m))).unzip();
            let (payloads, metadata): (Vec<String>, Vec<String>) = rest.into_iter().unzip();
            sqlx::query(
                "INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, \
                 event_version, payload, metadata) \
                 SELECT 'consumer_group', $1, s, 'DeclarationWaiting', '1.0', p::json, m::json \
                 FROM unnest($2::bigint[], $3::text[], $4::text[]) AS t(s, p, m) ORDER BY s",
            )
            .bind(group)
            .bind(&sequences)
            .bind(&payloads)
            .bind(&metadata)
            .execute(s.pool())
            .await
            .unwrap();
        }
    }
}

/// One single-row autocommit INSERT (SQLite: one write transaction of one statement;
/// Postgres: one round trip), mean of `n`.
async fn one_statement_insert(store: &Store, n: usize) -> Duration {
    let start = Instant::now();
    for i in 0..n {
        match store {
            Store::Sqlite(s) => s
                .write(move |ctx| {
                    ctx.tx.execute(
                        "INSERT INTO bench_raw (body) VALUES (?1)",
                        [format!("row {i}")],
                    )?;
                    Ok(())
                })
                .await
                .unwrap(),
            Store::Postgres(s) => {
                sqlx::query("INSERT INTO bench_raw (body) VALUES ($1)")
                    .bind(format!("row {i}"))
                    .execute(s.pool())
                    .await
                    .unwrap();
            }
        }
    }
    start.elapsed() / n as u32
}

async fn create_raw(store: &Store) {
    match store {
        Store::Sqlite(s) => s
            .write(|ctx| {
                ctx.tx.execute_batch(
                    "CREATE TABLE IF NOT EXISTS bench_raw (id INTEGER PRIMARY KEY, body TEXT NOT NULL)",
                )?;
                Ok(())
            })
            .await
            .unwrap(),
        Store::Postgres(s) => {
            sqlx::query(
                "CREATE TABLE IF NOT EXISTS bench_raw (id BIGSERIAL PRIMARY KEY, body TEXT NOT NULL)",
            )
            .execute(s.pool())
            .await
            .unwrap();
        }
    }
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[derive(Debug, Default, Clone, Copy)]
struct Figures {
    cold_old: Duration,
    cold_new: Duration,
    warm_on: Duration,
    warm_off: Duration,
    warm_alone: Duration,
    state_bytes: usize,
}

async fn cold(test: &TestStore, group: &str, every: u64, declarer: &str) -> Duration {
    let wharf = wharf_for(test, every);
    let start = Instant::now();
    register(&wharf, group, declarer, WAITER_SET).await;
    start.elapsed()
}

async fn measure(test: &TestStore, group: &str, shape: Shape) -> Figures {
    let declarer = waiter(shape, 1);
    // Prime: a cold attempt with saving on folds everything once and saves the state.
    cold(test, group, EVERY, &declarer).await;
    let good = test
        .store
        .saved_group_state(group)
        .await
        .unwrap()
        .expect("the priming attempt saved the state");
    // A row no build reads: the old path (fold the whole stream), with saving off.
    let unreadable = SavedGroupState {
        group: group.to_owned(),
        sequence: 0,
        format: -1,
        state: String::new(),
        stream_rewritten: false,
    };
    let (mut old, mut new) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        test.store
            .save_group_state(unreadable.clone())
            .await
            .unwrap();
        old.push(cold(test, group, 0, &declarer).await);
        test.store.save_group_state(good.clone()).await.unwrap();
        for _ in 0..COLD_PER_ROUND {
            new.push(cold(test, group, EVERY, &declarer).await);
        }
    }
    let on = wharf_for(test, EVERY);
    let off = wharf_for(test, 0);
    register(&on, group, &declarer, WAITER_SET).await;
    register(&off, group, &declarer, WAITER_SET).await;
    let (mut warm_on, mut warm_off) = (Vec::new(), Vec::new());
    for _ in 0..WARM {
        let start = Instant::now();
        register(&on, group, &declarer, WAITER_SET).await;
        warm_on.push(start.elapsed());
        let start = Instant::now();
        register(&off, group, &declarer, WAITER_SET).await;
        warm_off.push(start.elapsed());
    }
    // The two above alternate, so each finds the other's event and reads first; alone, a
    // process's next register decides on what its last one left it knowing (ADR 0052).
    let mut warm_alone = Vec::new();
    for _ in 0..WARM {
        let start = Instant::now();
        register(&on, group, &declarer, WAITER_SET).await;
        warm_alone.push(start.elapsed());
    }
    Figures {
        cold_old: median(old),
        cold_new: median(new),
        warm_on: median(warm_on),
        warm_off: median(warm_off),
        warm_alone: median(warm_alone),
        state_bytes: good.state.len(),
    }
}

async fn bench(backend: Backend, shape: Shape, sizes: &[usize]) {
    let test = TestStore::new(backend).await;
    create_raw(&test.store).await;
    one_statement_insert(&test.store, 50).await;
    let baseline_before = one_statement_insert(&test.store, 500).await;
    let mut figures = Vec::new();
    for &size in sizes {
        let group = format!("long-{size}");
        let built = Instant::now();
        long_group(&test, &group, size, shape).await;
        let built = built.elapsed();
        let f = measure(&test, &group, shape).await;
        println!(
            "{backend:?} {shape:?} {size:>7} events: cold old {:>8.1} ms | cold new {:>6.2} ms | \
             warm {:>5.2} ms (saving off {:>5.2} ms, alone {:>5.2} ms) | state {:>9} bytes \
             [built in {:.1} s]",
            ms(f.cold_old),
            ms(f.cold_new),
            ms(f.warm_on),
            ms(f.warm_off),
            ms(f.warm_alone),
            f.state_bytes,
            built.as_secs_f64()
        );
        figures.push((size, f));
    }
    let baseline_after = one_statement_insert(&test.store, 500).await;
    let baseline = (baseline_before + baseline_after) / 2;
    let (Some((small, first)), Some((large, last))) = (figures.first(), figures.last()) else {
        return;
    };
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!(
        "{backend:?} {shape:?}: cold {large}/{small}: old {:.1}, new {:.2} (goal <= 5) | \
         warm {large}/{small}: {:.2}, alone {:.2} (flat) | saving on/off at {large}: {:.2} | \
         one-statement insert {:.2} ms: cold new at {large} = {:.1}x, warm at {large} = {:.1}x, \
         alone {:.1}x",
        ratio(last.cold_old, first.cold_old),
        ratio(last.cold_new, first.cold_new),
        ratio(last.warm_on, first.warm_on),
        ratio(last.warm_alone, first.warm_alone),
        ratio(last.warm_on, last.warm_off),
        ms(baseline),
        ratio(last.cold_new, baseline),
        ratio(last.warm_on, baseline),
        ratio(last.warm_alone, baseline),
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let sizes = sizes();
    runtime.block_on(async {
        for shape in shapes() {
            bench(Backend::Sqlite, shape, &sizes).await;
            bench(Backend::Postgres, shape, &sizes).await;
        }
    });
}
