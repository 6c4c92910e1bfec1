//! Persistent sessions against a real Mosquitto: an unacked delivery is replayed on the next
//! connection; an ack from an earlier connection sends nothing; a replayed PUBREL is completed;
//! a broker that stops answering times requests out without freeing their ids; a broker that
//! goes away ends the deliveries with a cause.

mod common;

use common::{end_of, next_delivery, options, shared_port, unique, until, Broker};
use wharf_mqtt::{
    AckOutcome, ConnectOptions, Credentials, DisconnectCause, DisconnectReason, MqttError, QoS,
    Session, SubscribeReason,
};

fn persistent(port: u16, client_id: &str) -> ConnectOptions {
    let mut options = options(port, client_id);
    options.session_expiry = 300;
    options
}

async fn end_session(port: u16, client_id: &str) {
    let (handle, _deliveries) = Session::connect(options(port, client_id))
        .await
        .expect("connect with clean start");
    handle
        .disconnect(DisconnectReason::Normal)
        .await
        .expect("disconnect");
}

#[tokio::test]
async fn an_unacked_delivery_is_replayed_and_a_stale_ack_sends_nothing() {
    let client_id = unique("persist");
    let topic = format!("{}/t", unique("wharf-test/persist"));
    let mut session = persistent(shared_port(), &client_id);
    let (first, mut first_deliveries) = Session::connect(session.clone()).await.unwrap();
    assert!(!first.connack().session_present);
    let granted = first
        .subscribe(vec![(topic.clone(), QoS::AtLeastOnce)], Some(11))
        .await
        .unwrap();
    assert_eq!(granted, vec![SubscribeReason::Granted(QoS::AtLeastOnce)]);
    let (publisher, _) = Session::connect(options(shared_port(), &unique("pub")))
        .await
        .unwrap();
    publisher
        .publish(&topic, "m1", QoS::AtLeastOnce, false)
        .await
        .unwrap();

    let original = next_delivery(&mut first_deliveries).await;
    assert_eq!(
        (original.topic.as_str(), &original.payload[..]),
        (topic.as_str(), &b"m1"[..])
    );
    assert_eq!((original.qos, original.dup), (QoS::AtLeastOnce, false));
    assert_eq!(original.generation, first.generation());
    assert_eq!(original.properties.subscription_identifiers, vec![11]);
    // Not acked. Leave, keeping the session.
    first.disconnect(DisconnectReason::Normal).await.unwrap();
    assert!(matches!(
        end_of(&mut first_deliveries).await,
        DisconnectCause::Local(_)
    ));

    session.clean_start = false;
    let (second, mut second_deliveries) = Session::connect(session.clone()).await.unwrap();
    assert!(second.connack().session_present);
    assert!(second.generation() > first.generation());
    let replay = next_delivery(&mut second_deliveries).await;
    assert!(replay.dup, "a replay carries DUP");
    assert_eq!(&replay.payload[..], b"m1");
    assert_eq!(replay.generation, second.generation());
    // Same packet id as the original: an unfenced ack of the original would ack the replay.
    assert_eq!(replay.pkid, original.pkid);
    assert_eq!(second.ack(&original).await, AckOutcome::StaleConnection);
    assert_eq!(first.ack(&original).await, AckOutcome::StaleConnection);
    second.disconnect(DisconnectReason::Normal).await.unwrap();

    // The stale ack sent nothing: the broker still holds the message and replays it again.
    let (third, mut third_deliveries) = Session::connect(session.clone()).await.unwrap();
    let again = next_delivery(&mut third_deliveries).await;
    assert_eq!((&again.payload[..], again.dup), (&b"m1"[..], true));
    assert_eq!(third.ack(&again).await, AckOutcome::Sent);
    assert_eq!(third.ack(&again).await, AckOutcome::AlreadyAcked);
    third.disconnect(DisconnectReason::Normal).await.unwrap();

    // Acked on its own connection: not replayed. The broker sends what it holds first on
    // reconnect, so the first delivery being a fresh marker shows nothing was held.
    let (fourth, mut fourth_deliveries) = Session::connect(session.clone()).await.unwrap();
    assert!(fourth.connack().session_present);
    publisher
        .publish(&topic, "marker", QoS::AtLeastOnce, false)
        .await
        .unwrap();
    let next = next_delivery(&mut fourth_deliveries).await;
    assert_eq!((&next.payload[..], next.dup), (&b"marker"[..], false));
    assert_eq!(fourth.ack(&next).await, AckOutcome::Sent);
    fourth.disconnect(DisconnectReason::Normal).await.unwrap();
    end_session(shared_port(), &client_id).await;
}

#[tokio::test]
async fn a_pubrel_replayed_after_reconnect_is_completed() {
    let broker = Broker::start("");
    let client_id = unique("qos2");
    let topic = format!("{}/t", unique("wharf-test/qos2"));
    let mut session = persistent(broker.port, &client_id);
    let (first, mut first_deliveries) = Session::connect(session.clone()).await.unwrap();
    first
        .subscribe(vec![(topic.clone(), QoS::ExactlyOnce)], None)
        .await
        .unwrap();
    common::mosquitto_pub(broker.port, &["-q", "2", "-t", &topic, "-m", "exactly"]);
    let delivery = next_delivery(&mut first_deliveries).await;
    assert_eq!(delivery.qos, QoS::ExactlyOnce);

    // The broker reads our PUBREC only after we are gone, so its PUBREL is still owed.
    broker.pause();
    assert_eq!(first.ack(&delivery).await, AckOutcome::Sent);
    first.disconnect(DisconnectReason::Normal).await.unwrap();
    broker.resume();
    assert_eq!(first.releases_completed(), 0);

    session.clean_start = false;
    let (second, mut second_deliveries) = Session::connect(session.clone()).await.unwrap();
    assert!(second.connack().session_present);
    until("the replayed PUBREL is completed", || {
        second.releases_completed() == 1
    })
    .await;
    assert_eq!(second.disconnected(), None, "a replayed PUBREL is no error");
    second.disconnect(DisconnectReason::Normal).await.unwrap();
    drop(second_deliveries.next().await);

    // Completed: a third connection gets no PUBREL before a fresh marker.
    let (third, mut third_deliveries) = Session::connect(session).await.unwrap();
    common::mosquitto_pub(broker.port, &["-q", "1", "-t", &topic, "-m", "marker"]);
    let marker = next_delivery(&mut third_deliveries).await;
    assert_eq!(&marker.payload[..], b"marker");
    assert_eq!(third.releases_completed(), 0);
}

#[tokio::test]
async fn a_silent_broker_times_requests_out_and_their_ids_stay_reserved() {
    let broker = Broker::start("");
    let mut connect = options(broker.port, &unique("silent"));
    connect.operation_timeout = std::time::Duration::from_secs(2);
    let (handle, _deliveries) = Session::connect(connect).await.unwrap();
    let receive_maximum = usize::from(handle.connack().receive_maximum);
    assert_eq!(receive_maximum, 20);

    broker.pause();
    let tasks: Vec<_> = (0..25)
        .map(|i| {
            let handle = handle.clone();
            tokio::spawn(async move {
                handle
                    .subscribe(vec![(format!("silent/{i}"), QoS::AtLeastOnce)], None)
                    .await
            })
        })
        .collect();
    until("receive maximum requests in flight", || {
        handle.in_flight() == receive_maximum
    })
    .await;
    for task in tasks {
        let error = task.await.unwrap().unwrap_err();
        assert_eq!(
            error.to_string(),
            "MQTT SUBSCRIBE not acknowledged within 2s"
        );
    }
    // Never more than the broker allows, and a timed-out request keeps its id until acked.
    assert_eq!(handle.in_flight(), receive_maximum);

    broker.resume();
    until("the late SUBACKs free their ids", || {
        handle.in_flight() == 0
    })
    .await;
    let reasons = handle
        .subscribe(vec![("silent/after".to_string(), QoS::AtLeastOnce)], None)
        .await
        .unwrap();
    assert_eq!(reasons, vec![SubscribeReason::Granted(QoS::AtLeastOnce)]);
}

#[tokio::test]
async fn a_broker_going_away_ends_the_deliveries_with_a_cause() {
    let mut broker = Broker::start("");
    let (handle, mut deliveries) = Session::connect(options(broker.port, &unique("gone")))
        .await
        .unwrap();
    handle
        .subscribe(vec![("gone/#".to_string(), QoS::AtLeastOnce)], None)
        .await
        .unwrap();
    broker.kill();
    let cause = end_of(&mut deliveries).await;
    assert!(cause.is_remote(), "{cause}");
    assert_eq!(handle.closed().await, cause);
    // Every later call says so.
    assert_eq!(deliveries.next().await.unwrap_err(), cause);
    let error = handle
        .subscribe(vec![("gone/x".to_string(), QoS::AtMostOnce)], None)
        .await
        .unwrap_err();
    assert!(
        matches!(&error, MqttError::Disconnected { cause: c, .. } if *c == cause),
        "{error}"
    );
}

#[tokio::test]
async fn a_refused_connection_names_the_client_and_reason_and_no_credential() {
    // The later line wins: this broker refuses anonymous clients and knows no passwords.
    let broker = Broker::start("allow_anonymous false");
    let mut login = options(broker.port, "refused-client");
    login.credentials = Some(Credentials::new("alice-user", "hunter2-secret"));
    let error = Session::connect(login).await.unwrap_err();
    let shown = format!("{error} {error:?}");
    assert!(matches!(error, MqttError::ConnectRefused { .. }), "{shown}");
    assert!(shown.contains("refused-client"), "{shown}");
    assert!(shown.contains("(0x8"), "{shown}");
    assert!(
        !shown.contains("alice-user") && !shown.contains("hunter2-secret"),
        "{shown}"
    );

    let mut bad = options(broker.port, "");
    bad.clean_start = false;
    let error = Session::connect(bad).await.unwrap_err();
    assert!(error.to_string().contains("client_id"), "{error}");

    let closed_port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let error = Session::connect(options(closed_port, "x"))
        .await
        .unwrap_err();
    assert!(matches!(error, MqttError::Connect { .. }), "{error}");
    assert!(error
        .to_string()
        .contains(&format!("127.0.0.1:{closed_port}")));
}
