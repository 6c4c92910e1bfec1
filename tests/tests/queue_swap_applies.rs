//! A swap governs every claim after it (ADR 0014), on real stores, both backends, step by step.
//!
//! - Deliveries routed under the old set and not acked (queued, in flight, backing off) are
//!   handed out after the swap only when the new set matches them; the rest are set aside,
//!   counted in the listing and in the swap's record, and an ack by the claim that held one
//!   still settles it.
//! - Messages the old set routed past (never delivered) that the new set matches are delivered
//!   after the swap, while the log holds them; retention keeps them until their age limit.
//! - Nothing acked is ever handed out again; a rollback is symmetric: set-aside deliveries
//!   come back, acked ones do not.
//! - A claim fenced by an install the group has moved on from fails with `Fenced`.

use std::time::Duration;

use wharf::domain::GroupName;
use wharf_queue::{AckOutcome, Claimed, InstallFence, Queue, QueueError, QueueSettings};
use wharf_tests::fixtures::{declare, group, msg, topic};
use wharf_tests::{on_both_backends, Backend, TestStore};

const HOUR: Duration = Duration::from_secs(3600);

fn settings(visibility_timeout: Duration) -> QueueSettings {
    QueueSettings {
        visibility_timeout,
        max_attempts: 10,
        backoff_base: Duration::from_millis(10),
        backoff_max: Duration::from_millis(10),
        route_batch: 3,
    }
}

/// Fetches until a fetch comes back empty; returns everything claimed, in claim order.
async fn drain(queue: &Queue, g: &GroupName) -> Vec<Claimed> {
    let mut all = Vec::new();
    loop {
        let got = queue.fetch(g, "test:1:aa", 2).await.unwrap();
        if got.is_empty() {
            return all;
        }
        all.extend(got);
    }
}

/// Drains until `count` claims came back or the deadline passed: a restored set-aside delivery
/// keeps its backoff (10 ms here), so it becomes claimable a moment after the swap back.
async fn drain_count(queue: &Queue, g: &GroupName, count: usize) -> Vec<Claimed> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut all = drain(queue, g).await;
    while all.len() < count && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
        all.extend(drain(queue, g).await);
    }
    all.extend(drain(queue, g).await);
    all
}

fn subjects(claims: &[Claimed]) -> Vec<String> {
    let mut subjects: Vec<String> = claims.iter().map(|c| c.subject.clone()).collect();
    subjects.sort();
    subjects
}

async fn ack_all(queue: &Queue, claims: &[Claimed]) {
    for claim in claims {
        assert_eq!(
            queue.ack(claim).await.unwrap(),
            AckOutcome::Acked,
            "{claim:?}"
        );
    }
}

async fn install_of(queue: &Queue, g: &GroupName) -> i64 {
    queue.effective_install(g).await.unwrap().unwrap().position
}

// ---------------------------------------------------------------------------------------------

async fn a_swap_hands_out_only_the_new_sets_messages(backend: Backend) {
    let store = TestStore::new(backend).await;
    let queue = Queue::new(store.store.clone(), settings(HOUR));
    let g = group("g");
    declare(&store, "g", "orders", &["x/+"]).await;
    let old = install_of(&queue, &g).await;
    let interleaved = ["x/1", "y/1", "x/2", "y/2", "x/3", "y/3", "x/4", "y/4"];
    let batch: Vec<_> = interleaved.iter().map(|s| msg(s)).collect();
    queue.publish(&topic("orders"), &batch).await.unwrap();

    // Under {x/+}: x/1 handled and acked, x/2 in flight, x/3 nacked (backing off); x/4 lies
    // beyond what this fetch needed routed (three per step), so {x/+} never routed it.
    let first = queue.fetch(&g, "old:1:aa", 3).await.unwrap();
    assert_eq!(subjects(&first), ["x/1", "x/2", "x/3"]);
    assert!(first.iter().all(|c| c.routed_by == old));
    ack_all(&queue, &first[..1]).await;
    queue.nack(&first[2], "later").await.unwrap();
    let in_flight = first[1].clone();

    // Swap to {y/+}: only y messages from here on, including the ones routed past under x.
    declare(&store, "g", "orders", &["y/+"]).await;
    let new = install_of(&queue, &g).await;
    assert!(new > old);
    let after = drain(&queue, &g).await;
    assert_eq!(subjects(&after), ["y/1", "y/2", "y/3", "y/4"]);
    assert!(after.iter().all(|c| c.routed_by == new), "{after:?}");
    let stats = queue.group_stats(Some(&g)).await.unwrap().remove(0);
    assert_eq!(
        (stats.set_aside, stats.claimable, stats.rescan_remaining),
        (2, 0, 0),
        "x/2 (in flight) and x/3 (backing off) are set aside: {stats:?}"
    );
    let swaps = queue.swaps(&g, 10).await.unwrap();
    assert_eq!(swaps[0].install, new);
    assert_eq!(
        (swaps[0].kept, swaps[0].set_aside, swaps[0].restored),
        (0, 2, 0)
    );
    assert_eq!(
        (swaps[0].rescan_from, swaps[0].rescan_until),
        (1, 6),
        "the log from its start to where {{x/+}} had routed"
    );

    // The old handler finishes after the swap: its ack still settles the message.
    assert_eq!(queue.ack(&in_flight).await.unwrap(), AckOutcome::Acked);
    ack_all(&queue, &after).await;
    assert!(
        drain(&queue, &g).await.is_empty(),
        "nothing acked comes again"
    );

    // Rollback to {x/+}: the set-aside message comes back, acked ones never do, and x/4 (never
    // delivered) is delivered now.
    queue
        .publish(&topic("orders"), &[msg("x/5"), msg("y/5")])
        .await
        .unwrap();
    declare(&store, "g", "orders", &["x/+"]).await;
    let back = drain_count(&queue, &g, 3).await;
    assert_eq!(subjects(&back), ["x/3", "x/4", "x/5"]);
    let swaps = queue.swaps(&g, 10).await.unwrap();
    assert_eq!(
        (swaps[0].kept, swaps[0].set_aside, swaps[0].restored),
        (0, 0, 1),
        "{swaps:?}"
    );
    let stats = queue.group_stats(Some(&g)).await.unwrap().remove(0);
    assert_eq!(stats.set_aside, 0, "{stats:?}");
    ack_all(&queue, &back).await;

    // And forward again: y/5 was routed past under {x/+} after the rollback: delivered now.
    declare(&store, "g", "orders", &["y/+"]).await;
    assert_eq!(subjects(&drain(&queue, &g).await), ["y/5"]);
}
on_both_backends!(
    swap_and_rollback,
    a_swap_hands_out_only_the_new_sets_messages
);

// ---------------------------------------------------------------------------------------------

async fn a_lapsed_claim_goes_to_the_new_set_only_if_it_matches(backend: Backend) {
    let store = TestStore::new(backend).await;
    let short = Queue::new(store.store.clone(), settings(Duration::from_millis(200)));
    let g = group("g");
    declare(&store, "g", "orders", &["x/+", "k/+"]).await;
    short
        .publish(&topic("orders"), &[msg("x/1"), msg("k/1")])
        .await
        .unwrap();
    let held = short.fetch(&g, "old:1:aa", 2).await.unwrap();
    assert_eq!(subjects(&held), ["k/1", "x/1"]);

    // The new set keeps k/+ and drops x/+; both claims then lapse.
    declare(&store, "g", "orders", &["k/+", "y/+"]).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let again = loop {
        let got = short.fetch(&g, "new:1:bb", 5).await.unwrap();
        if !got.is_empty() {
            break got;
        }
        assert!(std::time::Instant::now() < deadline, "k/1 never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        subjects(&again),
        ["k/1"],
        "only the message the new set matches"
    );
    assert_eq!(again[0].attempts, 2, "a redelivery of the lapsed claim");
    let swaps = short.swaps(&g, 1).await.unwrap();
    assert_eq!((swaps[0].kept, swaps[0].set_aside), (1, 1), "{swaps:?}");
    assert_eq!(
        short.ack(&held[1]).await.unwrap(),
        AckOutcome::ClaimLost,
        "x/1's lapsed claim was not re-claimed, but k/1's was: {held:?}"
    );
}
on_both_backends!(
    lapsed_claim,
    a_lapsed_claim_goes_to_the_new_set_only_if_it_matches
);

// ---------------------------------------------------------------------------------------------

async fn routing_past_a_message_does_not_let_retention_drop_it(backend: Backend) {
    let store = TestStore::new(backend).await;
    let queue = Queue::new(store.store.clone(), settings(HOUR));
    let g = group("g");
    declare(&store, "g", "orders", &["x/+"]).await;
    queue
        .publish(&topic("orders"), &[msg("x/1"), msg("y/1")])
        .await
        .unwrap();
    ack_all(&queue, &drain(&queue, &g).await).await;
    let report = queue.retain(HOUR, HOUR, 100).await.unwrap();
    assert_eq!(
        report.messages, 0,
        "nothing is older than an hour: {report:?}"
    );
    declare(&store, "g", "orders", &["y/+"]).await;
    assert_eq!(subjects(&drain(&queue, &g).await), ["y/1"]);
}
on_both_backends!(
    retention_by_age,
    routing_past_a_message_does_not_let_retention_drop_it
);

// ---------------------------------------------------------------------------------------------

async fn a_fenced_fetch_stops_at_the_next_install(backend: Backend) {
    let store = TestStore::new(backend).await;
    let queue = Queue::new(store.store.clone(), settings(HOUR));
    let g = group("g");
    declare(&store, "g", "orders", &["x/+"]).await;
    let joined = install_of(&queue, &g).await;
    queue
        .publish(&topic("orders"), &[msg("x/1")])
        .await
        .unwrap();
    let got = queue
        .fetch_fenced(&g, "a:1:aa", InstallFence::joined(joined), 5)
        .await
        .unwrap();
    assert_eq!(subjects(&got), ["x/1"]);
    declare(&store, "g", "orders", &["x/+", "y/+"]).await;
    queue
        .publish(&topic("orders"), &[msg("x/2")])
        .await
        .unwrap();
    match queue
        .fetch_fenced(&g, "a:1:aa", InstallFence::joined(joined), 5)
        .await
    {
        Err(QueueError::Fenced {
            joined: j, current, ..
        }) => {
            assert_eq!(j, joined);
            assert!(current > Some(joined), "{current:?}");
        }
        other => panic!("expected Fenced, got {other:?}"),
    }
    let current = install_of(&queue, &g).await;
    let got = queue
        .fetch_fenced(&g, "b:1:bb", InstallFence::joined(current), 5)
        .await
        .unwrap();
    assert_eq!(subjects(&got), ["x/2"]);
}
on_both_backends!(fenced_fetch, a_fenced_fetch_stops_at_the_next_install);

/// The claim statement itself is fenced: deliveries another instance already routed under the
/// next install are there to be claimed, and a fetch fenced by the earlier install takes none
/// of them (it must not hand out a message of a set its instance did not declare).
async fn a_fenced_claim_takes_nothing_routed_under_the_next_install(backend: Backend) {
    let store = TestStore::new(backend).await;
    let queue = Queue::new(store.store.clone(), settings(HOUR));
    let g = group("g");
    declare(&store, "g", "orders", &["x/+"]).await;
    let joined = install_of(&queue, &g).await;
    declare(&store, "g", "orders", &["x/+", "y/+"]).await;
    let current = install_of(&queue, &g).await;
    queue
        .publish(&topic("orders"), &[msg("x/1"), msg("y/1")])
        .await
        .unwrap();
    // Route under the new install without claiming: the deliveries wait, stamped with it.
    while queue.route(&g).await.unwrap().more(3) {}
    let stats = queue.group_stats(Some(&g)).await.unwrap();
    assert_eq!(stats[0].claimable, 2, "{stats:?}");
    match queue
        .fetch_fenced(&g, "a:1:aa", InstallFence::joined(joined), 5)
        .await
    {
        Err(QueueError::Fenced { joined: j, .. }) => assert_eq!(j, joined),
        other => panic!("expected Fenced with nothing claimed, got {other:?}"),
    }
    let got = queue
        .fetch_fenced(&g, "b:1:bb", InstallFence::joined(current), 5)
        .await
        .unwrap();
    assert_eq!(subjects(&got), ["x/1", "y/1"]);
}
on_both_backends!(
    fenced_claim,
    a_fenced_claim_takes_nothing_routed_under_the_next_install
);
