//! The HA lease of an exclusive MQTT session: the lease ledger aggregate and its fence, the
//! renewal timing and the sans-IO renewer, and the bound on one activation (ADR 0028).
//!
//! Everything here is judged by a time the caller passes in: the lease ledger by the **store's**
//! clock (`DateTime<Utc>`, Postgres `clock_timestamp()` or the SQLite store's clock), the renewer
//! and the activation deadline by the driver's monotonic clock (a `Duration` since its epoch).
//! No clock is read here.

pub mod activation;
pub mod ledger;
pub mod renewer;
pub mod timing;
pub mod types;

pub use activation::{activation_deadline, ActivationPhases};
pub use ledger::{fence, Lease, LeaseCommand, LeaseError, LeaseEvent, Ownership, LEASE_AGGREGATE};
pub use renewer::{RenewOutcome, Renewer, RenewerAction, StepDownReason};
pub use timing::LeaseTiming;
pub use types::{FenceError, FencingToken, LeaseHolder, Staleness};
