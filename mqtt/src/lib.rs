//! Wharf's MQTT v5 session driver (ADR 0023): rumqttc's v5 codec over a tokio `TcpStream` (plain,
//! or TLS through rustls), with our own packet-id allocator and acks fenced by connection.
//!
//! - One `Session::connect` is one connection and one [`Generation`]; its `SessionHandle`
//!   subscribes and unsubscribes many filters per packet and returns every filter's reason code
//!   in order, and its [`Deliveries`] yield each incoming PUBLISH.
//! - Packet ids are never reused while outstanding; at most the broker's Receive Maximum
//!   requests are in flight; an acknowledgement is matched to the request of its own connection
//!   by packet id, and one that matches none ends the connection.
//! - Acks are manual only: [`SessionHandle::ack`] sends PUBACK/PUBREC only on the connection that
//!   received the delivery, once; PUBREL is completed automatically, replayed or not.
//! - When the connection ends, every waiting operation fails and the deliveries end with the
//!   [`DisconnectCause`]. There is no reconnect here: the caller connects again (a new
//!   generation) and decides what to re-subscribe.

mod codec;
mod connack;
mod connect;
mod connection;
mod delivery;
mod error;
mod options;
mod pkid;
mod reason;
mod session;
mod shared;
mod transport;

pub use connack::ConnAckInfo;
pub use connect::Session;
pub use delivery::{Deliveries, Delivery, DeliveryProperties, Generation};
pub use error::{DisconnectCause, MqttError};
pub use options::{ConnectOptions, Credentials};
pub use reason::{DisconnectReason, QoS, ReasonCode, SubscribeReason, UnsubscribeReason};
pub use session::{AckOutcome, SessionHandle};
pub use transport::TlsOptions;
