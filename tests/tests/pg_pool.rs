//! The Postgres pool hands out connections without a ping when they were just in use (one
//! round trip less per transaction), and pings one that sat idle: a connection the server
//! closed while it was idle is replaced before anyone uses it, and one closed while in steady
//! use fails a single statement and is dropped, the next call getting a fresh connection.
//! Every connection runs with JIT compilation off, whatever else the URL's options set.

use std::time::Duration;

use wharf::store::Store;
use wharf_tests::{Backend, TestStore};

async fn backend_pid(store: &Store) -> i32 {
    let Store::Postgres(pg) = store else {
        panic!("a Postgres store")
    };
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(pg.pool())
        .await
        .expect("the pool's connection answers")
}

async fn terminate(pid: i32) {
    let url = std::env::var("WHARF_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let pool = sqlx::PgPool::connect(&url)
        .await
        .expect("an admin connection");
    let done: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&pool)
        .await
        .expect("terminate");
    assert!(done, "backend {pid} terminated");
    // Wait until the server has closed it (a terminated backend leaves pg_stat_activity).
    for _ in 0..500 {
        let alive: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)")
                .bind(pid)
                .fetch_one(&pool)
                .await
                .expect("pg_stat_activity");
        if !alive {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("backend {pid} is still alive");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_checked_and_a_busy_one_is_replaced_after_one_failure() {
    let ts = TestStore::new(Backend::Postgres).await;
    // One connection, so every call below gets the same one while it lives.
    let mut config = ts.config();
    config.store.max_connections = 1;
    let wharf = wharf::Wharf::open(&config.settings()).await.expect("open");
    let store = wharf.store();
    let first = backend_pid(store).await;
    terminate(first).await;
    // Idle past the ping threshold (1 s): the dead connection is found and replaced.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let second = backend_pid(store).await;
    assert_ne!(first, second, "a fresh connection");

    // In steady use (no idle time), no ping: the dead connection fails one statement, and is
    // dropped rather than handed out again.
    let released = std::time::Instant::now();
    terminate(second).await;
    let Store::Postgres(pg) = store else {
        unreachable!()
    };
    let idle = released.elapsed();
    let failed = sqlx::query("SELECT 1").execute(pg.pool()).await;
    assert!(
        failed.is_err() || idle >= Duration::from_secs(1),
        "no ping on a connection idle only {idle:?}"
    );
    let third = backend_pid(store).await;
    assert_ne!(
        third, second,
        "the broken connection was dropped, not reused"
    );
}

async fn setting(store: &Store, name: &str) -> String {
    let Store::Postgres(pg) = store else {
        panic!("a Postgres store")
    };
    sqlx::query_scalar("SELECT current_setting($1)")
        .bind(name)
        .fetch_one(pg.pool())
        .await
        .expect("the pool's connection answers")
}

#[tokio::test]
async fn every_connection_runs_without_jit_and_keeps_the_url_s_own_options() {
    let ts = TestStore::new(Backend::Postgres).await;
    let admin = sqlx::PgPool::connect(&wharf_tests::pg_url())
        .await
        .expect("an admin connection");
    let server_default: String =
        sqlx::query_scalar("SELECT boot_val FROM pg_settings WHERE name = 'jit'")
            .fetch_one(&admin)
            .await
            .expect("pg_settings");
    let mut config = ts.config();
    config.store.url =
        wharf_tests::with_url_param(&config.store.url, "options=-c%20statement_timeout%3D4321");
    let wharf = wharf::Wharf::open(&config.settings()).await.expect("open");
    assert_eq!(
        setting(wharf.store(), "jit").await,
        "off",
        "server default: {server_default}"
    );
    assert_eq!(setting(wharf.store(), "statement_timeout").await, "4321ms");
}

/// A pool of the store's own (what the API reads through, ADR 0067): the same schema and
/// options, at most its own count of connections, and every statement ended by the server
/// after its timeout, so a read its caller gave up on gives its connection back.
#[tokio::test]
async fn a_pool_of_its_own_bounds_its_connections_and_ends_a_stuck_statement() {
    let ts = TestStore::new(Backend::Postgres).await;
    let Store::Postgres(pg) = &ts.store else {
        panic!("a Postgres store")
    };
    let own = Store::Postgres(pg.with_own_pool(1, Duration::from_millis(400)));
    assert_eq!(setting(&own, "statement_timeout").await, "400ms");
    assert_eq!(setting(&own, "jit").await, "off");
    let Store::Postgres(own_pg) = &own else {
        unreachable!()
    };
    // The same schema: its tables answer.
    let groups: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM consumer_group")
        .fetch_one(own_pg.pool())
        .await
        .expect("the store's tables");
    assert_eq!(groups, 0);
    // The store's own pool is not this one's setting.
    assert_ne!(setting(&ts.store, "statement_timeout").await, "400ms");

    // A statement blocked by another session's lock ends with the timeout, not the lock.
    let mut locker = wharf_tests::other_session(&ts).await;
    sqlx::query("BEGIN").execute(&mut locker).await.unwrap();
    sqlx::query("LOCK TABLE consumer_group IN ACCESS EXCLUSIVE MODE")
        .execute(&mut locker)
        .await
        .unwrap();
    let blocked = sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM consumer_group")
        .fetch_one(own_pg.pool())
        .await
        .expect_err("the blocked read is cancelled");
    let code = blocked
        .as_database_error()
        .and_then(|e| e.code())
        .map(|c| c.into_owned());
    assert_eq!(code.as_deref(), Some("57014"), "query_canceled: {blocked}");

    // Its only connection is busy while a read waits on the lock: a second caller waits for
    // it, and gets it once the first read's statement has been ended. The pool's acquire
    // timeout is its statement timeout (ADR 0067), so the second caller starts waiting once
    // the first has been blocked for half of it: the first statement then ends, and its
    // connection comes back after the cancel and a round trip, well inside the second's wait.
    let first = {
        let pool = own_pg.pool().clone();
        tokio::spawn(async move {
            sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM consumer_group")
                .fetch_one(&pool)
                .await
        })
    };
    wharf_tests::wait_until(
        "the first read has waited on the lock for half its timeout",
        Duration::from_secs(20),
        || {
            let pool = pg.pool().clone();
            async move {
                sqlx::query_scalar::<_, i64>(
                    "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                 AND query LIKE 'SELECT COUNT(*) FROM consumer_group%' \
                 AND clock_timestamp() - query_start > interval '200 milliseconds'",
                )
                .fetch_one(&pool)
                .await
                .unwrap()
                    > 0
            }
        },
    )
    .await;
    let second: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(own_pg.pool())
        .await
        .expect("the connection comes back once the first statement ends");
    assert_eq!(second, 1);
    assert!(
        first.await.unwrap().is_err(),
        "the first read was cancelled"
    );
    sqlx::query("ROLLBACK").execute(&mut locker).await.unwrap();
}
