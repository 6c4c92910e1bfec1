//! Benchmark: what the HA lease costs a write (issue 10). On each backend, in one run and in
//! alternating rounds: the plain baseline (one single-row INSERT, autocommit: one statement,
//! one round trip), an unfenced Remember of one filter (the persistent session's write), the
//! same Remember fenced by an exclusive owner's claim (holder, token and expiry checked in the
//! lock statement), and a lease renew. Prints each rate and the ratios (goal: fenced write at
//! least 0.8 of unfenced).
//!
//! Writes rotate over `SESSIONS` sessions per path (two disjoint sets, so the fenced and the
//! unfenced Remember write streams of the same lengths), so each stream stays short (a
//! Remember loads its session's stream; the lease decides from its row and does not).
//!
//! Run: `cargo bench -p wharf-tests --bench lease_fence` (WHARF_BENCH_N, default 2000 writes per
//! path, split over `ROUNDS` rounds).

use std::time::{Duration, Instant};

use wharf::domain::lease::{FencingToken, LeaseHolder};
use wharf::domain::session::{ExactFilter, Qos};
use wharf::store::{LeaseClaim, Store};
use wharf_sessions::{LeaseLedger, RenewVerdict, SessionLedger};
use wharf_tests::{Backend, TestStore};

const SESSIONS: usize = 50;
const ROUNDS: usize = 4;

fn iterations() -> usize {
    std::env::var("WHARF_BENCH_N")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2_000)
}

/// The `i`th write's session among the unfenced (`set` 0) or the fenced (`set` 1) ones: two
/// disjoint sets, so both paths write streams of the same lengths.
fn session(set: usize, i: usize) -> String {
    format!("ms-{:032x}", set * SESSIONS + i % SESSIONS)
}

async fn plain_inserts(store: &Store, n: usize, offset: usize) -> Duration {
    let start = Instant::now();
    for i in offset..offset + n {
        match store {
            Store::Sqlite(s) => {
                s.write(move |ctx| {
                    ctx.tx.execute(
                        "INSERT INTO bench_plain (body) VALUES (?1)",
                        [format!("row {i}")],
                    )?;
                    Ok(())
                })
                .await
                .unwrap();
            }
            Store::Postgres(s) => {
                sqlx::query("INSERT INTO bench_plain (body) VALUES ($1)")
                    .bind(format!("row {i}"))
                    .execute(s.pool())
                    .await
                    .unwrap();
            }
        }
    }
    start.elapsed()
}

async fn create_plain_table(store: &Store) {
    match store {
        Store::Sqlite(s) => s
            .write(|ctx| {
                ctx.tx.execute_batch(
                    "CREATE TABLE IF NOT EXISTS bench_plain (id INTEGER PRIMARY KEY, body TEXT NOT NULL)",
                )?;
                Ok(())
            })
            .await
            .unwrap(),
        Store::Postgres(s) => {
            sqlx::query(
                "CREATE TABLE IF NOT EXISTS bench_plain (id BIGSERIAL PRIMARY KEY, body TEXT NOT NULL)",
            )
            .execute(s.pool())
            .await
            .unwrap();
        }
    }
}

/// `n` Remembers of one new filter each, rotating over the sessions.
async fn remembers(ledger: &SessionLedger, set: usize, n: usize, offset: usize) -> Duration {
    let start = Instant::now();
    for i in offset..offset + n {
        let filter = ExactFilter::parse_field("filter", &format!("bench/{i}")).unwrap();
        ledger
            .remember(&session(set, i), vec![(filter, Qos::AtLeastOnce)])
            .await
            .unwrap();
    }
    start.elapsed()
}

async fn renews(leases: &LeaseLedger, holder: &LeaseHolder, n: usize) -> Duration {
    let start = Instant::now();
    for i in 0..n {
        let verdict = leases
            .renew(&session(1, i), holder, FencingToken(1))
            .await
            .unwrap();
        assert!(
            matches!(verdict, RenewVerdict::Renewed { .. }),
            "{verdict:?}"
        );
    }
    start.elapsed()
}

fn rate(n: usize, took: Duration) -> f64 {
    n as f64 / took.as_secs_f64()
}

async fn bench(backend: Backend, n: usize) {
    let test = TestStore::new(backend).await;
    create_plain_table(&test.store).await;
    let ledger = SessionLedger::new(test.store.clone());
    let leases = LeaseLedger::new(test.store.clone());
    let holder = LeaseHolder::parse("holder", "bench:1:0:s1").unwrap();
    let unfenced = ledger.clone();
    for i in 0..SESSIONS {
        ledger
            .seed(&session(0, i), Vec::new(), "bench")
            .await
            .unwrap();
        ledger
            .seed(&session(1, i), Vec::new(), "bench")
            .await
            .unwrap();
        let acquired = leases
            .acquire(&session(1, i), &holder, Duration::from_secs(3600))
            .await
            .unwrap();
        assert_eq!(acquired.token, FencingToken(1));
    }
    let fenced = ledger.fenced(LeaseClaim {
        holder: holder.as_str().to_owned(),
        token: 1,
    });
    // Warm up every path (connections, prepared statements).
    plain_inserts(&test.store, 20, 0).await;
    remembers(&unfenced, 0, SESSIONS, 0).await;
    remembers(&fenced, 1, SESSIONS, 0).await;
    renews(&leases, &holder, SESSIONS).await;

    let per_round = (n / ROUNDS).max(1);
    let (mut plain, mut open, mut guarded, mut renewed) = (
        Duration::ZERO,
        Duration::ZERO,
        Duration::ZERO,
        Duration::ZERO,
    );
    for round in 0..ROUNDS {
        let offset = round * per_round;
        plain += plain_inserts(&test.store, per_round, offset + 1000).await;
        open += remembers(&unfenced, 0, per_round, SESSIONS + offset).await;
        guarded += remembers(&fenced, 1, per_round, SESSIONS + offset).await;
        renewed += renews(&leases, &holder, per_round).await;
    }
    let total = per_round * ROUNDS;
    let (plain, open, guarded, renewed) = (
        rate(total, plain),
        rate(total, open),
        rate(total, guarded),
        rate(total, renewed),
    );
    println!(
        "{backend:?}: plain insert {plain:>6.0}/s | Remember unfenced {open:>6.0}/s, fenced \
         {guarded:>6.0}/s (fenced/unfenced {:.2}, goal >= 0.80; fenced/plain insert {:.2}) | \
         lease renew {renewed:>6.0}/s (renew/plain insert {:.2}) [n={total} per path, \
         {ROUNDS} alternating rounds, {SESSIONS} sessions]",
        guarded / open,
        guarded / plain,
        renewed / plain,
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
