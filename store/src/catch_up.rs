//! Catching a projector up with the log, written once for both backends (ADR 0078).
//!
//! A cheap look first (the log's head and the projector's checkpoint, no lock): with nothing
//! new, the common case for reads that catch up before they answer, nothing else runs. Then
//! batches up to that head, each in a transaction of its own that holds the projector's
//! checkpoint (so concurrent runners take turns), reads at most `batch` positions after it,
//! applies them in order and moves the checkpoint in the same commit. Each backend supplies
//! the look and the batch's transaction ([`CatchUpRunner`]) and the batch's statements
//! ([`CatchUpBatch`]).

use crate::error::StoreError;
use crate::event::RecordedEvent;

/// A backend's side of catching one projector up.
pub(crate) trait CatchUpRunner {
    /// The log's head and the projector's checkpoint, read without a lock.
    async fn look(&self) -> Result<(i64, i64), StoreError>;

    /// Runs [`batch`] towards `head` in a transaction of its own, committed when it returns.
    async fn batch(&self, head: i64, batch: i64) -> Result<Option<u64>, StoreError>;
}

/// A backend's statements inside one batch's transaction.
pub(crate) trait CatchUpBatch {
    /// The projector's name.
    fn projector(&self) -> &'static str;

    /// The projector's checkpoint (0 when it never ran), held against other runners until the
    /// batch commits.
    async fn hold_checkpoint(&mut self) -> Result<i64, StoreError>;

    /// The events with `after < position <= through`, in position order.
    async fn events(&mut self, after: i64, through: i64) -> Result<Vec<RecordedEvent>, StoreError>;

    /// Applies the projector to one event.
    async fn apply(&mut self, event: &RecordedEvent) -> Result<(), StoreError>;

    /// Moves the projector's checkpoint to `through`.
    async fn set_checkpoint(&mut self, through: i64) -> Result<(), StoreError>;
}

/// Brings the runner's projector up to the head of the log as it stood at the look, `batch`
/// positions per transaction; how many events it applied.
pub(crate) async fn catch_up<R: CatchUpRunner>(runner: &R, batch: i64) -> Result<u64, StoreError> {
    let (head, checkpoint) = runner.look().await?;
    if head <= checkpoint {
        return Ok(0);
    }
    // Every position up to `head` is settled (one writer on SQLite; the append lock on
    // Postgres). A batch covers at most `batch` positions: fewer events where the pruner left
    // gaps.
    let mut applied = 0u64;
    while let Some(count) = runner.batch(head, batch).await? {
        applied += count;
    }
    Ok(applied)
}

/// One batch towards `head`: `None` when the checkpoint has reached it (another runner may
/// have got there first).
pub(crate) async fn batch<B: CatchUpBatch>(
    db: &mut B,
    head: i64,
    batch: i64,
) -> Result<Option<u64>, StoreError> {
    let from = db.hold_checkpoint().await?;
    if from >= head {
        return Ok(None);
    }
    let through = head.min(from.saturating_add(batch.max(1)));
    let events = db.events(from, through).await?;
    for event in &events {
        db.apply(event)
            .await
            .map_err(|e| StoreError::in_projector(db.projector(), e))?;
    }
    db.set_checkpoint(through).await?;
    Ok(Some(events.len() as u64))
}
