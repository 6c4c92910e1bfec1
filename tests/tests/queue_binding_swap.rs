//! Swapping a group's binding set in the middle of a stream, on real stores, both backends.
//!
//! The rule under test (ADR 0014): after an install commits, every claim hands out only messages
//! its set matches, and the swap applies to everything the group has not consumed while the log
//! holds it. Two proofs:
//!
//! - concurrently (publisher, two consuming instances and a swapper all running): every claim
//!   hands out a message stamped with an install at least as new as the one in effect when the
//!   claim began, whose set matches it; no message is handed out twice (no claim lapses here);
//!   and once the stream stops, every message the last set matches has been delivered, under
//!   whichever install first matched it;
//! - against a model (property test): random interleavings of publish, route, claim, ack,
//!   nack, lapse and swap; at every claim, each handed-out message matches the set in effect
//!   and was never acked; at the end, a whole-topic install drains exactly the messages never
//!   acked, so nothing was lost.
//!
//! The sets are chosen so that every swap has subjects only the old set matches and subjects
//! only the new set matches.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use wharf::domain::matcher::filter_matches;
use wharf::domain::{BindingMatcher, BindingSet, DeclarationEvent, DeclarerId, GroupName};
use wharf::domain::{RegisterOutcome, TopicName};
use wharf::store::Store;
use wharf::{Registration, Wharf};
use wharf_queue::{AckOutcome, Claimed, Queue, QueueSettings};
use wharf_tests::fixtures::msg;
use wharf_tests::{on_both_backends, wait_until, Backend, TestStore};

const DEADLINE: Duration = Duration::from_secs(90);

/// The sets installed in turn, round and round. Between any two neighbours (the last and the
/// first included) some subjects match only the old set and some only the new one.
const SETS: [&[&str]; 5] = [
    &["a/#", "b/y"],
    &["b/#", "c/x"],
    &["a/x", "c/#"],
    &["b/x", "d/+"],
    &["a/#", "d/x"],
];

/// What the publisher draws from, round robin; `e/x` matches no set.
const SUBJECTS: [&str; 9] = [
    "a/x", "a/y", "b/x", "b/y", "c/x", "c/y", "d/x", "d/y", "e/x",
];

/// How many swaps the concurrent test makes mid-stream.
const SWAPS: usize = 12;

const GROUP: &str = "swapped";
const TOPIC: &str = "stream";

fn group() -> GroupName {
    GroupName::parse("group", GROUP).unwrap()
}

fn topic() -> TopicName {
    TopicName::parse("topic", TOPIC).unwrap()
}

/// No claim lapses during these tests: every delivery is handed out once.
fn settings(route_batch: i64) -> QueueSettings {
    QueueSettings {
        visibility_timeout: Duration::from_secs(120),
        max_attempts: 5,
        backoff_base: Duration::from_millis(10),
        backoff_max: Duration::from_secs(1),
        route_batch,
    }
}

/// The reference check, filter by filter (empty = whole topic).
fn wants(set: &BindingSet, subject: &str) -> bool {
    set.is_whole_topic() || set.filters().iter().any(|f| filter_matches(f, subject))
}

/// The set of the k-th install: the sets in turn, round and round.
fn set_of(k: usize) -> &'static [&'static str] {
    SETS[k % SETS.len()]
}

/// Installs `set_of(k)` as declarer `swapper-k` (nobody heartbeats, so it always installs) and
/// returns the ledger position of the install: the generation deliveries will name.
async fn install(wharf: &Wharf, k: usize) -> i64 {
    let declarer = DeclarerId::parse("declarer", &format!("swapper-{k}")).unwrap();
    let outcome = wharf
        .as_declarer(declarer)
        .register(&Registration::new(GROUP, TOPIC, "1", set_of(k)).unwrap())
        .await
        .unwrap();
    assert!(
        matches!(outcome, RegisterOutcome::Installed { .. }),
        "swap {k} must install: {outcome:?}"
    );
    let mut effective = wharf
        .read_model()
        .effective_bindings(&group())
        .await
        .unwrap();
    effective.sort();
    let mut wanted: Vec<String> = set_of(k).iter().map(|p| (*p).to_owned()).collect();
    wanted.sort();
    assert_eq!(effective, wanted, "the binding rows hold set {k}");
    *installed_sets(wharf.store()).await.keys().last().unwrap()
}

/// Every set the group's ledger installed, by the ledger position of its Installed event.
async fn installed_sets(store: &Store) -> BTreeMap<i64, BindingSet> {
    store
        .load("consumer_group", GROUP)
        .await
        .unwrap()
        .into_iter()
        .filter_map(
            |recorded| match recorded.decode::<DeclarationEvent>().unwrap() {
                DeclarationEvent::Installed { attempt, .. } => {
                    Some((recorded.position, attempt.patterns))
                }
                DeclarationEvent::Waiting { .. } => None,
            },
        )
        .collect()
}

/// Every (position, subject) of the topic's log, read from the store.
async fn log_rows(store: &Store) -> BTreeMap<i64, String> {
    match store {
        Store::Sqlite(s) => s
            .read(|conn| {
                let mut stmt = conn.prepare(
                    "SELECT position, subject FROM message WHERE topic = ?1 ORDER BY position",
                )?;
                let rows = stmt
                    .query_map([TOPIC], |row| Ok((row.get(0)?, row.get(1)?)))?
                    .collect::<Result<_, _>>()?;
                Ok(rows)
            })
            .await
            .unwrap(),
        Store::Postgres(s) => sqlx::query_as::<_, (i64, String)>(
            "SELECT position, subject FROM message WHERE topic = $1 ORDER BY position",
        )
        .bind(TOPIC)
        .fetch_all(s.pool())
        .await
        .unwrap()
        .into_iter()
        .collect(),
    }
}

/// Checks the matcher the router uses against the reference on the test's own sets and
/// subjects, so a disagreement is reported as such rather than as a routing fault.
fn oracle_agrees() {
    for patterns in SETS {
        let set = BindingSet::parse(patterns).unwrap();
        let trie = BindingMatcher::new(&set);
        for subject in SUBJECTS {
            assert_eq!(
                trie.matches_str(subject),
                wants(&set, subject),
                "{patterns:?} vs {subject}"
            );
        }
    }
    // Each swap has subjects on both sides of it.
    for k in 1..=SETS.len() {
        let (old, new) = (
            BindingSet::parse(set_of(k - 1)).unwrap(),
            BindingSet::parse(set_of(k)).unwrap(),
        );
        assert!(SUBJECTS.iter().any(|s| wants(&old, s) && !wants(&new, s)));
        assert!(SUBJECTS.iter().any(|s| !wants(&old, s) && wants(&new, s)));
    }
}

/// A consumer only stops when told to; one that stopped early failed, and its panic is the
/// test's failure.
async fn surface_consumer_failure(consumers: &mut Vec<tokio::task::JoinHandle<()>>) {
    if let Some(i) = consumers.iter().position(|c| c.is_finished()) {
        consumers.remove(i).await.unwrap();
        panic!("consumer {i} stopped before it was told to");
    }
}

/// A delivery a consumer saw.
#[derive(Debug, Clone)]
struct Delivered {
    position: i64,
    subject: String,
    routed_by: i64,
}

/// One consuming instance: before each fetch it reads the install in effect; every message
/// the fetch hands out must be stamped with that install or a newer one, and match its set.
fn spawn_consumer(
    me: usize,
    queue: Queue,
    delivered: Arc<Mutex<Vec<Delivered>>>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let name = format!("consumer-{me}");
        let start = Instant::now();
        let mut sets = BTreeMap::new();
        loop {
            assert!(start.elapsed() < DEADLINE, "{name} timed out");
            let before = queue.effective_install(&group()).await.unwrap().unwrap();
            let batch = queue.fetch(&group(), &name, 10).await.unwrap();
            if batch.is_empty() {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                tokio::task::yield_now().await;
                continue;
            }
            for c in batch {
                if !sets.contains_key(&c.routed_by) {
                    sets = installed_sets(queue.store()).await;
                }
                let set = &sets[&c.routed_by];
                assert!(
                    c.routed_by >= before.position,
                    "position {} handed out under install {} after install {} was in effect",
                    c.position,
                    c.routed_by,
                    before.position
                );
                assert!(
                    wants(set, &c.subject),
                    "position {} ({}) handed out under set {set}",
                    c.position,
                    c.subject
                );
                assert_eq!(c.attempts, 1, "no redelivery in this test");
                assert_eq!(queue.ack(&c).await.unwrap(), AckOutcome::Acked);
                delivered.lock().unwrap().push(Delivered {
                    position: c.position,
                    subject: c.subject,
                    routed_by: c.routed_by,
                });
            }
        }
    })
}

async fn swaps_mid_stream_hand_out_only_the_set_in_effect(backend: Backend) {
    oracle_agrees();
    let store = TestStore::new(backend).await;
    let wharf = store.wharf();
    let first = install(&wharf, 0).await;
    let queue = Queue::new(store.store.clone(), settings(7));

    let stop_publishing = Arc::new(AtomicBool::new(false));
    let publisher = {
        let (queue, stop) = (queue.clone(), stop_publishing.clone());
        tokio::spawn(async move {
            let mut next = 0usize;
            let mut tail = 30;
            while tail > 0 {
                if stop.load(Ordering::SeqCst) {
                    tail -= 3;
                }
                let batch: Vec<_> = (0..3)
                    .map(|k| msg(SUBJECTS[(next + k) % SUBJECTS.len()]))
                    .collect();
                queue.publish(&topic(), &batch).await.unwrap();
                next += 3;
            }
            next as i64
        })
    };

    let delivered: Arc<Mutex<Vec<Delivered>>> = Arc::default();
    let stop_consuming = Arc::new(AtomicBool::new(false));
    let mut consumers: Vec<_> = (0..2)
        .map(|me| spawn_consumer(me, queue.clone(), delivered.clone(), stop_consuming.clone()))
        .collect();

    // Each swap waits until the set in effect has delivered across two full rounds of the
    // subjects, so every install hands out messages while the stream runs.
    let mut generations = vec![first];
    for k in 0..=SWAPS {
        let gen = *generations.last().unwrap();
        let span = 2 * SUBJECTS.len() as i64;
        wait_until(
            &format!("set {k} delivers across two rounds of subjects"),
            DEADLINE,
            || {
                let delivered = delivered.clone();
                let consumer_stopped = consumers.iter().any(|c| c.is_finished());
                async move {
                    if consumer_stopped {
                        return true;
                    }
                    let delivered = delivered.lock().unwrap();
                    let mine: Vec<i64> = delivered
                        .iter()
                        .filter(|d| d.routed_by == gen)
                        .map(|d| d.position)
                        .collect();
                    match (mine.iter().min(), mine.iter().max()) {
                        (Some(low), Some(high)) => high - low >= span,
                        _ => false,
                    }
                }
            },
        )
        .await;
        surface_consumer_failure(&mut consumers).await;
        if k < SWAPS {
            generations.push(install(&wharf, k + 1).await);
        }
    }
    stop_publishing.store(true, Ordering::SeqCst);
    let published = publisher.await.unwrap();
    wait_until("the consumers drain the stream", DEADLINE, || {
        let consumer_stopped = consumers.iter().any(|c| c.is_finished());
        let queue = queue.clone();
        async move {
            let s = queue.group_stats(Some(&group())).await.unwrap().remove(0);
            consumer_stopped
                || (s.routed_lag == 0
                    && s.rescan_remaining == 0
                    && s.claimable + s.in_flight + s.backing_off == 0)
        }
    })
    .await;
    surface_consumer_failure(&mut consumers).await;
    stop_consuming.store(true, Ordering::SeqCst);
    for consumer in consumers {
        consumer.await.unwrap();
    }

    let sets = installed_sets(&store.store).await;
    assert_eq!(
        sets.keys().copied().collect::<Vec<_>>(),
        generations,
        "the ledger holds exactly the installs made"
    );
    let log = log_rows(&store.store).await;
    assert_eq!(
        log.keys().copied().collect::<Vec<_>>(),
        (1..=published).collect::<Vec<_>>(),
        "the whole stream is in the log"
    );
    let mut by_position: BTreeMap<i64, Delivered> = BTreeMap::new();
    for d in std::mem::take(&mut *delivered.lock().unwrap()) {
        let p = d.position;
        assert_eq!(d.subject, log[&p]);
        assert!(
            by_position.insert(p, d).is_none(),
            "position {p} delivered twice"
        );
    }
    let used: BTreeSet<i64> = by_position.values().map(|d| d.routed_by).collect();
    assert_eq!(used.len(), SWAPS + 1, "every install handed out messages");

    // Completeness: the last set applies to everything the group had not consumed, so every
    // message it matches was delivered (by it, or earlier by a set that matched it too).
    let last = &sets[generations.last().unwrap()];
    for (position, subject) in &log {
        if wants(last, subject) {
            assert!(
                by_position.contains_key(position),
                "position {position} ({subject}) matches the last set {last} and was never \
                 delivered"
            );
        }
    }
    // And the new sets did reach back: some message was delivered by an install that came
    // after the one in effect when it was published past.
    let reached_back = by_position
        .values()
        .zip(by_position.values().skip(1))
        .any(|(a, b)| a.routed_by > b.routed_by);
    assert!(
        reached_back,
        "no install delivered anything routed past before it"
    );
}
on_both_backends!(
    concurrent_swaps,
    swaps_mid_stream_hand_out_only_the_set_in_effect
);

// ---------------------------------------------------------------------------------------------
// The model test.

/// One step of a random interleaving.
#[derive(Debug, Clone)]
enum Op {
    /// Publish these subjects (indexes into SUBJECTS).
    Publish(Vec<usize>),
    /// Install set k (a no-op when it is the one in effect).
    Swap(usize),
    /// Route one step.
    Route,
    /// Fetch up to n; with `lapse`, under a visibility timeout that has run out by the next op.
    Claim { n: u32, lapse: bool },
    /// Ack the i-th held claim (modulo the number held).
    Ack(usize),
    /// Nack the i-th held claim.
    Nack(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => prop::collection::vec(0..SUBJECTS.len(), 1..4).prop_map(Op::Publish),
        1 => (0..SETS.len()).prop_map(Op::Swap),
        1 => Just(Op::Route),
        3 => (1u32..4, any::<bool>()).prop_map(|(n, lapse)| Op::Claim { n, lapse }),
        2 => any::<usize>().prop_map(Op::Ack),
        1 => any::<usize>().prop_map(Op::Nack),
    ]
}

/// What the model knows: the set in effect and what was acked.
struct Model {
    set: usize,
    acked: BTreeSet<i64>,
    held: Vec<Claimed>,
}

fn model_settings(visibility_timeout: Duration) -> QueueSettings {
    QueueSettings {
        visibility_timeout,
        max_attempts: 1_000,
        backoff_base: Duration::from_millis(1),
        backoff_max: Duration::from_millis(1),
        route_batch: 2,
    }
}

/// A lapsing claim's timeout: over by the time the next step runs.
const LAPSE: Duration = Duration::from_millis(1);

async fn run_model(backend: Backend, ops: Vec<Op>) {
    let store = TestStore::new(backend).await;
    let wharf = store.wharf();
    install(&wharf, 0).await;
    let queue = Queue::new(store.store.clone(), model_settings(DEADLINE));
    let lapsing = Queue::new(store.store.clone(), model_settings(LAPSE));
    let mut model = Model {
        set: 0,
        acked: BTreeSet::new(),
        held: Vec::new(),
    };
    for op in ops {
        match op {
            Op::Publish(subjects) => {
                let batch: Vec<_> = subjects.iter().map(|&i| msg(SUBJECTS[i])).collect();
                queue.publish(&topic(), &batch).await.unwrap();
            }
            Op::Swap(k) if k % SETS.len() != model.set => {
                install(&wharf, k).await;
                model.set = k % SETS.len();
            }
            Op::Swap(_) => {}
            Op::Route => {
                queue.route(&group()).await.unwrap();
            }
            Op::Claim { n, lapse } => {
                let from = if lapse { &lapsing } else { &queue };
                let set = BindingSet::parse(set_of(model.set)).unwrap();
                for c in from.fetch(&group(), "model:1:aa", n).await.unwrap() {
                    assert!(
                        wants(&set, &c.subject),
                        "{} handed out under {set}",
                        c.subject
                    );
                    assert!(
                        !model.acked.contains(&c.position),
                        "{} ({}) handed out again after its ack",
                        c.position,
                        c.subject
                    );
                    model.held.push(c);
                }
                if lapse {
                    tokio::time::sleep(LAPSE * 2).await;
                }
            }
            Op::Ack(i) if !model.held.is_empty() => {
                let c = model.held.remove(i % model.held.len());
                if queue.ack(&c).await.unwrap() == AckOutcome::Acked {
                    model.acked.insert(c.position);
                }
            }
            Op::Nack(i) if !model.held.is_empty() => {
                let c = model.held.remove(i % model.held.len());
                queue.nack(&c, "model").await.unwrap();
            }
            Op::Ack(_) | Op::Nack(_) => {}
        }
    }
    // Settle what is still held, then install the whole topic: it must hand out exactly the
    // messages never acked, each once, and nothing acked.
    for c in std::mem::take(&mut model.held) {
        if queue.ack(&c).await.unwrap() == AckOutcome::Acked {
            model.acked.insert(c.position);
        }
    }
    let whole = DeclarerId::parse("declarer", "final").unwrap();
    let none: &[&str] = &[];
    let outcome = wharf
        .as_declarer(whole)
        .register(&Registration::new(GROUP, TOPIC, "1", none).unwrap())
        .await
        .unwrap();
    assert!(
        matches!(outcome, RegisterOutcome::Installed { .. }),
        "{outcome:?}"
    );
    let mut drained = BTreeSet::new();
    let start = Instant::now();
    loop {
        let got = queue.fetch(&group(), "model:1:aa", 50).await.unwrap();
        for c in &got {
            assert!(!model.acked.contains(&c.position), "{c:?} was acked before");
            assert!(drained.insert(c.position), "{c:?} handed out twice");
            queue.ack(c).await.unwrap();
        }
        let s = queue.group_stats(Some(&group())).await.unwrap().remove(0);
        let settled = s.routed_lag == 0
            && s.rescan_remaining == 0
            && s.claimable + s.in_flight + s.backing_off == 0;
        if got.is_empty() && settled {
            break;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "the final drain did not finish: {s:?}"
        );
        if got.is_empty() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    let log: BTreeSet<i64> = log_rows(&store.store).await.into_keys().collect();
    let unacked: BTreeSet<i64> = log.difference(&model.acked).copied().collect();
    assert_eq!(
        drained, unacked,
        "the whole-topic install hands out exactly what was never acked"
    );
}

fn model_cases(backend: Backend, cases: u32) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let config = ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(ops in prop::collection::vec(op(), 1..60))| {
        runtime.block_on(run_model(backend, ops));
    });
}

#[test]
fn model_interleavings_sqlite() {
    model_cases(Backend::Sqlite, 32);
}

#[test]
fn model_interleavings_postgres() {
    model_cases(Backend::Postgres, 12);
}
