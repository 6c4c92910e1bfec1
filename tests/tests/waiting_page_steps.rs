//! What SQLite's page of waiting groups costs (ADR 0044), counted in virtual machine steps
//! (`sqlite3_stmt_status(SQLITE_STMTSTATUS_VM_STEP)`) on a store of 20,000 groups where one in
//! a hundred has an open waiter and one of those is a crash-looping group with 20,000.
//!
//! The page must cost the groups with waiting attempts it passes, not every group after the
//! cursor: its steps stay within a few times those of a plain page by name of the same size,
//! where the former walk of every group (probing each) took about a hundred times as many,
//! and must be caught by the same bound. Both answer the same groups in the same order.

use rusqlite::{Connection, StatementStatus};
use wharf::store::{SqliteStore, Store};
use wharf_projections::rows::page_sql;
use wharf_tests::{Backend, TestStore};

const GROUPS: i64 = 20_000;
/// The crash-looping group's waiting attempts.
const LOOPING: i64 = 20_000;
/// A page and the row that says another follows.
const FETCH: i64 = 101;
/// How many times a page by name's steps a page of waiting groups may take.
const BOUND: i64 = 8;

/// The former statement (a walk of every group by name from the cursor, probing each).
const FORMER: &str = "SELECT e.group_name FROM effective_declaration e \
     WHERE e.group_name > ?1 AND EXISTS (SELECT 1 FROM declarer_attempt a \
       WHERE a.group_name = e.group_name AND a.status = 'waiting' \
       AND a.patterns <> e.patterns) ORDER BY e.group_name LIMIT ?2";

/// The store: `GROUPS` groups, one in `every` (`i % every = 7 % every`) with an open waiter,
/// and `g010007`, one of those, with `LOOPING` more.
fn fill_sql(every: i64) -> String {
    format!(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < {GROUPS})
         INSERT INTO effective_declaration (group_name, topic, declarer, version, patterns,
             previous, declared_at, attempt_at, position, installs)
         SELECT printf('g%06d', i), 't' || (i % 10), 'd', '1', '[\"a/#\"]', NULL, i, i, i + 1, 1
         FROM n;
         WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < {GROUPS})
         INSERT INTO declarer_attempt (group_name, declarer, status, version, patterns,
             incumbent, declared_at, attempt_at, position)
         SELECT printf('g%06d', i), 'w',
             CASE WHEN i % {every} = 7 % {every} THEN 'waiting' ELSE 'resolved' END,
             '2', '[\"b/#\"]', '[\"a/#\"]', i, i, i + 1
         FROM n;
         WITH RECURSIVE k(j) AS (SELECT 0 UNION ALL SELECT j + 1 FROM k WHERE j + 1 < {LOOPING})
         INSERT INTO declarer_attempt (group_name, declarer, status, version, patterns,
             incumbent, declared_at, attempt_at, position)
         SELECT 'g010007', 'loop-' || j, 'waiting', '2', '[\"b/#\"]', '[\"a/#\"]', j, j, j + 1
         FROM k;
         INSERT OR IGNORE INTO waiting_group (group_name)
         SELECT group_name FROM declarer_attempt WHERE status = 'waiting';"
    )
}

/// A fresh SQLite store filled by [`fill_sql`] with one group in `every` waiting.
async fn filled(every: i64) -> TestStore {
    let store = TestStore::new(Backend::Sqlite).await;
    let fill = fill_sql(every);
    sqlite_of(&store)
        .write(move |ctx| Ok(ctx.tx.execute_batch(&fill)?))
        .await
        .expect("fill the store");
    store
}

fn sqlite_of(store: &TestStore) -> &SqliteStore {
    let Store::Sqlite(sqlite) = &store.store else {
        unreachable!("a SQLite test store")
    };
    sqlite
}

/// The group names `sql` answers for `after` (and `topic` when given), and its steps.
fn run(conn: &Connection, sql: &str, after: &str, topic: Option<&str>) -> (Vec<String>, i64) {
    let mut stmt = conn.prepare(sql).expect("prepare");
    let names: Vec<String> = match topic {
        Some(topic) => stmt
            .query_map(rusqlite::params![after, FETCH, topic], |r| r.get(0))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows"),
        None => stmt
            .query_map(rusqlite::params![after, FETCH], |r| r.get(0))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows"),
    };
    (names, i64::from(stmt.get_status(StatementStatus::VmStep)))
}

#[tokio::test]
async fn a_page_of_waiting_groups_costs_the_waiting_groups_it_passes() {
    let store = filled(100).await;
    let sqlite = sqlite_of(&store);
    let results = sqlite
        .read(|conn| {
            let mut out = Vec::new();
            for after in ["", "g010000", "g019950"] {
                let plain = run(conn, &page_sql('?', false, false), after, None);
                let new = run(conn, &page_sql('?', false, true), after, None);
                let former = run(conn, FORMER, after, None);
                out.push((after, None, plain, new, former));
            }
            // A topic's waiting groups: t7 holds every waiting group (i % 100 = 7).
            let topic_former = FORMER.replace(
                "WHERE e.group_name > ?1",
                "WHERE e.group_name > ?1 AND e.topic = ?3",
            );
            for after in ["", "g010000"] {
                let plain = run(conn, &page_sql('?', true, false), after, Some("t7"));
                let new = run(conn, &page_sql('?', true, true), after, Some("t7"));
                let former = run(conn, &topic_former, after, Some("t7"));
                out.push((after, Some("t7"), plain, new, former));
            }
            Ok(out)
        })
        .await
        .expect("read the pages");
    for (after, topic, (plain, plain_steps), (new, new_steps), (former, former_steps)) in results {
        let what = format!("after {after:?}, topic {topic:?}");
        assert_eq!(new, former, "{what}: the same groups in the same order");
        let expected: Vec<String> = (0..GROUPS)
            .filter(|i| i % 100 == 7)
            .map(|i| format!("g{i:06}"))
            .filter(|name| name.as_str() > after)
            .take(FETCH as usize)
            .collect();
        assert_eq!(
            new, expected,
            "{what}: every waiting group after the cursor"
        );
        let bound = BOUND * plain_steps.max(1);
        assert!(
            !plain.is_empty() && new_steps <= bound,
            "{what}: the page of waiting groups took {new_steps} steps, over {BOUND} x a \
             page by name ({plain_steps})"
        );
        // Near the end a page holds few groups and both walks are short; from the start
        // and the middle the former walk passes a hundred groups per waiting one.
        if new.len() == FETCH as usize {
            assert!(
                former_steps > bound,
                "{what}: the bound must catch the former walk ({former_steps} steps, \
                 bound {bound})"
            );
        }
    }
}

/// Every group waiting: the page must stop at its limit; a fleet where few groups wait cannot
/// tell. The bundled SQLite once materialized the page's former recursion through the waiting
/// index whole (every waiting group after the cursor, 10 ms at 10,000 groups and 104 ms at
/// 100,000 after a rebuild); since ADR 0060 the page walks `waiting_group`, whose walk the
/// `LIMIT` must stop just the same.
#[tokio::test]
async fn a_page_of_waiting_groups_stops_at_its_limit_when_every_group_waits() {
    let store = filled(1).await;
    let sqlite = sqlite_of(&store);
    let results = sqlite
        .read(|conn| {
            let mut out = Vec::new();
            for after in ["", "g010000"] {
                let plain = run(conn, &page_sql('?', false, false), after, None);
                let new = run(conn, &page_sql('?', false, true), after, None);
                out.push((after, plain, new));
            }
            Ok(out)
        })
        .await
        .expect("read the pages");
    for (after, (plain, plain_steps), (new, new_steps)) in results {
        assert_eq!(
            new, plain,
            "after {after:?}: every group waits, so the same page"
        );
        assert_eq!(new.len(), FETCH as usize);
        let bound = BOUND * plain_steps.max(1);
        assert!(
            new_steps <= bound,
            "after {after:?}: the page of waiting groups took {new_steps} steps, over {BOUND} x \
             a page by name ({plain_steps}): the recursion ran past the page"
        );
    }
}
