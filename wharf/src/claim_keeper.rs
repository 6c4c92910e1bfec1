//! Keeps a running handler's claim alive.
//!
//! A claim hides its message for the visibility timeout. A handler that runs longer would see
//! the message handed to another instance while it still works on it. While a handler runs, the
//! keeper extends the claim by the visibility timeout every third of it, until the handler ends
//! or the claim has been held for `queue.max_claim_hold`; then it lets the claim expire (a hung
//! handler must not hold a message forever). An extension that finds the claim taken over stops
//! the keeper and is counted as a lost claim.

use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, warn};
use wharf_queue::{Claimed, ExtendOutcome, Queue};
use wharf_store::Finishing;

/// How a consumer keeps its claims.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeepPolicy {
    /// The queue's visibility timeout: each extension's length.
    pub visibility_timeout: Duration,
    /// How long a claim is kept in all; zero keeps none.
    pub max_hold: Duration,
}

impl KeepPolicy {
    /// Time between extensions: a third of the timeout, so one failed extension still leaves
    /// another try before the claim expires.
    fn interval(&self) -> Duration {
        (self.visibility_timeout / 3).max(Duration::from_millis(1))
    }
}

/// Why the keeper stopped extending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeeperEnd {
    /// The claim had been taken over.
    ClaimLost,
    /// `max_hold` passed; the claim is left to expire.
    HoldLimit,
}

/// Extends `message`'s claim until `max_hold` passes or the claim is lost; never returns while
/// it keeps the claim, so it is meant to be raced against the handler.
pub(crate) async fn keep_claim(queue: &Queue, message: &Claimed, policy: KeepPolicy) -> KeeperEnd {
    let started = Instant::now();
    loop {
        let next = Instant::now() + policy.interval();
        if next.duration_since(started) >= policy.max_hold {
            tokio::time::sleep_until(started + policy.max_hold).await;
            warn!(
                held = %humantime::format_duration(policy.max_hold),
                "the handler is still running after queue.max_claim_hold; its claim is no \
                 longer extended and the message may be redelivered to another instance"
            );
            return KeeperEnd::HoldLimit;
        }
        tokio::time::sleep_until(next).await;
        // The handler may end while an extension is in flight: the race drops this loop, not
        // the extension's statement, which runs to its end on its own (ADR 0068).
        let (extending, claimed) = (queue.clone(), message.clone());
        let extension =
            Finishing::new(
                async move { extending.extend(&claimed, policy.visibility_timeout).await },
            );
        match extension.await {
            Ok(ExtendOutcome::Extended { visible_at }) => debug!(%visible_at, "claim extended"),
            Ok(ExtendOutcome::ClaimLost) => {
                warn!(
                    "the claim was taken over while the handler runs; the message may be \
                     handled twice (delivery is at least once)"
                );
                return KeeperEnd::ClaimLost;
            }
            Err(e) => warn!(error = %e, "extending the claim failed; trying again"),
        }
    }
}
