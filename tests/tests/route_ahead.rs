//! Routing ahead of the claims (ADR 0050), on Postgres: while a consumer's handlers hold every
//! slot (so its claim loop fetches nothing), its router still routes the log about one routing
//! batch past the positions it claimed, and no further; the messages routed ahead are then
//! handled exactly once. On SQLite the claims route for themselves (ADR 0069): the log is
//! routed exactly as far as they claimed, nothing is left routed and unclaimed.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use wharf::config::QueueConfig;
use wharf::domain::GroupName;
use wharf::handler::handler_fn;
use wharf::queue::{Claimed, Headers};
use wharf::{Registration, Wharf};
use wharf_tests::{on_both_backends, on_postgres, wait_until, Backend, TestStore};

const DEADLINE: Duration = Duration::from_secs(20);
/// Log positions per routing step.
const ROUTE_BATCH: i64 = 10;
const MESSAGES: usize = 100;

fn wharf(store: &TestStore) -> Wharf {
    let mut config = store.config();
    config.declarations.instance_ttl = Duration::from_secs(5);
    config.queue = QueueConfig {
        route_batch: ROUTE_BATCH,
        claim_batch: 5,
        concurrency: 5,
        poll_interval: Duration::from_millis(20),
        visibility_timeout: Duration::from_secs(10),
        drain_timeout: Duration::from_secs(10),
        ..QueueConfig::default()
    };
    Wharf::with_store(store.store.clone(), &config.settings())
}

async fn routed_position(wharf: &Wharf) -> i64 {
    let group = GroupName::parse("group", "billing").unwrap();
    let stats = wharf.queue().group_stats(Some(&group)).await.unwrap();
    stats.first().map_or(0, |s| s.routed_position)
}

/// A consumer of every message of `orders` whose handlers wait for the gate; the positions
/// published, the gate, and what the handlers finished.
struct Gated {
    wharf: Wharf,
    consumer: wharf::Consumer,
    positions: Vec<i64>,
    gate: watch::Sender<bool>,
    handled: Arc<Mutex<Vec<i64>>>,
}

/// With `aligned`, a routing step aligns the group's routing with its install (ADR 0014)
/// before anything is published, as every step after a group's first does.
async fn gated_consumer(store: &TestStore, aligned: bool) -> Gated {
    let wharf = wharf(store);
    let registration = Registration::new("billing", "orders", "1", &["orders/#"]).unwrap();
    wharf.register(&registration).await.unwrap();
    if aligned {
        let group = GroupName::parse("group", "billing").unwrap();
        let report = wharf.queue().route(&group).await.unwrap();
        assert!(report.swap.is_some() && report.scanned == 0, "{report:?}");
    }
    let messages = (0..MESSAGES)
        .map(|i| {
            let subject = format!("orders/{i}");
            (subject.clone(), subject.into_bytes(), Headers::new())
        })
        .collect();
    let positions = wharf.publish("orders", messages).await.unwrap();
    let (gate, opened) = watch::channel(false);
    let handled = Arc::new(Mutex::new(Vec::<i64>::new()));
    let consumer = wharf.consume_with(registration, {
        let handled = handled.clone();
        handler_fn(move |message: Claimed| {
            let (handled, mut opened) = (handled.clone(), opened.clone());
            async move {
                opened.wait_for(|open| *open).await.ok();
                handled.lock().unwrap().push(message.position);
                Ok(())
            }
        })
    });
    Gated {
        wharf,
        consumer,
        positions,
        gate,
        handled,
    }
}

/// Opens the gate and checks every message is handled exactly once.
async fn each_handled_once(gated: Gated) {
    let Gated {
        consumer,
        positions,
        gate,
        handled,
        ..
    } = gated;
    gate.send_replace(true);
    wait_until("every message is handled", DEADLINE, || {
        let handled = handled.clone();
        async move { handled.lock().unwrap().len() >= MESSAGES }
    })
    .await;
    let stats = consumer.shutdown().await;
    let handled = handled.lock().unwrap().clone();
    let distinct: BTreeSet<i64> = handled.iter().copied().collect();
    assert_eq!(
        handled.len(),
        MESSAGES,
        "each message handled once: {stats:?}"
    );
    assert_eq!(distinct, positions.into_iter().collect::<BTreeSet<_>>());
}

on_postgres!(
    the_router_keeps_a_batch_routed_ahead_of_the_claims,
    router_keeps_a_batch_ahead
);
async fn router_keeps_a_batch_ahead(backend: Backend) {
    let store = TestStore::new(backend).await;
    let gated = gated_consumer(&store, false).await;
    let (wharf, positions, handled) = (&gated.wharf, &gated.positions, &gated.handled);

    // The first fetch routed one step itself and claimed the first five; every slot is now
    // held, so only the router can route.
    let first_claimed = positions[4];
    wait_until(
        "the router is a routing batch past the claims",
        DEADLINE,
        || {
            let wharf = wharf.clone();
            async move { routed_position(&wharf).await >= first_claimed + ROUTE_BATCH }
        },
    )
    .await;
    let routed = routed_position(wharf).await;
    assert!(
        routed < first_claimed + 2 * ROUTE_BATCH,
        "the router stops once a batch ahead: routed to {routed}, claimed up to {first_claimed}"
    );
    assert!(
        handled.lock().unwrap().is_empty(),
        "no handler has finished yet"
    );
    each_handled_once(gated).await;
}

on_both_backends!(
    on_sqlite_claims_route_only_what_they_take,
    claims_route_what_they_take
);
async fn claims_route_what_they_take(backend: Backend) {
    let store = TestStore::new(backend).await;
    let gated = gated_consumer(&store, true).await;
    let group = GroupName::parse("group", "billing").unwrap();
    // Every slot held by the first five claimed.
    wait_until("the first five are claimed", DEADLINE, || {
        let wharf = gated.wharf.clone();
        let group = group.clone();
        async move {
            let stats = wharf.queue().group_stats(Some(&group)).await.unwrap();
            stats.first().is_some_and(|s| s.in_flight == 5)
        }
    })
    .await;
    let stats = gated.wharf.queue().group_stats(Some(&group)).await.unwrap();
    if backend == Backend::Sqlite {
        // The claims routed exactly as far as they claimed: nothing routed and left unclaimed.
        assert_eq!(
            (stats[0].routed_position, stats[0].claimable),
            (gated.positions[4], 0),
            "{stats:?}"
        );
    } else {
        // A routing step of its own routes a whole batch (ADR 0050).
        assert!(
            stats[0].routed_position >= gated.positions[0] + ROUTE_BATCH - 1,
            "{stats:?}"
        );
    }
    each_handled_once(gated).await;
}
