//! A claim that routes for itself (ADR 0069), on real stores. On SQLite, once a group's routing
//! is aligned with its install, a claim the routed deliveries cannot fill routes what is new in
//! its own transaction and inserts what it takes already claimed: the cursor moves exactly as
//! far as the claim took, routed deliveries are handed out before new ones, a sparse set is
//! still found past the claim's scan, and a fenced-out claim routes nothing. On Postgres the
//! same fetches route whole batches in steps of their own (ADR 0050); the messages handed out
//! are the same.

use std::time::{Duration, Instant};

use wharf::domain::GroupName;
use wharf_queue::{AckOutcome, InstallFence, Queue, QueueError, QueueSettings};
use wharf_tests::fixtures::{declare, group, msg, topic};
use wharf_tests::{on_both_backends, Backend, TestStore};

const DEADLINE: Duration = Duration::from_secs(30);
const ROUTE_BATCH: i64 = 10;

fn settings() -> QueueSettings {
    QueueSettings {
        route_batch: ROUTE_BATCH,
        ..QueueSettings::default()
    }
}

/// A group `g` on topic `t` taking `job/+`, its routing aligned with its install (the first
/// routing step after an install applies it, ADR 0014), and its queue.
async fn aligned_group(store: &TestStore) -> (Queue, GroupName) {
    declare(store, "g", "t", &["job/+"]).await;
    let queue = Queue::new(store.store.clone(), settings());
    let g = group("g");
    let report = queue.route(&g).await.unwrap();
    assert!(report.swap.is_some() && report.scanned == 0, "{report:?}");
    (queue, g)
}

async fn publish(queue: &Queue, subjects: &[String]) -> Vec<i64> {
    let batch: Vec<_> = subjects.iter().map(|s| msg(s)).collect();
    queue.publish(&topic("t"), &batch).await.unwrap()
}

fn subjects(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{prefix}/{i}")).collect()
}

async fn stats(queue: &Queue, g: &GroupName) -> (i64, i64, i64) {
    let s = queue.group_stats(Some(g)).await.unwrap().remove(0);
    (s.routed_position, s.claimable, s.in_flight)
}

async fn a_claim_routes_only_what_it_takes(backend: Backend) {
    let store = TestStore::new(backend).await;
    let (queue, g) = aligned_group(&store).await;
    // Every other message matches.
    let all: Vec<String> = (0..30)
        .map(|i| {
            if i % 2 == 0 {
                format!("job/{i}")
            } else {
                format!("other/{i}")
            }
        })
        .collect();
    let positions = publish(&queue, &all).await;
    let matching: Vec<i64> = positions.iter().step_by(2).copied().collect();

    let claimed = queue.fetch(&g, "a", 5).await.unwrap();
    let got: Vec<i64> = claimed.iter().map(|c| c.position).collect();
    assert_eq!(
        got,
        matching[..5].to_vec(),
        "the first five matches, in order"
    );
    assert!(claimed.iter().all(|c| c.attempts == 1), "{claimed:?}");
    if backend == Backend::Sqlite {
        assert_eq!(
            stats(&queue, &g).await,
            (matching[4], 0, 5),
            "routed to the fifth match, nothing routed and left unclaimed"
        );
    } else {
        assert_eq!(
            stats(&queue, &g).await,
            (positions[9], 0, 5),
            "one step of ten"
        );
    }
    // Acked, they are gone; the next claim goes on from the cursor.
    for claim in &claimed {
        assert_eq!(queue.ack(claim).await.unwrap(), AckOutcome::Acked);
    }
    let next = queue.fetch(&g, "a", 5).await.unwrap();
    let got: Vec<i64> = next.iter().map(|c| c.position).collect();
    assert_eq!(got, matching[5..10].to_vec());
}
on_both_backends!(routes_what_it_takes, a_claim_routes_only_what_it_takes);

async fn routed_deliveries_are_handed_out_before_new_ones(backend: Backend) {
    let store = TestStore::new(backend).await;
    let (queue, g) = aligned_group(&store).await;
    let positions = publish(&queue, &subjects("job", 30)).await;
    // A routing step of its own routes the first batch: ten deliveries wait.
    assert_eq!(queue.route(&g).await.unwrap().routed, 10);

    let claimed = queue.fetch(&g, "a", 14).await.unwrap();
    let got: Vec<i64> = claimed.iter().map(|c| c.position).collect();
    assert_eq!(
        got,
        positions[..14].to_vec(),
        "routed first, then new, in order"
    );
    let routed = if backend == Backend::Sqlite {
        (positions[13], 0)
    } else {
        (positions[19], 6)
    };
    assert_eq!(stats(&queue, &g).await, (routed.0, routed.1, 14));
}
on_both_backends!(
    routed_first,
    routed_deliveries_are_handed_out_before_new_ones
);

async fn a_sparse_set_is_found_past_the_claims_scan(backend: Backend) {
    let store = TestStore::new(backend).await;
    let (queue, g) = aligned_group(&store).await;
    // Three and a half routing batches of other subjects, then one match.
    let mut all = subjects("other", 35);
    all.push("job/1".to_owned());
    let positions = publish(&queue, &all).await;

    let start = Instant::now();
    let mut claimed = Vec::new();
    while claimed.is_empty() {
        assert!(start.elapsed() < DEADLINE, "the match was never claimed");
        claimed = queue.fetch(&g, "a", 5).await.unwrap();
    }
    let got: Vec<(i64, &str)> = claimed
        .iter()
        .map(|c| (c.position, c.subject.as_str()))
        .collect();
    assert_eq!(got, vec![(positions[35], "job/1")]);
    let (routed, claimable, in_flight) = stats(&queue, &g).await;
    assert_eq!((claimable, in_flight), (0, 1));
    assert!(routed >= positions[35], "routed past the match: {routed}");
}
on_both_backends!(sparse_set, a_sparse_set_is_found_past_the_claims_scan);

async fn a_fenced_out_claim_routes_nothing(backend: Backend) {
    let store = TestStore::new(backend).await;
    let (queue, g) = aligned_group(&store).await;
    let install = queue.effective_install(&g).await.unwrap().unwrap().position;
    let before = stats(&queue, &g).await;
    publish(&queue, &subjects("job", 5)).await;

    // An instance that joined under another install claims nothing, and routes nothing.
    let fenced = queue
        .fetch_fenced(&g, "lapsed", InstallFence::joined(install + 1), 5)
        .await;
    assert!(
        matches!(fenced, Err(QueueError::Fenced { .. })),
        "{fenced:?}"
    );
    assert_eq!(stats(&queue, &g).await, before);
    // The instance holding the install claims all five.
    assert_eq!(
        queue
            .fetch_fenced(&g, "a", InstallFence::joined(install), 5)
            .await
            .unwrap()
            .len(),
        5
    );
}
on_both_backends!(fenced_out, a_fenced_out_claim_routes_nothing);
