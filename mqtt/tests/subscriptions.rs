//! SUBSCRIBE and UNSUBSCRIBE against a real Mosquitto: concurrent requests each get their own
//! acknowledgement past the broker's Receive Maximum, ACL refusals and QoS downgrades come back
//! in their filter's position, and UNSUBACK tells removed from never-subscribed.

mod common;

use common::{options, shared_port, unique, Broker};
use wharf_mqtt::{MqttError, QoS, Session, SubscribeReason, UnsubscribeReason};

#[tokio::test]
async fn twenty_five_concurrent_subscribes_each_get_their_own_suback() {
    let (handle, _deliveries) = Session::connect(options(shared_port(), &unique("conc")))
        .await
        .unwrap();
    // Mosquitto allows 20 in flight: more requests than ids would collide without our allocator.
    assert_eq!(handle.connack().receive_maximum, 20);
    let base = unique("wharf-test/conc");
    let tasks: Vec<_> = (0..25u8)
        .map(|i| {
            let handle = handle.clone();
            // Each request has its own shape (1 to 3 filters, QoS 0 to 2), so an ack handed to
            // the wrong request would show as a wrong length or QoS.
            let qos = QoS::from_level(i % 3).unwrap();
            let filters: Vec<_> = (0..=i % 3)
                .map(|j| (format!("{base}/{i}/{j}"), qos))
                .collect();
            tokio::spawn(async move { (i, handle.subscribe(filters, None).await) })
        })
        .collect();
    for task in tasks {
        let (i, result) = task.await.unwrap();
        let reasons = result.unwrap_or_else(|error| panic!("request {i}: {error}"));
        let qos = QoS::from_level(i % 3).unwrap();
        assert_eq!(
            reasons,
            vec![SubscribeReason::Granted(qos); usize::from(i % 3) + 1],
            "request {i}"
        );
    }
}

/// Mosquitto 2.0.11's `acl_file` never refuses a SUBSCRIBE (it only filters what is delivered),
/// so the refusal comes from its dynamic security plugin: anonymous clients may subscribe to
/// `allowed/#` only.
const DYNSEC: &str = r#"{
  "defaultACLAccess": {"publishClientSend": true, "publishClientReceive": true,
                       "subscribe": false, "unsubscribe": true},
  "clients": [],
  "groups": [{"groupname": "anonymous", "roles": [{"rolename": "reader"}], "clients": []}],
  "roles": [{"rolename": "reader", "acls": [
    {"acltype": "subscribePattern", "topic": "allowed/#", "priority": 0, "allow": true}]}],
  "anonymousGroup": "anonymous"
}"#;

#[tokio::test]
async fn an_acl_denied_filter_is_not_authorized_in_its_position() {
    let config = format!(
        "plugin {}\nplugin_opt_config_file {{dir}}/dynamic-security.json",
        common::dynamic_security_plugin().display()
    );
    let broker = Broker::start_with(&config, &[("dynamic-security.json", DYNSEC)]);
    let (handle, _deliveries) = Session::connect(options(broker.port, &unique("acl")))
        .await
        .unwrap();
    let reasons = handle
        .subscribe(
            vec![
                ("allowed/a".to_string(), QoS::AtLeastOnce),
                ("denied/b".to_string(), QoS::AtLeastOnce),
                ("allowed/c/#".to_string(), QoS::AtMostOnce),
            ],
            Some(7),
        )
        .await
        .unwrap();
    assert_eq!(
        reasons,
        vec![
            SubscribeReason::Granted(QoS::AtLeastOnce),
            SubscribeReason::NotAuthorized,
            SubscribeReason::Granted(QoS::AtMostOnce),
        ]
    );
    assert_eq!(reasons[1].code(), 0x87);
}

#[tokio::test]
async fn max_qos_one_grants_one_for_a_requested_two() {
    let broker = Broker::start("max_qos 1");
    let (handle, _deliveries) = Session::connect(options(broker.port, &unique("maxqos")))
        .await
        .unwrap();
    assert_eq!(handle.connack().maximum_qos, QoS::AtLeastOnce);
    let reasons = handle
        .subscribe(vec![("sensors/#".to_string(), QoS::ExactlyOnce)], None)
        .await
        .unwrap();
    assert_eq!(reasons, vec![SubscribeReason::Granted(QoS::AtLeastOnce)]);
    // Publishing above the broker's maximum is refused before anything is sent.
    let error = handle
        .publish("sensors/a", "x", QoS::ExactlyOnce, false)
        .await
        .unwrap_err();
    assert!(matches!(error, MqttError::InvalidInput { .. }), "{error}");
}

#[tokio::test]
async fn unsubscribe_tells_removed_from_never_subscribed() {
    let (handle, _deliveries) = Session::connect(options(shared_port(), &unique("unsub")))
        .await
        .unwrap();
    let base = unique("wharf-test/unsub");
    let subscribed = format!("{base}/sensors/#");
    let shared = format!("$share/g/{base}/sensors/#");
    let granted = handle
        .subscribe(
            vec![
                (subscribed.clone(), QoS::AtLeastOnce),
                (shared.clone(), QoS::AtLeastOnce),
            ],
            None,
        )
        .await
        .unwrap();
    assert_eq!(granted, vec![SubscribeReason::Granted(QoS::AtLeastOnce); 2]);
    let reasons = handle
        .unsubscribe(vec![
            subscribed.clone(),
            format!("{base}/never/#"),
            shared.clone(),
        ])
        .await
        .unwrap();
    assert_eq!(
        reasons,
        vec![
            UnsubscribeReason::Success,
            UnsubscribeReason::NoSubscriptionExisted,
            UnsubscribeReason::Success,
        ]
    );
    let again = handle.unsubscribe(vec![subscribed]).await.unwrap();
    assert_eq!(again, vec![UnsubscribeReason::NoSubscriptionExisted]);
    assert_eq!(again[0].code(), 0x11);
}

#[tokio::test]
async fn bad_requests_are_refused_before_anything_is_sent() {
    let (handle, _deliveries) = Session::connect(options(shared_port(), &unique("bad")))
        .await
        .unwrap();
    let error = handle.subscribe(Vec::new(), None).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid filter list \"\": a SUBSCRIBE needs at least one filter"
    );
    let error = handle
        .subscribe(vec![("a/b".to_string(), QoS::AtMostOnce)], Some(0))
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("subscription identifier \"0\""),
        "{error}"
    );
    // The connection is still fine.
    let reasons = handle
        .subscribe(vec![(unique("wharf-test/ok"), QoS::AtMostOnce)], None)
        .await
        .unwrap();
    assert_eq!(reasons, vec![SubscribeReason::Granted(QoS::AtMostOnce)]);
}
