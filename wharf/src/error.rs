//! The library's one error type.

use wharf_domain::lease::LeaseError;
use wharf_domain::session::ManagedSessionError;
use wharf_domain::{DeclarationError, ValidationError};
use wharf_projections::ProjectionError;
use wharf_queue::QueueError;
use wharf_store::StoreError;

/// Anything the embedded library can fail with.
#[derive(Debug, thiserror::Error)]
pub enum WharfError {
    /// Input was refused; names the field and the value.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// The declaration was refused (e.g. the group consumes another topic).
    #[error(transparent)]
    Declaration(#[from] DeclarationError),
    /// The store failed or is unreachable.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A read failed.
    #[error(transparent)]
    Projection(#[from] ProjectionError),
    /// The message log failed (publishing, claiming, settling or retention).
    #[error(transparent)]
    Queue(QueueError),
    /// A managed-session ledger command was refused (unknown history, migration required...).
    #[error(transparent)]
    Session(#[from] ManagedSessionError),
    /// The configuration is unusable; names the key.
    #[error("configuration: {0}")]
    Config(String),
    /// A lease command was refused (held by another, a stale release...); nothing landed.
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// A ledger write on behalf of an exclusive session's lease owner was refused by the
    /// fence, in the write's own transaction: the claim is stale, nothing landed.
    #[error("session {session_id}: write refused by the lease fence: {reason}")]
    Fenced {
        /// The durable session identity.
        session_id: String,
        /// Why the claim does not hold, as the store's guard said.
        reason: String,
    },
}

impl From<QueueError> for WharfError {
    /// Refused input stays [`WharfError::Invalid`], whichever layer refused it.
    fn from(e: QueueError) -> Self {
        match e {
            QueueError::Invalid(invalid) => Self::Invalid(invalid),
            other => Self::Queue(other),
        }
    }
}
