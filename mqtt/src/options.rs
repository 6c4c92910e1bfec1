//! What one connection needs: where, who, the session's shape and the driver's bounds. The
//! credentials are kept out of every `Debug` form and every error.

use std::fmt;
use std::time::Duration;

use crate::error::MqttError;

/// A user name and an optional password for CONNECT. Neither is ever printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    username: String,
    password: Option<String>,
}

impl Credentials {
    /// A user name with a password.
    pub fn new(username: impl Into<String>, password: impl Into<String>) -> Self {
        Credentials {
            username: username.into(),
            password: Some(password.into()),
        }
    }

    /// A user name alone.
    pub fn username_only(username: impl Into<String>) -> Self {
        Credentials {
            username: username.into(),
            password: None,
        }
    }

    pub(crate) fn username(&self) -> &str {
        &self.username
    }

    pub(crate) fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Credentials(redacted)")
    }
}

/// How to open one MQTT v5 connection (plain TCP).
#[derive(Clone)]
pub struct ConnectOptions {
    /// Broker host name or address.
    pub host: String,
    /// Broker TCP port.
    pub port: u16,
    /// The client identifier sent in CONNECT (1 to 65535 bytes).
    pub client_id: String,
    /// CONNECT's clean start flag: true discards any session the broker holds for the client id.
    pub clean_start: bool,
    /// Session Expiry Interval in seconds (0: the session ends with the connection).
    pub session_expiry: u32,
    /// Keep alive in seconds (0 turns pings off). The broker's Server Keep Alive overrides it.
    pub keep_alive: u16,
    /// Optional user name and password; never printed.
    pub credentials: Option<Credentials>,
    /// Bound on TCP connect plus the CONNECT/CONNACK exchange.
    pub connect_timeout: Duration,
    /// Bound on each SUBSCRIBE, UNSUBSCRIBE, QoS 1 publish and disconnect, including the wait for
    /// a free packet identifier.
    pub operation_timeout: Duration,
    /// The largest packet we accept (sent as Maximum Packet Size); larger ones end the connection.
    pub max_packet_size: u32,
    /// How many QoS 1/2 deliveries the broker may have unacked towards us (Receive Maximum).
    pub receive_maximum: u16,
    /// Deliveries buffered between the connection and the application. When it is full the
    /// connection stops reading, so the broker sees TCP back-pressure.
    pub delivery_buffer: usize,
    /// TLS over the TCP connection (`None`: plain TCP). The broker's host is the server name.
    pub tls: Option<crate::transport::TlsOptions>,
}

impl ConnectOptions {
    /// Defaults: clean start, no session expiry, keep alive 30 s, 30 s timeouts, 1 MiB packets,
    /// receive maximum 1024, a buffer of 1024 deliveries.
    pub fn new(host: impl Into<String>, port: u16, client_id: impl Into<String>) -> Self {
        ConnectOptions {
            host: host.into(),
            port,
            client_id: client_id.into(),
            clean_start: true,
            session_expiry: 0,
            keep_alive: 30,
            credentials: None,
            connect_timeout: Duration::from_secs(30),
            operation_timeout: Duration::from_secs(30),
            max_packet_size: 1024 * 1024,
            receive_maximum: 1024,
            delivery_buffer: 1024,
            tls: None,
        }
    }

    /// Checks every field before anything connects.
    pub fn validate(&self) -> Result<(), MqttError> {
        if self.host.is_empty() {
            return Err(invalid("host", "", "must not be empty"));
        }
        if self.port == 0 {
            return Err(invalid("port", "0", "must be 1 to 65535"));
        }
        if self.client_id.is_empty() && !self.clean_start {
            return Err(invalid(
                "client_id",
                "",
                "must not be empty for a session that survives the connection (clean_start false)",
            ));
        }
        if self.client_id.len() > usize::from(u16::MAX) || self.client_id.contains('\0') {
            return Err(invalid(
                "client_id",
                &self.client_id,
                "must be at most 65535 bytes without NUL",
            ));
        }
        nonzero_duration("connect_timeout", self.connect_timeout)?;
        nonzero_duration("operation_timeout", self.operation_timeout)?;
        if self.max_packet_size < 128 {
            return Err(invalid(
                "max_packet_size",
                &self.max_packet_size.to_string(),
                "must be at least 128 bytes",
            ));
        }
        if self.receive_maximum == 0 {
            return Err(invalid("receive_maximum", "0", "must be 1 to 65535"));
        }
        if self.delivery_buffer == 0 {
            return Err(invalid("delivery_buffer", "0", "must be at least 1"));
        }
        Ok(())
    }

    pub(crate) fn address(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

fn nonzero_duration(field: &'static str, value: Duration) -> Result<(), MqttError> {
    if value.is_zero() {
        return Err(invalid(field, "0s", "must be longer than zero"));
    }
    Ok(())
}

fn invalid(field: &'static str, value: &str, reason: &'static str) -> MqttError {
    MqttError::InvalidOption {
        field,
        value: value.to_string(),
        reason,
    }
}

impl fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectOptions")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("client_id", &self.client_id)
            .field("clean_start", &self.clean_start)
            .field("session_expiry", &self.session_expiry)
            .field("keep_alive", &self.keep_alive)
            .field(
                "credentials",
                &self.credentials.as_ref().map(|_| "redacted"),
            )
            .field("connect_timeout", &self.connect_timeout)
            .field("operation_timeout", &self.operation_timeout)
            .field("max_packet_size", &self.max_packet_size)
            .field("receive_maximum", &self.receive_maximum)
            .field("delivery_buffer", &self.delivery_buffer)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_credentials() {
        let mut options = ConnectOptions::new("localhost", 1883, "c");
        options.credentials = Some(Credentials::new("alice-user", "hunter2-secret"));
        let shown = format!("{options:?} {:?}", options.credentials);
        assert!(!shown.contains("alice-user"), "{shown}");
        assert!(!shown.contains("hunter2-secret"), "{shown}");
        assert!(shown.contains("redacted"), "{shown}");
    }

    #[test]
    fn bad_fields_are_named_with_their_values() {
        let mut options = ConnectOptions::new("localhost", 1883, "");
        options.clean_start = false;
        let error = options.validate().unwrap_err().to_string();
        assert!(error.contains("client_id"), "{error}");

        let mut options = ConnectOptions::new("localhost", 1883, "c");
        options.max_packet_size = 10;
        let error = options.validate().unwrap_err().to_string();
        assert!(
            error.contains("max_packet_size") && error.contains("10"),
            "{error}"
        );

        let options = ConnectOptions::new("", 1883, "c");
        assert!(options.validate().unwrap_err().to_string().contains("host"));
        assert!(ConnectOptions::new("localhost", 1883, "c")
            .validate()
            .is_ok());
    }
}
