//! Projection rebuild: a replay of the whole log, in position order, into the projection
//! tables, inside one transaction that holds the append lock. The transaction is the shadow:
//! readers keep seeing the old rows until the rebuilt ones commit in one step.
//! `Verify` rebuilds the same way, compares against the live rows, and rolls back.

use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::error::StoreError;
use crate::event::{Payload, RecordedEvent};
pub use crate::projector::{Decoded, ReplayEvent};

mod fold;
mod image;

pub(crate) use fold::{fold_page, ReplayApply, Step};
pub use image::Image;

/// Whether a rebuild replaces the live projections or only compares against them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RebuildMode {
    /// Replace the live projection rows with the replayed ones.
    Apply,
    /// Replay aside, compare with the live rows, change nothing.
    Verify,
}

/// Called as the replay progresses with (events replayed, events in the log).
pub type Progress = Arc<dyn Fn(u64, u64) + Send + Sync>;

/// How a projection table differs between the live rows and a replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableDifference {
    /// The table.
    pub table: String,
    /// Rows the live table holds that the replay does not produce.
    pub only_live: u64,
    /// Rows the replay produces that the live table lacks.
    pub only_rebuilt: u64,
}

/// What a rebuild did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RebuildReport {
    /// How many events were replayed.
    pub events: u64,
    /// The position of the last replayed event.
    pub last_position: i64,
    /// Differences found (Verify only; empty when clean).
    pub differences: Vec<TableDifference>,
    /// Whether the rebuilt rows were committed.
    pub applied: bool,
}

impl RebuildReport {
    /// True when verification found no difference.
    pub fn is_clean(&self) -> bool {
        self.differences.is_empty()
    }
}

/// How many positions a rebuild reads per page (a bounded range of the position index).
pub(crate) const REBUILD_PAGE: i64 = 10_000;

/// Whether a projector that acts on `types` (`None`: any) acts on an event of `aggregate_type`.
pub(crate) fn wants(types: Option<&[&str]>, aggregate_type: &str) -> bool {
    types.is_none_or(|types| types.contains(&aggregate_type))
}

/// The name of the copy of `table` Verify compares with it.
pub(crate) fn snapshot_table(table: &str) -> String {
    format!("wharf_verify_{table}")
}

/// Where a rebuild's image of a row projector's tables is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayTarget {
    /// Into the projector's own (reset) tables: a rebuild.
    Live,
    /// Into an unindexed temporary copy of each table, beside the untouched live rows: a
    /// verify, which compares the two and keeps neither.
    Aside,
}

impl ReplayTarget {
    /// The table the replay writes `table`'s rows into.
    pub fn table(self, table: &str) -> String {
        match self {
            Self::Live => table.to_owned(),
            Self::Aside => snapshot_table(table),
        }
    }
}

/// An event row as a rebuild reads it: every column, the JSON as text.
pub(crate) struct RawRow {
    pub position: i64,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub sequence: i64,
    pub event_type: String,
    pub event_version: String,
    pub payload: String,
    pub metadata: String,
    pub recorded_at: DateTime<Utc>,
}

impl RawRow {
    /// The row as a rebuild's fold sees it.
    pub fn replay(&self) -> ReplayEvent<'_> {
        ReplayEvent {
            position: self.position,
            aggregate_type: &self.aggregate_type,
            aggregate_id: &self.aggregate_id,
            sequence: self.sequence,
            event_type: &self.event_type,
            payload: &self.payload,
        }
    }

    /// The row as a projector's `apply` sees it (its JSON parsed).
    pub fn recorded(&self) -> Result<RecordedEvent, StoreError> {
        let parse = |text: &str| {
            serde_json::from_str(text).map_err(|e| StoreError::decode(self.position, e))
        };
        Ok(RecordedEvent {
            position: self.position,
            aggregate_type: self.aggregate_type.clone(),
            aggregate_id: self.aggregate_id.clone(),
            sequence: self.sequence,
            event_type: self.event_type.clone(),
            event_version: self.event_version.clone(),
            payload: Payload::from_text(self.payload.clone())
                .map_err(|e| StoreError::decode(self.position, e))?,
            metadata: parse(&self.metadata)?,
            recorded_at: self.recorded_at,
        })
    }
}
