//! Worker-instance heartbeats on Postgres.

use super::PgStore;
use crate::error::StoreError;
use crate::event::InstanceRecord;

impl PgStore {
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
