//! Benchmark: the register install path (locked load, decide, append, inline projection,
//! commit) against the strongest plain baseline, a single-row INSERT as one autocommit
//! statement (on Postgres one round trip, on one connection kept for the whole loop, so that
//! no pool checkout or ping on return is counted: ADR 0051), on the same store with the same
//! durability, in the same run; also against the same insert through the pool (the baseline
//! before ADR 0051) and the old baseline (BEGIN, INSERT, COMMIT through the pool). Prints each
//! rate and the ratios (goal: >= 0.5 against the one-statement insert).
//!
//! Every registration here is a swap (no live declarers, alternating sets), so each one appends
//! an event and rewrites the group's binding rows. Registrations rotate over `GROUPS` groups,
//! so each group's ledger holds about `N / GROUPS` installs, like a fleet of groups changing
//! bindings over many deploys.
//!
//! Run: `cargo bench -p wharf-tests --bench register_install` (set WHARF_BENCH_N to change N,
//! default 3000).

use std::time::Instant;

use wharf::domain::DeclarerId;
use wharf::store::Store;
use wharf::Registration;
use wharf_tests::{Backend, TestStore};

const GROUPS: usize = 50;

fn iterations() -> usize {
    std::env::var("WHARF_BENCH_N")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(3_000)
}

async fn raw_commits_per_second(store: &Store, n: usize) -> f64 {
    match store {
        Store::Sqlite(s) => {
            s.write(|ctx| {
                ctx.tx.execute_batch(
                    "CREATE TABLE IF NOT EXISTS bench_raw (id INTEGER PRIMARY KEY, body TEXT NOT NULL)",
                )?;
                Ok(())
            })
            .await
            .unwrap();
            let start = Instant::now();
            for i in 0..n {
                s.write(move |ctx| {
                    ctx.tx.execute(
                        "INSERT INTO bench_raw (body) VALUES (?1)",
                        [format!("row {i}")],
                    )?;
                    Ok(())
                })
                .await
                .unwrap();
            }
            n as f64 / start.elapsed().as_secs_f64()
        }
        Store::Postgres(s) => {
            sqlx::query("CREATE TABLE IF NOT EXISTS bench_raw (id BIGSERIAL PRIMARY KEY, body TEXT NOT NULL)")
                .execute(s.pool())
                .await
                .unwrap();
            let start = Instant::now();
            for i in 0..n {
                let mut tx = s.pool().begin().await.unwrap();
                sqlx::query("INSERT INTO bench_raw (body) VALUES ($1)")
                    .bind(format!("row {i}"))
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
            }
            n as f64 / start.elapsed().as_secs_f64()
        }
    }
}

/// The strongest plain baseline: one single-row INSERT as one autocommit statement (SQLite:
/// one write transaction of one statement; Postgres: one round trip).
async fn one_statement_inserts_per_second(store: &Store, n: usize) -> f64 {
    match store {
        Store::Sqlite(_) => raw_commits_per_second(store, n).await,
        Store::Postgres(s) => {
            let start = Instant::now();
            for i in 0..n {
                sqlx::query("INSERT INTO bench_raw (body) VALUES ($1)")
                    .bind(format!("row {i}"))
                    .execute(s.pool())
                    .await
                    .unwrap();
            }
            n as f64 / start.elapsed().as_secs_f64()
        }
    }
}

/// The same single-row INSERT on one Postgres connection kept for the whole loop (SQLite: the
/// same as [`one_statement_inserts_per_second`]).
async fn kept_connection_inserts_per_second(store: &Store, n: usize) -> f64 {
    let Store::Postgres(s) = store else {
        return one_statement_inserts_per_second(store, n).await;
    };
    let mut connection = s.pool().acquire().await.unwrap();
    let start = Instant::now();
    for i in 0..n {
        sqlx::query("INSERT INTO bench_raw (body) VALUES ($1)")
            .bind(format!("row {i}"))
            .execute(&mut *connection)
            .await
            .unwrap();
    }
    n as f64 / start.elapsed().as_secs_f64()
}

async fn installs_per_second(test: &TestStore, n: usize) -> f64 {
    let wharf = test.wharf();
    let sets: [&[&str]; 2] = [&["orders/+/paid", "orders/+/refunded"], &["orders/#"]];
    let start = Instant::now();
    for i in 0..n {
        let group = format!("group-{}", i % GROUPS);
        let round = i / GROUPS;
        let declarer = DeclarerId::parse("declarer", &format!("bench-{round}")).unwrap();
        let registration = Registration::new(&group, "orders", "1", sets[round % 2]).unwrap();
        let outcome = wharf
            .as_declarer(declarer)
            .register(&registration)
            .await
            .unwrap();
        assert!(
            matches!(outcome, wharf::domain::RegisterOutcome::Installed { .. }),
            "every benchmark registration must install: {outcome:?}"
        );
    }
    n as f64 / start.elapsed().as_secs_f64()
}

async fn bench(backend: Backend, n: usize) {
    let test = TestStore::new(backend).await;
    // Warm up connections and caches on both paths.
    raw_commits_per_second(&test.store, 20).await;
    // The baselines run before and after, and their means are used: the machine's commit
    // rate drifts over a run, and every path should see the same machine.
    let before = raw_commits_per_second(&test.store, n).await;
    let kept_before = kept_connection_inserts_per_second(&test.store, n).await;
    let one_before = one_statement_inserts_per_second(&test.store, n).await;
    let installs = installs_per_second(&test, n).await;
    let one_after = one_statement_inserts_per_second(&test.store, n).await;
    let kept_after = kept_connection_inserts_per_second(&test.store, n).await;
    let after = raw_commits_per_second(&test.store, n).await;
    let raw = (before + after) / 2.0;
    let one = (one_before + one_after) / 2.0;
    let kept = (kept_before + kept_after) / 2.0;
    println!(
        "{backend:?}: register install {installs:>6.0}/s | one-statement insert on a kept \
         connection {kept:>6.0}/s: ratio {:.2} (goal >= 0.50) | the same through the pool \
         {one:>6.0}/s: ratio {:.2} | old baseline BEGIN/INSERT/COMMIT {raw:>6.0}/s: ratio {:.2} \
         [n={n}, {GROUPS} groups]",
        installs / kept,
        installs / one,
        installs / raw
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let n = iterations();
    runtime.block_on(async {
        bench(Backend::Sqlite, n).await;
        bench(Backend::Postgres, n).await;
    });
}
