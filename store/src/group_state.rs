//! Saved group states: the `group_snapshot` table (ADR 0034).
//!
//! Each row is one consumer group's folded state as of a sequence of its stream, written by the
//! register path inside the group's locked transaction (through [`crate::group::GroupExtra`];
//! the row's type and its upsert are that transaction's, in `group.rs`) or re-derived by a
//! rebuild (here, with the reads). The store keeps the state as opaque text with the format number
//! the writer gave it; it never parses it (what a state means is the domain's, how it is checked
//! is the projections'). Derived data: deleting every row loses nothing but speed.

use std::sync::LazyLock;

use rusqlite::{params, OptionalExtension};
use sqlx::Row;

use crate::error::StoreError;
pub use crate::group::SavedGroupState;
use crate::group::{pg_save, sqlite_save_in_tx, GROUP_AGGREGATE};
use crate::{PgStore, SqliteStore, Store};

/// A stream's newest sequence, as listed for a rebuild or a verify.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamHead {
    /// The aggregate id.
    pub aggregate_id: String,
    /// Its newest sequence.
    pub head: i64,
}

/// A read of saved states with `filter` (its parameters from `$1`), on both backends: the row,
/// and whether the event at its sequence has moved.
fn read_statement(filter: &str) -> String {
    format!(
        "SELECT s.group_name, s.sequence, s.format, s.state, \
           COALESCE(s.position <> (SELECT e.position FROM events e \
             WHERE e.aggregate_type = '{GROUP_AGGREGATE}' AND e.aggregate_id = s.group_name \
             AND e.sequence = s.sequence), false) \
         FROM group_snapshot s {filter}"
    )
}

/// One group's saved state: `$1` the group.
static READ_ONE: LazyLock<String> = LazyLock::new(|| read_statement("WHERE s.group_name = $1"));

/// A page of saved states in name order: `$1` the name to start after, `$2` the page size.
static READ_PAGE: LazyLock<String> =
    LazyLock::new(|| read_statement("WHERE s.group_name > $1 ORDER BY s.group_name LIMIT $2"));

fn sqlite_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<SavedGroupState> {
    Ok(SavedGroupState {
        group: row.get(0)?,
        sequence: row.get(1)?,
        format: row.get(2)?,
        state: row.get(3)?,
        stream_rewritten: row.get(4)?,
    })
}

fn pg_row(row: &sqlx::postgres::PgRow) -> Result<SavedGroupState, StoreError> {
    Ok(SavedGroupState {
        group: row.try_get(0)?,
        sequence: row.try_get(1)?,
        format: row.try_get(2)?,
        state: row.try_get(3)?,
        stream_rewritten: row.try_get(4)?,
    })
}

impl SqliteStore {
    /// The group's saved state, if any.
    pub async fn saved_group_state(
        &self,
        group: &str,
    ) -> Result<Option<SavedGroupState>, StoreError> {
        let group = group.to_owned();
        self.read(move |conn| {
            Ok(conn
                .prepare_cached(&READ_ONE)?
                .query_row([group], sqlite_row)
                .optional()?)
        })
        .await
    }

    /// Up to `limit` saved states of groups named after `after`, in name order.
    pub async fn saved_group_states(
        &self,
        after: String,
        limit: i64,
    ) -> Result<Vec<SavedGroupState>, StoreError> {
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(&READ_PAGE)?;
            let rows = stmt.query_map(params![after, limit], sqlite_row)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// Replaces every saved state with `states`, in one transaction.
    pub async fn replace_saved_group_states(
        &self,
        states: Vec<SavedGroupState>,
    ) -> Result<(), StoreError> {
        self.write(move |ctx| {
            ctx.tx.execute("DELETE FROM group_snapshot", [])?;
            for saved in &states {
                sqlite_save_in_tx(ctx.tx, saved)?;
            }
            Ok(())
        })
        .await
    }

    /// Writes one saved state outside any attempt (tests and tools).
    pub async fn save_group_state(&self, saved: SavedGroupState) -> Result<(), StoreError> {
        self.write(move |ctx| sqlite_save_in_tx(ctx.tx, &saved))
            .await
    }

    /// Every stream of `aggregate_type` and its newest sequence, in id order.
    pub async fn stream_heads(&self, aggregate_type: &str) -> Result<Vec<StreamHead>, StoreError> {
        let kind = aggregate_type.to_owned();
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT aggregate_id, MAX(sequence) FROM events WHERE aggregate_type = ?1 \
                 GROUP BY aggregate_id ORDER BY aggregate_id",
            )?;
            let rows = stmt.query_map([kind], |row| {
                Ok(StreamHead {
                    aggregate_id: row.get(0)?,
                    head: row.get(1)?,
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }
}

impl PgStore {
    /// The group's saved state, if any.
    pub async fn saved_group_state(
        &self,
        group: &str,
    ) -> Result<Option<SavedGroupState>, StoreError> {
        let row = sqlx::query(&READ_ONE)
            .bind(group)
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(pg_row).transpose()
    }

    /// Up to `limit` saved states of groups named after `after`, in name order.
    pub async fn saved_group_states(
        &self,
        after: String,
        limit: i64,
    ) -> Result<Vec<SavedGroupState>, StoreError> {
        let rows = sqlx::query(&READ_PAGE)
            .bind(after)
            .bind(limit)
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(pg_row).collect()
    }

    /// Replaces every saved state with `states`, in one transaction.
    pub async fn replace_saved_group_states(
        &self,
        states: Vec<SavedGroupState>,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool().begin().await?;
        sqlx::query("DELETE FROM group_snapshot")
            .execute(&mut *tx)
            .await?;
        for saved in &states {
            pg_save(&mut tx, saved).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Writes one saved state outside any attempt (tests and tools).
    pub async fn save_group_state(&self, saved: SavedGroupState) -> Result<(), StoreError> {
        let mut conn = self.pool().acquire().await?;
        pg_save(&mut conn, &saved).await
    }

    /// Every stream of `aggregate_type` and its newest sequence, in id order.
    pub async fn stream_heads(&self, aggregate_type: &str) -> Result<Vec<StreamHead>, StoreError> {
        let rows = sqlx::query(
            "SELECT aggregate_id, MAX(sequence) FROM events WHERE aggregate_type = $1 \
             GROUP BY aggregate_id ORDER BY aggregate_id",
        )
        .bind(aggregate_type)
        .fetch_all(self.pool())
        .await?;
        rows.iter()
            .map(|row| {
                Ok(StreamHead {
                    aggregate_id: row.try_get(0)?,
                    head: row.try_get(1)?,
                })
            })
            .collect()
    }
}

macro_rules! dispatch {
    ($self:ident, $store:ident => $body:expr) => {
        match $self {
            Store::Sqlite($store) => $body,
            Store::Postgres($store) => $body,
        }
    };
}

impl Store {
    /// The group's saved state, if any.
    pub async fn saved_group_state(
        &self,
        group: &str,
    ) -> Result<Option<SavedGroupState>, StoreError> {
        dispatch!(self, s => s.saved_group_state(group).await)
    }

    /// Up to `limit` saved states of groups named after `after`, in name order.
    pub async fn saved_group_states(
        &self,
        after: String,
        limit: i64,
    ) -> Result<Vec<SavedGroupState>, StoreError> {
        dispatch!(self, s => s.saved_group_states(after, limit).await)
    }

    /// Replaces every saved state with `states`, in one transaction.
    pub async fn replace_saved_group_states(
        &self,
        states: Vec<SavedGroupState>,
    ) -> Result<(), StoreError> {
        dispatch!(self, s => s.replace_saved_group_states(states).await)
    }

    /// Writes one saved state outside any attempt (tests and tools).
    pub async fn save_group_state(&self, saved: SavedGroupState) -> Result<(), StoreError> {
        dispatch!(self, s => s.save_group_state(saved).await)
    }

    /// Every stream of `aggregate_type` and its newest sequence, in id order.
    pub async fn stream_heads(&self, aggregate_type: &str) -> Result<Vec<StreamHead>, StoreError> {
        dispatch!(self, s => s.stream_heads(aggregate_type).await)
    }
}
