//! Wharf's domain: pure, synchronous and deterministic.
//!
//! Everything here is a plain function of (state, command, time given): no clock is read, no
//! I/O is done. The store adapters load state, pass in the store's time and the live instances
//! they observed, and append what the decision returns.
//!
//! Architecture invariant: this crate depends on no runtime, database or network crate (tokio,
//! sqlx, rusqlite, rumqttc, axum). `cqrs-es` is used for its `Aggregate` contract and its
//! given/when/then test harness only.

pub mod binding_set;
pub mod consumer;
pub mod declaration;
pub mod error;
pub mod filter;
pub mod group_state;
pub mod lease;
pub mod matcher;
pub mod names;
pub mod session;

pub use binding_set::BindingSet;
pub use consumer::{ConsumerLifecycle, ConsumerState, LifecycleTiming};
pub use declaration::{
    decide, Attempt, ConsumerGroup, Decision, DeclarationError, DeclarationEvent, LiveInstance,
    OpenWait, OpenWaits, Register, RegisterOutcome,
};
pub use error::ValidationError;
pub use filter::{Subject, TopicFilter};
pub use group_state::{
    decode_group_state, encode_group_state, fold_group, is_current_format, StateRefused,
    GROUP_STATE_FORMAT,
};
pub use lease::{
    fence, ActivationPhases, FenceError, FencingToken, Lease, LeaseCommand, LeaseError, LeaseEvent,
    LeaseHolder, LeaseTiming, RenewOutcome, Renewer, RenewerAction, Staleness, StepDownReason,
    LEASE_AGGREGATE,
};
pub use matcher::BindingMatcher;
pub use names::{AppVersion, DeclarerId, GroupName, TopicName};
pub use session::{
    redact_url, Acknowledgement, CanonicalBroker, DurableSessionIdentity, ExactFilter,
    FilterRecord, IdentityInputs, ManagedFilterEvent, ManagedSession, ManagedSessionCommand,
    ManagedSessionError, Plan, Qos, Reconciler, SessionLevel, SessionMode, SubscribeOutcome,
    MANAGED_SESSION_AGGREGATE,
};
