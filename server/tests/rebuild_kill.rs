//! `wharf projections rebuild` killed half-way (SIGKILL, as a crash or an OOM kill would),
//! then run again, on real stores: the killed run changes nothing (the replay is one
//! transaction), and the rerun leaves exactly what a fresh replay produces (`--verify` finds
//! it clean, and the rows equal those the first rebuild wrote before they were damaged).
//!
//! The ledger (5k groups, 50k events: an install, eight waiting retries of a declarer asking
//! for another set, and its swap) is written with SQL, so that a rebuild takes long enough to
//! be caught in the middle; the kill comes after the first progress line (a page of 10k positions replayed).

#![allow(clippy::unwrap_used)]

mod support;

use chrono::{DateTime, Utc};
use support::{pg_connect, Backend, Running, TestStore};
use wharf::domain::declaration::AGGREGATE_TYPE;
use wharf::domain::TopicName;
use wharf::domain::{AppVersion, Attempt, BindingSet, DeclarationEvent, DeclarerId, GroupName};

const GROUPS: i64 = 5_000;
const STEPS: i64 = 10;

/// Runs an async test body once per backend.
macro_rules! on_both_backends {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name(super::Backend::Sqlite).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name(super::Backend::Postgres).await;
            }
        }
    };
}

/// The payload of step 1 (install), 2..STEPS-1 (waiting) or STEPS (swap) of group `GROUP`,
/// with `GROUP` standing for the group's number in names.
fn template(step: i64) -> String {
    let old = BindingSet::parse(&["orders/+/paid"]).unwrap();
    let new = BindingSet::parse(&["orders/#"]).unwrap();
    let at: DateTime<Utc> = "2026-11-30T12:00:00.123456Z".parse().unwrap();
    let attempt = |who: &str, set: &BindingSet| Attempt {
        group: GroupName::parse("g", "g-GROUP").unwrap(),
        topic: TopicName::parse("t", "orders").unwrap(),
        declarer: DeclarerId::parse("d", &format!("{who}-GROUP")).unwrap(),
        version: AppVersion::parse("v", "1").unwrap(),
        patterns: set.clone(),
        declared_at: at,
        attempt_at: at + chrono::Duration::seconds(step),
    };
    let event = match step {
        1 => DeclarationEvent::Installed {
            attempt: attempt("a", &old),
            previous: None,
        },
        STEPS => DeclarationEvent::Installed {
            attempt: attempt("b", &new),
            previous: Some(old),
        },
        _ => DeclarationEvent::Waiting {
            attempt: attempt("b", &new),
            incumbent: old,
            live_declarers: vec![DeclarerId::parse("d", "a-GROUP").unwrap()],
        },
    };
    serde_json::to_string(&event).unwrap().replace('\'', "''")
}

/// One SQL `CASE` choosing the template of `step`.
fn payload_case() -> String {
    let arms: Vec<String> = (1..=STEPS)
        .map(|step| format!("WHEN {step} THEN '{}'", template(step)))
        .collect();
    format!("CASE s {} END", arms.join(" "))
}

async fn load(store: &TestStore) {
    let payload = format!("replace({}, 'GROUP', CAST(g AS TEXT))", payload_case());
    let kind = format!(
        "CASE s WHEN 1 THEN 'DeclarationInstalled' WHEN {STEPS} THEN 'DeclarationInstalled' \
         ELSE 'DeclarationWaiting' END"
    );
    match &store.schema {
        Some(schema) => {
            let mut conn = pg_connect().await.unwrap();
            sqlx::raw_sql(&format!(
                "SET search_path TO \"{schema}\"; \
                 INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, \
                 event_version, payload, metadata) \
                 SELECT '{AGGREGATE_TYPE}', 'g-' || g, s, {kind}, '1.0', ({payload})::json, '{{}}' \
                 FROM generate_series(1, {STEPS}) s, generate_series(1, {GROUPS}) g ORDER BY s, g"
            ))
            .execute(&mut conn)
            .await
            .unwrap();
        }
        None => {
            let conn = rusqlite::Connection::open(store.sqlite_path()).unwrap();
            conn.execute_batch(&format!(
                "WITH RECURSIVE gs(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM gs WHERE g < {GROUPS}), \
                 ss(s) AS (SELECT 1 UNION ALL SELECT s + 1 FROM ss WHERE s < {STEPS}) \
                 INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, \
                 event_version, payload, metadata, recorded_at) \
                 SELECT '{AGGREGATE_TYPE}', 'g-' || g, s, {kind}, '1.0', {payload}, '{{}}', 0 \
                 FROM ss, gs ORDER BY s, g"
            ))
            .unwrap();
        }
    }
}

/// Every projection row, in key order, as text.
async fn projections(store: &TestStore) -> Vec<String> {
    let queries = [
        "SELECT group_name || ' ' || declarer || ' ' || status || ' ' || version || ' ' || \
         position FROM declarer_attempt ORDER BY group_name, declarer",
        "SELECT group_name || ' ' || declarer || ' ' || installs || ' ' || position \
         FROM effective_declaration ORDER BY group_name",
        "SELECT group_name || ' ' || pattern FROM binding ORDER BY group_name, pattern",
    ];
    let mut rows = Vec::new();
    for sql in queries {
        match &store.schema {
            Some(schema) => {
                let mut conn = pg_connect().await.unwrap();
                sqlx::raw_sql(&format!("SET search_path TO \"{schema}\""))
                    .execute(&mut conn)
                    .await
                    .unwrap();
                let found: Vec<String> =
                    sqlx::query_scalar(sql).fetch_all(&mut conn).await.unwrap();
                rows.extend(found);
            }
            None => {
                let conn = rusqlite::Connection::open(store.sqlite_path()).unwrap();
                let mut stmt = conn.prepare(sql).unwrap();
                let found = stmt
                    .query_map([], |r| r.get::<_, String>(0))
                    .unwrap()
                    .collect::<Result<Vec<_>, _>>()
                    .unwrap();
                rows.extend(found);
            }
        }
    }
    rows
}

async fn execute(store: &TestStore, sql: &str) {
    match &store.schema {
        Some(schema) => {
            let mut conn = pg_connect().await.unwrap();
            sqlx::raw_sql(&format!("SET search_path TO \"{schema}\"; {sql}"))
                .execute(&mut conn)
                .await
                .unwrap();
        }
        None => rusqlite::Connection::open(store.sqlite_path())
            .unwrap()
            .execute_batch(sql)
            .unwrap(),
    }
}

async fn a_killed_rebuild_changes_nothing_and_a_rerun_equals_a_fresh_replay(backend: Backend) {
    let Some(store) = TestStore::migrated(backend).await else {
        return;
    };
    load(&store).await;
    let first = store.run(&["projections", "rebuild"]).await;
    assert!(first.success().contains("replayed 50000 events"), "{first}");
    let replayed = projections(&store).await;
    assert_eq!(
        replayed.len() as i64,
        GROUPS * 4,
        "2 attempts, 1 install, 1 binding each"
    );
    assert!(
        replayed.contains(&"g-7 b-7 installed 1 45007".to_owned()),
        "{:?}",
        &replayed[..4]
    );

    // Damage the projections, then kill a rebuild once it is a tenth in.
    execute(
        &store,
        "DELETE FROM effective_declaration WHERE group_name = 'g-9'; \
         UPDATE declarer_attempt SET version = 'damaged' WHERE group_name = 'g-12'",
    )
    .await;
    let mut killed = Running::start("rebuild", store.command(), &["projections", "rebuild"]);
    let progress = killed.expect_err("rebuild: ").await;
    let code = killed.kill().await;
    assert_eq!(
        code,
        None,
        "killed by the signal after {progress:?}\n{}",
        killed.transcript()
    );
    assert!(
        !killed.lines_of(true).iter().any(|l| l.contains("rebuilt")),
        "the rebuild finished before the kill: {}",
        killed.transcript()
    );

    // Nothing of the killed replay is visible: the damage is still there, and only it.
    let verify = store.run(&["projections", "rebuild", "--verify"]).await;
    let report = verify.stdout.clone();
    assert_eq!(verify.code, Some(1), "{verify}");
    assert!(
        report.contains("effective_declaration") && report.contains("declarer_attempt"),
        "{verify}"
    );
    assert!(
        !report.lines().any(|l| l.starts_with("binding ")),
        "{verify}"
    );

    let rerun = store.run(&["projections", "rebuild"]).await;
    rerun.success();
    let verify = store.run(&["projections", "rebuild", "--verify"]).await;
    assert!(verify.success().contains("match"), "{verify}");
    assert_eq!(
        projections(&store).await,
        replayed,
        "the rerun equals the first replay"
    );
}

on_both_backends!(a_killed_rebuild_changes_nothing_and_a_rerun_equals_a_fresh_replay);
