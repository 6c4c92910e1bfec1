//! What the application receives: one `Delivery` per incoming PUBLISH, stamped with the
//! connection's generation, and the stream of them that ends with the connection's cause.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use tokio::sync::{mpsc, watch};

use crate::error::DisconnectCause;
use crate::reason::QoS;

static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

/// One connection's number, unique and increasing within the process: every `Session::connect`
/// takes the next one. An ack is sent only on the connection whose generation received the
/// delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Generation(pub u64);

impl Generation {
    pub(crate) fn next() -> Generation {
        Generation(NEXT_GENERATION.fetch_add(1, Ordering::Relaxed))
    }
}

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "generation {}", self.0)
    }
}

/// The MQTT v5 properties of a PUBLISH that an application may keep (as message headers).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeliveryProperties {
    /// Payload Format Indicator (1: UTF-8 text).
    pub payload_format_indicator: Option<u8>,
    /// Message Expiry Interval left, in seconds.
    pub message_expiry_interval: Option<u32>,
    /// Content Type.
    pub content_type: Option<String>,
    /// Response Topic.
    pub response_topic: Option<String>,
    /// Correlation Data.
    pub correlation_data: Option<Bytes>,
    /// User Properties, in order, duplicates kept.
    pub user_properties: Vec<(String, String)>,
    /// The Subscription Identifiers of every subscription that matched.
    pub subscription_identifiers: Vec<u32>,
}

/// One incoming PUBLISH. QoS 1 and 2 deliveries stay unacknowledged until `SessionHandle::ack`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The connection that received it.
    pub generation: Generation,
    /// The broker's packet identifier (0 for QoS 0).
    pub pkid: u16,
    /// The topic name.
    pub topic: String,
    /// The payload, as received.
    pub payload: Bytes,
    /// The QoS it was delivered with.
    pub qos: QoS,
    /// DUP: the broker may have sent it before (a replay after reconnect).
    pub dup: bool,
    /// RETAIN: a retained message sent because of a new subscription.
    pub retain: bool,
    /// The PUBLISH properties.
    pub properties: DeliveryProperties,
    /// Which receipt on its connection this is; an ack must name the receipt still in flight.
    pub(crate) receipt: u64,
}

/// The deliveries of one connection, in the order the broker sent them.
#[derive(Debug)]
pub struct Deliveries {
    pub(crate) generation: Generation,
    pub(crate) receiver: mpsc::Receiver<Delivery>,
    pub(crate) closed: watch::Receiver<Option<DisconnectCause>>,
}

impl Deliveries {
    /// The connection these deliveries come from.
    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// The next delivery; once the connection has ended and everything received was taken,
    /// the cause, on this and every later call.
    pub async fn next(&mut self) -> Result<Delivery, DisconnectCause> {
        match self.receiver.recv().await {
            Some(delivery) => Ok(delivery),
            None => Err(self
                .closed
                .borrow()
                .clone()
                .unwrap_or(DisconnectCause::HandleDropped)),
        }
    }
}
