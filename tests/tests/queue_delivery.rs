//! Delivery through the message log on real stores, both backends:
//!
//! - four instances of one group competing for 400 matching messages (published while they
//!   consume) settle each of them exactly once, no message is ever held by two instances at
//!   once, and no unmatched subject is handed out;
//! - two groups on one topic each receive exactly the messages their own set matches;
//! - an instance that dies holding claims loses them after the visibility timeout: another
//!   instance gets them on a second attempt, and the dead instance's late ack or nack changes
//!   nothing;
//! - nacks back off (not claimable before `visible_at`, claimable after, doubling), a message
//!   dead-letters after max attempts (by nacks, or by claims left to expire) with its attempts
//!   and last error, and a replay puts it back with fresh attempts;
//! - a publish is validated as a whole (the bad message is named, nothing is written), and
//!   positions are gapless per topic, one per message, independent across topics, also under
//!   concurrent publishers;
//! - a group receives only what is published after it is first declared, and a whole-topic
//!   group (no bindings) receives every subject, `$`-prefixed ones included;
//! - the group figures (routed lag, claimable, in flight, backing off, dead letters, oldest
//!   unacked) move as the queue does (the reads that carry them: `carried_figures.rs`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use wharf::domain::matcher::filter_matches;
use wharf::domain::{GroupName, TopicFilter, TopicName};
use wharf::store::Store;
use wharf_queue::{
    validate_batch, AckOutcome, Claimed, Headers, NackOutcome, OutgoingMessage, Queue, QueueError,
    QueueSettings,
};
use wharf_tests::fixtures::{bury_next, declare, group, msg, topic};
use wharf_tests::{on_both_backends, wait_until, Backend, TestStore};

const DEADLINE: Duration = Duration::from_secs(60);

/// Short claim timings, as the brief asks; tests that need a longer window say why.
fn fast() -> QueueSettings {
    QueueSettings {
        visibility_timeout: Duration::from_millis(300),
        max_attempts: 5,
        backoff_base: Duration::from_millis(10),
        backoff_max: Duration::from_secs(1),
        route_batch: 50,
    }
}

/// The reference answer: does the set (empty = whole topic) want `subject`? Uses the plain
/// one-filter comparison, not the trie the router uses.
fn wants(patterns: &[&str], subject: &str) -> bool {
    patterns.is_empty()
        || patterns
            .iter()
            .any(|p| filter_matches(&TopicFilter::parse("pattern", p).unwrap(), subject))
}

/// Fetches (routing as it goes) until the group has routed the whole log and nothing more is
/// claimable; returns everything claimed, unacked.
async fn drain(queue: &Queue, group: &GroupName, instance: &str) -> Vec<Claimed> {
    let start = Instant::now();
    let mut all = Vec::new();
    loop {
        let batch = queue.fetch(group, instance, 100).await.unwrap();
        if batch.is_empty() {
            let stats = queue.group_stats(Some(group)).await.unwrap();
            if stats[0].routed_lag == 0 && stats[0].claimable == 0 {
                return all;
            }
        }
        all.extend(batch);
        assert!(start.elapsed() < DEADLINE, "draining {group} timed out");
    }
}

/// Every (position, subject) of a topic's log, in position order, read from the store.
async fn log_rows(store: &Store, topic: &str) -> Vec<(i64, String)> {
    let topic = topic.to_owned();
    match store {
        Store::Sqlite(s) => s
            .read(move |conn| {
                let mut stmt = conn.prepare(
                    "SELECT position, subject FROM message WHERE topic = ?1 ORDER BY position",
                )?;
                let rows = stmt
                    .query_map([topic], |row| Ok((row.get(0)?, row.get(1)?)))?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
            .unwrap(),
        Store::Postgres(s) => sqlx::query_as(
            "SELECT position, subject FROM message WHERE topic = $1 ORDER BY position",
        )
        .bind(topic)
        .fetch_all(s.pool())
        .await
        .unwrap(),
    }
}

/// (head, size) of a topic, or None when it was never published to.
async fn topic_figures(queue: &Queue, name: &str) -> Option<(i64, i64)> {
    queue
        .topic_stats()
        .await
        .unwrap()
        .into_iter()
        .find(|t| t.topic == name)
        .map(|t| (t.head, t.size))
}

// ---------------------------------------------------------------------------------------------

const INSTANCES: usize = 4;
const MATCHING: usize = 400;

/// One claim an instance saw, and what its ack did.
#[derive(Debug)]
struct Settled {
    position: i64,
    subject: String,
    instance: usize,
    attempts: i32,
    claimed_at: Instant,
    acked_at: Instant,
    outcome: AckOutcome,
}

async fn competing_instances_settle_each_message_once(backend: Backend) {
    let store = TestStore::new(backend).await;
    declare(&store, "workers", "jobs", &["jobs/+/run"]).await;
    // A long visibility timeout: within it, a second holder of a message can only be a bug
    // (redelivery after expiry is covered by its own test below).
    let queue = Queue::new(
        store.store.clone(),
        QueueSettings {
            visibility_timeout: Duration::from_secs(60),
            ..fast()
        },
    );
    let workers = group("workers");
    let jobs = topic("jobs");

    // Publishing runs beside the instances: 400 matching subjects interleaved with 400 that
    // only look alike.
    let publisher = {
        let (queue, jobs) = (queue.clone(), jobs.clone());
        tokio::spawn(async move {
            let mut expected = BTreeSet::new();
            for chunk in 0..(MATCHING / 10) {
                let mut batch = Vec::new();
                for k in 0..10 {
                    let i = chunk * 10 + k;
                    let matching = format!("jobs/{i}/run");
                    expected.insert(matching.clone());
                    batch.push(msg(&matching));
                    let decoy = match i % 4 {
                        0 => format!("jobs/{i}/skip"),
                        1 => format!("other/{i}/run"),
                        2 => format!("jobs/{i}/run/extra"),
                        _ => format!("jobs/{i}"),
                    };
                    batch.push(msg(&decoy));
                }
                queue.publish(&jobs, &batch).await.unwrap();
            }
            expected
        })
    };

    let acked = Arc::new(AtomicUsize::new(0));
    let holders: Arc<Mutex<HashMap<i64, usize>>> = Arc::default();
    let settled: Arc<Mutex<Vec<Settled>>> = Arc::default();
    let instances: Vec<_> = (0..INSTANCES)
        .map(|me| {
            let (queue, workers) = (queue.clone(), workers.clone());
            let (acked, holders, settled) = (acked.clone(), holders.clone(), settled.clone());
            tokio::spawn(async move {
                let name = format!("instance-{me}");
                let start = Instant::now();
                while acked.load(Ordering::SeqCst) < MATCHING {
                    assert!(start.elapsed() < DEADLINE, "{name} timed out");
                    let batch = queue.fetch(&workers, &name, 5).await.unwrap();
                    if batch.is_empty() {
                        tokio::task::yield_now().await;
                        continue;
                    }
                    let claimed_at = Instant::now();
                    {
                        let mut holders = holders.lock().unwrap();
                        for c in &batch {
                            if let Some(other) = holders.insert(c.position, me) {
                                panic!(
                                    "position {} claimed by instance {me} while instance {other} \
                                     still holds it",
                                    c.position
                                );
                            }
                        }
                    }
                    for c in batch {
                        let held_by = holders.lock().unwrap().remove(&c.position);
                        assert_eq!(held_by, Some(me), "position {} changed holder", c.position);
                        let outcome = queue.ack(&c).await.unwrap();
                        if outcome == AckOutcome::Acked {
                            acked.fetch_add(1, Ordering::SeqCst);
                        }
                        settled.lock().unwrap().push(Settled {
                            position: c.position,
                            subject: c.subject,
                            instance: me,
                            attempts: c.attempts,
                            claimed_at,
                            acked_at: Instant::now(),
                            outcome,
                        });
                    }
                }
            })
        })
        .collect();
    let expected = publisher.await.unwrap();
    for instance in instances {
        instance.await.unwrap();
    }

    let settled = std::mem::take(&mut *settled.lock().unwrap());
    let acked_ok: Vec<&Settled> = settled
        .iter()
        .filter(|s| s.outcome == AckOutcome::Acked)
        .collect();
    assert_eq!(acked_ok.len(), MATCHING, "acks that settled a message");
    let mut per_position: BTreeMap<i64, usize> = BTreeMap::new();
    for s in &acked_ok {
        *per_position.entry(s.position).or_default() += 1;
    }
    let twice: Vec<_> = per_position.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "positions acked twice: {twice:?}");
    let subjects: BTreeSet<String> = settled.iter().map(|s| s.subject.clone()).collect();
    assert_eq!(
        subjects, expected,
        "exactly the matching subjects were delivered, no decoy"
    );
    // Within the visibility timeout nothing is redelivered: one claim per message, on its
    // first attempt, and every ack came after its claim.
    assert_eq!(settled.len(), MATCHING, "claims handed out");
    assert!(settled.iter().all(|s| s.attempts == 1));
    assert!(settled.iter().all(|s| s.acked_at >= s.claimed_at));
    let busy: BTreeSet<usize> = settled.iter().map(|s| s.instance).collect();
    assert!(
        busy.len() >= 2,
        "the instances competed: work went to {busy:?}"
    );
    assert!(holders.lock().unwrap().is_empty());

    assert!(drain(&queue, &workers, "late").await.is_empty());
    let stats = &queue.group_stats(Some(&workers)).await.unwrap()[0];
    assert_eq!(stats.routed_lag, 0);
    assert_eq!((stats.claimable, stats.in_flight), (0, 0));
    assert_eq!(stats.oldest_unacked_seconds, None);
}
on_both_backends!(
    competing_instances,
    competing_instances_settle_each_message_once
);

// ---------------------------------------------------------------------------------------------

async fn two_groups_each_get_their_own_matches(backend: Backend) {
    let store = TestStore::new(backend).await;
    let eu: &[&str] = &["orders/eu/#"];
    let paid: &[&str] = &["orders/+/paid", "refunds/#"];
    declare(&store, "eu", "orders", eu).await;
    declare(&store, "paid", "orders", paid).await;
    declare(&store, "elsewhere", "returns", &[]).await;
    let queue = Queue::new(store.store.clone(), fast());
    let subjects = [
        "orders/eu/paid",
        "orders/eu/new",
        "orders/us/paid",
        "orders/eu",
        "refunds/x/y",
        "refunds",
        "orders/us/new",
        "orders//paid",
        "orders/eu/paid/late",
        "misc",
    ];
    // Several batches, so routing crosses batch boundaries.
    for chunk in subjects.chunks(3) {
        let batch: Vec<_> = chunk.iter().map(|s| msg(s)).collect();
        queue.publish(&topic("orders"), &batch).await.unwrap();
    }
    let by_position: BTreeMap<i64, &str> = (1..).zip(subjects).collect();
    for (name, set) in [("eu", eu), ("paid", paid)] {
        let claimed = drain(&queue, &group(name), "i").await;
        let got: BTreeSet<i64> = claimed.iter().map(|c| c.position).collect();
        let want: BTreeSet<i64> = by_position
            .iter()
            .filter(|(_, s)| wants(set, s))
            .map(|(p, _)| *p)
            .collect();
        assert_eq!(got, want, "group {name} gets exactly what {set:?} matches");
        assert_eq!(claimed.len(), want.len(), "group {name}: each once");
        for c in &claimed {
            assert_eq!(c.subject, by_position[&c.position]);
            assert_eq!(c.payload, c.subject.as_bytes());
            assert_eq!((c.group.as_str(), c.topic.as_str()), (name, "orders"));
            assert_eq!(queue.ack(c).await.unwrap(), AckOutcome::Acked);
        }
    }
    assert!(drain(&queue, &group("elsewhere"), "i").await.is_empty());
}
on_both_backends!(two_groups, two_groups_each_get_their_own_matches);

// ---------------------------------------------------------------------------------------------

async fn a_dead_instance_loses_its_claims(backend: Backend) {
    let store = TestStore::new(backend).await;
    declare(&store, "g", "t", &["t/#"]).await;
    let settings = fast();
    let queue = Queue::new(store.store.clone(), settings);
    let g = group("g");
    let batch: Vec<_> = (1..=5).map(|i| msg(&format!("t/{i}"))).collect();
    queue.publish(&topic("t"), &batch).await.unwrap();

    let before_claim = store.store.now().await.unwrap();
    let doomed = queue.fetch(&g, "doomed", 10).await.unwrap();
    assert_eq!(doomed.len(), 5);
    assert!(doomed.iter().all(|c| c.attempts == 1));
    let early = queue.claim(&g, "survivor", 10).await.unwrap();
    let after_early = store.store.now().await.unwrap();
    let timeout = chrono::Duration::from_std(settings.visibility_timeout).unwrap();
    if after_early < before_claim + timeout {
        // By the store's clock the second claim ran inside the first claim's window.
        assert!(
            early.is_empty(),
            "claims held within the timeout were handed out again"
        );
    }

    // The doomed instance never acks. After the timeout the survivor gets every message.
    let taken: Arc<Mutex<Vec<Claimed>>> = Arc::default();
    wait_until("the survivor re-claims all five", DEADLINE, || {
        let (queue, g, taken) = (queue.clone(), g.clone(), taken.clone());
        async move {
            let got = queue.claim(&g, "survivor", 10).await.unwrap();
            let mut taken = taken.lock().unwrap();
            taken.extend(got);
            taken.len() >= 5
        }
    })
    .await;
    let taken = std::mem::take(&mut *taken.lock().unwrap());
    let positions = |v: &[Claimed]| v.iter().map(|c| c.position).collect::<Vec<_>>();
    assert_eq!(positions(&taken), positions(&doomed));
    assert!(taken.iter().all(|c| c.attempts == 2), "{taken:?}");
    assert!(taken.iter().all(|c| c.claim_token != doomed[0].claim_token));

    // The dead instance comes back and settles what it no longer holds: nothing changes.
    for c in &doomed[..3] {
        assert_eq!(queue.ack(c).await.unwrap(), AckOutcome::ClaimLost);
    }
    for c in &doomed[3..] {
        assert_eq!(queue.nack(c, "late").await.unwrap(), NackOutcome::ClaimLost);
    }
    for c in &taken {
        assert_eq!(
            queue.ack(c).await.unwrap(),
            AckOutcome::Acked,
            "the survivor's claim on {} survived the late settle",
            c.position
        );
    }
    let stats = &queue.group_stats(Some(&g)).await.unwrap()[0];
    assert_eq!(
        (stats.claimable, stats.in_flight, stats.backing_off),
        (0, 0, 0)
    );
    assert_eq!(stats.dead_letters, 0);
}
on_both_backends!(dead_instance, a_dead_instance_loses_its_claims);

// ---------------------------------------------------------------------------------------------

/// Polls claims of one message until it is handed out, checking each poll against the store's
/// clock: a claim that came back empty ran before `visible_at`, one that returned the message
/// ran at or after it.
async fn claim_after(
    store: &Store,
    queue: &Queue,
    g: &GroupName,
    position: i64,
    visible_at: DateTime<Utc>,
) -> Claimed {
    // SQLite keeps microseconds; allow for the truncation.
    let slack = chrono::Duration::microseconds(1);
    let start = Instant::now();
    loop {
        let before = store.now().await.unwrap();
        let mut got = queue.claim(g, "retrier", 1).await.unwrap();
        let after = store.now().await.unwrap();
        match got.pop() {
            Some(c) => {
                assert_eq!(c.position, position);
                assert!(
                    after + slack >= visible_at,
                    "claimed by {after}, before its visible_at {visible_at}"
                );
                return c;
            }
            None => {
                assert!(
                    before < visible_at + slack,
                    "not claimable at {before}, though visible since {visible_at}"
                );
            }
        }
        assert!(
            start.elapsed() < DEADLINE,
            "message {position} never came back"
        );
        tokio::task::yield_now().await;
    }
}

async fn nacks_back_off_then_dead_letter_and_replay(backend: Backend) {
    let store = TestStore::new(backend).await;
    declare(&store, "g", "t", &["job/+"]).await;
    let settings = QueueSettings {
        max_attempts: 3,
        ..fast()
    };
    let queue = Queue::new(store.store.clone(), settings);
    let g = group("g");
    let headers = Headers::from([("trace".to_owned(), "abc".to_owned())]);
    let job = OutgoingMessage::new("job/1", b"work".to_vec(), headers.clone()).unwrap();
    let position = queue.publish_one(&topic("t"), job).await.unwrap();

    let mut claim = queue.fetch(&g, "first", 1).await.unwrap().pop().unwrap();
    let slack = chrono::Duration::milliseconds(1);
    for attempt in 1..=3 {
        assert_eq!(claim.attempts, attempt);
        let before = store.store.now().await.unwrap();
        let outcome = queue
            .nack(&claim, &format!("failure {attempt}"))
            .await
            .unwrap();
        let after = store.store.now().await.unwrap();
        if attempt == 3 {
            assert_eq!(outcome, NackOutcome::DeadLettered);
            break;
        }
        let NackOutcome::Retrying { visible_at } = outcome else {
            panic!("attempt {attempt}: expected a retry, got {outcome:?}");
        };
        // base x 2^(attempt-1): 10 ms, then 20 ms.
        let backoff = chrono::Duration::from_std(settings.backoff(attempt)).unwrap();
        assert_eq!(backoff, chrono::Duration::milliseconds(10 << (attempt - 1)));
        assert!(visible_at + slack >= before + backoff, "attempt {attempt}");
        assert!(visible_at <= after + backoff + slack, "attempt {attempt}");
        claim = claim_after(&store.store, &queue, &g, position, visible_at).await;
    }
    assert!(queue.claim(&g, "any", 10).await.unwrap().is_empty());
    let dead = queue.dead_letters(&g, 0, 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    let letter = &dead[0];
    assert_eq!(letter.position, position);
    assert_eq!((letter.group.as_str(), letter.topic.as_str()), ("g", "t"));
    assert_eq!(letter.subject, "job/1");
    assert_eq!(letter.payload, b"work");
    assert_eq!(letter.headers, headers);
    assert_eq!(letter.published_at, claim.published_at);
    assert_eq!(letter.attempts, 3);
    assert_eq!(letter.last_error.as_deref(), Some("failure 3"));
    assert!(queue
        .dead_letters(&g, position, 10)
        .await
        .unwrap()
        .is_empty());
    let stats = &queue.group_stats(Some(&g)).await.unwrap()[0];
    assert_eq!(stats.dead_letters, 1);
    assert_eq!(
        (stats.claimable, stats.in_flight, stats.backing_off),
        (0, 0, 0)
    );

    assert!(!queue.replay_dead_letter(&g, position + 100).await.unwrap());
    assert!(queue.replay_dead_letter(&g, position).await.unwrap());
    assert!(
        !queue.replay_dead_letter(&g, position).await.unwrap(),
        "a replayed letter is gone from the dead letters"
    );
    let replayed = queue.claim(&g, "again", 10).await.unwrap();
    assert_eq!(replayed.len(), 1);
    assert_eq!(replayed[0].position, position);
    assert_eq!(replayed[0].attempts, 1, "attempts restart on replay");
    assert_eq!(replayed[0].payload, b"work");
    assert_eq!(replayed[0].headers, headers);
    let stats = &queue.group_stats(Some(&g)).await.unwrap()[0];
    assert_eq!(stats.dead_letters, 0);
    assert_eq!(queue.ack(&replayed[0]).await.unwrap(), AckOutcome::Acked);

    // A backoff long enough to observe: right after the nack the message is not claimable,
    // and it comes back once visible_at has passed.
    let slow = Queue::new(
        store.store.clone(),
        QueueSettings {
            backoff_base: Duration::from_millis(500),
            ..settings
        },
    );
    let second = slow.publish_one(&topic("t"), msg("job/2")).await.unwrap();
    let claim = slow.fetch(&g, "first", 1).await.unwrap().pop().unwrap();
    assert_eq!(claim.position, second);
    let NackOutcome::Retrying { visible_at } = slow.nack(&claim, "not yet").await.unwrap() else {
        panic!("expected a retry");
    };
    let stats = slow.group_stats(Some(&g)).await.unwrap().remove(0);
    if store.store.now().await.unwrap() < visible_at {
        assert_eq!((stats.backing_off, stats.claimable), (1, 0));
    }
    // The first poll runs right after the nack, well inside the 500 ms backoff: it must come
    // back empty (claim_after checks each poll against visible_at).
    let back = claim_after(&store.store, &slow, &g, second, visible_at).await;
    assert_eq!(back.attempts, 2);
    assert_eq!(slow.ack(&back).await.unwrap(), AckOutcome::Acked);
}
on_both_backends!(
    nack_backoff_and_dead_letters,
    nacks_back_off_then_dead_letter_and_replay
);

async fn expired_claims_dead_letter_after_max_attempts(backend: Backend) {
    let store = TestStore::new(backend).await;
    declare(&store, "g", "t", &["job/+"]).await;
    let settings = QueueSettings {
        max_attempts: 3,
        ..fast()
    };
    let queue = Queue::new(store.store.clone(), settings);
    let g = group("g");
    let position = queue
        .publish_one(&topic("t"), msg("job/expiring"))
        .await
        .unwrap();
    let first = queue.fetch(&g, "i", 1).await.unwrap();
    assert_eq!(first[0].attempts, 1);
    // Never settled: each claim lapses and the message is claimed again, up to max attempts.
    let handed_out: Arc<Mutex<Vec<i32>>> = Arc::new(Mutex::new(vec![1]));
    wait_until("the message dead-letters", DEADLINE, || {
        let (queue, g, handed_out) = (queue.clone(), g.clone(), handed_out.clone());
        async move {
            let got = queue.claim(&g, "i", 1).await.unwrap();
            handed_out
                .lock()
                .unwrap()
                .extend(got.iter().map(|c| c.attempts));
            !queue.dead_letters(&g, 0, 10).await.unwrap().is_empty()
        }
    })
    .await;
    assert_eq!(
        *handed_out.lock().unwrap(),
        vec![1, 2, 3],
        "handed out exactly max_attempts times"
    );
    let dead = queue.dead_letters(&g, 0, 10).await.unwrap();
    assert_eq!(dead[0].position, position);
    let why = dead[0].last_error.as_deref().unwrap_or_default();
    assert!(
        why.contains("expired"),
        "never nacked, so the expiry is the reason: {why:?}"
    );
    assert_eq!(
        dead[0].attempts, 3,
        "a dead letter records how many times the message was claimed"
    );
    let stats = &queue.group_stats(Some(&g)).await.unwrap()[0];
    assert_eq!(
        (stats.claimable, stats.in_flight, stats.dead_letters),
        (0, 0, 1)
    );
}
on_both_backends!(
    expired_claims_dead_letter,
    expired_claims_dead_letter_after_max_attempts
);

// ---------------------------------------------------------------------------------------------

/// The publish edge: validate the raw batch, then publish it.
async fn publish_raw(
    queue: &Queue,
    topic: &TopicName,
    raw: Vec<(String, Vec<u8>, Headers)>,
) -> Result<Vec<i64>, QueueError> {
    let batch = validate_batch(raw)?;
    queue.publish(topic, &batch).await
}

fn raw(subject: &str) -> (String, Vec<u8>, Headers) {
    (subject.to_owned(), b"p".to_vec(), Headers::new())
}

fn invalid_field(result: Result<Vec<i64>, QueueError>) -> (String, String) {
    match result {
        Err(QueueError::Invalid(e)) => (e.field, e.value),
        other => panic!("expected a validation error, got {other:?}"),
    }
}

async fn publish_validates_whole_batches_and_numbers_per_topic(backend: Backend) {
    let store = TestStore::new(backend).await;
    let queue = Queue::new(store.store.clone(), fast());
    let (ta, tb) = (topic("ta"), topic("tb"));
    assert_eq!(
        queue
            .publish(&ta, &[msg("x/1"), msg("x/2"), msg("x/3")])
            .await
            .unwrap(),
        vec![1, 2, 3]
    );

    let bad_subject = vec![raw("x/4"), raw("x/5"), raw("a/#"), raw("x/6")];
    assert_eq!(
        invalid_field(publish_raw(&queue, &ta, bad_subject).await),
        ("messages[2].subject".to_owned(), "a/#".to_owned())
    );
    let plus = vec![raw("a/+")];
    assert_eq!(
        invalid_field(publish_raw(&queue, &ta, plus).await).0,
        "messages[0].subject"
    );
    let big = vec![
        raw("x/7"),
        (
            "x/8".to_owned(),
            vec![0u8; wharf_queue::message::MAX_PAYLOAD_BYTES + 1],
            Headers::new(),
        ),
    ];
    assert_eq!(
        invalid_field(publish_raw(&queue, &ta, big).await).0,
        "messages[1].payload"
    );
    let bad_header = vec![
        raw("x/9"),
        raw("x/10"),
        (
            "x/11".to_owned(),
            b"p".to_vec(),
            Headers::from([(String::new(), "v".to_owned())]),
        ),
    ];
    assert_eq!(
        invalid_field(publish_raw(&queue, &ta, bad_header).await).0,
        "messages[2].headers[]"
    );
    assert_eq!(
        invalid_field(publish_raw(&queue, &tb, Vec::new()).await).0,
        "messages"
    );
    assert_eq!(
        invalid_field(queue.publish(&tb, &[]).await.map(|_| Vec::new())).0,
        "messages"
    );
    let too_many = vec![msg("x/y"); wharf_queue::message::MAX_BATCH + 1];
    assert_eq!(
        invalid_field(queue.publish(&tb, &too_many).await).0,
        "messages"
    );
    // Nothing of any refused batch was written; the refused topic was never created.
    assert_eq!(topic_figures(&queue, "ta").await, Some((3, 3)));
    assert_eq!(topic_figures(&queue, "tb").await, None);
    let subjects: Vec<String> = log_rows(&store.store, "ta")
        .await
        .into_iter()
        .map(|(_, s)| s)
        .collect();
    assert_eq!(subjects, ["x/1", "x/2", "x/3"]);

    // One position per message, continuing across batches, independent per topic.
    assert_eq!(
        queue.publish(&tb, &[msg("y/1"), msg("y/2")]).await.unwrap(),
        vec![1, 2]
    );
    assert_eq!(
        queue
            .publish(&ta, &[msg("x/4"), msg("x/5"), msg("x/6"), msg("x/7")])
            .await
            .unwrap(),
        vec![4, 5, 6, 7]
    );
    assert_eq!(queue.publish_one(&tb, msg("y/3")).await.unwrap(), 3);
    assert_eq!(topic_figures(&queue, "ta").await, Some((7, 7)));
    assert_eq!(topic_figures(&queue, "tb").await, Some((3, 3)));
}
on_both_backends!(
    publish_validation,
    publish_validates_whole_batches_and_numbers_per_topic
);

async fn concurrent_publishers_get_gapless_positions(backend: Backend) {
    const PUBLISHERS: usize = 6;
    const BATCHES: usize = 15;
    let store = TestStore::new(backend).await;
    let queue = Queue::new(store.store.clone(), fast());
    let barrier = Arc::new(tokio::sync::Barrier::new(PUBLISHERS));
    let tasks: Vec<_> = (0..PUBLISHERS)
        .map(|p| {
            let (queue, barrier) = (queue.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let mut published = Vec::new();
                for b in 0..BATCHES {
                    let name = if (p + b) % 2 == 0 { "pa" } else { "pb" };
                    let size = 1 + (p * 7 + b * 3) % 7;
                    let subjects: Vec<String> =
                        (0..size).map(|k| format!("p{p}/b{b}/m{k}")).collect();
                    let batch: Vec<_> = subjects.iter().map(|s| msg(s)).collect();
                    let positions = queue.publish(&topic(name), &batch).await.unwrap();
                    published.push((name, positions, subjects));
                }
                published
            })
        })
        .collect();
    let mut expected: BTreeMap<&str, BTreeMap<i64, String>> = BTreeMap::new();
    for task in tasks {
        for (name, positions, subjects) in task.await.unwrap() {
            assert_eq!(positions.len(), subjects.len());
            assert!(
                positions.windows(2).all(|w| w[1] == w[0] + 1),
                "a batch's positions are consecutive: {positions:?}"
            );
            let log = expected.entry(name).or_default();
            for (position, subject) in positions.into_iter().zip(subjects) {
                assert!(
                    log.insert(position, subject).is_none(),
                    "position {position} of {name} given twice"
                );
            }
        }
    }
    for (name, log) in &expected {
        let total = log.len() as i64;
        assert_eq!(
            log.keys().copied().collect::<Vec<_>>(),
            (1..=total).collect::<Vec<_>>(),
            "{name}: gapless from 1"
        );
        let stored: BTreeMap<i64, String> =
            log_rows(&store.store, name).await.into_iter().collect();
        assert_eq!(&stored, log, "{name}: each position holds its own message");
        assert_eq!(topic_figures(&queue, name).await, Some((total, total)));
    }
}
on_both_backends!(
    concurrent_publishers,
    concurrent_publishers_get_gapless_positions
);

// ---------------------------------------------------------------------------------------------

async fn groups_start_at_the_head_and_whole_topic_takes_everything(backend: Backend) {
    let store = TestStore::new(backend).await;
    let queue = Queue::new(store.store.clone(), fast());
    let t = topic("t");
    let none: &[&str] = &[];
    declare(&store, "early", "t", &["n/#"]).await;
    declare(&store, "whole", "t", none).await;
    declare(&store, "hash", "t", &["#"]).await;
    let first = ["n/1", "$SYS/up", "n/2", "$x", "other"];
    let batch: Vec<_> = first.iter().map(|s| msg(s)).collect();
    queue.publish(&t, &batch).await.unwrap();

    declare(&store, "late", "t", &["n/#"]).await;
    let late_stats = &queue.group_stats(Some(&group("late"))).await.unwrap()[0];
    assert_eq!(
        (late_stats.routed_position, late_stats.routed_lag),
        (5, 0),
        "a new group's cursor starts at the topic head"
    );
    let second = ["n/3", "$SYS/down", "n/4"];
    let batch: Vec<_> = second.iter().map(|s| msg(s)).collect();
    queue.publish(&t, &batch).await.unwrap();

    let subjects =
        |claimed: Vec<Claimed>| -> Vec<String> { claimed.into_iter().map(|c| c.subject).collect() };
    assert_eq!(
        subjects(drain(&queue, &group("late"), "i").await),
        ["n/3", "n/4"],
        "the late group receives only what was published after it was declared"
    );
    assert_eq!(
        subjects(drain(&queue, &group("early"), "i").await),
        ["n/1", "n/2", "n/3", "n/4"]
    );
    let all: Vec<&str> = first.iter().chain(second.iter()).copied().collect();
    assert_eq!(
        subjects(drain(&queue, &group("whole"), "i").await),
        all,
        "a group without bindings takes the whole topic, $ subjects included"
    );
    let hash: Vec<&str> = all
        .iter()
        .copied()
        .filter(|s| !s.starts_with('$'))
        .collect();
    assert_eq!(
        subjects(drain(&queue, &group("hash"), "i").await),
        hash,
        "an explicit '#' follows MQTT and skips $ subjects"
    );
    // The oracle agrees with what was delivered.
    for s in &all {
        assert!(wants(none, s));
        assert_eq!(wants(&["#"], s), !s.starts_with('$'));
    }
}
on_both_backends!(
    late_and_whole_topic_groups,
    groups_start_at_the_head_and_whole_topic_takes_everything
);

// ---------------------------------------------------------------------------------------------

async fn group_figures_follow_the_queue(backend: Backend) {
    let store = TestStore::new(backend).await;
    declare(&store, "g", "t", &["s/#"]).await;
    let g = group("g");
    let t = topic("t");
    // Long windows, so "in flight" and "backing off" cannot lapse between two reads.
    let steady = Queue::new(
        store.store.clone(),
        QueueSettings {
            visibility_timeout: Duration::from_secs(60),
            backoff_base: Duration::from_secs(60),
            backoff_max: Duration::from_secs(60),
            max_attempts: 5,
            route_batch: 100,
        },
    );
    let stats = || async { steady.group_stats(Some(&g)).await.unwrap().remove(0) };
    let figures = |s: &wharf_queue::GroupQueueStats| {
        (
            s.routed_lag,
            s.claimable,
            s.in_flight,
            s.backing_off,
            s.dead_letters,
        )
    };
    let s = stats().await;
    assert_eq!((s.group.as_str(), s.topic.as_str()), ("g", "t"));
    assert_eq!(s.routed_position, 0);
    assert_eq!(figures(&s), (0, 0, 0, 0, 0));
    assert_eq!(s.oldest_unacked_seconds, None);

    let batch: Vec<_> = ["s/1", "s/2", "x/3", "s/4", "s/5", "s/6"]
        .iter()
        .map(|s| msg(s))
        .collect();
    steady.publish(&t, &batch).await.unwrap();
    let s = stats().await;
    assert_eq!(figures(&s), (6, 0, 0, 0, 0), "nothing routed yet");
    assert_eq!(s.oldest_unacked_seconds, None);

    let report = steady.route(&g).await.unwrap();
    assert_eq!((report.scanned, report.routed, report.position), (6, 5, 6));
    let s = stats().await;
    assert_eq!(s.routed_position, 6);
    assert_eq!(figures(&s), (0, 5, 0, 0, 0));
    let first_age = s.oldest_unacked_seconds.expect("an unacked message");
    assert!(first_age >= 0.0);

    let held = steady.claim(&g, "i", 2).await.unwrap();
    assert_eq!(held.len(), 2);
    assert_eq!(figures(&stats().await), (0, 3, 2, 0, 0));
    let NackOutcome::Retrying { .. } = steady.nack(&held[0], "later").await.unwrap() else {
        panic!("expected a retry");
    };
    assert_eq!(figures(&stats().await), (0, 3, 1, 1, 0));
    assert_eq!(steady.ack(&held[1]).await.unwrap(), AckOutcome::Acked);
    assert_eq!(figures(&stats().await), (0, 3, 0, 1, 0));

    // A claim that lapses counts as claimable again.
    let lapsing = Queue::new(store.store.clone(), fast());
    let short = lapsing.claim(&g, "j", 1).await.unwrap();
    assert_eq!(short.len(), 1);
    wait_until("the short claim lapses", DEADLINE, || async {
        figures(&stats().await) == (0, 3, 0, 1, 0)
    })
    .await;

    // A dead letter counts once it is buried.
    bury_next(&store, &g).await;
    // Claims go in position order, so the lapsed message comes first: its only attempt was used
    // by the lapsed claim, so it is buried on the way, and the claim takes the next one.
    assert_eq!(figures(&stats().await), (0, 1, 0, 1, 2));

    // The oldest unacked message keeps ageing until it is settled.
    wait_until("the oldest unacked age grows", DEADLINE, || async {
        stats().await.oldest_unacked_seconds.unwrap() > first_age
    })
    .await;
    let rest = steady.claim(&g, "i", 10).await.unwrap();
    assert_eq!(rest.len(), 1);
    for c in &rest {
        assert_eq!(steady.ack(c).await.unwrap(), AckOutcome::Acked);
    }
    assert!(
        stats().await.oldest_unacked_seconds.is_some(),
        "one backing off"
    );
    steady.publish_one(&t, msg("s/7")).await.unwrap();
    assert_eq!(figures(&stats().await), (1, 0, 0, 1, 2));
}
on_both_backends!(group_figures, group_figures_follow_the_queue);

async fn oldest_unacked_is_the_first_delivery_by_position(backend: Backend) {
    let store = TestStore::new(backend).await;
    declare(&store, "g", "t", &["s/#"]).await;
    let (g, t) = (group("g"), topic("t"));
    let queue = Queue::new(
        store.store.clone(),
        QueueSettings {
            visibility_timeout: Duration::from_secs(60),
            ..fast()
        },
    );
    let oldest = || async {
        queue.group_stats(Some(&g)).await.unwrap()[0]
            .oldest_unacked_seconds
            .expect("an unacked message")
    };
    queue.publish_one(&t, msg("s/1")).await.unwrap();
    queue.route(&g).await.unwrap();
    // The second message is published a good while after the first, by the store's clock.
    wait_until("the first message ages", DEADLINE, || async {
        oldest().await > 0.5
    })
    .await;
    queue.publish_one(&t, msg("s/2")).await.unwrap();
    queue.route(&g).await.unwrap();
    let with_first = oldest().await;
    assert!(with_first > 0.5, "the first message's age: {with_first}");

    let first = queue.claim(&g, "i", 1).await.unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(queue.ack(&first[0]).await.unwrap(), AckOutcome::Acked);
    // Now the second message is the oldest unacked one: half a second younger.
    let with_second = oldest().await;
    assert!(
        with_second < with_first - 0.25,
        "after the first is acked: {with_second}, before: {with_first}"
    );
}
on_both_backends!(
    oldest_unacked,
    oldest_unacked_is_the_first_delivery_by_position
);
