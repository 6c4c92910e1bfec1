//! Retention, written once for both backends (ADR 0078): delete, in bounded batches, messages
//! older than the retention that no live group still needs (ADR 0014: being routed past is not
//! being consumed, since a swap applies to everything the log still holds; so age is the only
//! limit).
//!
//! A live group (an instance with a fresh heartbeat) needs what it has not routed or, after a
//! swap, not rescanned, and what waits in its deliveries: the topic's live floor. Each batch
//! computes that floor afresh in its own transaction (on Postgres under a per-topic lock a
//! dead-letter replay also takes), so a message replayed mid-pass raises it before the next
//! batch looks; then deletes up to a batch of aged messages below it, and the deliveries and
//! set-aside deliveries whose messages are gone (they can never be handed out again).

use std::time::Duration;

use crate::error::QueueError;
use crate::message::RetentionReport;

/// What one pass keeps and how much one batch deletes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RetentionLimits {
    /// Messages younger than this stay.
    pub retention: Duration,
    /// A group is live while an instance's heartbeat is younger than this.
    pub instance_ttl: Duration,
    /// At most this many messages per batch.
    pub batch: i64,
}

/// A table whose rows point at log messages: retention drops those whose messages are gone.
#[derive(Debug, Clone, Copy)]
pub(crate) enum OrphanTable {
    Delivery,
    SetAside,
}

impl OrphanTable {
    /// The table's name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Delivery => "delivery",
            Self::SetAside => "set_aside",
        }
    }
}

/// What one batch deleted.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct BatchDeleted {
    pub messages: u64,
    pub orphaned_deliveries: u64,
    pub set_aside: u64,
}

/// A backend's side of a pass: the topics, and each batch's transaction.
pub(crate) trait RetentionRunner {
    /// Every topic, by name.
    async fn topics(&self) -> Result<Vec<String>, QueueError>;

    /// Runs [`batch`] on `topic` in a transaction of its own.
    async fn batch(&self, topic: &str, limits: RetentionLimits)
        -> Result<BatchDeleted, QueueError>;
}

/// A backend's statements inside one batch's transaction.
pub(crate) trait RetentionBatch {
    /// The lowest position `topic` must keep for its live groups.
    async fn live_floor(&mut self, topic: &str, instance_ttl: Duration) -> Result<i64, QueueError>;

    /// Deletes up to `batch` messages of `topic` below `floor` older than `retention`, lowest
    /// first; how many.
    async fn delete_aged(
        &mut self,
        topic: &str,
        floor: i64,
        retention: Duration,
        batch: i64,
    ) -> Result<u64, QueueError>;

    /// Deletes the rows of `table` for `topic` below `floor` whose messages are gone; how
    /// many.
    async fn drop_orphans(
        &mut self,
        table: OrphanTable,
        topic: &str,
        floor: i64,
    ) -> Result<u64, QueueError>;
}

/// One pass over every topic: batches until one deletes fewer messages than a batch.
pub(crate) async fn retain<R: RetentionRunner>(
    runner: &R,
    limits: RetentionLimits,
) -> Result<RetentionReport, QueueError> {
    let mut report = RetentionReport::default();
    for topic in runner.topics().await? {
        loop {
            let deleted = runner.batch(&topic, limits).await?;
            report.messages += deleted.messages;
            report.orphaned_deliveries += deleted.orphaned_deliveries;
            report.set_aside_dropped += deleted.set_aside;
            if (deleted.messages as i64) < limits.batch {
                break;
            }
        }
    }
    Ok(report)
}

/// One batch on `topic`: a fresh floor, up to a batch of aged messages, and the orphans.
pub(crate) async fn batch<B: RetentionBatch>(
    db: &mut B,
    topic: &str,
    limits: RetentionLimits,
) -> Result<BatchDeleted, QueueError> {
    let floor = db.live_floor(topic, limits.instance_ttl).await?;
    let messages = db
        .delete_aged(topic, floor, limits.retention, limits.batch)
        .await?;
    Ok(BatchDeleted {
        messages,
        orphaned_deliveries: db.drop_orphans(OrphanTable::Delivery, topic, floor).await?,
        set_aside: db.drop_orphans(OrphanTable::SetAside, topic, floor).await?,
    })
}
