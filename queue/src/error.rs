//! The queue layer's one error type.

use wharf_domain::ValidationError;
use wharf_store::StoreError;

/// Anything publishing, routing or claiming can fail with.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// Input was refused; names the field and the value. Nothing was written.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// The group has never been declared, so it has no binding set to route with.
    #[error("consumer group {0:?} has no declaration; register it first")]
    UnknownGroup(String),
    /// A fenced claim found that the group's install has moved on from the one the instance
    /// joined: it must re-declare before it claims again.
    #[error(
        "consumer group {group:?} is no longer under install {joined} (now {current:?}); \
         re-declare before claiming"
    )]
    Fenced {
        /// The group.
        group: String,
        /// The install the instance joined.
        joined: i64,
        /// The install in effect now (`None`: the group has no declaration any more).
        current: Option<i64>,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<rusqlite::Error> for QueueError {
    fn from(e: rusqlite::Error) -> Self {
        Self::Store(e.into())
    }
}

impl From<sqlx::Error> for QueueError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(e.into())
    }
}

impl From<serde_json::Error> for QueueError {
    fn from(e: serde_json::Error) -> Self {
        Self::Store(e.into())
    }
}
