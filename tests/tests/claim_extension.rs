//! Claim extension on real stores, both backends:
//!
//! - `Queue::extend` moves a held claim's `visible_at` (by the store's clock) without counting
//!   an attempt; no other instance gets the message before it; a settled or taken-over claim
//!   cannot be extended; a zero or over-long extension is refused naming `by`;
//! - the consumer runtime keeps a slow handler's claim alive, so a second instance of the
//!   group never gets the message while the first still works on it, and the message is
//!   handled once;
//! - past `queue.max_claim_hold` the runtime stops extending: the claim expires, another
//!   instance gets the message, and the slow handler's late ack counts as a lost claim.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use wharf::config::QueueConfig;
use wharf::domain::DeclarerId;
use wharf::handler::handler_fn;
use wharf::queue::{AckOutcome, Claimed, ExtendOutcome, Headers, Queue, QueueError, QueueSettings};
use wharf::{Consumer, ConsumerStats, Registration, Wharf};
use wharf_tests::fixtures::{declare, group, msg, topic};
use wharf_tests::{on_both_backends, wait_until, Backend, TestStore};

const DEADLINE: Duration = Duration::from_secs(20);
const VISIBILITY: Duration = Duration::from_millis(300);

fn settings() -> QueueSettings {
    QueueSettings {
        visibility_timeout: VISIBILITY,
        max_attempts: 5,
        backoff_base: Duration::from_millis(10),
        backoff_max: Duration::from_secs(1),
        route_batch: 50,
    }
}

async fn extend_moves_visibility_and_only_for_the_holder(backend: Backend) {
    let store = TestStore::new(backend).await;
    declare(&store, "g", "t", &["job/+"]).await;
    let queue = Queue::new(store.store.clone(), settings());
    let g = group("g");
    let position = queue.publish_one(&topic("t"), msg("job/1")).await.unwrap();
    let held = queue.fetch(&g, "slow", 1).await.unwrap().remove(0);
    assert_eq!((held.position, held.attempts), (position, 1));

    let before = store.store.now().await.unwrap();
    let outcome = queue.extend(&held, Duration::from_secs(3)).await.unwrap();
    let after = store.store.now().await.unwrap();
    let ExtendOutcome::Extended { visible_at } = outcome else {
        panic!("the holder's extension must succeed: {outcome:?}");
    };
    let slack = chrono::Duration::milliseconds(1);
    assert!(visible_at + slack >= before + chrono::Duration::seconds(3));
    assert!(visible_at <= after + chrono::Duration::seconds(3) + slack);

    // Past the original timeout, and until the extended one, nobody else gets it.
    let original = before + chrono::Duration::from_std(VISIBILITY).unwrap();
    let start = Instant::now();
    loop {
        let polled_at = store.store.now().await.unwrap();
        let got = queue.claim(&g, "other", 10).await.unwrap();
        let done = store.store.now().await.unwrap();
        if done < visible_at {
            assert!(got.is_empty(), "handed out at {done}, before {visible_at}");
        }
        if polled_at > original + chrono::Duration::milliseconds(200) || !got.is_empty() {
            break;
        }
        assert!(start.elapsed() < DEADLINE, "the store clock did not move");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The holder settles; afterwards its claim cannot be extended.
    assert_eq!(queue.ack(&held).await.unwrap(), AckOutcome::Acked);
    assert_eq!(
        queue.extend(&held, Duration::from_secs(1)).await.unwrap(),
        ExtendOutcome::ClaimLost
    );

    // A claim that expired and was taken over cannot be extended by its old holder, and an
    // extension does not count as an attempt.
    queue.publish_one(&topic("t"), msg("job/2")).await.unwrap();
    let first = queue.fetch(&g, "slow", 1).await.unwrap().remove(0);
    assert!(matches!(
        queue.extend(&first, VISIBILITY).await.unwrap(),
        ExtendOutcome::Extended { .. }
    ));
    let taken = Arc::new(Mutex::new(None));
    wait_until("the expired claim is taken over", DEADLINE, || {
        let (queue, g, taken) = (queue.clone(), g.clone(), taken.clone());
        async move {
            let got = queue.claim(&g, "other", 1).await.unwrap().pop();
            let found = got.is_some();
            if found {
                *taken.lock().unwrap() = got;
            }
            found
        }
    })
    .await;
    let taken = taken.lock().unwrap().take().unwrap();
    assert_eq!((taken.position, taken.attempts), (first.position, 2));
    assert_eq!(
        queue.extend(&first, Duration::from_secs(1)).await.unwrap(),
        ExtendOutcome::ClaimLost
    );
    assert_eq!(queue.ack(&taken).await.unwrap(), AckOutcome::Acked);

    for bad in [Duration::ZERO, Duration::from_secs(24 * 3600 + 1)] {
        match queue.extend(&taken, bad).await {
            Err(QueueError::Invalid(e)) => assert_eq!(e.field, "by", "{e}"),
            other => panic!("extending by {bad:?} must be refused, got {other:?}"),
        }
    }
}
on_both_backends!(
    queue_extend,
    extend_moves_visibility_and_only_for_the_holder
);

// ---------------------------------------------------------------------------------------------
// The runtime keeps a slow handler's claim
// ---------------------------------------------------------------------------------------------

fn wharf_with(store: &TestStore, max_claim_hold: Duration) -> Wharf {
    let mut config = store.config();
    config.declarations.instance_ttl = Duration::from_secs(5);
    config.queue = QueueConfig {
        visibility_timeout: VISIBILITY,
        poll_interval: Duration::from_millis(20),
        max_claim_hold,
        ..QueueConfig::default()
    };
    Wharf::with_store(store.store.clone(), &config.settings())
}

fn registration() -> Registration {
    Registration::new("billing", "orders", "1", &["orders/#"]).unwrap()
}

async fn counted(consumer: &Consumer, what: &str, done: impl Fn(ConsumerStats) -> bool) {
    wait_until(what, DEADLINE, || {
        let done = done(consumer.stats());
        async move { done }
    })
    .await;
}

async fn ready(consumer: &Consumer) {
    let mut watch = consumer.watch();
    tokio::time::timeout(DEADLINE, watch.wait_for(|s| s.is_ready()))
        .await
        .expect("the consumer became ready")
        .unwrap();
}

/// A handler that counts its calls, reports each start, and returns when `release` is true.
fn held_handler(
    calls: Arc<AtomicUsize>,
    started: watch::Sender<Vec<Claimed>>,
    release: watch::Receiver<bool>,
) -> impl wharf::Handler {
    handler_fn(move |message: Claimed| {
        let (calls, started, mut release) = (calls.clone(), started.clone(), release.clone());
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            started.send_modify(|seen| seen.push(message));
            release
                .wait_for(|go| *go)
                .await
                .expect("the test holds the sender");
            Ok(())
        }
    })
}

async fn publish_one(wharf: &Wharf) {
    let message = ("orders/slow".to_owned(), b"work".to_vec(), Headers::new());
    wharf.publish("orders", vec![message]).await.unwrap();
}

async fn a_slow_handler_keeps_its_claim(backend: Backend) {
    let store = TestStore::new(backend).await;
    let wharf = wharf_with(&store, Duration::from_secs(3600));
    let calls = Arc::new(AtomicUsize::new(0));
    let (started, mut has_started) = watch::channel(Vec::new());
    let (release, released) = watch::channel(false);
    let declarer = |name: &str| wharf.as_declarer(DeclarerId::parse("declarer", name).unwrap());
    let slow = declarer("slow").consume_with(
        registration(),
        held_handler(calls.clone(), started.clone(), released.clone()),
    );
    ready(&slow).await;
    let rival = declarer("rival").consume_with(
        registration(),
        held_handler(calls.clone(), started, released),
    );
    ready(&rival).await;
    publish_one(&wharf).await;
    tokio::time::timeout(DEADLINE, has_started.wait_for(|s| s.len() == 1))
        .await
        .expect("one handler started")
        .unwrap();

    // Hold the handler for five visibility timeouts by the store's clock: without extensions
    // the rival (polling every 20 ms) would get the message after the first.
    let begin = store.store.now().await.unwrap();
    let hold = chrono::Duration::from_std(VISIBILITY * 5).unwrap();
    wait_until("five visibility timeouts pass", DEADLINE, || {
        let store = store.store.clone();
        async move { store.now().await.unwrap() > begin + hold }
    })
    .await;
    assert_eq!(calls.load(Ordering::SeqCst), 1, "handed out twice");
    release.send_replace(true);
    let both = |c: &Consumer, r: &Consumer| c.stats().handled_ok + r.stats().handled_ok;
    wait_until("the handler settles", DEADLINE, || {
        let done = both(&slow, &rival) == 1;
        async move { done }
    })
    .await;
    let (a, b) = (slow.shutdown().await, rival.shutdown().await);
    assert_eq!(a.claims_lost + b.claims_lost, 0, "the ack found its claim");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "handled once");
    assert_eq!(has_started.borrow()[0].attempts, 1);
    let stats = wharf.queue().group_stats(None).await.unwrap().remove(0);
    assert_eq!(stats.claimable + stats.in_flight + stats.backing_off, 0);
}
on_both_backends!(slow_handler, a_slow_handler_keeps_its_claim);

async fn past_max_claim_hold_the_claim_expires(backend: Backend) {
    let store = TestStore::new(backend).await;
    let wharf = wharf_with(&store, Duration::from_millis(600));
    let calls = Arc::new(AtomicUsize::new(0));
    let (started, mut has_started) = watch::channel(Vec::new());
    let (release, released) = watch::channel(false);
    let declarer = |name: &str| wharf.as_declarer(DeclarerId::parse("declarer", name).unwrap());
    let consumers = [
        declarer("one").consume_with(
            registration(),
            held_handler(calls.clone(), started.clone(), released.clone()),
        ),
        declarer("two").consume_with(
            registration(),
            held_handler(calls.clone(), started, released),
        ),
    ];
    for consumer in &consumers {
        ready(consumer).await;
    }
    publish_one(&wharf).await;
    // The hold limit passes, the claim expires, and the other instance gets the message.
    tokio::time::timeout(DEADLINE, has_started.wait_for(|s| s.len() == 2))
        .await
        .expect("the message was redelivered after the hold limit")
        .unwrap();
    let attempts: Vec<i32> = has_started.borrow().iter().map(|m| m.attempts).collect();
    assert_eq!(attempts, vec![1, 2]);
    release.send_replace(true);
    let [one, two] = consumers;
    for consumer in [&one, &two] {
        counted(consumer, "each handler settles", |s| s.in_flight == 0).await;
    }
    let (a, b) = (one.shutdown().await, two.shutdown().await);
    assert_eq!(a.handled_ok + b.handled_ok, 2);
    assert_eq!(
        a.claims_lost + b.claims_lost,
        1,
        "the first holder's ack lost its claim"
    );
}
on_both_backends!(max_claim_hold, past_max_claim_hold_the_claim_expires);
