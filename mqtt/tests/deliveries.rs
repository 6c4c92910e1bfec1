//! What a delivery carries from a real Mosquitto: topic, payload, flags and the v5 properties
//! (user properties in order, content type, the subscription identifier); QoS 0 needs no ack;
//! overlapping subscriptions give one copy each.

mod common;

use common::{mosquitto_pub, next_delivery, options, shared_port, unique};
use wharf_mqtt::{AckOutcome, DisconnectReason, QoS, Session};

#[tokio::test]
async fn a_delivery_carries_its_properties() {
    let base = unique("wharf-test/props");
    let topic = format!("{base}/a");
    let (handle, mut deliveries) = Session::connect(options(shared_port(), &unique("props")))
        .await
        .unwrap();
    handle
        .subscribe(vec![(format!("{base}/#"), QoS::AtLeastOnce)], Some(42))
        .await
        .unwrap();
    mosquitto_pub(
        shared_port(),
        &[
            "-q",
            "1",
            "-t",
            &topic,
            "-m",
            "hello",
            "-D",
            "publish",
            "user-property",
            "trace",
            "t-1",
            "-D",
            "publish",
            "user-property",
            "trace",
            "t-2",
            "-D",
            "publish",
            "content-type",
            "text/plain",
        ],
    );
    let delivery = next_delivery(&mut deliveries).await;
    assert_eq!(delivery.topic, topic);
    assert_eq!(&delivery.payload[..], b"hello");
    assert_eq!(
        (delivery.qos, delivery.dup, delivery.retain),
        (QoS::AtLeastOnce, false, false)
    );
    let properties = &delivery.properties;
    assert_eq!(
        properties.user_properties,
        vec![
            ("trace".to_string(), "t-1".to_string()),
            ("trace".to_string(), "t-2".to_string())
        ]
    );
    assert_eq!(properties.content_type.as_deref(), Some("text/plain"));
    assert_eq!(properties.subscription_identifiers, vec![42]);
    assert_eq!(handle.ack(&delivery).await, AckOutcome::Sent);
}

#[tokio::test]
async fn qos0_and_retained_deliveries() {
    let topic = format!("{}/r", unique("wharf-test/retained"));
    mosquitto_pub(
        shared_port(),
        &["-q", "0", "-r", "-t", &topic, "-m", "kept"],
    );
    let (handle, mut deliveries) = Session::connect(options(shared_port(), &unique("qos0")))
        .await
        .unwrap();
    handle
        .subscribe(vec![(topic.clone(), QoS::AtMostOnce)], None)
        .await
        .unwrap();
    let retained = next_delivery(&mut deliveries).await;
    assert_eq!(
        (&retained.payload[..], retained.retain),
        (&b"kept"[..], true)
    );
    assert_eq!((retained.qos, retained.pkid), (QoS::AtMostOnce, 0));
    assert_eq!(handle.ack(&retained).await, AckOutcome::NotRequired);
    // Clear the retained message so reruns start clean.
    handle
        .publish(&topic, Vec::<u8>::new(), QoS::AtMostOnce, true)
        .await
        .unwrap();
    handle.disconnect(DisconnectReason::Normal).await.unwrap();
}

#[tokio::test]
async fn overlapping_subscriptions_deliver_one_copy_each_with_its_own_identifier() {
    let base = unique("wharf-test/overlap");
    let (handle, mut deliveries) = Session::connect(options(shared_port(), &unique("overlap")))
        .await
        .unwrap();
    handle
        .subscribe(vec![(format!("{base}/#"), QoS::AtLeastOnce)], Some(42))
        .await
        .unwrap();
    handle
        .subscribe(vec![(format!("{base}/+"), QoS::AtLeastOnce)], Some(43))
        .await
        .unwrap();
    mosquitto_pub(
        shared_port(),
        &["-q", "1", "-t", &format!("{base}/a"), "-m", "x"],
    );
    let first = next_delivery(&mut deliveries).await;
    let second = next_delivery(&mut deliveries).await;
    assert_ne!(first.pkid, second.pkid, "two copies, two packet ids");
    let mut ids = vec![
        first.properties.subscription_identifiers.clone(),
        second.properties.subscription_identifiers.clone(),
    ];
    ids.sort();
    assert_eq!(ids, vec![vec![42], vec![43]]);
    assert_eq!(handle.ack(&first).await, AckOutcome::Sent);
    assert_eq!(handle.ack(&second).await, AckOutcome::Sent);
}
