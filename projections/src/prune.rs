//! The deferred pruner: trims superseded waiting attempts from the declaration ledger, and
//! superseded renewals from the HA lease ledger.
//!
//! Retention rule: a `DeclarationWaiting` event is superseded when the same declarer has a newer
//! event in the same group (a later retry, or its own install). Superseded attempts older than
//! the retention are deleted in bounded batches. Never deleted: an installed event, and the
//! newest event of any declarer (so an open or dead waiter keeps its newest row, which carries
//! when its wait began). Because each aggregate's newest event is some declarer's newest, the
//! next append's sequence is unaffected. Concurrent writers only add newer rows, and a row is
//! deleted only when a newer one exists that itself is never the last to go, so concurrent
//! pruners and writers are safe.
//!
//! Lease rule: a `LeaseRenewed` is superseded when a later event of the same lease stream sets
//! the expiry again or ends the ownership (a later renew, an acquire, a release or an observed
//! expiry). Superseded renewals older than the retention are deleted: the fold of what remains,
//! and so the `session_lease` row a rebuild gives, is unchanged, and the stream's newest event
//! is never deleted. A lease renewed every 6 s thus keeps about one retention's worth of
//! renewals (14,400 a day) whatever its age; acquires, releases, losses and expiries stay.

use chrono::{DateTime, Utc};
use serde::Serialize;
use wharf_store::{PgStore, SqliteStore, Store, StoreError};

/// How the pruner runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PruneOptions {
    /// Superseded attempts younger than this are kept.
    pub retention: std::time::Duration,
    /// Count what would be deleted, delete nothing.
    pub dry_run: bool,
    /// At most this many rows per delete transaction.
    pub batch: i64,
}

/// What a prune did (or, dry, would do).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PruneReport {
    /// Events recorded before this time were eligible.
    pub cutoff: DateTime<Utc>,
    /// Superseded attempts older than the cutoff.
    pub eligible: u64,
    /// How many were deleted (0 in a dry run).
    pub deleted: u64,
    /// Whether this was a dry run.
    pub dry_run: bool,
}

const SQLITE_ELIGIBLE: &str = "SELECT e.position FROM events e \
     WHERE e.aggregate_type = 'consumer_group' AND e.event_type = 'DeclarationWaiting' \
     AND e.recorded_at < ?1 AND EXISTS (SELECT 1 FROM events n \
       WHERE n.aggregate_type = e.aggregate_type AND n.aggregate_id = e.aggregate_id \
       AND n.sequence > e.sequence \
       AND json_extract(n.payload, '$.declarer') = json_extract(e.payload, '$.declarer')) \
     UNION ALL SELECT e.position FROM events e \
     WHERE e.aggregate_type = 'session_lease' AND e.event_type = 'LeaseRenewed' \
     AND e.recorded_at < ?1 AND EXISTS (SELECT 1 FROM events n \
       WHERE n.aggregate_type = e.aggregate_type AND n.aggregate_id = e.aggregate_id \
       AND n.sequence > e.sequence AND n.event_type IN \
         ('LeaseRenewed', 'LeaseAcquired', 'LeaseReleased', 'LeaseExpired'))";

const PG_ELIGIBLE: &str = "SELECT e.position FROM events e \
     WHERE e.aggregate_type = 'consumer_group' AND e.event_type = 'DeclarationWaiting' \
     AND e.recorded_at < $1 AND EXISTS (SELECT 1 FROM events n \
       WHERE n.aggregate_type = e.aggregate_type AND n.aggregate_id = e.aggregate_id \
       AND n.sequence > e.sequence AND n.payload->>'declarer' = e.payload->>'declarer') \
     UNION ALL SELECT e.position FROM events e \
     WHERE e.aggregate_type = 'session_lease' AND e.event_type = 'LeaseRenewed' \
     AND e.recorded_at < $1 AND EXISTS (SELECT 1 FROM events n \
       WHERE n.aggregate_type = e.aggregate_type AND n.aggregate_id = e.aggregate_id \
       AND n.sequence > e.sequence AND n.event_type IN \
         ('LeaseRenewed', 'LeaseAcquired', 'LeaseReleased', 'LeaseExpired'))";

/// Runs the pruner once.
pub async fn prune(store: &Store, options: PruneOptions) -> Result<PruneReport, StoreError> {
    // A retention longer than the clock can count back means nothing is old enough: the
    // cutoff saturates at the earliest time rather than failing.
    let now = store.now().await?;
    let cutoff = chrono::Duration::from_std(options.retention)
        .ok()
        .and_then(|retention| now.checked_sub_signed(retention))
        .unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC);
    let batch = options.batch.max(1);
    let (eligible, deleted) = match store {
        Store::Sqlite(s) => sqlite_prune(s, cutoff, batch, options.dry_run).await?,
        Store::Postgres(s) => pg_prune(s, cutoff, batch, options.dry_run).await?,
    };
    Ok(PruneReport {
        cutoff,
        eligible,
        deleted,
        dry_run: options.dry_run,
    })
}

async fn sqlite_prune(
    store: &SqliteStore,
    cutoff: DateTime<Utc>,
    batch: i64,
    dry_run: bool,
) -> Result<(u64, u64), StoreError> {
    let cutoff = cutoff.timestamp_micros();
    let eligible: i64 = store
        .read(move |conn| {
            Ok(conn.query_row(
                &format!("SELECT COUNT(*) FROM ({SQLITE_ELIGIBLE})"),
                [cutoff],
                |r| r.get(0),
            )?)
        })
        .await?;
    if dry_run {
        return Ok((eligible as u64, 0));
    }
    let mut deleted = 0u64;
    loop {
        let removed = store
            .write(move |ctx| {
                Ok(ctx.tx.execute(
                    &format!("DELETE FROM events WHERE position IN ({SQLITE_ELIGIBLE} LIMIT ?2)"),
                    rusqlite::params![cutoff, batch],
                )?)
            })
            .await?;
        deleted += removed as u64;
        if (removed as i64) < batch {
            return Ok((eligible as u64, deleted));
        }
    }
}

async fn pg_prune(
    store: &PgStore,
    cutoff: DateTime<Utc>,
    batch: i64,
    dry_run: bool,
) -> Result<(u64, u64), StoreError> {
    let eligible: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM ({PG_ELIGIBLE}) d"))
        .bind(cutoff)
        .fetch_one(store.pool())
        .await?;
    if dry_run {
        return Ok((eligible as u64, 0));
    }
    let mut deleted = 0u64;
    loop {
        let removed = sqlx::query(&format!(
            "DELETE FROM events WHERE position IN ({PG_ELIGIBLE} LIMIT $2)"
        ))
        .bind(cutoff)
        .bind(batch)
        .execute(store.pool())
        .await?
        .rows_affected();
        deleted += removed;
        if (removed as i64) < batch {
            return Ok((eligible as u64, deleted));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_retention_beyond_the_clock_prunes_nothing_instead_of_failing() {
        let dir = tempfile::tempdir().unwrap();
        let sqlite =
            wharf_store::SqliteStore::open(dir.path().join("w.db"), crate::sqlite_inline())
                .await
                .unwrap();
        sqlite.migrate().await.unwrap();
        let report = prune(
            &Store::Sqlite(sqlite),
            PruneOptions {
                retention: std::time::Duration::MAX,
                dry_run: false,
                batch: 10,
            },
        )
        .await
        .unwrap();
        assert_eq!((report.eligible, report.deleted), (0, 0));
        assert_eq!(report.cutoff, chrono::DateTime::<chrono::Utc>::MIN_UTC);
    }
}
