//! Publish wake-ups on real stores: an idle consumer whose poll interval is an hour still
//! handles a new message at once,
//!
//! - when it is published through the same `Wharf` (both backends: the in-process counter);
//! - on Postgres, when it is published by another `Wharf` with its own connection pool, as
//!   another process would (the `wharf_publish` notification and the library's listener);
//! - for each publish of a trickle, one at a time to an idle consumer (both backends);
//! - on Postgres, for every `Wharf` built on clones of one store handle (two instances in one
//!   process): each listens on a connection of its own.
//!
//! and, on Postgres, a dropped `Wharf` (its consumer shut down) leaves no session behind, its
//! listener's included. Which notifications the listener accepts (its own schema only) is
//! unit-tested in `wharf/src/publish_listener.rs`.
//!
//! Each test first waits until the consumer has made a fetch that came back empty, so it is in
//! its idle wait when the message is published; the hour-long poll makes a missed wake-up a
//! test failure (the deadline), not a slow pass.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use wharf::config::{DeclarationConfig, QueueConfig};
use wharf::handler::handler_fn;
use wharf::queue::{Claimed, Headers};
use wharf::store::{PgStore, Store};
use wharf::{Consumer, ConsumerStats, Registration, Wharf};
use wharf_tests::{on_both_backends, wait_until, Backend, TestStore};

const DEADLINE: Duration = Duration::from_secs(20);

/// A `Wharf` whose consumers poll once an hour, so only a wake-up gets a message handled in
/// time. Declaration timings are the defaults (store calls' deadline 10 s), not the tests'
/// fast ones (133 ms): on a loaded machine a fetch past that deadline drops what it claimed
/// until the visibility timeout, which is no wake-up's fault (`fetch_retry.rs` tests that).
fn hour_poll_wharf(store: Store, test: &TestStore) -> Wharf {
    let mut config = test.config();
    config.declarations = DeclarationConfig::default();
    config.queue = QueueConfig {
        poll_interval: Duration::from_secs(3600),
        ..QueueConfig::default()
    };
    Wharf::with_store(store, &config.settings())
}

fn recorder(seen: Arc<Mutex<Vec<Claimed>>>) -> impl wharf::Handler {
    handler_fn(move |message: Claimed| {
        let seen = seen.clone();
        async move {
            seen.lock().unwrap().push(message);
            Ok(())
        }
    })
}

async fn counted(consumer: &Consumer, what: &str, done: impl Fn(ConsumerStats) -> bool) {
    wait_until(what, DEADLINE, || {
        let done = done(consumer.stats());
        async move { done }
    })
    .await;
}

/// Waits until `consumer` (of `group`, on `wharf`) has handled `n` messages; past the deadline
/// fails with its figures and the group's queue figures (routed, claimable, in flight).
async fn handled(wharf: &Wharf, consumer: &Consumer, group: &str, n: u64) {
    let start = std::time::Instant::now();
    while consumer.stats().handled_ok < n {
        if start.elapsed() > DEADLINE {
            let group = wharf::domain::GroupName::parse("group", group).unwrap();
            let queue = wharf.queue().group_stats(Some(&group)).await;
            panic!(
                "message {n} of {group} not handled within {DEADLINE:?}: consumer {:?}, \
                 queue {queue:?}",
                consumer.stats()
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Starts a recording consumer of `orders/#` in the group `billing` and waits until it is idle.
async fn idle_consumer(wharf: &Wharf) -> (Consumer, Arc<Mutex<Vec<Claimed>>>) {
    idle_consumer_of(wharf, "billing").await
}

/// Starts a recording consumer of `orders/#` in `group` and waits until it is idle.
async fn idle_consumer_of(wharf: &Wharf, group: &str) -> (Consumer, Arc<Mutex<Vec<Claimed>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let registration = Registration::new(group, "orders", "1", &["orders/#"]).unwrap();
    let consumer = wharf.consume_with(registration, recorder(seen.clone()));
    counted(&consumer, "the consumer's first, empty fetch", |s| {
        s.fetches >= 1
    })
    .await;
    (consumer, seen)
}

async fn publish(wharf: &Wharf, topic: &str, subject: &str) {
    let message = (subject.to_owned(), b"x".to_vec(), Headers::new());
    wharf.publish(topic, vec![message]).await.unwrap();
}

async fn a_publish_wakes_an_idle_consumer_of_the_same_wharf(backend: Backend) {
    let test = TestStore::new(backend).await;
    let wharf = hour_poll_wharf(test.store.clone(), &test);
    let (consumer, seen) = idle_consumer(&wharf).await;
    publish(&wharf, "orders", "orders/1").await;
    counted(&consumer, "the message handled", |s| s.handled_ok == 1).await;
    assert_eq!(seen.lock().unwrap()[0].subject, "orders/1");
    consumer.shutdown().await;
}
on_both_backends!(
    same_wharf,
    a_publish_wakes_an_idle_consumer_of_the_same_wharf
);

/// A trickle: each publish waits for the one before to be handled, so every one finds the
/// consumer idle, and wakes its claim loop and the router beside it at once. Each must be
/// handled on its wake-up (on Postgres the claim loop's fetch may find the router holding the
/// group: it waits for the router's step rather than come back empty and sleep).
async fn every_publish_of_a_trickle_wakes_the_idle_consumer(backend: Backend) {
    let test = TestStore::new(backend).await;
    let wharf = hour_poll_wharf(test.store.clone(), &test);
    let (consumer, seen) = idle_consumer(&wharf).await;
    for n in 1..=TRICKLE {
        publish(&wharf, "orders", &format!("orders/{n}")).await;
        handled(&wharf, &consumer, "billing", n).await;
    }
    assert_eq!(seen.lock().unwrap().len(), TRICKLE as usize);
    consumer.shutdown().await;
}
on_both_backends!(trickle, every_publish_of_a_trickle_wakes_the_idle_consumer);

/// Publishes in the trickle.
const TRICKLE: u64 = 40;

/// A second handle on the test's Postgres schema with a pool of its own.
fn other_process(test: &TestStore) -> Store {
    let schema = test.schema().expect("a Postgres test store has a schema");
    Store::Postgres(
        PgStore::connect(
            &TestStore::pg_settings(schema),
            wharf::projections::pg_inline(),
        )
        .expect("a second Postgres handle"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_publish_from_another_process_wakes_an_idle_consumer() {
    let test = TestStore::new(Backend::Postgres).await;
    let wharf = hour_poll_wharf(test.store.clone(), &test);
    let (consumer, seen) = idle_consumer(&wharf).await;

    let publisher = hour_poll_wharf(other_process(&test), &test);
    publish(&publisher, "orders", "orders/1").await;
    counted(&consumer, "the message handled", |s| s.handled_ok == 1).await;
    let seen: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|m| m.subject.clone())
        .collect();
    assert_eq!(seen, vec!["orders/1".to_owned()]);
    consumer.shutdown().await;
}

/// Two `Wharf`s on clones of one store handle, as an application that builds one per component
/// would: each one's listener has a connection of its own. With one `LISTEN` connection shared
/// by the store's clones, the second listener waited for it, gave up after its start timeout,
/// and left its consumer polling (here: an hour).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_wharf_on_one_store_handle_listens() {
    let test = TestStore::new(Backend::Postgres).await;
    let first = hour_poll_wharf(test.store.clone(), &test);
    let second = hour_poll_wharf(test.store.clone(), &test);
    let (billing, billing_seen) = idle_consumer_of(&first, "billing").await;
    let (audit, audit_seen) = idle_consumer_of(&second, "audit").await;

    let publisher = hour_poll_wharf(other_process(&test), &test);
    publish(&publisher, "orders", "orders/1").await;
    handled(&first, &billing, "billing", 1).await;
    handled(&second, &audit, "audit", 1).await;
    for seen in [billing_seen, audit_seen] {
        assert_eq!(seen.lock().unwrap()[0].subject, "orders/1");
    }
    billing.shutdown().await;
    audit.shutdown().await;
}

/// Dropping a `Wharf` and its store handle, after its consumer has shut down, ends every
/// session it opened, its listener's among them: a process that builds and drops `Wharf`s
/// keeps no connection behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_wharf_leaves_no_session_behind() {
    let test = TestStore::new(Backend::Postgres).await;
    let schema = test.schema().expect("a Postgres test store has a schema");
    // Named, so the test counts exactly this handle's sessions.
    let name = format!("wharf_dropped_{}", std::process::id());
    let settings = wharf::store::PgSettings {
        url: wharf_tests::pg_url_named(&name),
        ..TestStore::pg_settings(schema)
    };
    let store = PgStore::connect(&settings, wharf::projections::pg_inline()).unwrap();
    let wharf = hour_poll_wharf(Store::Postgres(store), &test);
    let (consumer, _) = idle_consumer(&wharf).await;
    let Store::Postgres(admin) = &test.store else {
        unreachable!("a Postgres store")
    };
    let sessions = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
        )
        .bind(&name)
        .fetch_one(admin.pool())
        .await
        .unwrap()
    };
    // The listener's session and at least one of the pool's.
    wait_until(
        "the listener and the pool are connected",
        DEADLINE,
        || async { sessions().await >= 2 },
    )
    .await;

    consumer.shutdown().await;
    drop(wharf);
    wait_until(
        "every session of the dropped Wharf ends",
        DEADLINE,
        || async { sessions().await == 0 },
    )
    .await;
}
