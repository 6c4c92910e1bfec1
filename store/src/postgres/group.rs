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
        lock_group(&mut tx, &lock).await?;
        let snapshot = read_snapshot(&mut tx, &lock).await?;
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

/// Creates the group row if needed and locks it, in one statement: `ON CONFLICT DO UPDATE`
/// takes the row lock, as `SELECT ... FOR UPDATE` would. A new group's routing cursor starts at
/// the topic's head: it receives what is published after it is first declared (ADR 0007).
async fn lock_group(conn: &mut PgConnection, lock: &GroupLock) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO consumer_group (group_name, topic, routed_position) \
         VALUES ($1, $2, COALESCE((SELECT head FROM topic WHERE name = $2), 0)) \
         ON CONFLICT (group_name) DO UPDATE SET topic = consumer_group.topic",
    )
    .bind(&lock.group)
    .bind(&lock.topic)
    .execute(conn)
    .await?;
    Ok(())
}

/// What the decision needs, read in one round trip after the lock: the store's time, the live
/// instances and the group's events.
async fn read_snapshot(
    conn: &mut PgConnection,
    lock: &GroupLock,
) -> Result<GroupSnapshot, StoreError> {
    type Row = (
        chrono::DateTime<chrono::Utc>,
        sqlx::types::Json<Vec<LiveInstanceRow>>,
        sqlx::types::Json<Vec<RecordedEvent>>,
        i64,
    );
    let (now, live, events, stream_head): Row =
        sqlx::query_as(
            "SELECT clock_timestamp(), \
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
                 WHERE aggregate_type = $3 AND aggregate_id = $1)",
        )
        .bind(&lock.group)
        .bind(lock.instance_ttl.as_secs_f64())
        .bind(GROUP_AGGREGATE)
        .bind(lock.after_sequence)
        .fetch_one(conn)
        .await?;
    Ok(GroupSnapshot {
        events: events.0,
        after_sequence: lock.after_sequence,
        stream_head,
        live_instances: live.0,
        now,
    })
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
