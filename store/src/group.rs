//! The consumer group as a [`LockedAggregate`]: the declaration side of the locked executor.
//!
//! A declaration attempt runs as one transaction (see [`crate::executor`]): lock the group's
//! `consumer_group` row, load its events, observe its live instances, the attempting
//! declarer's open wait (its `open_wait` row, kept inline, ADR 0049) and the store's time,
//! decide (a pure closure), append what the decision returns with inline projection, write the
//! caller's heartbeat if the decision allows, commit. Concurrent attempts on one group
//! serialize on the group row lock. The group- and queue-specific SQL of that transaction lives
//! here, not in the executor.

use std::sync::LazyLock;

use async_trait::async_trait;
use rusqlite::{params, OptionalExtension};
use sqlx::PgConnection;

use crate::error::StoreError;
use crate::event::Heartbeat;
use crate::executor::{Decision, LockedAggregate, PgLock, Snapshot, Write};
use crate::projector::CteStatement;

/// The aggregate type the group executor loads and appends to.
pub const GROUP_AGGREGATE: &str = "consumer_group";

/// One group's saved state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedGroupState {
    /// The group (its stream's aggregate id).
    pub group: String,
    /// The stream sequence the state folds up to.
    pub sequence: i64,
    /// How `state` is written (the writer's format number).
    pub format: i32,
    /// The state, opaque to the store.
    pub state: String,
    /// Read back only (ignored when writing): the stream's event at `sequence` is not the one
    /// the state was saved at (its position differs: the events were restored or replaced
    /// since), so the state must not be used.
    pub stream_rewritten: bool,
}

/// The upsert of a saved state, on both backends (SQLite reads `$n` as the n-th parameter too).
/// The row records the position of the stream's event at its sequence, read in the writer's
/// transaction (the attempt's own event is already inserted there).
static UPSERT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO group_snapshot (group_name, sequence, format, state, position) \
         VALUES ($1, $2, $3, $4, (SELECT position FROM events \
           WHERE aggregate_type = '{GROUP_AGGREGATE}' AND aggregate_id = $1 AND sequence = $2)) \
         ON CONFLICT (group_name) DO UPDATE SET sequence = excluded.sequence, \
           format = excluded.format, state = excluded.state, position = excluded.position"
    )
});

/// SQLite: writes `saved` in the caller's transaction, replacing the group's row.
pub(crate) fn sqlite_save_in_tx(
    tx: &rusqlite::Transaction<'_>,
    saved: &SavedGroupState,
) -> Result<(), StoreError> {
    tx.prepare_cached(&UPSERT)?.execute(params![
        saved.group,
        saved.sequence,
        saved.format,
        saved.state
    ])?;
    Ok(())
}

/// Postgres: writes `saved` on the caller's connection (inside its transaction).
pub(crate) async fn pg_save(
    conn: &mut PgConnection,
    saved: &SavedGroupState,
) -> Result<(), StoreError> {
    sqlx::query(&UPSERT)
        .bind(&saved.group)
        .bind(saved.sequence)
        .bind(saved.format)
        .bind(&saved.state)
        .execute(conn)
        .await?;
    Ok(())
}

/// Which group to lock, and how fresh a heartbeat must be to count as live.
#[derive(Debug, Clone)]
pub struct GroupLock {
    /// The group's name (also its aggregate id).
    pub group: String,
    /// The topic the group consumes (recorded on the group row when it is created).
    pub topic: String,
    /// The attempting declarer, whose open wait the decision observes.
    pub declarer: String,
    /// How old a heartbeat may be, by the store's clock, for its instance to count as live.
    pub instance_ttl: std::time::Duration,
    /// Load only events with a greater sequence: the caller already holds the group's state
    /// up to this sequence (0 loads everything).
    pub after_sequence: i64,
}

/// A live instance observed inside the locked transaction.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub struct LiveInstanceRow {
    /// The instance's declarer identity.
    pub declarer: String,
    /// The set it declares.
    pub patterns: Vec<String>,
}

/// The attempting declarer's open wait, observed inside the locked transaction.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub struct OpenWaitRow {
    /// The set it waits for.
    pub patterns: Vec<String>,
    /// When it first stated that set (microseconds in JSON: the form the Postgres observation
    /// yields whatever the session's time zone, so a speculative write can compare it).
    #[serde(with = "chrono::serde::ts_microseconds")]
    pub declared_at: chrono::DateTime<chrono::Utc>,
}

/// What a group's decision observes beside its events. Its JSON is what
/// [`LockedAggregate::pg_observe`] yields: a speculative write (ADR 0052) compares the two.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub struct GroupObserved {
    /// The group's instances with a fresh heartbeat, by declarer in byte order.
    pub live: Vec<LiveInstanceRow>,
    /// The attempting declarer's open wait, if it has one.
    pub open_wait: Option<OpenWaitRow>,
}

/// What a group's decision sees: its events, what it observes and the store's time.
pub type GroupSnapshot = Snapshot<GroupObserved>;

/// What a group's decision writes beside its events: the caller's heartbeat when it may
/// consume, and the group's saved state when one is due (ADR 0034).
#[derive(Debug, Clone, Default)]
pub struct GroupExtra {
    /// The caller's heartbeat.
    pub heartbeat: Option<Heartbeat>,
    /// The group's state as of the attempt's resulting sequence, replacing its saved one.
    pub saved_state: Option<SavedGroupState>,
}

impl From<Heartbeat> for GroupExtra {
    fn from(heartbeat: Heartbeat) -> Self {
        Self {
            heartbeat: Some(heartbeat),
            saved_state: None,
        }
    }
}

/// What a group's decision writes: events, and its [`GroupExtra`].
pub type GroupWrite = Write<GroupExtra>;

/// A group decision: what to write, and what to tell the caller.
pub type GroupDecision<T, E> = Decision<T, E, GroupExtra>;

/// A group's lock is its `consumer_group` row (the router takes the same row lock, so routing
/// never runs between a swap's decision and its commit). Creating the row also starts the
/// group's routing cursor at the topic's head (ADR 0007).
#[async_trait]
impl LockedAggregate for GroupLock {
    type Observed = GroupObserved;
    type Extra = GroupExtra;

    fn aggregate_type(&self) -> &'static str {
        GROUP_AGGREGATE
    }

    fn aggregate_id(&self) -> &str {
        &self.group
    }

    fn after_sequence(&self) -> i64 {
        self.after_sequence
    }

    fn pg_lock(&self, args: &mut CteStatement) -> Result<PgLock, StoreError> {
        let topic = args.bind(self.topic.clone())?;
        Ok(PgLock {
            upsert: format!(
                "INSERT INTO consumer_group (group_name, topic, routed_position) \
                 VALUES ($1, {topic}, COALESCE((SELECT head FROM topic WHERE name = {topic}), 0)) \
                 ON CONFLICT (group_name) DO UPDATE SET version = consumer_group.version + 1"
            ),
            written: "consumer_group.version".to_owned(),
            seen: "(SELECT g.version FROM consumer_group g WHERE g.group_name = $1)".to_owned(),
            bump: Some(
                "UPDATE consumer_group SET version = version + 1 WHERE group_name = $1 \
                 RETURNING version"
                    .to_owned(),
            ),
        })
    }

    fn pg_observe(&self, args: &mut CteStatement) -> Result<String, StoreError> {
        let live = self.pg_live_json(args)?;
        let declarer = args.bind(self.declarer.clone())?;
        Ok(format!(
            "json_build_object('live', {live}, \
             'open_wait', (SELECT json_build_object('patterns', patterns, 'declared_at', \
               {OPEN_WAIT_MICROS}) \
               FROM open_wait WHERE group_name = $1 AND declarer = {declarer}))"
        ))
    }

    /// No live instance and no open wait (a swap's usual inputs) are two probes by key; the
    /// JSON is built only for a non-empty live list (ADR 0056).
    fn pg_observed_is(
        &self,
        args: &mut CteStatement,
        observed: &GroupObserved,
    ) -> Result<Option<String>, StoreError> {
        let live = if observed.live.is_empty() {
            let fresh = self.pg_fresh(args)?;
            format!("NOT EXISTS (SELECT 1 FROM worker_instance WHERE group_name = $1 AND {fresh})")
        } else {
            let live = self.pg_live_json(args)?;
            let expected = args.bind(sqlx::types::Json(serde_json::to_value(&observed.live)?))?;
            format!("({live})::jsonb = {expected}::jsonb")
        };
        let declarer = args.bind(self.declarer.clone())?;
        let wait = match &observed.open_wait {
            None => format!(
                "NOT EXISTS (SELECT 1 FROM open_wait WHERE group_name = $1 AND declarer = {declarer})"
            ),
            Some(wait) => {
                let patterns = args.bind(wait.patterns.clone())?;
                let declared_at = args.bind(wait.declared_at.timestamp_micros())?;
                format!(
                    "EXISTS (SELECT 1 FROM open_wait WHERE group_name = $1 \
                     AND declarer = {declarer} AND patterns = {patterns} \
                     AND {OPEN_WAIT_MICROS} = {declared_at})"
                )
            }
        };
        Ok(Some(format!("({live} AND {wait})")))
    }

    /// The heartbeat rides in the optimistic write as one CTE; a write that also saves the
    /// group's state (once every `snapshot_every` events) takes the transaction path.
    fn pg_extra_cte(
        &self,
        args: &mut CteStatement,
        extra: &GroupExtra,
        source: &str,
    ) -> Result<Option<String>, StoreError> {
        // A saved state is written in the transaction form; so is an extra without a heartbeat,
        // which the decision never builds (it sends no extra then).
        let (None, Some(heartbeat)) = (&extra.saved_state, &extra.heartbeat) else {
            return Ok(None);
        };
        let values = [
            "$1".to_owned(),
            args.bind(heartbeat.declarer.clone())?,
            args.bind(self.topic.clone())?,
            args.bind(heartbeat.version.clone())?,
            args.bind(heartbeat.patterns.clone())?,
        ];
        Ok(Some(upsert_heartbeat(&values, source)))
    }

    async fn pg_write_extra(
        &self,
        conn: &mut PgConnection,
        extra: &GroupExtra,
    ) -> Result<(), StoreError> {
        if let Some(saved) = &extra.saved_state {
            pg_save(conn, saved).await?;
        }
        let Some(heartbeat) = &extra.heartbeat else {
            return Ok(());
        };
        let values = ["$1", "$2", "$3", "$4", "$5"].map(str::to_owned);
        sqlx::query(&upsert_heartbeat(&values, "(SELECT 1) AS one"))
            .bind(&self.group)
            .bind(&heartbeat.declarer)
            .bind(&self.topic)
            .bind(&heartbeat.version)
            .bind(&heartbeat.patterns)
            .execute(conn)
            .await?;
        Ok(())
    }

    fn sqlite_lock(&self, tx: &rusqlite::Transaction<'_>, now: i64) -> Result<(), StoreError> {
        // Cached statements throughout: this is the register hot path, and compiling SQL
        // costs about as much here as the statements themselves.
        tx.prepare_cached(
            "INSERT OR IGNORE INTO consumer_group (group_name, topic, created_at, routed_position) \
             VALUES (?1, ?2, ?3, COALESCE((SELECT head FROM topic WHERE name = ?2), 0))",
        )?
        .execute(params![self.group, self.topic, now])?;
        Ok(())
    }

    fn sqlite_observe(
        &self,
        tx: &rusqlite::Transaction<'_>,
        now: i64,
    ) -> Result<GroupObserved, StoreError> {
        Ok(GroupObserved {
            live: self.sqlite_live(tx, now)?,
            open_wait: self.sqlite_open_wait(tx)?,
        })
    }

    fn sqlite_write_extra(
        &self,
        tx: &rusqlite::Transaction<'_>,
        extra: &GroupExtra,
        now: i64,
    ) -> Result<(), StoreError> {
        if let Some(saved) = &extra.saved_state {
            sqlite_save_in_tx(tx, saved)?;
        }
        let Some(heartbeat) = &extra.heartbeat else {
            return Ok(());
        };
        tx.prepare_cached(
            "INSERT INTO worker_instance (group_name, declarer, topic, version, patterns, started_at, heartbeat_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6) \
             ON CONFLICT (group_name, declarer) DO UPDATE SET topic = excluded.topic, \
             version = excluded.version, patterns = excluded.patterns, heartbeat_at = excluded.heartbeat_at",
        )?
        .execute(params![
            self.group,
            heartbeat.declarer,
            self.topic,
            heartbeat.version,
            serde_json::to_string(&heartbeat.patterns)?,
            now
        ])?;
        Ok(())
    }
}

/// An open wait's `declared_at` as integer microseconds (the form [`OpenWaitRow`] serializes,
/// whatever the session's time zone).
const OPEN_WAIT_MICROS: &str = "floor(extract(epoch FROM declared_at) * 1000000)::bigint";

impl GroupLock {
    /// The condition on a `worker_instance` row of the group that makes it live: a heartbeat
    /// fresher than the TTL by the store's clock.
    fn pg_fresh(&self, args: &mut CteStatement) -> Result<String, StoreError> {
        let ttl = args.bind(self.instance_ttl.as_secs_f64())?;
        Ok(format!(
            "heartbeat_at > clock_timestamp() - make_interval(secs => {ttl})"
        ))
    }

    /// The group's live instances as a JSON array ordered by declarer in byte order.
    fn pg_live_json(&self, args: &mut CteStatement) -> Result<String, StoreError> {
        let fresh = self.pg_fresh(args)?;
        Ok(format!(
            "COALESCE((SELECT json_agg(json_build_object('declarer', declarer, \
               'patterns', patterns) ORDER BY declarer COLLATE \"C\") \
               FROM worker_instance WHERE group_name = $1 AND {fresh}), '[]'::json)"
        ))
    }

    /// The group's instances whose heartbeat is fresher than the TTL at `now`.
    fn sqlite_live(
        &self,
        tx: &rusqlite::Transaction<'_>,
        now: i64,
    ) -> Result<Vec<LiveInstanceRow>, StoreError> {
        let ttl = i64::try_from(self.instance_ttl.as_micros()).unwrap_or(i64::MAX);
        let mut stmt = tx.prepare_cached(
            "SELECT declarer, patterns FROM worker_instance \
             WHERE group_name = ?1 AND heartbeat_at > ?2 ORDER BY declarer",
        )?;
        let rows = stmt.query_map(params![self.group, now.saturating_sub(ttl)], |row| {
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

    /// The attempting declarer's `open_wait` row, by key.
    fn sqlite_open_wait(
        &self,
        tx: &rusqlite::Transaction<'_>,
    ) -> Result<Option<OpenWaitRow>, StoreError> {
        let row = tx
            .prepare_cached(
                "SELECT patterns, declared_at FROM open_wait \
                 WHERE group_name = ?1 AND declarer = ?2",
            )?
            .query_row(params![self.group, self.declarer], |row| {
                Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
            })
            .optional()?;
        let Some((patterns, declared_at)) = row else {
            return Ok(None);
        };
        Ok(Some(OpenWaitRow {
            patterns: serde_json::from_str(&patterns).map_err(|e| StoreError::decode(0, e))?,
            declared_at: crate::event::from_micros(declared_at),
        }))
    }
}

/// The heartbeat upsert of a group's instance: `values` are the SQL of group, declarer, topic,
/// version and patterns; one row per row of `source`, stamped with the store's clock.
fn upsert_heartbeat(values: &[String; 5], source: &str) -> String {
    let [group, declarer, topic, version, patterns] = values;
    format!(
        "INSERT INTO worker_instance (group_name, declarer, topic, version, patterns, started_at, heartbeat_at) \
         SELECT {group}, {declarer}, {topic}, {version}, {patterns}, c.t, c.t \
         FROM {source} CROSS JOIN (SELECT clock_timestamp() AS t) c \
         ON CONFLICT (group_name, declarer) DO UPDATE SET topic = excluded.topic, \
         version = excluded.version, patterns = excluded.patterns, heartbeat_at = excluded.heartbeat_at"
    )
}
