//! The walks a page of the group listing takes through `effective_declaration` (ADR 0024,
//! 0036, 0044): by name, by `(topic, group_name)`, or, for the page of waiting groups, a skip
//! through the partial index of waiting attempts one group at a time.
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
/// topic). With `waiting` it skips through the partial index of waiting attempts one group at
/// a time (a recursive loose index scan: each step is one index descent to the next group
/// name with a waiting attempt) and looks each such group up by key, with its first open
/// waiter, so a page costs the groups with waiting attempts it passes, not their attempts
/// (walking every waiting attempt read all 100k of a crash-looping group's, 0.9 s on
/// Postgres) and not the groups without one (walking the groups by name and probing each,
/// SQLite's former statement, passed ten groups per waiting one in the `listing` bench's
/// fleet: 28 ms p99 at 10k groups).
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
        // recursion yields group names in order and is evaluated only as far as the LIMIT
        // pulls; the outer ORDER BY sorts the page, never the recursion. Each group is looked
        // up as the first name from the one sought, then checked equal: only the primary key
        // gives that order, where an equality on the name alone ties, in a plan made on empty
        // tables, with a walk of the whole `(topic, group_name)` index (ADR 0058).
        let topic = topic.replace("e.topic", "g.topic");
        let (first, step) = (next_waiting(&format!("{p}1")), next_waiting("w.name"));
        return format!(
            "SELECT {EFFECTIVE_COLUMNS}{columns} FROM ( \
               WITH RECURSIVE waiting(name) AS ( \
                 {first} UNION ALL SELECT {step} \
                 FROM waiting w WHERE w.name IS NOT NULL) \
               SELECT g.* FROM waiting w CROSS JOIN LATERAL ( \
                 SELECT g.* FROM ( \
                   SELECT * FROM effective_declaration g WHERE g.group_name >= w.name \
                   ORDER BY g.group_name LIMIT 1) g CROSS JOIN LATERAL ( \
                   SELECT 1 FROM declarer_attempt a WHERE a.group_name = g.group_name \
                   AND a.status = 'waiting' AND a.patterns <> g.patterns \
                   ORDER BY a.declared_at, a.declarer LIMIT 1) open \
                 WHERE g.group_name = w.name{topic} LIMIT 1) g \
               LIMIT {p}2) e{joins} \
             ORDER BY e.group_name"
        );
    }
    if waiting {
        // The same skip on SQLite. A recursive CTE joined to a table is materialized whole
        // before the join (every waiting group after the cursor); as the only table of a
        // subquery it runs as a co-routine that the LIMIT stops. So the skip and the open
        // waiter's probe are the `IN` list's own subquery, and the page looks its groups up
        // by key in the list's order (no sort). `NOT MATERIALIZED` keeps the recursion a
        // co-routine: without it the bundled SQLite chose to materialize it whole, every
        // waiting group after the cursor (tests/tests/waiting_page_steps.rs).
        let topic = topic.replace("e.topic", "g.topic");
        let (first, step) = (
            next_waiting(&format!("{p}1")),
            next_waiting("waiting_group.name"),
        );
        return format!(
            "SELECT {EFFECTIVE_COLUMNS}{columns} FROM effective_declaration e{joins} \
             WHERE e.group_name IN ( \
               WITH RECURSIVE waiting_group(name) AS NOT MATERIALIZED ( \
                 SELECT {first} UNION ALL SELECT {step} \
                 FROM waiting_group WHERE waiting_group.name IS NOT NULL) \
               SELECT waiting_group.name FROM waiting_group WHERE EXISTS ( \
                 SELECT 1 FROM declarer_attempt a \
                 JOIN effective_declaration g ON g.group_name = a.group_name \
                 WHERE a.group_name = waiting_group.name AND a.status = 'waiting' \
                 AND a.patterns <> g.patterns{topic}) \
               LIMIT {p}2) \
             ORDER BY e.group_name"
        );
    }
    format!(
        "SELECT {EFFECTIVE_COLUMNS}{columns} FROM effective_declaration e{joins} \
         WHERE e.group_name > {p}1{topic} ORDER BY e.group_name LIMIT {p}2"
    )
}

/// One step of the skip: the first group name after `after` with a waiting attempt, as a
/// parenthesized scalar subquery (one descent of the partial index of waiting attempts).
fn next_waiting(after: &str) -> String {
    format!(
        "(SELECT a.group_name FROM declarer_attempt a \
         WHERE a.status = 'waiting' AND a.group_name > {after} \
         ORDER BY a.group_name LIMIT 1)"
    )
}
