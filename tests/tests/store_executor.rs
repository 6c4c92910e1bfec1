//! The generic locked executor on a real SQLite file and a real Postgres schema: an aggregate
//! with no row of its own is locked through `aggregate_lock`, so concurrent attempts serialize
//! (every one appends after the other, none conflicts); what it observes is read in the locked
//! transaction; a guard that does not hold refuses the write with a typed error and leaves
//! nothing behind; a decision error rolls back. The optimistic form lands every attempt exactly
//! once under contention (a conflict, retried locked), and a write whose read the version moved
//! past writes nothing.

use std::convert::Infallible;

use async_trait::async_trait;
use serde_json::json;
use wharf::store::{
    Assumed, AttemptForm, Attempted, CteStatement, LockedAggregate, NewEvent, PgGuard, Store,
    StoreError, Write,
};
use wharf_tests::{on_both_backends, on_postgres, Backend, TestStore};

/// A test aggregate: observes how many rows `fence` holds; guarded, when `token` is set, by
/// `fence` holding exactly that token.
struct Fenced {
    id: String,
    after_sequence: i64,
    token: Option<i64>,
}

impl Fenced {
    fn new(id: &str, token: Option<i64>) -> Self {
        Self {
            id: id.to_owned(),
            after_sequence: 0,
            token,
        }
    }
}

#[async_trait]
impl LockedAggregate for Fenced {
    type Observed = i64;
    type Extra = ();

    fn aggregate_type(&self) -> &'static str {
        "test_fenced"
    }

    fn aggregate_id(&self) -> &str {
        &self.id
    }

    fn after_sequence(&self) -> i64 {
        self.after_sequence
    }

    fn pg_observe(&self, _args: &mut CteStatement) -> Result<String, StoreError> {
        Ok("to_json((SELECT count(*) FROM fence))".to_owned())
    }

    fn pg_guard(&self, args: &mut CteStatement) -> Result<Option<PgGuard>, StoreError> {
        let Some(token) = self.token else {
            return Ok(None);
        };
        let token = args.bind(token)?;
        Ok(Some(PgGuard {
            condition: format!("EXISTS (SELECT 1 FROM fence WHERE token = {token})"),
            refusal: format!("token {} is not current", self.token.unwrap_or(0)),
        }))
    }

    fn sqlite_observe(&self, tx: &rusqlite::Transaction<'_>, _now: i64) -> Result<i64, StoreError> {
        Ok(tx.query_row("SELECT count(*) FROM fence", [], |row| row.get(0))?)
    }

    fn sqlite_guard(
        &self,
        tx: &rusqlite::Transaction<'_>,
        _now: i64,
    ) -> Result<Option<String>, StoreError> {
        let Some(token) = self.token else {
            return Ok(None);
        };
        let holds: bool = tx.query_row(
            "SELECT EXISTS (SELECT 1 FROM fence WHERE token = ?1)",
            [token],
            |row| row.get(0),
        )?;
        Ok((!holds).then(|| format!("token {token} is not current")))
    }
}

fn event(n: i64) -> NewEvent {
    NewEvent {
        event_type: "Counted".to_owned(),
        event_version: "1.0".to_owned(),
        payload: json!({ "n": n }).into(),
        metadata: json!({}),
    }
}

async fn create_fence(store: &Store, token: i64) {
    match store {
        Store::Sqlite(s) => s
            .write(move |ctx| {
                ctx.tx
                    .execute_batch("CREATE TABLE fence (token INTEGER NOT NULL)")?;
                ctx.tx.execute("INSERT INTO fence VALUES (?1)", [token])?;
                Ok(())
            })
            .await
            .expect("fence table"),
        Store::Postgres(s) => {
            sqlx::query("CREATE TABLE fence (token BIGINT NOT NULL)")
                .execute(s.pool())
                .await
                .expect("fence table");
            sqlx::query("INSERT INTO fence VALUES ($1)")
                .bind(token)
                .execute(s.pool())
                .await
                .expect("fence row");
        }
    }
}

/// One attempt that appends one event after whatever the stream holds; returns the sequence
/// it wrote and what it observed.
async fn count_once(store: &Store, id: &str, token: Option<i64>) -> Result<(i64, i64), StoreError> {
    store
        .execute(Fenced::new(id, token), |snapshot| {
            let next = snapshot.last_sequence() + 1;
            Ok::<_, Infallible>((Write::events(vec![event(next)]), (next, snapshot.observed)))
        })
        .await
        .map(|decided| decided.expect("the decision never fails"))
}

async fn concurrent_attempts_serialize_on_the_aggregate_lock(backend: Backend) {
    let ts = TestStore::new(backend).await;
    create_fence(&ts.store, 7).await;
    let attempts = (0..8).map(|_| {
        let store = ts.store.clone();
        tokio::spawn(async move { count_once(&store, "s1", None).await })
    });
    let mut sequences = Vec::new();
    for attempt in futures::future::join_all(attempts).await {
        let (sequence, observed) = attempt.expect("task").expect("no conflict under the lock");
        assert_eq!(observed, 1, "the observed value is read in the transaction");
        sequences.push(sequence);
    }
    sequences.sort_unstable();
    assert_eq!(sequences, (1..=8).collect::<Vec<_>>());
    let loaded = ts.store.load("test_fenced", "s1").await.expect("load");
    assert_eq!(loaded.len(), 8);
    // Another aggregate id has a lock of its own and a stream of its own.
    assert_eq!(count_once(&ts.store, "s2", None).await.expect("s2").0, 1);
}

on_both_backends!(
    concurrent_attempts_serialize_on_the_aggregate_lock,
    concurrent_attempts_serialize_on_the_aggregate_lock
);

async fn a_guard_that_does_not_hold_refuses_and_writes_nothing(backend: Backend) {
    let ts = TestStore::new(backend).await;
    create_fence(&ts.store, 7).await;
    assert_eq!(
        count_once(&ts.store, "s1", Some(7))
            .await
            .expect("current token")
            .0,
        1
    );

    let refused = count_once(&ts.store, "s1", Some(6)).await;
    match refused {
        Err(StoreError::GuardRefused {
            aggregate_type,
            aggregate_id,
            reason,
        }) => {
            assert_eq!(aggregate_type, "test_fenced");
            assert_eq!(aggregate_id, "s1");
            assert_eq!(reason, "token 6 is not current");
        }
        other => panic!("expected a guard refusal, got {other:?}"),
    }
    let loaded = ts.store.load("test_fenced", "s1").await.expect("load");
    assert_eq!(loaded.len(), 1, "the refused attempt appended nothing");
}

on_both_backends!(
    a_guard_that_does_not_hold_refuses_and_writes_nothing,
    a_guard_that_does_not_hold_refuses_and_writes_nothing
);

async fn a_decision_error_rolls_back(backend: Backend) {
    let ts = TestStore::new(backend).await;
    create_fence(&ts.store, 1).await;
    let refused = ts
        .store
        .execute(Fenced::new("s1", None), |_| Err::<(Write<()>, ()), _>("no"))
        .await
        .expect("the store call succeeds");
    assert_eq!(refused, Err("no"));
    assert!(ts
        .store
        .load("test_fenced", "s1")
        .await
        .expect("load")
        .is_empty());
    // The lock row the refused attempt took was rolled back with it: the next attempt starts
    // from a new row and still appends at sequence 1.
    assert_eq!(count_once(&ts.store, "s1", None).await.expect("after").0, 1);
}

on_both_backends!(a_decision_error_rolls_back, a_decision_error_rolls_back);

/// One attempt in the optimistic form that appends `events` events after whatever the stream
/// holds; a conflict is returned as it is.
async fn count_optimistic(store: &Store, id: &str, events: i64) -> Result<i64, StoreError> {
    store
        .execute_optimistic(Fenced::new(id, None), move |snapshot| {
            let first = snapshot.last_sequence() + 1;
            let written = (first..first + events).map(event).collect();
            Ok::<_, Infallible>((Write::events(written), first + events - 1))
        })
        .await
        .map(|decided| decided.expect("the decision never fails"))
}

/// Optimistic first, locked after a conflict: what a caller of the optimistic form does.
async fn count_with_retry(store: &Store, id: &str) -> i64 {
    match count_optimistic(store, id, 1).await {
        Ok(sequence) => sequence,
        Err(StoreError::Conflict { .. }) => count_once(store, id, None).await.expect("locked").0,
        Err(e) => panic!("the optimistic attempt failed: {e}"),
    }
}

async fn optimistic_attempts_under_contention_all_land_in_order(backend: Backend) {
    let ts = TestStore::new(backend).await;
    create_fence(&ts.store, 1).await;
    // The first attempt creates the lock row (an aggregate without one always runs locked).
    assert_eq!(
        count_optimistic(&ts.store, "s1", 1).await.expect("first"),
        1
    );
    let tasks = (0..6).map(|_| {
        let store = ts.store.clone();
        tokio::spawn(async move {
            let mut written = Vec::new();
            for _ in 0..10 {
                written.push(count_with_retry(&store, "s1").await);
            }
            written
        })
    });
    let mut sequences: Vec<i64> = futures::future::join_all(tasks)
        .await
        .into_iter()
        .flat_map(|task| task.expect("task"))
        .collect();
    sequences.sort_unstable();
    assert_eq!(
        sequences,
        (2..=61).collect::<Vec<_>>(),
        "every attempt wrote exactly once"
    );
    let loaded = ts.store.load("test_fenced", "s1").await.expect("load");
    let payloads: Vec<i64> = loaded
        .iter()
        .map(|e| e.payload.to_value()["n"].as_i64().unwrap())
        .collect();
    assert_eq!(
        payloads,
        (1..=61).collect::<Vec<_>>(),
        "each event written by the decision that saw its predecessor"
    );
}

on_both_backends!(
    optimistic_attempts_under_contention_all_land_in_order,
    optimistic_attempts_under_contention_all_land_in_order
);

/// Runs a locked attempt of its own while an optimistic one is between its read and its write
/// (inside the decision), then lets the optimistic one write `events` events.
async fn interleaved_write(store: &Store, events: i64) -> Result<i64, StoreError> {
    let other = store.clone();
    store
        .execute_optimistic(Fenced::new("s1", None), move |snapshot| {
            let handle = tokio::runtime::Handle::current();
            std::thread::spawn(move || handle.block_on(count_once(&other, "s1", None)))
                .join()
                .expect("thread")
                .expect("the locked attempt in between");
            let first = snapshot.last_sequence() + 1;
            let written = (first..first + events).map(event).collect();
            Ok::<_, Infallible>((Write::events(written), first))
        })
        .await
        .map(|decided| decided.expect("the decision never fails"))
}

async fn a_write_after_the_version_moved_conflicts_and_writes_nothing(backend: Backend) {
    assert_eq!(backend, Backend::Postgres);
    let ts = TestStore::new(backend).await;
    create_fence(&ts.store, 1).await;
    assert_eq!(count_once(&ts.store, "s1", None).await.expect("first").0, 1);
    // One event: the single-statement write. Two: the check inside a transaction.
    for (events, head) in [(1, 2), (2, 3)] {
        match interleaved_write(&ts.store, events).await {
            Err(StoreError::Conflict {
                aggregate_type,
                aggregate_id,
                sequence,
            }) => {
                assert_eq!(
                    (aggregate_type.as_str(), aggregate_id.as_str()),
                    ("test_fenced", "s1")
                );
                assert_eq!(
                    sequence, head,
                    "the sequence the stale decision would have taken"
                );
            }
            other => panic!("expected a conflict, got {other:?}"),
        }
        let loaded = ts.store.load("test_fenced", "s1").await.expect("load");
        assert_eq!(
            loaded.len() as i64,
            head,
            "only the attempt in between landed"
        );
    }
    // A later optimistic attempt sees the moved stream and writes after it, both forms.
    assert_eq!(count_optimistic(&ts.store, "s1", 1).await.expect("one"), 4);
    assert_eq!(count_optimistic(&ts.store, "s1", 2).await.expect("two"), 6);
}

on_postgres!(
    a_write_after_the_version_moved_conflicts_and_writes_nothing,
    a_write_after_the_version_moved_conflicts_and_writes_nothing
);

async fn optimistic_refusals_write_nothing(backend: Backend) {
    let ts = TestStore::new(backend).await;
    create_fence(&ts.store, 7).await;
    assert_eq!(
        count_optimistic(&ts.store, "s1", 1).await.expect("first"),
        1
    );
    let refused = ts
        .store
        .execute_optimistic(Fenced::new("s1", Some(6)), |_| {
            Ok::<_, Infallible>((Write::events(vec![event(2)]), ()))
        })
        .await;
    assert!(
        matches!(&refused, Err(StoreError::GuardRefused { reason, .. }) if reason == "token 6 is not current"),
        "{refused:?}"
    );
    let failed = ts
        .store
        .execute_optimistic(Fenced::new("s1", None), |_| Err::<(Write<()>, ()), _>("no"))
        .await
        .expect("the store call succeeds");
    assert_eq!(failed, Err("no"));
    let loaded = ts.store.load("test_fenced", "s1").await.expect("load");
    assert_eq!(
        loaded.len(),
        1,
        "neither the refused nor the failed decision wrote"
    );
}

on_both_backends!(
    optimistic_refusals_write_nothing,
    optimistic_refusals_write_nothing
);

/// One attempt in `form` that appends one event after the sequence `after` (the caller's state)
/// and reports what it observed; `None` is a conflict.
async fn count_in(
    store: &Store,
    after: i64,
    token: Option<i64>,
    form: AttemptForm<i64>,
) -> Option<(Attempted<Result<(i64, i64), Infallible>>, AttemptForm<i64>)> {
    let mut form = form;
    let target = Fenced {
        after_sequence: after,
        ..Fenced::new("s1", token)
    };
    let attempted = store
        .attempt_in(
            target,
            |snapshot| {
                let next = snapshot.last_sequence() + 1;
                Ok((Write::events(vec![event(next)]), (next, snapshot.observed)))
            },
            &mut form,
        )
        .await
        .expect("the store call succeeds");
    attempted.map(|attempted| (attempted, form))
}

fn assumed(version: i64, observed: i64) -> AttemptForm<i64> {
    AttemptForm::Speculative(Assumed {
        version,
        observed,
        not_before: chrono::DateTime::<chrono::Utc>::MIN_UTC,
    })
}

async fn events_of(store: &Store) -> usize {
    store.load("test_fenced", "s1").await.expect("load").len()
}

/// ADR 0052 on Postgres: a speculative attempt decides on the version, stream head and
/// observation it is told to assume, and its one statement lands only when all of them still
/// hold and its time is not ahead of the store's clock; otherwise it is a conflict that wrote
/// nothing, and the form to run next is the optimistic one.
async fn a_speculative_write_lands_only_on_what_it_assumed(backend: Backend) {
    assert_eq!(backend, Backend::Postgres);
    let ts = TestStore::new(backend).await;
    let store = &ts.store;
    create_fence(store, 1).await;
    // The first attempt creates the lock row; its answer also tells the store's time.
    let (first, _) = count_in(store, 0, None, AttemptForm::Optimistic)
        .await
        .expect("a first attempt has nothing to conflict with");
    assert_eq!(first.outcome, Ok((1, 1)));
    let version = first.version.expect("Postgres reports the version");

    // Each input wrong in turn: a conflict, nothing written, optimistic next.
    let wrong = [
        ("version", 1, assumed(version + 1, 1)),
        ("stream head", 5, assumed(version, 1)),
        ("observed", 1, assumed(version, 2)),
    ];
    for (what, after, form) in wrong {
        match count_in(store, after, None, form).await {
            None => {}
            Some((attempted, _)) => panic!("a wrong {what} landed: {:?}", attempted.outcome),
        }
        assert_eq!(events_of(store).await, 1, "a wrong {what} wrote nothing");
    }
    let ahead = AttemptForm::Speculative(Assumed {
        version,
        observed: 1,
        not_before: chrono::Utc::now() + chrono::TimeDelta::hours(1),
    });
    assert!(
        count_in(store, 1, None, ahead).await.is_none(),
        "a decision time ahead of the store's clock conflicts"
    );
    assert_eq!(events_of(store).await, 1);

    // Everything as assumed: one event, the version one up.
    let (landed, _) = count_in(store, 1, None, assumed(version, 1))
        .await
        .expect("the assumed inputs hold");
    assert_eq!(landed.outcome, Ok((2, 1)));
    assert_eq!(landed.version, Some(version + 1));
    assert_eq!(events_of(store).await, 2);

    // Another fence row moves the observation without touching the version or the stream.
    create_fence_row(store, 2).await;
    assert!(count_in(store, 2, None, assumed(version + 1, 1))
        .await
        .is_none());
    let (read, _) = count_in(store, 2, None, AttemptForm::Optimistic)
        .await
        .expect("the optimistic form reads what moved");
    assert_eq!(read.outcome, Ok((3, 2)));
    assert_eq!(events_of(store).await, 3);
}

on_postgres!(
    a_speculative_write_lands_only_on_what_it_assumed,
    a_speculative_write_lands_only_on_what_it_assumed
);

/// A guarded aggregate never runs speculatively (a guard refuses, it does not conflict), and
/// SQLite runs every form locked: in both, a wrong assumption changes nothing.
async fn a_speculative_form_that_cannot_speculate_reads_first(backend: Backend) {
    let ts = TestStore::new(backend).await;
    let store = &ts.store;
    create_fence(store, 7).await;
    let (first, _) = count_in(store, 0, Some(7), AttemptForm::Optimistic)
        .await
        .expect("first");
    assert_eq!(first.outcome, Ok((1, 1)));
    let (guarded, _) = count_in(store, 1, Some(7), assumed(-1, 99))
        .await
        .expect("a guarded speculative attempt reads instead");
    assert_eq!(guarded.outcome, Ok((2, 1)));
    let mut form = assumed(-1, 99);
    let refused = store
        .attempt_in(
            Fenced {
                after_sequence: 2,
                ..Fenced::new("s1", Some(6))
            },
            |_| Ok::<_, Infallible>((Write::events(vec![event(3)]), ())),
            &mut form,
        )
        .await;
    assert!(
        matches!(&refused, Err(StoreError::GuardRefused { .. })),
        "the guard still refuses: {refused:?}"
    );
    if backend == Backend::Sqlite {
        let (plain, _) = count_in(store, 2, None, assumed(-1, 99))
            .await
            .expect("SQLite runs it locked");
        assert_eq!(plain.outcome, Ok((3, 1)));
        assert_eq!(plain.version, None, "SQLite reports no version");
    }
}

on_both_backends!(
    a_speculative_form_that_cannot_speculate_reads_first,
    a_speculative_form_that_cannot_speculate_reads_first
);

async fn create_fence_row(store: &Store, token: i64) {
    let Store::Postgres(s) = store else {
        unreachable!("Postgres only")
    };
    sqlx::query("INSERT INTO fence VALUES ($1)")
        .bind(token)
        .execute(s.pool())
        .await
        .expect("fence row");
}
