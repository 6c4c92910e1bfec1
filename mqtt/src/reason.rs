//! Our own QoS and reason-code types, so callers never see rumqttc's, and the mapping from the
//! codec's enums (MQTT v5 sections 3.2.2.2, 3.9.3, 3.11.3, 3.14.2.1).

use std::fmt;

use rumqttc::v5::mqttbytes::v5::{
    ConnectReturnCode, DisconnectReasonCode, PubAckReason, SubscribeReasonCode, UnsubAckReason,
};
use rumqttc::v5::mqttbytes::QoS as CodecQoS;

/// An MQTT quality of service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QoS {
    /// At most once (0).
    AtMostOnce,
    /// At least once (1).
    AtLeastOnce,
    /// Exactly once (2).
    ExactlyOnce,
}

impl QoS {
    /// The wire value, 0 to 2.
    pub fn level(self) -> u8 {
        match self {
            QoS::AtMostOnce => 0,
            QoS::AtLeastOnce => 1,
            QoS::ExactlyOnce => 2,
        }
    }

    /// The QoS for a wire value, or `None` above 2.
    pub fn from_level(level: u8) -> Option<QoS> {
        match level {
            0 => Some(QoS::AtMostOnce),
            1 => Some(QoS::AtLeastOnce),
            2 => Some(QoS::ExactlyOnce),
            _ => None,
        }
    }

    pub(crate) fn to_codec(self) -> CodecQoS {
        match self {
            QoS::AtMostOnce => CodecQoS::AtMostOnce,
            QoS::AtLeastOnce => CodecQoS::AtLeastOnce,
            QoS::ExactlyOnce => CodecQoS::ExactlyOnce,
        }
    }

    pub(crate) fn from_codec(qos: CodecQoS) -> QoS {
        match qos {
            CodecQoS::AtMostOnce => QoS::AtMostOnce,
            CodecQoS::AtLeastOnce => QoS::AtLeastOnce,
            CodecQoS::ExactlyOnce => QoS::ExactlyOnce,
        }
    }
}

impl fmt::Display for QoS {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "QoS {}", self.level())
    }
}

/// One filter's outcome in a SUBACK, in the order the filters were sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SubscribeReason {
    /// 0x00 to 0x02: subscribed with this maximum QoS (may be below the one requested).
    Granted(QoS),
    /// 0x80.
    Unspecified,
    /// 0x83.
    ImplementationSpecific,
    /// 0x87: the broker's ACL refused the filter.
    NotAuthorized,
    /// 0x8F.
    TopicFilterInvalid,
    /// 0x91.
    PacketIdInUse,
    /// 0x97.
    QuotaExceeded,
    /// 0x9E.
    SharedSubscriptionsNotSupported,
    /// 0xA1.
    SubscriptionIdsNotSupported,
    /// 0xA2.
    WildcardSubscriptionsNotSupported,
}

impl SubscribeReason {
    /// The wire reason code.
    pub fn code(self) -> u8 {
        match self {
            SubscribeReason::Granted(qos) => qos.level(),
            SubscribeReason::Unspecified => 0x80,
            SubscribeReason::ImplementationSpecific => 0x83,
            SubscribeReason::NotAuthorized => 0x87,
            SubscribeReason::TopicFilterInvalid => 0x8F,
            SubscribeReason::PacketIdInUse => 0x91,
            SubscribeReason::QuotaExceeded => 0x97,
            SubscribeReason::SharedSubscriptionsNotSupported => 0x9E,
            SubscribeReason::SubscriptionIdsNotSupported => 0xA1,
            SubscribeReason::WildcardSubscriptionsNotSupported => 0xA2,
        }
    }

    /// The QoS granted, or `None` for a failure code.
    pub fn granted(self) -> Option<QoS> {
        match self {
            SubscribeReason::Granted(qos) => Some(qos),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            SubscribeReason::Granted(_) => "granted",
            SubscribeReason::Unspecified => "unspecified error",
            SubscribeReason::ImplementationSpecific => "implementation specific error",
            SubscribeReason::NotAuthorized => "not authorized",
            SubscribeReason::TopicFilterInvalid => "topic filter invalid",
            SubscribeReason::PacketIdInUse => "packet identifier in use",
            SubscribeReason::QuotaExceeded => "quota exceeded",
            SubscribeReason::SharedSubscriptionsNotSupported => {
                "shared subscriptions not supported"
            }
            SubscribeReason::SubscriptionIdsNotSupported => {
                "subscription identifiers not supported"
            }
            SubscribeReason::WildcardSubscriptionsNotSupported => {
                "wildcard subscriptions not supported"
            }
        }
    }

    pub(crate) fn from_codec(code: SubscribeReasonCode) -> SubscribeReason {
        match code {
            SubscribeReasonCode::Success(qos) => SubscribeReason::Granted(QoS::from_codec(qos)),
            // The codec never reads `Failure` (0x80 reads as `Unspecified`); same byte.
            SubscribeReasonCode::Failure | SubscribeReasonCode::Unspecified => {
                SubscribeReason::Unspecified
            }
            SubscribeReasonCode::ImplementationSpecific => SubscribeReason::ImplementationSpecific,
            SubscribeReasonCode::NotAuthorized => SubscribeReason::NotAuthorized,
            SubscribeReasonCode::TopicFilterInvalid => SubscribeReason::TopicFilterInvalid,
            SubscribeReasonCode::PkidInUse => SubscribeReason::PacketIdInUse,
            SubscribeReasonCode::QuotaExceeded => SubscribeReason::QuotaExceeded,
            SubscribeReasonCode::SharedSubscriptionsNotSupported => {
                SubscribeReason::SharedSubscriptionsNotSupported
            }
            SubscribeReasonCode::SubscriptionIdNotSupported => {
                SubscribeReason::SubscriptionIdsNotSupported
            }
            SubscribeReasonCode::WildcardSubscriptionsNotSupported => {
                SubscribeReason::WildcardSubscriptionsNotSupported
            }
        }
    }
}

impl fmt::Display for SubscribeReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SubscribeReason::Granted(qos) => write!(f, "granted {qos} (0x{:02X})", self.code()),
            other => write!(f, "{} (0x{:02X})", other.name(), other.code()),
        }
    }
}

/// One filter's outcome in an UNSUBACK, in the order the filters were sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnsubscribeReason {
    /// 0x00: the subscription existed and is removed.
    Success,
    /// 0x11: there was no such subscription.
    NoSubscriptionExisted,
    /// 0x80.
    Unspecified,
    /// 0x83.
    ImplementationSpecific,
    /// 0x87.
    NotAuthorized,
    /// 0x8F.
    TopicFilterInvalid,
    /// 0x91.
    PacketIdInUse,
}

impl UnsubscribeReason {
    /// The wire reason code.
    pub fn code(self) -> u8 {
        match self {
            UnsubscribeReason::Success => 0x00,
            UnsubscribeReason::NoSubscriptionExisted => 0x11,
            UnsubscribeReason::Unspecified => 0x80,
            UnsubscribeReason::ImplementationSpecific => 0x83,
            UnsubscribeReason::NotAuthorized => 0x87,
            UnsubscribeReason::TopicFilterInvalid => 0x8F,
            UnsubscribeReason::PacketIdInUse => 0x91,
        }
    }

    /// True for 0x00 and 0x11: the broker holds no such subscription after this UNSUBACK.
    pub fn is_gone(self) -> bool {
        matches!(
            self,
            UnsubscribeReason::Success | UnsubscribeReason::NoSubscriptionExisted
        )
    }

    fn name(self) -> &'static str {
        match self {
            UnsubscribeReason::Success => "success",
            UnsubscribeReason::NoSubscriptionExisted => "no subscription existed",
            UnsubscribeReason::Unspecified => "unspecified error",
            UnsubscribeReason::ImplementationSpecific => "implementation specific error",
            UnsubscribeReason::NotAuthorized => "not authorized",
            UnsubscribeReason::TopicFilterInvalid => "topic filter invalid",
            UnsubscribeReason::PacketIdInUse => "packet identifier in use",
        }
    }

    pub(crate) fn from_codec(reason: UnsubAckReason) -> UnsubscribeReason {
        match reason {
            UnsubAckReason::Success => UnsubscribeReason::Success,
            UnsubAckReason::NoSubscriptionExisted => UnsubscribeReason::NoSubscriptionExisted,
            UnsubAckReason::UnspecifiedError => UnsubscribeReason::Unspecified,
            UnsubAckReason::ImplementationSpecificError => {
                UnsubscribeReason::ImplementationSpecific
            }
            UnsubAckReason::NotAuthorized => UnsubscribeReason::NotAuthorized,
            UnsubAckReason::TopicFilterInvalid => UnsubscribeReason::TopicFilterInvalid,
            UnsubAckReason::PacketIdentifierInUse => UnsubscribeReason::PacketIdInUse,
        }
    }
}

impl fmt::Display for UnsubscribeReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (0x{:02X})", self.name(), self.code())
    }
}

/// A wire reason code with its name, for CONNACK refusals, DISCONNECTs and PUBACKs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReasonCode {
    /// The byte on the wire.
    pub code: u8,
    /// The name the specification gives it.
    pub name: &'static str,
}

impl fmt::Display for ReasonCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (0x{:02X})", self.name, self.code)
    }
}

const fn rc(code: u8, name: &'static str) -> ReasonCode {
    ReasonCode { code, name }
}

pub(crate) fn connect_reason(code: ConnectReturnCode) -> ReasonCode {
    use ConnectReturnCode as C;
    match code {
        C::Success => rc(0x00, "success"),
        C::RefusedProtocolVersion | C::UnsupportedProtocolVersion => {
            rc(0x84, "unsupported protocol version")
        }
        C::BadClientId | C::ClientIdentifierNotValid => rc(0x85, "client identifier not valid"),
        C::ServiceUnavailable | C::ServerUnavailable => rc(0x88, "server unavailable"),
        C::UnspecifiedError => rc(0x80, "unspecified error"),
        C::MalformedPacket => rc(0x81, "malformed packet"),
        C::ProtocolError => rc(0x82, "protocol error"),
        C::ImplementationSpecificError => rc(0x83, "implementation specific error"),
        C::BadUserNamePassword => rc(0x86, "bad user name or password"),
        C::NotAuthorized => rc(0x87, "not authorized"),
        C::ServerBusy => rc(0x89, "server busy"),
        C::Banned => rc(0x8A, "banned"),
        C::BadAuthenticationMethod => rc(0x8C, "bad authentication method"),
        C::TopicNameInvalid => rc(0x90, "topic name invalid"),
        C::PacketTooLarge => rc(0x95, "packet too large"),
        C::QuotaExceeded => rc(0x97, "quota exceeded"),
        C::PayloadFormatInvalid => rc(0x99, "payload format invalid"),
        C::RetainNotSupported => rc(0x9A, "retain not supported"),
        C::QoSNotSupported => rc(0x9B, "QoS not supported"),
        C::UseAnotherServer => rc(0x9C, "use another server"),
        C::ServerMoved => rc(0x9D, "server moved"),
        C::ConnectionRateExceeded => rc(0x9F, "connection rate exceeded"),
    }
}

pub(crate) fn disconnect_reason(code: DisconnectReasonCode) -> ReasonCode {
    use DisconnectReasonCode as D;
    let name = match code {
        D::NormalDisconnection => "normal disconnection",
        D::DisconnectWithWillMessage => "disconnect with will message",
        D::UnspecifiedError => "unspecified error",
        D::MalformedPacket => "malformed packet",
        D::ProtocolError => "protocol error",
        D::ImplementationSpecificError => "implementation specific error",
        D::NotAuthorized => "not authorized",
        D::ServerBusy => "server busy",
        D::ServerShuttingDown => "server shutting down",
        D::KeepAliveTimeout => "keep alive timeout",
        D::SessionTakenOver => "session taken over",
        D::TopicFilterInvalid => "topic filter invalid",
        D::TopicNameInvalid => "topic name invalid",
        D::ReceiveMaximumExceeded => "receive maximum exceeded",
        D::TopicAliasInvalid => "topic alias invalid",
        D::PacketTooLarge => "packet too large",
        D::MessageRateTooHigh => "message rate too high",
        D::QuotaExceeded => "quota exceeded",
        D::AdministrativeAction => "administrative action",
        D::PayloadFormatInvalid => "payload format invalid",
        D::RetainNotSupported => "retain not supported",
        D::QoSNotSupported => "QoS not supported",
        D::UseAnotherServer => "use another server",
        D::ServerMoved => "server moved",
        D::SharedSubscriptionNotSupported => "shared subscriptions not supported",
        D::ConnectionRateExceeded => "connection rate exceeded",
        D::MaximumConnectTime => "maximum connect time",
        D::SubscriptionIdentifiersNotSupported => "subscription identifiers not supported",
        D::WildcardSubscriptionsNotSupported => "wildcard subscriptions not supported",
    };
    rc(code as u8, name)
}

pub(crate) fn puback_reason(reason: PubAckReason) -> ReasonCode {
    use PubAckReason as P;
    match reason {
        P::Success => rc(0x00, "success"),
        P::NoMatchingSubscribers => rc(0x10, "no matching subscribers"),
        P::UnspecifiedError => rc(0x80, "unspecified error"),
        P::ImplementationSpecificError => rc(0x83, "implementation specific error"),
        P::NotAuthorized => rc(0x87, "not authorized"),
        P::TopicNameInvalid => rc(0x90, "topic name invalid"),
        P::PacketIdentifierInUse => rc(0x91, "packet identifier in use"),
        P::QuotaExceeded => rc(0x97, "quota exceeded"),
        P::PayloadFormatInvalid => rc(0x99, "payload format invalid"),
    }
}

/// The reasons a client may give in its DISCONNECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DisconnectReason {
    /// 0x00: the broker discards the will.
    Normal,
    /// 0x04: the broker publishes the will.
    WithWill,
    /// 0x80.
    Unspecified,
    /// 0x83.
    ImplementationSpecific,
}

impl DisconnectReason {
    pub(crate) fn to_codec(self) -> DisconnectReasonCode {
        match self {
            DisconnectReason::Normal => DisconnectReasonCode::NormalDisconnection,
            DisconnectReason::WithWill => DisconnectReasonCode::DisconnectWithWillMessage,
            DisconnectReason::Unspecified => DisconnectReasonCode::UnspecifiedError,
            DisconnectReason::ImplementationSpecific => {
                DisconnectReasonCode::ImplementationSpecificError
            }
        }
    }
}

impl fmt::Display for DisconnectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        disconnect_reason(self.to_codec()).fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_through_the_display() {
        assert_eq!(SubscribeReason::NotAuthorized.code(), 0x87);
        assert_eq!(
            SubscribeReason::NotAuthorized.to_string(),
            "not authorized (0x87)"
        );
        assert_eq!(
            SubscribeReason::Granted(QoS::AtLeastOnce).to_string(),
            "granted QoS 1 (0x01)"
        );
        assert_eq!(
            UnsubscribeReason::NoSubscriptionExisted.to_string(),
            "no subscription existed (0x11)"
        );
        assert!(UnsubscribeReason::NoSubscriptionExisted.is_gone());
        assert!(!UnsubscribeReason::NotAuthorized.is_gone());
        assert_eq!(
            DisconnectReason::WithWill.to_string(),
            "disconnect with will message (0x04)"
        );
    }

    #[test]
    fn qos_levels_round_trip() {
        for level in 0..=2 {
            assert_eq!(QoS::from_level(level).map(QoS::level), Some(level));
        }
        assert_eq!(QoS::from_level(3), None);
    }
}
