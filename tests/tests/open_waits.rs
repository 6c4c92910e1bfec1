//! The open waits kept inline with the declaration events (ADR 0049), on both backends:
//! - a waiting declarer's retry from a process that holds nothing of the group (a cold start,
//!   whose saved state no longer carries waits) keeps the `declared_at` of its first wait,
//!   read from its `open_wait` row; another set, or a wait closed by an install, starts anew;
//! - the migration's backfill gives exactly the rows the appends left, and a replay agrees.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use wharf::domain::{DeclarerId, RegisterOutcome};
use wharf::store::{RebuildMode, Store};
use wharf::{Registration, Wharf};
use wharf_tests::{backfill_open_waits, keep_live, on_both_backends, Backend, TestStore};

const TOPIC: &str = "orders";

/// One `open_wait` row: group, declarer, set, first declaration time in microseconds.
type Row = (String, String, Vec<String>, i64);

async fn register(wharf: &Wharf, group: &str, declarer: &str, set: &[&str]) -> RegisterOutcome {
    let registration = Registration::new(group, TOPIC, "1", set).unwrap();
    wharf
        .as_declarer(DeclarerId::parse("declarer", declarer).unwrap())
        .register(&registration)
        .await
        .unwrap()
}

fn waiting_since(outcome: &RegisterOutcome) -> DateTime<Utc> {
    match outcome {
        RegisterOutcome::Waiting { declared_at, .. } => *declared_at,
        other => panic!("expected a wait, got {other:?}"),
    }
}

fn installed(outcome: &RegisterOutcome) {
    assert!(
        matches!(outcome, RegisterOutcome::Installed { .. }),
        "expected an install, got {outcome:?}"
    );
}

async fn rows(store: &Store) -> Vec<Row> {
    match store {
        Store::Sqlite(s) => s
            .read(|conn| {
                let mut stmt = conn.prepare(
                    "SELECT group_name, declarer, patterns, declared_at FROM open_wait \
                     ORDER BY group_name, declarer",
                )?;
                let rows = stmt
                    .query_map([], |row| {
                        Ok((
                            row.get::<_, String>(0)?,
                            row.get::<_, String>(1)?,
                            row.get::<_, String>(2)?,
                            row.get::<_, i64>(3)?,
                        ))
                    })?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows
                    .into_iter()
                    .map(|(g, d, p, at)| (g, d, serde_json::from_str(&p).unwrap(), at))
                    .collect())
            })
            .await
            .unwrap(),
        Store::Postgres(s) => {
            let rows: Vec<(String, String, Vec<String>, DateTime<Utc>)> = sqlx::query_as(
                "SELECT group_name, declarer, patterns, declared_at FROM open_wait \
                 ORDER BY group_name COLLATE \"C\", declarer COLLATE \"C\"",
            )
            .fetch_all(s.pool())
            .await
            .unwrap();
            rows.into_iter()
                .map(|(g, d, p, at)| (g, d, p, at.timestamp_micros()))
                .collect()
        }
    }
}

fn row(group: &str, declarer: &str, set: &[&str], at: DateTime<Utc>) -> Row {
    (
        group.to_owned(),
        declarer.to_owned(),
        set.iter().map(|p| (*p).to_owned()).collect(),
        at.timestamp_micros(),
    )
}

async fn retry_keeps_its_first_wait(backend: Backend) {
    let test = TestStore::new(backend).await;
    let first = test.steady_wharf();
    installed(&register(&first, "g", "incumbent", &["orders/a/#"]).await);
    keep_live(&test.store, "g", "incumbent", &["orders/a/#"]).await;
    let since = waiting_since(&register(&first, "g", "d1", &["orders/b/#"]).await);
    assert_eq!(
        rows(&test.store).await,
        vec![row("g", "d1", &["orders/b/#"], since)]
    );

    // A process that holds nothing of the group: its state comes from the saved one or the
    // events, neither of which carries waits any more.
    let cold = test.steady_wharf();
    let again = register(&cold, "g", "d1", &["orders/b/#"]).await;
    assert_eq!(
        waiting_since(&again),
        since,
        "the retry keeps its first wait"
    );

    // Another set is another wait, and coming back to the first set does not revive it.
    let other = waiting_since(&register(&cold, "g", "d1", &["orders/c/#"]).await);
    assert!(other > since, "{other} after {since}");
    let back = waiting_since(&register(&test.steady_wharf(), "g", "d1", &["orders/b/#"]).await);
    assert!(back > other, "{back} after {other}");

    // Someone else installs d1's set: d1's wait is closed, and d1 then joins.
    test.store.leave("g", "incumbent").await.unwrap();
    installed(&register(&first, "g", "d2", &["orders/b/#"]).await);
    assert_eq!(rows(&test.store).await, Vec::<Row>::new());
    let joined = register(&test.steady_wharf(), "g", "d1", &["orders/b/#"]).await;
    assert!(
        matches!(joined, RegisterOutcome::Joined { .. }),
        "{joined:?}"
    );
}
on_both_backends!(
    a_retry_from_a_fresh_process_keeps_its_first_declared_at,
    retry_keeps_its_first_wait
);

/// Waits in three groups: closed by the waiter's own install, closed by another declarer's
/// install of the same set, moved to another set, and left open.
async fn mixed_waits(test: &TestStore) -> Vec<Row> {
    let wharf = test.steady_wharf();
    for group in ["alpha", "beta", "gamma"] {
        installed(&register(&wharf, group, "incumbent", &["orders/a/#"]).await);
        keep_live(&test.store, group, "incumbent", &["orders/a/#"]).await;
        for (who, set) in [
            ("w1", &["orders/b/#"][..]),
            ("w2", &["orders/b/#"][..]),
            ("w3", &["orders/c/#", "orders/d/+"][..]),
            ("w4", &["orders/b/#"][..]),
        ] {
            waiting_since(&register(&wharf, group, who, set).await);
        }
        waiting_since(&register(&wharf, group, "w4", &["orders/e"]).await);
        waiting_since(&register(&wharf, group, "w1", &["orders/b/#"]).await);
    }
    // alpha: w1 installs its own set (closing w2's wait for it); beta: a newcomer installs
    // w3's set; gamma stays as it is.
    test.store.leave("alpha", "incumbent").await.unwrap();
    installed(&register(&wharf, "alpha", "w1", &["orders/b/#"]).await);
    test.store.leave("beta", "incumbent").await.unwrap();
    installed(&register(&wharf, "beta", "new", &["orders/d/+", "orders/c/#"]).await);
    let left = rows(&test.store).await;
    let who: Vec<(&str, &str)> = left
        .iter()
        .map(|(g, d, _, _)| (g.as_str(), d.as_str()))
        .collect();
    assert_eq!(
        who,
        [
            ("alpha", "w3"),
            ("alpha", "w4"),
            ("beta", "w1"),
            ("beta", "w2"),
            ("beta", "w4"),
            ("gamma", "w1"),
            ("gamma", "w2"),
            ("gamma", "w3"),
            ("gamma", "w4"),
        ]
    );
    left
}

/// Empties `open_wait` and runs the migration's backfill.
async fn backfill(store: &Store) {
    match store {
        Store::Sqlite(s) => s
            .write(|ctx| {
                ctx.tx.execute_batch("DELETE FROM open_wait")?;
                Ok(())
            })
            .await
            .unwrap(),
        Store::Postgres(s) => {
            sqlx::query("DELETE FROM open_wait")
                .execute(s.pool())
                .await
                .unwrap();
        }
    }
    backfill_open_waits(store).await;
}

async fn backfill_matches_the_appends(backend: Backend) {
    let test = TestStore::new(backend).await;
    let appended = mixed_waits(&test).await;
    backfill(&test.store).await;
    assert_eq!(rows(&test.store).await, appended);
    let wharf = test.steady_wharf();
    let replayed = wharf
        .read_model()
        .rebuild(RebuildMode::Verify, Arc::new(|_, _| {}))
        .await
        .unwrap();
    assert!(replayed.is_clean(), "{replayed:?}");
    // A replay into the table gives the same rows again.
    let applied = wharf
        .read_model()
        .rebuild(RebuildMode::Apply, Arc::new(|_, _| {}))
        .await
        .unwrap();
    assert!(applied.applied, "{applied:?}");
    assert_eq!(rows(&test.store).await, appended);
}
on_both_backends!(
    the_migrations_backfill_gives_the_rows_the_appends_left,
    backfill_matches_the_appends
);
