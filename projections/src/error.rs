//! The projections layer's error type.

use wharf_store::StoreError;

/// Anything reading or maintaining projections can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ProjectionError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A query parameter is out of range; names the parameter and the value.
    #[error("invalid {field}: {value:?}: {reason}")]
    InvalidParameter {
        /// The parameter.
        field: &'static str,
        /// The value given.
        value: String,
        /// Why it is refused.
        reason: &'static str,
    },
}

impl From<rusqlite::Error> for ProjectionError {
    fn from(e: rusqlite::Error) -> Self {
        Self::Store(e.into())
    }
}

impl From<sqlx::Error> for ProjectionError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(e.into())
    }
}
