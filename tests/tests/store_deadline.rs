//! Deadlines on store calls stop the waiting, not the work (ADR 0068), against real Postgres.
//!
//! The hazard: a call dropped at its deadline while its statement still runs in the server,
//! the statement then ending in an error (here `statement_timeout`, as an operator's URL
//! options may set it), costs the sqlx pool that connection for good. Each test gives the
//! store's pool one connection, blocks a statement with another session's table lock past
//! the caller's deadline and the server's `statement_timeout`, then releases the lock: the
//! pool's only connection must serve again. With a plain `tokio::time::timeout` in place of
//! the bounded call, an abandoned statement can cost the pool its connection, and every later
//! acquire times out; whether it does depends on timing, so each test repeats its scenario.
//!
//! Every wait is on a condition with a deadline; no test sleeps to dodge a race.

use std::time::Duration;

use wharf::store::{finish_within, Store};
use wharf_api::ApiState;
use wharf_tests::{other_session, Backend, TestStore};

const DEADLINE: Duration = Duration::from_secs(20);

/// Each test repeats its scenario: whether one abandoned statement costs the pool its
/// connection depends on timing (ADR 0068), and one loss in any round fails the test.
const ROUNDS: usize = 3;

/// The caller's deadline, well inside the server's statement timeout (1.5 s, below).
const CALLER_DEADLINE: Duration = Duration::from_millis(200);

/// The store's connection as one pool of one, with a statement timeout on it.
async fn pool_of_one(test: &TestStore) -> (wharf::Wharf, sqlx::PgPool) {
    let mut config = test.config();
    config.store.max_connections = 1;
    let wharf = wharf::Wharf::open(&config.settings()).await.expect("open");
    let Store::Postgres(pg) = wharf.store() else {
        unreachable!("a Postgres test store")
    };
    let pool = pg.pool().clone();
    // A setting of the session, kept by the pool's only connection.
    sqlx::query("SET statement_timeout = 1500")
        .execute(&pool)
        .await
        .expect("the setting");
    (wharf, pool)
}

/// Another session's transaction holding `table` locked against every reader.
async fn lock(test: &TestStore, table: &str) -> sqlx::PgConnection {
    let mut locker = other_session(test).await;
    sqlx::query("BEGIN").execute(&mut locker).await.unwrap();
    sqlx::query(&format!("LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"))
        .execute(&mut locker)
        .await
        .unwrap();
    locker
}

/// The statements the locker's lock blocks, each as its backend and its start.
async fn blocked_statements(locker: &mut sqlx::PgConnection) -> Vec<(i32, String)> {
    sqlx::query_as(
        "SELECT pid, query_start::text FROM pg_stat_activity \
         WHERE pg_backend_pid() = ANY(pg_blocking_pids(pid))",
    )
    .fetch_all(locker)
    .await
    .unwrap()
}

/// Waits until `done` holds of the statements the locker blocks, with a deadline.
async fn until_blocked<F>(locker: &mut sqlx::PgConnection, what: &str, mut done: F)
where
    F: FnMut(&[(i32, String)]) -> bool,
{
    let start = std::time::Instant::now();
    while !done(&blocked_statements(locker).await) {
        assert!(start.elapsed() < DEADLINE, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Sees a statement the locker blocks, waits for the server to end that statement (its
/// `statement_timeout`) while the lock is still held, then ends the locker's transaction
/// with `end`. Later statements (a consumer's retries) may be blocked meanwhile.
async fn outlast_then_end(mut locker: sqlx::PgConnection, end: &str) {
    let mut first = None;
    until_blocked(
        &mut locker,
        "a statement blocked in the server",
        |blocked| {
            first = blocked.first().cloned();
            first.is_some()
        },
    )
    .await;
    let first = first.expect("seen blocked");
    until_blocked(&mut locker, "the server ends that statement", |blocked| {
        !blocked.contains(&first)
    })
    .await;
    sqlx::query(end).execute(&mut locker).await.unwrap();
}

/// The pool's only connection answers again within a few seconds.
async fn serves_again(pool: &sqlx::PgPool) {
    let answer = tokio::time::timeout(
        Duration::from_secs(5),
        sqlx::query_scalar::<_, i32>("SELECT 1").fetch_one(pool),
    )
    .await;
    assert!(
        matches!(answer, Ok(Ok(1))),
        "the pool's only connection did not come back: {answer:?} (size {}, idle {})",
        pool.size(),
        pool.num_idle()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_its_deadline_that_then_fails_leaves_the_pool_whole() {
    let test = TestStore::new(Backend::Postgres).await;
    let (_wharf, pool) = pool_of_one(&test).await;
    for _ in 0..ROUNDS {
        let locker = lock(&test, "consumer_group").await;
        let blocked = {
            let pool = pool.clone();
            async move {
                sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM consumer_group")
                    .fetch_one(&pool)
                    .await
            }
        };
        let answer = finish_within(CALLER_DEADLINE, blocked).await;
        assert!(answer.is_err(), "the blocked read answered: {answer:?}");

        outlast_then_end(locker, "ROLLBACK").await;
        serves_again(&pool).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readiness_probe_past_its_timeout_leaves_the_store_pool_whole() {
    let test = TestStore::new(Backend::Postgres).await;
    let (wharf, pool) = pool_of_one(&test).await;
    let state = ApiState::new(wharf.read_model().clone()).ready_timeout(CALLER_DEADLINE);
    assert_eq!(state.check_ready().await, Ok(()), "ready before the lock");
    for _ in 0..ROUNDS {
        let locker = lock(&test, "wharf_schema_migrations").await;
        let failed = state
            .check_ready()
            .await
            .expect_err("not ready while blocked");
        assert!(failed.contains("did not finish"), "{failed}");

        outlast_then_end(locker, "ROLLBACK").await;
        serves_again(&pool).await;
        assert_eq!(state.check_ready().await, Ok(()), "ready again");
    }
}

/// The consumer's fetch past its deadline (a third of the 400 ms instance TTL) while another
/// session holds the group's row, as a long routing step or swap would: the statement the
/// fetch was in finishes on its own once the server ends it (`statement_timeout` in the
/// store URL's options), and the pool of three keeps its connections. Without that, each
/// abandoned fetch could lose one, and the consumer, its heartbeats and the check below would
/// wait for the pool for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_whose_fetches_outlive_their_deadline_keeps_its_pool() {
    use wharf::config::QueueConfig;
    use wharf::handler::handler_fn;
    use wharf::queue::{Claimed, Headers};
    use wharf::Registration;

    let test = TestStore::new(Backend::Postgres).await;
    let mut config = test.config();
    config.store.url = format!("{}?options=-c%20statement_timeout%3D1500", config.store.url);
    config.store.max_connections = 3;
    config.queue = QueueConfig {
        poll_interval: Duration::from_millis(200),
        visibility_timeout: Duration::from_secs(2),
        ..QueueConfig::default()
    };
    let wharf = wharf::Wharf::open(&config.settings()).await.expect("open");
    let Store::Postgres(pg) = wharf.store() else {
        unreachable!("a Postgres test store")
    };
    let pool = pg.pool().clone();
    let registration = Registration::new("billing", "orders", "1", &["orders/#"]).unwrap();
    let consumer = wharf.consume_with(registration, handler_fn(|_: Claimed| async { Ok(()) }));
    let start = std::time::Instant::now();
    while consumer.stats().fetches < 1 {
        assert!(start.elapsed() < DEADLINE, "no first fetch");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    for round in 1..=ROUNDS {
        let mut holder = other_session(&test).await;
        wharf_tests::hold_group_row(&mut holder, "billing").await;
        let message = (format!("orders/{round}"), b"x".to_vec(), Headers::new());
        wharf.publish("orders", vec![message]).await.unwrap();
        outlast_then_end(holder, "COMMIT").await;

        let start = std::time::Instant::now();
        while consumer.stats().handled_ok < round as u64 {
            assert!(
                start.elapsed() < DEADLINE,
                "message {round} was never handled"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Every connection of the pool can be taken at once.
        let all = tokio::time::timeout(Duration::from_secs(5), async {
            let mut taken = Vec::new();
            for _ in 0..3 {
                taken.push(pool.acquire().await.expect("a connection"));
            }
            taken.len()
        })
        .await;
        assert_eq!(all, Ok(3), "the pool lost connections in round {round}");
    }
    consumer.shutdown().await;
}
