//! What a session does with the deliveries its reconcile dispatches: an [`MqttHandler`] takes a
//! batch and succeeds or fails as a whole; the runtime acks the batch to the broker only after
//! it succeeded, on the connection that received it. [`LogIngest`], the binary's handler,
//! appends each batch to the message log (one commit per log topic), so nothing is acked
//! before its commit.
//!
//! A message keeps its MQTT topic as the log subject, its payload byte for byte, and its
//! properties as headers: user properties under their own names (repeated names joined with a
//! comma), the rest as `mqtt.qos`, `mqtt.retain`, `mqtt.content_type`, `mqtt.response_topic`,
//! `mqtt.correlation_data` (hex), `mqtt.payload_format`, `mqtt.message_expiry`.

use std::collections::BTreeMap;

use async_trait::async_trait;
use wharf_domain::TopicName;
use wharf_mqtt::Delivery;
use wharf_queue::{HandlerError, Headers, OutgoingMessage, Queue};

/// The longest header name the log keeps (longer user-property names are cut at a character
/// boundary).
const MAX_HEADER_NAME: usize = 255;
/// The longest header value the log keeps.
const MAX_HEADER_VALUE: usize = 64 * 1024;

/// One MQTT message bound for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MqttMessage {
    /// The log topic of the subscription it came through.
    pub log_topic: TopicName,
    /// The message as the log stores it (subject = the MQTT topic).
    pub message: OutgoingMessage,
}

/// Handles a batch of dispatched deliveries; an error leaves the whole batch unacked (the
/// broker redelivers it after the session reconnects).
#[async_trait]
pub trait MqttHandler: Send + Sync + 'static {
    /// Handles the batch.
    async fn handle(&self, batch: &[MqttMessage]) -> Result<(), HandlerError>;
}

/// Appends each batch to the message log.
pub struct LogIngest {
    queue: Queue,
}

impl LogIngest {
    /// A handler appending to `queue`'s log.
    pub fn new(queue: Queue) -> Self {
        Self { queue }
    }
}

#[async_trait]
impl MqttHandler for LogIngest {
    async fn handle(&self, batch: &[MqttMessage]) -> Result<(), HandlerError> {
        let mut by_topic: BTreeMap<&TopicName, Vec<OutgoingMessage>> = BTreeMap::new();
        for m in batch {
            by_topic
                .entry(&m.log_topic)
                .or_default()
                .push(m.message.clone());
        }
        for (topic, messages) in by_topic {
            self.queue
                .publish(topic, &messages)
                .await
                .map_err(HandlerError::from_error)?;
        }
        Ok(())
    }
}

/// The log message for a delivery: subject, payload and headers.
pub fn to_log_message(delivery: &Delivery) -> Result<OutgoingMessage, HandlerError> {
    OutgoingMessage::new(
        &delivery.topic,
        delivery.payload.to_vec(),
        headers_of(delivery),
    )
    .map_err(HandlerError::from_error)
}

fn headers_of(delivery: &Delivery) -> Headers {
    let mut headers = Headers::new();
    let props = &delivery.properties;
    for (name, value) in &props.user_properties {
        let name = bounded(name, MAX_HEADER_NAME, true);
        if name.is_empty() {
            continue;
        }
        headers
            .entry(name)
            .and_modify(|v: &mut String| {
                v.push(',');
                v.push_str(value);
            })
            .or_insert_with(|| value.clone());
    }
    let mut put = |name: &str, value: String| {
        headers.insert(name.to_owned(), value);
    };
    put("mqtt.qos", delivery.qos.level().to_string());
    if delivery.retain {
        put("mqtt.retain", "true".to_owned());
    }
    if let Some(content_type) = &props.content_type {
        put("mqtt.content_type", content_type.clone());
    }
    if let Some(topic) = &props.response_topic {
        put("mqtt.response_topic", topic.clone());
    }
    if let Some(data) = &props.correlation_data {
        put("mqtt.correlation_data", hex(data));
    }
    if let Some(format) = props.payload_format_indicator {
        put("mqtt.payload_format", format.to_string());
    }
    if let Some(expiry) = props.message_expiry_interval {
        put("mqtt.message_expiry", expiry.to_string());
    }
    for value in headers.values_mut() {
        if value.len() > MAX_HEADER_VALUE {
            *value = bounded(value, MAX_HEADER_VALUE, false);
        }
    }
    headers
}

/// `text` cut to at most `max` bytes at a character boundary; control characters dropped from
/// names.
fn bounded(text: &str, max: usize, name: bool) -> String {
    let mut out = String::with_capacity(text.len().min(max));
    for c in text.chars() {
        if name && c.is_control() {
            continue;
        }
        if out.len() + c.len_utf8() > max {
            break;
        }
        out.push(c);
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_bounded_and_cleaned() {
        assert_eq!(bounded("a\u{1}b", 255, true), "ab");
        assert_eq!(bounded("ééé", 5, false), "éé");
        assert_eq!(hex(&[0, 255, 16]), "00ff10");
    }
}
