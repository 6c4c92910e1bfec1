//! ADR 0056: a speculative group attempt (ADR 0052) checks what it assumed of the group's live
//! instances and of its declarer's open wait by probes by key where it can (no live instance,
//! no open wait, an open wait compared column by column) and by the JSON of the live list
//! otherwise. Each assumption is tried against a real Postgres schema, right and wrong in turn,
//! both in the statement that writes nothing (a plain join) and in one that writes a heartbeat:
//! a wrong one must conflict, a right one must land. SQLite never speculates (one writer).

use std::convert::Infallible;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use wharf::store::{
    Assumed, AttemptForm, GroupExtra, GroupLock, GroupObserved, GroupWrite, Heartbeat,
    LiveInstanceRow, OpenWaitRow, Store,
};
use wharf_tests::{execute_sql, keep_live, on_postgres, Backend, TestStore};

const GROUP: &str = "billing";
const DECLARER: &str = "deploy-2";

fn lock() -> GroupLock {
    GroupLock {
        group: GROUP.to_owned(),
        topic: "orders".to_owned(),
        declarer: DECLARER.to_owned(),
        instance_ttl: Duration::from_secs(30),
        after_sequence: 0,
    }
}

fn patterns(list: &[&str]) -> Vec<String> {
    list.iter().map(|p| (*p).to_owned()).collect()
}

fn live(declarer: &str, list: &[&str]) -> LiveInstanceRow {
    LiveInstanceRow {
        declarer: declarer.to_owned(),
        patterns: patterns(list),
    }
}

fn observed(live: Vec<LiveInstanceRow>, open_wait: Option<OpenWaitRow>) -> GroupObserved {
    GroupObserved { live, open_wait }
}

/// What one attempt did.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// It conflicted and wrote nothing.
    Conflict,
    /// It decided on (and landed with) this observation.
    Landed(GroupObserved),
}

/// One attempt assuming `assumed` whose decision writes `heartbeat` (or nothing) and reports
/// what it observed. The heartbeat is written only by a decision on the assumed observation:
/// one that read first instead writes nothing, so a fallback leaves no row behind.
async fn attempt(
    store: &Store,
    assumed: &GroupObserved,
    version: i64,
    heartbeat: Option<&str>,
) -> Outcome {
    let form = AttemptForm::Speculative(Assumed {
        version,
        observed: assumed.clone(),
        not_before: DateTime::<Utc>::MIN_UTC,
    });
    let expected = assumed.clone();
    let extra = heartbeat.map(|declarer| {
        GroupExtra::from(Heartbeat {
            declarer: declarer.to_owned(),
            version: "1".to_owned(),
            patterns: patterns(&["orders/#"]),
        })
    });
    let mut form = form;
    let attempted = store
        .attempt_in(
            lock(),
            move |snapshot| {
                let write = GroupWrite {
                    events: Vec::new(),
                    extra: extra.filter(|_| snapshot.observed == expected),
                };
                Ok::<_, Infallible>((write, snapshot.observed.clone()))
            },
            &mut form,
        )
        .await
        .expect("the store call succeeds");
    match attempted {
        None => Outcome::Conflict,
        Some(attempted) => Outcome::Landed(attempted.outcome.expect("infallible")),
    }
}

/// The group's version as an optimistic attempt that writes nothing reads it (its answer also
/// gives the store's clock, which a speculative attempt needs to be less than 1 s old), and
/// what it observed.
async fn read(store: &Store) -> (i64, GroupObserved) {
    let mut form = AttemptForm::Optimistic;
    let attempted = store
        .attempt_in(
            lock(),
            |snapshot| Ok::<_, Infallible>((GroupWrite::default(), snapshot.observed.clone())),
            &mut form,
        )
        .await
        .expect("the store call succeeds")
        .expect("a read that writes nothing does not conflict");
    let version = attempted.version.expect("Postgres reports the version");
    (version, attempted.outcome.expect("infallible"))
}

/// A speculative attempt assuming `assumed`, just after a read refreshed the clock estimate.
/// A read-first fallback (the estimate went stale between the two calls on a loaded machine)
/// decides on what it read, never on the assumption: it is retried, a few times.
async fn speculate(store: &Store, assumed: &GroupObserved, heartbeat: Option<&str>) -> Outcome {
    for _ in 0..5 {
        let (version, actual) = read(store).await;
        match attempt(store, assumed, version, heartbeat).await {
            Outcome::Landed(seen) if seen != *assumed && seen == actual => continue,
            other => return other,
        }
    }
    panic!("five speculative attempts in a row fell back to reading first");
}

/// `assumed` must conflict, in both statement forms, and write nothing.
async fn must_conflict(store: &Store, what: &str, assumed: &GroupObserved) {
    for heartbeat in [None, Some("witness")] {
        assert_eq!(
            speculate(store, assumed, heartbeat).await,
            Outcome::Conflict,
            "a wrong {what} (heartbeat write: {heartbeat:?}) must conflict"
        );
    }
    assert!(
        !instance_exists(store, "witness").await,
        "a conflicting attempt wrote its heartbeat ({what})"
    );
}

/// `assumed` must land when it writes nothing (the heartbeat form is tried last, once).
async fn must_land(store: &Store, what: &str, assumed: &GroupObserved) {
    assert_eq!(
        speculate(store, assumed, None).await,
        Outcome::Landed(assumed.clone()),
        "the right {what} must land"
    );
}

async fn instance_exists(store: &Store, declarer: &str) -> bool {
    let Store::Postgres(s) = store else {
        unreachable!("Postgres only")
    };
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM worker_instance WHERE group_name = $1 AND declarer = $2)",
    )
    .bind(GROUP)
    .bind(declarer)
    .fetch_one(s.pool())
    .await
    .expect("instance query")
}

/// The declarer's open wait, as its row holds it.
async fn open_wait_of(store: &Store) -> OpenWaitRow {
    let (_, actual) = read(store).await;
    actual.open_wait.expect("the open wait the test wrote")
}

async fn every_assumption_is_checked(backend: Backend) {
    let test = TestStore::new(backend).await;
    let store = &test.store;
    let nobody = observed(Vec::new(), None);
    let (_, first) = read(store).await;
    assert_eq!(first, nobody, "a new group observes nothing");

    // Nothing live, no open wait: the two probes by key.
    must_land(store, "empty observation", &nobody).await;
    let worker = live("worker-7", &["orders/+/paid"]);
    must_conflict(store, "live list", &observed(vec![worker.clone()], None)).await;
    let wait = OpenWaitRow {
        patterns: patterns(&["orders/#"]),
        declared_at: Utc::now(),
    };
    must_conflict(store, "open wait", &observed(Vec::new(), Some(wait))).await;

    // An instance whose heartbeat lapsed is not live.
    execute_sql(
        store,
        "INSERT INTO worker_instance (group_name, declarer, topic, version, patterns, \
         started_at, heartbeat_at) VALUES ('billing', 'worker-1', 'orders', '1', \
         '{orders/#}', now() - interval '2 hours', now() - interval '1 hour')",
    )
    .await;
    must_land(store, "lapsed instance", &nobody).await;

    // A live instance: the empty probe sees it; the JSON compares declarer and patterns.
    keep_live(store, GROUP, "worker-7", &["orders/+/paid"]).await;
    must_conflict(store, "live list (empty)", &nobody).await;
    let other_set = live("worker-7", &["orders/#"]);
    must_conflict(store, "live patterns", &observed(vec![other_set], None)).await;
    let other_name = live("worker-8", &["orders/+/paid"]);
    must_conflict(store, "live declarer", &observed(vec![other_name], None)).await;
    let one_live = observed(vec![worker.clone()], None);
    must_land(store, "live list", &one_live).await;

    // The declarer's open wait: compared column by column.
    execute_sql(
        store,
        "INSERT INTO open_wait (group_name, declarer, patterns, declared_at) \
         VALUES ('billing', 'deploy-2', '{orders/#}', now() - interval '5 minutes')",
    )
    .await;
    must_conflict(store, "open wait (none)", &one_live).await;
    let wait = open_wait_of(store).await;
    let exact = observed(vec![worker.clone()], Some(wait.clone()));
    let microseconds = |off_by: i64| OpenWaitRow {
        declared_at: wait.declared_at + TimeDelta::microseconds(off_by),
        ..wait.clone()
    };
    let wrong_waits = [
        (
            "open wait patterns",
            OpenWaitRow {
                patterns: patterns(&["orders/+/refunded"]),
                ..wait.clone()
            },
        ),
        ("open wait time, a microsecond early", microseconds(-1)),
        ("open wait time, a microsecond late", microseconds(1)),
    ];
    for (what, wrong) in wrong_waits {
        must_conflict(store, what, &observed(vec![worker.clone()], Some(wrong))).await;
    }
    must_land(store, "open wait", &exact).await;

    // Everything as assumed, in the statement that writes: the heartbeat lands.
    assert_eq!(
        speculate(store, &exact, Some("witness")).await,
        Outcome::Landed(exact.clone())
    );
    assert!(instance_exists(store, "witness").await);
}

on_postgres!(every_assumption_is_checked, every_assumption_is_checked);
