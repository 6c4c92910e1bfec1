//! The locked group executor and worker-instance heartbeats on Postgres.

use sqlx::PgConnection;

use super::events::append_in_tx;
use super::PgStore;
use crate::error::StoreError;
use crate::event::{Heartbeat, InstanceRecord, RecordedEvent};
use crate::group::{GroupDecision, GroupLock, GroupSnapshot, LiveInstanceRow, GROUP_AGGREGATE};

impl PgStore {
    /// Runs one declaration attempt for a group as a single transaction (see [`crate::group`]).
    /// Concurrent attempts on the group serialize on its `consumer_group` row lock. A decision
    /// error rolls everything back and is returned as the inner `Err`.
    pub async fn execute_group<T, E, F>(
        &self,
        lock: GroupLock,
        decide: F,
    ) -> Result<Result<T, E>, StoreError>
    where
        T: Send,
        E: Send,
        F: FnOnce(&GroupSnapshot) -> GroupDecision<T, E> + Send,
    {
        let mut tx = self.pool.begin().await?;
        let snapshot = match lock_and_read(&mut tx, &lock).await? {
            Some(snapshot) => snapshot,
            None => read_snapshot(&mut tx, &lock).await?,
        };
        let (write, value) = match decide(&snapshot) {
            Ok(decided) => decided,
            Err(e) => {
                tx.rollback().await?;
                return Ok(Err(e));
            }
        };
        append_in_tx(
            &mut tx,
            &self.projectors,
            GROUP_AGGREGATE,
            &lock.group,
            snapshot.last_sequence(),
            &write.events,
        )
        .await?;
        if let Some(heartbeat) = &write.heartbeat {
            upsert_instance(&mut tx, &lock, heartbeat).await?;
        }
        tx.commit().await?;
        Ok(Ok(value))
    }

    /// Refreshes an instance's heartbeat by the database clock; `false` when the instance has
    /// no row (it left or never joined).
    pub async fn heartbeat(&self, group: &str, declarer: &str) -> Result<bool, StoreError> {
        let touched = sqlx::query(
            "UPDATE worker_instance SET heartbeat_at = clock_timestamp() \
             WHERE group_name = $1 AND declarer = $2",
        )
        .bind(group)
        .bind(declarer)
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(touched == 1)
    }

    /// Removes an instance (graceful shutdown), so a waiting new set need not wait for its TTL.
    pub async fn leave(&self, group: &str, declarer: &str) -> Result<bool, StoreError> {
        let removed =
            sqlx::query("DELETE FROM worker_instance WHERE group_name = $1 AND declarer = $2")
                .bind(group)
                .bind(declarer)
                .execute(&self.pool)
                .await?
                .rows_affected();
        Ok(removed == 1)
    }

    /// Every recorded instance (of one group, or of all), newest heartbeat first per group.
    pub async fn instances(
        &self,
        group: Option<String>,
    ) -> Result<Vec<InstanceRecord>, StoreError> {
        let rows: Vec<InstanceTuple> = sqlx::query_as(
            "SELECT group_name, declarer, topic, version, patterns, started_at, heartbeat_at \
                 FROM worker_instance WHERE $1::text IS NULL OR group_name = $1 \
                 ORDER BY group_name, heartbeat_at DESC, declarer",
        )
        .bind(group)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(
                |(group, declarer, topic, version, patterns, started_at, heartbeat_at)| {
                    InstanceRecord {
                        group,
                        declarer,
                        topic,
                        version,
                        patterns,
                        started_at,
                        heartbeat_at,
                    }
                },
            )
            .collect())
    }
}

type InstanceTuple = (
    String,
    String,
    String,
    String,
    Vec<String>,
    chrono::DateTime<chrono::Utc>,
    chrono::DateTime<chrono::Utc>,
);

/// The store's time, the group's live instances, its events after the caller's sequence and
/// its newest sequence, as one select list ($1 group, $2 TTL seconds, $3 aggregate type,
/// $4 after-sequence).
const SNAPSHOT_COLUMNS: &str = "clock_timestamp(), \
   COALESCE((SELECT json_agg(json_build_object('declarer', declarer, 'patterns', patterns) \
       ORDER BY declarer) FROM worker_instance WHERE group_name = $1 \
       AND heartbeat_at > clock_timestamp() - make_interval(secs => $2)), '[]'::json), \
   COALESCE((SELECT json_agg(json_build_object('position', position, \
       'aggregate_type', aggregate_type, 'aggregate_id', aggregate_id, \
       'sequence', sequence, 'event_type', event_type, \
       'event_version', event_version, 'payload', payload, 'metadata', metadata, \
       'recorded_at', recorded_at) ORDER BY sequence) \
     FROM events WHERE aggregate_type = $3 AND aggregate_id = $1 AND sequence > $4), \
     '[]'::json), \
   (SELECT COALESCE(MAX(sequence), 0) FROM events \
     WHERE aggregate_type = $3 AND aggregate_id = $1)";

type SnapshotRow = (
    chrono::DateTime<chrono::Utc>,
    sqlx::types::Json<Vec<LiveInstanceRow>>,
    sqlx::types::Json<Vec<RecordedEvent>>,
    i64,
);

fn snapshot_of(lock: &GroupLock, row: SnapshotRow) -> GroupSnapshot {
    let (now, live, events, stream_head) = row;
    GroupSnapshot {
        events: events.0,
        after_sequence: lock.after_sequence,
        stream_head,
        live_instances: live.0,
        now,
    }
}

/// Creates the group row if needed and locks it (`ON CONFLICT DO UPDATE` takes the row lock, as
/// `SELECT ... FOR UPDATE` would), bumping its version, and reads the snapshot in the same
/// statement. That snapshot was taken when the statement started, possibly before a wait for
/// the lock; it is used only when the version it saw is one below the version written (no other
/// attempt committed in between). `None` means: read the snapshot again, now, under the lock.
/// A new group's routing cursor starts at the topic's head (ADR 0007).
async fn lock_and_read(
    conn: &mut PgConnection,
    lock: &GroupLock,
) -> Result<Option<GroupSnapshot>, StoreError> {
    let sql = format!(
        "INSERT INTO consumer_group (group_name, topic, routed_position) \
         VALUES ($1, $5, COALESCE((SELECT head FROM topic WHERE name = $5), 0)) \
         ON CONFLICT (group_name) DO UPDATE SET version = consumer_group.version + 1 \
         RETURNING consumer_group.version, \
           (SELECT g.version FROM consumer_group g WHERE g.group_name = $1), {SNAPSHOT_COLUMNS}"
    );
    type Row = (
        i64,
        Option<i64>,
        chrono::DateTime<chrono::Utc>,
        sqlx::types::Json<Vec<LiveInstanceRow>>,
        sqlx::types::Json<Vec<RecordedEvent>>,
        i64,
    );
    let (written, seen, now, live, events, stream_head): Row = sqlx::query_as(&sql)
        .bind(&lock.group)
        .bind(lock.instance_ttl.as_secs_f64())
        .bind(GROUP_AGGREGATE)
        .bind(lock.after_sequence)
        .bind(&lock.topic)
        .fetch_one(conn)
        .await?;
    let consistent = match seen {
        None => written == 0,
        Some(seen) => seen + 1 == written,
    };
    Ok(consistent.then(|| snapshot_of(lock, (now, live, events, stream_head))))
}

/// What the decision needs, read in one round trip under the lock.
async fn read_snapshot(
    conn: &mut PgConnection,
    lock: &GroupLock,
) -> Result<GroupSnapshot, StoreError> {
    let row: SnapshotRow = sqlx::query_as(&format!("SELECT {SNAPSHOT_COLUMNS}"))
        .bind(&lock.group)
        .bind(lock.instance_ttl.as_secs_f64())
        .bind(GROUP_AGGREGATE)
        .bind(lock.after_sequence)
        .fetch_one(conn)
        .await?;
    Ok(snapshot_of(lock, row))
}

async fn upsert_instance(
    conn: &mut PgConnection,
    lock: &GroupLock,
    heartbeat: &Heartbeat,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO worker_instance (group_name, declarer, topic, version, patterns, started_at, heartbeat_at) \
         SELECT $1, $2, $3, $4, $5, c.t, c.t FROM (SELECT clock_timestamp() AS t) c \
         ON CONFLICT (group_name, declarer) DO UPDATE SET topic = excluded.topic, \
         version = excluded.version, patterns = excluded.patterns, heartbeat_at = excluded.heartbeat_at",
    )
    .bind(&lock.group)
    .bind(&heartbeat.declarer)
    .bind(&lock.topic)
    .bind(&heartbeat.version)
    .bind(&heartbeat.patterns)
    .execute(conn)
    .await?;
    Ok(())
}
