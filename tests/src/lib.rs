//! Shared harness for Wharf's integration tests: a fresh real store per test, on a SQLite file
//! in a temporary directory or in a fresh schema of the real Postgres.
//!
//! Postgres is found at `WHARF_TEST_PG_URL` (default `postgres://postgres@127.0.0.1:5432/test`).
//! When it cannot be reached the Postgres half of a test fails; it never skips.

pub mod broker;
pub mod fleet;
pub mod ledger;
pub mod prometheus_text;
pub mod proxy;
pub mod sessions;
pub mod states;
pub mod worker;

pub use sessions::WharfSessions;

use std::time::{Duration, Instant};

use rand::Rng;
use tempfile::TempDir;
use wharf::config::DeclarationConfig;
use wharf::store::{PgSettings, PgStore, SqliteStore, Store};
use wharf::Wharf;
use wharf_server::Config;

/// The Postgres URL tests use.
pub fn pg_url() -> String {
    std::env::var("WHARF_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// [`pg_url`] with its sessions named `application_name` (as `pg_stat_activity` shows them), so
/// a test can find or end exactly the sessions of one store handle or process.
pub fn pg_url_named(application_name: &str) -> String {
    with_url_param(&pg_url(), &format!("application_name={application_name}"))
}

/// `url` with `param` (`key=value`, already encoded) added to its query string.
pub fn with_url_param(url: &str, param: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{param}")
}

/// Which backend a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A SQLite file.
    Sqlite,
    /// A fresh schema in the test Postgres.
    Postgres,
}

/// A fresh, migrated store; dropped with its file or schema.
pub struct TestStore {
    /// The store.
    pub store: Store,
    /// Which backend.
    pub backend: Backend,
    dir: Option<TempDir>,
    schema: Option<String>,
}

impl TestStore {
    /// A fresh migrated store on `backend`.
    pub async fn new(backend: Backend) -> Self {
        let store = Self::unmigrated(backend).await;
        store
            .store
            .migrate()
            .await
            .expect("migrating a fresh store");
        store
    }

    /// A fresh store on `backend` whose schema has not been migrated.
    pub async fn unmigrated(backend: Backend) -> Self {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("temp dir");
                let path = dir.path().join("wharf.db");
                let store = SqliteStore::open(&path, wharf::projections::sqlite_inline())
                    .await
                    .expect("opening a SQLite file");
                Self {
                    store: Store::Sqlite(store),
                    backend,
                    dir: Some(dir),
                    schema: None,
                }
            }
            Backend::Postgres => {
                let schema = format!("wharf_t_{:016x}", rand::thread_rng().gen::<u64>());
                let settings = Self::pg_settings(&schema);
                PgStore::create_schema(&settings).await.unwrap_or_else(|e| {
                    panic!("Postgres at {} is required for this test: {e}", pg_url())
                });
                let store = PgStore::connect(&settings, wharf::projections::pg_inline())
                    .expect("connecting to Postgres");
                Self {
                    store: Store::Postgres(store),
                    backend,
                    dir: None,
                    schema: Some(schema),
                }
            }
        }
    }

    /// Settings for a pool on `schema` of the test database: 24 connections, or as many as
    /// `WHARF_TEST_PG_POOL` says (the benches' pool-size runs, docs/benchmarks.md).
    pub fn pg_settings(schema: &str) -> PgSettings {
        PgSettings {
            schema: Some(schema.to_owned()),
            max_connections: std::env::var("WHARF_TEST_PG_POOL").map_or(24, |v| {
                v.parse().ok().filter(|n| *n > 0).unwrap_or_else(|| {
                    panic!("WHARF_TEST_PG_POOL must be a count above 0, got {v:?}")
                })
            }),
            ..PgSettings::new(pg_url())
        }
    }

    /// The store URL and schema, for configuring a `wharf` process on the same store.
    pub fn config(&self) -> Config {
        let mut config = Config {
            declarations: fast_declarations(),
            ..Config::default()
        };
        match (&self.dir, &self.schema) {
            (Some(dir), _) => {
                config.store.url = format!("sqlite://{}", dir.path().join("wharf.db").display());
            }
            (None, Some(schema)) => {
                config.store.url = pg_url();
                config.store.schema = schema.clone();
            }
            (None, None) => unreachable!("a test store is a file or a schema"),
        }
        config
    }

    /// A Wharf over this store with fast test timings.
    pub fn wharf(&self) -> Wharf {
        Wharf::with_store(self.store.clone(), &self.config().settings())
    }

    /// A Wharf on this store with the harness's fast heartbeats and retries but instances that
    /// stay live for 30 s without one: for tests whose point is not a lapse, so that a loaded
    /// machine (a heartbeat late by more than the 400 ms TTL) cannot let a waiting set swap in.
    pub fn steady_wharf(&self) -> Wharf {
        let mut config = self.config();
        config.declarations.instance_ttl = Duration::from_secs(30);
        Wharf::with_store(self.store.clone(), &config.settings())
    }

    /// The Postgres schema, when on Postgres.
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// Leaves a Postgres store's schema in place when this is dropped (for a look by hand
    /// after a bench); returns its name. A SQLite file is removed as before.
    pub fn keep(mut self) -> Option<String> {
        self.schema.take()
    }
}

impl Drop for TestStore {
    fn drop(&mut self) {
        let Some(schema) = self.schema.take() else {
            return;
        };
        // Drop the schema from a separate thread with its own runtime: Drop cannot await.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(runtime) = runtime {
                runtime.block_on(async {
                    use sqlx::Connection;
                    if let Ok(mut conn) = sqlx::PgConnection::connect(&pg_url()).await {
                        let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                            .execute(&mut conn)
                            .await;
                    }
                });
            }
        })
        .join();
    }
}

/// Declaration timings short enough for tests: heartbeats every 50 ms, dead after 400 ms.
pub fn fast_declarations() -> DeclarationConfig {
    DeclarationConfig {
        retry_interval: Duration::from_millis(50),
        heartbeat_interval: Duration::from_millis(50),
        instance_ttl: Duration::from_millis(400),
        ..DeclarationConfig::default()
    }
}

/// Takes statistics of the tables in `conn`'s schema only. A bare `ANALYZE` would also analyze
/// every other test's schema in the database, and catch a sibling test's table while it is
/// being filled: its pages counted and none of its rows, statistics that test never asked for
/// (the cause of a plan test's failure in CI on 2026-12-05, ADR 0066).
pub async fn analyze_own_tables(conn: &mut sqlx::PgConnection) {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT format('%I.%I', schemaname, tablename) FROM pg_tables \
         WHERE schemaname = current_schema() ORDER BY tablename",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    assert!(
        !tables.is_empty(),
        "the test's schema has tables to analyze"
    );
    sqlx::query(&format!("ANALYZE {}", tables.join(", ")))
        .execute(&mut *conn)
        .await
        .unwrap();
}

/// A connection to the test's schema, as another routing step would hold one.
pub async fn other_session(test: &TestStore) -> sqlx::PgConnection {
    let schema = test.schema().expect("a Postgres test store has a schema");
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&pg_url())
        .await
        .unwrap();
    sqlx::query(&format!("SET search_path TO \"{schema}\""))
        .execute(&mut conn)
        .await
        .unwrap();
    conn
}

/// Begins a transaction on `conn` and locks `group`'s row in it, as a routing step or a swap
/// does; returns the session's backend pid (to look for sessions it blocks).
pub async fn hold_group_row(conn: &mut sqlx::PgConnection, group: &str) -> i32 {
    sqlx::query("BEGIN").execute(&mut *conn).await.unwrap();
    let locked: Option<String> = sqlx::query_scalar(
        "SELECT group_name FROM consumer_group WHERE group_name = $1 FOR UPDATE",
    )
    .bind(group)
    .fetch_optional(&mut *conn)
    .await
    .unwrap();
    assert_eq!(locked.as_deref(), Some(group), "the group row exists");
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *conn)
        .await
        .unwrap()
}

/// Runs SQL (one statement or several) directly on the store's own connection: a table a test
/// needs, a row it plants, a projection it corrupts on purpose.
pub async fn execute_sql(store: &Store, sql: &str) {
    match store {
        Store::Sqlite(s) => {
            let sql = sql.to_owned();
            s.write(move |ctx| Ok(ctx.tx.execute_batch(&sql)?))
                .await
                .expect("running SQL on SQLite");
        }
        Store::Postgres(s) => {
            sqlx::raw_sql(sql)
                .execute(s.pool())
                .await
                .expect("running SQL on Postgres");
        }
    }
}

/// Waits until `condition` holds, polling every 10 ms, failing the test after `deadline`.
pub async fn wait_until<F, Fut>(what: &str, deadline: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if condition().await {
            return;
        }
        assert!(
            start.elapsed() < deadline,
            "timed out after {deadline:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Makes `declarer` a live instance of `group` declaring `patterns` for a day by the store's
/// clock (an upsert of its `worker_instance` row), without a `Wharf` heartbeating it.
pub async fn keep_live(store: &Store, group: &str, declarer: &str, patterns: &[&str]) {
    let patterns: Vec<String> = patterns.iter().map(|p| (*p).to_owned()).collect();
    match store {
        Store::Sqlite(s) => {
            let (group, declarer) = (group.to_owned(), declarer.to_owned());
            let patterns = serde_json::to_string(&patterns).expect("a list of strings");
            s.write(move |ctx| {
                let until = ctx.now.timestamp_micros() + 86_400_000_000;
                ctx.tx.execute(
                    "INSERT INTO worker_instance (group_name, declarer, topic, version, patterns, \
                     started_at, heartbeat_at) VALUES (?1, ?2, 'orders', '1', ?3, ?4, ?4) \
                     ON CONFLICT (group_name, declarer) DO UPDATE SET patterns = excluded.patterns, \
                     heartbeat_at = excluded.heartbeat_at",
                    rusqlite::params![group, declarer, patterns, until],
                )?;
                Ok(())
            })
            .await
            .expect("an instance row on SQLite");
        }
        Store::Postgres(s) => {
            sqlx::query(
                "INSERT INTO worker_instance (group_name, declarer, topic, version, patterns, \
                 started_at, heartbeat_at) VALUES ($1, $2, 'orders', '1', $3, now(), \
                 now() + interval '1 day') ON CONFLICT (group_name, declarer) DO UPDATE SET \
                 patterns = excluded.patterns, heartbeat_at = excluded.heartbeat_at",
            )
            .bind(group)
            .bind(declarer)
            .bind(&patterns)
            .execute(s.pool())
            .await
            .expect("an instance row on Postgres");
        }
    }
}

/// Runs the migration that created `open_wait` again (ADR 0049): its backfill adds the rows the
/// stored events imply and skips rows that exist. For ledgers written with SQL, and for the
/// test that compares the backfill with what the appends left.
pub async fn backfill_open_waits(store: &Store) {
    rerun_migration(store, "open_wait").await;
}

/// Runs the migration whose file name contains `name` again, on its store's backend: one
/// written to run twice (`IF NOT EXISTS`, conflicts skipped, functions replaced), whose
/// backfill adds the rows the store implies and skips those that exist. On Postgres every
/// later migration runs again after it (each is written to run twice), so a function the
/// named one replaces ends as the newest migration defines it, not as that older one did;
/// SQLite keeps no functions (and some of its migrations add columns, which cannot run twice).
pub async fn rerun_migration(store: &Store, name: &str) {
    let scripts = store.migrations();
    let at = scripts
        .iter()
        .position(|m| m.name.contains(name))
        .unwrap_or_else(|| panic!("no migration named like {name:?}"));
    let rerun = match store {
        Store::Sqlite(_) => &scripts[at..=at],
        Store::Postgres(_) => &scripts[at..],
    };
    for script in rerun {
        execute_sql(store, script.sql).await;
    }
}

/// Runs an async test body once per backend, each in its own `#[tokio::test]`.
#[macro_export]
macro_rules! on_both_backends {
    ($name:ident, $body:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                super::$body($crate::Backend::Sqlite).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                super::$body($crate::Backend::Postgres).await;
            }
        }
    };
}

/// Runs `$body(Backend::Postgres)` as a test named `$name::postgres`, for a test whose edge
/// exists only on Postgres (SQLite runs that path locked).
#[macro_export]
macro_rules! on_postgres {
    ($name:ident, $body:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                super::$body($crate::Backend::Postgres).await;
            }
        }
    };
}

/// Small builders the queue tests share.
pub mod fixtures {
    use std::time::Duration;

    use wharf::domain::{GroupName, TopicName};
    use wharf::Registration;
    use wharf_queue::{Headers, NackOutcome, OutgoingMessage, Queue, QueueSettings};

    use crate::TestStore;

    /// A topic name known to be valid.
    pub fn topic(name: &str) -> TopicName {
        TopicName::parse("topic", name).expect("a valid topic name")
    }

    /// A group name known to be valid.
    pub fn group(name: &str) -> GroupName {
        GroupName::parse("group", name).expect("a valid group name")
    }

    /// A message whose payload is its subject.
    pub fn msg(subject: &str) -> OutgoingMessage {
        OutgoingMessage::new(subject, subject.as_bytes().to_vec(), Headers::new())
            .expect("a valid message")
    }

    /// Claims the group's next claimable message with one attempt allowed and nacks it: it
    /// is buried in the dead letters.
    pub async fn bury_next(store: &TestStore, g: &GroupName) {
        let strict = Queue::new(
            store.store.clone(),
            QueueSettings {
                max_attempts: 1,
                visibility_timeout: Duration::from_secs(60),
                ..QueueSettings::default()
            },
        );
        let doomed = strict.claim(g, "k", 1).await.expect("a claim");
        assert_eq!(doomed.len(), 1, "a claimable message to bury");
        assert_eq!(
            strict.nack(&doomed[0], "fatal").await.expect("a nack"),
            NackOutcome::DeadLettered
        );
    }

    /// Declares `group` on `topic` with `patterns` (version "1").
    pub async fn declare(store: &TestStore, group: &str, topic: &str, patterns: &[&str]) {
        store
            .wharf()
            .register(
                &Registration::new(group, topic, "1", patterns).expect("a valid registration"),
            )
            .await
            .expect("declaring a test group");
    }
}
