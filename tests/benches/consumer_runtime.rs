//! Benchmark: end-to-end throughput of the library's consumer runtime (`Wharf::consume_with`
//! with a handler that does nothing: claim, handler, ack, all through the runtime) through a
//! group with 100 patterns where half the subjects match, against plain `SKIP LOCKED` queues
//! on the same store, in the same run (issue 8, item 5; ADR 0035).
//!
//! - **The strongest plain queue** (the new baseline): [`CONSUMERS`] tasks, each
//!   `DELETE ... WHERE id = ANY(ARRAY(SELECT ... LIMIT 10 FOR UPDATE SKIP LOCKED)) RETURNING`
//!   (SQLite: `DELETE ... WHERE id IN (SELECT ... LIMIT 10) RETURNING`): one statement and one
//!   commit per 10 messages, no handler. On Postgres each task keeps one connection for its
//!   whole loop, as `pgbench` does (ADR 0051); the same loop taking a pool connection for each
//!   statement (what this bench compared with before: sqlx pings every connection returned to
//!   its pool) is run too, and its ratio printed as the pooled one.
//! - **The runtime at the same batch size and concurrency**: [`CONSUMERS`] consumers (two
//!   instances of the group, like two processes; each one claim loop, so two claim statements
//!   in flight at most, as the plain queue's two tasks), each `queue.claim_batch` 10 and
//!   `queue.concurrency` 10 (a whole batch handled at once). Each fetch settles the acks of
//!   the handlers done since the last one and claims the next batch in one statement (ADR
//!   0035; on Postgres one call of the cached `SELECT ... FROM wharf_claim(...)`, one round
//!   trip, ADR 0042), and routes only when that claim comes back short. New ratio: this / the
//!   strongest plain queue. Goal >= 0.50 on Postgres, >= 0.70 on SQLite.
//! - **The queue alone**: [`CONSUMERS`] tasks calling `Queue::ack_and_fetch_holding` in a loop,
//!   batches of 10, each fetch carrying the acks of the batch before (no handler, no runtime):
//!   the store's side of the runtime's claim loop, printed against the same baseline so that
//!   the runtime's own cost shows apart from the queue's.
//! - **The runtime at its defaults** (one consumer, claim_batch 32, concurrency 8), and the old
//!   baseline (the `queue_claim` plain loop: two tasks, claim 10 with one statement, then ack
//!   each with a `DELETE` of its own). Old ratio: defaults / old baseline, as this bench
//!   printed before.
//!
//! Rounds alternate (plain, runtime, runtime, plain, ...) and means are compared, because this
//! machine drifts. The clock of a runtime run starts when its consumers start and stops when
//! they have handled every matching message; publishing happens before it.
//!
//! **Flatness.** In a fresh store per size, an unmatched backlog of 10k and of 1M messages is
//! published into the group's routing range and routed past (timed on its own: that is the
//! router's skip rate, once per message), the store is put at rest (Postgres `VACUUM
//! (ANALYZE)` + `CHECKPOINT`, SQLite a WAL checkpoint) and a fresh half-matching batch is
//! handled by the runtime at the same batch size and concurrency. Goal: the two rates within
//! 20% (1M / 10k in 0.80..1.25).
//!
//! Run: `cargo bench -p wharf-tests --bench consumer_runtime` (`WHARF_BENCH_SCALE` scales the
//! 20k matched messages and the backlogs;
//! `WHARF_BENCH_BACKLOG_LOAD=sql` loads the Postgres backlogs with one statement).

use std::time::{Duration, Instant};

use wharf::config::QueueConfig;
use wharf::handler::handler_fn;
use wharf::queue::{Claimed, HeldConnection, Queue};
use wharf::store::Store;
use wharf::{Registration, Wharf};
use wharf_tests::{Backend, TestStore};

mod support;
use support::*;

/// Alternating rounds of the plain-vs-runtime comparison.
const RUNTIME_ROUNDS: usize = 2;

/// How a runtime run's consumers are configured.
#[derive(Debug, Clone, Copy)]
struct Shape {
    consumers: usize,
    claim_batch: u32,
    concurrency: u32,
}

/// The plain queue's shape: [`CONSUMERS`] claimers of [`FETCH_MAX`].
const SAME_SHAPE: Shape = Shape {
    consumers: CONSUMERS,
    claim_batch: FETCH_MAX,
    concurrency: FETCH_MAX,
};

/// The library's defaults.
const DEFAULT_SHAPE: Shape = Shape {
    consumers: 1,
    claim_batch: 32,
    concurrency: 8,
};

impl Shape {
    fn label(&self) -> String {
        format!(
            "runtime: {} consumer(s), claim_batch {}, concurrency {}",
            self.consumers, self.claim_batch, self.concurrency
        )
    }
}

fn wharf(test: &TestStore, shape: Shape) -> Wharf {
    let mut config = test.config();
    // The production TTL (a third of it is every store call's deadline): the tests' 400 ms
    // makes a consumer stall whenever a loaded machine's commit takes over 133 ms.
    config.declarations.instance_ttl = Duration::from_secs(30);
    config.declarations.heartbeat_interval = Duration::from_secs(1);
    config.queue = QueueConfig {
        poll_interval: Duration::from_millis(5),
        claim_batch: shape.claim_batch,
        concurrency: shape.concurrency,
        ..QueueConfig::default()
    };
    Wharf::with_store(test.store.clone(), &config.settings())
}

/// What one timed runtime run did.
struct RuntimeRun {
    shape: Shape,
    handled: usize,
    elapsed: Duration,
    /// Fetches the consumers made (empty ones included).
    fetches: u64,
    /// Polls (every 2 ms) that found a consumer not ready after it first was (stalled or
    /// re-declaring: it claims nothing then), out of all polls after that.
    not_ready: usize,
    polls: usize,
}

impl RuntimeRun {
    fn rate(&self) -> f64 {
        self.handled as f64 / self.elapsed.as_secs_f64()
    }

    fn line(&self) -> String {
        format!(
            "{:<58} {:>7} handled in {:>6.2} s = {:>7.0} msg/s  ({} fetches, {:.1} messages \
             each; not ready in {} of {} polls)",
            self.shape.label(),
            self.handled,
            self.elapsed.as_secs_f64(),
            self.rate(),
            self.fetches,
            self.handled as f64 / self.fetches.max(1) as f64,
            self.not_ready,
            self.polls
        )
    }
}

/// Starts `shape.consumers` consumers with a no-op handler and times them, from when all of
/// them are ready (declared and joined: a one-off cost per consumer, not a per-message one)
/// until `expected` messages are handled; the rate counts what was handled in that window.
async fn runtime_run(wharf: &Wharf, shape: Shape, expected: usize) -> RuntimeRun {
    let patterns: Vec<String> = (0..PATTERNS).map(|i| format!("sensors/{i}/+")).collect();
    let registration = Registration::new(GROUP, TOPIC, "1", &patterns).expect("registration");
    let mut start = Instant::now();
    let mut handled_at_start = None;
    let consumers: Vec<_> = (0..shape.consumers)
        .map(|_| {
            wharf.consume_with(
                registration.clone(),
                handler_fn(|message: Claimed| async move {
                    assert!(message.subject.starts_with("sensors/"), "{message:?}");
                    Ok(())
                }),
            )
        })
        .collect();
    let (mut ready_once, mut not_ready, mut polls) = (vec![false; consumers.len()], 0, 0);
    loop {
        let mut handled = 0;
        for (consumer, ready_once) in consumers.iter().zip(ready_once.iter_mut()) {
            let ready = consumer.is_ready();
            if *ready_once {
                polls += 1;
                not_ready += usize::from(!ready);
            }
            *ready_once |= ready;
            let stats = consumer.stats();
            assert_eq!(stats.handled_err + stats.claims_lost, 0, "{stats:?}");
            handled += stats.handled_ok;
        }
        if handled_at_start.is_none() && ready_once.iter().all(|ready| *ready) {
            start = Instant::now();
            handled_at_start = Some(handled);
        }
        if handled >= expected as u64 {
            break;
        }
        assert!(start.elapsed() < DEADLINE, "the consumers hung");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = start.elapsed();
    let (mut handled, mut fetches) = (0, 0);
    for consumer in consumers {
        let last = consumer.shutdown().await;
        handled += last.handled_ok;
        fetches += last.fetches;
    }
    assert_eq!(handled, expected as u64, "each message handled once");
    RuntimeRun {
        shape,
        handled: expected - handled_at_start.unwrap_or(0) as usize,
        elapsed,
        fetches,
        not_ready,
        polls,
    }
}

/// [`CONSUMERS`] tasks calling `Queue::ack_and_fetch_holding` themselves, each carrying the
/// acks of its previous batch on a connection it keeps between fetches, as the runtime's claim
/// loop does (no handler, no runtime): what the store's side of that loop costs alone. Returns
/// messages per second.
async fn queue_loop(queue: &Queue, expected: usize) -> f64 {
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..CONSUMERS)
        .map(|i| {
            let (queue, done) = (queue.clone(), done.clone());
            tokio::spawn(async move {
                let group = group();
                let instance = format!("queue-loop-{i}");
                let mut connection = HeldConnection::default();
                let mut held: Vec<Claimed> = Vec::new();
                loop {
                    let acked = held.len();
                    let step = queue
                        .ack_and_fetch_holding(
                            &mut connection,
                            &held,
                            &group,
                            &instance,
                            None,
                            FETCH_MAX,
                        )
                        .await
                        .unwrap();
                    assert_eq!(step.acks.len(), acked);
                    let total = done.fetch_add(acked, std::sync::atomic::Ordering::Relaxed) + acked;
                    held = step.fetched.unwrap();
                    if held.is_empty() && total >= expected {
                        connection.release();
                        return;
                    }
                    assert!(start.elapsed() < DEADLINE, "the queue loop hung");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    expected as f64 / start.elapsed().as_secs_f64()
}

fn mean<T>(runs: &[T], rate: impl Fn(&T) -> f64) -> f64 {
    runs.iter().map(rate).sum::<f64>() / runs.len() as f64
}

fn goal(backend: Backend) -> &'static str {
    if backend == Backend::Postgres {
        "0.50"
    } else {
        "0.70"
    }
}

async fn against_plain(backend: Backend, matched: usize) {
    let test = TestStore::new(backend).await;
    declare(&test).await;
    let same = wharf(&test, SAME_SHAPE);
    let defaults = wharf(&test, DEFAULT_SHAPE);
    let queue: &Queue = same.queue();
    // Warm up every path.
    plain_claim_and_ack(&test.store, 50).await;
    plain_claim_delete_all(&test.store, 50).await;
    plain_claim_delete_all_held(&test.store, 50).await;
    for (wharf, shape) in [(&same, SAME_SHAPE), (&defaults, DEFAULT_SHAPE)] {
        publish_half_matching(queue, 50).await;
        runtime_run(wharf, shape, 50).await;
    }

    let old_before = plain_claim_and_ack(&test.store, matched).await;
    let mut strong = vec![plain_claim_delete_all_held(&test.store, matched).await];
    let mut pooled = vec![plain_claim_delete_all(&test.store, matched).await];
    let (mut same_runs, mut default_runs) = (Vec::new(), Vec::new());
    for _ in 0..RUNTIME_ROUNDS {
        publish_half_matching(queue, matched).await;
        same_runs.push(runtime_run(&same, SAME_SHAPE, matched).await);
        publish_half_matching(queue, matched).await;
        default_runs.push(runtime_run(&defaults, DEFAULT_SHAPE, matched).await);
        pooled.push(plain_claim_delete_all(&test.store, matched).await);
        strong.push(plain_claim_delete_all_held(&test.store, matched).await);
    }
    let old_after = plain_claim_and_ack(&test.store, matched).await;
    let mut loops = Vec::new();
    for _ in 0..RUNTIME_ROUNDS {
        publish_half_matching(queue, matched).await;
        loops.push(queue_loop(queue, matched).await);
    }
    let loop_rate = loops.iter().sum::<f64>() / loops.len() as f64;

    println!(
        "{backend:?}: the consumer runtime against plain SKIP LOCKED queues ({RUNTIME_ROUNDS} \
         alternating rounds, means)"
    );
    println!(
        "  {}",
        old_before.line("claim then ack each (old baseline, before)")
    );
    for (round, (run, pooled_run)) in strong.iter().zip(&pooled).enumerate() {
        println!(
            "  {}",
            run.line(&format!(
                "one-statement claim-and-delete (run {})",
                round + 1
            ))
        );
        println!(
            "  {}",
            pooled_run.line(&format!("  the same, pooled (run {})", round + 1))
        );
        if let (Some(same), Some(defaults)) = (same_runs.get(round), default_runs.get(round)) {
            println!("  {}", same.line());
            println!("  {}", defaults.line());
        }
    }
    println!(
        "  {}",
        old_after.line("claim then ack each (old baseline, after)")
    );
    let strong_rate = mean(&strong, ClaimRun::rate);
    let pooled_rate = mean(&pooled, ClaimRun::rate);
    let old_rate = (old_before.rate() + old_after.rate()) / 2.0;
    let same_rate = mean(&same_runs, RuntimeRun::rate);
    let default_rate = mean(&default_runs, RuntimeRun::rate);
    println!(
        "  NEW ratio: runtime at the same batch size (10) and concurrency ({CONSUMERS}) / \
         one-statement claim-and-delete: {same_rate:.0} / {strong_rate:.0} msg/s = {:.2} \
         (goal >= {})",
        same_rate / strong_rate,
        goal(backend)
    );
    println!(
        "  runtime at the same batch size and concurrency / the same statement pooled (the \
         baseline before ADR 0051): {same_rate:.0} / {pooled_rate:.0} msg/s = {:.2}",
        same_rate / pooled_rate
    );
    println!(
        "  the queue alone (ack_and_fetch_holding in {CONSUMERS} loops of 10, no handler) / \
         one-statement claim-and-delete: {loop_rate:.0} / {strong_rate:.0} msg/s = {:.2}",
        loop_rate / strong_rate
    );
    println!(
        "  runtime at its defaults / one-statement claim-and-delete: {default_rate:.0} / \
         {strong_rate:.0} msg/s = {:.2}",
        default_rate / strong_rate
    );
    println!(
        "  OLD ratio: runtime at its defaults / claim then ack each: {default_rate:.0} / \
         {old_rate:.0} msg/s = {:.2}",
        default_rate / old_rate
    );
}

/// Routes the group past its backlog with `route()` alone (one caller: routing is serialized
/// per group anyway); returns how long it took.
async fn route_past(queue: &Queue, backlog: usize) -> Duration {
    let group = group();
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
    assert_eq!(
        (scanned, routed),
        (backlog as u64, 0),
        "all backlog scanned, none routed"
    );
    start.elapsed()
}

/// Keeps the backlog's after-effects (a checkpoint, the fresh rows' statistics) out of the
/// timed window; done identically for every size.
async fn at_rest(store: &Store) {
    match store {
        Store::Postgres(s) => {
            for statement in ["VACUUM (ANALYZE) message", "CHECKPOINT"] {
                sqlx::query(statement).execute(s.pool()).await.unwrap();
            }
        }
        Store::Sqlite(s) => {
            s.write(|ctx| {
                // Inside the write transaction a checkpoint cannot run; settle the statistics.
                ctx.tx.execute_batch("ANALYZE")?;
                Ok(())
            })
            .await
            .unwrap();
        }
    }
}

/// One flatness size: a fresh store, a backlog routed past, then a timed runtime run.
async fn flatness(backend: Backend, backlog: usize, matched: usize) -> (Duration, RuntimeRun) {
    let test = TestStore::new(backend).await;
    declare(&test).await;
    let same = wharf(&test, SAME_SHAPE);
    let queue = same.queue().clone();
    publish_half_matching(&queue, 50).await;
    runtime_run(&same, SAME_SHAPE, 50).await;
    load_backlog(&test, &queue, backlog).await;
    let skip = route_past(&queue, backlog).await;
    at_rest(&test.store).await;
    publish_half_matching(&queue, matched).await;
    (skip, runtime_run(&same, SAME_SHAPE, matched).await)
}

async fn flat(backend: Backend, backlogs: [usize; 2], matched: usize) {
    println!(
        "{backend:?} flatness: unmatched backlog routed past by route(), store at rest, then \
         {matched} matching messages (of {}) handled by the runtime at the same shape",
        matched * 2
    );
    let mut rates = Vec::new();
    for backlog in backlogs {
        let (skip, run) = flatness(backend, backlog, matched).await;
        println!(
            "  backlog {backlog:>8}: skipped at {:>8.0} rows/s | {}",
            backlog as f64 / skip.as_secs_f64(),
            run.line()
        );
        rates.push(run.rate());
    }
    println!(
        "  ratio runtime rate {} / {} backlog: {:.2} (goal 0.80..1.25)",
        backlogs[1],
        backlogs[0],
        rates[1] / rates[0]
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let matched = scaled(20_000);
    let backlogs = [scaled(10_000), scaled(1_000_000)];
    let sqlite_matched = matched;
    let only = std::env::var("WHARF_BENCH_BACKENDS").unwrap_or_default();
    let run = |backend: &str| only.is_empty() || only.contains(backend);
    runtime.block_on(async {
        if run("postgres") {
            against_plain(Backend::Postgres, matched).await;
            flat(Backend::Postgres, backlogs, matched).await;
        }
        if run("sqlite") {
            against_plain(Backend::Sqlite, sqlite_matched).await;
            flat(Backend::Sqlite, backlogs, sqlite_matched).await;
        }
    });
}
