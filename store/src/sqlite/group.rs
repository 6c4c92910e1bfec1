//! The locked group executor and worker-instance heartbeats on SQLite.

use rusqlite::params;

use super::events::{append_in_tx, load_after_in_tx};
use super::SqliteStore;
use crate::error::StoreError;
use crate::event::{from_micros, Heartbeat, InstanceRecord};
use crate::group::{GroupDecision, GroupLock, GroupSnapshot, LiveInstanceRow, GROUP_AGGREGATE};

impl SqliteStore {
    /// Runs one declaration attempt for a group as a single transaction (see [`crate::group`]).
    /// A decision error rolls everything back and is returned as the inner `Err`.
    pub async fn execute_group<T, E, F>(
        &self,
        lock: GroupLock,
        decide: F,
    ) -> Result<Result<T, E>, StoreError>
    where
        T: Send + 'static,
        E: Send + 'static,
        F: FnOnce(&GroupSnapshot) -> GroupDecision<T, E> + Send + 'static,
    {
        self.write_or_rollback(move |ctx| {
            let tx = ctx.tx;
            let now = ctx.now.timestamp_micros();
            // Cached statements throughout: this is the register hot path, and compiling SQL
            // costs about as much here as the statements themselves.
            tx.prepare_cached(
                "INSERT OR IGNORE INTO consumer_group (group_name, topic, created_at, routed_position) \
                 VALUES (?1, ?2, ?3, COALESCE((SELECT head FROM topic WHERE name = ?2), 0))",
            )?
            .execute(params![lock.group, lock.topic, now])?;
            let events = load_after_in_tx(tx, GROUP_AGGREGATE, &lock.group, lock.after_sequence)?;
            let stream_head: i64 = tx
                .prepare_cached(
                    "SELECT COALESCE(MAX(sequence), 0) FROM events \
                     WHERE aggregate_type = ?1 AND aggregate_id = ?2",
                )?
                .query_row(params![GROUP_AGGREGATE, lock.group], |row| row.get(0))?;
            let ttl = i64::try_from(lock.instance_ttl.as_micros()).unwrap_or(i64::MAX);
            let live_instances = live_instances(tx, &lock.group, now.saturating_sub(ttl))?;
            let snapshot = GroupSnapshot {
                events,
                after_sequence: lock.after_sequence,
                stream_head,
                live_instances,
                now: ctx.now,
            };
            let (write, value) = match decide(&snapshot) {
                Ok(decided) => decided,
                Err(e) => return Ok((Err(e), false)),
            };
            if !write.events.is_empty() {
                append_in_tx(
                    tx,
                    ctx.projectors,
                    ctx.now,
                    GROUP_AGGREGATE,
                    &lock.group,
                    snapshot.last_sequence(),
                    &write.events,
                )?;
            }
            if let Some(heartbeat) = &write.heartbeat {
                upsert_instance(tx, &lock, heartbeat, now)?;
            }
            Ok((Ok(value), true))
        })
        .await
    }

    /// Refreshes an instance's heartbeat; `false` when the instance has no row (it left or
    /// never joined).
    pub async fn heartbeat(&self, group: &str, declarer: &str) -> Result<bool, StoreError> {
        let (group, declarer) = (group.to_owned(), declarer.to_owned());
        self.write(move |ctx| {
            let touched = ctx.tx.execute(
                "UPDATE worker_instance SET heartbeat_at = ?3 WHERE group_name = ?1 AND declarer = ?2",
                params![group, declarer, ctx.now.timestamp_micros()],
            )?;
            Ok(touched == 1)
        })
        .await
    }

    /// Removes an instance (graceful shutdown), so a waiting new set need not wait for its TTL.
    pub async fn leave(&self, group: &str, declarer: &str) -> Result<bool, StoreError> {
        let (group, declarer) = (group.to_owned(), declarer.to_owned());
        self.write(move |ctx| {
            let removed = ctx.tx.execute(
                "DELETE FROM worker_instance WHERE group_name = ?1 AND declarer = ?2",
                params![group, declarer],
            )?;
            Ok(removed == 1)
        })
        .await
    }

    /// Every recorded instance (of one group, or of all), newest heartbeat first.
    pub async fn instances(
        &self,
        group: Option<String>,
    ) -> Result<Vec<InstanceRecord>, StoreError> {
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT group_name, declarer, topic, version, patterns, started_at, heartbeat_at \
                 FROM worker_instance WHERE ?1 IS NULL OR group_name = ?1 \
                 ORDER BY group_name, heartbeat_at DESC, declarer",
            )?;
            let rows = stmt.query_map([group], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                    row.get::<_, String>(3)?,
                    row.get::<_, String>(4)?,
                    row.get::<_, i64>(5)?,
                    row.get::<_, i64>(6)?,
                ))
            })?;
            rows.map(|row| {
                let (group, declarer, topic, version, patterns, started, beat) = row?;
                Ok(InstanceRecord {
                    patterns: serde_json::from_str(&patterns)
                        .map_err(|e| StoreError::decode(0, e))?,
                    group,
                    declarer,
                    topic,
                    version,
                    started_at: from_micros(started),
                    heartbeat_at: from_micros(beat),
                })
            })
            .collect()
        })
        .await
    }
}

fn live_instances(
    tx: &rusqlite::Transaction<'_>,
    group: &str,
    fresher_than: i64,
) -> Result<Vec<LiveInstanceRow>, StoreError> {
    let mut stmt = tx.prepare_cached(
        "SELECT declarer, patterns FROM worker_instance \
         WHERE group_name = ?1 AND heartbeat_at > ?2 ORDER BY declarer",
    )?;
    let rows = stmt.query_map(params![group, fresher_than], |row| {
        Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
    })?;
    rows.map(|row| {
        let (declarer, patterns) = row?;
        Ok(LiveInstanceRow {
            declarer,
            patterns: serde_json::from_str(&patterns).map_err(|e| StoreError::decode(0, e))?,
        })
    })
    .collect()
}

fn upsert_instance(
    tx: &rusqlite::Transaction<'_>,
    lock: &GroupLock,
    heartbeat: &Heartbeat,
    now: i64,
) -> Result<(), StoreError> {
    tx.prepare_cached(
        "INSERT INTO worker_instance (group_name, declarer, topic, version, patterns, started_at, heartbeat_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6) \
         ON CONFLICT (group_name, declarer) DO UPDATE SET topic = excluded.topic, \
         version = excluded.version, patterns = excluded.patterns, heartbeat_at = excluded.heartbeat_at",
    )?
    .execute(params![
            lock.group,
            heartbeat.declarer,
            lock.topic,
            heartbeat.version,
            serde_json::to_string(&heartbeat.patterns)?,
            now,
        ],
    )?;
    Ok(())
}
