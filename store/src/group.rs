//! The locked group executor's contract, shared by both backends.
//!
//! A declaration attempt runs as one transaction: lock the group's row, load its events, observe
//! its live instances and the store's time, decide (a pure closure), append what the decision
//! returns with inline projection, write the caller's heartbeat if the decision allows, commit.
//! Concurrent attempts on one group serialize on the group row lock.

use chrono::{DateTime, Utc};

use crate::event::{Heartbeat, NewEvent, RecordedEvent};

/// The aggregate type the group executor loads and appends to.
pub const GROUP_AGGREGATE: &str = "consumer_group";

/// Which group to lock, and how fresh a heartbeat must be to count as live.
#[derive(Debug, Clone)]
pub struct GroupLock {
    /// The group's name (also its aggregate id).
    pub group: String,
    /// The topic the group consumes (recorded on the group row when it is created).
    pub topic: String,
    /// How old a heartbeat may be, by the store's clock, for its instance to count as live.
    pub instance_ttl: std::time::Duration,
    /// Load only events with a greater sequence: the caller already holds the group's state
    /// up to this sequence (0 loads everything).
    pub after_sequence: i64,
}

/// A live instance observed inside the locked transaction.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct LiveInstanceRow {
    /// The instance's declarer identity.
    pub declarer: String,
    /// The set it declares.
    pub patterns: Vec<String>,
}

/// What the decision sees: the group's events, its live instances and the store's time.
#[derive(Debug, Clone)]
pub struct GroupSnapshot {
    /// The group's events after [`GroupLock::after_sequence`], in sequence order.
    pub events: Vec<RecordedEvent>,
    /// The sequence the load started after.
    pub after_sequence: i64,
    /// The group's newest sequence in the ledger (0 when none). Below `after_sequence` means
    /// the caller's state is from another ledger (say, before a restore) and must be dropped.
    pub stream_head: i64,
    /// Instances with a heartbeat fresher than the TTL.
    pub live_instances: Vec<LiveInstanceRow>,
    /// The store's time for this transaction.
    pub now: DateTime<Utc>,
}

impl GroupSnapshot {
    /// The sequence of the group's newest event (0 when none).
    pub fn last_sequence(&self) -> i64 {
        self.events
            .last()
            .map_or(self.after_sequence.max(0), |e| e.sequence)
    }
}

/// What the decision asks the executor to write.
#[derive(Debug, Clone, Default)]
pub struct GroupWrite {
    /// Events to append (may be empty: a join appends nothing).
    pub events: Vec<NewEvent>,
    /// A heartbeat to record in the same transaction (the instance starts consuming).
    pub heartbeat: Option<Heartbeat>,
}

/// A decision: what to write, and what to tell the caller.
pub type GroupDecision<T, E> = Result<(GroupWrite, T), E>;
