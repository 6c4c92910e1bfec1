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
    let wharf = wharf::Wharf::open(&config).await.expect("open");
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
    let wharf = wharf::Wharf::open(&config).await.expect("open");
    assert_eq!(
        setting(wharf.store(), "jit").await,
        "off",
        "server default: {server_default}"
    );
    assert_eq!(setting(wharf.store(), "statement_timeout").await, "4321ms");
}
