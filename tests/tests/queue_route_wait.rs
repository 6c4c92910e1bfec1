//! A fetch that finds another routing step running (Postgres: the group row is locked) and
//! nothing to claim waits for that step to commit and claims what it routed, instead of coming
//! back empty while the deliveries it needs are about to commit. A claim loop woken by a publish
//! whose own fetch came back empty that way slept until the next publish or its poll interval
//! (seen in CI: the router beside the claim loop, woken by the same publish, held the row).
//!
//! The wait is bounded: a holder that outlasts it leaves the fetch empty, not failed, and the
//! next fetch claims.

use std::time::Duration;

use sqlx::PgConnection;
use wharf::store::Store;
use wharf_queue::{Queue, QueueSettings};
use wharf_tests::fixtures::{declare, group, msg, topic};
use wharf_tests::{hold_group_row, other_session, wait_until, Backend, TestStore};

const DEADLINE: Duration = Duration::from_secs(20);

/// A fetch running in a task of its own.
type Fetching = tokio::task::JoinHandle<Result<Vec<wharf_queue::Claimed>, wharf_queue::QueueError>>;

fn settings() -> QueueSettings {
    QueueSettings {
        route_batch: 50,
        ..QueueSettings::default()
    }
}

/// How many sessions wait for a lock `holder` holds.
async fn blocked_by(test: &TestStore, holder: i32) -> i64 {
    let Store::Postgres(pg) = &test.store else {
        unreachable!("a Postgres store")
    };
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
    )
    .bind(holder)
    .fetch_one(pg.pool())
    .await
    .unwrap()
}

/// A group `billing` with one message published and not routed, its row held by a session of
/// its own (returned, its transaction open), and a fetch waiting for that row.
async fn fetch_behind_a_held_group_row() -> (TestStore, Queue, PgConnection, Fetching) {
    let test = TestStore::new(Backend::Postgres).await;
    declare(&test, "billing", "orders", &["orders/#"]).await;
    let queue = Queue::new(test.store.clone(), settings());
    queue
        .publish_one(&topic("orders"), msg("orders/1"))
        .await
        .unwrap();

    let mut router = other_session(&test).await;
    let holder = hold_group_row(&mut router, "billing").await;
    let fetching = {
        let queue = queue.clone();
        tokio::spawn(async move { queue.fetch(&group("billing"), "i1", 8).await })
    };
    wait_until("the fetch waits for the routing step", DEADLINE, || async {
        blocked_by(&test, holder).await == 1
    })
    .await;
    (test, queue, router, fetching)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_with_nothing_to_claim_waits_for_the_routing_step_in_progress() {
    // The store lives to the end of the test (dropping it drops its schema).
    let (_test, _queue, mut router, fetching) = fetch_behind_a_held_group_row().await;
    assert!(
        !fetching.is_finished(),
        "the fetch came back while the row was held"
    );

    sqlx::query("COMMIT").execute(&mut router).await.unwrap();
    let claimed = fetching.await.unwrap().unwrap();
    let subjects: Vec<&str> = claimed.iter().map(|m| m.subject.as_str()).collect();
    assert_eq!(subjects, ["orders/1"], "claimed once the step committed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_outlasts_the_wait_leaves_the_fetch_empty_not_failed() {
    let (_test, queue, mut router, fetching) = fetch_behind_a_held_group_row().await;
    // The row stays held: the fetch gives up waiting (its lock timeout) on its own.
    let claimed = fetching.await.unwrap().unwrap();
    assert!(
        claimed.is_empty(),
        "nothing was routed while the row was held"
    );

    sqlx::query("ROLLBACK").execute(&mut router).await.unwrap();
    let claimed = queue.fetch(&group("billing"), "i1", 8).await.unwrap();
    assert_eq!(claimed.len(), 1, "the next fetch routes and claims");
}
