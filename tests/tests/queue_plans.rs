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

#[tokio::test]
async fn a_routing_step_reads_only_its_batch_on_a_large_log_with_stale_statistics() {
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
/// statement inside is planned on every call with the call's values, and with sequential
/// scans, bitmap scans and sorts disabled while it plans. A connection that first claimed
/// while `delivery` was tiny, on statistics that still say so, then walks the primary key for
/// a batch of 10 out of 300k claimable rows. (Planned on those statistics with the scans
/// allowed, the same statement read the whole table and sorted it on disk: 4,586 buffers,
/// 134 ms.) The buffers counted are the function's, its statement's included.
#[tokio::test]
async fn a_claim_touches_only_its_batch_on_a_large_queue_claimed_from_while_small() {
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
    sqlx::query("ANALYZE delivery")
        .execute(&mut *conn)
        .await
        .unwrap();
    let call = "SELECT * FROM wharf_claim('g', $1, 'x', 7, 30, NULL, '{}', '{}')";
    // Claims the five routed messages, planning while the table is tiny; several times, so a
    // cache that would settle on a generic plan after five custom ones would have.
    for _ in 0..8 {
        let _: Vec<(i64,)> = sqlx::query_as(&call.replace('*', "c_position"))
            .bind(10_i64)
            .fetch_all(&mut *conn)
            .await
            .unwrap();
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
    ] {
        sqlx::query(statement)
            .bind(install)
            .execute(&mut *conn)
            .await
            .unwrap();
    }
    let explain = format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {call}");
    let (plan,): (Value,) = sqlx::query_as(&explain)
        .bind(10_i64)
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    let root = &plan[0]["Plan"];
    assert_eq!(root["Actual Rows"], 10, "{plan}");
    let buffers = root["Shared Hit Blocks"].as_i64().unwrap_or(0)
        + root["Shared Read Blocks"].as_i64().unwrap_or(0);
    assert!(
        buffers < 300,
        "a claim of 10 touched {buffers} buffers on a 300k-row queue: {plan}"
    );
}
