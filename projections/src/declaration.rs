//! The declaration projectors.
//!
//! - [`EffectiveBindings`] (inline): the group's effective declaration, whose `patterns` are
//!   the binding set that routes and claims read (`binding` is a view that unnests them, ADR
//!   0064). Runs inside the install/swap transaction, so the set changes in the same commit as
//!   the ledger and a reader sees exactly one declared set.
//! - [`DeclarerAttempts`] (catch-up): each declarer's newest attempt per group, from which the
//!   listing derives open waiters. An install also marks every other waiter for the same set
//!   `resolved`, mirroring the aggregate: those declarers join without appending anything.
//!   Beside them, `waiting_group` names each group that has a waiting attempt, in the same
//!   transaction, so the page of waiting groups walks one index (ADR 0060).

use async_trait::async_trait;
use rusqlite::{params, Transaction};
use sqlx::PgConnection;
use wharf_domain::declaration::AGGREGATE_TYPE;
use wharf_domain::{Attempt, BindingSet, DeclarationEvent};
use wharf_store::projector::{PgReplay, SqliteReplay};
use wharf_store::{
    CteStatement, EventRef, PgProjector, RecordedEvent, SqliteProjector, StoreError,
};

use crate::replay::{AttemptsFold, EffectiveFold};

/// Decodes a declaration event, or `None` for events of other aggregates.
fn declaration(event: &EventRef<'_>) -> Result<Option<DeclarationEvent>, StoreError> {
    if event.aggregate_type != AGGREGATE_TYPE {
        return Ok(None);
    }
    event.decode().map(Some)
}

fn json_patterns(set: &BindingSet) -> String {
    serde_json::Value::from(set.patterns()).to_string()
}

/// Inline projector of `effective_declaration`, each group's installed set (the `binding` view
/// unnests its patterns).
pub struct EffectiveBindings;

impl EffectiveBindings {
    /// The projector's name.
    pub const NAME: &'static str = "effective_bindings";
    const TABLES: &'static [&'static str] = &["effective_declaration"];
}

impl SqliteProjector for EffectiveBindings {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn tables(&self) -> &'static [&'static str] {
        Self::TABLES
    }

    fn replay(&self) -> Option<Box<dyn SqliteReplay>> {
        Some(Box::<EffectiveFold>::default())
    }

    fn apply(&self, tx: &Transaction<'_>, event: &RecordedEvent) -> Result<(), StoreError> {
        let Some(DeclarationEvent::Installed { attempt, previous }) = declaration(&event.as_ref())?
        else {
            return Ok(());
        };
        let group = attempt.group.as_str();
        tx.prepare_cached(
            "INSERT INTO effective_declaration (group_name, topic, declarer, version, patterns, \
             previous, declared_at, attempt_at, position, installs) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 1) \
             ON CONFLICT (group_name) DO UPDATE SET topic = excluded.topic, \
             declarer = excluded.declarer, version = excluded.version, patterns = excluded.patterns, \
             previous = excluded.previous, declared_at = excluded.declared_at, \
             attempt_at = excluded.attempt_at, position = excluded.position, \
             installs = effective_declaration.installs + 1",
        )?
        .execute(params![
            group,
            attempt.topic.as_str(),
            attempt.declarer.as_str(),
            attempt.version.as_str(),
            json_patterns(&attempt.patterns),
            previous.as_ref().map(json_patterns),
            attempt.declared_at.timestamp_micros(),
            attempt.attempt_at.timestamp_micros(),
            event.position,
        ])?;
        Ok(())
    }
}

impl EffectiveBindings {
    /// The row an install leaves, as a CTE of `statement`: the group's effective declaration,
    /// its patterns included (`position` is the SQL of the event's position). Readers see it at
    /// commit, or not at all. False for events that change nothing here.
    fn pg_rows(
        event: &EventRef<'_>,
        position: &str,
        statement: &mut CteStatement,
    ) -> Result<bool, StoreError> {
        let Some(DeclarationEvent::Installed { attempt, previous }) = declaration(event)? else {
            return Ok(false);
        };
        let values = [
            statement.bind(attempt.group.as_str())?,
            statement.bind(attempt.topic.as_str())?,
            statement.bind(attempt.declarer.as_str())?,
            statement.bind(attempt.version.as_str())?,
            statement.bind(attempt.patterns.patterns())?,
            statement.bind(previous.as_ref().map(BindingSet::patterns))?,
            statement.bind(attempt.declared_at)?,
            statement.bind(attempt.attempt_at)?,
            position.to_owned(),
        ];
        statement.cte(
            "effective_upserted",
            &format!(
                "INSERT INTO effective_declaration (group_name, topic, declarer, version, patterns, \
                 previous, declared_at, attempt_at, position, installs) SELECT {}, 1 \
                 ON CONFLICT (group_name) DO UPDATE SET topic = excluded.topic, \
                 declarer = excluded.declarer, version = excluded.version, \
                 patterns = excluded.patterns, previous = excluded.previous, \
                 declared_at = excluded.declared_at, attempt_at = excluded.attempt_at, \
                 position = excluded.position, installs = effective_declaration.installs + 1",
                values.join(", ")
            ),
        );
        Ok(true)
    }
}

#[async_trait]
impl PgProjector for EffectiveBindings {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn tables(&self) -> &'static [&'static str] {
        Self::TABLES
    }

    fn replay(&self) -> Option<Box<dyn PgReplay>> {
        Some(Box::<EffectiveFold>::default())
    }

    async fn apply(
        &self,
        conn: &mut PgConnection,
        event: &RecordedEvent,
    ) -> Result<(), StoreError> {
        crate::fused::apply_as_ctes(conn, event, Self::pg_rows).await
    }

    /// The install's rows ride in the statement that inserts the event.
    fn fuse(
        &self,
        event: &EventRef<'_>,
        position: &str,
        statement: &mut CteStatement,
    ) -> Result<bool, StoreError> {
        // Everything this projector writes for the event is now in the statement (nothing,
        // for an event it ignores): there is nothing to apply afterwards.
        Self::pg_rows(event, position, statement)?;
        Ok(true)
    }
}

/// Catch-up projector of each declarer's newest attempt per group (`declarer_attempt`).
pub struct DeclarerAttempts;

impl DeclarerAttempts {
    /// The projector's name (its checkpoint key).
    pub const NAME: &'static str = "declarer_attempts";
    const TABLES: &'static [&'static str] = &["declarer_attempt", "waiting_group"];
}

/// SQLite, after a wait: names `?1` in `waiting_group` when it has a waiting attempt; after an
/// install: drops it when it has none left.
const SQLITE_WAITING_GROUP_ADDED: &str = "INSERT OR IGNORE INTO waiting_group (group_name) \
     SELECT ?1 WHERE EXISTS (SELECT 1 FROM declarer_attempt a \
     WHERE a.group_name = ?1 AND a.status = 'waiting')";
const SQLITE_WAITING_GROUP_GONE: &str = "DELETE FROM waiting_group WHERE group_name = ?1 \
     AND NOT EXISTS (SELECT 1 FROM declarer_attempt a \
     WHERE a.group_name = ?1 AND a.status = 'waiting')";

/// Postgres: `declarer_attempt`'s upsert of a declarer's attempt (`$1` group, `$2` declarer,
/// `$3` status, `$4` version, `$5` set, `$6` incumbent set, `$7` and `$8` its times, `$9` the
/// event's position), kept only when newer than the row's, followed by `$tail`.
macro_rules! pg_record_attempt {
    ($tail:literal) => {
        concat!(
            "INSERT INTO declarer_attempt (group_name, declarer, status, version, patterns, \
             incumbent, declared_at, attempt_at, position) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
             ON CONFLICT (group_name, declarer) DO UPDATE SET status = excluded.status, \
             version = excluded.version, patterns = excluded.patterns, \
             incumbent = excluded.incumbent, declared_at = excluded.declared_at, \
             attempt_at = excluded.attempt_at, position = excluded.position \
             WHERE excluded.position > declarer_attempt.position",
            $tail
        )
    };
}

/// Postgres: an attempt that is not a wait, recorded.
const PG_RECORD: &str = pg_record_attempt!("");

/// Postgres: a wait, recorded, and its group named in `waiting_group` in the same statement
/// when the wait is the declarer's newest attempt (the upsert returns its row only then).
const PG_RECORD_WAIT: &str = concat!(
    "WITH recorded AS (",
    pg_record_attempt!(" RETURNING group_name"),
    ") INSERT INTO waiting_group (group_name) SELECT group_name FROM recorded \
     ON CONFLICT DO NOTHING"
);

/// Postgres: an install's resolution of the other waiters for its set (`$1` group, `$2` set,
/// `$3` installer), and `waiting_group`'s row gone when no waiting attempt is left. Both in
/// one statement, so the second cannot see the first's changes: it counts what the first
/// leaves waiting (the installer's own attempt is no longer waiting: the statement before
/// this one recorded its install).
const PG_RESOLVED: &str = "WITH resolved AS (UPDATE declarer_attempt SET status = 'resolved' \
     WHERE group_name = $1 AND status = 'waiting' AND patterns = $2 AND declarer <> $3 \
     RETURNING 1) \
     DELETE FROM waiting_group WHERE group_name = $1 AND NOT EXISTS ( \
     SELECT 1 FROM declarer_attempt a WHERE a.group_name = $1 AND a.status = 'waiting' \
     AND NOT (a.patterns = $2 AND a.declarer <> $3))";

/// The row a declaration event leaves in `declarer_attempt`.
struct AttemptRow<'a> {
    attempt: &'a Attempt,
    status: &'static str,
    incumbent: Option<&'a BindingSet>,
}

fn attempt_row(event: &DeclarationEvent) -> AttemptRow<'_> {
    match event {
        DeclarationEvent::Installed { attempt, .. } => AttemptRow {
            attempt,
            status: "installed",
            incumbent: None,
        },
        DeclarationEvent::Waiting {
            attempt, incumbent, ..
        } => AttemptRow {
            attempt,
            status: "waiting",
            incumbent: Some(incumbent),
        },
    }
}

impl SqliteProjector for DeclarerAttempts {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn tables(&self) -> &'static [&'static str] {
        Self::TABLES
    }

    fn replay(&self) -> Option<Box<dyn SqliteReplay>> {
        Some(Box::<AttemptsFold>::default())
    }

    fn apply(&self, tx: &Transaction<'_>, event: &RecordedEvent) -> Result<(), StoreError> {
        let Some(declared) = declaration(&event.as_ref())? else {
            return Ok(());
        };
        let row = attempt_row(&declared);
        tx.execute(
            "INSERT INTO declarer_attempt (group_name, declarer, status, version, patterns, \
             incumbent, declared_at, attempt_at, position) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) \
             ON CONFLICT (group_name, declarer) DO UPDATE SET status = excluded.status, \
             version = excluded.version, patterns = excluded.patterns, incumbent = excluded.incumbent, \
             declared_at = excluded.declared_at, attempt_at = excluded.attempt_at, \
             position = excluded.position WHERE excluded.position > declarer_attempt.position",
            params![
                row.attempt.group.as_str(),
                row.attempt.declarer.as_str(),
                row.status,
                row.attempt.version.as_str(),
                json_patterns(&row.attempt.patterns),
                row.incumbent.map(json_patterns),
                row.attempt.declared_at.timestamp_micros(),
                row.attempt.attempt_at.timestamp_micros(),
                event.position,
            ],
        )?;
        if row.status == "installed" {
            tx.execute(
                "UPDATE declarer_attempt SET status = 'resolved' WHERE group_name = ?1 \
                 AND status = 'waiting' AND patterns = ?2 AND declarer <> ?3",
                params![
                    row.attempt.group.as_str(),
                    json_patterns(&row.attempt.patterns),
                    row.attempt.declarer.as_str(),
                ],
            )?;
        }
        // A wait can only add its group; an install (and the waits it resolved) only remove it.
        let named = match row.status {
            "waiting" => SQLITE_WAITING_GROUP_ADDED,
            _ => SQLITE_WAITING_GROUP_GONE,
        };
        tx.prepare_cached(named)?
            .execute([row.attempt.group.as_str()])?;
        Ok(())
    }
}

#[async_trait]
impl PgProjector for DeclarerAttempts {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn tables(&self) -> &'static [&'static str] {
        Self::TABLES
    }

    fn replay(&self) -> Option<Box<dyn PgReplay>> {
        Some(Box::<AttemptsFold>::default())
    }

    async fn apply(
        &self,
        conn: &mut PgConnection,
        event: &RecordedEvent,
    ) -> Result<(), StoreError> {
        let Some(declared) = declaration(&event.as_ref())? else {
            return Ok(());
        };
        let row = attempt_row(&declared);
        let record = if row.status == "waiting" {
            PG_RECORD_WAIT
        } else {
            PG_RECORD
        };
        sqlx::query(record)
            .bind(row.attempt.group.as_str())
            .bind(row.attempt.declarer.as_str())
            .bind(row.status)
            .bind(row.attempt.version.as_str())
            .bind(row.attempt.patterns.patterns())
            .bind(row.incumbent.map(BindingSet::patterns))
            .bind(row.attempt.declared_at)
            .bind(row.attempt.attempt_at)
            .bind(event.position)
            .execute(&mut *conn)
            .await?;
        if row.status == "installed" {
            sqlx::query(PG_RESOLVED)
                .bind(row.attempt.group.as_str())
                .bind(row.attempt.patterns.patterns())
                .bind(row.attempt.declarer.as_str())
                .execute(conn)
                .await?;
        }
        Ok(())
    }
}
