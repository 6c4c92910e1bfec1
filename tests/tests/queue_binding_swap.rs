//! Swapping a group's binding set in the middle of a stream, on real stores, both backends.
//!
//! The routing rule under test: each log position is matched against exactly one installed
//! set, the one in effect when it was routed, and never against a union of the old and the
//! new set. Two proofs:
//!
//! - concurrently (publisher, two consuming instances and a swapper all running): every
//!   delivered message matches the set installed by the ledger event its `routed_by` names,
//!   generations never go backwards along the log, and every message left undelivered is one
//!   that a set possibly in effect for it does not match (exactly the set, wherever the
//!   deliveries around it agree on the generation);
//! - step by step (one log position per routing step, swaps between steps, publisher
//!   concurrent): the generation of every position is known, and the delivered positions are
//!   exactly those whose subject that generation's set matches, each stamped with it.
//!
//! The sets are chosen so that every swap has subjects only the old set matches and subjects
//! only the new set matches, and both kinds are checked to land only in their own generation.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wharf::domain::matcher::filter_matches;
use wharf::domain::{BindingMatcher, BindingSet, DeclarationEvent, DeclarerId, GroupName};
use wharf::domain::{RegisterOutcome, TopicName};
use wharf::store::Store;
use wharf::{Registration, Wharf};
use wharf_queue::{AckOutcome, Queue, QueueSettings};
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

async fn swaps_mid_stream_route_by_exactly_one_set(backend: Backend) {
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
        .map(|me| {
            let (queue, delivered, stop) =
                (queue.clone(), delivered.clone(), stop_consuming.clone());
            tokio::spawn(async move {
                let name = format!("consumer-{me}");
                let start = Instant::now();
                let mut sets = BTreeMap::new();
                loop {
                    assert!(start.elapsed() < DEADLINE, "{name} timed out");
                    let batch = queue.fetch(&group(), &name, 10).await.unwrap();
                    if batch.is_empty() {
                        if stop.load(Ordering::SeqCst) {
                            return;
                        }
                        tokio::task::yield_now().await;
                        continue;
                    }
                    for c in batch {
                        // Soundness as it happens, so a routing fault fails at once.
                        if !sets.contains_key(&c.routed_by) {
                            sets = installed_sets(queue.store()).await;
                        }
                        let set = &sets[&c.routed_by];
                        assert!(
                            wants(set, &c.subject),
                            "position {} ({}) delivered under set {set}",
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
        })
        .collect();

    // Each swap waits until the set in effect has routed two full rounds of the subjects: its
    // deliveries span that many positions, and every position between two deliveries of one
    // generation was routed by it too (routing only moves forward).
    let mut generations = vec![first];
    for k in 0..=SWAPS {
        let gen = *generations.last().unwrap();
        let span = 2 * SUBJECTS.len() as i64;
        wait_until(
            &format!("set {k} routes two rounds of subjects"),
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
                || (s.routed_lag == 0 && s.claimable + s.in_flight + s.backing_off == 0)
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
        assert!(
            by_position.insert(p, d).is_none(),
            "position {p} delivered twice"
        );
    }

    // Soundness: each delivery matches the set its generation installed.
    for d in by_position.values() {
        let set = sets
            .get(&d.routed_by)
            .unwrap_or_else(|| panic!("routed_by {} is no install of the group", d.routed_by));
        assert_eq!(d.subject, log[&d.position]);
        assert!(
            wants(set, &d.subject),
            "position {} ({}) was routed by {} whose set {set} does not match it",
            d.position,
            d.subject,
            d.routed_by
        );
    }
    // Routing moves forward through the log, so generations never go back.
    let stamps: Vec<(i64, i64)> = by_position
        .values()
        .map(|d| (d.position, d.routed_by))
        .collect();
    for w in stamps.windows(2) {
        assert!(
            w[0].1 <= w[1].1,
            "position {} routed by {} after position {} routed by {}",
            w[1].0,
            w[1].1,
            w[0].0,
            w[0].1
        );
    }
    let used: BTreeSet<i64> = stamps.iter().map(|(_, g)| *g).collect();
    assert_eq!(used.len(), SWAPS + 1, "every generation routed deliveries");

    // Completeness: an undelivered position was routed by a generation between those of the
    // deliveries around it; some generation in that range must not match it. Where both
    // neighbours agree, that is the one set that was in effect.
    let mut exact = 0usize;
    for (&position, subject) in &log {
        if by_position.contains_key(&position) {
            continue;
        }
        let low = by_position
            .range(..position)
            .next_back()
            .map_or(first, |(_, d)| d.routed_by);
        let high = by_position
            .range(position..)
            .next()
            .map_or(*generations.last().unwrap(), |(_, d)| d.routed_by);
        if low == high {
            exact += 1;
        }
        let possible: Vec<(&i64, &BindingSet)> = sets.range(low..=high).collect();
        assert!(
            possible.iter().any(|(_, set)| !wants(set, subject)),
            "position {position} ({subject}) was not delivered, yet every set that can have \
             routed it matches it: {possible:?}"
        );
    }
    assert!(
        exact > 0,
        "some undelivered positions were pinned to one generation"
    );

    // No union at any swap: under each new set, subjects only it matches were delivered, and
    // subjects only its predecessor matches were passed over (wherever the generation is
    // pinned by deliveries on both sides).
    for pair in generations.windows(2) {
        let (old, new) = (&sets[&pair[0]], &sets[&pair[1]]);
        let under_new: Vec<(i64, &str)> = log
            .iter()
            .filter(|(p, _)| {
                let low = by_position.range(..=**p).next_back();
                let high = by_position.range(**p..).next();
                matches!((low, high), (Some((_, l)), Some((_, h))) if l.routed_by == pair[1] && h.routed_by == pair[1])
            })
            .map(|(p, s)| (*p, s.as_str()))
            .collect();
        let new_only: Vec<_> = under_new
            .iter()
            .filter(|(_, s)| wants(new, s) && !wants(old, s))
            .collect();
        let old_only: Vec<_> = under_new
            .iter()
            .filter(|(_, s)| wants(old, s) && !wants(new, s))
            .collect();
        assert!(
            !new_only.is_empty() && !old_only.is_empty(),
            "swap {pair:?} saw both kinds"
        );
        for (p, s) in new_only {
            assert!(
                by_position.contains_key(p),
                "{p} ({s}) only the new set matches"
            );
        }
        for (p, s) in old_only {
            assert!(
                !by_position.contains_key(p),
                "{p} ({s}) only the old set matches"
            );
        }
    }
}
on_both_backends!(concurrent_swaps, swaps_mid_stream_route_by_exactly_one_set);

// ---------------------------------------------------------------------------------------------

const PER_GENERATION: usize = 40;

async fn stepwise_swaps_deliver_exactly_the_matches_of_each_generation(backend: Backend) {
    oracle_agrees();
    let store = TestStore::new(backend).await;
    let wharf = store.wharf();
    let queue = Queue::new(store.store.clone(), settings(1));
    let mut generation = install(&wharf, 0).await;
    let total = PER_GENERATION * SETS.len();

    // The stream is published while routing runs; routing waits for it where it catches up.
    let publisher = {
        let queue = queue.clone();
        tokio::spawn(async move {
            for chunk in 0..total / 4 {
                let batch: Vec<_> = (0..4)
                    .map(|k| msg(SUBJECTS[(chunk * 4 + k) % SUBJECTS.len()]))
                    .collect();
                queue.publish(&topic(), &batch).await.unwrap();
            }
        })
    };

    // One position per routing step; a swap happens only between steps, so the generation of
    // every position is the one installed last before its step.
    let mut routed_under: BTreeMap<i64, i64> = BTreeMap::new();
    let start = Instant::now();
    let mut cursor = 0;
    let mut installs = 1;
    while routed_under.len() < total {
        let k = routed_under.len() / PER_GENERATION;
        if k >= installs {
            generation = install(&wharf, k).await;
            installs += 1;
        }
        let report = queue.route(&group()).await.unwrap();
        assert!(!report.busy, "nobody else routes this group");
        match report.scanned {
            0 => {
                assert_eq!(report.position, cursor);
                assert!(start.elapsed() < DEADLINE, "the publisher stalled");
                tokio::task::yield_now().await;
            }
            1 => {
                assert_eq!(
                    report.position,
                    cursor + 1,
                    "one position per step, in order"
                );
                cursor = report.position;
                routed_under.insert(cursor, generation);
            }
            n => panic!("a step of batch 1 scanned {n} positions"),
        }
    }
    publisher.await.unwrap();
    assert_eq!(queue.route(&group()).await.unwrap().scanned, 0);

    let sets = installed_sets(&store.store).await;
    assert_eq!(sets.len(), SETS.len());
    let log = log_rows(&store.store).await;
    assert_eq!(log.len(), total);
    let claimed = queue.claim(&group(), "reader", 10_000).await.unwrap();
    assert!(queue
        .claim(&group(), "reader", 10_000)
        .await
        .unwrap()
        .is_empty());
    let delivered: BTreeMap<i64, i64> = claimed.iter().map(|c| (c.position, c.routed_by)).collect();
    assert_eq!(delivered.len(), claimed.len(), "each position once");

    let expected: BTreeMap<i64, i64> = routed_under
        .iter()
        .filter(|(p, g)| wants(&sets[g], &log[p]))
        .map(|(p, g)| (*p, *g))
        .collect();
    assert_eq!(
        delivered, expected,
        "delivered exactly the positions their generation's set matches, stamped with it"
    );

    // Spelled out for each swap: subjects only the old set matches are not delivered once the
    // new set is in effect, subjects only the new set matches are, and vice versa before it.
    let gens: Vec<i64> = sets.keys().copied().collect();
    for pair in gens.windows(2) {
        let (old, new) = (&sets[&pair[0]], &sets[&pair[1]]);
        let mut seen = [0usize; 4];
        for (p, g) in &routed_under {
            let subject = &log[p];
            let (in_old, in_new) = (wants(old, subject), wants(new, subject));
            if in_old == in_new {
                continue;
            }
            let under_new = *g == pair[1];
            let under_old = *g == pair[0];
            if !(under_new || under_old) {
                continue;
            }
            let got = delivered.contains_key(p);
            match (under_old, in_old) {
                (true, true) => {
                    assert!(got, "{p} {subject}: old-only subject under the old set");
                    seen[0] += 1;
                }
                (true, false) => {
                    assert!(!got, "{p} {subject}: new-only subject under the old set");
                    seen[1] += 1;
                }
                (false, true) => {
                    assert!(!got, "{p} {subject}: old-only subject under the new set");
                    seen[2] += 1;
                }
                (false, false) => {
                    assert!(got, "{p} {subject}: new-only subject under the new set");
                    seen[3] += 1;
                }
            }
        }
        assert!(
            seen.iter().all(|n| *n > 0),
            "swap {pair:?} exercised every case: {seen:?}"
        );
    }
}
on_both_backends!(
    stepwise_swaps,
    stepwise_swaps_deliver_exactly_the_matches_of_each_generation
);
