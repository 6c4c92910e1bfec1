//! The walks a page of the group listing takes through `effective_declaration` (ADR 0024,
//! 0036, 0044, 0060, 0061): by name, by `(topic, group_name)`, or, for the page of waiting
//! groups, along `waiting_group` (the groups with a waiting attempt, kept by the attempts'
//! projector); and the walk of a group's open waiters that counts them and finds the oldest.
//!
//! The statement text is public (through `rows::page_sql`) so the plan tests EXPLAIN exactly
//! what runs. A page of waiting groups costs the groups with waiting attempts it passes on
//! both backends, never the groups without one, nor the attempts of one group.

/// The effective row's columns, as every page and the one-group read select them.
pub(crate) const EFFECTIVE_COLUMNS: &str = "e.group_name, e.topic, e.declarer, e.version, \
     e.patterns, e.previous, e.declared_at, e.attempt_at, e.position, e.installs";

/// The page statement on either backend (`p` is the placeholder prefix, `$` or `?`): `1` the
/// group name to start after, `2` the row count, `3` the topic when filtered.
///
/// Without `waiting` it walks `effective_declaration` by name (by `(topic, group_name)` with a
/// topic). With `waiting` it walks `waiting_group` by name, a contiguous range of its key like
/// a plain page's, and looks each group up by key with its first open waiter (ADR 0060); on
/// Postgres that is `oldest_waiter`'s walk, whose count and oldest waiter are then columns
/// of the row (`WAITER_COLUMNS`, ADR 0061). So a
/// page costs the groups with waiting attempts it passes, not their attempts (walking every
/// waiting attempt read all 100k of a crash-looping group's, 0.9 s on Postgres), not the
/// groups without one (probing every group passed ten per waiting one in the `listing`
/// bench's fleet: 28 ms p99 at 10k groups on SQLite), and not an index descent per group to
/// find the next one (the recursive skip through the waiting attempts of ADR 0044: three
/// times a plain page's call on Postgres at 10k groups).
pub fn page_sql(p: char, topic: bool, waiting: bool) -> String {
    page_sql_with(p, topic, waiting, &PageExtra::default())
}

/// What a statement adds to each row of a page: select-list entries (each starting with a
/// comma) and joins, both over `e`, the page's effective row. SQLite's summary page is the
/// page with its summaries as such columns (ADR 0046).
#[derive(Debug, Clone, Copy, Default)]
pub struct PageExtra<'a> {
    /// Appended to the select list, e.g. `, (SELECT COUNT(*) ...)`.
    pub columns: &'a str,
    /// Appended after the page's `FROM effective_declaration e` (or its subquery `e`).
    pub joins: &'a str,
}

/// [`page_sql`] with `extra`'s columns and joins on each of the page's rows.
pub fn page_sql_with(p: char, topic: bool, waiting: bool, extra: &PageExtra<'_>) -> String {
    let PageExtra { columns, joins } = *extra;
    let topic = if topic {
        format!(" AND e.topic = {p}3")
    } else {
        String::new()
    };
    if waiting && p == '$' {
        // Each LATERAL subquery has a LIMIT, so none is flattened into a join (a hash join
        // over a scan of every group, or a bitmap of every waiting attempt of a group). The
        // walk of `waiting_group` yields names in order and stops where the LIMIT does; the
        // outer ORDER BY sorts the page, never the walk. Each group is looked up as the
        // names from the one sought up to the same one, in name order: only the primary key
        // gives that order, where an equality on the name makes the order moot and ties, in a
        // plan made on empty tables, with a walk of the whole `(topic, group_name)` index
        // (ADR 0058); and a range closed on both sides ends the index scan at the key, where
        // a lower bound alone read the rest of the leaf page (ADR 0070). The group's walk
        // of its open waiters both admits it (an inner join: no open waiter, no row) and
        // answers its count and oldest waiter (ADR 0061).
        let topic = topic.replace("e.topic", "g.topic");
        let oldest = oldest_waiter("g.group_name", "g.patterns");
        return format!(
            "SELECT {EFFECTIVE_COLUMNS}{WAITER_COLUMNS}{columns} FROM ( \
               SELECT g.*, o.waiters, o.declarer AS oldest_declarer, \
                 o.version AS oldest_version, o.patterns AS oldest_patterns, \
                 o.incumbent AS oldest_incumbent, o.declared_at AS oldest_declared_at, \
                 o.attempt_at AS oldest_attempt_at \
               FROM waiting_group wg CROSS JOIN LATERAL ( \
                 SELECT * FROM effective_declaration g \
                 WHERE g.group_name >= wg.group_name AND g.group_name <= wg.group_name{topic} \
                 ORDER BY g.group_name LIMIT 1) g \
               CROSS JOIN LATERAL ({oldest}) o \
               WHERE wg.group_name > {p}1 ORDER BY wg.group_name LIMIT {p}2) e{joins} \
             ORDER BY e.group_name"
        );
    }
    if waiting {
        // The same walk on SQLite, as the `IN` list's own subquery: the page then looks its
        // groups up by key in the list's order (no sort), and the LIMIT stops the walk.
        let topic = topic.replace("e.topic", "g.topic");
        return format!(
            "SELECT {EFFECTIVE_COLUMNS}{columns} FROM effective_declaration e{joins} \
             WHERE e.group_name IN ( \
               SELECT w.group_name FROM waiting_group w \
               WHERE w.group_name > {p}1 AND EXISTS ( \
                 SELECT 1 FROM declarer_attempt a \
                 JOIN effective_declaration g ON g.group_name = a.group_name \
                 WHERE a.group_name = w.group_name AND a.status = 'waiting' \
                 AND a.patterns <> g.patterns{topic}) \
               ORDER BY w.group_name LIMIT {p}2) \
             ORDER BY e.group_name"
        );
    }
    format!(
        "SELECT {EFFECTIVE_COLUMNS}{columns} FROM effective_declaration e{joins} \
         WHERE e.group_name > {p}1{topic} ORDER BY e.group_name LIMIT {p}2"
    )
}

/// How far a summary counts a group's waiters and instances: beyond it, `more` is true.
pub const COUNT_CAP: u32 = 100;

/// How far a group's open waiters are counted: one past the listing's cap, so `more` can be
/// told.
pub(crate) const WAITER_FETCH: u32 = COUNT_CAP + 1;

/// The columns a Postgres page of waiting groups adds to each effective row: the group's open
/// waiters counted up to [`WAITER_FETCH`] and the oldest one's row.
pub(crate) const WAITER_COLUMNS: &str = ", e.waiters, e.oldest_declarer, e.oldest_version, \
     e.oldest_patterns, e.oldest_incumbent, e.oldest_declared_at, e.oldest_attempt_at";

/// The oldest open waiter of the group `group` names, whose effective set is `patterns`, with
/// the group's count of open waiters (up to [`WAITER_FETCH`]) beside it, as the body of a
/// subquery: one walk of the partial index of waiting attempts in its key order, which stops
/// at the cap (an unordered count under a `LIMIT` was planned as a bitmap of every entry). An
/// attempt for the set already in effect is not open (its resolution may not be projected
/// yet). No row when the group has no open waiter.
pub(crate) fn oldest_waiter(group: &str, patterns: &str) -> String {
    format!(
        "SELECT w.*, COUNT(*) OVER () AS waiters FROM ( \
           SELECT a.declarer, a.version, a.patterns, a.incumbent, a.declared_at, \
             a.attempt_at FROM declarer_attempt a \
           WHERE a.group_name = {group} AND a.status = 'waiting' \
           AND a.patterns <> {patterns} ORDER BY a.declared_at, a.declarer \
           LIMIT {WAITER_FETCH}) w \
         ORDER BY w.declared_at, w.declarer LIMIT 1"
    )
}
