//! The library's one error type.

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
    /// The configuration is unusable; names the key.
    #[error("configuration: {0}")]
    Config(String),
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
