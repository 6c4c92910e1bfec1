//! Lazy routing and the claim floor, on real stores, both backends:
//!
//! - `fetch` claims from what is already routed and routes the next slice of the log only when
//!   that runs short, so a busy group's routed-but-unclaimed deliveries stay within about one
//!   routing batch;
//! - the claim floor (Postgres: where a claim's index scan starts) never passes a delivery that
//!   still exists: a message held by a dead instance comes back after its visibility timeout
//!   while the rest of the group races ahead, and a dead letter replayed far below the group's
//!   progress is claimed again. On Postgres the tests also read the floor itself, to show it
//!   did move past acked work (otherwise they would prove nothing about it).

use std::time::{Duration, Instant};

use wharf::domain::GroupName;
use wharf::store::Store;
use wharf_queue::{AckOutcome, Claimed, NackOutcome, Queue, QueueSettings};
use wharf_tests::fixtures::{declare, group, msg, topic};
use wharf_tests::{on_both_backends, Backend, TestStore};

const DEADLINE: Duration = Duration::from_secs(60);
const ROUTE_BATCH: i64 = 50;

fn settings() -> QueueSettings {
    QueueSettings {
        visibility_timeout: Duration::from_millis(300),
        max_attempts: 5,
        backoff_base: Duration::from_millis(10),
        backoff_max: Duration::from_secs(1),
        route_batch: ROUTE_BATCH,
    }
}

async fn publish_jobs(queue: &Queue, count: usize) -> Vec<i64> {
    let batch: Vec<_> = (0..count).map(|i| msg(&format!("job/{i}"))).collect();
    queue.publish(&topic("t"), &batch).await.unwrap()
}

async fn routed_position(queue: &Queue, g: &GroupName) -> i64 {
    queue.group_stats(Some(g)).await.unwrap()[0].routed_position
}

/// The group's claim floor on Postgres; `None` on SQLite, which has no floor (a deleted row's
/// b-tree cell is gone at commit, so there is nothing for a claim to walk over).
async fn claim_floor(store: &Store, g: &GroupName) -> Option<i64> {
    match store {
        Store::Sqlite(_) => None,
        Store::Postgres(s) => Some(
            sqlx::query_scalar("SELECT claim_floor FROM consumer_group WHERE group_name = $1")
                .bind(g.as_str())
                .fetch_one(s.pool())
                .await
                .unwrap(),
        ),
    }
}

/// Fetches and acks (as `instance`) until `count` messages are acked; returns them.
async fn consume(queue: &Queue, g: &GroupName, instance: &str, count: usize) -> Vec<Claimed> {
    let start = Instant::now();
    let mut acked = Vec::new();
    while acked.len() < count {
        assert!(start.elapsed() < DEADLINE, "consuming {count} timed out");
        for claim in queue.fetch(g, instance, 10).await.unwrap() {
            assert_eq!(queue.ack(&claim).await.unwrap(), AckOutcome::Acked);
            acked.push(claim);
        }
    }
    acked
}

async fn fetch_routes_only_when_routed_deliveries_run_short(backend: Backend) {
    let store = TestStore::new(backend).await;
    declare(&store, "g", "t", &["job/+"]).await;
    let queue = Queue::new(store.store.clone(), settings());
    let g = group("g");
    let positions = publish_jobs(&queue, 200).await;
    let start = positions[0] - 1;

    // The first fetch finds nothing routed, routes one batch and claims from it.
    let first = queue.fetch(&g, "a", 10).await.unwrap();
    assert_eq!(first.len(), 10);
    assert_eq!(routed_position(&queue, &g).await, start + ROUTE_BATCH);
    // Four more fetches are served by that batch alone: the log is not routed further.
    let mut claimed = first;
    for _ in 0..4 {
        claimed.extend(queue.fetch(&g, "a", 10).await.unwrap());
        assert_eq!(routed_position(&queue, &g).await, start + ROUTE_BATCH);
    }
    let got: Vec<i64> = claimed.iter().map(|c| c.position).collect();
    assert_eq!(got, positions[..50].to_vec(), "the first batch, in order");
    // The batch is all claimed: the next fetch comes up empty on its claim, routes, and
    // claims from the new batch in the same call. On Postgres that is a routing step of a
    // whole batch; on SQLite the claim routes in its own transaction, only as far as it
    // claims (ADR 0069).
    let next = queue.fetch(&g, "a", 10).await.unwrap();
    let got: Vec<i64> = next.iter().map(|c| c.position).collect();
    assert_eq!(got, positions[50..60].to_vec());
    let routed_to = if backend == Backend::Sqlite {
        positions[59]
    } else {
        start + 2 * ROUTE_BATCH
    };
    assert_eq!(routed_position(&queue, &g).await, routed_to);
}
on_both_backends!(
    lazy_routing,
    fetch_routes_only_when_routed_deliveries_run_short
);

async fn a_claim_held_by_a_dead_instance_is_not_left_below_the_floor(backend: Backend) {
    let store = TestStore::new(backend).await;
    declare(&store, "g", "t", &["job/+"]).await;
    // Long enough that the survivor normally finishes the rest inside it; if a slow machine
    // lets the claim expire first, the message simply shows up among the survivor's acks.
    let queue = Queue::new(
        store.store.clone(),
        QueueSettings {
            visibility_timeout: Duration::from_secs(2),
            ..settings()
        },
    );
    let g = group("g");
    let positions = publish_jobs(&queue, 300).await;

    // The doomed instance takes the very first message and never settles it.
    let doomed = queue.fetch(&g, "doomed", 1).await.unwrap();
    assert_eq!(doomed[0].position, positions[0]);
    // Meanwhile the survivor works through everything else, routing batch after batch.
    let mut acked = consume(&queue, &g, "survivor", 299).await;
    assert_eq!(routed_position(&queue, &g).await, positions[299]);
    if acked.iter().all(|c| c.position != positions[0]) {
        if let Some(floor) = claim_floor(&store.store, &g).await {
            assert_eq!(
                floor, positions[0],
                "held by the floor at the unsettled message"
            );
        }
        // After the visibility timeout the message comes back to the survivor.
        acked.extend(consume(&queue, &g, "survivor", 1).await);
    }
    let mut got: Vec<i64> = acked.iter().map(|c| c.position).collect();
    got.sort_unstable();
    assert_eq!(got, positions, "every message acked once");
    let back = acked.iter().find(|c| c.position == positions[0]).unwrap();
    assert_eq!(back.attempts, 2);
    assert_eq!(queue.ack(&doomed[0]).await.unwrap(), AckOutcome::ClaimLost);

    // Nothing is left; the next routing step moves the floor past everything routed.
    publish_jobs(&queue, 1).await;
    consume(&queue, &g, "survivor", 1).await;
    queue.fetch(&g, "survivor", 10).await.unwrap();
    if let Some(floor) = claim_floor(&store.store, &g).await {
        assert!(
            floor > positions[299],
            "floor {floor} passed the acked work"
        );
    }
}
on_both_backends!(
    dead_instance_below_floor,
    a_claim_held_by_a_dead_instance_is_not_left_below_the_floor
);

async fn a_dead_letter_replayed_below_the_floor_is_claimed_again(backend: Backend) {
    let store = TestStore::new(backend).await;
    declare(&store, "g", "t", &["job/+"]).await;
    let queue = Queue::new(
        store.store.clone(),
        QueueSettings {
            max_attempts: 1,
            ..settings()
        },
    );
    let g = group("g");
    let positions = publish_jobs(&queue, 200).await;
    let failed = queue.fetch(&g, "a", 1).await.unwrap().remove(0);
    assert_eq!(failed.position, positions[0]);
    assert_eq!(
        queue.nack(&failed, "poison").await.unwrap(),
        NackOutcome::DeadLettered
    );
    consume(&queue, &g, "a", 199).await;
    // One more routing step with nothing left below it puts the floor past the whole range.
    publish_jobs(&queue, 1).await;
    consume(&queue, &g, "a", 1).await;
    queue.fetch(&g, "a", 10).await.unwrap();
    if let Some(floor) = claim_floor(&store.store, &g).await {
        assert!(
            floor > positions[199],
            "floor {floor} is past the acked range"
        );
    }

    assert!(queue.replay_dead_letter(&g, failed.position).await.unwrap());
    if let Some(floor) = claim_floor(&store.store, &g).await {
        assert_eq!(floor, failed.position, "the replay lowered the floor");
    }
    let again = queue.fetch(&g, "b", 10).await.unwrap();
    let got: Vec<i64> = again.iter().map(|c| c.position).collect();
    assert_eq!(got, vec![failed.position]);
    assert_eq!(again[0].attempts, 1, "a replay restarts the attempts");
    assert_eq!(queue.ack(&again[0]).await.unwrap(), AckOutcome::Acked);
}
on_both_backends!(
    replay_below_floor,
    a_dead_letter_replayed_below_the_floor_is_claimed_again
);
