//! The rows the store deals in: events to append, recorded events, worker instances.

use chrono::{DateTime, TimeZone, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::StoreError;

/// An event about to be appended. The store assigns position, sequence and `recorded_at`.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    /// The event's type name (cqrs-es `DomainEvent::event_type`).
    pub event_type: String,
    /// The event's schema version (cqrs-es `DomainEvent::event_version`).
    pub event_version: String,
    /// The event body.
    pub payload: Value,
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
            payload: serde_json::to_value(event)?,
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
    /// The event body.
    pub payload: Value,
    /// The event's metadata.
    pub metadata: Value,
    /// When the store recorded it, by the store's clock.
    pub recorded_at: DateTime<Utc>,
}

impl RecordedEvent {
    /// Deserializes the payload into a domain event type.
    pub fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T, StoreError> {
        // Deserialized from the borrowed tree: no copy of the payload.
        T::deserialize(&self.payload).map_err(|e| StoreError::decode(self.position, e))
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
    /// The event body.
    pub payload: &'a Value,
}

impl EventRef<'_> {
    /// Deserializes the payload into a domain event type.
    pub fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T, StoreError> {
        T::deserialize(self.payload).map_err(|e| {
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
