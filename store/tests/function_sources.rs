//! Each Postgres function has one source file, and a migrated store holds it as written
//! (ADR 0073).
//!
//! - A fresh schema migrated by this build's scripts defines each function of
//!   `migrations/postgres/functions/<name>.sql` as that file does: the same body (`prosrc`, the
//!   text between the dollar quotes), arguments, result, and whole definition
//!   (`pg_get_function_identity_arguments`, `pg_get_function_result`, `pg_get_functiondef`:
//!   language, volatility, settings), the file's definition made in a schema of its own.
//! - Every function the migrated schema holds has such a file, and each file defines functions
//!   of its own name only.
//! - No migration script defines a function itself: each includes its function's file.
//! - The comparison fails on a file edited without a migration that creates it so, and on a
//!   function without a file.
//!
//! Postgres is found at `WHARF_TEST_PG_URL` (default `postgres://postgres@127.0.0.1:5432/test`).
//! When it cannot be reached the tests are skipped, or fail with `WHARF_REQUIRE_SERVICES=1`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sqlx::{Connection, Executor, PgConnection};
use wharf_store::{PgSettings, PgStore};

fn pg_url() -> String {
    std::env::var("WHARF_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A connection to the test database, or `None` (the test skips) when it cannot be reached and
/// `WHARF_REQUIRE_SERVICES` is not `1`.
async fn pg_connect() -> Option<PgConnection> {
    match PgConnection::connect(&pg_url()).await {
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

fn migrations_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations/postgres")
}

/// Each function source file, by function name (the file's stem), with its text.
fn function_files() -> BTreeMap<String, String> {
    let dir = migrations_dir().join("functions");
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).expect("migrations/postgres/functions") {
        let path = entry.expect("a function file").path();
        assert_eq!(
            path.extension().and_then(|e| e.to_str()),
            Some("sql"),
            "{}: only `<function>.sql` files belong in functions/",
            path.display()
        );
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("a file name")
            .to_owned();
        let text = std::fs::read_to_string(&path).expect("a function file's text");
        files.insert(name, text);
    }
    assert!(!files.is_empty(), "no function files in {}", dir.display());
    files
}

/// One function as the catalog holds it.
#[derive(Debug, PartialEq, Eq)]
struct Definition {
    result: String,
    body: String,
    /// `pg_get_functiondef`, the schema's name replaced by `<schema>`.
    whole: String,
}

/// Every function of `schema`, by `name(identity arguments)`.
async fn functions(conn: &mut PgConnection, schema: &str) -> BTreeMap<String, Definition> {
    let rows: Vec<(String, String, String, String, String)> = sqlx::query_as(
        "SELECT p.proname::text, pg_get_function_identity_arguments(p.oid), \
                pg_get_function_result(p.oid), p.prosrc, pg_get_functiondef(p.oid) \
         FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
         WHERE n.nspname = $1",
    )
    .bind(schema)
    .fetch_all(&mut *conn)
    .await
    .expect("reading the schema's functions");
    rows.into_iter()
        .map(|(name, arguments, result, body, whole)| {
            (
                format!("{name}({arguments})"),
                Definition {
                    result,
                    body,
                    whole: whole.replace(schema, "<schema>"),
                },
            )
        })
        .collect()
}

/// A schema nobody has created yet.
fn fresh_schema(prefix: &str) -> String {
    format!("{prefix}_{:016x}", rand::random::<u64>())
}

async fn drop_schema(conn: &mut PgConnection, schema: &str) {
    conn.execute(format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE").as_str())
        .await
        .expect("dropping a test schema");
}

/// A fresh schema migrated by this build's scripts, as a store migrates (its pool's
/// `search_path` the schema).
async fn migrated_schema() -> String {
    let schema = fresh_schema("wharf_fn_migrated");
    let settings = PgSettings {
        schema: Some(schema.clone()),
        max_connections: 2,
        ..PgSettings::new(pg_url())
    };
    PgStore::create_schema(&settings)
        .await
        .expect("creating the migrated schema");
    let store = PgStore::connect(&settings, Vec::new()).expect("a store on the schema");
    store.migrate().await.expect("migrating a fresh schema");
    store.pool().close().await;
    schema
}

/// What differs between the functions of `migrated` and those `files` define (each file run
/// alone, in order, in a schema of its own, with that schema as the `search_path` as a
/// migration has its store's): one line per difference, none when every function is as its
/// file defines it and has one.
async fn differences(
    conn: &mut PgConnection,
    migrated: &str,
    files: &BTreeMap<String, String>,
) -> Vec<String> {
    let sources = fresh_schema("wharf_fn_files");
    conn.execute(format!("CREATE SCHEMA \"{sources}\"").as_str())
        .await
        .expect("creating the files' schema");
    conn.execute(format!("SET search_path TO \"{sources}\"").as_str())
        .await
        .expect("setting the search path");
    let mut found = Vec::new();
    // Which file defines each function of the files' schema.
    let mut defined_by: BTreeMap<String, String> = BTreeMap::new();
    for (name, text) in files {
        if let Err(e) = sqlx::raw_sql(text).execute(&mut *conn).await {
            found.push(format!("functions/{name}.sql does not run: {e}"));
            continue;
        }
        let now = functions(conn, &sources).await;
        let new: Vec<&String> = now
            .keys()
            .filter(|f| !defined_by.contains_key(*f))
            .collect();
        if new.is_empty() {
            found.push(format!(
                "functions/{name}.sql defines no function of its own"
            ));
        }
        for function in new {
            if !function.starts_with(&format!("{name}(")) {
                found.push(format!(
                    "functions/{name}.sql defines {function}: a file defines functions of its \
                     own name only"
                ));
            }
            defined_by.insert(function.clone(), name.clone());
        }
    }
    let written = functions(conn, &sources).await;
    let created = functions(conn, migrated).await;
    conn.execute("RESET search_path")
        .await
        .expect("resetting the search path");
    drop_schema(conn, &sources).await;

    for (function, file) in &written {
        let source = &defined_by[function];
        match created.get(function) {
            None => found.push(format!(
                "{function} of functions/{source}.sql: no migration creates it"
            )),
            Some(made) if made != file => {
                let what = if made.body != file.body {
                    "its body (prosrc)"
                } else if made.result != file.result {
                    "its result"
                } else {
                    "its definition (pg_get_functiondef)"
                };
                found.push(format!(
                    "{function}: {what} in the migrated store differs from \
                     functions/{source}.sql\n-- migrated:\n{}\n-- file:\n{}",
                    made.whole, file.whole
                ));
            }
            Some(_) => {}
        }
    }
    for function in created.keys().filter(|f| !written.contains_key(*f)) {
        found.push(format!(
            "{function}: the migrated store has it, but no file in functions/ defines it"
        ));
    }
    found
}

#[tokio::test]
async fn every_function_is_as_its_one_source_file_defines_it() {
    let Some(mut conn) = pg_connect().await else {
        return;
    };
    let migrated = migrated_schema().await;
    let files = function_files();
    let found = differences(&mut conn, &migrated, &files).await;
    drop_schema(&mut conn, &migrated).await;
    assert!(found.is_empty(), "{}", found.join("\n\n"));
}

#[test]
fn no_migration_defines_a_function_itself() {
    let mut scripts: Vec<PathBuf> = std::fs::read_dir(migrations_dir())
        .expect("migrations/postgres")
        .map(|entry| entry.expect("a migration").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "sql"))
        .collect();
    scripts.sort();
    assert!(!scripts.is_empty(), "no migration scripts");
    for script in scripts {
        let text = std::fs::read_to_string(&script).expect("a migration's text");
        for line in text.lines() {
            let words: Vec<String> = line
                .split_whitespace()
                .take(4)
                .map(str::to_ascii_uppercase)
                .collect();
            let defines = matches!(
                words.iter().map(String::as_str).collect::<Vec<_>>()[..],
                ["CREATE", "FUNCTION", ..] | ["CREATE", "OR", "REPLACE", "FUNCTION"]
            );
            assert!(
                !defines,
                "{} defines a function itself ({line}): put it in functions/<name>.sql and \
                 include that (ADR 0073)",
                script.display()
            );
        }
    }
}

/// The comparison fails when it should: on a file whose body no migration creates (here the
/// text a migration included, edited), and on a function no file defines.
#[tokio::test]
async fn an_edited_file_and_a_function_without_a_file_are_found() {
    let files = function_files();
    let mut edited = files.clone();
    let ack = edited
        .get_mut("wharf_ack")
        .expect("functions/wharf_ack.sql");
    assert!(ack.contains("RETURN deleted;"), "the mutation's anchor");
    *ack = ack.replace("RETURN deleted;", "RETURN deleted + 0;");
    let mut missing = files.clone();
    missing.remove("wharf_settle");

    let Some(mut conn) = pg_connect().await else {
        return;
    };
    let migrated = migrated_schema().await;
    let found_edited = differences(&mut conn, &migrated, &edited).await;
    let found_missing = differences(&mut conn, &migrated, &missing).await;
    drop_schema(&mut conn, &migrated).await;

    assert_eq!(found_edited.len(), 1, "{found_edited:#?}");
    assert!(
        found_edited[0].starts_with(
            "wharf_ack(p_group text, p_position bigint, p_token bigint): its body (prosrc) in \
             the migrated store differs from functions/wharf_ack.sql"
        ),
        "{found_edited:#?}"
    );
    assert_eq!(
        found_missing,
        [
            "wharf_settle(p_groups text[], p_positions bigint[], p_tokens bigint[]): the migrated \
          store has it, but no file in functions/ defines it"
        ],
    );
}
