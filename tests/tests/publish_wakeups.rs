//! Publish wake-ups on real stores: an idle consumer whose poll interval is an hour still
//! handles a new message at once,
//!
//! - when it is published through the same `Wharf` (both backends: the in-process counter);
//! - on Postgres, when it is published by another `Wharf` with its own connection pool, as
//!   another process would (the `wharf_publish` notification and the library's listener).
//!   Which notifications the listener accepts (its own schema only) is unit-tested in
//!   `wharf/src/publish_listener.rs`.
//!
//! Each test first waits until the consumer has made a fetch that came back empty, so it is in
//! its idle wait when the message is published; the hour-long poll makes a missed wake-up a
//! test failure (the deadline), not a slow pass.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use wharf::config::QueueConfig;
use wharf::handler::handler_fn;
use wharf::queue::{Claimed, Headers};
use wharf::store::{PgStore, Store};
use wharf::{Consumer, ConsumerStats, Registration, Wharf};
use wharf_tests::{on_both_backends, wait_until, Backend, TestStore};

const DEADLINE: Duration = Duration::from_secs(20);

fn hour_poll_wharf(store: Store, test: &TestStore) -> Wharf {
    let mut config = test.config();
    config.queue = QueueConfig {
        poll_interval: Duration::from_secs(3600),
        ..QueueConfig::default()
    };
    Wharf::with_store(store, &config)
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

/// Starts a recording consumer of `orders/#` and waits until it is idle.
async fn idle_consumer(wharf: &Wharf) -> (Consumer, Arc<Mutex<Vec<Claimed>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let registration = Registration::new("billing", "orders", "1", &["orders/#"]).unwrap();
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
