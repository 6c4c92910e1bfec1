//! The message log end to end at its simplest: a declared group receives exactly the published
//! messages its set matches, claims them, and acks them.

use wharf::domain::{GroupName, TopicName};
use wharf::Registration;
use wharf_queue::{AckOutcome, Headers, OutgoingMessage, Queue, QueueSettings};
use wharf_tests::{on_both_backends, Backend, TestStore};

async fn publish_route_claim_ack(backend: Backend) {
    let store = TestStore::new(backend).await;
    let wharf = store.wharf();
    wharf
        .register(&Registration::new("billing", "orders", "1", &["orders/+/paid"]).unwrap())
        .await
        .unwrap();
    let queue = Queue::new(store.store.clone(), QueueSettings::default());
    let topic = TopicName::parse("topic", "orders").unwrap();
    let subjects = [
        "orders/eu/paid",
        "orders/eu/refunded",
        "orders/us/paid",
        "other",
    ];
    let messages: Vec<OutgoingMessage> = subjects
        .iter()
        .map(|s| OutgoingMessage::new(s, s.as_bytes().to_vec(), Headers::new()).unwrap())
        .collect();
    let positions = queue.publish(&topic, &messages).await.unwrap();
    assert_eq!(positions, vec![1, 2, 3, 4]);
    let group = GroupName::parse("group", "billing").unwrap();
    let claimed = queue.fetch(&group, "i1", 10).await.unwrap();
    let got: Vec<&str> = claimed.iter().map(|c| c.subject.as_str()).collect();
    assert_eq!(got, vec!["orders/eu/paid", "orders/us/paid"]);
    assert!(claimed.iter().all(|c| c.attempts == 1));
    assert!(queue.fetch(&group, "i2", 10).await.unwrap().is_empty());
    for message in &claimed {
        assert_eq!(queue.ack(message).await.unwrap(), AckOutcome::Acked);
        assert_eq!(queue.ack(message).await.unwrap(), AckOutcome::ClaimLost);
    }
    let stats = queue.group_stats(Some(&group)).await.unwrap();
    assert_eq!(stats[0].routed_position, 4);
    assert_eq!(stats[0].claimable + stats[0].in_flight, 0);
    let topics = queue.topic_stats().await.unwrap();
    assert_eq!((topics[0].head, topics[0].size), (4, 4));
}
on_both_backends!(smoke, publish_route_claim_ack);
