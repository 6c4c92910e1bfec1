//! The locked group executor and worker-instance heartbeats on Postgres.

use sqlx::PgConnection;

use super::events::{append_in_tx, load_in_tx};
use super::PgStore;
use crate::error::StoreError;
use crate::event::{Heartbeat, InstanceRecord};
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
        let events = load_in_tx(&mut tx, GROUP_AGGREGATE, &lock.group).await?;
        let live_instances = live_instances(&mut tx, &lock).await?;
        let now = sqlx::query_scalar("SELECT clock_timestamp()")
            .fetch_one(&mut *tx)
            .await?;
        let snapshot = GroupSnapshot {
            events,
            live_instances,
            now,
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

async fn lock_group(conn: &mut PgConnection, lock: &GroupLock) -> Result<(), StoreError> {
    // A new group's routing cursor starts at the topic's head: it receives what is published
    // after it is first declared (ADR 0007).
    sqlx::query(
        "INSERT INTO consumer_group (group_name, topic, routed_position) \
         VALUES ($1, $2, COALESCE((SELECT head FROM topic WHERE name = $2), 0)) \
         ON CONFLICT DO NOTHING",
    )
    .bind(&lock.group)
    .bind(&lock.topic)
    .execute(&mut *conn)
    .await?;
    sqlx::query("SELECT 1 FROM consumer_group WHERE group_name = $1 FOR UPDATE")
        .bind(&lock.group)
        .execute(conn)
        .await?;
    Ok(())
}

async fn live_instances(
    conn: &mut PgConnection,
    lock: &GroupLock,
) -> Result<Vec<LiveInstanceRow>, StoreError> {
    let rows: Vec<(String, Vec<String>)> = sqlx::query_as(
        "SELECT declarer, patterns FROM worker_instance WHERE group_name = $1 \
         AND heartbeat_at > clock_timestamp() - make_interval(secs => $2) ORDER BY declarer",
    )
    .bind(&lock.group)
    .bind(lock.instance_ttl.as_secs_f64())
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(declarer, patterns)| LiveInstanceRow { declarer, patterns })
        .collect())
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
