//! The group listing's page as summaries (ADR 0038): per group its effective declaration,
//! how many open waiters it has (counted up to [`COUNT_CAP`]) and its oldest one, and how many
//! instances it has, live and all; the lists themselves are the one-group read's (`ReadModel::group_members`).
//!
//! A page is one read: on Postgres one statement that also answers the catch-up check (the
//! log's head and the checkpoint of the catch-up projector) and the store's clock, run by
//! `wharf_group_summaries` (ADR 0046); on SQLite one read transaction with the check and one
//! statement for the page and its summaries. A read that finds the projector behind is
//! discarded, the projector catches up, and the page is read again, so a caller still reads
//! its own writes (ADR 0003) without a round trip of its own for the check.
//!
//! The waiter count is bounded: at most `COUNT_CAP + 1` index entries, so a page costs its
//! groups, not their waiters (a crash-looping group has 100k). Instances are counted exactly:
//! they are a group's fleet, not its history.

use chrono::{DateTime, Utc};
use serde::Serialize;
use wharf_store::GroupFiguresRow;

use crate::rows::page_sql;
use crate::views::{EffectiveView, WaiterView};
use crate::walks::{oldest_waiter, page_sql_with, PageExtra};

// What one read answered (the crate root names it `summary::Snapshot`).
pub(crate) use crate::listing::Snapshot;
pub use crate::walks::COUNT_CAP;

/// A bounded count of a group's members.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MemberCount {
    /// How many, counted up to 100.
    pub count: u32,
    /// True when more than `count` exist (read them from `GET /api/v1/groups/{group}`).
    pub more: bool,
}

impl MemberCount {
    /// The count of `seen` members where at most `COUNT_CAP + 1` were looked at.
    pub fn of(seen: i64) -> Self {
        let seen = u32::try_from(seen.max(0)).unwrap_or(u32::MAX);
        Self {
            count: seen.min(COUNT_CAP),
            more: seen > COUNT_CAP,
        }
    }
}

/// One consumer group as a listing page shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GroupSummary {
    /// The group's name.
    pub group: String,
    /// The log topic the group consumes.
    pub topic: String,
    /// The effective declaration (newest installed).
    pub effective: EffectiveView,
    /// Its open waiters (attempts blocked on live instances that declare the effective set).
    pub waiters: MemberCount,
    /// The open waiter that first stated its set earliest (ties by declarer); null when none.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub oldest_waiter: Option<WaiterView>,
    /// How many worker instances it has recorded, live or not.
    pub instances: u64,
    /// How many of them have a newest heartbeat fresher than the instance TTL.
    pub live_instances: u64,
}

/// One page of the group listing.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SummaryPage {
    /// The groups, by name.
    pub groups: Vec<GroupSummary>,
    /// Pass as `after` for the next page; `None` when no group follows this page.
    pub next_after: Option<String>,
}

/// A page's row for one group, before the views are built.
pub(crate) struct SummaryRow {
    pub effective: crate::views::EffectiveRow,
    pub waiters: i64,
    pub oldest: Option<crate::views::WaitingRow>,
    pub instances: i64,
    pub live: i64,
    /// The group's queue figures, when the read carried them and it has a queue row.
    pub figures: Option<GroupFiguresRow>,
}

fn seconds_between(from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    (to - from).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6
}

/// The queue figures a page's read carried, by group, of the groups the page keeps (`limit`
/// of them): taken out of the rows.
pub(crate) fn take_figures(
    read: &mut Snapshot<Vec<SummaryRow>>,
    limit: u32,
) -> Vec<(String, GroupFiguresRow)> {
    read.rows
        .iter_mut()
        .take(limit as usize)
        .filter_map(|row| {
            let figures = row.figures.take()?;
            Some((row.effective.group.clone(), figures))
        })
        .collect()
}

/// Builds the page from what one read answered: cuts to `limit` and names the next cursor.
pub(crate) fn page(read: Snapshot<Vec<SummaryRow>>, limit: u32) -> SummaryPage {
    let Snapshot { mut rows, now, .. } = read;
    let more = rows.len() > limit as usize;
    rows.truncate(limit as usize);
    let next_after = if more {
        rows.last().and_then(|row| {
            wharf_domain::GroupName::parse("group", &row.effective.group)
                .ok()
                .map(|name| crate::cursor::GroupCursor(name).encode())
        })
    } else {
        None
    };
    let groups = rows
        .into_iter()
        .map(|row| {
            let e = row.effective;
            GroupSummary {
                waiters: MemberCount::of(row.waiters),
                oldest_waiter: row.oldest.map(|w| WaiterView {
                    waiting_seconds: seconds_between(w.declared_at, now),
                    silent_seconds: seconds_between(w.attempt_at, now),
                    declarer: w.declarer,
                    version: w.version,
                    patterns: w.patterns,
                    incumbent: w.incumbent,
                    declared_at: w.declared_at,
                    last_attempt_at: w.attempt_at,
                }),
                instances: u64::try_from(row.instances).unwrap_or(0),
                live_instances: u64::try_from(row.live).unwrap_or(0),
                effective: EffectiveView {
                    whole_topic: e.patterns.is_empty(),
                    patterns: e.patterns,
                    declarer: e.declarer,
                    version: e.version,
                    declared_at: e.declared_at,
                    installed_at: e.attempt_at,
                    position: e.position,
                    installs: e.installs,
                    previous: e.previous,
                },
                group: e.group,
                topic: e.topic,
            }
        })
        .collect();
    SummaryPage { groups, next_after }
}

/// The summary page on Postgres, one statement: `$1` the group name to start after, `$2` the
/// row count, `$3` the topic (unused without a filter), `$4` whether only waiting groups are
/// listed (unused here: it picks the form), `$5` the catch-up projector's name and `$6` the
/// instance TTL in microseconds: the arguments of `wharf_group_summaries` (Postgres migration
/// 0015, ADR 0046), which runs these four statements, each planned once per connection with
/// every path but an index's off (migration 0022, ADR 0058).
///
/// The page itself is [`page_sql`]'s walk (by name, by `(topic, group_name)`, or along
/// `waiting_group` for the waiting groups), joined to one row of the clock and the catch-up
/// check, so an empty page still answers them. The waiters are counted by a walk of the
/// partial index of waiting attempts in key order (`walks::oldest_waiter`): the `ORDER BY` is
/// what keeps it an index scan that stops at the cap, where an unordered count under a
/// `LIMIT` was planned as a bitmap of every entry (all 20k waiting attempts of a crash-looping
/// group); the oldest waiter is the first row of that walk (a window count over at most
/// `COUNT_CAP + 1` rows). A page of waiting groups takes both from its own walk, where that
/// walk also admits the group (ADR 0061); a plain page joins it to each row. The instances
/// are counted exactly, live and all in one aggregate over the group's `worker_instance` rows
/// by key (its fleet and the rows not yet reaped, not its history; a `LIMIT` would not bound
/// it: the planner reads them through a bitmap either way). The log's head is its last
/// position (`ORDER BY position DESC LIMIT 1`), not `MAX(position)`, which a plan made on
/// empty tables answers by aggregating the whole index (ADR 0058).
pub fn pg_summary_sql(topic: bool, waiting: bool) -> String {
    summary_sql(topic, waiting, "", "")
}

/// The group's queue figures as columns of a page's row (ADR 0072): the eleven columns
/// `wharf_group_figures` answers after the name (`wharf_store::pg_figures_columns!`), read
/// by key for the row's group at the page's clock, so the page and its figures are one
/// snapshot; NULL when the group has no queue row. The group's `consumer_group` row is the
/// first name in the range from the row's group to itself, as every listing lookup is (ADR
/// 0070): a bare equality let a plan made on empty tables join the whole table to the page
/// and filter after (every group's deliveries aggregated for each listed group).
const PAGE_FIGURES_JOIN: &str = concat!(
    " LEFT JOIN LATERAL (SELECT ",
    wharf_store::pg_figures_columns!("m.now"),
    " FROM (SELECT * FROM consumer_group g WHERE g.group_name >= p.group_name \
       AND g.group_name <= p.group_name ORDER BY g.group_name LIMIT 1) g \
     CROSS JOIN LATERAL (",
    wharf_store::pg_figures_deliveries!("m.now"),
    ") d) f ON true"
);

/// [`pg_summary_sql`] with each group's queue figures as the columns after its summary
/// (columns 22 to 32, [`PAGE_FIGURES_JOIN`]): what `wharf_group_page` (Postgres migration
/// 0030, ADR 0072) runs, so the API's page is one statement, one round trip.
pub fn pg_page_sql(topic: bool, waiting: bool) -> String {
    summary_sql(topic, waiting, ", f.*", PAGE_FIGURES_JOIN)
}

/// The summary page's statement with `columns` after the summary's and `join` after its
/// other joins.
fn summary_sql(topic: bool, waiting: bool, columns: &str, join: &str) -> String {
    let page = page_sql('$', topic, waiting);
    let (projector, ttl) = ("$5", "$6");
    let (waiters, oldest) = if waiting {
        (
            "COALESCE(p.waiters, 0), p.oldest_declarer, p.oldest_version, p.oldest_patterns, \
             p.oldest_incumbent, p.oldest_declared_at, p.oldest_attempt_at",
            String::new(),
        )
    } else {
        (
            "COALESCE(o.waiters, 0), o.declarer, o.version, o.patterns, o.incumbent, \
             o.declared_at, o.attempt_at",
            format!(
                " LEFT JOIN LATERAL ({}) o ON true",
                oldest_waiter("p.group_name", "p.patterns")
            ),
        )
    };
    format!(
        "WITH meta AS (SELECT clock_timestamp() AS now, \
           COALESCE((SELECT position FROM events ORDER BY position DESC LIMIT 1), 0) AS head, \
           COALESCE((SELECT position FROM projection_checkpoint WHERE projector = {projector}), 0) \
             AS checkpoint) \
         SELECT m.now, m.head, m.checkpoint, p.group_name, p.topic, p.declarer, p.version, \
           p.patterns, p.previous, p.declared_at, p.attempt_at, p.position, p.installs, \
           {waiters}, COALESCE(c.instances, 0), COALESCE(c.live, 0){columns} \
         FROM meta m LEFT JOIN LATERAL ({page}) p ON true \
         LEFT JOIN LATERAL (SELECT COUNT(*) AS instances, COUNT(*) FILTER ( \
             WHERE i.heartbeat_at > m.now - {ttl}::bigint * interval '1 microsecond') AS live \
           FROM worker_instance i WHERE i.group_name = p.group_name) c ON true{oldest}{join} \
         ORDER BY p.group_name"
    )
}

/// The summaries SQLite's page adds to each of its rows (`e`), as columns 10 to 18: the open
/// waiters counted up to the cap (a walk of the partial waiting index that stops one past
/// it), the oldest open waiter's columns (looked up by its key, found as the first entry of
/// that walk; NULL when none), the instances, and those with a heartbeat after `?4`
/// (microseconds). Each is a keyed search per row of the page: no statement per group.
const SQLITE_SUMMARY_COLUMNS: &str = ", (SELECT COUNT(*) FROM (SELECT 1 FROM declarer_attempt a \
       WHERE a.group_name = e.group_name AND a.status = 'waiting' \
       AND a.patterns <> e.patterns ORDER BY a.declared_at, a.declarer LIMIT 101)), \
     o.declarer, o.version, o.patterns, o.incumbent, o.declared_at, o.attempt_at, \
     (SELECT COUNT(*) FROM worker_instance i WHERE i.group_name = e.group_name), \
     (SELECT COUNT(*) FROM worker_instance i WHERE i.group_name = e.group_name \
       AND i.heartbeat_at > ?4)";

/// The oldest open waiter's row, by its primary key.
const SQLITE_SUMMARY_JOINS: &str = " LEFT JOIN declarer_attempt o \
     ON o.group_name = e.group_name AND o.declarer = (SELECT a.declarer \
       FROM declarer_attempt a WHERE a.group_name = e.group_name AND a.status = 'waiting' \
       AND a.patterns <> e.patterns ORDER BY a.declared_at, a.declarer LIMIT 1)";

/// The summary page on SQLite as one statement (ADR 0046): [`page_sql_with`]'s walk with each
/// group's summary as columns of its row. `?1` the group name to start after, `?2` the row
/// count, `?3` the topic (NULL and unused without a filter), `?4` the heartbeat time after
/// which an instance is live (microseconds).
pub fn sqlite_summary_sql(topic: bool, waiting: bool) -> String {
    page_sql_with(
        '?',
        topic,
        waiting,
        &PageExtra {
            columns: SQLITE_SUMMARY_COLUMNS,
            joins: SQLITE_SUMMARY_JOINS,
        },
    )
}

/// The call that reads a summary page on Postgres (the arguments of [`pg_summary_sql`]).
pub const PG_SUMMARIES_CALL: &str = "SELECT * FROM wharf_group_summaries($1, $2, $3, $4, $5, $6)";

/// The call that reads a summary page with its groups' queue figures on Postgres:
/// `wharf_group_page` (Postgres migration 0030, ADR 0072) runs [`pg_page_sql`] with the
/// arguments of [`PG_SUMMARIES_CALL`].
pub const PG_PAGE_CALL: &str = "SELECT * FROM wharf_group_page($1, $2, $3, $4, $5, $6)";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::walks::WAITER_FETCH;

    #[test]
    fn a_count_stops_at_the_cap_and_says_more() {
        assert_eq!(
            MemberCount::of(0),
            MemberCount {
                count: 0,
                more: false
            }
        );
        assert_eq!(
            MemberCount::of(100),
            MemberCount {
                count: 100,
                more: false
            }
        );
        assert_eq!(
            MemberCount::of(101),
            MemberCount {
                count: 100,
                more: true
            }
        );
    }

    #[test]
    fn every_waiter_count_stops_one_past_the_cap() {
        let cap = format!("LIMIT {WAITER_FETCH})");
        assert!(
            SQLITE_SUMMARY_COLUMNS.contains(&cap),
            "{SQLITE_SUMMARY_COLUMNS}"
        );
        for (topic, waiting) in [(false, false), (true, false), (false, true), (true, true)] {
            let sql = pg_summary_sql(topic, waiting);
            assert!(sql.contains(&format!("LIMIT {WAITER_FETCH}) w")), "{sql}");
        }
    }

    #[test]
    fn the_postgres_statement_numbers_its_parameters_as_the_function_does() {
        for (topic, waiting) in [(false, false), (true, false), (false, true), (true, true)] {
            let sql = pg_summary_sql(topic, waiting);
            for n in [1, 2, 5, 6] {
                assert!(sql.contains(&format!("${n}")), "${n} missing: {sql}");
            }
            assert_eq!(sql.contains("$3"), topic, "{sql}");
            assert!(!sql.contains("$4") && !sql.contains("$7"), "{sql}");
        }
    }
}
