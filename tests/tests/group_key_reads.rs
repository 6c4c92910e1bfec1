//! Every statement Wharf runs on Postgres, outside the listing calls, that reads one group's
//! effective declaration given the group's name, held to a descent of a key: on 100k groups whose statistics were taken
//! while the tables were empty, or while the groups were being inserted, under custom and
//! generic plans.
//!
//! `effective_declaration` has two indexes that hold `group_name`: its primary key, and
//! `(topic, group_name)` for the listing's topic filter. On statistics that count the table's
//! pages but none of its rows the planner prices a walk of the whole second index like a
//! descent of the first, and takes it: 573 buffers at 100k groups, seen in CI on 2026-12-05
//! for the binding read, where a sibling test's database-wide `ANALYZE` had caught this
//! test's table during its fill. Each statement now reads the row by group and topic, which
//! both indexes hold whole (ADR 0066); each case here names the statement the library runs.

use serde_json::Value;
use wharf::store::Store;
use wharf_tests::{Backend, TestStore};

/// Groups in the tables.
const GROUPS: i64 = 100_000;
/// What one group's read may touch: a descent of each key it uses and the rows' pages.
const KEYED: i64 = 12;

fn buffers(plan: &Value) -> i64 {
    plan["Shared Hit Blocks"].as_i64().unwrap_or(0)
        + plan["Shared Read Blocks"].as_i64().unwrap_or(0)
}

/// Fills a migrated store through `conn` with [`GROUPS`] declared groups on one topic.
async fn fill(conn: &mut sqlx::PgConnection) {
    for fill in [
        "INSERT INTO topic (name, head) VALUES ('orders', 10)".to_owned(),
        format!(
            "INSERT INTO consumer_group (group_name, topic) \
             SELECT 'g' || i, 'orders' FROM generate_series(1, {GROUPS}) i"
        ),
        format!(
            "INSERT INTO effective_declaration (group_name, topic, declarer, version, patterns, \
             declared_at, attempt_at, position, installs) \
             SELECT 'g' || i, 'orders', 'd', '1', ARRAY['orders/' || i || '/#', 'orders/x'], \
             clock_timestamp(), clock_timestamp(), i, 1 FROM generate_series(1, {GROUPS}) i"
        ),
    ] {
        sqlx::query(&fill).execute(&mut *conn).await.unwrap();
    }
}

const ANALYZE: &str = "ANALYZE consumer_group, effective_declaration, topic";

/// The statistics a store's tables can carry when a read is planned.
#[derive(Clone, Copy, Debug)]
enum Statistics {
    /// Taken while the tables were empty (a fresh install, or a restore not yet analyzed).
    TakenWhileEmpty,
    /// Taken while the fill was in flight: the tables' pages counted, none of their rows (an
    /// analyze does not count rows another transaction is still inserting). What an analyze
    /// during a bulk load leaves until the next one, and what the planner prices a walk of a
    /// whole index on as if the table held a row.
    TakenDuringTheFill,
}

/// A filled store whose tables carry `statistics`.
async fn filled(
    test: &TestStore,
    statistics: Statistics,
) -> sqlx::pool::PoolConnection<sqlx::Postgres> {
    let Store::Postgres(store) = &test.store else {
        unreachable!("a Postgres test store")
    };
    let mut conn = store.pool().acquire().await.unwrap();
    match statistics {
        Statistics::TakenWhileEmpty => {
            sqlx::query(ANALYZE).execute(&mut *conn).await.unwrap();
            fill(&mut conn).await;
        }
        Statistics::TakenDuringTheFill => {
            let mut filling = store.pool().begin().await.unwrap();
            fill(&mut filling).await;
            sqlx::query(ANALYZE).execute(&mut *conn).await.unwrap();
            filling.commit().await.unwrap();
            let (pages, rows): (i32, f32) = sqlx::query_as(
                "SELECT relpages, reltuples FROM pg_class \
                 WHERE oid = 'effective_declaration'::regclass",
            )
            .fetch_one(&mut *conn)
            .await
            .unwrap();
            assert!(
                pages > 100 && rows < 1.0,
                "the statistics count the fill's pages ({pages}) and none of its rows ({rows})"
            );
        }
    }
    conn
}

/// The root of `sql`'s plan for group `group` (and its topic, when `sql` takes it as `$2`),
/// run under plan cache mode `mode`.
async fn explain(
    conn: &mut sqlx::PgConnection,
    mode: &str,
    sql: &str,
    group: &str,
    takes_topic: bool,
) -> Value {
    sqlx::query(&format!("SET plan_cache_mode = {mode}"))
        .execute(&mut *conn)
        .await
        .unwrap();
    let explain = format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}");
    let mut query = sqlx::query_as::<_, (Value,)>(&explain).bind(group);
    if takes_topic {
        query = query.bind("orders");
    }
    let (plan,) = query
        .fetch_one(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("explaining {sql}: {e}"));
    plan[0]["Plan"].clone()
}

/// Each statement on one group: the rows it returns on a declared group, and at most
/// [`KEYED`] buffers on that group and on one that is not there.
async fn each_read_descends_the_key(statistics: Statistics) {
    let test = TestStore::new(Backend::Postgres).await;
    let mut conn = filled(&test, statistics).await;
    // (what, statement, rows on a declared group, whether it takes the topic as `$2`)
    let reads = [
        (
            "the binding rows",
            wharf_projections::rows::PG_BINDINGS,
            2,
            false,
        ),
        (
            "the declarations' 404 check",
            wharf_projections::rows::PG_IS_DECLARED,
            1,
            false,
        ),
        (
            "a routing step's first look",
            wharf_queue::plans::ROUTE_LOOK,
            1,
            false,
        ),
        (
            "a routing step's install",
            wharf_queue::plans::INSTALL_ON_TOPIC,
            1,
            true,
        ),
        (
            "the install in effect",
            wharf_queue::plans::INSTALL_IN_EFFECT,
            1,
            false,
        ),
    ];
    for (what, sql, rows, takes_topic) in reads {
        for mode in ["force_custom_plan", "force_generic_plan"] {
            for group in ["g7", "g99999", "g0"] {
                let root = explain(&mut conn, mode, sql, group, takes_topic).await;
                let context = format!("{what} ({statistics:?}, {mode}, {group})");
                if group != "g0" {
                    assert_eq!(root["Actual Rows"], rows, "{context}: rows");
                }
                assert!(
                    buffers(&root) <= KEYED,
                    "{context} touched {} buffers: {root}",
                    buffers(&root)
                );
            }
        }
    }
}

#[tokio::test]
async fn reads_of_one_group_descend_its_key_on_statistics_taken_while_empty() {
    each_read_descends_the_key(Statistics::TakenWhileEmpty).await;
}

#[tokio::test]
async fn reads_of_one_group_descend_its_key_on_statistics_taken_during_a_bulk_load() {
    each_read_descends_the_key(Statistics::TakenDuringTheFill).await;
}
