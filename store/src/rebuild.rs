//! Projection rebuild: a replay of the whole log, in position order, into the projection
//! tables, inside one transaction that holds the append lock. The transaction is the shadow:
//! readers keep seeing the old rows until the rebuilt ones commit in one step.
//! `Verify` rebuilds the same way, compares against the live rows, and rolls back.

use std::sync::Arc;

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

/// The name of the snapshot copy of `table` used by Verify.
pub(crate) fn snapshot_table(table: &str) -> String {
    format!("wharf_verify_{table}")
}
