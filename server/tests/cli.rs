//! End-to-end tests of the `wharf` binary itself: each test spawns the real executable against
//! a real store (a SQLite file in a temporary directory or, for the commands that talk to
//! Postgres, a fresh schema of the test Postgres) and checks exit codes and output.
//!
//! The binary cannot declare anything, so declarations are seeded in-process with the wharf
//! library pointed at the same file or schema. Projections are corrupted by hand with plain SQL
//! to exercise `projections rebuild --verify`.
//!
//! Postgres is found at `WHARF_TEST_PG_URL` (default `postgres://postgres@127.0.0.1:5432/test`).
//! When it cannot be reached the Postgres variants are skipped with a message, unless
//! `WHARF_REQUIRE_SERVICES=1`, in which case they fail.

#![allow(clippy::unwrap_used)]

/// Every response these tests receive is held to the generated OpenAPI document (ADR 0033).
#[path = "../../api/tests/support/contract.rs"]
#[allow(dead_code)]
mod contract;

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStderr, Command};
use tokio::task::JoinHandle;
use wharf::domain::{DeclarerId, RegisterOutcome};
use wharf::{Consumer, ConsumerState, Registration, Wharf};
use wharf_server::Config;

/// The binary under test.
const WHARF: &str = env!("CARGO_BIN_EXE_wharf");
/// The longest any one-shot command may take.
const COMMAND_DEADLINE: Duration = Duration::from_secs(60);
/// The longest a seeded consumer may take to reach a state.
const STATE_DEADLINE: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------------------------
// Running the binary
// ---------------------------------------------------------------------------------------------

/// What a finished command left behind.
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
    /// Asserts exit code 0 and returns stdout.
    fn success(&self) -> &str {
        assert_eq!(self.code, Some(0), "expected success: {self}");
        &self.stdout
    }

    /// Asserts a non-zero exit code and returns stderr.
    fn failure(&self) -> &str {
        assert!(
            matches!(self.code, Some(code) if code != 0),
            "expected failure: {self}"
        );
        &self.stderr
    }

    /// Asserts success and parses stdout as JSON.
    fn json(&self) -> Value {
        serde_json::from_str(self.success())
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self}"))
    }
}

/// The binary with a clean environment: no inherited `WHARF_*` or `RUST_LOG` variables, run
/// from `dir` so a relative store path lands there and nowhere else.
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

/// Runs `command` (with `args` appended) to completion within `deadline`.
async fn run_with(mut command: Command, args: &[&str], deadline: Duration) -> Run {
    command.args(args);
    let what = format!("wharf {}", args.join(" "));
    let output = tokio::time::timeout(deadline, command.output())
        .await
        .unwrap_or_else(|_| panic!("`{what}` did not finish within {deadline:?}"))
        .unwrap_or_else(|e| panic!("`{what}` could not be started: {e}"));
    Run {
        what,
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

async fn run(command: Command, args: &[&str]) -> Run {
    run_with(command, args, COMMAND_DEADLINE).await
}

/// Drops terminal escape sequences (`ESC [ ... letter`) from a log line.
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

// ---------------------------------------------------------------------------------------------
// A fresh store per test
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Postgres,
}

fn pg_url() -> String {
    std::env::var("WHARF_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

fn services_required() -> bool {
    std::env::var("WHARF_REQUIRE_SERVICES").is_ok_and(|v| v == "1")
}

/// A fresh, unmigrated store and a scratch directory the commands run in. A Postgres schema is
/// dropped when this is dropped; the SQLite file goes with the directory.
struct TestStore {
    dir: TempDir,
    url: String,
    schema: Option<String>,
}

impl TestStore {
    /// A fresh store; `None` (after saying why) when Postgres is unreachable and not required.
    async fn new(backend: Backend) -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        match backend {
            Backend::Sqlite => {
                let url = format!("sqlite://{}", dir.path().join("wharf.db").display());
                Some(Self {
                    dir,
                    url,
                    schema: None,
                })
            }
            Backend::Postgres => {
                let schema = format!("wharf_cli_{:016x}", rand::random::<u64>());
                let created = async {
                    let mut conn = pg_connect().await?;
                    sqlx::raw_sql(&format!("CREATE SCHEMA \"{schema}\""))
                        .execute(&mut conn)
                        .await?;
                    Ok::<_, sqlx::Error>(())
                }
                .await;
                if let Err(e) = created {
                    assert!(
                        !services_required(),
                        "Postgres at {} is required (WHARF_REQUIRE_SERVICES=1): {e}",
                        pg_url()
                    );
                    eprintln!("SKIPPED: Postgres at {} is unreachable: {e}", pg_url());
                    return None;
                }
                Some(Self {
                    dir,
                    url: pg_url(),
                    schema: Some(schema),
                })
            }
        }
    }

    fn sqlite_path(&self) -> PathBuf {
        self.dir.path().join("wharf.db")
    }

    /// The binary pointed at this store: `--store-url` for SQLite, `WHARF_STORE__URL` and
    /// `WHARF_STORE__SCHEMA` for Postgres, so both ways of naming a store are exercised.
    fn command(&self) -> Command {
        let mut command = wharf_in(self.dir.path());
        match &self.schema {
            None => {
                command.arg("--store-url").arg(&self.url);
            }
            Some(schema) => {
                command
                    .env("WHARF_STORE__URL", &self.url)
                    .env("WHARF_STORE__SCHEMA", schema);
            }
        }
        command
    }

    async fn run(&self, args: &[&str]) -> Run {
        run(self.command(), args).await
    }

    /// A library configuration on the same store: heartbeats and retries every 100 ms, a
    /// long TTL so a seeded consumer stays live for the whole seeding.
    fn config(&self) -> Config {
        let mut config = Config::default();
        config.store.url = self.url.clone();
        config.store.schema = self.schema.clone().unwrap_or_default();
        config.store.auto_migrate = false;
        config.declarations.retry_interval = Duration::from_millis(100);
        config.declarations.heartbeat_interval = Duration::from_millis(100);
        config.declarations.instance_ttl = Duration::from_secs(10);
        config
    }

    /// The library on the same (already migrated) store.
    async fn wharf(&self) -> Wharf {
        Wharf::open(&self.config().settings())
            .await
            .unwrap_or_else(|e| panic!("opening {} in-process: {e}", self.url))
    }

    /// Runs SQL directly on the store, behind Wharf's back.
    async fn execute(&self, sql: &str) {
        match &self.schema {
            None => {
                let conn = rusqlite::Connection::open(self.sqlite_path()).unwrap();
                conn.execute_batch(sql).unwrap();
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
}

async fn pg_connect() -> Result<sqlx::PgConnection, sqlx::Error> {
    use sqlx::Connection;
    sqlx::PgConnection::connect(&pg_url()).await
}

impl Drop for TestStore {
    fn drop(&mut self) {
        let Some(schema) = self.schema.take() else {
            return;
        };
        // Drop cannot await: drop the schema from a thread with its own runtime.
        let _ = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async {
                if let Ok(mut conn) = pg_connect().await {
                    let _ = sqlx::raw_sql(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                        .execute(&mut conn)
                        .await;
                }
            });
        })
        .join();
    }
}

/// Runs an async test body once per backend.
macro_rules! on_both_backends {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                super::$name(super::Backend::Sqlite).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                super::$name(super::Backend::Postgres).await;
            }
        }
    };
}

// ---------------------------------------------------------------------------------------------
// Seeding declarations in-process
// ---------------------------------------------------------------------------------------------

fn declarer(name: &str) -> DeclarerId {
    DeclarerId::parse("declarer", name).unwrap()
}

fn registration(group: &str, patterns: &[&str]) -> Registration {
    Registration::new(group, "orders", "1.0.0", patterns).unwrap()
}

async fn until_ready(consumer: &Consumer, what: &str) {
    let mut watch = consumer.watch();
    tokio::time::timeout(STATE_DEADLINE, watch.wait_for(ConsumerState::is_ready))
        .await
        .unwrap_or_else(|_| panic!("{what}: stuck in {:?}", consumer.state()))
        .unwrap();
}

async fn register(wharf: &Wharf, who: &str, group: &str, patterns: &[&str]) -> RegisterOutcome {
    wharf
        .as_declarer(declarer(who))
        .register(&registration(group, patterns))
        .await
        .unwrap_or_else(|e| panic!("{who} registering on {group}: {e}"))
}

/// Seeds two groups on a migrated store:
/// - `billing`: `alpha-1` consumes `{orders/+/paid}` (live, returned; its consumer is the
///   instance `alpha-1/1`), then `beta-1` asks for
///   `{orders/eu/#}` and waits on it;
/// - `shipping`: `gamma-1` installs `{orders/us/#}` with a bare register.
async fn seed_groups(store: &TestStore) -> Consumer {
    let wharf = store.wharf().await;
    let alpha = wharf
        .as_declarer(declarer("alpha-1"))
        .consume(registration("billing", &["orders/+/paid"]));
    until_ready(&alpha, "alpha-1 consuming billing").await;
    let outcome = register(&wharf, "beta-1", "billing", &["orders/eu/#"]).await;
    assert!(
        matches!(outcome, RegisterOutcome::Waiting { .. }),
        "beta-1 must wait on alpha-1's live set: {outcome:?}"
    );
    let outcome = register(&wharf, "gamma-1", "shipping", &["orders/us/#"]).await;
    assert!(
        matches!(outcome, RegisterOutcome::Installed { .. }),
        "gamma-1 installs on an empty group: {outcome:?}"
    );
    alpha
}

/// A migrated, seeded store with every seeded consumer stopped (so nothing writes behind the
/// commands' backs).
async fn seeded(backend: Backend) -> Option<TestStore> {
    let store = TestStore::new(backend).await?;
    store.run(&["migrate"]).await.success();
    seed_groups(&store).await.shutdown().await;
    Some(store)
}

// ---------------------------------------------------------------------------------------------
// Help, flags and configuration
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn help_lists_the_commands_and_verbose_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let help = run(wharf_in(dir.path()), &["--help"]).await;
    let text = help.success();
    for command in [
        "serve",
        "migrate",
        "projections",
        "prune",
        "audit",
        "groups",
        "dead-letters",
        "config",
    ] {
        assert!(
            text.lines()
                .any(|line| line.trim_start().starts_with(command)),
            "--help must list `{command}`: {help}"
        );
    }
    let help = run(wharf_in(dir.path()), &["audit", "declarations", "--help"]).await;
    for flag in ["--group", "--after", "--limit", "--declarer", "--json"] {
        assert!(help.success().contains(flag), "{flag}: {help}");
    }

    let version = run(wharf_in(dir.path()), &["--version"]).await;
    assert!(
        version.success().contains(env!("CARGO_PKG_VERSION")),
        "{version}"
    );
    run(wharf_in(dir.path()), &[]).await.failure();
    run(wharf_in(dir.path()), &["no-such-command"])
        .await
        .failure();

    // -v before or after the command (it is global), and repeated.
    let url = format!("sqlite://{}", dir.path().join("v.db").display());
    let first = run(
        wharf_in(dir.path()),
        &["-v", "--store-url", &url, "migrate"],
    )
    .await;
    assert!(first.success().contains("applied "), "{first}");
    let again = run(
        wharf_in(dir.path()),
        &["--store-url", &url, "migrate", "-vv"],
    )
    .await;
    assert!(again.success().contains("schema is up to date"), "{again}");
}

#[tokio::test]
async fn the_default_configuration_is_valid_toml_and_drives_migrate() {
    let dir = tempfile::tempdir().unwrap();
    let printed = run(wharf_in(dir.path()), &["config", "default"]).await;
    let text = printed.success().to_owned();
    let table: toml::Table = text
        .parse()
        .unwrap_or_else(|e| panic!("`config default` is not TOML ({e}): {printed}"));
    assert_eq!(
        table["store"]["url"].as_str(),
        Some("sqlite://wharf.db"),
        "{printed}"
    );
    let parsed: Config = toml::from_str(&text).unwrap();
    assert_eq!(parsed, Config::default(), "the document is the defaults");

    // The default store is relative: `--config` with the printed file creates ./wharf.db.
    let file = dir.path().join("wharf.toml");
    std::fs::write(&file, &text).unwrap();
    let file_arg = file.display().to_string();
    let migrated = run(wharf_in(dir.path()), &["--config", &file_arg, "migrate"]).await;
    assert!(migrated.success().contains("applied "), "{migrated}");
    assert!(
        dir.path().join("wharf.db").is_file(),
        "the default store is ./wharf.db"
    );
    let again = run(wharf_in(dir.path()), &["-c", &file_arg, "migrate"]).await;
    assert!(again.success().contains("schema is up to date"), "{again}");

    // A file naming another store, found through WHARF_CONFIG, is honoured.
    let other = dir.path().join("other.db");
    let custom = dir.path().join("custom.toml");
    std::fs::write(
        &custom,
        text.replace(
            "url = \"sqlite://wharf.db\"",
            &format!("url = \"sqlite://{}\"", other.display()),
        ),
    )
    .unwrap();
    let mut command = wharf_in(dir.path());
    command.env("WHARF_CONFIG", &custom);
    let migrated = run(command, &["migrate"]).await;
    assert!(migrated.success().contains("applied "), "{migrated}");
    assert!(other.is_file(), "the configured store was created");
}

#[tokio::test]
async fn a_bad_configuration_exits_non_zero_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("WHARF_DECLARATIONS__INSTANCE_TTL", "1s", "instance_ttl"),
        ("WHARF_STORE__URLL", "x", "urll"),
        ("WHARF_STORE__URL", "mysql://x", "store.url"),
        ("WHARF_PRUNE__BATCH", "0", "prune.batch"),
        ("WHARF_STORAGE__URL", "x", "storage"),
    ];
    for (name, value, key) in cases {
        let mut command = wharf_in(dir.path());
        command.env(name, value);
        let failed = run(command, &["groups"]).await;
        assert!(
            failed.failure().contains(key),
            "{name}={value} must name {key}: {failed}"
        );
    }

    let failed = run(
        wharf_in(dir.path()),
        &["--store-url", "mysql://x", "groups"],
    )
    .await;
    let stderr = failed.failure();
    assert!(
        stderr.contains("mysql://x") && stderr.to_lowercase().contains("store url"),
        "a bad --store-url must be named: {failed}"
    );

    let failed = run(
        wharf_in(dir.path()),
        &["--config", "missing.toml", "groups"],
    )
    .await;
    assert!(failed.failure().contains("missing.toml"), "{failed}");

    let broken = dir.path().join("broken.toml");
    std::fs::write(&broken, "[store\nurl = 1\n").unwrap();
    let failed = run(
        wharf_in(dir.path()),
        &["--config", &broken.display().to_string(), "groups"],
    )
    .await;
    assert!(failed.failure().contains("broken.toml"), "{failed}");
    assert!(
        !dir.path().join("wharf.db").exists(),
        "a refused configuration opens no store"
    );
}

/// Type errors should name their key like the other configuration errors do.
#[tokio::test]
async fn a_value_of_the_wrong_type_names_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("WHARF_HTTP__LISTEN", "nope", "http.listen"),
        ("WHARF_PRUNE__RETENTION", "forever", "prune.retention"),
        (
            "WHARF_STORE__MAX_CONNECTIONS",
            "lots",
            "store.max_connections",
        ),
    ];
    for (name, value, key) in cases {
        let mut command = wharf_in(dir.path());
        command.env(name, value);
        let failed = run(command, &["groups"]).await;
        assert!(
            failed.failure().contains(key),
            "{name}={value} must name {key}: {failed}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// migrate and the unmigrated store
// ---------------------------------------------------------------------------------------------

async fn migrate_applies_once_then_is_up_to_date(backend: Backend) {
    let Some(store) = TestStore::new(backend).await else {
        return;
    };
    let first = store.run(&["migrate"]).await;
    let applied: Vec<&str> = first.success().lines().collect();
    assert!(!applied.is_empty(), "{first}");
    assert!(
        applied.iter().all(|line| line.starts_with("applied ")),
        "{first}"
    );
    assert!(applied.iter().any(|line| line.contains("0001")), "{first}");
    let second = store.run(&["migrate"]).await;
    assert_eq!(second.success().trim(), "schema is up to date", "{second}");
    // The migrated store is usable at once.
    let groups = store.run(&["groups", "--json"]).await;
    assert_eq!(
        groups.json(),
        serde_json::json!({ "groups": [], "next_after": null }),
        "{groups}"
    );
}

on_both_backends!(migrate_applies_once_then_is_up_to_date);

async fn an_unmigrated_store_is_refused_with_a_hint(backend: Backend) {
    let Some(store) = TestStore::new(backend).await else {
        return;
    };
    let commands: [&[&str]; 5] = [
        &["groups"],
        &["audit", "declarations", "--group", "billing"],
        &["prune", "--dry-run"],
        &["projections", "rebuild", "--verify"],
        &["projections", "rebuild"],
    ];
    for args in commands {
        let refused = store.run(args).await;
        assert!(
            refused.failure().contains("wharf migrate"),
            "an unmigrated store must point at `wharf migrate`: {refused}"
        );
    }
    // None of those created the schema behind the operator's back.
    let first = store.run(&["migrate"]).await;
    assert!(first.success().starts_with("applied "), "{first}");
}

on_both_backends!(an_unmigrated_store_is_refused_with_a_hint);

// ---------------------------------------------------------------------------------------------
// audit declarations and groups
// ---------------------------------------------------------------------------------------------

fn entries(page: &Value) -> &Vec<Value> {
    page["entries"].as_array().unwrap()
}

async fn audit_declarations_pages_and_filters(backend: Backend) {
    let Some(store) = seeded(backend).await else {
        return;
    };

    let table = store
        .run(&["audit", "declarations", "--group", "billing"])
        .await;
    let text = table.success();
    let header = text.lines().next().unwrap_or_default();
    assert!(
        header.contains("position") && header.contains("declarer") && header.contains("patterns"),
        "{table}"
    );
    let alpha = text
        .lines()
        .find(|l| l.contains("alpha-1"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        alpha.contains("installed") && alpha.contains("{orders/+/paid}"),
        "{table}"
    );
    let beta = text
        .lines()
        .find(|l| l.contains("beta-1"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        beta.contains("waiting") && beta.contains("{orders/eu/#}"),
        "{table}"
    );
    assert!(!text.contains("gamma-1"), "another group's entry: {table}");
    assert!(!text.contains("(more:"), "one page holds it all: {table}");

    let whole = store
        .run(&["audit", "declarations", "--group", "billing", "--json"])
        .await
        .json();
    let all = entries(&whole);
    assert_eq!(all.len(), 2, "{whole:#}");
    assert_eq!(
        all[0]["declarer"], "alpha-1/1",
        "the consumer instance installed"
    );
    assert_eq!(all[0]["status"], "installed");
    assert_eq!(all[0]["patterns"], serde_json::json!(["orders/+/paid"]));
    assert_eq!(all[1]["declarer"], "beta-1");
    assert_eq!(all[1]["status"], "waiting");
    assert_eq!(all[1]["patterns"], serde_json::json!(["orders/eu/#"]));
    assert_eq!(all[1]["incumbent"], serde_json::json!(["orders/+/paid"]));
    assert!(whole["next_after"].is_null(), "{whole:#}");

    // Paging one entry at a time walks the same entries in order.
    let first = store
        .run(&[
            "audit",
            "declarations",
            "--group",
            "billing",
            "--limit",
            "1",
            "--json",
        ])
        .await
        .json();
    assert_eq!(entries(&first).len(), 1, "{first:#}");
    assert_eq!(entries(&first)[0], all[0]);
    let cursor = first["next_after"]
        .as_i64()
        .unwrap_or_else(|| panic!("a full page names a cursor: {first:#}"));
    let cursor_arg = cursor.to_string();
    let second = store
        .run(&[
            "audit",
            "declarations",
            "--group",
            "billing",
            "--limit",
            "1",
            "--after",
            &cursor_arg,
            "--json",
        ])
        .await
        .json();
    assert_eq!(entries(&second).len(), 1, "{second:#}");
    assert_eq!(entries(&second)[0], all[1]);
    let tail_arg = second["next_after"].as_i64().unwrap().to_string();
    let tail = store
        .run(&[
            "audit",
            "declarations",
            "--group",
            "billing",
            "--limit",
            "1",
            "--after",
            &tail_arg,
            "--json",
        ])
        .await
        .json();
    assert!(entries(&tail).is_empty(), "{tail:#}");
    assert!(tail["next_after"].is_null(), "{tail:#}");

    // The table says how to fetch the next page.
    let paged = store
        .run(&[
            "audit",
            "declarations",
            "--group",
            "billing",
            "--limit",
            "1",
        ])
        .await;
    assert!(
        paged
            .success()
            .contains(&format!("(more: --after {cursor})")),
        "{paged}"
    );

    let filtered = store
        .run(&[
            "audit",
            "declarations",
            "--group",
            "billing",
            "--declarer",
            "beta-1",
            "--json",
        ])
        .await
        .json();
    assert_eq!(entries(&filtered), &vec![all[1].clone()], "{filtered:#}");
    let nobody = store
        .run(&[
            "audit",
            "declarations",
            "--group",
            "billing",
            "--declarer",
            "nobody",
            "--json",
        ])
        .await
        .json();
    assert!(entries(&nobody).is_empty(), "{nobody:#}");

    let unknown = store
        .run(&["audit", "declarations", "--group", "unknown", "--json"])
        .await
        .json();
    assert!(entries(&unknown).is_empty(), "{unknown:#}");

    let refused = store
        .run(&[
            "audit",
            "declarations",
            "--group",
            "billing",
            "--limit",
            "0",
        ])
        .await;
    assert!(refused.failure().contains("limit"), "{refused}");
    let refused = store
        .run(&["audit", "declarations", "--group", "a b"])
        .await;
    let stderr = refused.failure();
    assert!(
        stderr.contains("group") && stderr.contains("a b"),
        "{refused}"
    );
    let refused = store
        .run(&[
            "audit",
            "declarations",
            "--group",
            "billing",
            "--since",
            "yesterday",
        ])
        .await;
    assert!(refused.failure().contains("--since"), "{refused}");
}

on_both_backends!(audit_declarations_pages_and_filters);

fn find_group<'a>(page: &'a Value, name: &str) -> &'a Value {
    let groups = page.get("groups").unwrap_or(page);
    groups
        .as_array()
        .unwrap_or_else(|| panic!("a list of groups: {groups:#}"))
        .iter()
        .find(|g| g["group"] == name)
        .unwrap_or_else(|| panic!("group {name} is listed: {groups:#}"))
}

async fn groups_lists_effective_sets_and_waiters(backend: Backend) {
    let Some(store) = TestStore::new(backend).await else {
        return;
    };
    store.run(&["migrate"]).await.success();
    // Keep alpha-1 consuming while listing, so it shows as a live instance.
    let alpha = seed_groups(&store).await;

    let listing = store.run(&["groups"]).await;
    let text = listing.success();
    let billing = text
        .lines()
        .find(|l| l.starts_with("billing "))
        .unwrap_or_else(|| panic!("{listing}"));
    assert!(
        billing.contains("{orders/+/paid}")
            && billing.contains("alpha-1")
            && billing.contains("1 live instance(s)")
            && billing.contains("1 waiter(s)"),
        "{listing}"
    );
    let waiting = text
        .lines()
        .find(|l| l.contains("WAITING"))
        .unwrap_or_else(|| panic!("{listing}"));
    assert!(
        waiting.contains("beta-1") && waiting.contains("{orders/eu/#}"),
        "{listing}"
    );
    let shipping = text
        .lines()
        .find(|l| l.starts_with("shipping "))
        .unwrap_or_else(|| panic!("{listing}"));
    assert!(
        shipping.contains("{orders/us/#}")
            && shipping.contains("gamma-1")
            && shipping.contains("0 waiter(s)"),
        "{listing}"
    );

    let json = store.run(&["groups", "--json"]).await.json();
    assert_eq!(json["groups"].as_array().map(Vec::len), Some(2), "{json:#}");
    let billing = find_group(&json, "billing");
    assert_eq!(billing["topic"], "orders");
    assert_eq!(
        billing["effective"]["patterns"],
        serde_json::json!(["orders/+/paid"])
    );
    assert_eq!(billing["effective"]["declarer"], "alpha-1/1");
    // The listing is a summary: counts and the oldest waiter.
    assert_eq!(
        billing["waiters"],
        serde_json::json!({ "count": 1, "more": false }),
        "{billing:#}"
    );
    let oldest = &billing["oldest_waiter"];
    assert_eq!(oldest["declarer"], "beta-1");
    assert_eq!(oldest["patterns"], serde_json::json!(["orders/eu/#"]));
    assert_eq!(oldest["incumbent"], serde_json::json!(["orders/+/paid"]));
    assert_eq!(billing["live_instances"], 1, "{billing:#}");
    assert_eq!(billing["instances"], 1, "{billing:#}");
    let shipping = find_group(&json, "shipping");
    assert_eq!(
        shipping["effective"]["patterns"],
        serde_json::json!(["orders/us/#"])
    );
    assert_eq!(shipping["effective"]["whole_topic"], false);
    assert_eq!(shipping["waiters"]["count"], 0, "{shipping:#}");
    assert_eq!(shipping["oldest_waiter"], serde_json::Value::Null);

    alpha.shutdown().await;
}

on_both_backends!(groups_lists_effective_sets_and_waiters);

/// `groups` pages like the API: `--limit`, `--after` (the cursor the previous page printed),
/// `--topic`, `--waiting`; a bad cursor or limit names its flag.
async fn groups_pages_with_a_cursor_and_filters(backend: Backend) {
    let Some(store) = seeded(backend).await else {
        return;
    };
    let first = store.run(&["groups", "--limit", "1"]).await;
    let text = first.success();
    assert!(text.starts_with("billing "), "{first}");
    let cursor = text
        .lines()
        .find_map(|l| l.strip_prefix("(more: --after ")?.strip_suffix(')'))
        .unwrap_or_else(|| panic!("no cursor printed: {first}"))
        .to_owned();
    let second = store
        .run(&["groups", "--limit", "1", "--after", &cursor])
        .await;
    let text = second.success();
    assert!(text.starts_with("shipping "), "{second}");
    assert!(
        !text.contains("(more:"),
        "the last page names no cursor: {second}"
    );

    let page = store
        .run(&["groups", "--limit", "1", "--json"])
        .await
        .json();
    assert_eq!(page["next_after"], Value::from(cursor.as_str()), "{page:#}");
    let waiting = store.run(&["groups", "--waiting", "--json"]).await.json();
    let names: Vec<&str> = waiting["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["group"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["billing"], "{waiting:#}");
    let other_topic = store
        .run(&["groups", "--topic", "parcels", "--json"])
        .await
        .json();
    assert_eq!(
        other_topic["groups"],
        serde_json::json!([]),
        "{other_topic:#}"
    );

    let refused = store.run(&["groups", "--after", "billing"]).await;
    let stderr = refused.failure();
    assert!(
        stderr.contains("--after") && stderr.contains("billing"),
        "{refused}"
    );
    let refused = store.run(&["groups", "--limit", "0"]).await;
    assert!(refused.failure().contains("--limit"), "{refused}");
    let refused = store.run(&["groups", "--topic", "a/b"]).await;
    assert!(refused.failure().contains("--topic"), "{refused}");
}

on_both_backends!(groups_pages_with_a_cursor_and_filters);

// ---------------------------------------------------------------------------------------------
// projections rebuild
// ---------------------------------------------------------------------------------------------

/// Each group's effective `installs` counter, from `groups --json`.
async fn installs(store: &TestStore) -> Vec<(String, i64)> {
    let json = store.run(&["groups", "--json"]).await.json();
    let mut counts: Vec<(String, i64)> = json["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["group"].as_str().unwrap().to_owned(),
                g["effective"]["installs"].as_i64().unwrap(),
            )
        })
        .collect();
    counts.sort();
    counts
}

fn clean_installs() -> Vec<(String, i64)> {
    vec![("billing".to_owned(), 1), ("shipping".to_owned(), 1)]
}

async fn rebuild_verify_finds_and_apply_repairs_corruption(backend: Backend) {
    let Some(store) = seeded(backend).await else {
        return;
    };
    let verify = store.run(&["projections", "rebuild", "--verify"]).await;
    let text = verify.success();
    assert!(text.contains("replayed 3 events"), "{verify}");
    assert!(text.contains("match"), "{verify}");
    assert_eq!(installs(&store).await, clean_installs());

    store
        .execute("UPDATE effective_declaration SET installs = 99;")
        .await;
    let corrupted = vec![("billing".to_owned(), 99), ("shipping".to_owned(), 99)];
    assert_eq!(installs(&store).await, corrupted);

    let verify = store.run(&["projections", "rebuild", "--verify"]).await;
    assert_eq!(verify.code, Some(1), "differences exit 1: {verify}");
    assert!(verify.stdout.contains("DIFFERENCES"), "{verify}");
    assert!(
        verify
            .stdout
            .lines()
            .any(|l| l.split_whitespace().next() == Some("effective_declaration")),
        "verify must name effective_declaration: {verify}"
    );
    assert!(
        !verify
            .stdout
            .lines()
            .any(|l| l.starts_with("declarer_attempt")),
        "an untouched table is not named: {verify}"
    );
    assert_eq!(installs(&store).await, corrupted, "verify changes nothing");

    let apply = store.run(&["projections", "rebuild"]).await;
    assert!(apply.success().contains("rebuilt"), "{apply}");
    assert_eq!(installs(&store).await, clean_installs());
    let verify = store.run(&["projections", "rebuild", "--verify"]).await;
    assert!(verify.success().contains("match"), "{verify}");
    let json = store.run(&["groups", "--json"]).await.json();
    assert_eq!(
        find_group(&json, "billing")["waiters"]["count"],
        1,
        "the rebuilt listing keeps the waiter: {json:#}"
    );
}

on_both_backends!(rebuild_verify_finds_and_apply_repairs_corruption);

/// A wrong group snapshot (ADR 0034): `--verify` fails naming its group; a snapshot of a format
/// this build does not read is listed as ignored; `rebuild` re-derives the table.
async fn rebuild_verify_names_a_wrong_group_snapshot(backend: Backend) {
    let Some(store) = seeded(backend).await else {
        return;
    };
    store
        .execute(
            "INSERT INTO group_snapshot (group_name, sequence, format, state) VALUES \
             ('billing', 1, 1, '{\"effective\":null,\"waiting\":{},\"installs\":7}'), \
             ('shipping', 1, 0, 'an older format');",
        )
        .await;
    let verify = store.run(&["projections", "rebuild", "--verify"]).await;
    assert_eq!(verify.code, Some(1), "a wrong snapshot exits 1: {verify}");
    assert!(
        verify
            .stdout
            .contains("group snapshot of \"billing\" at sequence 1 is wrong"),
        "{verify}"
    );
    assert!(
        verify
            .stdout
            .contains("group snapshot of \"shipping\" at sequence 1 ignored"),
        "{verify}"
    );
    let apply = store.run(&["projections", "rebuild"]).await;
    assert!(
        apply.success().contains("group snapshots re-derived: 0"),
        "groups shorter than declarations.snapshot_every get none: {apply}"
    );
    let verify = store.run(&["projections", "rebuild", "--verify"]).await;
    assert!(
        verify.success().contains("0 group snapshots match"),
        "{verify}"
    );
}

on_both_backends!(rebuild_verify_names_a_wrong_group_snapshot);

// ---------------------------------------------------------------------------------------------
// prune
// ---------------------------------------------------------------------------------------------

/// The `payments` ledger as (position, declarer, status), via the CLI.
async fn payments_ledger(store: &TestStore) -> Vec<(i64, String, String)> {
    let page = store
        .run(&["audit", "declarations", "--group", "payments", "--json"])
        .await
        .json();
    entries(&page)
        .iter()
        .map(|e| {
            (
                e["position"].as_i64().unwrap(),
                e["declarer"].as_str().unwrap().to_owned(),
                e["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The count in `prune`'s one-line report ("dry run: N ..." / "deleted N ...").
fn reported_count(run: &Run, prefix: &str) -> u64 {
    let line = run.success().trim();
    line.strip_prefix(prefix)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("expected `{prefix}N ...`: {run}"))
}

async fn prune_deletes_only_superseded_waiting_attempts(backend: Backend) {
    let Some(store) = TestStore::new(backend).await else {
        return;
    };
    store.run(&["migrate"]).await.success();
    {
        let wharf = store.wharf().await;
        let incumbent = wharf
            .as_declarer(declarer("alpha-1"))
            .consume(registration("payments", &["orders/+/paid"]));
        until_ready(&incumbent, "alpha-1 consuming payments").await;
        for attempt in 1..=3 {
            let outcome = register(&wharf, "beta-1", "payments", &["orders/eu/#"]).await;
            assert!(
                matches!(outcome, RegisterOutcome::Waiting { .. }),
                "attempt {attempt} must wait: {outcome:?}"
            );
        }
        incumbent.shutdown().await;
    }
    let before = payments_ledger(&store).await;
    let statuses: Vec<&str> = before.iter().map(|e| e.2.as_str()).collect();
    assert_eq!(
        statuses,
        ["installed", "waiting", "waiting", "waiting"],
        "{before:?}"
    );

    // The default retention (a day) keeps everything.
    let kept = store.run(&["prune", "--dry-run"]).await;
    assert_eq!(reported_count(&kept, "dry run: "), 0);

    let dry = store
        .run(&["prune", "--dry-run", "--retention", "0s"])
        .await;
    assert_eq!(reported_count(&dry, "dry run: "), 2, "{dry}");
    assert_eq!(
        payments_ledger(&store).await,
        before,
        "a dry run deletes nothing"
    );

    let pruned = store.run(&["prune", "--retention", "0s"]).await;
    assert_eq!(reported_count(&pruned, "deleted "), 2, "{pruned}");
    let after = payments_ledger(&store).await;
    assert_eq!(
        after,
        vec![before[0].clone(), before[3].clone()],
        "the install and beta-1's newest attempt survive"
    );

    let again = store
        .run(&["prune", "--dry-run", "--retention", "0s"])
        .await;
    assert_eq!(reported_count(&again, "dry run: "), 0, "{again}");
    let verify = store.run(&["projections", "rebuild", "--verify"]).await;
    assert!(verify.success().contains("match"), "{verify}");

    let refused = store.run(&["prune", "--retention", "soon"]).await;
    assert!(refused.failure().contains("--retention"), "{refused}");
}

on_both_backends!(prune_deletes_only_superseded_waiting_attempts);

/// A message a group gave up on is listed, replayed once (a second replay fails, naming the
/// position), and `prune` then runs message log retention too.
async fn dead_letters_list_replay_and_retention(backend: Backend) {
    use wharf::queue::{Headers, NackOutcome, Queue, QueueSettings};
    let Some(store) = seeded(backend).await else {
        return;
    };
    let wharf = store.wharf().await;
    wharf
        .publish(
            "orders",
            vec![(
                "orders/eu/paid".to_owned(),
                b"boom".to_vec(),
                Headers::new(),
            )],
        )
        .await
        .unwrap();
    let group = wharf::domain::GroupName::parse("group", "billing").unwrap();
    let queue = Queue::new(
        wharf.store().clone(),
        QueueSettings {
            max_attempts: 1,
            ..QueueSettings::default()
        },
    );
    let claimed = queue.fetch(&group, "cli-test", 10).await.unwrap();
    assert_eq!(claimed.len(), 1);
    let nacked = queue.nack(&claimed[0], "handler exploded").await.unwrap();
    assert_eq!(nacked, NackOutcome::DeadLettered);

    let listed = store
        .run(&["dead-letters", "list", "--group", "billing", "--json"])
        .await
        .json();
    let letters = listed.as_array().unwrap();
    assert_eq!(letters.len(), 1, "{listed}");
    assert_eq!(letters[0]["subject"], "orders/eu/paid");
    assert_eq!(letters[0]["last_error"], "handler exploded");
    let table = store
        .run(&["dead-letters", "list", "--group", "billing"])
        .await;
    assert!(table.success().contains("handler exploded"), "{table}");
    let position = letters[0]["position"].to_string();

    let replayed = store
        .run(&[
            "dead-letters",
            "replay",
            "--group",
            "billing",
            "--position",
            &position,
        ])
        .await;
    assert!(replayed.success().contains("replayed"), "{replayed}");
    let again = store
        .run(&[
            "dead-letters",
            "replay",
            "--group",
            "billing",
            "--position",
            &position,
        ])
        .await;
    assert!(again.failure().contains(&position), "{again}");
    let bad = store
        .run(&["dead-letters", "list", "--group", "bil ling"])
        .await;
    assert!(bad.failure().contains("--group"), "{bad}");

    let back = queue.claim(&group, "cli-test", 10).await.unwrap();
    assert_eq!(back.len(), 1, "the replayed message is claimable again");
    assert_eq!(back[0].attempts, 1, "with fresh attempts");
    queue.ack(&back[0]).await.unwrap();
    // `shipping` reads the same topic and has not routed past the message: it must stay.
    let kept = store.run(&["prune"]).await;
    assert!(
        kept.success().contains("message log: deleted 0 messages"),
        "{kept}"
    );
    // Routed past is not consumed (ADR 0014): a later swap of `shipping` may still want the
    // message, so only its age removes it.
    let shipping = wharf::domain::GroupName::parse("group", "shipping").unwrap();
    queue.route(&shipping).await.unwrap();
    let still = store.run(&["prune"]).await;
    assert!(
        still.success().contains("message log: deleted 0 messages"),
        "{still}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut aged = store.command();
        aged.env("WHARF_QUEUE__RETENTION", "1s");
        let pruned = run(aged, &["prune"]).await;
        if pruned.success().contains("message log: deleted 1 messages") {
            break;
        }
        assert!(Instant::now() < deadline, "never aged out: {pruned}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
on_both_backends!(dead_letters_list_replay_and_retention);

async fn audit_swaps_shows_what_each_swap_set_aside(backend: Backend) {
    use wharf::queue::{Headers, Queue, QueueSettings};
    let Some(store) = seeded(backend).await else {
        return;
    };
    let wharf = store.wharf().await;
    let messages = ["orders/us/1", "orders/eu/1", "orders/us/2"]
        .iter()
        .map(|s| ((*s).to_owned(), Vec::new(), Headers::new()))
        .collect();
    wharf.publish("orders", messages).await.unwrap();
    let shipping = wharf::domain::GroupName::parse("group", "shipping").unwrap();
    let queue = Queue::new(wharf.store().clone(), QueueSettings::default());
    let held = queue.fetch(&shipping, "cli-test", 10).await.unwrap();
    assert_eq!(held.len(), 2, "{held:?}");
    let outcome = register(&wharf, "gamma-2", "shipping", &["orders/eu/#"]).await;
    assert!(
        matches!(outcome, RegisterOutcome::Installed { .. }),
        "{outcome:?}"
    );
    let handed = queue.fetch(&shipping, "cli-test", 10).await.unwrap();
    assert_eq!(
        handed.len(),
        1,
        "only orders/eu/1 under the new set: {handed:?}"
    );

    let listed = store
        .run(&["audit", "swaps", "--group", "shipping", "--json"])
        .await;
    let swaps: Value = serde_json::from_str(listed.success()).unwrap();
    let swaps = swaps.as_array().unwrap();
    assert_eq!(swaps.len(), 2, "{swaps:?}");
    assert_eq!(swaps[0]["patterns"], serde_json::json!(["orders/eu/#"]));
    assert_eq!(
        (swaps[0]["set_aside"].as_i64(), swaps[0]["kept"].as_i64()),
        (Some(2), Some(0))
    );
    let table = store.run(&["audit", "swaps", "--group", "shipping"]).await;
    assert!(table.success().contains("set_aside"), "{table}");
    let unknown = store.run(&["audit", "swaps", "--group", "nobody"]).await;
    assert!(unknown.failure().contains("nobody"), "{unknown}");
    let bad = store
        .run(&["audit", "swaps", "--group", "shipping", "--limit", "0"])
        .await;
    assert!(bad.failure().contains("--limit"), "{bad}");
}
on_both_backends!(audit_swaps_shows_what_each_swap_set_aside);

// ---------------------------------------------------------------------------------------------
// serve
// ---------------------------------------------------------------------------------------------

/// A running `wharf serve`.
struct Server {
    child: Child,
    address: SocketAddr,
    /// The stderr lines up to and including "wharf serving", as written.
    startup: Vec<String>,
    /// Collects the rest of stderr until the process closes it.
    rest: JoinHandle<Vec<String>>,
}

/// The `listen=ADDRESS` field of the "wharf serving" log line.
fn listen_address(line: &str) -> Option<SocketAddr> {
    let start = line.find("listen=")? + "listen=".len();
    line[start..].split_whitespace().next()?.parse().ok()
}

/// Reads stderr until the "wharf serving" line; returns the address it names.
async fn read_until_serving(
    lines: &mut Lines<BufReader<ChildStderr>>,
    startup: &mut Vec<String>,
) -> Option<SocketAddr> {
    while let Some(line) = lines.next_line().await.ok()? {
        startup.push(line.clone());
        let plain = strip_ansi(&line);
        if plain.contains("wharf serving") {
            return listen_address(&plain);
        }
    }
    None
}

async fn start_server(store: &TestStore) -> Server {
    start_server_with(store, &[]).await
}

/// `serve` with extra environment variables.
async fn start_server_with(store: &TestStore, env: &[(&str, &str)]) -> Server {
    let mut command = store.command();
    command.envs(env.iter().copied());
    command
        .arg("serve")
        .env("WHARF_HTTP__LISTEN", "127.0.0.1:0")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = command.spawn().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut startup = Vec::new();
    let found = tokio::time::timeout(
        Duration::from_secs(30),
        read_until_serving(&mut lines, &mut startup),
    )
    .await;
    let address = match found {
        Ok(Some(address)) => address,
        Ok(None) => panic!(
            "serve ended stderr without a `wharf serving ... listen=` line (exit {:?}):\n{}",
            child.try_wait().ok().flatten(),
            startup.join("\n")
        ),
        Err(_) => panic!(
            "serve did not log `wharf serving` within 30s:\n{}",
            startup.join("\n")
        ),
    };
    let rest = tokio::spawn(async move {
        let mut rest = Vec::new();
        while let Ok(Some(line)) = lines.next_line().await {
            rest.push(strip_ansi(&line));
        }
        rest
    });
    Server {
        child,
        address,
        startup,
        rest,
    }
}

impl Server {
    /// Sends SIGTERM and waits for the exit; returns the exit code and the rest of stderr.
    async fn terminate(mut self) -> (Option<i32>, Vec<String>) {
        let pid = self.child.id().expect("serve is still running").to_string();
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(status.success(), "kill -TERM {pid}: {status}");
        let status = tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .expect("serve exits within 20s of SIGTERM")
            .unwrap();
        let rest = tokio::time::timeout(Duration::from_secs(5), self.rest)
            .await
            .expect("stderr closes when serve exits")
            .unwrap();
        (status.code(), rest)
    }
}

async fn get(client: &reqwest::Client, address: SocketAddr, path: &str) -> (u16, Value) {
    let response = client
        .get(format!("http://{address}{path}"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let text = response.text().await.unwrap();
    contract::assert_conforms("GET", path, status, &content_type, &text);
    let body =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("GET {path}: body is not JSON: {e}"));
    (status, body)
}

async fn serve_answers_then_stops_cleanly_on_sigterm(backend: Backend) {
    let Some(store) = seeded(backend).await else {
        return;
    };
    let server = start_server(&store).await;
    assert!(
        server.address.ip().is_loopback() && server.address.port() != 0,
        "{}",
        server.address
    );
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();

    let (status, body) = get(&client, server.address, "/healthz").await;
    assert_eq!((status, &body["status"]), (200, &Value::from("pass")));
    let (status, body) = get(&client, server.address, "/readyz").await;
    assert_eq!(status, 200, "{body:#}");

    let (status, body) = get(&client, server.address, "/api/v1/groups").await;
    assert_eq!(status, 200, "{body:#}");
    let billing = find_group(&body["groups"], "billing");
    assert_eq!(
        billing["effective"]["patterns"],
        serde_json::json!(["orders/+/paid"])
    );
    assert_eq!(billing["oldest_waiter"]["declarer"], "beta-1");
    find_group(&body["groups"], "shipping");

    let (status, page) = get(
        &client,
        server.address,
        "/api/v1/groups/billing/declarations?limit=1",
    )
    .await;
    assert_eq!(status, 200, "{page:#}");
    assert_eq!(entries(&page).len(), 1, "{page:#}");
    assert!(page["next_after"].is_i64(), "{page:#}");

    // Prometheus metrics: the store's figures read at scrape time (ADR 0021).
    let response = client
        .get(format!("http://{}/metrics", server.address))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    let metrics = response.text().await.unwrap();
    assert!(metrics.contains("\nwharf_store_up 1\n"), "{metrics}");
    assert!(
        metrics.contains("wharf_group_installs_total{group=\"billing\""),
        "{metrics}"
    );

    let (code, rest) = server.terminate().await;
    assert_eq!(
        code,
        Some(0),
        "SIGTERM is a clean shutdown:\n{}",
        rest.join("\n")
    );
    assert!(
        rest.iter().any(|l| l.contains("wharf stopped")),
        "{}",
        rest.join("\n")
    );
}

on_both_backends!(serve_answers_then_stops_cleanly_on_sigterm);

/// `serve` takes its HTTP bounds from the `http` section: a connection that sends nothing is
/// closed after `http.idle_timeout` / `http.header_read_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_closes_a_silent_connection_after_the_configured_timeouts() {
    use tokio::io::AsyncReadExt;
    let store = seeded(Backend::Sqlite).await.unwrap();
    let server = start_server_with(
        &store,
        &[
            ("WHARF_HTTP__IDLE_TIMEOUT", "300ms"),
            ("WHARF_HTTP__HEADER_READ_TIMEOUT", "300ms"),
        ],
    )
    .await;
    let mut silent = tokio::net::TcpStream::connect(server.address)
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match silent.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "a silent connection was still open after 5s (the defaults are 10s and 60s)"
    );
    let (code, _) = server.terminate().await;
    assert_eq!(code, Some(0));
}

/// Log lines written to a pipe should be plain text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_logs_plain_text_to_a_pipe() {
    let store = seeded(Backend::Sqlite).await.unwrap();
    let server = start_server(&store).await;
    let startup = server.startup.clone();
    let (code, _) = server.terminate().await;
    assert_eq!(code, Some(0));
    assert!(
        startup.iter().all(|l| !l.contains('\u{1b}')),
        "escape codes in piped logs: {startup:?}"
    );
}

#[tokio::test]
async fn serve_fails_closed_when_the_store_is_unreachable() {
    let dir = tempfile::tempdir().unwrap();
    let mut command = wharf_in(dir.path());
    command
        .env("WHARF_STORE__URL", "postgres://postgres@127.0.0.1:1/test")
        .env("WHARF_HTTP__LISTEN", "127.0.0.1:0");
    let started = Instant::now();
    let failed = run_with(command, &["serve"], Duration::from_secs(30)).await;
    let stderr = failed.failure();
    assert!(stderr.contains("store"), "{failed}");
    assert!(
        !stderr.contains("wharf serving"),
        "serve must not listen without its store: {failed}"
    );
    println!("serve gave up after {:?}", started.elapsed());
}
