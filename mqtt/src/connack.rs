//! What the broker said in CONNACK, as the session's handle keeps it: the limits and features in
//! force on one connection.

use rumqttc::v5::mqttbytes::v5::{ConnAck, ConnAckProperties};

use crate::options::ConnectOptions;
use crate::reason::QoS;

/// What the broker said in CONNACK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnAckInfo {
    /// The broker resumed a session it held for this client id.
    pub session_present: bool,
    /// How many of our QoS 1/2 publishes (and, here, any request with a packet id) may be
    /// unacknowledged at once (65535 when the broker does not say).
    pub receive_maximum: u16,
    /// The highest QoS the broker accepts (2 when it does not say).
    pub maximum_qos: QoS,
    /// The session expiry in force: the broker's if it sent one, else ours.
    pub session_expiry: u32,
    /// The keep alive in force: the broker's Server Keep Alive if sent, else ours.
    pub keep_alive: u16,
    /// The broker's Maximum Packet Size, if it has one.
    pub max_packet_size: Option<u32>,
    /// The client id the broker assigned, when we sent an empty one.
    pub assigned_client_id: Option<String>,
    /// Whether the broker accepts `$share/` filters.
    pub shared_subscriptions_available: bool,
    /// Whether the broker accepts Subscription Identifiers.
    pub subscription_identifiers_available: bool,
}

impl ConnAckInfo {
    pub(crate) fn new(ack: &ConnAck, options: &ConnectOptions) -> ConnAckInfo {
        let properties = ack.properties.clone().unwrap_or_default_props();
        ConnAckInfo {
            session_present: ack.session_present,
            receive_maximum: properties.receive_max.unwrap_or(u16::MAX).max(1),
            maximum_qos: properties
                .max_qos
                .and_then(QoS::from_level)
                .unwrap_or(QoS::ExactlyOnce),
            session_expiry: properties
                .session_expiry_interval
                .unwrap_or(options.session_expiry),
            keep_alive: properties.server_keep_alive.unwrap_or(options.keep_alive),
            max_packet_size: properties.max_packet_size,
            assigned_client_id: properties.assigned_client_identifier,
            shared_subscriptions_available: properties.shared_subscription_available != Some(0),
            subscription_identifiers_available: properties.subscription_identifiers_available
                != Some(0),
        }
    }
}

trait PropsOrDefault {
    fn unwrap_or_default_props(self) -> ConnAckProperties;
}

impl PropsOrDefault for Option<ConnAckProperties> {
    fn unwrap_or_default_props(self) -> ConnAckProperties {
        self.unwrap_or(ConnAckProperties {
            session_expiry_interval: None,
            receive_max: None,
            max_qos: None,
            retain_available: None,
            max_packet_size: None,
            assigned_client_identifier: None,
            topic_alias_max: None,
            reason_string: None,
            user_properties: Vec::new(),
            wildcard_subscription_available: None,
            subscription_identifiers_available: None,
            shared_subscription_available: None,
            server_keep_alive: None,
            response_information: None,
            server_reference: None,
            authentication_method: None,
            authentication_data: None,
        })
    }
}
