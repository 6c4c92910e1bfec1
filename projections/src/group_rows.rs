//! One group's read on Postgres: the statement `wharf_group_rows` runs (Postgres migration
//! 0027, ADR 0065) and the decoding of its rows, the group's own first and then one row per
//! member of each page, into the listing's rows; and the same statement with the group's
//! queue figures on its row, which `wharf_group_read` runs (migration 0029, ADR 0071).

use sqlx::postgres::PgRow;
use sqlx::Row;
use wharf_store::{GroupFiguresRow, InstanceRecord, StoreError};

use crate::listing::{PageRows, Snapshot};
use crate::views::{EffectiveRow, WaitingRow};

/// The one-group statement with `$figures` after the group row's columns, `$join` after its
/// `FROM`, and `$nulls` after each member row's columns: one text for the read with the
/// queue figures and the read without.
macro_rules! group_rows_sql {
    ($figures:literal, $join:literal, $nulls:literal) => {
        concat!(
            "WITH meta AS (SELECT clock_timestamp() AS now, \
       COALESCE((SELECT position FROM events ORDER BY position DESC LIMIT 1), 0) AS head, \
       COALESCE((SELECT position FROM projection_checkpoint WHERE projector = $6), 0) \
         AS checkpoint), \
     e AS (SELECT * FROM effective_declaration g \
         WHERE g.group_name >= $1 AND g.group_name <= $1 ORDER BY g.group_name LIMIT 1) \
     SELECT 0::smallint, m.now, m.head, m.checkpoint, e.group_name, e.declarer, e.topic, \
       e.version, e.patterns, e.previous, NULL::text[], e.declared_at, e.attempt_at, \
       e.position, e.installs, NULL::timestamptz, NULL::timestamptz",
            $figures,
            " FROM meta m LEFT JOIN e ON true",
            $join,
            " UNION ALL \
     SELECT 1::smallint, NULL, NULL, NULL, NULL, a.declarer, NULL, a.version, a.patterns, \
       NULL, a.incumbent, a.declared_at, a.attempt_at, NULL, NULL, NULL, NULL",
            $nulls,
            " FROM e CROSS JOIN LATERAL ( \
       SELECT a.declarer, a.version, a.patterns, a.incumbent, a.declared_at, a.attempt_at \
       FROM declarer_attempt a WHERE a.group_name = e.group_name \
       AND a.status = 'waiting' AND a.patterns <> e.patterns \
       AND (a.declared_at, a.declarer) > \
           (COALESCE($2::timestamptz, '-infinity'), COALESCE($3::text, '')) \
       ORDER BY a.declared_at, a.declarer LIMIT $4) a \
     UNION ALL \
     SELECT 2::smallint, NULL, NULL, NULL, NULL, i.declarer, i.topic, i.version, i.patterns, \
       NULL, NULL, NULL, NULL, NULL, NULL, i.started_at, i.heartbeat_at",
            $nulls,
            " FROM e CROSS JOIN LATERAL ( \
       SELECT w.declarer, w.topic, w.version, w.patterns, w.started_at, w.heartbeat_at \
       FROM worker_instance w WHERE w.group_name = e.group_name AND w.declarer > $5 \
       ORDER BY w.declarer LIMIT $4) i"
        )
    };
}

/// One group with a page of its waiters and of its instances, the store's clock and the
/// catch-up check, as one statement: `$1` the group, `$2`, `$3` the waiter key (NULL: from
/// the first), `$4` the count of each list, `$5` the instance key, `$6` the catch-up
/// projector. Rows come back as `GroupRowKind` says: first the group's (always one: the
/// clock and the check; its group columns NULL when the group was never declared), then a
/// page of waiters from the partial index of waiting attempts, then a page of instances from
/// `worker_instance`'s key, each at most `$4`, every value in its own column (ADR 0065). The
/// log's head is its last position and the group the first name in the range from `$1` to
/// `$1`: reads only a key's order answers, so the plan the function makes once per connection
/// reads by key whatever the tables held then (ADR 0058), and the range, closed on both
/// sides, ends the index scan at the key (ADR 0070).
pub const PG_GROUP_ROWS: &str = group_rows_sql!("", "", "");

/// [`PG_GROUP_ROWS`] with the group's queue figures on the group's row (ADR 0071): the
/// columns `wharf_group_figures` answers after the name, by a lateral call of it for the one
/// group found (none for a group never declared; NULL when the group has no queue row); NULL
/// on the members' rows. `wharf_group_read` (Postgres migration 0029) runs it, so one group's
/// API read is one statement, one round trip, one connection returned to the pool.
pub const PG_GROUP_READ: &str = group_rows_sql!(
    ", f.r_topic, f.r_routed_position, f.r_head, f.r_claimable, f.r_in_flight, \
     f.r_backing_off, f.r_dead_letters, f.r_oldest_published_at, f.r_now, f.r_set_aside, \
     f.r_rescan_remaining",
    " LEFT JOIN LATERAL wharf_group_figures(ARRAY[e.group_name]) f ON true",
    ", NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL"
);

/// The call that reads one group on Postgres: `wharf_group_rows` (Postgres migration 0027)
/// runs [`PG_GROUP_ROWS`] with its arguments. (`wharf_group_view`, migrations 0015 and 0022,
/// the same read with each list as JSON text, stays for builds before ADR 0065.)
pub const PG_GROUP_ROWS_CALL: &str = "SELECT * FROM wharf_group_rows($1, $2, $3, $4, $5, $6)";

/// The call that reads one group with its queue figures on Postgres: `wharf_group_read`
/// (Postgres migration 0029) runs [`PG_GROUP_READ`] with the arguments of
/// [`PG_GROUP_ROWS_CALL`].
pub const PG_GROUP_READ_CALL: &str = "SELECT * FROM wharf_group_read($1, $2, $3, $4, $5, $6)";

/// What a row of [`PG_GROUP_ROWS`] holds, its first column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GroupRowKind {
    /// The clock, the log's head, the checkpoint and the group's effective row.
    Group = 0,
    /// One waiter of the page.
    Waiter = 1,
    /// One instance of the page.
    Instance = 2,
}

/// The columns of [`PG_GROUP_ROWS`], in order; each kind fills its own and leaves the rest NULL.
mod col {
    pub const KIND: usize = 0;
    pub const NOW: usize = 1;
    pub const HEAD: usize = 2;
    pub const CHECKPOINT: usize = 3;
    pub const GROUP: usize = 4;
    pub const DECLARER: usize = 5;
    pub const TOPIC: usize = 6;
    pub const VERSION: usize = 7;
    pub const PATTERNS: usize = 8;
    pub const PREVIOUS: usize = 9;
    pub const INCUMBENT: usize = 10;
    pub const DECLARED_AT: usize = 11;
    pub const ATTEMPT_AT: usize = 12;
    pub const POSITION: usize = 13;
    pub const INSTALLS: usize = 14;
    pub const STARTED_AT: usize = 15;
    pub const HEARTBEAT_AT: usize = 16;
    /// The first of the queue figures' columns ([`super::PG_GROUP_READ`] only).
    pub const FIGURES: usize = 17;
}

/// Decodes [`PG_GROUP_ROWS`]' rows in the order they came back: the group's row (the clock,
/// the catch-up check, the effective row), then its members; checks the group's row leads and
/// no other repeats it. With `figures`, the group's row carries its queue figures too.
pub(crate) fn decode_group_rows(
    found: Vec<PgRow>,
    figures: bool,
) -> Result<(Snapshot<PageRows>, Option<GroupFiguresRow>), StoreError> {
    let mut found = found.into_iter();
    let head = found
        .next()
        .ok_or_else(|| unexpected("no row for the group"))?;
    if kind(&head)? != GroupRowKind::Group {
        return Err(unexpected("the group's row does not lead"));
    }
    let (last, checkpoint): (i64, i64) = (head.try_get(col::HEAD)?, head.try_get(col::CHECKPOINT)?);
    let mut read = Snapshot {
        now: head.try_get(col::NOW)?,
        behind: crate::reads::behind(last, checkpoint),
        rows: PageRows {
            effective: Vec::new(),
            waiting: Vec::new(),
            instances: Vec::new(),
        },
    };
    let Some(name) = head.try_get::<Option<String>, _>(col::GROUP)? else {
        return Ok((read, None));
    };
    let carried = if figures {
        GroupFiguresRow::from_pg(&head, col::FIGURES)?
    } else {
        None
    };
    read.rows
        .effective
        .push(group_effective(&head, name.clone())?);
    for row in found {
        match kind(&row)? {
            GroupRowKind::Waiter => read.rows.waiting.push(group_waiter(&row, name.clone())?),
            GroupRowKind::Instance => read
                .rows
                .instances
                .push(group_instance(&row, name.clone())?),
            GroupRowKind::Group => return Err(unexpected("a second group row")),
        }
    }
    Ok((read, carried))
}

/// The call returned rows in a shape its migration does not make.
fn unexpected(what: &str) -> StoreError {
    StoreError::Postgres(sqlx::Error::Protocol(format!("wharf_group_rows: {what}")))
}

fn kind(row: &PgRow) -> Result<GroupRowKind, StoreError> {
    match row.try_get::<i16, _>(col::KIND)? {
        0 => Ok(GroupRowKind::Group),
        1 => Ok(GroupRowKind::Waiter),
        2 => Ok(GroupRowKind::Instance),
        other => Err(unexpected(&format!("row kind {other}"))),
    }
}

fn group_effective(row: &PgRow, group: String) -> Result<EffectiveRow, StoreError> {
    Ok(EffectiveRow {
        group,
        topic: row.try_get(col::TOPIC)?,
        declarer: row.try_get(col::DECLARER)?,
        version: row.try_get(col::VERSION)?,
        patterns: row.try_get(col::PATTERNS)?,
        previous: row.try_get(col::PREVIOUS)?,
        declared_at: row.try_get(col::DECLARED_AT)?,
        attempt_at: row.try_get(col::ATTEMPT_AT)?,
        position: row.try_get(col::POSITION)?,
        installs: row.try_get(col::INSTALLS)?,
    })
}

fn group_waiter(row: &PgRow, group: String) -> Result<WaitingRow, StoreError> {
    Ok(WaitingRow {
        group,
        declarer: row.try_get(col::DECLARER)?,
        version: row.try_get(col::VERSION)?,
        patterns: row.try_get(col::PATTERNS)?,
        incumbent: row
            .try_get::<Option<Vec<String>>, _>(col::INCUMBENT)?
            .unwrap_or_default(),
        declared_at: row.try_get(col::DECLARED_AT)?,
        attempt_at: row.try_get(col::ATTEMPT_AT)?,
    })
}

fn group_instance(row: &PgRow, group: String) -> Result<InstanceRecord, StoreError> {
    Ok(InstanceRecord {
        group,
        declarer: row.try_get(col::DECLARER)?,
        topic: row.try_get(col::TOPIC)?,
        version: row.try_get(col::VERSION)?,
        patterns: row.try_get(col::PATTERNS)?,
        started_at: row.try_get(col::STARTED_AT)?,
        heartbeat_at: row.try_get(col::HEARTBEAT_AT)?,
    })
}
