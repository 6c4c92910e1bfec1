//! Plans of the routing hot path on a large log whose statistics were taken while it was empty
//! (autovacuum off, or a bulk load not yet analyzed), on the real Postgres.
//!
//! `position >= $2 ORDER BY position LIMIT n` (and a range open up to the largest position) was
//! planned there as a bitmap scan of every later row plus a sort: 280 ms per routing step at
//! 1M rows, and the `queue_claim` bench's skip rate fell from ~200k to ~80k rows/s. A routing
//! step now reads a range of at most a batch of positions; this test runs its statement under
//! custom and generic plans and checks the rows and buffers it touches, whatever the plan.

use serde_json::Value;
use wharf::store::Store;
use wharf_queue::plans::ROUTE_SLICE;
use wharf_tests::{Backend, TestStore};

/// The tests here count the buffers a statement touches, planning included (a function plans
/// its statement on every call). Another test's schema being created meanwhile invalidates
/// the catalog caches, and the planner then reads catalog pages that count too (seen: 1,101
/// buffers for a claim of 10 that reads 20), so these tests run one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn a_routing_step_reads_only_its_batch_on_a_large_log_with_stale_statistics() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let store = TestStore::new(Backend::Postgres).await;
    let Store::Postgres(pg) = &store.store else {
        unreachable!("a Postgres test store")
    };
    let mut conn = pg.pool().acquire().await.unwrap();
    sqlx::query("ANALYZE message")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO message (topic, position, subject, payload) \
         SELECT 't', g, 'metrics/' || (g % 100) || '/temp', '\\x00' \
         FROM generate_series(1, 300000) g",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    let explain = format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {ROUTE_SLICE}");
    for mode in ["force_custom_plan", "force_generic_plan"] {
        sqlx::query(&format!("SET plan_cache_mode = {mode}"))
            .execute(&mut *conn)
            .await
            .unwrap();
        let (plan,): (Value,) = sqlx::query_as(&explain)
            .bind("t")
            .bind(150_000_i64)
            .bind(150_499_i64)
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        let root = &plan[0]["Plan"];
        assert_eq!(root["Actual Rows"], 500, "{mode}: {plan}");
        let buffers = root["Shared Hit Blocks"].as_i64().unwrap_or(0)
            + root["Shared Read Blocks"].as_i64().unwrap_or(0);
        assert!(
            buffers < 100,
            "{mode}: a 500-row step touched {buffers} buffers: {plan}"
        );
    }
}

/// The claim call (`wharf_claim`, ADR 0042) is a statement each connection prepares once; the
/// function makes its plans once per connection too (ADR 0050), each statement in it by key or
/// a walk of the `delivery` primary key, with sequential scans, bitmap scans, sorts, hash and
/// merge joins and materializing disabled. A connection that first claimed and acked while
/// `delivery` was tiny, on statistics that still say so, then acks two keys and walks the
/// primary key for a batch of 10 out of 300k claimable rows, in a group table that grew to 100k
/// groups meanwhile. (Planned on those statistics with the scans allowed, the former single
/// statement read the whole table and sorted it on disk: 4,586 buffers, 134 ms; planned once
/// with its key lists, it read 5,719; the install looked up by group alone took the
/// `(topic, group_name)` index on a one-row table, a walk of the whole index once it grew.)
/// The buffers counted are the function's, its statements' included.
#[tokio::test]
async fn a_claim_touches_only_its_batch_on_a_large_queue_claimed_from_while_small() {
    let _alone = ONE_AT_A_TIME.lock().await;
    use wharf_tests::fixtures::{declare, group, msg, topic};
    let store = TestStore::new(Backend::Postgres).await;
    declare(&store, "g", "t", &["job/+"]).await;
    let queue = wharf_queue::Queue::new(store.store.clone(), Default::default());
    let batch: Vec<_> = (0..5).map(|i| msg(&format!("job/{i}"))).collect();
    queue.publish(&topic("t"), &batch).await.unwrap();
    queue.route(&group("g")).await.unwrap();
    let Store::Postgres(pg) = &store.store else {
        unreachable!("a Postgres test store")
    };
    let mut conn = pg.pool().acquire().await.unwrap();
    sqlx::query("ANALYZE delivery, message, consumer_group, effective_declaration")
        .execute(&mut *conn)
        .await
        .unwrap();
    let call = "SELECT * FROM wharf_claim('g', $1, 'x', 7, 30, NULL, $2, $3)";
    // Claims the five routed messages and acks two, planning while the tables are tiny;
    // several times, so a cache that would settle on a generic plan after five custom ones
    // would have.
    let mut acks: (Vec<i64>, Vec<i64>) = (Vec::new(), Vec::new());
    for _ in 0..8 {
        let claimed: Vec<(i64, Option<i64>)> =
            sqlx::query_as(&call.replace('*', "c_position, c_acked_token"))
                .bind(10_i64)
                .bind(&acks.0)
                .bind(&acks.1)
                .fetch_all(&mut *conn)
                .await
                .unwrap();
        let fresh = claimed.iter().filter(|(_, acked)| acked.is_none());
        acks = fresh.take(2).map(|(position, _)| (*position, 7)).unzip();
    }
    let (install,): (i64,) =
        sqlx::query_as("SELECT position FROM effective_declaration WHERE group_name = 'g'")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
    for statement in [
        "INSERT INTO message (topic, position, subject, payload) \
         SELECT 't', g, 'job/' || g, '\\x00' FROM generate_series(1000, 300999) g",
        "INSERT INTO delivery (group_name, topic, position, routed_by, routed_at, visible_at) \
         SELECT 'g', 't', g, $1, now(), now() - interval '1 second' \
         FROM generate_series(1000, 300999) g",
        "INSERT INTO consumer_group (group_name, topic) \
         SELECT 'other-' || g, 't' FROM generate_series(1, 100000) g",
        "INSERT INTO effective_declaration (group_name, topic, declarer, version, patterns, \
           declared_at, attempt_at, position, installs) \
         SELECT 'other-' || g, 't', 'd', '1', '{job/+}', now(), now(), $1, 1 \
         FROM generate_series(1, 100000) g",
        "UPDATE delivery SET claim_token = 7 \
         WHERE group_name = 'g' AND position IN (150001, 150002)",
    ] {
        sqlx::query(statement)
            .bind(install)
            .execute(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
    let explain = format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {call}");
    let (plan,): (Value,) = sqlx::query_as(&explain)
        .bind(10_i64)
        .bind(vec![150_001_i64, 150_002])
        .bind(vec![7_i64, 7])
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    let root = &plan[0]["Plan"];
    assert_eq!(root["Actual Rows"], 12, "two acked and ten claimed: {plan}");
    let buffers = root["Shared Hit Blocks"].as_i64().unwrap_or(0)
        + root["Shared Read Blocks"].as_i64().unwrap_or(0);
    println!("two acks and a claim of 10: {buffers} buffers");
    assert!(
        buffers < 200,
        "two acks and a claim of 10 touched {buffers} buffers on a 300k-row queue: {plan}"
    );
}

/// Runs `sql` on `conn`, failing the test on an error.
async fn run(conn: &mut sqlx::PgConnection, sql: &str) {
    sqlx::raw_sql(sql)
        .execute(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// The root of `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE {call}`: its rows and the
/// buffers it touched (a function's statement's included).
async fn explain_execute(conn: &mut sqlx::PgConnection, call: &str) -> (i64, i64, Value) {
    let (plan,): (Value,) = sqlx::query_as(&format!(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE {call}"
    ))
    .fetch_one(conn)
    .await
    .unwrap_or_else(|e| panic!("EXECUTE {call}: {e}"));
    let root = &plan[0]["Plan"];
    let rows = root["Actual Rows"].as_i64().unwrap_or(-1);
    let buffers = root["Shared Hit Blocks"].as_i64().unwrap_or(0)
        + root["Shared Read Blocks"].as_i64().unwrap_or(0);
    (rows, buffers, plan)
}

/// One settling statement as the queue sends it, with a call that misses (run while the queue
/// is tiny) and one that hits keys of the grown queue, and the rows the hit returns.
struct Settling {
    name: &'static str,
    sql: String,
    in_keyed_transaction: bool,
    miss: &'static str,
    hit: &'static str,
    hit_rows: Option<i64>,
}

fn settling_statements() -> Vec<Settling> {
    use wharf_queue::plans::{settle_in, ACK, BURY, EXTEND, NACK_MARK, NACK_RETRY, SETTLE};
    vec![
        Settling {
            name: "settle",
            sql: SETTLE.to_owned(),
            in_keyed_transaction: false,
            miss: "('{g,g}', '{1,2}', '{0,0}')",
            hit: "('{g,g}', '{150001,150002}', '{150001,150002}')",
            hit_rows: Some(2),
        },
        Settling {
            name: "ack",
            sql: ACK.to_owned(),
            in_keyed_transaction: false,
            miss: "('g', 1, 0)",
            hit: "('g', 150012, 150012)",
            // One row whatever it did: a scalar function.
            hit_rows: None,
        },
        Settling {
            name: "extend",
            sql: EXTEND.to_owned(),
            in_keyed_transaction: false,
            miss: "('g', 1, 0, 30)",
            hit: "('g', 150003, 150003, 30)",
            // One row whatever it did: a scalar function.
            hit_rows: None,
        },
        Settling {
            name: "nack_mark",
            sql: NACK_MARK.to_owned(),
            in_keyed_transaction: true,
            miss: "('g', 1, 0, 'boom')",
            hit: "('g', 150004, 150004, 'boom')",
            hit_rows: Some(1),
        },
        Settling {
            name: "nack_retry",
            sql: NACK_RETRY.to_owned(),
            in_keyed_transaction: true,
            miss: "('g', 0, 5)",
            hit: "('g', 150005, 5)",
            hit_rows: Some(1),
        },
        Settling {
            name: "bury",
            sql: BURY.to_owned(),
            in_keyed_transaction: true,
            miss: "('g', '{1,2}', 0, 1)",
            hit: "('g', '{150006,150007}', 150006, 1)",
            hit_rows: None,
        },
        Settling {
            name: "settle_delivery",
            sql: settle_in("delivery"),
            in_keyed_transaction: true,
            miss: "('{g,g}', '{1,2}', '{0,0}')",
            hit: "('{g,g}', '{150008,150009}', '{150008,150009}')",
            hit_rows: Some(2),
        },
        Settling {
            name: "settle_set_aside",
            sql: settle_in("set_aside"),
            in_keyed_transaction: true,
            miss: "('{g,g}', '{1,2}', '{0,0}')",
            hit: "('{g,g}', '{150010,150011}', '{150010,150011}')",
            hit_rows: Some(2),
        },
    ]
}

/// Acks, claim extensions, nacks, burials and the settle of set-aside claims (ADR 0048). Each
/// connection prepares its statements once; one that first ran them while `delivery` held five
/// rows, on statistics that still say so, had Postgres settle on generic plans that scanned the
/// whole table (an ack read 4,840 buffers at 300k rows, an ack of two hashed the table). Here a
/// connection runs each statement as the queue does, eight times, on a five-row queue; the queue
/// then grows to 300k rows, and each statement, run again through the same prepared statement,
/// must reach its keys alone.
#[tokio::test]
async fn settling_a_claim_touches_only_its_keys_on_a_queue_that_grew_after_the_first_calls() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let store = TestStore::new(Backend::Postgres).await;
    let Store::Postgres(pg) = &store.store else {
        unreachable!("a Postgres test store")
    };
    let mut conn = pg.pool().acquire().await.unwrap();
    let fill = |from: i64, to: i64| {
        format!(
            "INSERT INTO message (topic, position, subject, payload) \
             SELECT 't', g, 'job/' || g, '\\x00' FROM generate_series({from}, {to}) g; \
             INSERT INTO delivery (group_name, topic, position, routed_by, routed_at, visible_at, \
               attempts, claim_token) \
             SELECT 'g', 't', g, 1, now(), now(), 1, g FROM generate_series({from}, {to}) g; \
             INSERT INTO set_aside (group_name, topic, position, routed_by, routed_at, visible_at, \
               attempts, claim_token, set_aside_by, set_aside_at) \
             SELECT 'g', 't', g, 1, now(), now(), 1, g, 2, now() FROM generate_series({from}, {to}) g"
        )
    };
    run(&mut conn, &fill(1, 5)).await;
    run(
        &mut conn,
        "ANALYZE message; ANALYZE delivery; ANALYZE set_aside",
    )
    .await;
    let keyed = wharf_queue::plans::KEYED_PLANS;
    let statements = settling_statements();
    for s in &statements {
        run(&mut conn, &format!("PREPARE {} AS {}", s.name, s.sql)).await;
        // More runs than a plan cache needs to settle on a generic plan, as the code runs them.
        for _ in 0..8 {
            if s.in_keyed_transaction {
                run(&mut conn, &format!("BEGIN; {keyed}")).await;
            }
            run(&mut conn, &format!("EXECUTE {}{}", s.name, s.miss)).await;
            if s.in_keyed_transaction {
                run(&mut conn, "COMMIT").await;
            }
        }
    }
    run(&mut conn, &fill(150_000, 450_000)).await;
    for s in &statements {
        run(&mut conn, "BEGIN").await;
        if s.in_keyed_transaction {
            run(&mut conn, keyed).await;
        }
        let (rows, buffers, plan) =
            explain_execute(&mut conn, &format!("{}{}", s.name, s.hit)).await;
        run(&mut conn, "ROLLBACK").await;
        println!("{}: {buffers} buffers, {rows} rows", s.name);
        if let Some(expected) = s.hit_rows {
            assert_eq!(rows, expected, "{}: {plan}", s.name);
        }
        assert!(
            buffers < 200,
            "{}: touched {buffers} buffers on a 300k-row queue: {plan}",
            s.name
        );
    }
}
