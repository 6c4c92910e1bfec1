//! A group's queue figures as Postgres's `wharf_group_figures` answers them (migrations 0015,
//! 0022, 0028), decoded in one place for the two reads that carry them: the queue's own call,
//! and the one-group read that asks for them in its statement (`wharf_group_read`, migration
//! 0029, ADR 0071). The store owns the columns because it owns the functions; what the
//! figures mean (lag, age) is the queue's to derive.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::Row;

use crate::StoreError;

/// One group's figures, as the columns after its name hold them.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupFiguresRow {
    /// The topic the group consumes.
    pub topic: String,
    /// The log position the group has routed up to.
    pub routed_position: i64,
    /// The topic's head.
    pub head: i64,
    /// Deliveries claimable now.
    pub claimable: i64,
    /// Deliveries claimed and not yet acked or expired.
    pub in_flight: i64,
    /// Deliveries waiting out a backoff.
    pub backing_off: i64,
    /// The group's dead letters.
    pub dead_letters: i64,
    /// When the oldest unacked delivery's message was published (none without deliveries).
    pub oldest_published_at: Option<DateTime<Utc>>,
    /// The database's clock when the figures were read.
    pub now: DateTime<Utc>,
    /// Unacked deliveries set aside by swaps.
    pub set_aside: i64,
    /// Log positions the install in effect still has to rescan.
    pub rescan_remaining: i64,
}

impl GroupFiguresRow {
    /// The figures in `row`'s eleven columns from `first`, in the order `wharf_group_figures`
    /// returns them after the name; `None` when the topic column is
    /// NULL (a read that carries the figures found no queue row for the group).
    pub fn from_pg(row: &PgRow, first: usize) -> Result<Option<Self>, StoreError> {
        let Some(topic) = row.try_get::<Option<String>, _>(first)? else {
            return Ok(None);
        };
        Ok(Some(Self {
            topic,
            routed_position: row.try_get(first + 1)?,
            head: row.try_get(first + 2)?,
            claimable: row.try_get(first + 3)?,
            in_flight: row.try_get(first + 4)?,
            backing_off: row.try_get(first + 5)?,
            dead_letters: row.try_get(first + 6)?,
            oldest_published_at: row.try_get(first + 7)?,
            now: row.try_get(first + 8)?,
            set_aside: row.try_get(first + 9)?,
            rescan_remaining: row.try_get(first + 10)?,
        }))
    }
}
