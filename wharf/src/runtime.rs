//! The claim loop of a consumer that handles messages.
//!
//! It runs beside the declaration lifecycle and claims only while the lifecycle reports
//! `Consuming`: a waiting, stalled or re-declaring instance claims nothing (handlers already
//! running finish normally, and still ack: acks go by claim token). Every fetch is fenced by
//! the install the lifecycle joined (`Queue::fetch_fenced` with `Consuming { install }`): once
//! the group's install has moved on the fetch claims nothing and fails with
//! `QueueError::Fenced`; the loop then claims nothing more under that install and tells the
//! lifecycle, which re-declares (and waits, if it must). The state it watches is the
//! domain's `ConsumerState`, the lifecycle machine's (ADR 0076): this module imports nothing of
//! `consumer`, which starts it. A fetch has a deadline of
//! `DeclarationConfig::call_deadline` (a third of the instance TTL); what a fetch abandoned at
//! its deadline may have claimed is redelivered after the visibility timeout. Each fetch asks for as many messages as there are free handler
//! slots (at most `queue.claim_batch`, with `queue.concurrency` slots in all; it lingers up to
//! a millisecond for slots about to free up, so handlers that finish together fetch together);
//! each message runs in its own task under a `message{group,topic,position,attempts}` span and
//! is acked when its handler succeeds, or nacked with the error text when it fails or panics.
//! Acks are queued for this loop (`acker`): they ride on the next fetch's claim statement (one
//! commit for the acks of one batch and the claim of the next, ADR 0035), or, when no fetch is
//! due, are settled together on their own. While a handler runs its claim is extended
//! (`claim_keeper`), up to `queue.max_claim_hold`.
//!
//! While it is busy the loop keeps its store connection from one fetch to the next (ADR 0051):
//! no pool checkout and no ping on the connection's return between them. It hands the
//! connection back whenever it would wait longer than a few milliseconds for a slot, when a
//! fetch comes back short or fails, and when the pool has no other connection to spare.
//!
//! On Postgres a router task beside the loop keeps about a routing batch of the log routed
//! ahead of what the loop claims (`route_ahead`, ADR 0050), so that a fetch rarely waits for a
//! routing step. On SQLite the claim routes what is new in its own transaction (ADR 0069), and
//! no router runs.
//!
//! An idle consumer (its last fetch came back empty) waits for `queue.poll_interval` or for a
//! publish to its topic, whichever comes first (`publish_listener` brings other processes'
//! publishes on Postgres).
//!
//! On shutdown the loop stops claiming and waits up to `queue.drain_timeout` for the running
//! handlers, then aborts the rest: their claims expire after the visibility timeout and the
//! messages are redelivered. Delivery is at least once throughout; an ack that finds its claim
//! taken over is logged at warn, since that message may be handled twice.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinError, JoinSet};
use tracing::{debug, error, info, warn, Instrument};
use wharf_domain::{ConsumerState, GroupName, TopicName};
use wharf_metrics::prometheus::IntCounter;
use wharf_metrics::StoreOperation;
use wharf_queue::{
    AckOutcome, AckedFetch, Claimed, HeldConnection, InstallFence, NackOutcome, Queue, QueueError,
};
use wharf_store::Store;

use crate::acker::{self, AckBatch, Acker, PendingAcks};
use crate::claim_keeper::{keep_claim, KeepPolicy};
use crate::config::QueueConfig;
use crate::fetch_retry::FetchRetry;
use crate::handler::Handler;
use crate::publish_listener::PublishListener;
use crate::route_ahead::RouteAhead;
use crate::slots::{gather_slots, slot_while_held};

/// A snapshot of what a consumer's handlers have done so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConsumerStats {
    /// Messages whose handler succeeded (counted once the ack was attempted).
    pub handled_ok: u64,
    /// Messages whose handler failed or panicked (counted once the nack was attempted).
    pub handled_err: u64,
    /// Acks and nacks that found the claim expired and taken over by another claim.
    pub claims_lost: u64,
    /// Handlers running now.
    pub in_flight: u64,
    /// Fetches made (claims asked of the queue), empty ones included.
    pub fetches: u64,
}

/// The live counters behind [`ConsumerStats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    handled_ok: AtomicU64,
    handled_err: AtomicU64,
    claims_lost: AtomicU64,
    in_flight: AtomicU64,
    fetches: AtomicU64,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> ConsumerStats {
        ConsumerStats {
            handled_ok: self.handled_ok.load(Ordering::Relaxed),
            handled_err: self.handled_err.load(Ordering::Relaxed),
            claims_lost: self.claims_lost.load(Ordering::Relaxed),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            fetches: self.fetches.load(Ordering::Relaxed),
        }
    }

    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The consumer's Prometheus series, resolved once when it starts: each count on the claim and
/// settle path is one atomic increment (no label lookup, no lock).
#[derive(Clone)]
pub(crate) struct RuntimeMetrics {
    group: wharf_metrics::GroupCounters,
    fetch_errors: IntCounter,
    ack_errors: IntCounter,
    nack_errors: IntCounter,
}

impl RuntimeMetrics {
    pub(crate) fn new(metrics: &wharf_metrics::Metrics, group: &str, topic: &str) -> Self {
        let errors = metrics.store_errors();
        Self {
            group: metrics.consumers().for_group(group, topic),
            fetch_errors: errors.counter(StoreOperation::Fetch),
            ack_errors: errors.counter(StoreOperation::Ack),
            nack_errors: errors.counter(StoreOperation::Nack),
        }
    }
}

/// A handler slot held by one running message: frees the slot and the in-flight count when its
/// handler returns or its task ends, however it ends (an abort included).
struct Slot {
    _permit: OwnedSemaphorePermit,
    counters: Arc<Counters>,
}

impl Slot {
    fn take(permit: OwnedSemaphorePermit, counters: Arc<Counters>) -> Self {
        Counters::bump(&counters.in_flight);
        Self {
            _permit: permit,
            counters,
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.counters.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What a handler task needs to settle its message.
#[derive(Clone)]
struct Settle {
    queue: Queue,
    acker: Acker,
    counters: Arc<Counters>,
    metrics: RuntimeMetrics,
    keep: KeepPolicy,
}

/// Everything the claim loop needs.
pub(crate) struct Runtime {
    pub queue: Queue,
    pub store: Store,
    pub listener: Arc<PublishListener>,
    pub group: GroupName,
    pub topic: TopicName,
    pub instance: String,
    pub handler: Arc<dyn Handler>,
    pub config: QueueConfig,
    /// The deadline of one fetch.
    pub call_deadline: Duration,
    pub counters: Arc<Counters>,
    pub metrics: RuntimeMetrics,
}

impl Runtime {
    /// Claims and handles messages while `state` is `Consuming`, under the install it names,
    /// until `stop`; then drains. A fenced fetch is reported on `fenced` (the install it was
    /// fenced from), and nothing more is claimed under that install.
    pub(crate) async fn run(
        self,
        mut state: watch::Receiver<ConsumerState>,
        mut stop: watch::Receiver<bool>,
        fenced: watch::Sender<Option<i64>>,
    ) {
        let concurrency = usize::try_from(self.config.concurrency).unwrap_or(usize::MAX);
        let slots = Arc::new(Semaphore::new(concurrency.clamp(1, Semaphore::MAX_PERMITS)));
        let claim_batch = usize::try_from(self.config.claim_batch.max(1)).unwrap_or(usize::MAX);
        let mut tasks = JoinSet::new();
        let mut held = HeldConnection::default();
        let mut retry = FetchRetry::default();
        self.listener.ensure(&self.queue, &self.store).await;
        let mut published = self.queue.wakeups().subscribe(self.topic.as_str());
        // Where claims route for themselves (SQLite, ADR 0069) nothing routes ahead of them.
        let ahead = (!self.queue.routes_in_claims()).then(|| {
            RouteAhead::start(
                self.queue.clone(),
                self.group.clone(),
                self.queue.wakeups().subscribe(self.topic.as_str()),
            )
        });
        let (acker, mut acks) = acker::channel(self.queue.clone());
        let settle = Settle {
            queue: self.queue.clone(),
            acker,
            counters: self.counters.clone(),
            metrics: self.metrics.clone(),
            keep: KeepPolicy {
                visibility_timeout: self.config.visibility_timeout,
                max_hold: self.config.max_claim_hold,
            },
        };
        loop {
            while let Some(ended) = tasks.try_join_next() {
                log_task_end(ended);
            }
            if stopping(&stop) {
                break;
            }
            let install = match &*state.borrow_and_update() {
                ConsumerState::Consuming { install, .. } if *fenced.borrow() != Some(*install) => {
                    Some(*install)
                }
                _ => None,
            };
            let Some(install) = install.map(InstallFence::joined) else {
                // Claiming nothing; the acks of handlers still running are settled meanwhile.
                held.release();
                let idle = std::future::pending::<()>();
                self.settling(idle, &mut acks, &mut stop, &mut state).await;
                continue;
            };
            let Some(first) = self
                .free_slot(&slots, &mut held, &mut acks, &mut stop, &mut state)
                .await
            else {
                continue;
            };
            let permits = gather_slots(&slots, first, claim_batch.min(concurrency)).await;
            let wanted = u32::try_from(permits.len()).unwrap_or(u32::MAX);
            // Publishes from here on wake the idle wait below.
            published.borrow_and_update();
            let fetched = self
                .ack_and_fetch(&mut held, acks.take_ready(), install, wanted)
                .await;
            Counters::bump(&self.counters.fetches);
            if matches!(fetched, Ok(Ok(_) | Err(QueueError::Fenced { .. }))) {
                retry.answered();
            }
            match fetched {
                Ok(Ok(messages)) if !messages.is_empty() => {
                    debug!(claimed = messages.len(), wanted, "claimed");
                    self.metrics.group.claimed(messages.len() as u64);
                    if let Some(ahead) = &ahead {
                        ahead.claimed(install, &messages);
                    }
                    for (message, permit) in messages.into_iter().zip(permits) {
                        self.spawn(&mut tasks, &settle, message, permit);
                    }
                }
                Ok(Ok(_)) => {
                    drop(permits);
                    held.release();
                    // Until the poll interval passes or the topic sees a publish, whichever
                    // comes first.
                    let poll = self.config.poll_interval;
                    let idle = async {
                        tokio::select! {
                            () = tokio::time::sleep(poll) => {}
                            _ = published.changed() => {}
                        }
                    };
                    self.settling(idle, &mut acks, &mut stop, &mut state).await;
                }
                Ok(Err(QueueError::Fenced { current, .. })) => {
                    drop(permits);
                    held.release();
                    warn!(
                        joined = install.install(),
                        ?current,
                        "the group's install moved on from the one this instance joined; \
                         claiming nothing until it has declared again"
                    );
                    fenced.send_replace(Some(install.install()));
                }
                failed => {
                    drop(permits);
                    held.release();
                    self.metrics.fetch_errors.inc();
                    let pause = retry.failed(self.config.poll_interval);
                    let retry_in = humantime::format_duration(pause);
                    match failed {
                        Ok(Err(e)) => {
                            warn!(error = %e, %retry_in, "fetching messages failed; retrying");
                        }
                        _ => warn!(
                            deadline = %humantime::format_duration(self.call_deadline),
                            %retry_in,
                            "fetching messages got no answer within its deadline; retrying \
                             (anything it claimed is redelivered after the visibility timeout)"
                        ),
                    }
                    let pause = tokio::time::sleep(pause);
                    self.settling(pause, &mut acks, &mut stop, &mut state).await;
                }
            }
        }
        held.release();
        self.drain(&mut tasks, &mut acks).await;
        drop(settle);
    }

    /// Settles `acks` (maybe none) in the claim statement of a fetch of up to `wanted`, within
    /// the call deadline. The acks' waiters are told their outcomes: from the fetch's first
    /// statement; from an `ack_many` of their own when that statement failed (it settled
    /// nothing); as an error when the deadline passed (whether they committed is unknown; an
    /// ack that did not is redelivered after the visibility timeout).
    async fn ack_and_fetch(
        &self,
        held: &mut HeldConnection,
        acks: AckBatch,
        install: InstallFence,
        wanted: u32,
    ) -> Result<Result<Vec<Claimed>, QueueError>, tokio::time::error::Elapsed> {
        let fetch = self.queue.ack_and_fetch_holding(
            held,
            &acks.messages,
            &self.group,
            &self.instance,
            Some(install),
            wanted,
        );
        match tokio::time::timeout(self.call_deadline, fetch).await {
            Ok(Ok(AckedFetch {
                acks: outcomes,
                fetched,
            })) => {
                acks.reply(Ok(outcomes));
                Ok(fetched)
            }
            Ok(Err(e)) => {
                acks.settle(&self.queue).await;
                Ok(Err(e))
            }
            Err(elapsed) => {
                acks.reply(Err(Arc::new(QueueError::Store(
                    wharf_store::StoreError::Task(format!(
                        "the fetch that carried this ack got no answer within {}",
                        humantime::format_duration(self.call_deadline)
                    )),
                ))));
                Err(elapsed)
            }
        }
    }

    /// Waits for a free handler slot. The connection the last fetch kept (`held`) is kept
    /// across a short wait ([`slot_while_held`]), the usual gap between a batch's handlers
    /// finishing and the next fetch; a longer wait hands it back to the pool first (ADR 0051).
    /// Acks that come while every slot is busy are then settled on their own.
    async fn free_slot(
        &self,
        slots: &Arc<Semaphore>,
        held: &mut HeldConnection,
        acks: &mut PendingAcks,
        stop: &mut watch::Receiver<bool>,
        state: &mut watch::Receiver<ConsumerState>,
    ) -> Option<OwnedSemaphorePermit> {
        if let Some(permit) = slot_while_held(slots, held).await {
            return Some(permit);
        }
        let free = slots.clone().acquire_owned();
        match self.settling(free, acks, stop, state).await {
            Some(Ok(permit)) => Some(permit),
            _ => None,
        }
    }

    /// Awaits `work` like [`interruptible`], settling the acks that arrive meanwhile on their
    /// own (no fetch is due while the loop waits here).
    async fn settling<F: Future>(
        &self,
        work: F,
        acks: &mut PendingAcks,
        stop: &mut watch::Receiver<bool>,
        state: &mut watch::Receiver<ConsumerState>,
    ) -> Option<F::Output> {
        tokio::pin!(work);
        loop {
            tokio::select! {
                biased;
                output = interruptible(&mut work, stop, state) => return output,
                batch = acks.next_batch() => batch.settle(&self.queue).await,
            }
        }
    }

    /// Runs one claimed message's handler in its own task, holding `permit` while it runs.
    fn spawn(
        &self,
        tasks: &mut JoinSet<()>,
        settle: &Settle,
        message: Claimed,
        permit: OwnedSemaphorePermit,
    ) {
        let span = tracing::info_span!(
            "message",
            group = %message.group,
            topic = %message.topic,
            position = message.position,
            attempts = message.attempts,
            subject = %message.subject,
        );
        let slot = Slot::take(permit, self.counters.clone());
        let handler = self.handler.clone();
        let settle = settle.clone();
        tasks.spawn(
            async move {
                process(&settle, handler.as_ref(), message, slot).await;
            }
            .instrument(span),
        );
    }

    /// Waits up to the drain timeout for running handlers (settling their acks as they come),
    /// then aborts what is left.
    async fn drain(&self, tasks: &mut JoinSet<()>, acks: &mut PendingAcks) {
        if tasks.is_empty() {
            acks.take_ready().settle(&self.queue).await;
            return;
        }
        let deadline = self.config.drain_timeout;
        info!(
            in_flight = tasks.len(),
            deadline = %humantime::format_duration(deadline),
            "stopped claiming; draining running handlers"
        );
        let all_done = async {
            loop {
                tokio::select! {
                    ended = tasks.join_next() => match ended {
                        Some(ended) => log_task_end(ended),
                        None => break,
                    },
                    batch = acks.next_batch() => batch.settle(&self.queue).await,
                }
            }
        };
        let drained = tokio::time::timeout(deadline, all_done).await;
        // What finished last may have queued an ack after the loop above last looked.
        acks.take_ready().settle(&self.queue).await;
        if drained.is_err() {
            warn!(
                aborted = tasks.len(),
                "drain deadline passed; aborting the handlers still running. Their claims \
                 expire after the visibility timeout and the messages are redelivered"
            );
            tasks.shutdown().await;
        } else {
            info!("drained");
        }
    }
}

/// Runs the handler on one message, keeping its claim alive meanwhile, and settles it: ack on
/// success (queued for the claim loop, which settles it with its next trip to the store), nack
/// on failure or panic. The handler slot is freed as soon as the handler returns (a success's
/// ack queued first), so the next fetch can carry the ack.
async fn process(settle: &Settle, handler: &dyn Handler, message: Claimed, slot: Slot) {
    let outcome = {
        let handling = AssertUnwindSafe(handler.handle(&message)).catch_unwind();
        tokio::pin!(handling);
        let keeper = keep_claim(&settle.queue, &message, settle.keep);
        tokio::pin!(keeper);
        let mut keeping = !settle.keep.max_hold.is_zero();
        loop {
            tokio::select! {
                biased;
                outcome = &mut handling => break outcome,
                // A lost claim is counted when the settle finds it lost.
                _ = &mut keeper, if keeping => keeping = false,
            }
        }
    };
    let (queue, counters) = (&settle.queue, settle.counters.as_ref());
    let metrics = &settle.metrics;
    let failure = match outcome {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(panic) => Some(format!("handler panicked: {}", panic_text(panic.as_ref()))),
    };
    let Some(reason) = failure else {
        // Queued before the slot is freed, so the fetch the free slot wakes carries the ack.
        let ack = settle.acker.queue(message);
        drop(slot);
        match ack.outcome().await {
            Ok(AckOutcome::Acked) => {
                metrics.group.acked();
                debug!("handled and acked")
            }
            Ok(AckOutcome::ClaimLost) => {
                Counters::bump(&counters.claims_lost);
                metrics.group.claim_lost();
                warn!(
                    "handled, but the claim had expired and was taken over before the ack; \
                     the message may be handled twice (delivery is at least once)"
                );
            }
            Err(e) => {
                metrics.ack_errors.inc();
                error!(
                    error = %e,
                    "handled, but the ack failed; the message is redelivered after the visibility timeout"
                )
            }
        }
        Counters::bump(&counters.handled_ok);
        return;
    };
    drop(slot);
    match queue.nack(&message, &reason).await {
        Ok(NackOutcome::Retrying { visible_at }) => {
            metrics.group.nacked(false);
            warn!(error = %reason, %visible_at, "handler failed; the message will be retried")
        }
        Ok(NackOutcome::DeadLettered) => {
            metrics.group.nacked(true);
            error!(
                error = %reason,
                "handler failed on the last attempt; the message moved to the group's dead letters"
            )
        }
        Ok(NackOutcome::ClaimLost) => {
            Counters::bump(&counters.claims_lost);
            metrics.group.claim_lost();
            warn!(error = %reason, "handler failed, and the claim had already been taken over");
        }
        Err(e) => {
            metrics.nack_errors.inc();
            error!(
                error = %e,
                handler_error = %reason,
                "handler failed and the nack failed too; the message is redelivered after the visibility timeout"
            )
        }
    }
    Counters::bump(&counters.handled_err);
}

/// Awaits `work` unless stop is requested or the lifecycle state changes first (`None`).
async fn interruptible<F: Future>(
    work: F,
    stop: &mut watch::Receiver<bool>,
    state: &mut watch::Receiver<ConsumerState>,
) -> Option<F::Output> {
    if stopping(stop) {
        return None;
    }
    tokio::select! {
        output = work => Some(output),
        _ = stop.changed() => None,
        changed = state.changed() => {
            if changed.is_err() {
                // The lifecycle is gone; only a stop can end this wait now.
                let _ = stop.wait_for(|stopped| *stopped).await;
            }
            None
        }
    }
}

/// True once stop was requested, or the handle that could request it is gone.
fn stopping(stop: &watch::Receiver<bool>) -> bool {
    *stop.borrow() || stop.has_changed().is_err()
}

fn log_task_end(ended: Result<(), JoinError>) {
    if let Err(e) = ended {
        if e.is_panic() {
            error!(error = %e, "a message task panicked outside its handler");
        }
    }
}

fn panic_text(payload: &(dyn Any + Send)) -> &str {
    if let Some(text) = payload.downcast_ref::<&'static str>() {
        text
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text
    } else {
        "a panic without a message"
    }
}
