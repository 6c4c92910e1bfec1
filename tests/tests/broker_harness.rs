//! The private-broker harness itself: a persistent broker keeps a session and its queued
//! messages across a restart on the same port, a non-persistent one forgets them, and
//! `max_qos` reaches the CONNACK.

use wharf_mqtt::{DisconnectReason, QoS};
use wharf_tests::broker::{Broker, BrokerConfig};
use wharf_tests::sessions::{next_delivery, publish, resume_session, unique};

/// Subscribes `client` to `topic`, leaves, publishes one message to it while it is away.
async fn leave_a_message(broker: &Broker, client: &str, topic: &str) {
    let (handle, _deliveries) = resume_session(broker.port, client).await;
    let filters = vec![(topic.to_owned(), QoS::AtLeastOnce)];
    handle.subscribe(filters, None).await.expect("subscribe");
    let _ = handle.disconnect(DisconnectReason::Normal).await;
    publish(broker.port, topic, "kept").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persistent_broker_keeps_sessions_across_a_restart() {
    let mut broker = Broker::start(BrokerConfig::default().persistent());
    let port = broker.port;
    let (client, topic) = (unique("harness-keep"), unique("harness/keep"));
    leave_a_message(&broker, &client, &topic).await;
    tokio::task::block_in_place(|| broker.restart());
    assert_eq!(broker.port, port, "the same port");
    let (handle, mut deliveries) = resume_session(broker.port, &client).await;
    assert!(handle.connack().session_present, "{}", broker.log());
    let kept = next_delivery(&mut deliveries).await;
    assert_eq!(
        (kept.topic.as_str(), &kept.payload[..]),
        (topic.as_str(), &b"kept"[..])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_without_persistence_forgets_sessions_and_takes_a_new_config() {
    let mut broker = Broker::start(BrokerConfig::default());
    let (client, topic) = (unique("harness-forget"), unique("harness/forget"));
    leave_a_message(&broker, &client, &topic).await;
    tokio::task::block_in_place(|| broker.restart_with(BrokerConfig::default().with_max_qos(1)));
    let (handle, _deliveries) = resume_session(broker.port, &client).await;
    assert!(!handle.connack().session_present);
    assert_eq!(handle.connack().maximum_qos, QoS::AtLeastOnce);
}
