//! Keep alive and broker-side endings against a real Mosquitto: our PINGREQs keep an idle
//! connection open past the broker's 1.5x keep-alive cut-off; an unanswered PINGREQ ends the
//! connection; a second connection with the same client id ends the first from the broker's
//! side.

mod common;

use std::time::Duration;

use common::{end_of, next_delivery, options, unique, Broker};
use wharf_mqtt::{DisconnectCause, QoS, Session};

#[tokio::test]
async fn pings_keep_an_idle_connection_and_a_missing_pingresp_ends_it() {
    let broker = Broker::start("");
    let topic = unique("idle/t");
    let mut idle = options(broker.port, &unique("idle"));
    idle.keep_alive = 1;
    let (handle, mut deliveries) = Session::connect(idle).await.unwrap();
    assert_eq!(handle.connack().keep_alive, 1);
    handle
        .subscribe(vec![(topic.clone(), QoS::AtLeastOnce)], None)
        .await
        .unwrap();
    // The behaviour under test is time passing with nothing to send: without our PINGREQs
    // Mosquitto drops a client after 1.5 keep-alive intervals.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_eq!(handle.disconnected(), None);
    common::mosquitto_pub(broker.port, &["-q", "1", "-t", &topic, "-m", "still here"]);
    assert_eq!(
        &next_delivery(&mut deliveries).await.payload[..],
        b"still here"
    );

    broker.pause();
    let cause = end_of(&mut deliveries).await;
    broker.resume();
    assert_eq!(cause, DisconnectCause::KeepAliveTimeout);
}

#[tokio::test]
async fn a_session_taken_over_ends_the_first_connection_from_the_brokers_side() {
    let broker = Broker::start("");
    let client_id = unique("takeover");
    let (first, mut first_deliveries) = Session::connect(options(broker.port, &client_id))
        .await
        .unwrap();
    let (second, _second_deliveries) = Session::connect(options(broker.port, &client_id))
        .await
        .unwrap();
    // Mosquitto 2.0.11 closes the old connection without a DISCONNECT (nor does it send one on
    // SIGTERM or a keep-alive expiry); the cause says the broker's side ended it.
    let cause = end_of(&mut first_deliveries).await;
    assert_eq!(cause, DisconnectCause::BrokerClosed);
    assert!(cause.is_remote());
    assert_eq!(first.disconnected(), Some(cause));
    assert_eq!(second.disconnected(), None);
}
