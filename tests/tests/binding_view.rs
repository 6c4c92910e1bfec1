//! `binding` is a view over the effective declaration's patterns (ADR 0064; Postgres migration
//! 0026, SQLite 0012), and a rolling upgrade or a rollback crosses that change safely.
//!
//! - A store upgraded from the table keeps every group's binding rows: the view shows what the
//!   table held.
//! - The previous release's writes of binding rows (its install's delete and insert, on each
//!   backend as it sent them) still run on the new schema and change nothing: the patterns in
//!   `effective_declaration`, which that release wrote in the same transaction, are the truth.
//! - A read of a group's binding rows follows every install, by either release.

use sqlx::PgConnection;
use wharf::domain::{DeclarerId, GroupName, RegisterOutcome};
use wharf::store::migrate::Migration;
use wharf::store::Store;
use wharf::{Registration, Wharf};
use wharf_tests::{execute_sql, on_both_backends, Backend, TestStore};

/// The previous release's install, as it wrote the binding rows of `group` for `patterns`
/// (`projections/src/declaration.rs` before ADR 0064), in one transaction with `then`, which
/// stands for the rest of that release's install statement.
async fn previous_release_install(store: &Store, group: &str, patterns: &[&str], then: &str) {
    let group = group.to_owned();
    let patterns: Vec<String> = patterns.iter().map(|p| (*p).to_owned()).collect();
    match store {
        Store::Sqlite(s) => {
            let then = then.to_owned();
            s.write(move |ctx| {
                ctx.tx
                    .prepare_cached("DELETE FROM binding WHERE group_name = ?1")?
                    .execute([&group])?;
                let mut insert = ctx
                    .tx
                    .prepare_cached("INSERT INTO binding (group_name, pattern) VALUES (?1, ?2)")?;
                for pattern in &patterns {
                    insert.execute([&group, pattern])?;
                }
                ctx.tx.execute_batch(&then)?;
                Ok(())
            })
            .await
            .expect("the previous release's binding writes on SQLite");
        }
        Store::Postgres(s) => {
            let mut tx = s.pool().begin().await.unwrap();
            previous_release_pg_writes(&mut tx, &group, &patterns).await;
            sqlx::raw_sql(then).execute(&mut *tx).await.unwrap();
            tx.commit().await.unwrap();
        }
    }
}

/// The previous release's two binding parts on Postgres, fused into the statement that
/// appended the event (here alone), prepared and kept on `conn` as sqlx keeps statements.
async fn previous_release_pg_writes(conn: &mut PgConnection, group: &str, patterns: &[String]) {
    sqlx::query(
        "WITH bindings_gone AS (DELETE FROM binding \
         WHERE group_name = $1 AND pattern <> ALL($2::text[])), \
         bindings_added AS (INSERT INTO binding (group_name, pattern) \
         SELECT $1, unnest($2::text[]) ON CONFLICT DO NOTHING) \
         SELECT 1",
    )
    .bind(group)
    .bind(patterns)
    .execute(conn)
    .await
    .expect("the previous release's binding writes on Postgres");
}

/// Every binding row, as `group pattern`, in order.
async fn binding_rows(store: &Store) -> Vec<String> {
    let sql = "SELECT group_name || ' ' || pattern FROM binding ORDER BY group_name, pattern";
    match store {
        Store::Sqlite(s) => s
            .read(move |conn| {
                let mut stmt = conn.prepare(sql)?;
                let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
                Ok(rows.collect::<Result<Vec<_>, _>>()?)
            })
            .await
            .unwrap(),
        Store::Postgres(s) => sqlx::query_scalar(sql).fetch_all(s.pool()).await.unwrap(),
    }
}

/// What `binding` is in the store's catalog: `table` or `view`.
async fn binding_kind(store: &Store) -> String {
    match store {
        Store::Sqlite(s) => s
            .read(|conn| {
                Ok(conn.query_row(
                    "SELECT type FROM sqlite_master WHERE name = 'binding'",
                    [],
                    |r| r.get::<_, String>(0),
                )?)
            })
            .await
            .unwrap(),
        Store::Postgres(s) => sqlx::query_scalar(
            "SELECT CASE relkind WHEN 'r' THEN 'table' WHEN 'v' THEN 'view' ELSE relkind::text END \
             FROM pg_class WHERE oid = to_regclass('binding')",
        )
        .fetch_one(s.pool())
        .await
        .unwrap(),
    }
}

/// Migrates a fresh store as the previous release did: every script before the one that turns
/// `binding` into a view, recorded as the store records them.
async fn migrate_as_the_previous_release(store: &Store) {
    let previous: Vec<&Migration> = store
        .migrations()
        .iter()
        .take_while(|m| !m.name.contains("binding_rows_as_view"))
        .collect();
    assert!(
        previous.len() < store.migrations().len(),
        "the view's migration is among this build's"
    );
    // The table as each store creates it (Postgres fills `applied_at` by default).
    let (applied_at, applied_at_column) = match store {
        Store::Sqlite(_) => ("0", "INTEGER NOT NULL"),
        Store::Postgres(_) => ("now()", "TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()"),
    };
    let mut sql = format!(
        "CREATE TABLE wharf_schema_migrations (version BIGINT PRIMARY KEY, \
         name TEXT NOT NULL, applied_at {applied_at_column});"
    );
    for script in previous {
        sql.push_str(script.sql);
        sql.push_str(&format!(
            ";\nINSERT INTO wharf_schema_migrations (version, name, applied_at) \
             VALUES ({}, '{}', {applied_at});\n",
            script.version, script.name
        ));
    }
    execute_sql(store, &sql).await;
}

/// An effective declaration of `group` with `patterns`, as the previous release's install left
/// it (its binding rows come from [`previous_release_install`]).
fn effective_row(store: &Store, group: &str, patterns: &[&str]) -> String {
    let (list, time) = match store {
        Store::Sqlite(_) => (serde_json::to_string(patterns).unwrap(), "0".to_owned()),
        Store::Postgres(_) => (format!("{{{}}}", patterns.join(",")), "now()".to_owned()),
    };
    format!(
        "INSERT INTO effective_declaration (group_name, topic, declarer, version, patterns, \
         declared_at, attempt_at, position, installs) \
         VALUES ('{group}', 'orders', 'd', '1', '{list}', {time}, {time}, 1, 1)"
    )
}

const SETS: [(&str, &[&str]); 3] = [
    ("billing", &["orders/+/paid", "orders/+/refunded"]),
    ("empty", &[]),
    ("shipping", &["orders/eu/#"]),
];

async fn an_upgrade_keeps_every_groups_binding_rows(backend: Backend) {
    let test = TestStore::unmigrated(backend).await;
    let store = &test.store;
    migrate_as_the_previous_release(store).await;
    for (group, patterns) in SETS {
        let effective = effective_row(store, group, patterns);
        previous_release_install(store, group, patterns, &effective).await;
    }
    assert_eq!(binding_kind(store).await, "table");
    let before = binding_rows(store).await;
    assert_eq!(
        before,
        [
            "billing orders/+/paid",
            "billing orders/+/refunded",
            "shipping orders/eu/#"
        ],
        "the previous release's rows"
    );

    let applied = store.migrate().await.unwrap();
    let expected: Vec<&str> = store
        .migrations()
        .iter()
        .skip_while(|m| !m.name.contains("binding_rows_as_view"))
        .map(|m| m.name)
        .collect();
    assert_eq!(applied, expected, "the view's migration and those after it");
    assert_eq!(binding_kind(store).await, "view");
    assert_eq!(binding_rows(store).await, before, "the same rows, derived");
}

on_both_backends!(
    an_upgrade_keeps_every_groups_binding_rows,
    an_upgrade_keeps_every_groups_binding_rows
);

/// A connection of an older process that prepared its install statement while `binding` was a
/// table: after the migration its next install replans that statement against the view.
#[tokio::test]
async fn a_statement_prepared_on_the_table_runs_on_the_view() {
    let test = TestStore::unmigrated(Backend::Postgres).await;
    let store = &test.store;
    let Store::Postgres(pg) = store else {
        unreachable!("a Postgres test store")
    };
    migrate_as_the_previous_release(store).await;
    execute_sql(store, &effective_row(store, "billing", &["orders/#"])).await;
    let mut older = pg.pool().acquire().await.unwrap();
    let set = |p: &str| vec![p.to_owned()];
    previous_release_pg_writes(&mut older, "billing", &set("orders/#")).await;
    let prepared: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_prepared_statements \
         WHERE statement LIKE '%bindings_added%' AND statement NOT LIKE '%pg_prepared%'",
    )
    .fetch_one(&mut *older)
    .await
    .unwrap();
    assert_eq!(
        prepared, 1,
        "the older process keeps its statement prepared"
    );

    store.migrate().await.unwrap();
    assert_eq!(binding_kind(store).await, "view");
    previous_release_pg_writes(&mut older, "billing", &set("orders/eu/#")).await;
    assert_eq!(
        binding_rows(store).await,
        ["billing orders/#"],
        "the write was absorbed; the view shows the effective declaration"
    );
}

/// Installs `patterns` for `billing` as `declarer` (nobody heartbeats, so it installs).
async fn install(wharf: &Wharf, declarer: &str, patterns: &[&str]) {
    let registration = Registration::new("billing", "orders", "1", patterns).unwrap();
    let outcome = wharf
        .as_declarer(DeclarerId::parse("declarer", declarer).unwrap())
        .register(&registration)
        .await
        .unwrap();
    assert!(
        matches!(outcome, RegisterOutcome::Installed { .. }),
        "{declarer} installs: {outcome:?}"
    );
}

async fn effective_bindings(wharf: &Wharf) -> Vec<String> {
    let group = GroupName::parse("group", "billing").unwrap();
    wharf.read_model().effective_bindings(&group).await.unwrap()
}

async fn the_previous_releases_binding_writes_change_nothing(backend: Backend) {
    let test = TestStore::new(backend).await;
    let wharf = test.wharf();
    install(&wharf, "first", &["orders/+/paid"]).await;
    assert_eq!(effective_bindings(&wharf).await, ["orders/+/paid"]);

    // Its writes alone, of a set this store never installed: absorbed.
    previous_release_install(&test.store, "billing", &["orders/#"], "SELECT 1").await;
    assert_eq!(
        effective_bindings(&wharf).await,
        ["orders/+/paid"],
        "a write of binding rows is not an install"
    );

    // Its whole install: the binding writes and the effective declaration's new patterns.
    let patterns = match test.store {
        Store::Sqlite(_) => r#"'["orders/eu/#"]'"#,
        Store::Postgres(_) => "'{orders/eu/#}'",
    };
    let then = format!(
        "UPDATE effective_declaration SET patterns = {patterns} WHERE group_name = 'billing'"
    );
    previous_release_install(&test.store, "billing", &["orders/eu/#"], &then).await;
    assert_eq!(effective_bindings(&wharf).await, ["orders/eu/#"]);
    assert_eq!(binding_rows(&test.store).await, ["billing orders/eu/#"]);

    // And this release's installs, after it.
    install(&wharf, "second", &["orders/us/#", "orders/+/void"]).await;
    assert_eq!(
        effective_bindings(&wharf).await,
        ["orders/+/void", "orders/us/#"]
    );
}

on_both_backends!(
    the_previous_releases_binding_writes_change_nothing,
    the_previous_releases_binding_writes_change_nothing
);
