//! Log retention on real stores, both backends: it removes messages by age only (ADR 0014:
//! being routed past is not being consumed), never one a live group has not finished, and
//! publishers keep going while it runs.
//!
//! - Before its age limit nothing goes, even once every group has routed past and acked it.
//! - Aged messages go only when no live group (an instance with a fresh heartbeat) needs them:
//!   not routed yet, or waiting in its deliveries; a group with no live instance lets them go,
//!   and its deliveries of them are dropped and counted as orphaned.
//! - A pass over a 20 000-message backlog runs while a publisher and a consumer keep working:
//!   publishes complete during the pass, and every message published is still delivered.
//! - Dead letters are full copies: they outlive the log row, and a replay restores it, also
//!   when the replay lands in the middle of a pass.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wharf::domain::GroupName;
use wharf::store::Store;
use wharf::Registration;
use wharf_queue::{
    AckOutcome, Claimed, Headers, NackOutcome, OutgoingMessage, Queue, QueueSettings,
    RetentionReport,
};
use wharf_tests::fixtures::{declare, group, msg, topic};
use wharf_tests::{on_both_backends, wait_until, Backend, TestStore};

const DEADLINE: Duration = Duration::from_secs(120);
/// Long enough that nothing ages out in the tests that do not want it to.
const HOUR: Duration = Duration::from_secs(3600);
/// How fresh a heartbeat must be for retention to count its group as live.
const LIVE: Duration = Duration::from_secs(5);

/// Claims never lapse here; retention, not redelivery, is under test.
fn settings() -> QueueSettings {
    QueueSettings {
        visibility_timeout: Duration::from_secs(300),
        max_attempts: 5,
        backoff_base: Duration::from_millis(10),
        backoff_max: Duration::from_secs(1),
        route_batch: 3,
    }
}

/// Routes until the group has scanned the whole log.
async fn route_all(queue: &Queue, g: &GroupName) {
    let start = Instant::now();
    while queue.route(g).await.unwrap().scanned > 0 {
        assert!(start.elapsed() < DEADLINE, "routing {g} timed out");
    }
}

/// Claims everything the group has claimable now.
async fn claim_all(queue: &Queue, g: &GroupName) -> Vec<Claimed> {
    queue.claim(g, "claimer", 100_000).await.unwrap()
}

async fn ack_all<'a>(queue: &Queue, claims: impl IntoIterator<Item = &'a Claimed>) {
    for c in claims {
        assert_eq!(
            queue.ack(c).await.unwrap(),
            AckOutcome::Acked,
            "{}",
            c.position
        );
    }
}

/// The positions a topic's log holds, read from the store.
async fn log_positions(store: &Store, topic: &str) -> Vec<i64> {
    let topic = topic.to_owned();
    match store {
        Store::Sqlite(s) => s
            .read(move |conn| {
                let mut stmt = conn
                    .prepare("SELECT position FROM message WHERE topic = ?1 ORDER BY position")?;
                let rows = stmt
                    .query_map([topic], |row| row.get(0))?
                    .collect::<Result<_, _>>()?;
                Ok(rows)
            })
            .await
            .unwrap(),
        Store::Postgres(s) => {
            sqlx::query_scalar("SELECT position FROM message WHERE topic = $1 ORDER BY position")
                .bind(topic)
                .fetch_all(s.pool())
                .await
                .unwrap()
        }
    }
}

/// Makes `group` live: an instance that declares its set and heartbeats (no handler).
async fn live(store: &TestStore, group: &str, patterns: &[&str]) -> wharf::Consumer {
    let registration = Registration::new(group, "t", "1", patterns).unwrap();
    let consumer = store.wharf().consume(registration);
    wait_until("the group's instance is ready", DEADLINE, || async {
        consumer.is_ready()
    })
    .await;
    consumer
}

async fn retain(queue: &Queue, retention: Duration, batch: i64) -> RetentionReport {
    queue.retain(retention, LIVE, batch).await.unwrap()
}

fn report(messages: u64, orphaned_deliveries: u64) -> RetentionReport {
    RetentionReport {
        messages,
        orphaned_deliveries,
        set_aside_dropped: 0,
    }
}

// ---------------------------------------------------------------------------------------------

async fn only_age_removes_a_message(backend: Backend) {
    let store = TestStore::new(backend).await;
    let none: &[&str] = &[];
    declare(&store, "all", "t", none).await;
    declare(&store, "xs", "t", &["x/#"]).await;
    let queue = Queue::new(store.store.clone(), settings());
    let (all, xs) = (group("all"), group("xs"));
    let subjects = [
        "x/1", "x/2", "x/3", "x/4", "x/5", "x/6", "x/7", "x/8", "y/9", "y/10",
    ];
    let batch: Vec<_> = subjects.iter().map(|s| msg(s)).collect();
    queue.publish(&topic("t"), &batch).await.unwrap();
    let range = |a: i64, b: i64| (a..=b).collect::<Vec<_>>();

    // Both groups route everything and ack what they were handed (xs routes 9 and 10 past).
    for g in [&all, &xs] {
        route_all(&queue, g).await;
        let taken = claim_all(&queue, g).await;
        ack_all(&queue, &taken).await;
    }
    assert_eq!(
        retain(&queue, HOUR, 2).await,
        report(0, 0),
        "done by every group, but not an hour old"
    );
    assert_eq!(log_positions(&store.store, "t").await, range(1, 10));

    // Aged, with no live group: all of it goes, in batches; the head is kept.
    assert_eq!(retain(&queue, Duration::ZERO, 2).await, report(10, 0));
    assert!(log_positions(&store.store, "t").await.is_empty());
    let topics = queue.topic_stats().await.unwrap();
    assert_eq!(
        (topics[0].head, topics[0].size),
        (10, 0),
        "the head is kept"
    );
}
on_both_backends!(every_group_finished, only_age_removes_a_message);

// ---------------------------------------------------------------------------------------------

async fn aged_messages_wait_only_for_live_groups(backend: Backend) {
    let store = TestStore::new(backend).await;
    let wharf = store.wharf();
    let registration = Registration::new("live", "t", "1", &["m/#"]).unwrap();
    wharf.register(&registration).await.unwrap();
    declare(&store, "idle", "t", &["m/#"]).await;
    let consumer = wharf.consume(registration);
    wait_until("the live group's instance is ready", DEADLINE, || async {
        consumer.is_ready()
    })
    .await;
    let queue = Queue::new(store.store.clone(), settings());
    let (live, idle) = (group("live"), group("idle"));
    let first: Vec<_> = (1..=10).map(|i| msg(&format!("m/{i}"))).collect();
    queue.publish(&topic("t"), &first).await.unwrap();
    route_all(&queue, &live).await;
    route_all(&queue, &idle).await;
    let taken = claim_all(&queue, &live).await;
    assert_eq!(taken.len(), 10);
    ack_all(&queue, &taken[..4]).await;
    // Published after both groups routed: nobody has routed these.
    let later: Vec<_> = (11..=13).map(|i| msg(&format!("m/{i}"))).collect();
    queue.publish(&topic("t"), &later).await.unwrap();
    let range = |a: i64, b: i64| (a..=b).collect::<Vec<_>>();

    // Everything is aged. The live group still needs 5..10 (unacked) and 11..13 (unrouted);
    // the idle group's wish to keep 1..4 does not count, and its deliveries of them go.
    assert_eq!(retain(&queue, Duration::ZERO, 2).await, report(4, 4));
    assert_eq!(log_positions(&store.store, "t").await, range(5, 13));
    let idle_stats = queue.group_stats(Some(&idle)).await.unwrap().remove(0);
    assert_eq!(
        idle_stats.claimable, 6,
        "the idle group keeps deliveries of kept messages"
    );

    ack_all(&queue, &taken[4..]).await;
    assert_eq!(retain(&queue, Duration::ZERO, 2).await, report(6, 6));
    assert_eq!(
        log_positions(&store.store, "t").await,
        range(11, 13),
        "unrouted by the live group, so kept though aged"
    );
    assert!(consumer.is_ready(), "the instance stayed live throughout");

    // Once the live instance has left, no live group needs anything.
    consumer.shutdown().await;
    assert_eq!(retain(&queue, Duration::ZERO, 2).await, report(3, 0));
    assert!(log_positions(&store.store, "t").await.is_empty());
    let idle_stats = queue.group_stats(Some(&idle)).await.unwrap().remove(0);
    assert_eq!(
        (idle_stats.claimable, idle_stats.in_flight),
        (0, 0),
        "no delivery is left pointing at a deleted message"
    );
    assert!(claim_all(&queue, &idle).await.is_empty());
}
on_both_backends!(
    live_groups_and_ageing,
    aged_messages_wait_only_for_live_groups
);

// ---------------------------------------------------------------------------------------------

/// When a publish completed, and the positions it got.
type Publish = (Instant, Vec<i64>);

const BACKLOG: i64 = 20_000;
const HELD: i64 = 19_990;

/// The backlog's subjects: one in a hundred is wanted, and the held one.
fn backlog_subject(position: i64) -> String {
    if position == HELD {
        "keep/held".to_owned()
    } else if position % 100 == 0 {
        format!("keep/{position}")
    } else {
        format!("noise/{position}")
    }
}

async fn publishers_keep_going_while_retention_runs(backend: Backend) {
    let store = TestStore::new(backend).await;
    declare(&store, "g", "t", &["keep/#"]).await;
    // Live throughout, so its unfinished message pins the log while everything is aged.
    let instance = live(&store, "g", &["keep/#"]).await;
    let queue = Queue::new(
        store.store.clone(),
        QueueSettings {
            route_batch: 2_000,
            ..settings()
        },
    );
    let g = group("g");
    for chunk in 0..BACKLOG / 1_000 {
        let batch: Vec<_> = (chunk * 1_000 + 1..=(chunk + 1) * 1_000)
            .map(|p| msg(&backlog_subject(p)))
            .collect();
        queue.publish(&topic("t"), &batch).await.unwrap();
    }
    route_all(&queue, &g).await;
    let taken = claim_all(&queue, &g).await;
    assert_eq!(taken.len() as i64, BACKLOG / 100 + 1);
    let (held, settled): (Vec<&Claimed>, Vec<&Claimed>) =
        taken.iter().partition(|c| c.position == HELD);
    assert_eq!(held.len(), 1);
    ack_all(&queue, settled).await;

    // A publisher that records when each publish completed, and a consumer that settles what
    // it publishes, both running throughout.
    let stop = Arc::new(AtomicBool::new(false));
    let published: Arc<Mutex<Vec<Publish>>> = Arc::default();
    let publisher = {
        let (queue, stop, published) = (queue.clone(), stop.clone(), published.clone());
        tokio::spawn(async move {
            let mut n = 0;
            let mut wanted = BTreeSet::new();
            while !stop.load(Ordering::SeqCst) {
                let batch: Vec<_> = (0..10)
                    .map(|k| {
                        let kind = if k % 2 == 0 { "keep" } else { "noise" };
                        msg(&format!("{kind}/live/{n}/{k}"))
                    })
                    .collect();
                let positions = queue.publish(&topic("t"), &batch).await.unwrap();
                wanted.extend(positions.iter().step_by(2).copied());
                published.lock().unwrap().push((Instant::now(), positions));
                n += 1;
            }
            wanted
        })
    };
    let consumed: Arc<Mutex<Vec<i64>>> = Arc::default();
    let drained = Arc::new(AtomicBool::new(false));
    let consumer = {
        let (queue, g, consumed, drained) =
            (queue.clone(), g.clone(), consumed.clone(), drained.clone());
        tokio::spawn(async move {
            let start = Instant::now();
            loop {
                assert!(start.elapsed() < DEADLINE, "the consumer timed out");
                let batch = queue.fetch(&g, "live-consumer", 50).await.unwrap();
                if batch.is_empty() {
                    if drained.load(Ordering::SeqCst) {
                        return;
                    }
                    tokio::task::yield_now().await;
                }
                for c in batch {
                    assert!(
                        c.position > BACKLOG,
                        "backlog already settled: {}",
                        c.position
                    );
                    assert_eq!(queue.ack(&c).await.unwrap(), AckOutcome::Acked);
                    consumed.lock().unwrap().push(c.position);
                }
            }
        })
    };
    wait_until("the publisher is under way", DEADLINE, || async {
        !published.lock().unwrap().is_empty()
    })
    .await;

    // Repeated passes; the first one has the backlog to chew through.
    let passes = {
        let queue = queue.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            let first = queue.retain(Duration::ZERO, LIVE, 500).await.unwrap();
            let end = Instant::now();
            let mut later = 0;
            for _ in 0..4 {
                later += queue
                    .retain(Duration::ZERO, LIVE, 500)
                    .await
                    .unwrap()
                    .messages;
            }
            (start, end, first, later)
        })
    };
    let (start, end, first, later) = passes.await.unwrap();
    stop.store(true, Ordering::SeqCst);
    let wanted = publisher.await.unwrap();

    let during = published
        .lock()
        .unwrap()
        .iter()
        .filter(|(at, _)| *at > start && *at < end)
        .count();
    assert!(
        during > 0,
        "no publish completed during the {:?} retention pass",
        end - start
    );
    assert_eq!(
        first,
        report((HELD - 1) as u64, 0),
        "the first pass removed exactly what came before the unfinished message"
    );
    assert_eq!(
        later, 0,
        "later passes found nothing more: the held message pins the log"
    );

    wait_until(
        "the consumer settles everything published",
        DEADLINE,
        || async {
            let s = queue.group_stats(Some(&g)).await.unwrap().remove(0);
            s.routed_lag == 0 && s.claimable == 0 && s.in_flight == 1
        },
    )
    .await;
    drained.store(true, Ordering::SeqCst);
    consumer.await.unwrap();
    let consumed: Vec<i64> = std::mem::take(&mut *consumed.lock().unwrap());
    let consumed_set: BTreeSet<i64> = consumed.iter().copied().collect();
    assert_eq!(consumed.len(), consumed_set.len(), "each settled once");
    assert_eq!(
        consumed_set, wanted,
        "every wanted message published during retention was delivered"
    );

    // Nothing from the unfinished message on was removed; then it settles and all goes.
    let head = queue.topic_stats().await.unwrap()[0].head;
    assert_eq!(
        log_positions(&store.store, "t").await,
        (HELD..=head).collect::<Vec<_>>()
    );
    ack_all(&queue, held).await;
    assert_eq!(
        queue.retain(Duration::ZERO, LIVE, 500).await.unwrap(),
        report((head - HELD + 1) as u64, 0)
    );
    assert!(log_positions(&store.store, "t").await.is_empty());
    instance.shutdown().await;
}
on_both_backends!(
    publishing_during_retention,
    publishers_keep_going_while_retention_runs
);

// ---------------------------------------------------------------------------------------------

/// A queue that dead-letters on the first nack.
fn one_shot() -> QueueSettings {
    QueueSettings {
        max_attempts: 1,
        route_batch: 5_000,
        ..settings()
    }
}

/// Publishes a message with headers, routes it, claims it and nacks it into the dead letters.
async fn bury(queue: &Queue, g: &GroupName) -> Claimed {
    let headers = Headers::from([("origin".to_owned(), "test".to_owned())]);
    let message = OutgoingMessage::new("d/precious", b"irreplaceable".to_vec(), headers).unwrap();
    let position = queue.publish_one(&topic("t"), message).await.unwrap();
    route_all(queue, g).await;
    let claimed = claim_all(queue, g).await.remove(0);
    assert_eq!(claimed.position, position);
    assert_eq!(
        queue.nack(&claimed, "handler gave up").await.unwrap(),
        NackOutcome::DeadLettered
    );
    claimed
}

async fn dead_letters_outlive_the_log(backend: Backend) {
    let store = TestStore::new(backend).await;
    declare(&store, "g", "t", &["d/#"]).await;
    let instance = live(&store, "g", &["d/#"]).await;
    let queue = Queue::new(store.store.clone(), one_shot());
    let g = group("g");
    let original = bury(&queue, &g).await;

    // Aged, and the live group has no delivery of it: the log lets it go.
    assert_eq!(retain(&queue, Duration::ZERO, 10).await, report(1, 0));
    assert!(log_positions(&store.store, "t").await.is_empty());
    let dead = queue.dead_letters(&g, 0, 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    let letter = &dead[0];
    assert_eq!(letter.position, original.position);
    assert_eq!(letter.subject, original.subject);
    assert_eq!(letter.payload, original.payload);
    assert_eq!(letter.headers, original.headers);
    assert_eq!(letter.published_at, original.published_at);
    assert_eq!(letter.attempts, 1);
    assert_eq!(letter.last_error.as_deref(), Some("handler gave up"));

    // The replay restores the log row, same position and content, and hands it out anew.
    assert!(queue
        .replay_dead_letter(&g, original.position)
        .await
        .unwrap());
    assert_eq!(
        log_positions(&store.store, "t").await,
        vec![original.position]
    );
    assert_eq!(queue.topic_stats().await.unwrap()[0].size, 1);
    assert_eq!(
        retain(&queue, Duration::ZERO, 10).await,
        report(0, 0),
        "unfinished again, for a live group"
    );
    let again = claim_all(&queue, &g).await;
    assert_eq!(again.len(), 1);
    let again = &again[0];
    assert_eq!(
        (
            &again.subject,
            &again.payload,
            &again.headers,
            again.published_at
        ),
        (
            &original.subject,
            &original.payload,
            &original.headers,
            original.published_at
        )
    );
    assert_eq!(again.attempts, 1);
    assert_eq!(queue.ack(again).await.unwrap(), AckOutcome::Acked);
    assert!(queue.dead_letters(&g, 0, 10).await.unwrap().is_empty());
    assert_eq!(retain(&queue, Duration::ZERO, 10).await, report(1, 0));
    instance.shutdown().await;
}
on_both_backends!(dead_letters_survive_retention, dead_letters_outlive_the_log);

const NOISE: i64 = 30_000;

async fn a_replay_during_a_pass_is_not_undone(backend: Backend) {
    let store = TestStore::new(backend).await;
    declare(&store, "g", "t", &["d/#"]).await;
    let instance = live(&store, "g", &["d/#"]).await;
    let queue = Queue::new(store.store.clone(), one_shot());
    let g = group("g");
    let original = bury(&queue, &g).await;
    for chunk in 0..NOISE / 5_000 {
        let batch: Vec<_> = (0..5_000)
            .map(|k| msg(&format!("noise/{chunk}/{k}")))
            .collect();
        queue.publish(&topic("t"), &batch).await.unwrap();
    }
    route_all(&queue, &g).await;
    let total = NOISE + 1;
    assert_eq!(queue.topic_stats().await.unwrap()[0].size, total);

    // Everything is aged and done for the only (live) group; a pass in small batches starts
    // deleting it, and the dead letter is replayed while the pass is still going.
    let pass = {
        let queue = queue.clone();
        tokio::spawn(async move { queue.retain(Duration::ZERO, LIVE, 100).await.unwrap() })
    };
    wait_until("the pass has started deleting", DEADLINE, || async {
        queue.topic_stats().await.unwrap()[0].size < total
    })
    .await;
    assert!(queue
        .replay_dead_letter(&g, original.position)
        .await
        .unwrap());
    let report = pass.await.unwrap();
    // The replay lowers the floor, so the pass ends at its next batch: it landed mid-pass when
    // the pass did not get through the whole log. (Whether the task had already returned when
    // the replay did is a race of its own, and not the one under test.)
    assert!(
        (report.messages as i64) < total,
        "the pass deleted everything before the replay; nothing was raced (report {report:?})"
    );

    // The replayed message is unfinished: the pass must have left it and its delivery alone.
    // From the replay on, it is the group's oldest unfinished message, so it is also the floor:
    // what the pass had not yet deleted stays until it is settled.
    let stats = queue.group_stats(Some(&g)).await.unwrap().remove(0);
    let letters = queue.dead_letters(&g, 0, 10).await.unwrap().len();
    let left = log_positions(&store.store, "t").await;
    assert_eq!(
        left.first(),
        Some(&original.position),
        "the replayed message is in the log (pass {report:?}; group {stats:?}; {letters} dead \
         letters left; {} rows left)",
        left.len()
    );
    assert_eq!(
        stats.claimable, 1,
        "its delivery survived the pass: {stats:?}"
    );
    let again = claim_all(&queue, &g).await;
    assert_eq!(
        again.iter().map(|c| c.position).collect::<Vec<_>>(),
        vec![original.position],
        "the replayed message can be claimed"
    );
    assert_eq!(again[0].payload, original.payload);
    // Once it is settled, the next pass takes everything that was left.
    assert_eq!(queue.ack(&again[0]).await.unwrap(), AckOutcome::Acked);
    let last = queue.retain(Duration::ZERO, LIVE, 5_000).await.unwrap();
    assert_eq!(last.messages as usize, left.len(), "{last:?}");
    assert!(log_positions(&store.store, "t").await.is_empty());
    instance.shutdown().await;
}
on_both_backends!(
    replay_during_retention,
    a_replay_during_a_pass_is_not_undone
);
