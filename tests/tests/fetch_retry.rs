//! A consumer whose fetch failed or missed its deadline fetches again within milliseconds
//! (50 ms, doubling, capped by the poll interval), not after its poll interval: a consumer that
//! polls rarely (an hour here) and lives on publish wake-ups is not stalled by one slow answer.
//!
//! On Postgres the group row, held by another session as a long routing step or swap would
//! hold it, makes the woken fetch wait (ADR 0053) past its call deadline (a third of the
//! instance TTL: 133 ms with the tests' timings). Once the row is free, the retry routes and
//! claims the message.

use std::time::Duration;

use wharf::config::QueueConfig;
use wharf::handler::handler_fn;
use wharf::queue::{Claimed, Headers};
use wharf::{Registration, Wharf};
use wharf_tests::prometheus_text;
use wharf_tests::{hold_group_row, other_session, wait_until, Backend, TestStore};

const DEADLINE: Duration = Duration::from_secs(20);

/// The number of failed or timed-out fetches this `Wharf`'s metrics have counted.
async fn failed_fetches(wharf: &Wharf) -> f64 {
    let text = wharf.metrics().render(&[], Duration::from_secs(5)).await;
    let scrape = prometheus_text::parse(&text).expect("a well-formed scrape");
    scrape
        .value("wharf_store_errors_total", &[("operation", "fetch")])
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_past_its_deadline_is_retried_soon_not_after_the_poll_interval() {
    let test = TestStore::new(Backend::Postgres).await;
    let mut config = test.config();
    config.queue = QueueConfig {
        poll_interval: Duration::from_secs(3600),
        // A later fetch that also misses its deadline after claiming drops the claim until
        // then (on a loaded machine); the message must still come back within the test's.
        visibility_timeout: Duration::from_secs(2),
        ..QueueConfig::default()
    };
    let wharf = Wharf::with_store(test.store.clone(), &config.settings());
    let registration = Registration::new("billing", "orders", "1", &["orders/#"]).unwrap();
    let consumer = wharf.consume_with(registration, handler_fn(|_: Claimed| async { Ok(()) }));
    wait_until("the consumer's first, empty fetch", DEADLINE, || {
        let fetches = consumer.stats().fetches;
        async move { fetches >= 1 }
    })
    .await;

    let mut holder = other_session(&test).await;
    hold_group_row(&mut holder, "billing").await;

    let message = ("orders/1".to_owned(), b"x".to_vec(), Headers::new());
    wharf.publish("orders", vec![message]).await.unwrap();
    wait_until("a fetch misses its deadline", DEADLINE, || async {
        failed_fetches(&wharf).await >= 1.0
    })
    .await;
    assert_eq!(consumer.stats().handled_ok, 0, "nothing was routed yet");

    sqlx::query("COMMIT").execute(&mut holder).await.unwrap();
    wait_until("the retried fetch claims the message", DEADLINE, || {
        let handled = consumer.stats().handled_ok;
        async move { handled == 1 }
    })
    .await;
    consumer.shutdown().await;
}
