//! Managed MQTT subscriptions: exact filters, the durable session identity, the managed-filter
//! ledger aggregate, and the sans-IO reconcile state machine the session driver runs.

pub mod events;
pub mod exact_filter;
pub mod identity;
pub mod ledger;
pub mod reconcile;

pub use events::{ForgottenFilter, RememberedFilter, SubAckEntry};
pub use exact_filter::{ExactFilter, Qos};
pub use identity::{
    redact_url, CanonicalBroker, DurableSessionIdentity, IdentityInputs, SessionMode,
};
pub use ledger::{
    event_types, is_removal_verified, Acknowledgement, FilterRecord, ManagedFilterEvent,
    ManagedSession, ManagedSessionCommand, ManagedSessionError, SubscribeOutcome,
    MANAGED_SESSION_AGGREGATE, UNSUBACK_NO_SUBSCRIPTION_EXISTED, UNSUBACK_SUCCESS,
};
pub use reconcile::{
    plan, subscription_id, Action, Input, Now, Plan, ReconcileSettings, ReconcileStatus,
    Reconciler, SessionLevel, PLAIN_SUBSCRIPTION_ID,
};
