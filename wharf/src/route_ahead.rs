//! Routing ahead of the claims (ADR 0050).
//!
//! A fetch routes only when its claim comes back short, and then waits for the routing step (a
//! locked transaction of several statements) before it claims again: with a backlog, one fetch
//! in every batch of routed messages paid a routing step on the claim path. A router task
//! beside each claim loop keeps about a routing batch of the log routed ahead of what the loop
//! claims, so the loop's claims rarely come back short.
//!
//! The claim loop reports each batch it claims ([`RouteAhead::claimed`]); when the highest
//! position claimed comes within one routing batch of the position routed so far, the router
//! takes routing steps until it is a batch ahead again, the log is routed to its head, another
//! instance is routing (busy), or the install moved on. Once it has routed to the head it waits
//! for a publish to the topic before it routes again. Each step is fenced by the install the
//! loop claims under, so a lapsed instance routes nothing for a set it no longer holds.
//!
//! Nothing depends on the router: a claim that comes back short still routes itself, and the
//! routing step's group lock (SKIP LOCKED) keeps one router per group at a time whoever runs it.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tracing::{debug, Instrument};
use wharf_domain::GroupName;
use wharf_queue::{Claimed, InstallFence, Queue, QueueError};

/// The router of one claim loop; stops when dropped.
pub(crate) struct RouteAhead {
    shared: Arc<Shared>,
    batch: i64,
    task: JoinHandle<()>,
}

/// What the claim loop and the router share.
#[derive(Default)]
struct Shared {
    /// Wakes the router: the claims came within a batch of the routed position.
    wanted: Notify,
    /// The highest log position known to be routed (0 until the first step).
    routed: AtomicI64,
    /// The highest log position the loop has claimed.
    claimed: AtomicI64,
    /// The install the loop claims under: every step is fenced by it.
    install: AtomicI64,
}

impl RouteAhead {
    /// Starts the router of `group`'s claim loop; `published` changes after publishes to the
    /// group's topic.
    pub(crate) fn start(queue: Queue, group: GroupName, published: watch::Receiver<u64>) -> Self {
        let shared = Arc::new(Shared::default());
        let batch = queue.settings().route_batch.max(1);
        // In the claim loop's span: its logs name the consumer's group and instance.
        let router = route(queue, group, shared.clone(), published, batch);
        let task = tokio::spawn(router.in_current_span());
        Self {
            shared,
            batch,
            task,
        }
    }

    /// The loop claimed `messages` under `install`: wakes the router when they came within a
    /// routing batch of the position routed so far.
    pub(crate) fn claimed(&self, install: InstallFence, messages: &[Claimed]) {
        let Some(highest) = messages.iter().map(|m| m.position).max() else {
            return;
        };
        self.shared
            .install
            .store(install.install(), Ordering::Relaxed);
        let claimed = self
            .shared
            .claimed
            .fetch_max(highest, Ordering::Relaxed)
            .max(highest);
        if self.shared.routed.load(Ordering::Relaxed) - claimed < self.batch {
            self.shared.wanted.notify_one();
        }
    }
}

impl Drop for RouteAhead {
    fn drop(&mut self) {
        // A step cut short rolls back: routing is idempotent and the next step redoes it.
        self.task.abort();
    }
}

/// The router: steps when woken by the claims, until a batch ahead; once at the head of the
/// log, waits for a publish first.
async fn route(
    queue: Queue,
    group: GroupName,
    shared: Arc<Shared>,
    mut published: watch::Receiver<u64>,
    batch: i64,
) {
    let mut at_head = false;
    loop {
        if at_head {
            if published.changed().await.is_err() {
                return;
            }
        } else {
            shared.wanted.notified().await;
        }
        at_head = steps(&queue, &group, &shared, batch).await;
    }
}

/// Routing steps until a batch ahead of the claims; true when the last one found the log
/// routed to its head.
async fn steps(queue: &Queue, group: &GroupName, shared: &Shared, batch: i64) -> bool {
    loop {
        let fence = InstallFence::joined(shared.install.load(Ordering::Relaxed));
        let report = match queue.route_fenced(group, Some(fence)).await {
            Ok(report) => report,
            Err(QueueError::Fenced { .. }) => return false,
            Err(e) => {
                // The claim path routes on its own and reports its errors.
                debug!(error = %e, "routing ahead failed; the claims route for themselves");
                return false;
            }
        };
        if report.busy {
            return false;
        }
        let routed = shared
            .routed
            .fetch_max(report.position, Ordering::Relaxed)
            .max(report.position);
        if !report.more(batch) {
            return true;
        }
        if routed - shared.claimed.load(Ordering::Relaxed) >= batch {
            return false;
        }
    }
}
