//! The machine's vocabulary: the inputs the driver feeds, the actions it must carry out, and
//! the session's readiness level.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::session::exact_filter::{ExactFilter, Qos};
use crate::session::ledger::SubscribeOutcome;

/// How far a session has come. Ordered: anything below `Full` is not ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionLevel {
    /// Not connected (yet, or again).
    Starting,
    /// Connected; the desired filters are not all granted yet.
    Connected,
    /// Every desired filter granted; stale filters may still await removal.
    Subscribed,
    /// History equals desired, nothing awaits removal: ready.
    Full,
    /// Terminal: a replay only a removed shared filter could have delivered. History kept.
    MigrationRequired,
}

impl SessionLevel {
    /// Only `Full` is ready (`MigrationRequired` sorts above it but is not).
    pub fn is_ready(self) -> bool {
        self == Self::Full
    }

    /// The level's snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Connected => "connected",
            Self::Subscribed => "subscribed",
            Self::Full => "full",
            Self::MigrationRequired => "migration_required",
        }
    }
}

impl fmt::Display for SessionLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What happened, as the driver tells the machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// A connection's CONNACK arrived; generations increase with every connection.
    Connected {
        /// The connection's generation.
        generation: u64,
        /// The CONNACK's session-present flag (recorded; the reconcile is the same either way).
        session_present: bool,
    },
    /// The ledger committed the last [`Action::Remember`].
    Remembered,
    /// The SUBACKs of one [`Action::Subscribe`] (several may be outstanding; they may answer
    /// in any order): one entry per filter answered (possibly fewer than were sent).
    SubAck {
        /// The connection it arrived on.
        generation: u64,
        /// Filter and outcome.
        outcomes: Vec<(ExactFilter, SubscribeOutcome)>,
    },
    /// An UNSUBACK for the last [`Action::Unsubscribe`]: filter and reason code.
    UnsubAck {
        /// The connection it arrived on.
        generation: u64,
        /// Filter and UNSUBACK reason code.
        outcomes: Vec<(ExactFilter, u8)>,
    },
    /// The ledger committed the last [`Action::Forget`].
    Forgotten,
    /// The connection of `generation` ended.
    Disconnected {
        /// Its generation.
        generation: u64,
    },
    /// A PUBLISH arrived.
    Delivery {
        /// The driver's id for it (unique per process).
        id: u64,
        /// The connection it arrived on.
        generation: u64,
        /// Its topic.
        topic: String,
        /// The DUP flag: a redelivery.
        dup: bool,
        /// The subscription identifiers it carried.
        subscription_ids: Vec<u32>,
    },
    /// Time passed; see [`Reconciler::next_deadline`](super::Reconciler::next_deadline).
    Tick,
}

/// What the driver must do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Write these filters to the ledger (`ManagedSessionCommand::Remember`), then send
    /// [`Input::Remembered`]; at most one is outstanding. If the write fails, rebuild the
    /// machine from the ledger, as after a crash: nothing is subscribed meanwhile.
    Remember(Vec<(ExactFilter, Qos)>),
    /// SUBSCRIBE these filters on the current connection, each with its
    /// [`subscription_id`](super::subscription_id), and send one [`Input::SubAck`] with their
    /// answers. The driver need not wait for them before carrying out the next action.
    Subscribe(Vec<(ExactFilter, Qos)>),
    /// UNSUBSCRIBE exactly these strings on the current connection.
    Unsubscribe(Vec<ExactFilter>),
    /// Write these removals to the ledger (`ManagedSessionCommand::Forget`), then send
    /// [`Input::Forgotten`]. If the write fails, rebuild the machine from the ledger: the
    /// filters stay in history and the next start removes and verifies them again.
    Forget(Vec<(ExactFilter, u8)>),
    /// Close the connection and open a new one now (no backoff).
    Recycle,
    /// Hand the delivery to its handler; ack it after the handler succeeded, on its connection.
    Dispatch {
        /// The delivery.
        id: u64,
    },
    /// Never ack this delivery on its connection.
    Hold {
        /// The delivery.
        id: u64,
    },
    /// Ack this delivery without handling it: it matches nothing, past `unmatched_grace`.
    AckUnmatched {
        /// The delivery.
        id: u64,
    },
    /// Close the connection and do not reconnect (terminal).
    Disconnect,
    /// Write `ManagedSessionCommand::RequireMigration` to the ledger.
    RequireMigration {
        /// Why.
        reason: String,
        /// The removed shared filters involved.
        filters: Vec<ExactFilter>,
    },
    /// The reconcile failed on this connection: disconnect, back off, reconnect to retry.
    Failed {
        /// Which filters and why.
        reason: String,
    },
    /// The session's level changed.
    Level(SessionLevel),
}

/// What the machine reports about its session, for the API and `wharf sessions show`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconcileStatus {
    /// The current level.
    pub level: SessionLevel,
    /// Every filter that may exist at the broker (the history, as committed).
    pub history: Vec<ExactFilter>,
    /// History filters not desired: awaiting removal.
    pub pending_stale: Vec<ExactFilter>,
    /// Why the last attempt failed, or the migration reason; `None` after reaching Full.
    pub last_failure: Option<String>,
    /// Inputs of another connection, or no longer expected, that were ignored.
    pub ignored_inputs: u64,
}
