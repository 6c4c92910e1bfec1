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
