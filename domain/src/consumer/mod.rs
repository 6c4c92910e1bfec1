//! The consuming instance's declaration lifecycle as a sans-IO machine (ADRs 0015, 0076).
//!
//! [`ConsumerLifecycle`] decides every step of one consumer: declare (and wait, loudly, with
//! no timeout), learn the install joined, heartbeat, stall, lapse, re-declare, and leave once
//! the claim loop has drained. The driver (`wharf`'s `consumer.rs`) does what each [`Step`]
//! says: it publishes the states and logs the notes, makes the one store call asked for with
//! its deadline (or waits until the time given, or for a signal), and feeds the answer back as
//! an [`Input`], with the time of its own monotonic clock as a [`Now`] (a `Duration` since its
//! epoch). No clock is read here, so every rule below is tested with no clock
//! (`domain/tests/consumer_lifecycle.rs`).
//!
//! The rules:
//! - **Ready only in effect.** The instance is [`ConsumerState::Consuming`] only after an
//!   attempt joined or installed and the install read right after it is the instance's own
//!   set; that install's position is its fence. A waiting, refused, stalled or re-declaring
//!   instance is not ready.
//! - **Readiness bounded by the TTL.** The lapse is the **send** time of the last call that
//!   confirmed the heartbeat (the attempt that joined, or a heartbeat whose install check
//!   found the same install) plus `instance_ttl`: the row's heartbeat is no older, so by the
//!   store's clock it cannot lapse earlier. The machine never reports `Consuming` at or past
//!   the lapse: a wait ends at it, and a confirmation that arrives at or past it does not count.
//! - **Stalled at once.** A heartbeat (or its install check) that fails or gets no answer
//!   makes the instance [`ConsumerState::Stalled`]; the lapse stays where it was.
//! - **Lapsed: declare again.** Once the lapse passes unconfirmed, the group may count the
//!   instance as gone, so it declares again (and may wait) before it claims again; a row gone,
//!   an install moved on, or a fenced fetch under its install do the same.
//! - **Resume within the TTL.** A heartbeat confirmed again before the lapse resumes
//!   consuming under the same install, with the same `joins`.
//! - **Every call bounded.** A call's deadline is `now + call_deadline` and, while in effect,
//!   never past the lapse: `min(now + call_deadline, lapse)`. A call whose deadline has passed
//!   is not sent.
//! - **Drain, then leave.** A stop ends declaring; a consuming instance heartbeats on until
//!   the claim loop has drained (the halt), then leaves.

mod machine;
mod state;
mod timing;

pub use machine::{
    AttemptFailure, CallFailure, ConsumerLifecycle, Effect, HeartbeatAnswer, Input, Install, Next,
    Note, Now, Step, StoreCall,
};
pub use state::ConsumerState;
pub use timing::LifecycleTiming;
