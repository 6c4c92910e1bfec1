//! Coalesces the acks of one consumer's handlers into shared commits.
//!
//! Each finished handler hands its message to the acker and waits for the outcome. The acker
//! takes whatever acks are queued at that moment (up to [`MAX_BATCH`]) and settles them with
//! one `Queue::ack_many`, one commit. Nothing waits for a batch to fill: a lone ack goes out at
//! once, and under load the acks that queue up during one commit share the next (group
//! commit). An ack is never reported before its commit.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::debug;
use wharf_queue::{AckOutcome, Claimed, Queue, QueueError};
use wharf_store::StoreError;

/// The most acks settled in one commit.
const MAX_BATCH: usize = 256;

type Reply = oneshot::Sender<Result<AckOutcome, Arc<QueueError>>>;

/// The handlers' side of the acker; cloned into every handler task.
#[derive(Clone)]
pub(crate) struct Acker {
    acks: mpsc::UnboundedSender<(Claimed, Reply)>,
    queue: Queue,
}

impl Acker {
    /// Starts the acker's task on `queue`; it ends when every `Acker` clone is dropped.
    pub(crate) fn start(queue: Queue) -> (Self, JoinHandle<()>) {
        let (acks, receiver) = mpsc::unbounded_channel();
        let task = tokio::spawn(settle_batches(queue.clone(), receiver));
        (Self { acks, queue }, task)
    }

    /// Acks `message` in the next shared commit and returns its outcome.
    pub(crate) async fn ack(&self, message: Claimed) -> Result<AckOutcome, Arc<QueueError>> {
        let (reply, outcome) = oneshot::channel();
        if let Err(mpsc::error::SendError((message, _))) = self.acks.send((message, reply)) {
            // The acker task is gone (it panicked): ack on our own.
            return self.queue.ack(&message).await.map_err(Arc::new);
        }
        outcome.await.unwrap_or_else(|_| {
            Err(Arc::new(QueueError::Store(StoreError::Task(
                "the acker stopped before settling this ack".to_owned(),
            ))))
        })
    }
}

async fn settle_batches(queue: Queue, mut acks: mpsc::UnboundedReceiver<(Claimed, Reply)>) {
    let mut batch = Vec::new();
    while acks.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let (messages, replies): (Vec<Claimed>, Vec<Reply>) = batch.drain(..).unzip();
        debug!(acks = messages.len(), "settling acks in one commit");
        match queue.ack_many(&messages).await {
            Ok(outcomes) => {
                for (reply, outcome) in replies.into_iter().zip(outcomes) {
                    let _ = reply.send(Ok(outcome));
                }
            }
            Err(e) => {
                let e = Arc::new(e);
                for reply in replies {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }
}
