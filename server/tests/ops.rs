//! Operability of the `wharf` binary and library (issue 11): many processes starting together,
//! read-only commands that never create a store, store URLs and configuration values refused by
//! name, a corrupt SQLite file, and a store migrated by a newer build.
//!
//! Every test runs the real executable (or the library) against real SQLite files and a real
//! Postgres (`WHARF_TEST_PG_URL`, default `postgres://postgres@127.0.0.1:5432/test`). A
//! Postgres test skips with a message when the server is unreachable, unless
//! `WHARF_REQUIRE_SERVICES=1`.

#![allow(clippy::unwrap_used)]

use std::fmt;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;
use wharf::Wharf;
use wharf_server::Config;

const WHARF: &str = env!("CARGO_BIN_EXE_wharf");
const DEADLINE: Duration = Duration::from_secs(60);

struct Run {
    what: String,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl fmt::Display for Run {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` exited with {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.what, self.code, self.stdout, self.stderr
        )
    }
}

impl Run {
    fn success(&self) -> &str {
        assert_eq!(self.code, Some(0), "expected success: {self}");
        &self.stdout
    }

    /// Asserts exit code 1 (a refusal, never a panic's 101) and returns stderr.
    fn refused(&self) -> &str {
        assert_eq!(self.code, Some(1), "expected a refusal (exit 1): {self}");
        assert!(!self.stderr.contains("panicked"), "{self}");
        &self.stderr
    }
}

/// The binary in `dir` with no inherited `WHARF_*` or `RUST_LOG` variables.
fn wharf_in(dir: &Path) -> Command {
    let mut command = Command::new(WHARF);
    command
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    for (name, _) in std::env::vars() {
        if name.starts_with("WHARF_") {
            command.env_remove(name);
        }
    }
    command
}

async fn run(mut command: Command, args: &[&str]) -> Run {
    command.args(args);
    let what = format!("wharf {}", args.join(" "));
    let output = tokio::time::timeout(DEADLINE, command.output())
        .await
        .unwrap_or_else(|_| panic!("`{what}` did not finish within {DEADLINE:?}"))
        .unwrap();
    Run {
        what,
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn pg_url() -> String {
    std::env::var("WHARF_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

async fn pg_connect() -> Option<sqlx::PgConnection> {
    use sqlx::Connection;
    match sqlx::PgConnection::connect(&pg_url()).await {
        Ok(conn) => Some(conn),
        Err(e) => {
            assert!(
                std::env::var("WHARF_REQUIRE_SERVICES").as_deref() != Ok("1"),
                "Postgres at {} is required: {e}",
                pg_url()
            );
            eprintln!("SKIPPED: Postgres at {} is unreachable: {e}", pg_url());
            None
        }
    }
}

/// A schema name nobody has created; dropped by [`drop_schema`].
fn fresh_schema(prefix: &str) -> String {
    format!("{prefix}_{:016x}", rand::random::<u64>())
}

async fn schema_exists(conn: &mut sqlx::PgConnection, schema: &str) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
        .bind(schema)
        .fetch_one(conn)
        .await
        .unwrap()
}

async fn drop_schema(conn: &mut sqlx::PgConnection, schema: &str) {
    sqlx::raw_sql(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
        .execute(conn)
        .await
        .unwrap();
}

fn pg_command(dir: &Path, schema: &str) -> Command {
    let mut command = wharf_in(dir);
    command
        .env("WHARF_STORE__URL", pg_url())
        .env("WHARF_STORE__SCHEMA", schema);
    command
}

fn pg_config(schema: &str) -> Config {
    let mut config = Config::default();
    config.store.url = pg_url();
    config.store.schema = schema.to_owned();
    config
}

// ---------------------------------------------------------------------------------------------
// A: any number of processes may start together
// ---------------------------------------------------------------------------------------------

const PROCESSES: usize = 8;
const ROUNDS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_migrate_processes_on_a_fresh_postgres_schema_all_succeed() {
    let Some(mut conn) = pg_connect().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    for round in 0..ROUNDS {
        let schema = fresh_schema("wharf_ops_race");
        let runs = futures::future::join_all(
            (0..PROCESSES).map(|_| run(pg_command(dir.path(), &schema), &["migrate"])),
        )
        .await;
        drop_schema(&mut conn, &schema).await;
        let failed: Vec<String> = runs
            .iter()
            .filter(|r| r.code != Some(0))
            .map(ToString::to_string)
            .collect();
        assert!(
            failed.is_empty(),
            "round {round}: {} of {PROCESSES} failed:\n{}",
            failed.len(),
            failed.join("\n")
        );
        let applied = runs
            .iter()
            .filter(|r| r.stdout.contains("applied "))
            .count();
        assert_eq!(applied, 1, "exactly one process applies the migrations");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_library_opens_on_a_fresh_postgres_schema_all_succeed() {
    let Some(mut conn) = pg_connect().await else {
        return;
    };
    for round in 0..ROUNDS {
        let schema = fresh_schema("wharf_ops_open");
        let config = pg_config(&schema);
        let opens = futures::future::join_all((0..PROCESSES).map(|_| {
            let config = config.clone();
            async move { Wharf::open(&config.settings()).await.map(|_| ()) }
        }))
        .await;
        drop_schema(&mut conn, &schema).await;
        let failed: Vec<String> = opens
            .into_iter()
            .filter_map(|opened| opened.err().map(|e| e.to_string()))
            .collect();
        assert!(
            failed.is_empty(),
            "round {round}: {} of {PROCESSES} opens failed: {failed:?}",
            failed.len()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_migrate_processes_and_library_opens_on_a_fresh_sqlite_file_all_succeed() {
    for round in 0..ROUNDS {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("race.db").display());
        let runs = futures::future::join_all((0..PROCESSES).map(|_| {
            let mut command = wharf_in(dir.path());
            command.args(["--store-url", &url]);
            run(command, &["migrate"])
        }))
        .await;
        let failed: Vec<String> = runs
            .iter()
            .filter(|r| r.code != Some(0))
            .map(ToString::to_string)
            .collect();
        assert!(failed.is_empty(), "round {round}:\n{}", failed.join("\n"));

        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::default();
        config.store.url = format!("sqlite://{}", dir.path().join("open.db").display());
        let opens = futures::future::join_all((0..PROCESSES).map(|_| {
            let config = config.clone();
            async move { Wharf::open(&config.settings()).await.map(|_| ()) }
        }))
        .await;
        let failed: Vec<String> = opens
            .into_iter()
            .filter_map(|opened| opened.err().map(|e| e.to_string()))
            .collect();
        assert!(failed.is_empty(), "round {round}: {failed:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// A: read-only commands never create a store; unknown store URLs are refused
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn read_only_commands_in_an_empty_folder_create_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let commands: [&[&str]; 5] = [
        &["groups"],
        &["groups", "--json"],
        &["audit", "declarations", "--group", "billing"],
        &["dead-letters", "list", "--group", "billing"],
        &["prune", "--dry-run"],
    ];
    for args in commands {
        let refused = run(wharf_in(dir.path()), args).await;
        let stderr = refused.refused();
        assert!(
            stderr.contains("wharf.db") && stderr.contains("wharf migrate"),
            "the refusal names the missing file and the way to create it: {refused}"
        );
        assert_eq!(files_in(dir.path()), Vec::<String>::new(), "{refused}");
    }
    run(wharf_in(dir.path()), &["config", "default"])
        .await
        .success();
    assert_eq!(files_in(dir.path()), Vec::<String>::new());

    // The documented default still creates ./wharf.db where a store is meant to be created.
    run(wharf_in(dir.path()), &["migrate"]).await.success();
    assert!(dir.path().join("wharf.db").is_file());
    run(wharf_in(dir.path()), &["groups"]).await.success();
}

/// The library with `auto_migrate = false` creates nothing either.
#[tokio::test]
async fn a_library_open_without_auto_migrate_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::default();
    config.store.url = format!("sqlite://{}", dir.path().join("wharf.db").display());
    config.store.auto_migrate = false;
    let refused = Wharf::open(&config.settings())
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(refused.contains("wharf.db"), "{refused}");
    assert_eq!(files_in(dir.path()), Vec::<String>::new());

    let Some(mut conn) = pg_connect().await else {
        return;
    };
    let schema = fresh_schema("wharf_ops_noauto");
    let mut config = pg_config(&schema);
    config.store.auto_migrate = false;
    let refused = Wharf::open(&config.settings())
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(refused.contains(&schema), "{refused}");
    assert!(!schema_exists(&mut conn, &schema).await);
}

#[tokio::test]
async fn read_only_commands_never_create_a_postgres_schema() {
    let Some(mut conn) = pg_connect().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let schema = fresh_schema("wharf_ops_ro");
    for args in [
        &["groups"][..],
        &["audit", "declarations", "--group", "billing"],
        &["dead-letters", "list", "--group", "billing"],
    ] {
        let refused = run(pg_command(dir.path(), &schema), args).await;
        assert!(
            refused.refused().contains(&schema) && refused.stderr.contains("wharf migrate"),
            "{refused}"
        );
        assert!(!schema_exists(&mut conn, &schema).await, "{refused}");
    }
}

#[tokio::test]
async fn a_store_url_of_no_known_form_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    for url in [
        "::::",
        "wharf.db",
        "mysql://x",
        "sqlite://",
        "file:wharf.db",
    ] {
        for command in ["groups", "migrate"] {
            let refused = run(wharf_in(dir.path()), &["--store-url", url, command]).await;
            let stderr = refused.refused();
            assert!(
                stderr.contains(&format!("\"{url}\"")) && stderr.contains("sqlite://PATH"),
                "the refusal quotes the value and the accepted forms: {refused}"
            );
        }
    }
    assert_eq!(files_in(dir.path()), Vec::<String>::new());
    let file = dir.path().join("a.db");
    let url = format!("sqlite:{}", file.display());
    run(wharf_in(dir.path()), &["--store-url", &url, "migrate"])
        .await
        .success();
    assert!(file.is_file(), "sqlite:PATH is still accepted");
}

// ---------------------------------------------------------------------------------------------
// D: configuration values refused by name
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn max_connections_out_of_bounds_is_refused_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    for value in ["0", "100000"] {
        let mut command = wharf_in(dir.path());
        command
            .env("WHARF_STORE__MAX_CONNECTIONS", value)
            .args(["--store-url", &pg_url()]);
        let refused = run(command, &["groups"]).await;
        let stderr = refused.refused();
        assert!(
            stderr.contains("store.max_connections") && stderr.contains(value),
            "{refused}"
        );
    }
}

#[tokio::test]
async fn an_invalid_schema_is_reported_as_the_schema_not_the_url() {
    let dir = tempfile::tempdir().unwrap();
    let mut command = wharf_in(dir.path());
    command
        .env("WHARF_STORE__URL", "postgres://postgres@127.0.0.1:1/test")
        .env("WHARF_STORE__SCHEMA", "bad-name");
    let refused = run(command, &["groups"]).await;
    let stderr = refused.refused();
    assert!(
        stderr.contains("store.schema") && stderr.contains("\"bad-name\""),
        "{refused}"
    );
    assert!(!stderr.to_lowercase().contains("store url"), "{refused}");
}

#[tokio::test]
async fn a_numeric_schema_name_is_a_string() {
    let Some(mut conn) = pg_connect().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let schema = format!("{}", 1_000_000 + rand::random::<u32>() % 1_000_000);
    let migrated = run(pg_command(dir.path(), &schema), &["migrate"]).await;
    drop_schema(&mut conn, &schema).await;
    assert!(migrated.success().contains("applied "), "{migrated}");
}

#[tokio::test]
async fn retention_beyond_the_bounds_is_refused_at_parse_time() {
    let dir = tempfile::tempdir().unwrap();
    run(wharf_in(dir.path()), &["migrate"]).await.success();
    let refused = run(
        wharf_in(dir.path()),
        &["prune", "--retention", "99999999999years"],
    )
    .await;
    let stderr = refused.failure_any();
    assert!(
        stderr.contains("--retention") && stderr.contains("100 years"),
        "{refused}"
    );
    let refused = run(wharf_in(dir.path()), &["prune", "--retention", "forever"]).await;
    assert!(
        refused.failure_any().contains("7d"),
        "the error names the accepted format: {refused}"
    );
    for (name, key) in [
        ("WHARF_PRUNE__RETENTION", "prune.retention"),
        ("WHARF_QUEUE__RETENTION", "queue.retention"),
    ] {
        let mut command = wharf_in(dir.path());
        command.env(name, "99999999999years");
        let refused = run(command, &["prune", "--dry-run"]).await;
        let stderr = refused.refused();
        assert!(
            stderr.contains(key) && stderr.contains("100 years"),
            "{refused}"
        );
    }
}

#[tokio::test]
async fn times_name_their_accepted_format() {
    let dir = tempfile::tempdir().unwrap();
    let refused = run(
        wharf_in(dir.path()),
        &[
            "audit",
            "declarations",
            "--group",
            "billing",
            "--since",
            "yesterday",
        ],
    )
    .await;
    let stderr = refused.failure_any();
    assert!(
        stderr.contains("RFC 3339") && stderr.contains("2024-05-01T12:00:00Z"),
        "{refused}"
    );
}

#[tokio::test]
async fn an_unknown_wharf_variable_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut command = wharf_in(dir.path());
    command.env("WHARF_FOO", "1");
    let refused = run(command, &["migrate"]).await;
    assert!(refused.refused().contains("WHARF_FOO"), "{refused}");
    assert_eq!(files_in(dir.path()), Vec::<String>::new());
}

impl Run {
    /// Any non-zero exit that is not a panic (clap's usage errors exit 2).
    fn failure_any(&self) -> &str {
        assert!(
            matches!(self.code, Some(code) if code != 0 && code != 101),
            "expected a refusal: {self}"
        );
        &self.stderr
    }
}

// ---------------------------------------------------------------------------------------------
// B: a store migrated by a newer build; a corrupt SQLite file
// ---------------------------------------------------------------------------------------------

/// Runs SQL on a SQLite file or a Postgres schema behind Wharf's back.
async fn execute(url: &str, schema: Option<&str>, sql: &str) {
    match schema {
        None => {
            let path = url.strip_prefix("sqlite://").unwrap();
            rusqlite::Connection::open(path)
                .unwrap()
                .execute_batch(sql)
                .unwrap();
        }
        Some(schema) => {
            let mut conn = pg_connect().await.unwrap();
            sqlx::raw_sql(&format!("SET search_path TO \"{schema}\"; {sql}"))
                .execute(&mut conn)
                .await
                .unwrap();
        }
    }
}

async fn a_newer_schema_is_read_but_never_migrated_pruned_or_rebuilt(postgres: bool) {
    let dir = tempfile::tempdir().unwrap();
    let (url, schema) = if postgres {
        let Some(_) = pg_connect().await else {
            return;
        };
        (pg_url(), Some(fresh_schema("wharf_ops_newer")))
    } else {
        let url = format!("sqlite://{}", dir.path().join("wharf.db").display());
        (url, None)
    };
    let command = || {
        let mut command = wharf_in(dir.path());
        command.env("WHARF_STORE__URL", &url);
        if let Some(schema) = &schema {
            command.env("WHARF_STORE__SCHEMA", schema);
        }
        command
    };
    run(command(), &["migrate"]).await.success();
    let known = run(command(), &["migrate"]).await;
    assert!(known.success().contains("up to date"), "{known}");
    let now = if postgres { "clock_timestamp()" } else { "0" };
    execute(
        &url,
        schema.as_deref(),
        &format!(
            "INSERT INTO wharf_schema_migrations (version, name, applied_at) \
             VALUES (99, '0099_from_a_newer_build.sql', {now})"
        ),
    )
    .await;

    // The library opens it (without migrating) and declares, publishes and reads.
    {
        let mut config = Config::default();
        config.store.url = url.clone();
        config.store.schema = schema.clone().unwrap_or_default();
        let wharf = Wharf::open(&config.settings()).await.unwrap();
        let registration =
            wharf::Registration::new("billing", "orders", "1.0.0", &["orders/+/paid"]).unwrap();
        let outcome = wharf.register(&registration).await.unwrap();
        assert!(outcome.may_consume(), "{outcome:?}");
        wharf
            .publish(
                "orders",
                vec![("orders/eu/paid".into(), b"{}".to_vec(), Default::default())],
            )
            .await
            .unwrap();
        assert_eq!(wharf.store().schema_version().await.unwrap(), 99);
    }
    // Reads keep working.
    run(command(), &["groups", "--json"]).await.success();
    run(
        command(),
        &["dead-letters", "list", "--group", "billing", "--json"],
    )
    .await
    .success();
    // What rewrites or deletes refuses, naming both versions.
    let scripts = if postgres {
        wharf::store::migrate::POSTGRES
    } else {
        wharf::store::migrate::SQLITE
    };
    let known = wharf::store::migrate::needed(scripts).to_string();
    for args in [
        &["migrate"][..],
        &["prune"],
        &["prune", "--dry-run"],
        &["projections", "rebuild"],
        &["projections", "rebuild", "--verify"],
    ] {
        let refused = run(command(), args).await;
        let stderr = refused.refused();
        assert!(
            stderr.contains("version 99") && stderr.contains(&format!("({known})")),
            "{refused}"
        );
    }
    // A newer build that records a compatibility floor above this build stops reads too.
    execute(
        &url,
        schema.as_deref(),
        "CREATE TABLE wharf_schema_compat (readers_from BIGINT NOT NULL); \
         INSERT INTO wharf_schema_compat VALUES (99)",
    )
    .await;
    let refused = run(command(), &["groups"]).await;
    assert!(
        refused
            .refused()
            .contains("readable only by builds that know version 99"),
        "{refused}"
    );
    if let Some(schema) = &schema {
        drop_schema(&mut pg_connect().await.unwrap(), schema).await;
    }
}

#[tokio::test]
async fn a_newer_sqlite_schema_is_read_but_never_migrated_pruned_or_rebuilt() {
    a_newer_schema_is_read_but_never_migrated_pruned_or_rebuilt(false).await;
}

#[tokio::test]
async fn a_newer_postgres_schema_is_read_but_never_migrated_pruned_or_rebuilt() {
    a_newer_schema_is_read_but_never_migrated_pruned_or_rebuilt(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_a_sqlite_file_with_a_corrupt_page() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wharf.db");
    let url = format!("sqlite://{}", path.display());
    {
        let mut config = Config::default();
        config.store.url = url.clone();
        let wharf = Wharf::open(&config.settings()).await.unwrap();
        for group in ["billing", "shipping", "audit"] {
            let registration =
                wharf::Registration::new(group, "orders", "1.0.0", &["orders/+/paid"]).unwrap();
            wharf.register(&registration).await.unwrap();
        }
    }
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    let page_size: u64 = conn
        .query_row("PRAGMA page_size", [], |row| row.get(0))
        .unwrap();
    let root: u64 = conn
        .query_row(
            "SELECT rootpage FROM sqlite_master WHERE name = 'events'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    drop(conn);
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.seek(SeekFrom::Start((root - 1) * page_size)).unwrap();
        file.write_all(&vec![0xA5; page_size as usize]).unwrap();
        file.sync_all().unwrap();
    }

    let mut command = wharf_in(dir.path());
    command
        .env("WHARF_STORE__URL", &url)
        .env("WHARF_HTTP__LISTEN", "127.0.0.1:0");
    let refused = run(command, &["serve"]).await;
    let stderr = refused.refused();
    assert!(
        stderr.contains("integrity check")
            && stderr.contains(&path.display().to_string())
            && !stderr.contains("wharf serving"),
        "{refused}"
    );
}
