//! Handler slots for the claim loop: how a fetch gathers the slots it claims for, and how long
//! the loop keeps its store connection while it waits for one (ADR 0051).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wharf_queue::HeldConnection;

/// How long the claim loop keeps its connection while it waits for a handler slot: about the
/// time a batch of quick handlers takes to finish, well under the pool's idle check.
pub(crate) const CONNECTION_LINGER: Duration = Duration::from_millis(5);

/// How long a fetch waits for more handler slots to free up when only a few are free: handlers
/// that finish together then share one claim (and their acks one commit) instead of each
/// fetching alone.
const SLOT_LINGER: Duration = Duration::from_millis(1);

/// Takes `first` and whatever other slots free up within [`SLOT_LINGER`], up to `want`.
pub(crate) async fn gather_slots(
    slots: &Arc<Semaphore>,
    first: OwnedSemaphorePermit,
    want: usize,
) -> Vec<OwnedSemaphorePermit> {
    let mut permits = vec![first];
    let deadline = tokio::time::Instant::now() + SLOT_LINGER;
    while permits.len() < want {
        let next = match slots.clone().try_acquire_owned() {
            Ok(permit) => Ok(permit),
            Err(_) => tokio::time::timeout_at(deadline, slots.clone().acquire_owned())
                .await
                .map_err(|_| ())
                .and_then(|acquired| acquired.map_err(|_| ())),
        };
        match next {
            Ok(permit) => permits.push(permit),
            Err(()) => break,
        }
    }
    permits
}

/// A slot that frees within [`CONNECTION_LINGER`] while `held` keeps a connection; `None` (and
/// the connection handed back to the pool) when none does, or when none was held.
pub(crate) async fn slot_while_held(
    slots: &Arc<Semaphore>,
    held: &mut HeldConnection,
) -> Option<OwnedSemaphorePermit> {
    if !held.is_held() {
        return None;
    }
    let soon = tokio::time::timeout(CONNECTION_LINGER, slots.clone().acquire_owned());
    if let Ok(Ok(permit)) = soon.await {
        return Some(permit);
    }
    held.release();
    None
}
