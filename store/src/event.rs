//! The rows the store deals in: events to append, recorded events, worker instances.

use chrono::{DateTime, TimeZone, Utc};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::error::StoreError;

/// An event body as JSON text, serialized once.
///
/// The text is what the ledger stores and what each projector decodes: an append serializes
/// the domain event straight to text (no `serde_json::Value` tree between), binds that text,
/// and each inline projector parses its own typed view of it. A 10,000-filter event built
/// as a tree, decoded from it, printed from it and dropped spent about half of a large
/// ledger write's client time in the tree (ADR 0045). Equality is by JSON value, not text.
#[derive(Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Payload(Box<RawValue>);

impl Payload {
    /// Serializes a value (a domain event) to its JSON text.
    pub fn to_json<T: Serialize + ?Sized>(value: &T) -> Result<Self, serde_json::Error> {
        serde_json::value::to_raw_value(value).map(Self)
    }

    /// Takes stored JSON text, checking that it is one JSON value.
    pub fn from_text(text: String) -> Result<Self, serde_json::Error> {
        RawValue::from_string(text).map(Self)
    }

    /// The JSON text.
    pub fn get(&self) -> &str {
        self.0.get()
    }

    /// Deserializes the text into `T`.
    pub fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.get())
    }

    /// The JSON as a value tree (for callers that inspect it field by field).
    pub fn to_value(&self) -> Value {
        // The text came from a serializer or passed `from_text`: it is one JSON value.
        self.decode().unwrap_or(Value::Null)
    }
}

impl From<Box<RawValue>> for Payload {
    fn from(raw: Box<RawValue>) -> Self {
        Self(raw)
    }
}

impl From<Value> for Payload {
    fn from(value: Value) -> Self {
        // A `Value` always prints to valid JSON.
        Self::to_json(&value).unwrap_or_else(|_| Self(RawValue::NULL.to_owned()))
    }
}

impl PartialEq for Payload {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get() || self.to_value() == other.to_value()
    }
}

impl std::fmt::Debug for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.get())
    }
}

impl std::fmt::Display for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.get())
    }
}

/// An event about to be appended. The store assigns position, sequence and `recorded_at`.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    /// The event's type name (cqrs-es `DomainEvent::event_type`).
    pub event_type: String,
    /// The event's schema version (cqrs-es `DomainEvent::event_version`).
    pub event_version: String,
    /// The event body, as JSON text.
    pub payload: Payload,
    /// Free-form metadata (who, from where).
    pub metadata: Value,
}

impl NewEvent {
    /// Builds a new event from a cqrs-es domain event.
    pub fn from_domain<E: cqrs_es::DomainEvent>(
        event: &E,
        metadata: Value,
    ) -> Result<Self, StoreError> {
        Ok(Self {
            event_type: event.event_type(),
            event_version: event.event_version(),
            payload: Payload::to_json(event)?,
            metadata,
        })
    }
}

/// An event as the ledger holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedEvent {
    /// Global position: commit order across all aggregates.
    pub position: i64,
    /// The aggregate's type (e.g. `consumer_group`).
    pub aggregate_type: String,
    /// The aggregate's id (e.g. the group name).
    pub aggregate_id: String,
    /// Per-aggregate sequence, from 1.
    pub sequence: i64,
    /// The event's type name.
    pub event_type: String,
    /// The event's schema version.
    pub event_version: String,
    /// The event body, as JSON text.
    pub payload: Payload,
    /// The event's metadata.
    pub metadata: Value,
    /// When the store recorded it, by the store's clock.
    pub recorded_at: DateTime<Utc>,
}

impl RecordedEvent {
    /// Deserializes the payload into a domain event type.
    pub fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T, StoreError> {
        self.payload
            .decode()
            .map_err(|e| StoreError::decode(self.position, e))
    }

    /// The event as a projector sees it.
    pub fn as_ref(&self) -> EventRef<'_> {
        EventRef {
            position: Some(self.position),
            aggregate_type: &self.aggregate_type,
            aggregate_id: &self.aggregate_id,
            sequence: self.sequence,
            event_type: &self.event_type,
            payload: &self.payload,
        }
    }
}

/// An event as a projector sees it: recorded, or being inserted (no position yet).
#[derive(Debug, Clone, Copy)]
pub struct EventRef<'a> {
    /// The global position; `None` while the event is being inserted.
    pub position: Option<i64>,
    /// The aggregate's type.
    pub aggregate_type: &'a str,
    /// The aggregate's id.
    pub aggregate_id: &'a str,
    /// Per-aggregate sequence.
    pub sequence: i64,
    /// The event's type name.
    pub event_type: &'a str,
    /// The event body, as JSON text.
    pub payload: &'a Payload,
}

impl EventRef<'_> {
    /// Deserializes the payload into a domain event type.
    pub fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T, StoreError> {
        self.payload.decode().map_err(|e| {
            let at = format!(
                "{}/{}#{}",
                self.aggregate_type, self.aggregate_id, self.sequence
            );
            StoreError::decode(self.position.unwrap_or(0), format!("{at}: {e}"))
        })
    }
}

/// A worker instance of a consumer group, as heartbeats record it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceRecord {
    /// The group.
    pub group: String,
    /// The instance's declarer identity.
    pub declarer: String,
    /// The topic it consumes.
    pub topic: String,
    /// Its application version.
    pub version: String,
    /// The binding set it runs with, normalized.
    pub patterns: Vec<String>,
    /// When it first heartbeated.
    pub started_at: DateTime<Utc>,
    /// Its newest heartbeat.
    pub heartbeat_at: DateTime<Utc>,
}

/// The heartbeat an executor writes with a successful declaration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    /// The instance's declarer identity.
    pub declarer: String,
    /// Its application version.
    pub version: String,
    /// The set it runs with.
    pub patterns: Vec<String>,
}

/// Converts microseconds since the Unix epoch (SQLite's time columns) to a timestamp.
pub fn from_micros(micros: i64) -> DateTime<Utc> {
    Utc.timestamp_micros(micros)
        .single()
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// A filtered, position-paged read of one aggregate's events (the audit queries).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventQuery {
    /// Only events after this position.
    pub after_position: i64,
    /// Only events recorded at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Only events recorded before this time.
    pub until: Option<DateTime<Utc>>,
    /// Only events whose payload has this top-level string field with this value.
    pub payload_field: Option<(String, String)>,
    /// At most this many events.
    pub limit: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Remembered {
        filters: Vec<String>,
        qos: u8,
    }

    #[test]
    fn a_payload_is_the_serializer_s_text_and_decodes_back() {
        let event = Remembered {
            filters: vec!["a/+/b".into(), "c/#".into()],
            qos: 1,
        };
        let payload = Payload::to_json(&event).unwrap();
        // Field order as declared, nothing re-ordered or re-spaced.
        assert_eq!(payload.get(), r#"{"filters":["a/+/b","c/#"],"qos":1}"#);
        assert_eq!(payload.decode::<Remembered>().unwrap(), event);
        assert_eq!(serde_json::to_string(&payload).unwrap(), payload.get());
    }

    #[test]
    fn stored_text_must_be_one_json_value_and_equality_is_by_value() {
        let err = Payload::from_text("{\"qos\": 1".to_owned()).unwrap_err();
        assert!(err.is_eof(), "{err}");
        assert!(Payload::from_text("1 2".to_owned()).is_err());
        let spaced = Payload::from_text("{ \"b\": 2, \"a\": [1] }".to_owned()).unwrap();
        let tight = Payload::from(serde_json::json!({"a": [1], "b": 2}));
        assert_eq!(spaced, tight);
        assert_ne!(spaced, Payload::from(serde_json::json!({"a": [1], "b": 3})));
        assert_eq!(spaced.to_value()["b"], 2);
        assert_eq!(format!("{spaced:?}"), spaced.get());
    }
}
