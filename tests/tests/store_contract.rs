//! The event store's contract, proved on a real SQLite file and a real Postgres schema:
//! global positions and store-clock timestamps on append, per-aggregate optimistic
//! concurrency, inline projectors that roll an append back when they fail, faithful reads
//! (load, read_after, filtered and paged query_events), catch-up that applies every event
//! exactly once and never skips an event whose transaction committed late, worker-instance
//! heartbeats judged by the store's clock, idempotent migrations, and (Postgres) that the
//! ledger Wharf writes reads back through postgres-es into the same aggregate state.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use cqrs_es::persist::{PersistedEventRepository, PersistedEventStore};
use cqrs_es::{Aggregate, EventStore};
use postgres_es::PostgresEventRepository;
use serde_json::{json, Value};
use sqlx::PgConnection;
use wharf::domain::{ConsumerGroup, DeclarationEvent, DeclarerId, RegisterOutcome};
use wharf::store::{
    EventQuery, GroupLock, GroupWrite, Heartbeat, NewEvent, PgProjector, PgStore, RecordedEvent,
    SqliteProjector, SqliteStore, Store, StoreError,
};
use wharf::Registration;
use wharf_tests::{execute_sql, on_both_backends, wait_until, Backend, TestStore};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// A plain event with a JSON payload.
fn event(event_type: &str, payload: Value) -> NewEvent {
    NewEvent {
        event_type: event_type.to_owned(),
        event_version: "1.0".to_owned(),
        payload: payload.into(),
        metadata: json!({ "test": "store_contract" }),
    }
}

fn sqlite_of(store: &Store) -> &SqliteStore {
    match store {
        Store::Sqlite(s) => s,
        Store::Postgres(_) => panic!("expected the SQLite backend"),
    }
}

fn pg_of(store: &Store) -> &PgStore {
    match store {
        Store::Postgres(s) => s,
        Store::Sqlite(_) => panic!("expected the Postgres backend"),
    }
}

/// Every event in the ledger, in position order.
async fn all_events(store: &Store) -> Vec<RecordedEvent> {
    store
        .read_after(0, 100_000)
        .await
        .expect("reading the ledger")
}

/// A boxed future as `#[async_trait]` expects from a `PgProjector::apply` (this crate does not
/// depend on async-trait, so the desugared form is written out).
type Applying<'a> = Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + 'a>>;

// ---------------------------------------------------------------------------------------------
// Test projectors
// ---------------------------------------------------------------------------------------------

/// Inline projector that refuses any event whose type is `Boom`.
struct Failing;

impl Failing {
    const NAME: &'static str = "failing";

    fn check(event: &RecordedEvent) -> Result<(), StoreError> {
        if event.event_type == "Boom" {
            Err(StoreError::decode(event.position, "Boom is refused"))
        } else {
            Ok(())
        }
    }
}

impl SqliteProjector for Failing {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn tables(&self) -> &'static [&'static str] {
        &[]
    }

    fn apply(
        &self,
        _tx: &rusqlite::Transaction<'_>,
        event: &RecordedEvent,
    ) -> Result<(), StoreError> {
        Self::check(event)
    }
}

impl PgProjector for Failing {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn tables(&self) -> &'static [&'static str] {
        &[]
    }

    fn apply<'life0, 'life1, 'life2, 'async_trait>(
        &'life0 self,
        _conn: &'life1 mut PgConnection,
        event: &'life2 RecordedEvent,
    ) -> Applying<'async_trait>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        'life2: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move { Self::check(event) })
    }
}

/// Inline projector that writes every event's position to `scribble`, so a rollback of the
/// append can be seen to take a projector's own writes with it.
struct Scribe;

impl SqliteProjector for Scribe {
    fn name(&self) -> &'static str {
        "scribe"
    }

    fn tables(&self) -> &'static [&'static str] {
        &["scribble"]
    }

    fn apply(
        &self,
        tx: &rusqlite::Transaction<'_>,
        event: &RecordedEvent,
    ) -> Result<(), StoreError> {
        tx.execute(
            "INSERT INTO scribble (position) VALUES (?1)",
            [event.position],
        )?;
        Ok(())
    }
}

impl PgProjector for Scribe {
    fn name(&self) -> &'static str {
        "scribe"
    }

    fn tables(&self) -> &'static [&'static str] {
        &["scribble"]
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
            sqlx::query("INSERT INTO scribble (position) VALUES ($1)")
                .bind(event.position)
                .execute(conn)
                .await?;
            Ok(())
        })
    }
}

/// Catch-up projector that records each event it is given in `seen`, with the order it was
/// applied in. `position` is the primary key, so applying an event twice fails loudly.
struct Counter;

impl Counter {
    const NAME: &'static str = "test_counter";
    const DDL: &'static str = "CREATE TABLE seen (position BIGINT PRIMARY KEY, \
         aggregate_id TEXT NOT NULL, applied BIGINT NOT NULL)";
}

impl SqliteProjector for Counter {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn tables(&self) -> &'static [&'static str] {
        &["seen"]
    }

    fn apply(
        &self,
        tx: &rusqlite::Transaction<'_>,
        event: &RecordedEvent,
    ) -> Result<(), StoreError> {
        tx.execute(
            "INSERT INTO seen (position, aggregate_id, applied) \
             VALUES (?1, ?2, (SELECT COUNT(*) + 1 FROM seen))",
            rusqlite::params![event.position, event.aggregate_id],
        )?;
        Ok(())
    }
}

impl PgProjector for Counter {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn tables(&self) -> &'static [&'static str] {
        &["seen"]
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
            sqlx::query(
                "INSERT INTO seen (position, aggregate_id, applied) \
                 VALUES ($1, $2, (SELECT COUNT(*) + 1 FROM seen))",
            )
            .bind(event.position)
            .bind(&event.aggregate_id)
            .execute(conn)
            .await?;
            Ok(())
        })
    }
}

/// Runs the counting projector's catch-up with `batch` events per transaction.
async fn catch_up(store: &Store, batch: i64) -> u64 {
    match store {
        Store::Sqlite(s) => s.catch_up(Arc::new(Counter), batch).await,
        Store::Postgres(s) => s.catch_up(Arc::new(Counter), batch).await,
    }
    .expect("catch-up of the counting projector")
}

/// What the counting projector has seen, in the order it applied it: (position, aggregate id).
async fn seen(store: &Store) -> Vec<(i64, String)> {
    const SQL: &str = "SELECT position, aggregate_id FROM seen ORDER BY applied";
    match store {
        Store::Sqlite(s) => s
            .read(|conn| {
                let mut stmt = conn.prepare(SQL)?;
                let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
                Ok(rows.collect::<Result<Vec<_>, _>>()?)
            })
            .await
            .expect("reading seen on SQLite"),
        Store::Postgres(s) => sqlx::query_as(SQL)
            .fetch_all(s.pool())
            .await
            .expect("reading seen on Postgres"),
    }
}

// ---------------------------------------------------------------------------------------------
// Append: positions, sequences, store clock
// ---------------------------------------------------------------------------------------------

async fn append_assigns_positions_sequences_and_store_time(backend: Backend) {
    let ts = TestStore::new(backend).await;
    let store = &ts.store;

    let before = store.now().await.expect("store time");
    let a1 = store
        .append(
            "t",
            "a",
            0,
            vec![event("E", json!({"n": 1})), event("E", json!({"n": 2}))],
        )
        .await
        .expect("first append to a");
    let b1 = store
        .append("t", "b", 0, vec![event("E", json!({"n": 3}))])
        .await
        .expect("first append to b");
    let a2 = store
        .append("t", "a", 2, vec![event("E", json!({"n": 4}))])
        .await
        .expect("second append to a");
    let other_type = store
        .append("u", "a", 0, vec![event("E", json!({"n": 5}))])
        .await
        .expect("same id, other aggregate type");
    let after = store.now().await.expect("store time");

    let written: Vec<RecordedEvent> = [a1, b1, a2, other_type].concat();
    let positions: Vec<i64> = written.iter().map(|e| e.position).collect();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "positions must increase across aggregates in append order: {positions:?}"
    );
    let sequences: Vec<(&str, &str, i64)> = written
        .iter()
        .map(|e| {
            (
                e.aggregate_type.as_str(),
                e.aggregate_id.as_str(),
                e.sequence,
            )
        })
        .collect();
    assert_eq!(
        sequences,
        vec![
            ("t", "a", 1),
            ("t", "a", 2),
            ("t", "b", 1),
            ("t", "a", 3),
            ("u", "a", 1)
        ],
        "per-aggregate sequences start at 1 and are independent per (type, id)"
    );
    for e in &written {
        assert!(
            before <= e.recorded_at && e.recorded_at <= after,
            "recorded_at {} of position {} is not between the store's time before ({before}) \
             and after ({after})",
            e.recorded_at,
            e.position
        );
    }
    assert!(
        before < after,
        "the store clock must advance across appends ({before} vs {after})"
    );

    // What append returned is exactly what the ledger holds.
    assert_eq!(all_events(store).await, written);
}

on_both_backends!(
    append_assigns_positions_sequences_and_store_time,
    append_assigns_positions_sequences_and_store_time
);

// ---------------------------------------------------------------------------------------------
// Optimistic concurrency
// ---------------------------------------------------------------------------------------------

async fn stale_append_conflicts_and_writes_nothing(backend: Backend) {
    let ts = TestStore::new(backend).await;
    let store = &ts.store;
    store
        .append(
            "t",
            "occ",
            0,
            vec![event("E", json!({"v": 1})), event("E", json!({"v": 2}))],
        )
        .await
        .expect("seeding the aggregate");
    let ledger_before = all_events(store).await;

    // A writer that saw nothing, and a writer that saw only the first event.
    for (stale, taken) in [(0, 1), (1, 2)] {
        let result = store
            .append(
                "t",
                "occ",
                stale,
                vec![
                    event("E", json!({"v": "stale"})),
                    event("E", json!({"v": "stale"})),
                ],
            )
            .await;
        match result {
            Err(StoreError::Conflict {
                aggregate_type,
                aggregate_id,
                sequence,
            }) => {
                assert_eq!(aggregate_type, "t");
                assert_eq!(aggregate_id, "occ");
                assert_eq!(sequence, taken, "the conflict names the taken sequence");
            }
            other => panic!("a stale append (last_sequence {stale}) must conflict, got {other:?}"),
        }
        assert_eq!(
            all_events(store).await,
            ledger_before,
            "a conflicting append must write nothing"
        );
    }

    // The writer with the current sequence succeeds and continues the sequence.
    let next = store
        .append("t", "occ", 2, vec![event("E", json!({"v": 3}))])
        .await
        .expect("a current append succeeds");
    assert_eq!(next[0].sequence, 3);
    let loaded = store.load("t", "occ").await.expect("load");
    let values: Vec<Value> = loaded
        .iter()
        .map(|e| e.payload.to_value()["v"].clone())
        .collect();
    assert_eq!(values, vec![json!(1), json!(2), json!(3)]);
}

on_both_backends!(
    stale_append_conflicts_and_writes_nothing,
    stale_append_conflicts_and_writes_nothing
);

// ---------------------------------------------------------------------------------------------
// Inline projector failure rolls the append back
// ---------------------------------------------------------------------------------------------

async fn inline_projector_failure_rolls_back(backend: Backend) {
    let ts = TestStore::new(backend).await;
    execute_sql(
        &ts.store,
        "CREATE TABLE scribble (position BIGINT PRIMARY KEY)",
    )
    .await;

    // A second handle on the same file or schema, with extra inline projectors.
    let guarded = match &ts.store {
        Store::Sqlite(s) => {
            let mut projectors = wharf::projections::sqlite_inline();
            projectors.push(Arc::new(Scribe));
            projectors.push(Arc::new(Failing));
            Store::Sqlite(
                SqliteStore::open(s.path(), projectors)
                    .await
                    .expect("second SQLite handle"),
            )
        }
        Store::Postgres(_) => {
            let schema = ts.schema().expect("a Postgres test store has a schema");
            let mut projectors = wharf::projections::pg_inline();
            projectors.push(Arc::new(Scribe));
            projectors.push(Arc::new(Failing));
            Store::Postgres(
                PgStore::connect(&TestStore::pg_settings(schema), projectors)
                    .expect("second Postgres handle"),
            )
        }
    };

    guarded
        .append("t", "ok", 0, vec![event("Fine", json!({}))])
        .await
        .expect("an event the projectors accept");
    let ledger_before = all_events(&ts.store).await;

    // The good event is projected first, then Boom fails: all of it must roll back.
    let result = guarded
        .append(
            "t",
            "bad",
            0,
            vec![
                event("Fine", json!({"first": true})),
                event("Boom", json!({})),
            ],
        )
        .await;
    match result {
        Err(StoreError::Projection { projector, source }) => {
            assert_eq!(
                projector,
                Failing::NAME,
                "the error names the failing projector"
            );
            assert!(
                matches!(*source, StoreError::Decode { .. }),
                "the projector's own error is kept as the source: {source:?}"
            );
        }
        other => panic!("a failing inline projector must fail the append, got {other:?}"),
    }
    assert_eq!(
        all_events(&ts.store).await,
        ledger_before,
        "no event of the failed append may be written"
    );
    assert!(
        guarded.load("t", "bad").await.expect("load").is_empty(),
        "the failed aggregate has no events"
    );
    let scribbled = match &guarded {
        Store::Sqlite(s) => s
            .read(|conn| Ok(conn.query_row("SELECT COUNT(*) FROM scribble", [], |r| r.get(0))?))
            .await
            .expect("count scribbles"),
        Store::Postgres(s) => sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM scribble")
            .fetch_one(s.pool())
            .await
            .expect("count scribbles"),
    };
    assert_eq!(
        scribbled, 1,
        "the other projector's writes in the failed append roll back too"
    );

    // The sequence was not taken: a good append to the same aggregate starts at 1.
    let good = guarded
        .append("t", "bad", 0, vec![event("Fine", json!({"again": true}))])
        .await
        .expect("a following good append succeeds");
    assert_eq!(good[0].sequence, 1);
    assert!(good[0].position > ledger_before.last().expect("seeded").position);
    assert_eq!(all_events(&ts.store).await.len(), ledger_before.len() + 1);

    if let Store::Postgres(s) = &guarded {
        s.pool().close().await;
    }
}

on_both_backends!(
    inline_projector_failure_rolls_back,
    inline_projector_failure_rolls_back
);

// ---------------------------------------------------------------------------------------------
// Reads
// ---------------------------------------------------------------------------------------------

fn query(limit: i64) -> EventQuery {
    EventQuery {
        limit,
        ..EventQuery::default()
    }
}

async fn reads_return_what_was_written_in_order(backend: Backend) {
    let ts = TestStore::new(backend).await;
    let store = &ts.store;

    // Eight events on ("audit", "q"), one per append, interleaved with events on another
    // aggregate that carry the same payload fields (and so must never leak into a query).
    let mut q = Vec::new();
    let mut everything = Vec::new();
    for i in 0..8i64 {
        let who = if i % 3 == 0 { "alice" } else { "bob" };
        let written = store
            .append(
                "audit",
                "q",
                i,
                vec![event("Q", json!({"declarer": who, "n": i}))],
            )
            .await
            .expect("append to q");
        q.extend(written.clone());
        everything.extend(written);
        let noise = store
            .append(
                "audit",
                "other",
                i,
                vec![event("Q", json!({"declarer": "alice", "n": i}))],
            )
            .await
            .expect("append to other");
        everything.extend(noise);
    }

    // load: the aggregate's events in sequence order, exactly as written.
    assert_eq!(store.load("audit", "q").await.expect("load"), q);
    assert!(store.load("audit", "none").await.expect("load").is_empty());

    // read_after: every aggregate, in position order, paged.
    assert_eq!(all_events(store).await, everything);
    let from = everything[3].position;
    assert_eq!(
        store.read_after(from, 4).await.expect("read_after"),
        everything[4..8].to_vec()
    );
    let last = everything.last().expect("written").position;
    assert!(store
        .read_after(last, 10)
        .await
        .expect("read_after")
        .is_empty());

    // query_events without filters: the aggregate's events only.
    assert_eq!(
        store
            .query_events("audit", "q", query(100))
            .await
            .expect("query"),
        q
    );

    // payload_field.
    let alice: Vec<RecordedEvent> = q
        .iter()
        .filter(|e| e.payload.to_value()["declarer"] == "alice")
        .cloned()
        .collect();
    assert_eq!(alice.len(), 3);
    let by_alice = EventQuery {
        payload_field: Some(("declarer".into(), "alice".into())),
        ..query(100)
    };
    assert_eq!(
        store
            .query_events("audit", "q", by_alice.clone())
            .await
            .expect("query"),
        alice
    );
    let by_nobody = EventQuery {
        payload_field: Some(("declarer".into(), "carol".into())),
        ..query(100)
    };
    assert!(store
        .query_events("audit", "q", by_nobody)
        .await
        .expect("query")
        .is_empty());

    // since (inclusive) and until (exclusive), by the store's recorded_at.
    let since = q[2].recorded_at;
    let until = q[6].recorded_at;
    let window: Vec<RecordedEvent> = q
        .iter()
        .filter(|e| e.recorded_at >= since && e.recorded_at < until)
        .cloned()
        .collect();
    assert!(
        !window.is_empty() && window.len() < q.len(),
        "the time window must select a proper subset: {} of {}",
        window.len(),
        q.len()
    );
    let timed = EventQuery {
        since: Some(since),
        until: Some(until),
        ..query(100)
    };
    assert_eq!(
        store
            .query_events("audit", "q", timed)
            .await
            .expect("query"),
        window
    );
    let combined = EventQuery {
        since: Some(since),
        ..by_alice.clone()
    };
    let expected: Vec<RecordedEvent> = alice
        .iter()
        .filter(|e| e.recorded_at >= since)
        .cloned()
        .collect();
    assert_eq!(
        store
            .query_events("audit", "q", combined)
            .await
            .expect("query"),
        expected
    );

    // after_position + limit pages through the aggregate without gaps or repeats.
    let mut paged = Vec::new();
    let mut after = 0;
    loop {
        let page = store
            .query_events(
                "audit",
                "q",
                EventQuery {
                    after_position: after,
                    ..query(3)
                },
            )
            .await
            .expect("query page");
        assert!(page.len() <= 3, "a page holds at most `limit` events");
        let Some(last) = page.last() else { break };
        after = last.position;
        let full = page.len() == 3;
        paged.extend(page);
        if !full {
            break;
        }
    }
    assert_eq!(paged, q);

    // An `after_position` that is not one of the aggregate's events (another aggregate's, or
    // beyond the head) still answers exactly the aggregate's events after that position.
    for noise in everything.iter().filter(|e| e.aggregate_id == "other") {
        let expected: Vec<RecordedEvent> = q
            .iter()
            .filter(|e| e.position > noise.position)
            .cloned()
            .collect();
        let page = store
            .query_events(
                "audit",
                "q",
                EventQuery {
                    after_position: noise.position,
                    ..query(100)
                },
            )
            .await
            .expect("query after another aggregate's position");
        assert_eq!(page, expected, "after position {}", noise.position);
    }
    let beyond = EventQuery {
        after_position: last + 1,
        ..query(100)
    };
    assert!(store
        .query_events("audit", "q", beyond)
        .await
        .expect("query")
        .is_empty());
}

on_both_backends!(
    reads_return_what_was_written_in_order,
    reads_return_what_was_written_in_order
);

// ---------------------------------------------------------------------------------------------
// Catch-up
// ---------------------------------------------------------------------------------------------

async fn catch_up_applies_every_event_exactly_once(backend: Backend) {
    let ts = TestStore::new(backend).await;
    let store = &ts.store;
    execute_sql(store, Counter::DDL).await;

    assert_eq!(catch_up(store, 2).await, 0, "an empty log applies nothing");
    assert_eq!(
        store.checkpoint(Counter::NAME).await.expect("checkpoint"),
        0
    );

    for i in 0..5 {
        let id = format!("agg{}", i % 2);
        let last = store.load("t", &id).await.expect("load").len() as i64;
        store
            .append("t", &id, last, vec![event("E", json!({ "i": i }))])
            .await
            .expect("append");
    }
    assert_eq!(
        catch_up(store, 2).await,
        5,
        "batches of 2 still apply all 5"
    );
    let head = all_events(store).await;
    assert_eq!(
        store.checkpoint(Counter::NAME).await.expect("checkpoint"),
        head.last().expect("events").position
    );
    assert_eq!(
        catch_up(store, 2).await,
        0,
        "a caught-up projector applies nothing"
    );

    // Exactly a multiple of the batch size, then more.
    store
        .append(
            "t",
            "agg9",
            0,
            vec![event("E", json!({})), event("E", json!({}))],
        )
        .await
        .expect("append");
    store
        .append("t", "agg8", 0, vec![event("E", json!({}))])
        .await
        .expect("append");
    assert_eq!(catch_up(store, 3).await, 3);
    assert_eq!(catch_up(store, 3).await, 0);

    let head = all_events(store).await;
    let expected: Vec<(i64, String)> = head
        .iter()
        .map(|e| (e.position, e.aggregate_id.clone()))
        .collect();
    assert_eq!(
        seen(store).await,
        expected,
        "every event applied once, in position order"
    );
    assert_eq!(
        store.checkpoint(Counter::NAME).await.expect("checkpoint"),
        head.last().expect("events").position,
        "the checkpoint is the last position"
    );
}

on_both_backends!(
    catch_up_applies_every_event_exactly_once,
    catch_up_applies_every_event_exactly_once
);

/// How long a blocked append is given to (wrongly) complete before it counts as blocked.
const BLOCKED_FOR: Duration = Duration::from_millis(300);

async fn catch_up_never_skips_a_late_commit(backend: Backend) {
    let ts = TestStore::new(backend).await;
    let store = ts.store.clone();
    execute_sql(&store, Counter::DDL).await;

    let late_position = match backend {
        Backend::Postgres => {
            // A raw transaction appends (taking the append lock) and does not commit yet.
            let pg = pg_of(&store);
            let mut raw = pg.pool().begin().await.expect("begin a raw transaction");
            let late = wharf::store::postgres::append_in_tx(
                &mut raw,
                &[],
                "t",
                "late",
                0,
                vec![event("Late", json!({}))],
            )
            .await
            .expect("append inside the raw transaction");

            // Another writer on another aggregate must wait for the append lock.
            let mut other = tokio::spawn({
                let store = store.clone();
                async move {
                    store
                        .append("t", "early", 0, vec![event("Early", json!({}))])
                        .await
                }
            });
            assert!(
                tokio::time::timeout(BLOCKED_FOR, &mut other).await.is_err(),
                "an append must block while an earlier-positioned append is uncommitted"
            );

            // Catch-up sees neither: one is uncommitted, the other has not inserted.
            assert_eq!(catch_up(&store, 10).await, 0);
            assert!(seen(&store).await.is_empty());
            assert_eq!(
                store.checkpoint(Counter::NAME).await.expect("checkpoint"),
                0
            );

            raw.commit().await.expect("commit the late transaction");
            other
                .await
                .expect("the other append task")
                .expect("the other append succeeds once the lock is free");
            late[0].position
        }
        Backend::Sqlite => {
            // A write transaction appends and then holds the writer until released.
            let sqlite = sqlite_of(&store).clone();
            let (appended_tx, appended_rx) = tokio::sync::oneshot::channel();
            let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
            let holder = tokio::spawn(async move {
                sqlite
                    .write(move |ctx| {
                        let late = wharf::store::sqlite::append_in_tx(
                            ctx.tx,
                            ctx.projectors,
                            ctx.now,
                            "t",
                            "late",
                            0,
                            vec![event("Late", json!({}))],
                        )?;
                        let _ = appended_tx.send(late[0].position);
                        release_rx
                            .recv()
                            .map_err(|e| StoreError::Task(format!("never released: {e}")))?;
                        Ok(late)
                    })
                    .await
            });
            let late_position = appended_rx.await.expect("the holder appended");

            let mut other = tokio::spawn({
                let store = store.clone();
                async move {
                    store
                        .append("t", "early", 0, vec![event("Early", json!({}))])
                        .await
                }
            });
            assert!(
                tokio::time::timeout(BLOCKED_FOR, &mut other).await.is_err(),
                "an append must block while another write transaction is open"
            );
            assert!(
                store.read_after(0, 10).await.expect("read").is_empty(),
                "readers see nothing uncommitted"
            );
            // Catch-up sees nothing committed either: it applies nothing and leaves the
            // checkpoint where it was (without waiting for the writer).
            assert_eq!(catch_up(&store, 10).await, 0);
            assert!(seen(&store).await.is_empty());
            assert_eq!(
                store.checkpoint(Counter::NAME).await.expect("checkpoint"),
                0
            );

            release_tx.send(()).expect("release the holder");
            holder
                .await
                .expect("the holder task")
                .expect("the held write commits");
            other
                .await
                .expect("the other append task")
                .expect("the other append succeeds once the writer is free");
            late_position
        }
    };

    catch_up(&store, 10).await;
    let applied = seen(&store).await;
    let ids: Vec<&str> = applied.iter().map(|(_, id)| id.as_str()).collect();
    assert_eq!(
        ids,
        vec!["late", "early"],
        "catch-up must apply both, the late commit first: {applied:?}"
    );
    assert_eq!(applied[0].0, late_position);
    assert!(
        applied[0].0 < applied[1].0,
        "the late commit holds the smaller position: {applied:?}"
    );
    assert_eq!(
        store.checkpoint(Counter::NAME).await.expect("checkpoint"),
        applied[1].0
    );
}

on_both_backends!(
    catch_up_never_skips_a_late_commit,
    catch_up_never_skips_a_late_commit
);

// ---------------------------------------------------------------------------------------------
// Worker instances and the group executor
// ---------------------------------------------------------------------------------------------

fn lock(group: &str, ttl: Duration) -> GroupLock {
    GroupLock {
        group: group.to_owned(),
        topic: "orders".to_owned(),
        declarer: "observer".to_owned(),
        instance_ttl: ttl,
        after_sequence: 0,
    }
}

/// The declarers a locked attempt observes as live under `ttl`.
async fn live_declarers(store: &Store, group: &str, ttl: Duration) -> Vec<String> {
    store
        .execute_group(lock(group, ttl), |snapshot| {
            let live = snapshot
                .observed
                .live
                .iter()
                .map(|i| i.declarer.clone())
                .collect();
            Ok::<_, Infallible>((GroupWrite::default(), live))
        })
        .await
        .expect("a locked attempt")
        .expect("the decision never fails")
}

const LONG_TTL: Duration = Duration::from_secs(60);
const SHORT_TTL: Duration = Duration::from_millis(300);

async fn worker_instances_follow_heartbeats(backend: Backend) {
    let ts = TestStore::new(backend).await;
    let store = &ts.store;

    let before = store.now().await.expect("store time");
    let heartbeat = Heartbeat {
        declarer: "w1".into(),
        version: "1.2.3".into(),
        patterns: vec!["orders/+/paid".into(), "orders/eu/#".into()],
    };
    let observed_now = store
        .execute_group(lock("g1", LONG_TTL), move |snapshot| {
            assert!(snapshot.observed.live.is_empty());
            assert!(snapshot.observed.open_wait.is_none());
            assert!(snapshot.events.is_empty());
            Ok::<_, Infallible>((
                GroupWrite {
                    events: Vec::new(),
                    extra: Some(heartbeat.into()),
                },
                snapshot.now,
            ))
        })
        .await
        .expect("locked attempt")
        .expect("decision");
    let after = store.now().await.expect("store time");
    assert!(before <= observed_now && observed_now <= after);

    let instances = store.instances(Some("g1".into())).await.expect("instances");
    assert_eq!(instances.len(), 1, "{instances:?}");
    let first = &instances[0];
    assert_eq!(
        (
            first.group.as_str(),
            first.declarer.as_str(),
            first.topic.as_str()
        ),
        ("g1", "w1", "orders")
    );
    assert_eq!(first.version, "1.2.3");
    assert_eq!(first.patterns, vec!["orders/+/paid", "orders/eu/#"]);
    // A first heartbeat starts the instance. (Postgres reads clock_timestamp() once per
    // column, so the two may differ by a microsecond or so: only order is asserted.)
    assert!(first.started_at <= first.heartbeat_at);
    assert!(before <= first.started_at && first.heartbeat_at <= after);
    assert!(store
        .instances(Some("g2".into()))
        .await
        .expect("instances")
        .is_empty());
    assert_eq!(store.instances(None).await.expect("instances").len(), 1);

    // A heartbeat refreshes the row by the store's clock; an unknown instance has no row.
    assert!(store.heartbeat("g1", "w1").await.expect("heartbeat"));
    assert!(!store.heartbeat("g1", "nobody").await.expect("heartbeat"));
    assert!(!store.heartbeat("g2", "w1").await.expect("heartbeat"));
    let refreshed = store.instances(Some("g1".into())).await.expect("instances");
    assert_eq!(
        refreshed[0].started_at, first.started_at,
        "started_at is kept"
    );
    assert!(
        refreshed[0].heartbeat_at > first.heartbeat_at,
        "heartbeat_at advances"
    );

    // Live while fresher than the TTL, by the store's clock; a heartbeat makes it live again.
    assert_eq!(live_declarers(store, "g1", LONG_TTL).await, vec!["w1"]);
    wait_until(
        "w1 to stop counting as live under a 300 ms TTL",
        Duration::from_secs(10),
        || async { live_declarers(store, "g1", SHORT_TTL).await.is_empty() },
    )
    .await;
    let lapsed = store.instances(Some("g1".into())).await.expect("instances");
    let age = store.now().await.expect("store time") - lapsed[0].heartbeat_at;
    assert!(
        age >= chrono::Duration::from_std(SHORT_TTL).expect("ttl"),
        "an instance may only lapse once its heartbeat is older than the TTL (age {age})"
    );
    assert_eq!(
        live_declarers(store, "g1", LONG_TTL).await,
        vec!["w1"],
        "a lapsed heartbeat still counts under a longer TTL"
    );
    wait_until(
        "a fresh heartbeat to make w1 live again",
        Duration::from_secs(10),
        || async {
            store.heartbeat("g1", "w1").await.expect("heartbeat")
                && live_declarers(store, "g1", SHORT_TTL).await == vec!["w1".to_owned()]
        },
    )
    .await;

    // Leaving removes the row at once.
    assert!(store.leave("g1", "w1").await.expect("leave"));
    assert!(!store.leave("g1", "w1").await.expect("leave twice"));
    assert!(store.instances(None).await.expect("instances").is_empty());
    assert!(!store
        .heartbeat("g1", "w1")
        .await
        .expect("heartbeat after leave"));
    assert!(live_declarers(store, "g1", LONG_TTL).await.is_empty());
}

on_both_backends!(
    worker_instances_follow_heartbeats,
    worker_instances_follow_heartbeats
);

async fn group_executor_is_atomic(backend: Backend) {
    let ts = TestStore::new(backend).await;
    let store = &ts.store;

    // A decision error comes back as the inner error, and the attempt writes nothing.
    let refused = store
        .execute_group(lock("g1", LONG_TTL), |_| {
            Err::<(GroupWrite, ()), _>("refused")
        })
        .await
        .expect("the store itself did not fail");
    assert_eq!(refused, Err("refused"));
    assert!(store.instances(None).await.expect("instances").is_empty());

    // A group event the inline projector cannot decode fails the whole attempt: the event
    // and the heartbeat written with it are rolled back together.
    let result = store
        .execute_group(lock("g1", LONG_TTL), |_| {
            Ok::<_, Infallible>((
                GroupWrite {
                    events: vec![event(
                        "DeclarationInstalled",
                        json!({"not": "a declaration"}),
                    )],
                    extra: Some(
                        Heartbeat {
                            declarer: "w2".into(),
                            version: "1".into(),
                            patterns: vec![],
                        }
                        .into(),
                    ),
                },
                (),
            ))
        })
        .await;
    match result {
        Err(StoreError::Projection { projector, .. }) => {
            assert_eq!(projector, wharf::projections::EffectiveBindings::NAME);
        }
        other => panic!("an undecodable declaration must fail the attempt, got {other:?}"),
    }
    assert!(store.instances(None).await.expect("instances").is_empty());
    assert!(store
        .load("consumer_group", "g1")
        .await
        .expect("load")
        .is_empty());
    assert!(all_events(store).await.is_empty());

    // A plain append to a group aggregate runs the same inline projector, and fails the same.
    store
        .append("consumer_group", "g1", 0, vec![event("X", json!({}))])
        .await
        .expect_err("the inline projector refuses non-declarations on a group aggregate");

    // The next attempt sees nothing of the failed ones.
    let sequences = store
        .execute_group(lock("g1", LONG_TTL), |snapshot| {
            Ok::<_, Infallible>((
                GroupWrite::default(),
                (snapshot.last_sequence(), snapshot.events.len()),
            ))
        })
        .await
        .expect("attempt")
        .expect("decision");
    assert_eq!(sequences, (0, 0));
}

on_both_backends!(group_executor_is_atomic, group_executor_is_atomic);

// ---------------------------------------------------------------------------------------------
// Migrations
// ---------------------------------------------------------------------------------------------

async fn migrations_are_idempotent_and_checked(backend: Backend) {
    let migrated = TestStore::new(backend).await;
    assert!(
        migrated
            .store
            .migrate()
            .await
            .expect("second migrate")
            .is_empty(),
        "a second migrate applies nothing"
    );
    migrated
        .store
        .ensure_migrated()
        .await
        .expect("a migrated store passes the check");

    let fresh = TestStore::unmigrated(backend).await;
    let scripts = fresh.store.migrations();
    match fresh.store.ensure_migrated().await {
        Err(StoreError::NotMigrated { found, needed }) => {
            assert_eq!(found, 0);
            assert_eq!(needed, wharf::store::migrate::needed(scripts));
        }
        other => panic!("an unmigrated store must be refused, got {other:?}"),
    }
    let applied = fresh.store.migrate().await.expect("first migrate");
    let names: Vec<&str> = scripts.iter().map(|m| m.name).collect();
    assert_eq!(
        applied, names,
        "the first migrate applies every script in order"
    );
    fresh.store.ensure_migrated().await.expect("now migrated");
    assert!(fresh.store.migrate().await.expect("again").is_empty());
}

on_both_backends!(
    migrations_are_idempotent_and_checked,
    migrations_are_idempotent_and_checked
);

/// Postgres migration 0014 (ADR 0043): new event payloads are compressed with lz4 where the
/// server has it, and a large payload reads back exactly.
#[tokio::test]
async fn postgres_event_payloads_are_lz4_compressed() {
    let test = TestStore::new(Backend::Postgres).await;
    let pool = pg_of(&test.store).pool();
    // Whether this server was built with lz4 (the one case where pglz is right): its
    // compression setting offers it.
    let lz4: bool = sqlx::query_scalar(
        "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'",
    )
    .fetch_one(pool)
    .await
    .expect("the server's compression methods");
    let column: Option<String> = sqlx::query_scalar(
        "SELECT NULLIF(attcompression, '')::text FROM pg_attribute \
         WHERE attrelid = 'events'::regclass AND attname = 'payload'",
    )
    .fetch_one(pool)
    .await
    .expect("the payload column");
    assert_eq!(
        column.as_deref(),
        lz4.then_some("l"),
        "lz4 on this server: {lz4}"
    );

    let filters: Vec<String> = (0..20_000).map(|i| format!("plant/{i}/line/#")).collect();
    let payload = json!({ "filters": filters });
    test.store
        .append("t", "large", 0, vec![event("E", payload.clone())])
        .await
        .expect("a large append");
    let method: Option<String> = sqlx::query_scalar(
        "SELECT pg_column_compression(payload) FROM events WHERE aggregate_id = 'large'",
    )
    .fetch_one(pool)
    .await
    .expect("the stored payload");
    assert_eq!(method.as_deref(), Some(if lz4 { "lz4" } else { "pglz" }));
    let read = all_events(&test.store).await;
    assert_eq!(read.last().map(|e| e.payload.to_value()), Some(payload));
}

// ---------------------------------------------------------------------------------------------
// postgres-es interoperability
// ---------------------------------------------------------------------------------------------

fn declarer(name: &str) -> DeclarerId {
    DeclarerId::parse("declarer", name).expect("a valid declarer id")
}

/// Events Wharf writes through `register` read back through postgres-es (the cqrs-es
/// Postgres repository, on its default `events`/`snapshots` tables) and fold into the same
/// `ConsumerGroup` as Wharf's own load.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_es_reads_the_wharf_ledger() {
    let ts = TestStore::new(Backend::Postgres).await;
    let mut config = ts.config();
    config.declarations.instance_ttl = Duration::from_secs(30);
    let wharf = wharf::Wharf::with_store(ts.store.clone(), &config.settings());
    let old = Registration::new("interop", "orders", "1.0.0", &["orders/+/paid"]).expect("valid");
    let new = Registration::new(
        "interop",
        "orders",
        "2.0.0",
        &["orders/+/paid", "orders/eu/#"],
    )
    .expect("valid");

    // Installed, then Waiting (a live instance declares the old set), then Installed.
    let first = wharf
        .as_declarer(declarer("a"))
        .register(&old)
        .await
        .expect("register");
    assert!(
        matches!(first, RegisterOutcome::Installed { .. }),
        "{first:?}"
    );
    let incumbent = wharf.as_declarer(declarer("live")).consume(old.clone());
    let mut state = incumbent.watch();
    tokio::time::timeout(Duration::from_secs(10), state.wait_for(|s| s.is_ready()))
        .await
        .expect("the incumbent becomes ready")
        .expect("state channel");
    drop(state);
    let waiting = wharf
        .as_declarer(declarer("b"))
        .register(&new)
        .await
        .expect("register");
    assert!(
        matches!(waiting, RegisterOutcome::Waiting { .. }),
        "{waiting:?}"
    );
    incumbent.shutdown().await;
    let installed = wharf
        .as_declarer(declarer("b"))
        .register(&new)
        .await
        .expect("register");
    assert!(
        matches!(installed, RegisterOutcome::Installed { .. }),
        "{installed:?}"
    );

    let ours = ts
        .store
        .load("consumer_group", "interop")
        .await
        .expect("load");
    let types: Vec<&str> = ours.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(
        types,
        vec![
            "DeclarationInstalled",
            "DeclarationWaiting",
            "DeclarationInstalled"
        ]
    );

    let pool = pg_of(&ts.store).pool().clone();
    let repo = PostgresEventRepository::new(pool.clone());
    let theirs = repo
        .get_events::<ConsumerGroup>("interop")
        .await
        .expect("postgres-es reads the ledger");
    assert_eq!(theirs.len(), ours.len());
    for (t, o) in theirs.iter().zip(&ours) {
        assert_eq!(t.aggregate_type, o.aggregate_type);
        assert_eq!(t.aggregate_id, o.aggregate_id);
        assert_eq!(t.sequence as i64, o.sequence);
        assert_eq!(t.event_type, o.event_type);
        assert_eq!(t.event_version, o.event_version);
        assert_eq!(t.payload, o.payload.to_value());
        assert_eq!(t.metadata, o.metadata);
    }

    let mut folded_ours = ConsumerGroup::default();
    for e in &ours {
        folded_ours.apply(e.decode::<DeclarationEvent>().expect("our event decodes"));
    }
    let mut folded_theirs = ConsumerGroup::default();
    for e in theirs {
        folded_theirs.apply(serde_json::from_value(e.payload).expect("their payload decodes"));
    }
    assert_eq!(folded_theirs, folded_ours);
    assert_eq!(folded_ours.installs, 2);
    assert_eq!(folded_ours.effective_set(), new.bindings);
    let open: i64 =
        sqlx::query_scalar("SELECT count(*) FROM open_wait WHERE group_name = 'interop'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(open, 0, "b's own install ended its wait");

    // And through cqrs-es's own event store, the way a CqrsFramework would load it.
    let event_store =
        PersistedEventStore::<PostgresEventRepository, ConsumerGroup>::new_event_store(
            PostgresEventRepository::new(pool),
        );
    let context = event_store
        .load_aggregate("interop")
        .await
        .expect("cqrs-es loads the aggregate");
    assert_eq!(context.aggregate, folded_ours);
    assert_eq!(context.current_sequence, 3);
}
