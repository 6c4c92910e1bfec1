//! `Queue::ack_and_fetch` on real stores, both backends (ADR 0035): the acks a fetch carries
//! are settled with its first claim and reported in the order given (acked, or lost when the
//! token is stale); what it claims never includes a message it acks (an expired claim acked by
//! its holder is done, not handed out again by the same call); an ack of another group is
//! refused naming the field, before anything is written; a fence failure after the acks were
//! settled still reports them.

use std::time::Duration;

use wharf::queue::{AckOutcome, InstallFence, Queue, QueueError, QueueSettings};
use wharf_tests::fixtures::{declare, group, msg, topic};
use wharf_tests::{on_both_backends, wait_until, Backend, TestStore};

fn queue(store: &TestStore, visibility: Duration) -> Queue {
    Queue::new(
        store.store.clone(),
        QueueSettings {
            visibility_timeout: visibility,
            ..QueueSettings::default()
        },
    )
}

async fn acks_ride_on_the_claim(backend: Backend) {
    let store = TestStore::new(backend).await;
    declare(&store, "a", "t", &["job/+"]).await;
    declare(&store, "b", "t", &["job/+"]).await;
    let queue = queue(&store, Duration::from_secs(30));
    let batch: Vec<_> = (0..6).map(|i| msg(&format!("job/{i}"))).collect();
    queue.publish(&topic("t"), &batch).await.unwrap();
    let first = queue.fetch(&group("a"), "x", 3).await.unwrap();
    assert_eq!(first.len(), 3);

    // Two real acks and a forged one ride on the next fetch.
    let mut forged = first[2].clone();
    forged.claim_token = forged.claim_token.wrapping_add(1);
    let carried = [first[0].clone(), first[1].clone(), forged];
    let next = queue
        .ack_and_fetch(&carried, &group("a"), "x", None, 2)
        .await
        .unwrap();
    assert_eq!(
        next.acks,
        vec![AckOutcome::Acked, AckOutcome::Acked, AckOutcome::ClaimLost]
    );
    let claimed = next.fetched.unwrap();
    let positions: Vec<i64> = claimed.iter().map(|m| m.position).collect();
    assert_eq!(positions, vec![4, 5], "the next two, in position order");
    let stats = queue
        .group_stats(Some(&group("a")))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(
        (stats.in_flight, stats.claimable),
        (3, 1),
        "job/2 (its holder still has it) and the two just claimed are in flight: {stats:?}"
    );
    // The forged ack left the claim in place; its holder settles it, with the last two.
    let mut rest = vec![first[2].clone()];
    rest.extend(claimed);
    let last = queue
        .ack_and_fetch(&rest, &group("a"), "x", None, 10)
        .await
        .unwrap();
    assert_eq!(last.acks, vec![AckOutcome::Acked; 3]);
    let positions: Vec<i64> = last.fetched.unwrap().iter().map(|m| m.position).collect();
    assert_eq!(positions, vec![6], "only job/5 was left");

    // Another group's ack is refused, naming it; nothing was settled or claimed.
    let from_b = queue.fetch(&group("b"), "y", 1).await.unwrap();
    let refused = queue
        .ack_and_fetch(&from_b, &group("a"), "x", None, 1)
        .await
        .unwrap_err();
    match &refused {
        QueueError::Invalid(e) => {
            assert_eq!(e.field, "acks[0].group", "{refused}");
            assert_eq!(e.value, "b", "{refused}");
        }
        other => panic!("expected a validation error, got {other:?}"),
    }
    assert_eq!(queue.ack(&from_b[0]).await.unwrap(), AckOutcome::Acked);
}
on_both_backends!(acks_ride_on_the_claim, acks_ride_on_the_claim);

async fn an_expired_claim_acked_is_not_claimed_again_by_the_same_call(backend: Backend) {
    let store = TestStore::new(backend).await;
    declare(&store, "c", "u", &[]).await;
    let queue = queue(&store, Duration::from_millis(100));
    queue.publish_one(&topic("u"), msg("job/x")).await.unwrap();
    let held = queue.fetch(&group("c"), "slow", 1).await.unwrap();
    assert_eq!(held.len(), 1);
    // Wait until the claim has expired: it is claimable again.
    wait_until("the claim expires", Duration::from_secs(10), || async {
        let stats = queue
            .group_stats(Some(&group("c")))
            .await
            .unwrap()
            .remove(0);
        stats.claimable == 1
    })
    .await;
    // Its holder's handler finished anyway: the ack (token still current) settles it, and the
    // claim in the same call does not hand it out again.
    let next = queue
        .ack_and_fetch(&held, &group("c"), "slow", None, 5)
        .await
        .unwrap();
    assert_eq!(next.acks, vec![AckOutcome::Acked]);
    assert!(next.fetched.unwrap().is_empty());
    let stats = queue
        .group_stats(Some(&group("c")))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(stats.claimable + stats.in_flight, 0, "{stats:?}");
}
on_both_backends!(
    expired_claim_acked,
    an_expired_claim_acked_is_not_claimed_again_by_the_same_call
);

async fn a_fence_failure_after_the_acks_still_reports_them(backend: Backend) {
    let store = TestStore::new(backend).await;
    declare(&store, "d", "v", &["job/+"]).await;
    let queue = queue(&store, Duration::from_secs(30));
    let install = queue
        .effective_install(&group("d"))
        .await
        .unwrap()
        .unwrap()
        .position;
    queue
        .publish(&topic("v"), &[msg("job/1"), msg("job/2")])
        .await
        .unwrap();
    let held = queue
        .fetch_fenced(&group("d"), "x", InstallFence::joined(install), 1)
        .await
        .unwrap();
    assert_eq!(held.len(), 1);
    // A swap moves the install on: the fenced fetch claims nothing more, but its ack counts.
    declare(&store, "d", "v", &["job/#"]).await;
    let next = queue
        .ack_and_fetch(
            &held,
            &group("d"),
            "x",
            Some(InstallFence::joined(install)),
            5,
        )
        .await
        .unwrap();
    assert_eq!(next.acks, vec![AckOutcome::Acked]);
    assert!(
        matches!(next.fetched, Err(QueueError::Fenced { joined, .. }) if joined == install),
        "{:?}",
        next.fetched
    );
}
on_both_backends!(
    fence_after_acks,
    a_fence_failure_after_the_acks_still_reports_them
);

/// Large batches: 600 claimed at once, each handed out once with its own subject, then all
/// 600 acked by the next fetch, which claims the rest, with a stale ack among them still
/// reported lost in its place.
async fn batches_wider_than_one_statement(backend: Backend) {
    let store = TestStore::new(backend).await;
    declare(&store, "a", "t", &["job/+"]).await;
    let queue = queue(&store, Duration::from_secs(30));
    let batch: Vec<_> = (0..700).map(|i| msg(&format!("job/{i}"))).collect();
    queue.publish(&topic("t"), &batch).await.unwrap();
    let first = queue.fetch(&group("a"), "x", 600).await.unwrap();
    let positions: Vec<i64> = first.iter().map(|m| m.position).collect();
    assert_eq!(positions, (1..=600).collect::<Vec<i64>>());
    for m in &first {
        assert_eq!(m.subject, format!("job/{}", m.position - 1), "{m:?}");
    }

    let mut carried = first.clone();
    let mut stale = first[299].clone();
    stale.claim_token = stale.claim_token.wrapping_add(1);
    carried.insert(300, stale);
    let next = queue
        .ack_and_fetch(&carried, &group("a"), "x", None, 600)
        .await
        .unwrap();
    let mut expected = vec![AckOutcome::Acked; 601];
    expected[300] = AckOutcome::ClaimLost;
    assert_eq!(next.acks, expected);
    let rest: Vec<i64> = next.fetched.unwrap().iter().map(|m| m.position).collect();
    assert_eq!(rest, (601..=700).collect::<Vec<i64>>());
    let stats = queue
        .group_stats(Some(&group("a")))
        .await
        .unwrap()
        .remove(0);
    assert_eq!((stats.in_flight, stats.claimable), (100, 0), "{stats:?}");
}
on_both_backends!(
    batches_wider_than_one_statement,
    batches_wider_than_one_statement
);
