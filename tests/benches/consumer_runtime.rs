//! Benchmark: end-to-end throughput of the library's consumer runtime (`Wharf::consume_with`
//! with a handler that does nothing) through a group with 100 patterns where half the subjects
//! match, against the plain `SKIP LOCKED` queue of the `queue_claim` bench (two tasks, claim 10,
//! ack each), on the same store, in the same run.
//!
//! The runtime claims up to `queue.claim_batch` (32) per fetch for `queue.concurrency` (8)
//! handlers, keeps each claim alive while its handler runs, and settles the acks of handlers
//! that finish together in one commit (`wharf/src/acker.rs`). The plain baseline runs before
//! and after; the mean is the baseline. The clock starts when the consumer is started and stops
//! when it has handled every matching message; publishing happens before it.
//!
//! Run: `cargo bench -p wharf-tests --bench consumer_runtime` (`WHARF_BENCH_SCALE` scales the
//! 20k matched messages; SQLite runs a quarter of them).

use std::time::{Duration, Instant};

use wharf::config::QueueConfig;
use wharf::handler::handler_fn;
use wharf::queue::{Claimed, Queue};
use wharf::{Registration, Wharf};
use wharf_tests::{Backend, TestStore};

mod support;
use support::*;

fn wharf(test: &TestStore) -> Wharf {
    let mut config = test.config();
    config.queue = QueueConfig {
        poll_interval: Duration::from_millis(5),
        ..QueueConfig::default()
    };
    Wharf::with_store(test.store.clone(), &config)
}

/// What one timed consumer run did.
struct RuntimeRun {
    rate: f64,
    elapsed: Duration,
    /// Fetches the runtime made (empty ones included).
    fetches: u64,
    /// Polls (every 2 ms) that found the consumer not ready after it first was (stalled or
    /// re-declaring: it claims nothing then), out of all polls after that.
    not_ready: usize,
    polls: usize,
}

/// Starts a consumer with a no-op handler and times it until `expected` messages are handled.
async fn runtime_run(wharf: &Wharf, expected: usize) -> RuntimeRun {
    let patterns: Vec<String> = (0..PATTERNS).map(|i| format!("sensors/{i}/+")).collect();
    let registration = Registration::new(GROUP, TOPIC, "1", &patterns).expect("registration");
    let start = Instant::now();
    let consumer = wharf.consume_with(
        registration,
        handler_fn(|message: Claimed| async move {
            assert!(message.subject.starts_with("sensors/"), "{message:?}");
            Ok(())
        }),
    );
    let (mut ready_once, mut not_ready, mut polls) = (false, 0usize, 0usize);
    loop {
        let ready = consumer.is_ready();
        if ready_once {
            polls += 1;
            not_ready += usize::from(!ready);
        }
        ready_once |= ready;
        let stats = consumer.stats();
        assert_eq!(stats.handled_err + stats.claims_lost, 0, "{stats:?}");
        if stats.handled_ok >= expected as u64 {
            break;
        }
        assert!(start.elapsed() < DEADLINE, "the consumer hung: {stats:?}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = start.elapsed();
    let last = consumer.shutdown().await;
    assert_eq!(
        last.handled_ok, expected as u64,
        "each message handled once"
    );
    RuntimeRun {
        rate: expected as f64 / elapsed.as_secs_f64(),
        elapsed,
        fetches: last.fetches,
        not_ready,
        polls,
    }
}

async fn bench(backend: Backend, matched: usize) {
    let test = TestStore::new(backend).await;
    declare(&test).await;
    let wharf = wharf(&test);
    let queue: &Queue = wharf.queue();
    // Warm up both paths.
    plain_claim_and_ack(&test.store, 50).await;
    publish_half_matching(queue, 50).await;
    runtime_run(&wharf, 50).await;

    let before = plain_claim_and_ack(&test.store, matched).await;
    publish_half_matching(queue, matched).await;
    let run = runtime_run(&wharf, matched).await;
    let (rate, elapsed) = (run.rate, run.elapsed);
    let after = plain_claim_and_ack(&test.store, matched).await;
    let baseline = (before.rate() + after.rate()) / 2.0;
    println!("{backend:?}: consumer runtime (claim_batch 32, concurrency 8, acks share commits)");
    println!("  {}", before.line("plain SKIP LOCKED queue (before)"));
    println!(
        "  {:<44} {matched:>7} handled in {:>6.2} s = {rate:>7.0} msg/s",
        format!("consumer runtime ({PATTERNS} patterns, 50% match)"),
        elapsed.as_secs_f64()
    );
    println!(
        "  {:<44} {} fetches ({:.1} messages each); not ready in {} of {} polls after the first ready",
        "",
        run.fetches,
        matched as f64 / run.fetches.max(1) as f64,
        run.not_ready,
        run.polls
    );
    println!("  {}", after.line("plain SKIP LOCKED queue (after)"));
    println!(
        "  ratio runtime / plain (mean {baseline:.0} msg/s): {:.2}",
        rate / baseline
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let matched = scaled(20_000);
    runtime.block_on(async {
        bench(Backend::Postgres, matched).await;
        bench(Backend::Sqlite, (matched / 4).max(1)).await;
    });
}
