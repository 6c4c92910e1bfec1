//! A group's queue figures as Postgres's `wharf_group_figures` answers them (migrations 0015,
//! 0022, 0028): the SQL of their columns, written once for every statement that reads them,
//! and their decoding, in one place for the reads that carry them: the queue's own call, the
//! one-group read that asks for them in its statement (`wharf_group_read`, migration 0029, ADR
//! 0071) and the listing's page that does (`wharf_group_page`, migration 0030, ADR 0072). The
//! store owns the columns because it owns the functions; what the figures mean (lag, age) is
//! the queue's to derive.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::Row;

use crate::StoreError;

/// The figures' eleven columns (as [`GroupFiguresRow::from_pg`] reads them) over a group's
/// `consumer_group` row `g` and the aggregate `d` of its deliveries
/// ([`pg_figures_deliveries!`]), with `$now` the clock they are read at: a literal, for
/// `concat!`.
#[macro_export]
macro_rules! pg_figures_columns {
    ($now:literal) => {
        concat!(
            "g.topic, g.routed_position, \
       COALESCE((SELECT head FROM topic t WHERE t.name = g.topic), 0), \
       d.claimable, d.in_flight, d.backing_off, \
       (SELECT COUNT(*) FROM dead_letter x WHERE x.group_name = g.group_name), \
       (SELECT n.published_at FROM message n \
          WHERE n.topic = g.topic AND n.position = d.first_position), ",
            $now,
            ", (SELECT COUNT(*) FROM set_aside s WHERE s.group_name = g.group_name), \
       GREATEST(g.rescan_until - g.rescan_position + 1, 0)"
        )
    };
}

/// The aggregate of the deliveries of the group whose `consumer_group` row is `g`, at the
/// clock `$now`: claimable, in flight and backing off (`FILTER`s of one aggregate over the
/// group's deliveries by key), and their first position, whose message is the oldest unacked
/// one (a group consumes one topic for good, so its deliveries' topic is the group's; a second
/// walk of the deliveries for the first one cost about a tenth of the call, ADR 0070).
#[macro_export]
macro_rules! pg_figures_deliveries {
    ($now:literal) => {
        concat!(
            "SELECT COUNT(*) FILTER (WHERE e.visible_at <= ",
            $now,
            ") AS claimable, COUNT(*) FILTER (WHERE e.visible_at > ",
            $now,
            " AND e.claim_token IS NOT NULL) AS in_flight, \
         COUNT(*) FILTER (WHERE e.visible_at > ",
            $now,
            " AND e.claim_token IS NULL) AS backing_off, MIN(e.position) AS first_position \
       FROM delivery e WHERE e.group_name = g.group_name"
        )
    };
}

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
