//! What a consumer reports: where it is in its lifecycle.

use chrono::{DateTime, Utc};

use crate::{BindingSet, DeclarerId};

/// Where a consumer is in its lifecycle.
#[derive(Debug, Clone, PartialEq)]
pub enum ConsumerState {
    /// The first attempt has not finished yet, or the instance is declaring again (its
    /// heartbeat lapsed, or the group's install moved on).
    Declaring,
    /// A live incumbent declares a different set; this instance waits and does not consume.
    Waiting {
        /// The stored set being waited on.
        incumbent: BindingSet,
        /// The live instances that declare it.
        live_declarers: Vec<DeclarerId>,
        /// When this instance first stated its set.
        declared_at: DateTime<Utc>,
        /// Attempts made so far.
        attempts: u64,
    },
    /// The declaration joined or installed; the instance heartbeats and may consume.
    Consuming {
        /// The set it consumes with.
        bindings: BindingSet,
        /// The install it joined (the ledger position of the group's `Installed` event): its
        /// claims are fenced by it, and hand out nothing once the group's install moves on.
        install: i64,
        /// How many times this instance has joined or installed: 1 after its first
        /// declaration, one more after each re-declaration (after a lapse or a fence).
        joins: u64,
    },
    /// The store could not be reached to attempt or to heartbeat (an error, or no answer
    /// within the call's deadline); not ready and not claiming until it can.
    Stalled {
        /// The last error.
        reason: String,
    },
    /// The declaration was refused for good (e.g. the group consumes another topic).
    Failed {
        /// Why.
        reason: String,
    },
    /// Shut down.
    Stopped,
}

impl ConsumerState {
    /// True only while consuming: what a readiness probe should report.
    pub fn is_ready(&self) -> bool {
        matches!(self, Self::Consuming { .. })
    }
}
