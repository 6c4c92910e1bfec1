//! Worker-instance heartbeats on SQLite.

use rusqlite::params;

use super::SqliteStore;
use crate::error::StoreError;
use crate::event::{from_micros, InstanceRecord};

impl SqliteStore {
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
