//! The sessions crate's one error type.

use wharf_domain::lease::LeaseError;
use wharf_domain::session::ManagedSessionError;
use wharf_domain::ValidationError;
use wharf_store::StoreError;

/// Anything starting, seeding, planning or running a managed MQTT session can fail with.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// Input was refused; names the field and the value.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// The store failed or is unreachable.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A managed-session ledger command was refused (unknown history, migration required...).
    #[error(transparent)]
    Session(#[from] ManagedSessionError),
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
    /// The `mqtt` or `lease` configuration is unusable; names the key.
    #[error("configuration: {0}")]
    Config(String),
}
