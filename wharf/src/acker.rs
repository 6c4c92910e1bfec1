//! The acks of one consumer's handlers, settled by its claim loop.
//!
//! Each handler whose message succeeded hands it to the [`Acker`] and waits for the outcome; an
//! ack is never reported before its commit. The claim loop owns the other end
//! ([`PendingAcks`]) and takes whatever acks are queued whenever it next goes to the store:
//! before a fetch they ride on the fetch's claim statement (`Queue::ack_and_fetch`: the acks of
//! one batch and the claim of the next share one commit and, on Postgres, one statement; ADR
//! 0035); when no fetch is due (every handler slot busy, idle, not consuming, draining) it
//! settles them at once with `Queue::ack_many`. Nothing waits for a batch to fill: the acks
//! that queue up while the loop is at the store share its next trip (group commit, ADR 0012).

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tracing::debug;
use wharf_queue::{AckOutcome, Claimed, Queue, QueueError};
use wharf_store::StoreError;

/// The most acks settled by one statement.
pub(crate) const MAX_BATCH: usize = 256;

/// What an ack's waiter is told.
pub(crate) type AckResult = Result<AckOutcome, Arc<QueueError>>;

type Reply = oneshot::Sender<AckResult>;

/// The handlers' side; cloned into every handler task.
#[derive(Clone)]
pub(crate) struct Acker {
    acks: mpsc::UnboundedSender<(Claimed, Reply)>,
    queue: Queue,
}

/// The claim loop's side: the acks queued and not yet settled.
pub(crate) struct PendingAcks {
    receiver: mpsc::UnboundedReceiver<(Claimed, Reply)>,
}

/// A batch of acks taken off the queue: the messages, and who waits for each outcome.
#[derive(Default)]
pub(crate) struct AckBatch {
    pub messages: Vec<Claimed>,
    replies: Vec<Reply>,
}

/// A connected acker and its pending queue.
pub(crate) fn channel(queue: Queue) -> (Acker, PendingAcks) {
    let (acks, receiver) = mpsc::unbounded_channel();
    (Acker { acks, queue }, PendingAcks { receiver })
}

impl Acker {
    /// Queues `message` for the claim loop to ack; the returned ack reports its outcome once
    /// committed. Queued before the handler's slot is freed, so the fetch that slot wakes can
    /// carry it.
    pub(crate) fn queue(&self, message: Claimed) -> QueuedAck {
        let (reply, outcome) = oneshot::channel();
        match self.acks.send((message, reply)) {
            Ok(()) => QueuedAck::Queued(outcome),
            // The claim loop is gone (it panicked): ack on our own.
            Err(mpsc::error::SendError((message, _))) => {
                QueuedAck::Alone(self.queue.clone(), Box::new(message))
            }
        }
    }
}

/// An ack handed to the claim loop (or, with the loop gone, to be made alone).
pub(crate) enum QueuedAck {
    Queued(oneshot::Receiver<AckResult>),
    Alone(Queue, Box<Claimed>),
}

impl QueuedAck {
    /// The ack's outcome, once committed.
    pub(crate) async fn outcome(self) -> AckResult {
        match self {
            Self::Queued(outcome) => outcome.await.unwrap_or_else(|_| {
                Err(Arc::new(QueueError::Store(StoreError::Task(
                    "the claim loop stopped before settling this ack".to_owned(),
                ))))
            }),
            Self::Alone(queue, message) => queue.ack(&message).await.map_err(Arc::new),
        }
    }
}

impl PendingAcks {
    /// The acks queued right now (at most [`MAX_BATCH`]); empty when there are none.
    pub(crate) fn take_ready(&mut self) -> AckBatch {
        let mut batch = AckBatch::default();
        while batch.messages.len() < MAX_BATCH {
            match self.receiver.try_recv() {
                Ok((message, reply)) => batch.push(message, reply),
                Err(_) => break,
            }
        }
        batch
    }

    /// Waits for the next ack, then takes it and whatever else is queued by then.
    pub(crate) async fn next_batch(&mut self) -> AckBatch {
        let mut batch = AckBatch::default();
        if let Some((message, reply)) = self.receiver.recv().await {
            batch.push(message, reply);
            let mut rest = self.take_ready();
            batch.messages.append(&mut rest.messages);
            batch.replies.append(&mut rest.replies);
        }
        batch
    }
}

impl AckBatch {
    fn push(&mut self, message: Claimed, reply: Reply) {
        self.messages.push(message);
        self.replies.push(reply);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    /// Tells every waiter its outcome (`outcomes` in the batch's order) or the shared error.
    pub(crate) fn reply(self, outcomes: Result<Vec<AckOutcome>, Arc<QueueError>>) {
        match outcomes {
            Ok(outcomes) => {
                for (reply, outcome) in self.replies.into_iter().zip(outcomes) {
                    let _ = reply.send(Ok(outcome));
                }
            }
            Err(e) => {
                for reply in self.replies {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }

    /// Settles the batch on its own, in one commit (`Queue::ack_many`), and replies.
    pub(crate) async fn settle(self, queue: &Queue) {
        if self.is_empty() {
            return;
        }
        debug!(acks = self.messages.len(), "settling acks in one commit");
        let outcomes = queue.ack_many(&self.messages).await.map_err(Arc::new);
        self.reply(outcomes);
    }
}
