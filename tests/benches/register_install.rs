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
//! The registers run in rounds of N (`WHARF_BENCH_ROUNDS`, default 3) on one `Wharf`, each
//! round between two runs of the kept-connection insert, and each round's ratio is against the
//! mean of the two inserts around it: this machine's commit rate moves from one second to the
//! next, so a ratio is only taken between runs a few seconds apart. The median round is the
//! figure; the lowest and highest are printed beside it.
//!
//! Run: `cargo bench -p wharf-tests --bench register_install` (set WHARF_BENCH_N to change N,
//! default 3000; `WHARF_BENCH_BACKENDS=postgres` or `sqlite` runs one backend).

use std::time::Instant;

use wharf::domain::DeclarerId;
use wharf::store::Store;
use wharf::{Registration, Wharf};
use wharf_tests::{Backend, TestStore};

const GROUPS: usize = 50;

fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(default)
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
                    // Cached, as a user's loop would keep it (Postgres: sqlx caches it).
                    ctx.tx
                        .prepare_cached("INSERT INTO bench_raw (body) VALUES (?1)")?
                        .execute([format!("row {i}")])?;
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

/// Registers `n` times on `wharf`, continuing the rotation at `first` (so that every register
/// of every round is a swap), and returns registers per second.
async fn installs_per_second(wharf: &Wharf, first: usize, n: usize) -> f64 {
    let sets: [&[&str]; 2] = [&["orders/+/paid", "orders/+/refunded"], &["orders/#"]];
    let start = Instant::now();
    for i in first..first + n {
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

/// The register rounds, each between two kept-connection insert runs.
struct Rounds {
    /// Registers per second, one per round.
    installs: Vec<f64>,
    /// Inserts per second on a kept connection: one more than there are rounds.
    kept: Vec<f64>,
}

impl Rounds {
    async fn run(test: &TestStore, n: usize, rounds: usize) -> Self {
        let wharf = test.wharf();
        let mut kept = vec![kept_connection_inserts_per_second(&test.store, n).await];
        let mut installs = Vec::with_capacity(rounds);
        for round in 0..rounds {
            installs.push(installs_per_second(&wharf, round * n, n).await);
            kept.push(kept_connection_inserts_per_second(&test.store, n).await);
        }
        Rounds { installs, kept }
    }

    /// Each round's registers against the mean of the inserts just before and after it.
    fn ratios(&self) -> Vec<f64> {
        let around = self.kept.windows(2).map(|pair| (pair[0] + pair[1]) / 2.0);
        self.installs
            .iter()
            .zip(around)
            .map(|(installs, kept)| installs / kept)
            .collect()
    }

    fn mean(values: &[f64]) -> f64 {
        values.iter().sum::<f64>() / values.len() as f64
    }
}

/// The median and the extremes of `values` (not empty).
fn median_and_range(values: &[f64]) -> (f64, f64, f64) {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    let median = if sorted.len().is_multiple_of(2) {
        (sorted[middle - 1] + sorted[middle]) / 2.0
    } else {
        sorted[middle]
    };
    (median, sorted[0], sorted[sorted.len() - 1])
}

async fn bench(backend: Backend, n: usize, rounds: usize) {
    let test = TestStore::new(backend).await;
    // Warm up connections and caches on both paths.
    raw_commits_per_second(&test.store, 20).await;
    // The pooled and the old baselines run once before and once after the rounds, and their
    // means are used.
    let before = raw_commits_per_second(&test.store, n).await;
    let one_before = one_statement_inserts_per_second(&test.store, n).await;
    let measured = Rounds::run(&test, n, rounds).await;
    let one_after = one_statement_inserts_per_second(&test.store, n).await;
    let after = raw_commits_per_second(&test.store, n).await;
    let raw = (before + after) / 2.0;
    let one = (one_before + one_after) / 2.0;
    let installs = Rounds::mean(&measured.installs);
    let kept = Rounds::mean(&measured.kept);
    let ratios = measured.ratios();
    let (median, lowest, highest) = median_and_range(&ratios);
    let per_round: Vec<String> = measured
        .installs
        .iter()
        .zip(&ratios)
        .map(|(installs, ratio)| format!("{installs:.0}/s {ratio:.2}"))
        .collect();
    println!(
        "{backend:?}: register install against the one-statement insert on a kept connection, \
         per round: {} | median {median:.2} (lowest {lowest:.2}, highest {highest:.2}; goal >= \
         0.50) [n={n} x {rounds} rounds, {GROUPS} groups]",
        per_round.join(", ")
    );
    println!(
        "{backend:?}: means: register install {installs:>6.0}/s | kept insert {kept:>6.0}/s \
         | the insert through the pool {one:>6.0}/s: ratio {:.2} | old baseline \
         BEGIN/INSERT/COMMIT {raw:>6.0}/s: ratio {:.2}",
        installs / one,
        installs / raw
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let n = env_count("WHARF_BENCH_N", 3_000);
    let rounds = env_count("WHARF_BENCH_ROUNDS", 3);
    let only = std::env::var("WHARF_BENCH_BACKENDS").unwrap_or_default();
    let run = |backend: &str| only.is_empty() || only.contains(backend);
    runtime.block_on(async {
        if run("sqlite") {
            bench(Backend::Sqlite, n, rounds).await;
        }
        if run("postgres") {
            bench(Backend::Postgres, n, rounds).await;
        }
    });
}
