//! The plan of the executor's snapshot read on Postgres (ADR 0037), on a group whose stream
//! has 100k events, with statistics taken while `events` was empty.
//!
//! A warm attempt (the process holds the group's state up to a recent sequence) must read only
//! the events after that sequence, the stream's head by a walk of the key and its declarer's
//! own open wait by key (ADR 0049; the group has 50k open waits here, its neighbours 50 each):
//! a bounded number of buffers whatever the stream's length, under custom and generic plans
//! alike. An install's delete of the open waits it closes is held to the group's own rows
//! (the read of a group's binding rows is in `group_key_reads.rs`). (The head was once
//! `MAX(sequence)`, which the cold_register bench caught reading the whole stream on each
//! attempt; on this table Postgres plans that form as a one-entry backward scan too, so the
//! bound is shown to catch a read of the whole stream instead.)

use serde_json::Value;
use sqlx::postgres::PgArguments;
use sqlx::Arguments;
use wharf::store::{GroupLock, Store};
use wharf_store::postgres::snapshot_read_statement;
use wharf_tests::{Backend, TestStore};

/// Events in the long group's stream.
const STREAM: i64 = 100_000;
/// The sequence a warm attempt holds the state up to: ten events to fold.
const HELD: i64 = STREAM - 10;
/// What a warm snapshot may touch: the lock row, ten events, the head, the live instances.
const WARM: i64 = 100;

fn buffers(plan: &Value) -> i64 {
    plan["Shared Hit Blocks"].as_i64().unwrap_or(0)
        + plan["Shared Read Blocks"].as_i64().unwrap_or(0)
}

fn seq_scans_of_events(plan: &Value) -> usize {
    let own = usize::from(plan["Node Type"] == "Seq Scan" && plan["Relation Name"] == "events");
    own + plan["Plans"]
        .as_array()
        .into_iter()
        .flatten()
        .map(seq_scans_of_events)
        .sum::<usize>()
}

fn warm_lock() -> GroupLock {
    GroupLock {
        group: "long".to_owned(),
        topic: "orders".to_owned(),
        declarer: "waiter-77".to_owned(),
        instance_ttl: std::time::Duration::from_secs(30),
        after_sequence: HELD,
    }
}

/// The executor's statement, its text rewritten by `edit`.
fn statement(edit: impl Fn(&str) -> String) -> (String, PgArguments) {
    let (sql, args) = snapshot_read_statement(&warm_lock())
        .expect("building the snapshot statement")
        .expect("a group attempt runs optimistically");
    (edit(&sql), args)
}

/// The root's buffers and its sequential scans of `events`, under each plan cache mode.
async fn explain(
    conn: &mut sqlx::PgConnection,
    edit: impl Fn(&str) -> String,
) -> Vec<(&'static str, i64, usize)> {
    let mut found = Vec::new();
    for mode in ["force_custom_plan", "force_generic_plan"] {
        sqlx::query(&format!("SET plan_cache_mode = {mode}"))
            .execute(&mut *conn)
            .await
            .unwrap();
        let (sql, args) = statement(&edit);
        let (plan,): (Value,) = sqlx::query_as_with(
            &format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}"),
            args,
        )
        .fetch_one(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("explaining {sql}: {e}"));
        let root = &plan[0]["Plan"];
        if std::env::var("SHOW_PLANS").is_ok() {
            println!("{mode}: {plan}");
        }
        found.push((mode, buffers(root), seq_scans_of_events(root)));
    }
    found
}

#[tokio::test]
async fn a_warm_snapshot_read_is_bounded_whatever_the_streams_length() {
    let test = TestStore::new(Backend::Postgres).await;
    let mut conn = analyzed_while_empty(&test).await;
    // The long group's stream, and as many events of 1,000 other groups around it.
    sqlx::query(
        "INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, event_version, \
         payload, metadata) \
         SELECT 'consumer_group', 'long', i, 'Bulk', '1', '{}'::json, '{}'::json \
         FROM generate_series(1, $1) i \
         UNION ALL \
         SELECT 'consumer_group', 'g' || (i % 1000), i / 1000 + 1, 'Bulk', '1', '{}'::json, \
           '{}'::json \
         FROM generate_series(0, $1 - 1) i",
    )
    .bind(STREAM)
    .execute(&mut *conn)
    .await
    .unwrap();
    fill_open_waits(&mut conn).await;

    for (mode, buffers, scans) in explain(&mut conn, str::to_owned).await {
        assert_eq!(scans, 0, "the warm snapshot ({mode}) scanned events");
        assert!(
            buffers <= WARM,
            "the warm snapshot ({mode}) touched {buffers} buffers (bound {WARM})"
        );
    }

    // The bound is not loose: the same statement without the held sequence (every event of
    // the stream, as a read that ignored the held state would fetch) must break it.
    let unbounded = |sql: &str| {
        let replaced = sql.replace("AND sequence > $3", "AND sequence > 0");
        assert_ne!(
            replaced, sql,
            "the statement's event range is not the one expected"
        );
        replaced
    };
    for (mode, buffers, scans) in explain(&mut conn, unbounded).await {
        assert!(
            scans > 0 || buffers > WARM,
            "a read of the whole stream ({mode}) was not caught: {buffers} buffers"
        );
    }
}

/// 50k open waits in the long group and 50 in each of 1,000 others (statistics still say
/// `open_wait` is empty).
async fn fill_open_waits(conn: &mut sqlx::PgConnection) {
    sqlx::query(
        "INSERT INTO open_wait (group_name, declarer, patterns, declared_at) \
         SELECT 'long', 'waiter-' || i, ARRAY['orders/' || (i % 7) || '/#'], clock_timestamp() \
         FROM generate_series(1, 50000) i \
         UNION ALL \
         SELECT 'g' || (i % 1000), 'waiter-' || i, ARRAY['orders/#'], clock_timestamp() \
         FROM generate_series(1, 50000) i",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
}

/// `delete` (a DELETE statement) under `mode`, explained with ANALYZE inside a transaction
/// that is rolled back: its buffers, and the rows it deleted.
async fn explain_delete(
    conn: &mut sqlx::PgConnection,
    mode: &str,
    delete: &str,
    args: PgArguments,
) -> (i64, i64) {
    sqlx::query(&format!("SET plan_cache_mode = {mode}"))
        .execute(&mut *conn)
        .await
        .unwrap();
    let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
    let (plan,): (Value,) = sqlx::query_as_with(
        &format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {delete}"),
        args,
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap_or_else(|e| panic!("explaining {delete}: {e}"));
    tx.rollback().await.unwrap();
    let root = &plan[0]["Plan"];
    let deleted = root["Plans"][0]["Actual Rows"].as_i64().unwrap_or(-1);
    (buffers(root), deleted)
}

/// A Postgres test store's connection, after `ANALYZE` of its empty tables.
async fn analyzed_while_empty(test: &TestStore) -> sqlx::pool::PoolConnection<sqlx::Postgres> {
    let Store::Postgres(store) = &test.store else {
        unreachable!("a Postgres test store")
    };
    let mut conn = store.pool().acquire().await.unwrap();
    wharf_tests::analyze_own_tables(&mut conn).await;
    conn
}

const MODES: [&str; 2] = ["force_custom_plan", "force_generic_plan"];

/// The open-wait delete an install in a small group makes, fused into its insert (ADR 0049):
/// on the group's key, under custom and generic plans, with statistics from an empty table.
#[tokio::test]
async fn an_install_closes_open_waits_by_the_groups_key() {
    let test = TestStore::new(Backend::Postgres).await;
    let mut conn = analyzed_while_empty(&test).await;
    fill_open_waits(&mut conn).await;
    let delete = "DELETE FROM open_wait \
        WHERE group_name = $1 AND (declarer = $2 OR patterns = $3::text[])";
    for mode in MODES {
        for (group, closes) in [("g7", 50), ("g8", 0)] {
            let patterns = if closes > 0 { "orders/#" } else { "orders/x" };
            let mut args = PgArguments::default();
            args.add(group).unwrap();
            args.add("someone").unwrap();
            args.add(vec![patterns]).unwrap();
            let (buffers, deleted) = explain_delete(&mut conn, mode, delete, args).await;
            assert_eq!(deleted, closes, "{mode} on {group}: rows closed");
            // The group's 50 rows (each on a page of its own here, all read to compare their
            // sets) and their index entries, not the table's 100k rows (over 1,000 pages).
            assert!(
                buffers <= 3 * 50 + 20,
                "the install's open-wait delete ({mode}, {group}) touched {buffers} buffers"
            );
        }
    }
}
