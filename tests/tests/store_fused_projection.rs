//! Fused inline projections on a real Postgres schema: a projector whose rows ride in the
//! statement that inserts the event.
//!
//! - the fused rows carry the inserted event's own position, for every event of a multi-event
//!   append, and `apply` is not run for an event that was fused;
//! - a projector that declines (returns false) is applied after the insert as before;
//! - a unique violation inside a fused projection fails the append as a database error, not as
//!   an optimistic-concurrency conflict, and writes nothing (neither events nor rows);
//! - the real `EffectiveBindings` projector, fused on the live path, leaves exactly the rows a
//!   replay through `apply` leaves (`rebuild --verify` after installs).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde_json::{json, Value};
use sqlx::PgConnection;
use wharf::store::{
    CteStatement, EventRef, NewEvent, PgProjector, PgStore, RebuildMode, RecordedEvent, Store,
    StoreError,
};
use wharf::Registration;
use wharf_tests::{Backend, TestStore};

type Applying<'a> = Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + 'a>>;

fn event(event_type: &str, payload: Value) -> NewEvent {
    NewEvent {
        event_type: event_type.to_owned(),
        event_version: "1.0".to_owned(),
        payload: payload.into(),
        metadata: json!({ "test": "fused" }),
    }
}

/// Fuses every event except `Plain` ones into `fused_row (position, sequence, tag)`; `tag` is
/// the payload's `tag` and is unique, so a repeated tag fails inside the fused statement.
/// Applies `Plain` events afterwards into `applied_row`; `apply` on a fused event is an error.
struct Tagger;

impl PgProjector for Tagger {
    fn name(&self) -> &'static str {
        "tagger"
    }

    fn tables(&self) -> &'static [&'static str] {
        &["fused_row", "applied_row"]
    }

    fn apply<'life0, 'life1, 'life2, 'async_trait>(
        &'life0 self,
        conn: &'life1 mut PgConnection,
        event: &'life2 RecordedEvent,
    ) -> Applying<'async_trait>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        'life2: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move {
            if event.event_type != "Plain" {
                return Err(StoreError::decode(event.position, "applied a fused event"));
            }
            sqlx::query("INSERT INTO applied_row (position) VALUES ($1)")
                .bind(event.position)
                .execute(conn)
                .await?;
            Ok(())
        })
    }

    fn fuse(
        &self,
        event: &EventRef<'_>,
        position: &str,
        statement: &mut CteStatement,
    ) -> Result<bool, StoreError> {
        if event.event_type == "Plain" {
            return Ok(false);
        }
        let sequence = statement.bind(event.sequence)?;
        let tag = statement.bind(
            event.payload.to_value()["tag"]
                .as_str()
                .unwrap_or("")
                .to_owned(),
        )?;
        statement.cte(
            "tagged",
            &format!(
                "INSERT INTO fused_row (position, sequence, tag) SELECT {position}, {sequence}, {tag}"
            ),
        );
        Ok(true)
    }
}

async fn tagged_store(ts: &TestStore) -> PgStore {
    let schema = ts.schema().expect("a Postgres test store has a schema");
    let Store::Postgres(s) = &ts.store else {
        panic!("expected Postgres")
    };
    sqlx::raw_sql(
        "CREATE TABLE fused_row (position BIGINT PRIMARY KEY, sequence BIGINT NOT NULL, \
           tag TEXT NOT NULL UNIQUE); \
         CREATE TABLE applied_row (position BIGINT PRIMARY KEY);",
    )
    .execute(s.pool())
    .await
    .expect("creating the test tables");
    let mut projectors = wharf::projections::pg_inline();
    projectors.push(Arc::new(Tagger));
    PgStore::connect(&TestStore::pg_settings(schema), projectors).expect("a tagged handle")
}

async fn rows(store: &PgStore, sql: &str) -> Vec<(i64, i64)> {
    sqlx::query_as(sql)
        .fetch_all(store.pool())
        .await
        .expect("reading rows")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fused_rows_carry_their_event_positions() {
    let ts = TestStore::new(Backend::Postgres).await;
    let store = tagged_store(&ts).await;
    let appended = store
        .append(
            "t",
            "a",
            0,
            vec![
                event("Tagged", json!({"tag": "one"})),
                event("Plain", json!({})),
                event("Tagged", json!({"tag": "two"})),
            ],
        )
        .await
        .expect("appending a mixed batch");
    let fused = rows(
        &store,
        "SELECT position, sequence FROM fused_row ORDER BY position",
    )
    .await;
    assert_eq!(
        fused,
        vec![(appended[0].position, 1), (appended[2].position, 3)],
        "each fused row holds its own event's position and sequence"
    );
    let applied: Vec<i64> = sqlx::query_scalar("SELECT position FROM applied_row")
        .fetch_all(store.pool())
        .await
        .unwrap();
    assert_eq!(
        applied,
        vec![appended[1].position],
        "the declined event is applied after"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_fused_projection_is_not_a_conflict_and_writes_nothing() {
    let ts = TestStore::new(Backend::Postgres).await;
    let store = tagged_store(&ts).await;
    store
        .append("t", "a", 0, vec![event("Tagged", json!({"tag": "taken"}))])
        .await
        .expect("the first tag");
    let before = store.read_after(0, 1000).await.unwrap();

    let result = store
        .append(
            "t",
            "b",
            0,
            vec![
                event("Plain", json!({})),
                event("Tagged", json!({"tag": "taken"})),
            ],
        )
        .await;
    match result {
        Err(StoreError::Postgres(sqlx::Error::Database(db))) => {
            assert_eq!(db.code().as_deref(), Some("23505"));
            assert_eq!(db.constraint(), Some("fused_row_tag_key"), "{db}");
        }
        other => panic!("expected the projection's unique violation, got {other:?}"),
    }
    assert_eq!(store.read_after(0, 1000).await.unwrap(), before);
    assert!(rows(&store, "SELECT position, 0::bigint FROM applied_row")
        .await
        .is_empty());
    assert_eq!(
        rows(&store, "SELECT position, sequence FROM fused_row")
            .await
            .len(),
        1
    );

    // A real conflict is still reported as one.
    let stale = store
        .append("t", "a", 0, vec![event("Tagged", json!({"tag": "fresh"}))])
        .await;
    assert!(
        matches!(stale, Err(StoreError::Conflict { sequence: 1, .. })),
        "{stale:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fused_effective_bindings_match_a_replay() {
    let ts = TestStore::new(Backend::Postgres).await;
    let wharf = ts.wharf();
    let sets: [&[&str]; 3] = [&["a/+", "b/#"], &["b/#", "c"], &[]];
    for round in 0..6 {
        for group in ["g1", "g2"] {
            let set = sets[(round + usize::from(group == "g2")) % sets.len()];
            let declarer = wharf::domain::DeclarerId::parse("declarer", &format!("d-{round}"))
                .expect("declarer");
            wharf
                .as_declarer(declarer)
                .register(&Registration::new(group, "t", "1", set).expect("registration"))
                .await
                .expect("register");
        }
    }
    let patterns: Vec<(String, String)> =
        sqlx::query_as("SELECT group_name, pattern FROM binding ORDER BY 1, 2")
            .fetch_all(match &ts.store {
                Store::Postgres(s) => s.pool(),
                Store::Sqlite(_) => unreachable!(),
            })
            .await
            .unwrap();
    let pair = |g: &str, p: &str| (g.to_owned(), p.to_owned());
    // Round 5: g1 has sets[2] (whole topic: no rows), g2 has sets[0].
    assert_eq!(patterns, vec![pair("g2", "a/+"), pair("g2", "b/#")]);
    let report = wharf
        .read_model()
        .rebuild(RebuildMode::Verify, Arc::new(|_, _| {}))
        .await
        .expect("verify");
    assert!(
        report.differences.is_empty(),
        "a replay through apply differs from the fused live rows: {:?}",
        report.differences
    );
}
