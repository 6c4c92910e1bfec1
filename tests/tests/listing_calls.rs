//! The Postgres listing reads as cached calls (ADR 0046): `wharf_group_summaries`,
//! `wharf_group_page`, `wharf_group_rows`, `wharf_group_figures` and `wharf_group_read`
//! (Postgres migrations 0015, 0022, 0027, 0028, 0029 and 0030).
//!
//! - Each function runs exactly the statements the plan tests (`read_plans.rs`) check, the
//!   texts in `projections` and `queue` (whitespace aside), and plans them once per connection
//!   with every path but an index's off (ADR 0058) and JIT compilation off: a function that
//!   kept a statement of its own, or let a plan follow the statistics, would not be what the
//!   plan tests hold to their bounds.
//! - A connection that made its plans while the tables were empty (on statistics taken while
//!   empty) still reads a page of a large store by key afterwards (the buffers of the call, its
//!   statement's included).
//! - SQLite's summary page is one statement per page, not statements per group: its virtual
//!   machine steps stay within a bound per listed group, with a crash-looping group on the page
//!   and every group waiting (a page of waiting groups whose walk were materialized whole
//!   would step through all 2,000).

use rusqlite::StatementStatus;
use serde_json::Value;
use wharf::store::Store;
use wharf_projections::rows::{PG_GROUP_READ, PG_GROUP_ROWS};
use wharf_projections::summary::{pg_page_sql, pg_summary_sql, sqlite_summary_sql};
use wharf_tests::{Backend, TestStore};

/// Whitespace collapsed to single spaces.
fn normalized(sql: &str) -> String {
    sql.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[tokio::test]
async fn each_listing_call_runs_the_statements_the_plan_tests_check_planned_by_key() {
    let store = TestStore::new(Backend::Postgres).await;
    let Store::Postgres(pg) = &store.store else {
        unreachable!("a Postgres test store")
    };
    let forms = [(false, false), (true, false), (false, true), (true, true)];
    let summaries: Vec<String> = forms
        .into_iter()
        .map(|(topic, waiting)| pg_summary_sql(topic, waiting))
        .collect();
    let pages: Vec<String> = forms
        .into_iter()
        .map(|(topic, waiting)| pg_page_sql(topic, waiting))
        .collect();
    let expected: [(&str, Vec<String>); 5] = [
        ("wharf_group_summaries", summaries),
        ("wharf_group_page", pages),
        ("wharf_group_rows", vec![PG_GROUP_ROWS.to_owned()]),
        ("wharf_group_read", vec![PG_GROUP_READ.to_owned()]),
        (
            "wharf_group_figures",
            vec![wharf_queue::plans::GROUP_FIGURES.to_owned()],
        ),
    ];
    for (function, statements) in expected {
        let (source, config): (String, Vec<String>) = sqlx::query_as(
            "SELECT p.prosrc, p.proconfig FROM pg_proc p \
             JOIN pg_namespace n ON n.oid = p.pronamespace \
             WHERE n.nspname = current_schema() AND p.proname = $1",
        )
        .bind(function)
        .fetch_one(pg.pool())
        .await
        .unwrap_or_else(|e| panic!("{function}: {e}"));
        let source = normalized(&source);
        for statement in statements {
            assert!(
                source.contains(&format!("RETURN QUERY {};", normalized(&statement))),
                "{function} does not run the checked statement {statement}\n{source}"
            );
        }
        assert_eq!(
            source.matches("RETURN QUERY").count(),
            if function == "wharf_group_summaries" || function == "wharf_group_page" {
                4
            } else {
                1
            },
            "{function} runs a statement of its own: {source}"
        );
        for setting in [
            "plan_cache_mode=force_generic_plan",
            "enable_seqscan=off",
            "enable_bitmapscan=off",
            "enable_sort=off",
            "enable_hashjoin=off",
            "enable_mergejoin=off",
            "enable_material=off",
            "enable_memoize=off",
            "jit=off",
        ] {
            assert!(
                config.iter().any(|c| c == setting),
                "{function}: {config:?}"
            );
        }
        // The one-group read's kinds of rows come back branch after branch (ADR 0065): no
        // parallel append may interleave them.
        if function == "wharf_group_rows" || function == "wharf_group_read" {
            assert!(
                config
                    .iter()
                    .any(|c| c == "max_parallel_workers_per_gather=0"),
                "{function}: {config:?}"
            );
        }
    }
}

/// A large listing store: 20k groups over 50 topics, each with three instances, five
/// attempts (one group in a hundred waiting), a queue row and three deliveries; one
/// crash-looping group with 20k waiting attempts; a ledger of 1M events, whose position index
/// alone is over the bound (a head read as an aggregate over it rather than its last entry).
const FILL: [&str; 10] = [
    "INSERT INTO effective_declaration (group_name, topic, declarer, version, patterns, \
     previous, declared_at, attempt_at, position, installs) SELECT 'g' || lpad(i::text, 6, '0'), \
     't' || (i % 50), 'd', '1', ARRAY['a/#'], NULL, now(), now(), i, 1 \
     FROM generate_series(1, 20000) i",
    "INSERT INTO declarer_attempt (group_name, declarer, status, version, patterns, incumbent, \
     declared_at, attempt_at, position) SELECT 'g' || lpad(i::text, 6, '0'), 'w' || j, \
     CASE WHEN j = 0 AND i % 100 = 7 THEN 'waiting' ELSE 'resolved' END, '1', ARRAY['b/#'], \
     ARRAY['a/#'], now() + j * interval '1 s', now(), i * 10 + j \
     FROM generate_series(1, 20000) i, generate_series(0, 4) j",
    "INSERT INTO declarer_attempt (group_name, declarer, status, version, patterns, incumbent, \
     declared_at, attempt_at, position) SELECT 'g005007', 'crash' || k, 'waiting', '1', \
     ARRAY['b/#'], ARRAY['a/#'], now() + k * interval '1 ms', now(), 1000000 + k \
     FROM generate_series(1, 20000) k",
    "INSERT INTO waiting_group (group_name) \
     SELECT DISTINCT group_name FROM declarer_attempt WHERE status = 'waiting'",
    "INSERT INTO worker_instance (group_name, declarer, topic, version, patterns, started_at, \
     heartbeat_at) SELECT 'g' || lpad(i::text, 6, '0'), 'i' || j, 't', '1', ARRAY['a/#'], now(), \
     now() FROM generate_series(1, 20000) i, generate_series(0, 2) j",
    "INSERT INTO topic (name, head) SELECT 't' || i, 3 FROM generate_series(0, 49) i",
    "INSERT INTO message (topic, position, subject, payload) \
     SELECT t.name, p, 'x', '\\x00'::bytea FROM topic t, generate_series(1, 3) p",
    "INSERT INTO consumer_group (group_name, topic, routed_position) \
     SELECT group_name, topic, 3 FROM effective_declaration",
    "INSERT INTO delivery (group_name, topic, position, routed_by, routed_at, visible_at) \
     SELECT e.group_name, e.topic, p, e.position, now(), now() \
     FROM effective_declaration e, generate_series(1, 3) p",
    "INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, event_version, \
     payload, metadata) SELECT 'filler', 'f', i, 'x', '1', '{}', '{}' \
     FROM generate_series(1, 1000000) i",
];

/// The plan tests' bound for a summary page (ADR 0038), which a page's queue figures are
/// inside too. A scan of `declarer_attempt` alone is over 1,300 buffers here, of the
/// crash-looping group's waiting attempts several hundred, and every per-group probe by a
/// scan of its table multiplies that by the page.
const PAGE_BOUND: i64 = 2_500;

/// A page with its groups' queue figures (ADR 0072): the page's bound and the figures' own.
const PAGE_WITH_FIGURES_BOUND: i64 = 2 * PAGE_BOUND;

/// One group reads a few entries of each of its keys (21 buffers here); a walk of a whole
/// index of `effective_declaration` (the one by topic, whose second column is the name) is
/// over 100.
const GROUP_BOUND: i64 = 60;

/// The calls a listing makes, with their arguments as SQL literals and the most buffers each
/// may touch: a page by name, by topic, of waiting groups past the crash-looping one, one
/// group, a page's queue figures.
fn calls() -> Vec<(String, String, i64)> {
    let page = |function: &str, topic: &str, waiting: bool| {
        format!(
            "SELECT * FROM {function}('g005000', 101, {topic}, {waiting}, \
             'declarer_attempts', 60000000)"
        )
    };
    let mut calls = Vec::new();
    for (function, with, bound) in [
        ("wharf_group_summaries", "", PAGE_BOUND),
        ("wharf_group_page", " with figures", PAGE_WITH_FIGURES_BOUND),
    ] {
        calls.extend(
            [
                ("page", page(function, "NULL", false)),
                ("page by topic", page(function, "'t7'", false)),
                ("page of waiting groups", page(function, "NULL", true)),
                (
                    "page by topic of waiting groups",
                    page(function, "'t7'", true),
                ),
            ]
            .map(|(what, call)| (format!("{what}{with}"), call, bound)),
        );
    }
    calls.extend([
        (
            "one group".to_owned(),
            "SELECT * FROM wharf_group_rows('g005007', NULL, NULL, 101, '', \
             'declarer_attempts')"
                .to_owned(),
            GROUP_BOUND,
        ),
        (
            "one group with its queue figures".to_owned(),
            "SELECT * FROM wharf_group_read('g005007', NULL, NULL, 101, '', \
             'declarer_attempts')"
                .to_owned(),
            GROUP_BOUND,
        ),
        (
            "queue figures".to_owned(),
            "SELECT * FROM wharf_group_figures(ARRAY(SELECT group_name \
             FROM effective_declaration WHERE group_name > 'g005000' ORDER BY group_name \
             LIMIT 100))"
                .to_owned(),
            PAGE_BOUND,
        ),
    ]);
    calls
}

#[tokio::test]
async fn listing_calls_made_on_empty_tables_read_a_large_store_by_key() {
    let store = TestStore::new(Backend::Postgres).await;
    let Store::Postgres(pg) = &store.store else {
        unreachable!("a Postgres test store")
    };
    let mut conn = pg.pool().acquire().await.unwrap();
    wharf_tests::analyze_own_tables(&mut conn).await;
    // On empty tables: the connection's plans are made here (more calls than a plan cache
    // needs to settle on a generic plan, had a function left the choice to it).
    for _ in 0..8 {
        for (what, call, _) in calls() {
            sqlx::query(&call)
                .fetch_all(&mut *conn)
                .await
                .unwrap_or_else(|e| panic!("{what}: {e}"));
        }
    }
    for statement in FILL {
        sqlx::query(statement)
            .execute(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
    sqlx::query(
        "INSERT INTO projection_checkpoint (projector, position) VALUES ('declarer_attempts', 0) \
         ON CONFLICT (projector) DO NOTHING",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    // One call of each first, unmeasured: while the fill ran, other tests' migrations may
    // have overflowed this backend's queue of catalog invalidations, which resets its caches,
    // and the first call after would count the catalog rows it reads back (83 buffers for one
    // group with its figures once in CI, 37 otherwise). The plans are still those made on
    // empty tables, or after such a reset plans remade on the statistics taken while the
    // tables were empty (nothing analyzes them after the fill).
    for (what, call, _) in calls() {
        sqlx::query(&call)
            .fetch_all(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
    }
    for (what, call, bound) in calls() {
        let (plan,): (Value,) =
            sqlx::query_as(&format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {call}"))
                .fetch_one(&mut *conn)
                .await
                .unwrap_or_else(|e| panic!("{what}: {e}"));
        let root = &plan[0]["Plan"];
        let buffers = root["Shared Hit Blocks"].as_i64().unwrap_or(0)
            + root["Shared Read Blocks"].as_i64().unwrap_or(0);
        assert!(
            buffers <= bound,
            "{what} touched {buffers} buffers (bound {bound}) after calls on empty tables: \
             {plan}"
        );
    }
}

#[tokio::test]
async fn sqlite_summary_page_is_one_statement_bounded_per_group() {
    let store = TestStore::new(Backend::Sqlite).await;
    let Store::Sqlite(sqlite) = &store.store else {
        unreachable!("a SQLite test store")
    };
    let steps = sqlite
        .write(|ctx| {
            ctx.tx.execute_batch(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000) \
                 INSERT INTO effective_declaration (group_name, topic, declarer, version, \
                   patterns, previous, declared_at, attempt_at, position, installs) \
                 SELECT printf('g%06d', i), 't' || (i % 5), 'd', '1', '[\"a/#\"]', NULL, 0, 0, \
                   i, 1 FROM n; \
                 WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000) \
                 INSERT INTO worker_instance (group_name, declarer, topic, version, patterns, \
                   started_at, heartbeat_at) SELECT printf('g%06d', i), 'i' || j.j, 't', '1', \
                   '[\"a/#\"]', 0, 0 FROM n, (SELECT 0 AS j UNION ALL SELECT 1) j; \
                 WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5000) \
                 INSERT INTO declarer_attempt (group_name, declarer, status, version, patterns, \
                   incumbent, declared_at, attempt_at, position) \
                 SELECT 'g000050', 'crash' || i, 'waiting', '1', '[\"b/#\"]', '[\"a/#\"]', i, i, \
                   i FROM n; \
                 INSERT INTO declarer_attempt (group_name, declarer, status, version, patterns, \
                   incumbent, declared_at, attempt_at, position) \
                 SELECT group_name, 'w', 'waiting', '1', '[\"b/#\"]', '[\"a/#\"]', 0, 0, 0 \
                 FROM effective_declaration; \
                 INSERT INTO waiting_group (group_name) SELECT group_name \
                 FROM effective_declaration;",
            )?;
            let mut steps = Vec::new();
            for (topic, waiting) in [(false, false), (false, true)] {
                let sql = sqlite_summary_sql(topic, waiting);
                // The same page counting every open waiter: the bound must catch it.
                let uncapped = sql.replacen("a.declarer LIMIT 101)", "a.declarer)", 1);
                assert_ne!(uncapped, sql, "the count is capped");
                for (capped, sql) in [(true, sql), (false, uncapped)] {
                    let mut stmt = ctx.tx.prepare(&sql)?;
                    let rows = stmt
                        .query_map(rusqlite::params!["", 101, None::<String>, 0], |r| {
                            r.get::<_, i64>(10)
                        })?
                        .collect::<Result<Vec<_>, _>>()?;
                    let vm_steps = i64::from(stmt.get_status(StatementStatus::VmStep));
                    steps.push((waiting, capped, rows, vm_steps));
                }
            }
            Ok(steps)
        })
        .await
        .unwrap();
    for (waiting, capped, rows, vm_steps) in steps {
        let listed = rows.len() as i64;
        let what = format!("waiting={waiting} capped={capped}");
        assert_eq!(listed, 101, "{what}: {rows:?}");
        // A few hundred steps per listed group, the crash-looping group's 101 counted
        // waiters included; counting its 5,000 takes tens of thousands more.
        let bound = 300 * listed + 5_000;
        if capped {
            assert!(rows.contains(&101), "{what}: {rows:?}");
            assert!(
                vm_steps <= bound,
                "{what}: {vm_steps} steps for {listed} groups"
            );
        } else {
            assert!(rows.contains(&5_001), "{what}: {rows:?}");
            assert!(
                vm_steps > bound,
                "{what}: the bound must catch it ({vm_steps})"
            );
        }
        println!("{what}: {vm_steps} steps for {listed} groups");
    }
}
