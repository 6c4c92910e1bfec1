//! A claim loop's kept connection on the real Postgres (ADR 0051): a fetch that claims all it
//! asked for keeps its connection for the next one, which settles its acks on it; a fetch that
//! comes back short (it routes through the pool), or a pool with no connection to spare, keeps
//! nothing; and the consumer runtime hands its kept connection back to the pool while its
//! handlers run longer than the linger, so a busy consumer never holds a connection out of the
//! pool while it only waits. The publish listener's `LISTEN` connection is not one of the
//! pool's: a consumer runs on a pool of one. When the server ends every session of a busy
//! consumer, the kept connection among them, it goes on and loses nothing.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use wharf::config::QueueConfig;
use wharf::handler::handler_fn;
use wharf::queue::{AckOutcome, Claimed, Headers, HeldConnection, Queue, QueueSettings};
use wharf::store::{PgStore, Store};
use wharf::{Registration, Wharf};
use wharf_tests::fixtures::{declare, group, msg, topic};
use wharf_tests::{pg_url_named, wait_until, Backend, TestStore};

const DEADLINE: Duration = Duration::from_secs(20);

/// A queue over a pool of `max_connections` on `test`'s schema.
fn queue_with_pool(test: &TestStore, max_connections: u32) -> (Queue, PgStore) {
    let settings = wharf::store::PgSettings {
        max_connections,
        ..TestStore::pg_settings(test.schema().expect("a Postgres store"))
    };
    let store = PgStore::connect(&settings, wharf::projections::pg_inline()).expect("a pool");
    let queue = Queue::new(Store::Postgres(store.clone()), QueueSettings::default());
    (queue, store)
}

/// A queue over a pool of `max_connections` on `test`'s schema, with `messages` published on
/// `t` and all routed for group `a` (`job/+`), so fetches claim from routed deliveries.
async fn routed_queue(test: &TestStore, max_connections: u32, messages: usize) -> (Queue, PgStore) {
    declare(test, "a", "t", &["job/+"]).await;
    let (queue, store) = queue_with_pool(test, max_connections);
    let batch: Vec<_> = (0..messages).map(|i| msg(&format!("job/{i}"))).collect();
    queue.publish(&topic("t"), &batch).await.unwrap();
    queue.route(&group("a")).await.unwrap();
    (queue, store)
}

/// Whether every connection the pool has opened is back in it.
fn all_idle(store: &PgStore) -> bool {
    store.pool().num_idle() == store.pool().size() as usize
}

#[tokio::test]
async fn a_full_fetch_keeps_its_connection_and_a_short_one_does_not() {
    let test = TestStore::new(Backend::Postgres).await;
    let (queue, store) = routed_queue(&test, 3, 6).await;

    let mut held = HeldConnection::default();
    let first = queue
        .ack_and_fetch_holding(&mut held, &[], &group("a"), "x", None, 3)
        .await
        .unwrap();
    let first = first.fetched.unwrap();
    assert_eq!(first.len(), 3);
    assert!(
        held.is_held(),
        "a fetch that got all it asked for keeps its connection"
    );
    assert!(!all_idle(&store), "the kept connection is out of the pool");

    // The next fetch settles the acks on the kept connection, claims the other three, and
    // keeps it again.
    let second = queue
        .ack_and_fetch_holding(&mut held, &first, &group("a"), "x", None, 3)
        .await
        .unwrap();
    assert_eq!(second.acks, vec![AckOutcome::Acked; 3]);
    let second = second.fetched.unwrap();
    assert_eq!(second.len(), 3);
    assert!(held.is_held());

    // Nothing is left: the fetch comes back short, routes through the pool, and gives its
    // connection back first.
    let third = queue
        .ack_and_fetch_holding(&mut held, &second, &group("a"), "x", None, 3)
        .await
        .unwrap();
    assert_eq!(third.acks, vec![AckOutcome::Acked; 3]);
    assert!(third.fetched.unwrap().is_empty());
    assert!(!held.is_held(), "a short fetch keeps no connection");
    wait_until("the connection is back in the pool", DEADLINE, || async {
        all_idle(&store)
    })
    .await;
    let stats = queue.group_stats(Some(&group("a"))).await.unwrap();
    assert_eq!(
        (stats[0].in_flight, stats[0].claimable),
        (0, 0),
        "{stats:?}"
    );
}

#[tokio::test]
async fn a_pool_without_a_connection_to_spare_keeps_nothing() {
    let test = TestStore::new(Backend::Postgres).await;
    let (queue, store) = routed_queue(&test, 1, 4).await;

    let mut held = HeldConnection::default();
    let fetched = queue
        .ack_and_fetch_holding(&mut held, &[], &group("a"), "x", None, 2)
        .await
        .unwrap();
    assert_eq!(fetched.fetched.unwrap().len(), 2);
    assert!(
        !held.is_held(),
        "the pool's only connection goes back: the process's other calls need it"
    );
    // Back in the pool once the pool's check on its return is done.
    wait_until("the connection is back in the pool", DEADLINE, || async {
        all_idle(&store)
    })
    .await;
    let stats = queue.group_stats(Some(&group("a"))).await.unwrap();
    assert_eq!(stats[0].in_flight, 2);
}

/// A consumer whose handlers hold every slot gives its kept connection back to the pool after
/// the linger; once they finish, everything is handled once.
#[tokio::test]
async fn a_consumer_waiting_on_its_handlers_holds_no_connection() {
    let test = TestStore::new(Backend::Postgres).await;
    let Store::Postgres(pg) = &test.store else {
        unreachable!("a Postgres store")
    };
    let mut config = test.config();
    config.declarations.instance_ttl = Duration::from_secs(5);
    config.queue = QueueConfig {
        claim_batch: 2,
        concurrency: 2,
        poll_interval: Duration::from_millis(20),
        drain_timeout: Duration::from_secs(10),
        ..QueueConfig::default()
    };
    let wharf = Wharf::with_store(test.store.clone(), &config.settings());
    let registration = Registration::new("billing", "orders", "1", &["orders/#"]).unwrap();
    wharf.register(&registration).await.unwrap();
    // Two quick messages, then two whose handlers wait for the gate: the fetch that claims
    // those gets both (all it asked for) and keeps its connection.
    let subjects = [
        "orders/quick/1",
        "orders/quick/2",
        "orders/slow/1",
        "orders/slow/2",
    ];
    let messages = subjects
        .iter()
        .map(|s| (s.to_string(), s.as_bytes().to_vec(), Headers::new()))
        .collect();
    wharf.publish("orders", messages).await.unwrap();

    let (gate, opened) = watch::channel(false);
    let (running, handled) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let consumer = wharf.consume_with(registration, {
        let (running, handled) = (running.clone(), handled.clone());
        handler_fn(move |message: Claimed| {
            let (running, handled, mut opened) = (running.clone(), handled.clone(), opened.clone());
            async move {
                if message.subject.contains("/slow/") {
                    running.fetch_add(1, Ordering::SeqCst);
                    opened.wait_for(|open| *open).await.ok();
                }
                handled.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        })
    });

    wait_until("both slow handlers hold their slots", DEADLINE, || {
        let running = running.clone();
        async move { running.load(Ordering::SeqCst) == 2 }
    })
    .await;
    wait_until(
        "the claim loop gave its connection back while it waits",
        DEADLINE,
        || async { all_idle(pg) },
    )
    .await;

    gate.send_replace(true);
    wait_until("every message is handled", DEADLINE, || {
        let handled = handled.clone();
        async move { handled.load(Ordering::SeqCst) == subjects.len() }
    })
    .await;
    let stats = consumer.shutdown().await;
    assert_eq!(stats.handled_ok, subjects.len() as u64, "{stats:?}");
}

/// The publish listener holds its `LISTEN` connection for as long as it runs; from the pool it
/// took the only connection of a pool of one, and the consumer beside it never claimed.
#[tokio::test]
async fn a_consumer_runs_on_a_pool_of_one() {
    let test = TestStore::new(Backend::Postgres).await;
    let settings = wharf::store::PgSettings {
        max_connections: 1,
        acquire_timeout: Duration::from_secs(5),
        ..TestStore::pg_settings(test.schema().expect("a Postgres store"))
    };
    let store = PgStore::connect(&settings, wharf::projections::pg_inline()).expect("a pool");
    let mut config = test.config();
    config.declarations.instance_ttl = Duration::from_secs(5);
    config.queue = QueueConfig {
        claim_batch: 4,
        concurrency: 4,
        poll_interval: Duration::from_millis(20),
        ..QueueConfig::default()
    };
    let wharf = Wharf::with_store(Store::Postgres(store), &config.settings());
    let registration = Registration::new("billing", "orders", "1", &["orders/#"]).unwrap();
    wharf.register(&registration).await.unwrap();
    let handled = Arc::new(AtomicUsize::new(0));
    let consumer = wharf.consume_with(registration, {
        let handled = handled.clone();
        handler_fn(move |_message: Claimed| {
            let handled = handled.clone();
            async move {
                handled.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        })
    });
    wait_until("the consumer is ready", DEADLINE, || {
        let ready = consumer.is_ready();
        async move { ready }
    })
    .await;
    // Published after the consumer started (its listener too), in two rounds.
    for round in 0..2 {
        let messages = (0..10)
            .map(|i| {
                let subject = format!("orders/{round}/{i}");
                (subject.clone(), subject.into_bytes(), Headers::new())
            })
            .collect();
        wharf.publish("orders", messages).await.unwrap();
        wait_until("the round is handled", DEADLINE, || {
            let handled = handled.clone();
            async move { handled.load(Ordering::SeqCst) == 10 * (round + 1) }
        })
        .await;
    }
    let stats = consumer.shutdown().await;
    assert_eq!(stats.handled_ok, 20, "{stats:?}");
    assert_eq!(stats.handled_err + stats.claims_lost, 0, "{stats:?}");
}

/// The server ends every session of a busy consumer (`pg_terminate_backend`, as a failover or
/// an operator would), its claim loop's kept connection among them: the consumer goes on, on
/// new connections, until every message is handled; none is lost (some may be handled twice:
/// an ack on a dead connection is redelivered after the visibility timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_consumer_whose_sessions_are_terminated_goes_on() {
    const MESSAGES: usize = 10_000;
    let test = TestStore::new(Backend::Postgres).await;
    let schema = test.schema().expect("a Postgres store");
    // The URL names the consumer's sessions, so the test can end exactly those.
    let name = format!("wharf_held_{}", std::process::id());
    let settings = wharf::store::PgSettings {
        url: pg_url_named(&name),
        max_connections: 4,
        ..TestStore::pg_settings(schema)
    };
    let store = PgStore::connect(&settings, wharf::projections::pg_inline()).expect("a pool");
    let mut config = test.config();
    config.declarations.instance_ttl = Duration::from_secs(5);
    config.queue = QueueConfig {
        claim_batch: 10,
        concurrency: 10,
        poll_interval: Duration::from_millis(20),
        visibility_timeout: Duration::from_secs(2),
        ..QueueConfig::default()
    };
    let wharf = Wharf::with_store(Store::Postgres(store.clone()), &config.settings());
    let registration = Registration::new("billing", "orders", "1", &["orders/#"]).unwrap();
    wharf.register(&registration).await.unwrap();
    for chunk in 0..MESSAGES / 500 {
        let messages = (0..500)
            .map(|i| {
                let subject = format!("orders/{}", chunk * 500 + i);
                (subject.clone(), subject.into_bytes(), Headers::new())
            })
            .collect();
        wharf.publish("orders", messages).await.unwrap();
    }
    // Handlers of a millisecond: a batch is done well within the loop's linger, so the loop
    // keeps its connection from one fetch to the next, and 10,000 take a second at least.
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let consumer = wharf.consume_with(registration, {
        let seen = seen.clone();
        handler_fn(move |message: Claimed| {
            let seen = seen.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(1)).await;
                seen.lock().unwrap().insert(message.subject);
                Ok(())
            }
        })
    });
    let handled = |at_least: usize| {
        let seen = seen.clone();
        async move { seen.lock().unwrap().len() >= at_least }
    };
    wait_until("the consumer is busy", DEADLINE, || handled(MESSAGES / 10)).await;
    assert!(
        store.pool().size() as usize > store.pool().num_idle(),
        "a busy consumer has a connection out of its pool"
    );

    let Store::Postgres(admin) = &test.store else {
        unreachable!("a Postgres store")
    };
    let ended: i64 = sqlx::query_scalar(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE application_name = $1",
    )
    .bind(&name)
    .fetch_one(admin.pool())
    .await
    .unwrap();
    assert!(ended >= 1, "the consumer's sessions were ended");
    assert!(
        seen.lock().unwrap().len() < MESSAGES,
        "the sessions were ended while the consumer was busy"
    );

    wait_until("every message is handled", Duration::from_secs(60), || {
        handled(MESSAGES)
    })
    .await;
    let stats = consumer.shutdown().await;
    assert!(stats.handled_ok >= MESSAGES as u64, "{stats:?}");
    assert_eq!(stats.handled_err, 0, "{stats:?}");
}
