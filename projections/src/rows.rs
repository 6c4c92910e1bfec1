//! The statements that read projection rows, as each backend runs them: pages of groups, one
//! group, its members, whether it is declared and its bindings (run by `backend/sqlite.rs` and
//! `backend/postgres.rs`, the reads of several statements written once in `reads.rs`).
//!
//! Every statement here is keyed: a group page walks `effective_declaration` by name (or by
//! `(topic, group_name)`), waiters come from the partial index of waiting attempts
//! `(group_name, declared_at, declarer)`, instances from `worker_instance`'s key. The SQL
//! constants are public so the plan tests EXPLAIN exactly what runs. On Postgres no plan whose
//! shape came from a table while it was empty serves them (see
//! `docs/adr/0024-paged-listing.md`): the one-group read (`group_rows.rs`) runs inside
//! `wharf_group_rows` (ADRs 0046, 0065), planned once per connection with every path but an
//! index's off (ADR 0058); the others are unnamed statements, planned on every call with the
//! values given.

pub use crate::group_rows::{PG_GROUP_READ, PG_GROUP_READ_CALL, PG_GROUP_ROWS, PG_GROUP_ROWS_CALL};

/// A page of groups as the backends read it.
#[derive(Debug, Clone)]
pub(crate) struct PageKeys {
    /// After this group name (`""`: from the first).
    pub after: String,
    /// How many effective rows to read (one more than the page).
    pub fetch: i64,
    /// Only this topic.
    pub topic: Option<String>,
    /// Only groups with an open waiter.
    pub waiting: bool,
}

pub use crate::walks::page_sql;
use crate::walks::EFFECTIVE_COLUMNS;

/// One group's effective row (`?1`/`$1` the group).
pub fn one_sql(p: char) -> String {
    format!("SELECT {EFFECTIVE_COLUMNS} FROM effective_declaration e WHERE e.group_name = {p}1")
}

/// One group's open waiters after a key, by that key: 1 the group, 2 and 3 the key, 4 the count.
pub const SQLITE_WAITERS: &str = "SELECT a.group_name, a.declarer, a.version, a.patterns, \
     a.incumbent, a.declared_at, a.attempt_at FROM declarer_attempt a \
     WHERE a.group_name = ?1 AND a.status = 'waiting' \
     AND a.patterns <> (SELECT e.patterns FROM effective_declaration e WHERE e.group_name = ?1) \
     AND (a.declared_at, a.declarer) > (?2, ?3) ORDER BY a.declared_at, a.declarer LIMIT ?4";

/// One group's instances after a declarer, by declarer: 1 the group, 2 the key, 3 the count.
pub const SQLITE_INSTANCES: &str = "SELECT group_name, declarer, topic, version, patterns, \
     started_at, heartbeat_at FROM worker_instance WHERE group_name = ?1 AND declarer > ?2 \
     ORDER BY declarer LIMIT ?3";

/// The open waiters of each listed group after a key: `$1` the groups, `$2`, `$3` the key
/// (NULL: from the first), `$4` the count per group.
pub const PG_WAITERS: &str = "SELECT g.name, w.declarer, w.version, w.patterns, w.incumbent, \
     w.declared_at, w.attempt_at FROM unnest($1::text[]) AS g(name) CROSS JOIN LATERAL ( \
       SELECT a.declarer, a.version, a.patterns, a.incumbent, a.declared_at, a.attempt_at \
       FROM declarer_attempt a JOIN effective_declaration e ON e.group_name = a.group_name \
       WHERE a.group_name = g.name AND a.status = 'waiting' AND a.patterns <> e.patterns \
       AND (a.declared_at, a.declarer) > \
           (COALESCE($2::timestamptz, '-infinity'), COALESCE($3::text, '')) \
       ORDER BY a.declared_at, a.declarer LIMIT $4) w \
     ORDER BY g.name, w.declared_at, w.declarer";

/// The instances of each listed group after a declarer: `$1` the groups, `$2` the key, `$3`
/// the count per group.
pub const PG_INSTANCES: &str = "SELECT g.name, i.declarer, i.topic, i.version, i.patterns, \
     i.started_at, i.heartbeat_at FROM unnest($1::text[]) AS g(name) CROSS JOIN LATERAL ( \
       SELECT w.declarer, w.topic, w.version, w.patterns, w.started_at, w.heartbeat_at \
       FROM worker_instance w WHERE w.group_name = g.name AND w.declarer > $2 \
       ORDER BY w.declarer LIMIT $3) i \
     ORDER BY g.name, i.declarer";

/// Whether group `$1` has an effective declaration on Postgres. Read by group and topic (the
/// topic from the group's row), which both of `effective_declaration`'s indexes hold whole
/// (ADR 0066): by the name alone, statistics that count the table's pages but not its rows let
/// the planner walk the whole `(topic, group_name)` index.
pub const PG_IS_DECLARED: &str = "SELECT EXISTS (SELECT 1 FROM effective_declaration e \
     WHERE e.group_name = $1 \
     AND e.topic = (SELECT g.topic FROM consumer_group g WHERE g.group_name = $1))";

/// The effective binding rows of group `$1` on Postgres: its effective declaration's patterns,
/// one row each, as the `binding` view derives them (ADR 0064), the row read by group and
/// topic as [`PG_IS_DECLARED`] reads it (ADR 0066).
pub const PG_BINDINGS: &str = "SELECT p.pattern FROM effective_declaration e \
     CROSS JOIN LATERAL unnest(e.patterns) AS p (pattern) \
     WHERE e.group_name = $1 \
     AND e.topic = (SELECT g.topic FROM consumer_group g WHERE g.group_name = $1) \
     ORDER BY p.pattern";
