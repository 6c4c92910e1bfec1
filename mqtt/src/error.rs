//! The driver's one error enum, and why a connection ended. No message carries a credential or a
//! Rust debug form.

use std::fmt;
use std::time::Duration;

use crate::reason::ReasonCode;

/// Why a connection ended; every operation on it after that fails with this cause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DisconnectCause {
    /// The broker closed the TCP connection without a DISCONNECT.
    BrokerClosed,
    /// The broker sent DISCONNECT with this reason.
    BrokerDisconnect(ReasonCode),
    /// Reading or writing the socket failed.
    Io(String),
    /// The broker sent something we cannot decode or that breaks the protocol.
    Protocol(String),
    /// No PINGRESP came back within the keep alive after a PINGREQ.
    KeepAliveTimeout,
    /// We sent DISCONNECT (`SessionHandle::disconnect`).
    Local(ReasonCode),
    /// Every handle was dropped; the socket was closed without a DISCONNECT.
    HandleDropped,
}

impl DisconnectCause {
    /// True when the broker's side ended the connection (it closed, refused or broke the stream).
    pub fn is_remote(&self) -> bool {
        !matches!(
            self,
            DisconnectCause::Local(_) | DisconnectCause::HandleDropped
        )
    }
}

impl fmt::Display for DisconnectCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DisconnectCause::BrokerClosed => f.write_str("the broker closed the connection"),
            DisconnectCause::BrokerDisconnect(reason) => {
                write!(f, "the broker sent DISCONNECT: {reason}")
            }
            DisconnectCause::Io(detail) => write!(f, "socket error: {detail}"),
            DisconnectCause::Protocol(detail) => write!(f, "protocol error: {detail}"),
            DisconnectCause::KeepAliveTimeout => {
                f.write_str("no PINGRESP within the keep alive interval")
            }
            DisconnectCause::Local(reason) => write!(f, "we disconnected: {reason}"),
            DisconnectCause::HandleDropped => f.write_str("every session handle was dropped"),
        }
    }
}

/// Everything the driver can fail with.
#[derive(Debug, thiserror::Error)]
pub enum MqttError {
    /// A connect option is out of range.
    #[error("invalid MQTT option {field} = \"{value}\": {reason}")]
    InvalidOption {
        /// The option's name.
        field: &'static str,
        /// The value given.
        value: String,
        /// What is allowed.
        reason: &'static str,
    },
    /// An argument of an operation is out of range.
    #[error("invalid {field} \"{value}\": {reason}")]
    InvalidInput {
        /// What the argument is.
        field: &'static str,
        /// The value given.
        value: String,
        /// What is allowed.
        reason: &'static str,
    },
    /// A TLS file (CA, client certificate or key) is missing or unusable.
    #[error("TLS file {file}: {reason}")]
    TlsFile {
        /// The file's path.
        file: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// The TCP connection could not be opened.
    #[error("cannot connect to MQTT broker {address}: {source}")]
    Connect {
        /// host:port.
        address: String,
        /// The socket error.
        source: std::io::Error,
    },
    /// TCP connect plus CONNACK took longer than `connect_timeout`.
    #[error("no CONNACK from MQTT broker {address} within {}", secs(*after))]
    ConnectTimeout {
        /// host:port.
        address: String,
        /// The bound that passed.
        after: Duration,
    },
    /// The broker answered CONNECT with a failure code.
    #[error("MQTT broker {address} refused the connection of client \"{client_id}\": {reason}")]
    ConnectRefused {
        /// host:port.
        address: String,
        /// The client id sent.
        client_id: String,
        /// CONNACK's reason.
        reason: ReasonCode,
    },
    /// The CONNECT/CONNACK exchange failed before a session existed.
    #[error("MQTT handshake with {address} failed: {cause}")]
    Handshake {
        /// host:port.
        address: String,
        /// What went wrong.
        cause: DisconnectCause,
    },
    /// An operation was not acknowledged within `operation_timeout`.
    #[error("MQTT {operation} not acknowledged within {}", secs(*after))]
    Timeout {
        /// SUBSCRIBE, UNSUBSCRIBE, PUBLISH or DISCONNECT.
        operation: &'static str,
        /// The bound that passed.
        after: Duration,
    },
    /// The connection ended before the operation completed (or before it started).
    #[error("MQTT {operation} failed: the connection ended ({cause})")]
    Disconnected {
        /// The operation that failed.
        operation: &'static str,
        /// Why the connection ended.
        cause: DisconnectCause,
    },
    /// The packet is larger than the broker's Maximum Packet Size.
    #[error("MQTT {operation} packet of {size} bytes exceeds the broker's maximum of {max} bytes")]
    PacketTooLarge {
        /// The operation.
        operation: &'static str,
        /// Encoded size.
        size: usize,
        /// The broker's maximum.
        max: u32,
    },
    /// An acknowledgement carried more reason codes than the request had filters.
    #[error("MQTT {operation} of {sent} filters got {received} reason codes")]
    AckLength {
        /// SUBACK or UNSUBACK.
        operation: &'static str,
        /// Filters sent.
        sent: usize,
        /// Codes received.
        received: usize,
    },
    /// The broker refused a QoS 1 publish.
    #[error("MQTT broker refused the publish to \"{topic}\": {reason}")]
    PublishRefused {
        /// The topic.
        topic: String,
        /// PUBACK's reason.
        reason: ReasonCode,
    },
}

/// A duration as seconds with up to three decimals ("30s", "0.25s").
pub(crate) fn secs(duration: Duration) -> String {
    let text = format!("{:.3}", duration.as_secs_f64());
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text}s")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_seconds() {
        assert_eq!(secs(Duration::from_secs(30)), "30s");
        assert_eq!(secs(Duration::from_millis(250)), "0.25s");
        let error = MqttError::Timeout {
            operation: "SUBSCRIBE",
            after: Duration::from_secs(30),
        };
        assert_eq!(
            error.to_string(),
            "MQTT SUBSCRIBE not acknowledged within 30s"
        );
    }
}
