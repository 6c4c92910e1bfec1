//! Benchmark: `projections rebuild` and `--verify` against a raw streamed read of the same
//! events through the same driver, in the same run (issue 8; goal: ratio >= 0.25, the same
//! within 20% from 230k to 2.3M events).
//!
//! The ledger is a fleet of groups that deploy: per group an install, waiting retries of two
//! declarers asking for a new set, the swap to it (which resolves the other waiter), and a
//! waiter for the old set; interleaved across groups in position order. It is bulk-loaded
//! (the same rows the register path writes; no projection), and nothing is analyzed, so the
//! first rebuild runs into empty projections with the statistics of an empty store, as after a
//! restore.
//!
//! - raw: `SELECT position, payload FROM events ORDER BY position`, streamed and each payload
//!   decoded into the domain's `DeclarationEvent` (mean of a read before and after the
//!   rebuilds);
//! - rebuild (first): into empty projections; rebuild: over existing ones; verify.
//!
//! - the group snapshots (ADR 0034): their re-derive after a rebuild and their check in a
//!   verify, timed apart (the CLI runs them after the projections' transaction).
//!
//! Before each timed round the store is put at rest (`settle`: Postgres `VACUUM` of the
//! projection tables and `CHECKPOINT`, SQLite a WAL checkpoint), outside the timing.
//!
//! Run: `cargo bench -p wharf-tests --bench rebuild` (WHARF_BENCH_EVENTS=23000,230000 to pick
//! the sizes, WHARF_BENCH_BACKENDS=sqlite or postgres to pick one backend).

use std::sync::Arc;
use std::time::Instant;

use futures::TryStreamExt;
use sqlx::Row;
use wharf::domain::DeclarationEvent;
use wharf::store::{Progress, RebuildMode, Store};
use wharf_tests::ledger::load;
use wharf_tests::{Backend, TestStore};

fn sizes() -> Vec<usize> {
    std::env::var("WHARF_BENCH_EVENTS")
        .ok()
        .map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![23_000, 230_000])
}

fn backends() -> Vec<Backend> {
    match std::env::var("WHARF_BENCH_BACKENDS").as_deref() {
        Ok("sqlite") => vec![Backend::Sqlite],
        Ok("postgres") => vec![Backend::Postgres],
        _ => vec![Backend::Sqlite, Backend::Postgres],
    }
}

/// Seconds for a streamed read of every event's position and payload, decoded.
async fn raw_read(store: &Store) -> (f64, usize) {
    settle(store).await;
    let start = Instant::now();
    let count = match store {
        Store::Sqlite(s) => s
            .read(|conn| {
                let mut stmt =
                    conn.prepare("SELECT position, payload FROM events ORDER BY position")?;
                let mut rows = stmt.query([])?;
                let mut count = 0usize;
                while let Some(row) = rows.next()? {
                    let _position: i64 = row.get(0)?;
                    let payload: String = row.get(1)?;
                    let event: DeclarationEvent =
                        serde_json::from_str(&payload).expect("a declaration payload");
                    std::hint::black_box(event);
                    count += 1;
                }
                Ok(count)
            })
            .await
            .expect("raw read"),
        Store::Postgres(s) => {
            let mut rows = sqlx::query("SELECT position, payload FROM events ORDER BY position")
                .fetch(s.pool());
            let mut count = 0usize;
            while let Some(row) = rows.try_next().await.expect("raw read") {
                let _position: i64 = row.get(0);
                let event: sqlx::types::Json<DeclarationEvent> = row.get(1);
                std::hint::black_box(event);
                count += 1;
            }
            count
        }
    };
    (start.elapsed().as_secs_f64(), count)
}

/// Puts the store at rest before a timed round: Postgres vacuums the projection tables (the
/// previous round's deleted rows; autovacuum is off on this machine) and checkpoints (so no
/// round pays for the write-back of the load or of the round before); SQLite checkpoints its
/// WAL into the main file.
async fn settle(store: &Store) {
    match store {
        Store::Sqlite(s) => s
            .read(|conn| Ok(conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")?))
            .await
            .expect("checkpointing the WAL"),
        Store::Postgres(s) => {
            // One statement each: VACUUM refuses to run in a multi-statement string.
            for sql in [
                "VACUUM declarer_attempt, effective_declaration, binding",
                "CHECKPOINT",
            ] {
                sqlx::query(sql)
                    .execute(s.pool())
                    .await
                    .expect("vacuum and checkpoint");
            }
        }
    }
}

async fn timed_rebuild(test: &TestStore, mode: RebuildMode) -> f64 {
    settle(&test.store).await;
    let quiet: Progress = Arc::new(|_, _| {});
    let start = Instant::now();
    let report = test
        .wharf()
        .read_model()
        .rebuild(mode, quiet)
        .await
        .expect("rebuild");
    let seconds = start.elapsed().as_secs_f64();
    assert!(
        report.is_clean(),
        "the replay differs: {:?}",
        report.differences
    );
    seconds
}

/// The group snapshots' part of a rebuild and of a verify (ADR 0034), timed apart: the
/// re-derive at `snapshot_every` (the CLI's, default 1000; `WHARF_BENCH_SNAPSHOT_EVERY`), then
/// the check of every saved state. Returns (seconds, states written, seconds, states checked).
async fn timed_snapshots(test: &TestStore) -> (f64, u64, f64, u64) {
    let every = std::env::var("WHARF_BENCH_SNAPSHOT_EVERY")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    let read = test.wharf().read_model().clone();
    settle(&test.store).await;
    let start = Instant::now();
    let written = read.rederive_snapshots(every).await.expect("re-derive");
    let rederive = start.elapsed().as_secs_f64();
    let start = Instant::now();
    let report = read.verify_snapshots().await.expect("verify snapshots");
    let verify = start.elapsed().as_secs_f64();
    assert!(report.is_clean(), "snapshots differ: {:?}", report.wrong);
    (rederive, written, verify, report.checked)
}

/// The median of `runs` timed calls of `read`, in milliseconds.
async fn median_ms<F, Fut>(runs: usize, mut read: F) -> f64
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let start = Instant::now();
        read().await;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    times[runs / 2]
}

/// Listing reads on the rebuilt store (through `ReadModel`, no HTTP), median of 21: the first
/// page of 100 groups, the page after the middle group, a page of waiting groups (every group
/// has one open waiter), one group.
async fn listing(test: &TestStore, events: usize) -> String {
    use wharf::domain::GroupName;
    use wharf::projections::{GroupCursor, GroupQuery, MemberQuery};
    let read = test.wharf().read_model().clone();
    let middle = events.div_ceil(wharf_tests::ledger::PER_GROUP) / 2;
    let first = GroupQuery::default();
    let deep = GroupQuery {
        after: Some(GroupCursor(
            GroupName::parse("g", &format!("group-{:06}", middle)).expect("name"),
        )),
        ..GroupQuery::default()
    };
    let waiting = GroupQuery {
        waiting: true,
        ..GroupQuery::default()
    };
    let group = GroupName::parse("g", "group-000042").expect("name");
    let page = |query: GroupQuery| {
        let read = read.clone();
        move || {
            let (read, query) = (read.clone(), query.clone());
            async move {
                let page = read.groups_page(&query).await.expect("a page");
                assert_eq!(page.groups.len(), 100);
            }
        }
    };
    let first = median_ms(21, page(first)).await;
    let deep = median_ms(21, page(deep)).await;
    let waiting = median_ms(21, page(waiting)).await;
    let one = median_ms(21, || {
        let (read, group) = (read.clone(), group.clone());
        async move {
            let view = read.group_members(&group, &MemberQuery::default()).await;
            assert!(view.expect("a group").is_some());
        }
    })
    .await;
    format!("{first:.2} | {deep:.2} | {waiting:.2} | {one:.2}")
}

#[tokio::main]
async fn main() {
    println!(
        "| backend | events | raw read s | first rebuild s (ratio) | rebuild s (ratio) | verify s (ratio) |"
    );
    println!("|---|---|---|---|---|---|");
    let mut listings = Vec::new();
    let mut snapshots = Vec::new();
    for backend in backends() {
        for events in sizes() {
            let test = TestStore::new(backend).await;
            let start = Instant::now();
            load(&test.store, events).await;
            eprintln!(
                "{backend:?}: loaded {events} events in {:.1} s",
                start.elapsed().as_secs_f64()
            );
            let (before, count) = raw_read(&test.store).await;
            assert_eq!(count, events);
            let first = timed_rebuild(&test, RebuildMode::Apply).await;
            let again = timed_rebuild(&test, RebuildMode::Apply).await;
            let verify = timed_rebuild(&test, RebuildMode::Verify).await;
            let (rederive, written, checked_s, checked) = timed_snapshots(&test).await;
            snapshots.push(format!(
                "| {backend:?} | {events} | {rederive:.3} ({written}) | {checked_s:.3} ({checked}) |"
            ));
            let (after, _) = raw_read(&test.store).await;
            listings.push(format!(
                "| {backend:?} | {events} | {} |",
                listing(&test, events).await
            ));
            let raw = (before + after) / 2.0;
            println!(
                "| {backend:?} | {events} | {raw:.3} ({before:.3}, {after:.3}) | {first:.3} ({:.3}) | {again:.3} ({:.3}) | {verify:.3} ({:.3}) |",
                raw / first,
                raw / again,
                raw / verify,
            );
        }
    }
    println!();
    println!(
        "| backend | events | snapshots re-derive s (written) | snapshots verify s (checked) |"
    );
    println!("|---|---|---|---|");
    for line in snapshots {
        println!("{line}");
    }
    println!();
    println!("| backend | events | first page ms | page after the middle ms | waiting page ms | one group ms |");
    println!("|---|---|---|---|---|---|");
    for line in listings {
        println!("{line}");
    }
}
