//! Plans of the reads that serve a listing (ADR 0024), on tables with enough rows that a
//! scan shows, with statistics taken while they were empty.
//!
//! - Postgres: every statement of the catch-up check, the catch-up batch, a page of groups (each
//!   filter), one group and its member pages runs under `EXPLAIN (ANALYZE, BUFFERS, FORMAT
//!   JSON)` with custom and with generic plans; none may scan `events` or a listing table
//!   sequentially, and each touches a bounded number of buffers. The former catch-up check,
//!   `EXISTS (... position > (subquery))`, is run too, and must be caught: the detector works.
//! - A group's history page (`QUERY_EVENTS`) is among them (no scan; on SQLite no sort).
//! - SQLite: `EXPLAIN QUERY PLAN` of the same statements shows no `SCAN` of those tables and
//!   no sort of what a search found (`USE TEMP B-TREE`); a page of waiting groups does not walk
//!   `effective_declaration` by a range of names (ADR 0044; the former walk must be caught).
//!
//! `SHOW_PLANS=1` prints the plan of every statement caught scanning.

use serde_json::Value;
use sqlx::postgres::PgArguments;
use sqlx::Arguments;
use wharf::store::Store;
use wharf_projections::rows::{
    one_sql, page_sql, PG_GROUP_READ, PG_GROUP_ROWS, PG_INSTANCES, PG_WAITERS, SQLITE_INSTANCES,
    SQLITE_WAITERS,
};
use wharf_projections::summary::{pg_page_sql, pg_summary_sql, sqlite_summary_sql};
use wharf_tests::{Backend, TestStore};

const WATCHED: [&str; 5] = [
    "events",
    "effective_declaration",
    "declarer_attempt",
    "waiting_group",
    "worker_instance",
];
const GROUPS: i64 = 20_000;
const EVENTS: i64 = 200_000;
/// What a keyed read of a few rows may touch.
const KEYED: i64 = 100;
/// What a page of 101 groups may touch: a few buffers per group, its filter's skipped rows
/// within the page's index range included (a topic's groups without a waiter, read through a
/// bitmap when the statistics are stale).
const PAGE: i64 = 1_000;
/// What a summary page of 101 groups may touch (ADR 0038): the page's own walk (for the
/// waiting groups a lookup per group, whose walk of its waiters admits it: ADR 0060, 0061)
/// and per group two keyed probes, its waiters' walk (at most 101) and its instances, heap
/// fetches included (nothing is vacuumed here): about 720 by name and 1,730 of waiting groups
/// measured with the skip of ADR 0044, less since.
const SUMMARY_PAGE: i64 = 2_500;
/// A summary page with its groups' queue figures (ADR 0072): per group its `consumer_group`
/// row, its deliveries, its topic's head, its oldest delivery's message, its dead letters and
/// set-aside rows, each by key.
const SUMMARY_PAGE_WITH_FIGURES: i64 = 4_000;

/// Builds a summary page's statement for a form (by topic, of waiting groups).
type SummaryStatement = fn(bool, bool) -> String;

/// Every sequential scan of a watched table in a plan tree, and the root's buffers.
fn scans(plan: &Value, found: &mut Vec<String>) {
    let relation = plan["Relation Name"].as_str().unwrap_or_default();
    if plan["Node Type"] == "Seq Scan" && WATCHED.contains(&relation) {
        found.push(relation.to_owned());
    }
    for child in plan["Plans"].as_array().into_iter().flatten() {
        scans(child, found);
    }
}

fn buffers(plan: &Value) -> i64 {
    plan["Shared Hit Blocks"].as_i64().unwrap_or(0)
        + plan["Shared Read Blocks"].as_i64().unwrap_or(0)
}

/// Fills the tables the way a large store looks after statistics were taken on it empty.
async fn large_store_with_stale_statistics(conn: &mut sqlx::PgConnection) {
    wharf_tests::analyze_own_tables(conn).await;
    for statement in [
        format!(
            "INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, \
             event_version, payload, metadata) SELECT 'bulk', 'b' || (i % 1000), i, 'Bulk', '1', \
             '{{}}', '{{}}' FROM generate_series(1, {EVENTS}) i"
        ),
        format!(
            "INSERT INTO effective_declaration (group_name, topic, declarer, version, patterns, \
             previous, declared_at, attempt_at, position, installs) SELECT 'g' || lpad(i::text, 6, '0'), \
             't' || (i % 50), 'd', '1', ARRAY['a/#'], NULL, now(), now(), i, 1 \
             FROM generate_series(1, {GROUPS}) i"
        ),
        format!(
            "INSERT INTO declarer_attempt (group_name, declarer, status, version, patterns, \
             incumbent, declared_at, attempt_at, position) SELECT 'g' || lpad(i::text, 6, '0'), \
             'w' || j, CASE WHEN j = 0 AND i % 100 = 7 THEN 'waiting' ELSE 'resolved' END, '1', \
             ARRAY['b/#'], ARRAY['a/#'], now() + j * interval '1 s', now(), i * 10 + j \
             FROM generate_series(1, {GROUPS}) i, generate_series(0, 4) j"
        ),
        format!(
            "INSERT INTO worker_instance (group_name, declarer, topic, version, patterns, \
             started_at, heartbeat_at) SELECT 'g' || lpad(i::text, 6, '0'), 'i' || j, 't', '1', \
             ARRAY['a/#'], now(), now() FROM generate_series(1, {GROUPS}) i, generate_series(0, 2) j"
        ),
        // A crash-looping deploy: one group inside the pages' range holds 20k waiting
        // attempts, every one of a new declarer.
        "INSERT INTO declarer_attempt (group_name, declarer, status, version, patterns, \
         incumbent, declared_at, attempt_at, position) SELECT 'g005007', 'crash' || k, \
         'waiting', '1', ARRAY['b/#'], ARRAY['a/#'], now() + k * interval '1 ms', now(), \
         1000000 + k FROM generate_series(1, 20000) k"
            .to_owned(),
        "INSERT INTO waiting_group (group_name) \
         SELECT DISTINCT group_name FROM declarer_attempt WHERE status = 'waiting'"
            .to_owned(),
        "INSERT INTO projection_checkpoint (projector, position) \
         SELECT 'declarer_attempts', MAX(position) FROM events"
            .to_owned(),
    ] {
        sqlx::query(&statement).execute(&mut *conn).await.unwrap();
    }
}

/// Runs `sql` with the arguments `args` makes under both plan modes; returns the watched
/// tables it scanned sequentially, and checks that a plan that scans none touches at most
/// `max_buffers` buffers. (A sequential scan of `events` here touches about 1,900.)
async fn explain(
    conn: &mut sqlx::PgConnection,
    what: &str,
    sql: &str,
    max_buffers: i64,
    args: impl Fn() -> PgArguments,
) -> Vec<String> {
    let explain = format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}");
    let mut scanned = Vec::new();
    for mode in ["force_custom_plan", "force_generic_plan"] {
        sqlx::query(&format!("SET plan_cache_mode = {mode}"))
            .execute(&mut *conn)
            .await
            .unwrap();
        let (plan,): (Value,) = sqlx::query_as_with(&explain, args())
            .fetch_one(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let root = &plan[0]["Plan"];
        let mut found = Vec::new();
        scans(root, &mut found);
        if found.is_empty() {
            assert!(
                buffers(root) <= max_buffers,
                "{what} ({mode}) touched {} buffers: {plan}",
                buffers(root)
            );
        }
        if !found.is_empty() && std::env::var("SHOW_PLANS").is_ok() {
            println!("{what} ({mode}): {plan}");
        }
        scanned.extend(found.into_iter().map(|t| format!("{what} ({mode}): {t}")));
    }
    scanned
}

/// Takes on (or, with `on` false, resets) the settings `wharf_group_summaries` plans its
/// statements under, as the function declares them (every path but an index's off; migration
/// 0022, ADR 0058), but for the plan cache mode, which [`explain`] sets itself. A statement
/// that runs only inside the function is checked as it is planned there: on a waiting group
/// table of 150 rows that statistics taken empty put at 45, left to itself the planner sorts
/// the whole table's groups, each looked up, after a sequential scan.
async fn listing_call_settings(conn: &mut sqlx::PgConnection, on: bool) {
    let (config,): (Vec<String>,) = sqlx::query_as(
        "SELECT p.proconfig FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
         WHERE n.nspname = current_schema() AND p.proname = 'wharf_group_summaries'",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    for setting in config {
        let (name, value) = setting.split_once('=').expect("name=value");
        if name == "plan_cache_mode" || name == "search_path" {
            continue;
        }
        let statement = if on {
            format!("SET {name} = {value}")
        } else {
            format!("RESET {name}")
        };
        sqlx::query(&statement).execute(&mut *conn).await.unwrap();
    }
}

/// Arguments from values of one type each call site gives.
macro_rules! args {
    ($($value:expr),* $(,)?) => {
        || {
            let mut args = PgArguments::default();
            $( args.add($value).unwrap(); )*
            args
        }
    };
}

#[tokio::test]
async fn postgres_listing_reads_never_scan_the_ledger_or_other_groups() {
    let store = TestStore::new(Backend::Postgres).await;
    let Store::Postgres(pg) = &store.store else {
        unreachable!("a Postgres test store")
    };
    let mut conn = pg.pool().acquire().await.unwrap();
    large_store_with_stale_statistics(&mut conn).await;
    let head: i64 = sqlx::query_scalar("SELECT MAX(position) FROM events")
        .fetch_one(&mut *conn)
        .await
        .unwrap();

    let old_check = "SELECT EXISTS (SELECT 1 FROM events WHERE position > COALESCE( \
         (SELECT position FROM projection_checkpoint WHERE projector = $1), 0))";
    let caught = explain(
        &mut conn,
        "the former check",
        old_check,
        i64::MAX,
        args!["declarer_attempts"],
    )
    .await;
    assert!(
        caught.iter().any(|s| s.ends_with("events")),
        "the detector must catch the former catch-up check's scan: {caught:?}"
    );

    let group = vec!["g010000".to_owned()];
    let none_at: Option<chrono::DateTime<chrono::Utc>> = None;
    let none_declarer: Option<String> = None;
    let mut scanned = Vec::new();
    scanned.extend(
        explain(
            &mut conn,
            "catch-up check",
            wharf::store::postgres::CATCH_UP_CHECK,
            KEYED,
            args!["declarer_attempts"],
        )
        .await,
    );
    scanned.extend(
        explain(
            &mut conn,
            "catch-up batch",
            wharf::store::postgres::EVENTS_IN_RANGE,
            KEYED,
            args![head - 500, head],
        )
        .await,
    );
    // A page by name or topic runs as it is (the Postgres read backend's `page`); the page of
    // waiting groups and the summary page run only inside `wharf_group_summaries`, under its
    // settings (ADR 0058).
    for (topic, waiting) in [(false, false), (false, true), (true, false), (true, true)] {
        let what = if topic {
            format!("page by topic waiting={waiting}")
        } else {
            format!("page waiting={waiting}")
        };
        let sql = page_sql('$', topic, waiting);
        listing_call_settings(&mut conn, waiting).await;
        scanned.extend(if topic {
            let args = args!["g005000", 101_i64, "t7"];
            explain(&mut conn, &what, &sql, PAGE, args).await
        } else {
            explain(&mut conn, &what, &sql, PAGE, args!["g005000", 101_i64]).await
        });
    }
    // The summary page (ADR 0038): one statement with the clock and the catch-up check, each
    // group's waiter count bounded. Past the crash-looping group (20k waiting attempts) too.
    // Also with each group's queue figures (ADR 0072), a few keyed probes more per group.
    const TTL_MICROS: i64 = 60_000_000;
    listing_call_settings(&mut conn, true).await;
    let forms: [(&str, SummaryStatement, i64); 2] = [
        ("summary page", pg_summary_sql, SUMMARY_PAGE),
        (
            "summary page with figures",
            pg_page_sql,
            SUMMARY_PAGE_WITH_FIGURES,
        ),
    ];
    for ((form, build, bound), (topic, waiting)) in forms.into_iter().flat_map(|form| {
        [(false, false), (false, true), (true, false), (true, true)].map(|case| (form, case))
    }) {
        let what = format!("{form} topic={topic} waiting={waiting}");
        let sql = build(topic, waiting);
        let topic = topic.then_some("t7");
        scanned.extend(
            explain(
                &mut conn,
                &what,
                &sql,
                bound,
                args![
                    "g005000",
                    101_i64,
                    topic,
                    waiting,
                    "declarer_attempts",
                    TTL_MICROS
                ],
            )
            .await,
        );
    }
    // A summary reads at most the cap of a group's waiters, under either plan: no node reads
    // the whole list, which a bitmap under a count would (its buffers alone do not show it:
    // 20k waiting attempts fill a few hundred pages). A page of the crash-looping group alone,
    // so each node's rows are that group's (EXPLAIN averages rows over loops). Counting
    // every open waiter instead of at most 101 reads all 20k of them, and must be caught.
    for waiting in [false, true] {
        let most = max_node_rows(
            &mut conn,
            &pg_summary_sql(false, waiting),
            args![
                "g005006",
                1_i64,
                None::<&str>,
                waiting,
                "declarer_attempts",
                TTL_MICROS
            ],
        )
        .await;
        assert!(
            most <= 101,
            "summary waiting={waiting}: a node yields {most} rows"
        );
    }
    let uncapped = pg_summary_sql(false, false).replace(
        "ORDER BY a.declared_at, a.declarer LIMIT 101) w",
        "ORDER BY a.declared_at, a.declarer) w",
    );
    assert_ne!(
        uncapped,
        pg_summary_sql(false, false),
        "the waiter count is capped"
    );
    let most = max_node_rows(
        &mut conn,
        &uncapped,
        args![
            "g005006",
            1_i64,
            None::<&str>,
            false,
            "declarer_attempts",
            TTL_MICROS
        ],
    )
    .await;
    assert!(
        most >= 20_000,
        "the row bound must catch an uncapped count ({most} rows)"
    );
    listing_call_settings(&mut conn, false).await;
    // One group in one statement: its effective row, a page of each list, the clock, the
    // check; the crash-looping group's first waiters and a group's instances after a key;
    // without its queue figures and with them (ADR 0071).
    for (what, statement, group, at, declarer, instances_after) in [
        (
            "one-statement group (crash-looping)",
            PG_GROUP_ROWS,
            "g005007",
            none_at,
            none_declarer.clone(),
            "",
        ),
        (
            "one-statement group",
            PG_GROUP_ROWS,
            "g010000",
            none_at,
            none_declarer.clone(),
            "i0",
        ),
        (
            "one-statement group with its figures (crash-looping)",
            PG_GROUP_READ,
            "g005007",
            none_at,
            none_declarer.clone(),
            "",
        ),
    ] {
        scanned.extend(
            explain(
                &mut conn,
                what,
                statement,
                PAGE,
                args![
                    group,
                    at,
                    declarer.clone(),
                    101_i64,
                    instances_after,
                    "declarer_attempts"
                ],
            )
            .await,
        );
    }
    // Its waiter page stops at the page, under either plan (a node's rows: its one loop); the
    // node that appends the statement's rows holds the group's row and both pages at most.
    let most = max_node_rows(
        &mut conn,
        PG_GROUP_ROWS,
        args![
            "g005007",
            none_at,
            none_declarer.clone(),
            101_i64,
            "",
            "declarer_attempts"
        ],
    )
    .await;
    assert!(
        most <= 1 + 2 * 101,
        "one-statement group: a node yields {most} rows"
    );
    // The former page of waiting groups walked every waiting attempt from the cursor: past
    // the crash-looping group, 20k of them. The bound must catch it.
    let former_waiting = "SELECT DISTINCT ON (a.group_name) e.group_name FROM declarer_attempt a \
         CROSS JOIN LATERAL (SELECT * FROM effective_declaration g \
           WHERE g.group_name = a.group_name LIMIT 1) e \
         WHERE a.status = 'waiting' AND a.group_name > $1 AND a.patterns <> e.patterns \
         ORDER BY a.group_name LIMIT $2";
    let former = root_buffers(&mut conn, former_waiting, args!["g005000", 101_i64]).await;
    assert!(
        former > PAGE,
        "the bound must catch the former waiting page ({former} buffers)"
    );
    scanned.extend(
        explain(
            &mut conn,
            "waiters of the crash-looping group",
            PG_WAITERS,
            PAGE,
            args![
                vec!["g005007".to_owned()],
                none_at,
                none_declarer.clone(),
                101_i64
            ],
        )
        .await,
    );
    scanned.extend(
        explain(
            &mut conn,
            "one group",
            &one_sql('$'),
            KEYED,
            args!["g010000"],
        )
        .await,
    );
    scanned.extend(
        explain(
            &mut conn,
            "waiters",
            PG_WAITERS,
            KEYED,
            args![group.clone(), none_at, none_declarer.clone(), 101_i64],
        )
        .await,
    );
    scanned.extend(
        explain(
            &mut conn,
            "instances",
            PG_INSTANCES,
            KEYED,
            args![group.clone(), "", 101_i64],
        )
        .await,
    );
    // A group's history page: keyed by (aggregate, sequence) from the cursor's sequence, on
    // an aggregate of 200 events spread over the whole ledger.
    let aggregate = "b7";
    let cursor: i64 = sqlx::query_scalar(
        "SELECT position FROM events WHERE aggregate_type = 'bulk' AND aggregate_id = $1 \
         ORDER BY sequence OFFSET 19 LIMIT 1",
    )
    .bind(aggregate)
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    let none_time: Option<chrono::DateTime<chrono::Utc>> = None;
    // It runs unnamed, planned per call; with these statistics (taken while empty) Postgres
    // may still read the aggregate's events through a bitmap (ADR 0036, open), never a scan.
    for (what, after) in [
        ("history, first page", 0_i64),
        ("history after a cursor", cursor),
    ] {
        scanned.extend(
            explain(
                &mut conn,
                what,
                wharf::store::postgres::QUERY_EVENTS,
                i64::MAX,
                args![
                    "bulk",
                    aggregate,
                    after,
                    none_time,
                    none_time,
                    none_declarer.clone(),
                    none_declarer.clone(),
                    20_i64
                ],
            )
            .await,
        );
    }
    assert!(scanned.is_empty(), "sequential scans: {scanned:?}");
}

/// The most rows any node of `sql`'s plan yields per loop, under custom and generic plans.
async fn max_node_rows(
    conn: &mut sqlx::PgConnection,
    sql: &str,
    args: impl Fn() -> PgArguments,
) -> i64 {
    fn most(plan: &Value) -> i64 {
        let own = plan["Actual Rows"].as_i64().unwrap_or(0);
        plan["Plans"]
            .as_array()
            .into_iter()
            .flatten()
            .map(most)
            .fold(own, i64::max)
    }
    let mut found = 0;
    for mode in ["force_custom_plan", "force_generic_plan"] {
        sqlx::query(&format!("SET plan_cache_mode = {mode}"))
            .execute(&mut *conn)
            .await
            .unwrap();
        let (plan,): (Value,) =
            sqlx::query_as_with(&format!("EXPLAIN (ANALYZE, FORMAT JSON) {sql}"), args())
                .fetch_one(&mut *conn)
                .await
                .unwrap();
        if std::env::var("SHOW_PLANS").is_ok() {
            println!("{mode}: {plan}");
        }
        found = found.max(most(&plan[0]["Plan"]));
    }
    found
}

/// The buffers `sql` touches under a custom plan.
async fn root_buffers(
    conn: &mut sqlx::PgConnection,
    sql: &str,
    args: impl Fn() -> PgArguments,
) -> i64 {
    sqlx::query("SET plan_cache_mode = force_custom_plan")
        .execute(&mut *conn)
        .await
        .unwrap();
    let (plan,): (Value,) = sqlx::query_as_with(
        &format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}"),
        args(),
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    buffers(&plan[0]["Plan"])
}

/// SQLite's page of waiting groups before ADR 0044: a walk of every group by name from the
/// cursor, probing each for an open waiter (ten groups passed per waiting one in the bench).
const SQLITE_FORMER_WAITING: &str = "SELECT e.group_name FROM effective_declaration e \
     WHERE e.group_name > ?1 AND EXISTS (SELECT 1 FROM declarer_attempt a \
       WHERE a.group_name = e.group_name AND a.status = 'waiting' \
       AND a.patterns <> e.patterns) ORDER BY e.group_name LIMIT ?2";

#[tokio::test]
async fn sqlite_listing_reads_search_by_key() {
    let store = TestStore::new(Backend::Sqlite).await;
    let Store::Sqlite(sqlite) = &store.store else {
        unreachable!("a SQLite test store")
    };
    let statements = vec![
        (
            "catch-up check",
            wharf::store::sqlite::CATCH_UP_CHECK.to_owned(),
        ),
        (
            "catch-up batch",
            wharf::store::sqlite::EVENTS_IN_RANGE.to_owned(),
        ),
        ("page", page_sql('?', false, false)),
        ("page by topic", page_sql('?', true, false)),
        ("page of waiting groups", page_sql('?', false, true)),
        ("page by topic of waiting groups", page_sql('?', true, true)),
        (
            "page of waiting groups by a walk of every group (must be caught)",
            SQLITE_FORMER_WAITING.to_owned(),
        ),
        ("one group", one_sql('?')),
        ("waiters", SQLITE_WAITERS.to_owned()),
        ("instances", SQLITE_INSTANCES.to_owned()),
        ("summary page", sqlite_summary_sql(false, false)),
        ("summary page by topic", sqlite_summary_sql(true, false)),
        (
            "summary page of waiting groups",
            sqlite_summary_sql(false, true),
        ),
        (
            "summary page by topic of waiting groups",
            sqlite_summary_sql(true, true),
        ),
        (
            "queue figures of a page",
            wharf_queue::plans::sqlite_group_figures(),
        ),
        ("history", wharf::store::sqlite::QUERY_EVENTS.to_owned()),
        (
            "a sort of the group's history (must be caught)",
            "SELECT * FROM events WHERE aggregate_type = ?1 AND aggregate_id = ?2 \
             AND position > ?3 ORDER BY position LIMIT ?4"
                .to_owned(),
        ),
        (
            "a scan (must be caught)",
            "SELECT COUNT(*) FROM events WHERE event_type = ?1".to_owned(),
        ),
    ];
    let plans = sqlite
        .read(move |conn| {
            let mut plans = Vec::new();
            for (what, sql) in statements {
                let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))?;
                let nulls = vec![rusqlite::types::Null; stmt.parameter_count()];
                let lines: Vec<String> = stmt
                    .query_map(rusqlite::params_from_iter(nulls), |row| {
                        row.get::<_, String>(3)
                    })?
                    .collect::<Result<_, _>>()?;
                plans.push((what, lines));
            }
            Ok(plans)
        })
        .await
        .unwrap();
    for (what, lines) in plans {
        // `SCAN x` (with or without `USING ... INDEX`) reads every row of x; `SEARCH` is keyed;
        // a temporary B-tree sorts every row the search found before the first is returned.
        // The names a page's queue figures are read for (`json_each`) are not a table. A page
        // of waiting groups must not walk the groups by a range of names
        // (`effective_declaration ... (group_name>?)`): it walks `waiting_group` by a range of
        // its key and looks each group up by equality (ADR 0044, ADR 0060).
        let waiting_page = what.contains("waiting groups");
        let scans: Vec<&String> = lines
            .iter()
            .filter(|line| {
                (line.starts_with("SCAN ")
                    && *line != "SCAN CONSTANT ROW"
                    && !line.starts_with("SCAN json_each VIRTUAL TABLE")
                    && !line.starts_with("SCAN (subquery-"))
                    || line.contains("TEMP B-TREE")
                    || (waiting_page
                        && line.contains("effective_declaration")
                        && line.contains(">?"))
            })
            .collect();
        if what.ends_with("(must be caught)") {
            assert!(!scans.is_empty(), "the detector missed a scan: {lines:?}");
        } else {
            assert!(scans.is_empty(), "{what} scans: {lines:?}");
        }
    }
}
