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

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use wharf::store::Store;
use wharf_queue::{AckOutcome, Queue, QueueSettings};
use wharf_tests::{Backend, TestStore};

mod support;
use support::*;

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
    let run = join_claim_tasks(tasks, start, expected).await;
    let stats = queue.group_stats(Some(&group())).await.unwrap();
    assert_eq!(stats[0].routed_lag, 0, "routed up to the head: {stats:?}");
    assert_eq!(stats[0].claimable + stats[0].in_flight, 0, "{stats:?}");
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
