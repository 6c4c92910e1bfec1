//! `Queue::ack_many` on real stores, both backends: one call settles claims of several groups,
//! reports each outcome in the order given (acked, or lost when the token is stale or the
//! message was already settled; an expired claim and its successor in one batch: only the
//! successor), and leaves the unacked deliveries alone.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use wharf::queue::{AckOutcome, Queue, QueueSettings};
use wharf_tests::fixtures::{declare, group, msg, topic};
use wharf_tests::{on_both_backends, wait_until, Backend, TestStore};

async fn ack_many_settles_each_claim_it_holds(backend: Backend) {
    let store = TestStore::new(backend).await;
    declare(&store, "a", "t", &["job/+"]).await;
    declare(&store, "b", "t", &["job/#"]).await;
    let queue = Queue::new(
        store.store.clone(),
        QueueSettings {
            visibility_timeout: Duration::from_secs(30),
            ..QueueSettings::default()
        },
    );
    let batch: Vec<_> = (0..4).map(|i| msg(&format!("job/{i}"))).collect();
    queue.publish(&topic("t"), &batch).await.unwrap();
    let from_a = queue.fetch(&group("a"), "x", 3).await.unwrap();
    let from_b = queue.fetch(&group("b"), "y", 2).await.unwrap();
    assert_eq!((from_a.len(), from_b.len()), (3, 2));

    // One already acked on its own, one with a forged (stale) token.
    assert_eq!(queue.ack(&from_a[1]).await.unwrap(), AckOutcome::Acked);
    let mut forged = from_b[1].clone();
    forged.claim_token = forged.claim_token.wrapping_add(1);
    let outcomes = queue
        .ack_many(&[
            from_a[0].clone(),
            from_a[1].clone(),
            from_b[0].clone(),
            forged,
            from_a[2].clone(),
        ])
        .await
        .unwrap();
    assert_eq!(
        outcomes,
        vec![
            AckOutcome::Acked,
            AckOutcome::ClaimLost,
            AckOutcome::Acked,
            AckOutcome::ClaimLost,
            AckOutcome::Acked,
        ]
    );
    // The forged ack left b's claim in place: its holder can still settle it.
    assert_eq!(queue.ack(&from_b[1]).await.unwrap(), AckOutcome::Acked);
    let stats = queue.group_stats(None).await.unwrap();
    let in_flight: Vec<(String, i64, i64)> = stats
        .iter()
        .map(|s| (s.group.clone(), s.in_flight, s.claimable))
        .collect();
    assert_eq!(
        in_flight,
        vec![("a".to_owned(), 0, 1), ("b".to_owned(), 0, 2)],
        "a has job/3 left; b has job/2 and job/3 left"
    );
    assert!(queue.ack_many(&[]).await.unwrap().is_empty());

    // An expired claim and its successor on the same message, in one batch: only the
    // successor's ack counts.
    declare(&store, "c", "u", &[]).await;
    let short = Queue::new(
        store.store.clone(),
        QueueSettings {
            visibility_timeout: Duration::from_millis(100),
            ..QueueSettings::default()
        },
    );
    short.publish_one(&topic("u"), msg("job/x")).await.unwrap();
    let expired = short.fetch(&group("c"), "old", 1).await.unwrap().remove(0);
    let successor = Arc::new(Mutex::new(None));
    wait_until(
        "the claim expires and is taken over",
        Duration::from_secs(20),
        || {
            let (short, successor) = (short.clone(), successor.clone());
            async move {
                let got = short.claim(&group("c"), "new", 1).await.unwrap().pop();
                let found = got.is_some();
                *successor.lock().unwrap() = got;
                found
            }
        },
    )
    .await;
    let successor = successor.lock().unwrap().take().unwrap();
    assert_eq!(successor.position, expired.position);
    assert_eq!(
        short.ack_many(&[expired, successor]).await.unwrap(),
        vec![AckOutcome::ClaimLost, AckOutcome::Acked]
    );
}
on_both_backends!(ack_many, ack_many_settles_each_claim_it_holds);
