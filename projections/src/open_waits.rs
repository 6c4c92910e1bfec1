//! The open-waits projector (inline, ADR 0049): each group's declarers that wait, with the set
//! they wait for and when they first stated it, in `open_wait`.
//!
//! It follows [`wharf_domain::OpenWaits`] event by event: a `DeclarationWaiting` upserts its
//! declarer's row; a `DeclarationInstalled` deletes the installer's row and every row waiting
//! for the installed set. It runs in the append transaction (fused into the event's insert on
//! Postgres), so the register decision can read its own declarer's row by key under the same
//! lock that orders the appends, instead of folding every wait of the group's ledger.

use std::collections::HashMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rusqlite::{params, Transaction};
use sqlx::PgConnection;
use wharf_domain::declaration::AGGREGATE_TYPE;
use wharf_domain::{DeclarationEvent, OpenWaits};
use wharf_store::projector::{PgReplay, SqliteReplay};
use wharf_store::rebuild::{Decoded, ReplayEvent, ReplayTarget};
use wharf_store::{
    CteStatement, EventRef, PgProjector, RecordedEvent, SqliteProjector, StoreError,
};

use crate::replay::{copy, declaration, json_list, CopyText};

/// Inline projector of `open_wait`.
pub struct OpenWaitRows;

impl OpenWaitRows {
    /// The projector's name.
    pub const NAME: &'static str = "open_waits";
    const TABLES: &'static [&'static str] = &["open_wait"];

    /// The event's row change as one CTE of `statement`; false for events of other aggregates.
    fn pg_rows(
        event: &EventRef<'_>,
        _position: &str,
        statement: &mut CteStatement,
    ) -> Result<bool, StoreError> {
        if event.aggregate_type != AGGREGATE_TYPE {
            return Ok(false);
        }
        let body = match event.decode::<DeclarationEvent>()? {
            DeclarationEvent::Waiting { attempt, .. } => {
                let values = [
                    statement.bind(attempt.group.as_str())?,
                    statement.bind(attempt.declarer.as_str())?,
                    statement.bind(attempt.patterns.patterns())?,
                    statement.bind(attempt.declared_at)?,
                ];
                format!(
                    "INSERT INTO open_wait (group_name, declarer, patterns, declared_at) \
                     VALUES ({}) ON CONFLICT (group_name, declarer) DO UPDATE \
                     SET patterns = excluded.patterns, declared_at = excluded.declared_at",
                    values.join(", ")
                )
            }
            DeclarationEvent::Installed { attempt, .. } => {
                let group = statement.bind(attempt.group.as_str())?;
                let declarer = statement.bind(attempt.declarer.as_str())?;
                let patterns = statement.bind(attempt.patterns.patterns())?;
                format!(
                    "DELETE FROM open_wait WHERE group_name = {group} \
                     AND (declarer = {declarer} OR patterns = {patterns}::text[])"
                )
            }
        };
        statement.cte("open_wait_changed", &body);
        Ok(true)
    }
}

impl SqliteProjector for OpenWaitRows {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn tables(&self) -> &'static [&'static str] {
        Self::TABLES
    }

    fn aggregate_types(&self) -> Option<&'static [&'static str]> {
        Some(&[AGGREGATE_TYPE])
    }

    fn replay(&self) -> Option<Box<dyn SqliteReplay>> {
        Some(Box::<OpenWaitsFold>::default())
    }

    fn apply(&self, tx: &Transaction<'_>, event: &RecordedEvent) -> Result<(), StoreError> {
        if event.aggregate_type != AGGREGATE_TYPE {
            return Ok(());
        }
        match event.as_ref().decode::<DeclarationEvent>()? {
            DeclarationEvent::Waiting { attempt, .. } => {
                tx.prepare_cached(
                    "INSERT INTO open_wait (group_name, declarer, patterns, declared_at) \
                     VALUES (?1, ?2, ?3, ?4) ON CONFLICT (group_name, declarer) DO UPDATE \
                     SET patterns = excluded.patterns, declared_at = excluded.declared_at",
                )?
                .execute(params![
                    attempt.group.as_str(),
                    attempt.declarer.as_str(),
                    json_list(&attempt.patterns.patterns()),
                    attempt.declared_at.timestamp_micros(),
                ])?;
            }
            DeclarationEvent::Installed { attempt, .. } => {
                tx.prepare_cached(
                    "DELETE FROM open_wait WHERE group_name = ?1 \
                     AND (declarer = ?2 OR patterns = ?3)",
                )?
                .execute(params![
                    attempt.group.as_str(),
                    attempt.declarer.as_str(),
                    json_list(&attempt.patterns.patterns()),
                ])?;
            }
        }
        Ok(())
    }
}

#[async_trait]
impl PgProjector for OpenWaitRows {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn tables(&self) -> &'static [&'static str] {
        Self::TABLES
    }

    fn aggregate_types(&self) -> Option<&'static [&'static str]> {
        Some(&[AGGREGATE_TYPE])
    }

    fn replay(&self) -> Option<Box<dyn PgReplay>> {
        Some(Box::<OpenWaitsFold>::default())
    }

    async fn apply(
        &self,
        conn: &mut PgConnection,
        event: &RecordedEvent,
    ) -> Result<(), StoreError> {
        crate::fused::apply_as_ctes(conn, event, Self::pg_rows).await
    }

    /// The row change rides in the statement that inserts the event.
    fn fuse(
        &self,
        event: &EventRef<'_>,
        position: &str,
        statement: &mut CteStatement,
    ) -> Result<bool, StoreError> {
        Self::pg_rows(event, position, statement)?;
        Ok(true)
    }
}

/// The set-based replay of [`OpenWaitRows`]: the domain's own [`OpenWaits`] per group.
#[derive(Default)]
pub struct OpenWaitsFold {
    groups: HashMap<String, OpenWaits>,
}

/// One `open_wait` row: group, declarer, set, first declaration time.
type OpenWaitRow = (String, String, Vec<String>, DateTime<Utc>);

impl OpenWaitsFold {
    fn fold(&mut self, event: &ReplayEvent<'_>, decoded: &mut Decoded) -> Result<(), StoreError> {
        let Some(declared) = declaration(event, decoded)? else {
            return Ok(());
        };
        let group = declared.attempt().group.as_str();
        match self.groups.get_mut(group) {
            Some(waits) => waits.apply(declared),
            // A group's first install leaves nothing to close.
            None if declared.is_installed() => {}
            None => {
                let mut waits = OpenWaits::default();
                waits.apply(declared);
                self.groups.insert(group.to_owned(), waits);
            }
        }
        Ok(())
    }

    /// The rows in key order (group, then declarer), for a bulk load in about the key's order.
    fn into_rows(self) -> Vec<OpenWaitRow> {
        let mut groups: Vec<_> = self.groups.into_iter().collect();
        groups.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        groups
            .into_iter()
            .flat_map(|(group, waits)| {
                waits
                    .iter()
                    .map(|(declarer, wait)| {
                        (
                            group.clone(),
                            declarer.to_string(),
                            wait.patterns.patterns(),
                            wait.declared_at,
                        )
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    }
}

impl SqliteReplay for OpenWaitsFold {
    fn fold(&mut self, event: &ReplayEvent<'_>, decoded: &mut Decoded) -> Result<(), StoreError> {
        OpenWaitsFold::fold(self, event, decoded)
    }

    fn write(self: Box<Self>, tx: &Transaction<'_>) -> Result<(), StoreError> {
        let mut insert = tx.prepare(
            "INSERT INTO open_wait (group_name, declarer, patterns, declared_at) \
             VALUES (?1, ?2, ?3, ?4)",
        )?;
        for (group, declarer, patterns, declared_at) in self.into_rows() {
            insert.execute(params![
                group,
                declarer,
                json_list(&patterns),
                declared_at.timestamp_micros()
            ])?;
        }
        Ok(())
    }
}

#[async_trait]
impl PgReplay for OpenWaitsFold {
    fn fold(&mut self, event: &ReplayEvent<'_>, decoded: &mut Decoded) -> Result<(), StoreError> {
        OpenWaitsFold::fold(self, event, decoded)
    }

    async fn write(
        self: Box<Self>,
        conn: &mut PgConnection,
        target: ReplayTarget,
    ) -> Result<(), StoreError> {
        let mut rows = CopyText::default();
        for (group, declarer, patterns, declared_at) in self.into_rows() {
            rows.field(&group);
            rows.field(&declarer);
            rows.array(&patterns);
            rows.time(declared_at);
            rows.end_row();
        }
        let table = target.table("open_wait");
        copy(
            conn,
            &format!("{table} (group_name, declarer, patterns, declared_at)"),
            rows,
        )
        .await
    }
}
