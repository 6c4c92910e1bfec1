//! A routing step's statements on SQLite: the [`RouteDialect`] the step and its swap run on
//! (the logic: `routing.rs`; the rules: `generations.rs`, ADR 0014). Every statement runs in
//! the step's write transaction and completes at once; times are the store clock's
//! microseconds.

use rusqlite::{params, ToSql, Transaction};
use wharf_domain::GroupName;

use super::route::read_install;
use crate::error::QueueError;
use crate::message::{EffectiveInstall, SwapReport};
use crate::routing::{GenerationRow, RouteDialect};

/// A routing step's statements on its write transaction, at the store's time `now`.
pub(super) struct SqliteRoute<'a, 't> {
    pub tx: &'a Transaction<'t>,
    pub now: i64,
}

impl SqliteRoute<'_, '_> {
    /// Moves the rows at `positions` of `group` with `copy` (`?1` group, `?2` position, `?3`
    /// install, and `?4` now where it uses it), then deletes each from where it was with
    /// `remove` (`?1`, `?2`); how many positions.
    fn move_rows(
        &self,
        group: &GroupName,
        positions: &[i64],
        install: i64,
        copy: &str,
        remove: &str,
    ) -> Result<u64, QueueError> {
        let (mut copy, mut remove) = (self.tx.prepare(copy)?, self.tx.prepare(remove)?);
        let used = copy.parameter_count();
        for position in positions {
            let values: [&dyn ToSql; 4] = [&group.as_str(), position, &install, &self.now];
            copy.execute(&values[..used])?;
            remove.execute(params![group.as_str(), position])?;
        }
        Ok(positions.len() as u64)
    }
}

impl RouteDialect for SqliteRoute<'_, '_> {
    async fn install(
        &mut self,
        group: &GroupName,
        _topic: &str,
    ) -> Result<Option<EffectiveInstall>, QueueError> {
        read_install(self.tx, group)
    }

    async fn slice(
        &mut self,
        topic: &str,
        from: i64,
        to: i64,
    ) -> Result<Vec<(i64, String)>, QueueError> {
        // Bounded by position, as on Postgres.
        Ok(self
            .tx
            .prepare_cached(
                "SELECT position, subject FROM message WHERE topic = ?1 AND position >= ?2 \
                   AND position <= ?3 ORDER BY position",
            )?
            .query_map(params![topic, from, to], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })?
            .collect::<Result<Vec<_>, _>>()?)
    }

    async fn generations(
        &mut self,
        group: &GroupName,
        current: i64,
        first: i64,
        last: i64,
    ) -> Result<Vec<GenerationRow>, QueueError> {
        let rows = self
            .tx
            .prepare_cached(
                "SELECT install, patterns, from_position, through_position, rescan_from, \
                   rescan_through FROM route_generation \
                 WHERE group_name = ?1 AND install <> ?2 AND through_position IS NOT NULL \
                   AND ((from_position <= ?4 AND through_position >= ?3) \
                     OR (rescan_from <= ?4 AND rescan_through >= ?3))",
            )?
            .query_map(params![group.as_str(), current, first, last], |row| {
                Ok((
                    row.get::<_, i64>(0)?,
                    row.get::<_, String>(1)?,
                    (row.get(2)?, row.get(3)?),
                    (row.get(4)?, row.get(5)?),
                ))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        rows.into_iter()
            .map(|(install, patterns, forward, rescan)| {
                Ok(GenerationRow {
                    install,
                    patterns: serde_json::from_str(&patterns)?,
                    forward,
                    rescan,
                })
            })
            .collect()
    }

    async fn deliver(
        &mut self,
        group: &GroupName,
        topic: &str,
        positions: &[i64],
        install: i64,
    ) -> Result<(), QueueError> {
        let mut insert = self.tx.prepare_cached(
            "INSERT OR IGNORE INTO delivery (group_name, topic, position, routed_by, routed_at, \
               visible_at) VALUES (?1, ?2, ?3, ?4, ?5, ?5)",
        )?;
        for position in positions {
            insert.execute(params![group.as_str(), topic, position, install, self.now])?;
        }
        Ok(())
    }

    async fn advance(
        &mut self,
        group: &GroupName,
        routed_position: i64,
        rescan_position: i64,
        _lowest_delivered: Option<i64>,
    ) -> Result<(), QueueError> {
        // No claim floor here: SQLite's claims walk the group's deliveries by key.
        self.tx
            .prepare_cached(
                "UPDATE consumer_group SET routed_position = ?2, rescan_position = ?3 \
                 WHERE group_name = ?1",
            )?
            .execute(params![group.as_str(), routed_position, rescan_position])?;
        Ok(())
    }

    async fn close_generation(
        &mut self,
        group: &GroupName,
        install: i64,
        through: i64,
        rescan_through: i64,
    ) -> Result<(), QueueError> {
        self.tx.execute(
            "UPDATE route_generation SET through_position = ?3, rescan_through = ?4 \
             WHERE group_name = ?1 AND install = ?2 AND through_position IS NULL",
            params![group.as_str(), install, through, rescan_through],
        )?;
        Ok(())
    }

    async fn pending(
        &mut self,
        group: &GroupName,
        install: i64,
    ) -> Result<Vec<(i64, Option<String>)>, QueueError> {
        Ok(self
            .tx
            .prepare(
                "SELECT d.position, m.subject FROM delivery d \
                 LEFT JOIN message m ON m.topic = d.topic AND m.position = d.position \
                 WHERE d.group_name = ?1 AND d.routed_by <> ?2",
            )?
            .query_map(params![group.as_str(), install], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })?
            .collect::<Result<Vec<_>, _>>()?)
    }

    async fn restamp(
        &mut self,
        group: &GroupName,
        positions: &[i64],
        install: i64,
    ) -> Result<u64, QueueError> {
        let mut restamp = self.tx.prepare(
            "UPDATE delivery SET routed_by = ?3 WHERE group_name = ?1 AND position = ?2",
        )?;
        for position in positions {
            restamp.execute(params![group.as_str(), position, install])?;
        }
        Ok(positions.len() as u64)
    }

    async fn set_aside(
        &mut self,
        group: &GroupName,
        positions: &[i64],
        install: i64,
    ) -> Result<u64, QueueError> {
        self.move_rows(
            group,
            positions,
            install,
            "INSERT OR IGNORE INTO set_aside (group_name, topic, position, routed_by, routed_at, \
               attempts, visible_at, claimed_by, claim_token, last_error, set_aside_by, \
               set_aside_at) \
             SELECT group_name, topic, position, routed_by, routed_at, attempts, visible_at, \
               claimed_by, claim_token, last_error, ?3, ?4 \
             FROM delivery WHERE group_name = ?1 AND position = ?2",
            "DELETE FROM delivery WHERE group_name = ?1 AND position = ?2",
        )
    }

    async fn parked(&mut self, group: &GroupName) -> Result<Vec<(i64, String)>, QueueError> {
        Ok(self
            .tx
            .prepare(
                "SELECT s.position, m.subject FROM set_aside s \
                 JOIN message m ON m.topic = s.topic AND m.position = s.position \
                 WHERE s.group_name = ?1",
            )?
            .query_map([group.as_str()], |row| Ok((row.get(0)?, row.get(1)?)))?
            .collect::<Result<Vec<_>, _>>()?)
    }

    async fn restore(
        &mut self,
        group: &GroupName,
        positions: &[i64],
        install: i64,
    ) -> Result<u64, QueueError> {
        self.move_rows(
            group,
            positions,
            install,
            "INSERT OR IGNORE INTO delivery (group_name, topic, position, routed_by, routed_at, \
               attempts, visible_at, claimed_by, claim_token, last_error) \
             SELECT group_name, topic, position, ?3, routed_at, attempts, visible_at, \
               claimed_by, claim_token, last_error FROM set_aside \
             WHERE group_name = ?1 AND position = ?2",
            "DELETE FROM set_aside WHERE group_name = ?1 AND position = ?2",
        )
    }

    async fn oldest(&mut self, topic: &str) -> Result<Option<i64>, QueueError> {
        Ok(self.tx.query_row(
            "SELECT MIN(position) FROM message WHERE topic = ?1",
            [topic],
            |row| row.get(0),
        )?)
    }

    async fn open_generation(
        &mut self,
        group: &GroupName,
        install: &EffectiveInstall,
        from_position: i64,
        swap: &SwapReport,
    ) -> Result<(), QueueError> {
        self.tx.execute(
            "INSERT OR IGNORE INTO route_generation (group_name, install, patterns, \
               from_position, rescan_from, set_aside, restored, kept, applied_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            params![
                group.as_str(),
                install.position,
                serde_json::to_string(&install.patterns)?,
                from_position,
                swap.rescan_from,
                swap.set_aside as i64,
                swap.restored as i64,
                swap.kept as i64,
                self.now
            ],
        )?;
        Ok(())
    }

    async fn realign(
        &mut self,
        group: &GroupName,
        start: i64,
        swap: &SwapReport,
    ) -> Result<(), QueueError> {
        self.tx.execute(
            "UPDATE consumer_group SET start_position = ?2, routed_install = ?3, \
               rescan_position = ?4, rescan_until = ?5 WHERE group_name = ?1",
            params![
                group.as_str(),
                start,
                swap.install,
                swap.rescan_from,
                swap.rescan_until
            ],
        )?;
        Ok(())
    }
}
