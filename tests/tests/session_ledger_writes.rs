//! The managed-session ledger's write path on both backends (ADR 0031): a ledger handle keeps
//! each session's folded state and reads only the events appended since, so it must still see
//! what another handle (another process, another owner) appended, and must notice a ledger that
//! moved backwards (a restore) and read it again; and the projection rows a Remember writes
//! (an update of the rows already there, an insert of the others) are the ones a rebuild
//! replays. Two handles writing at once lose nothing (the optimistic form's conflict path).

use std::sync::Arc;
use wharf_tests::WharfSessions;

use wharf::domain::session::{
    ExactFilter, ManagedSession, ManagedSessionError, Qos, SubscribeOutcome,
    MANAGED_SESSION_AGGREGATE,
};
use wharf::projections::ManagedFilterView;
use wharf::store::{RebuildMode, Store};
use wharf_sessions::SessionError;
use wharf_tests::{on_both_backends, Backend, TestStore};

fn filter(f: &str) -> ExactFilter {
    ExactFilter::parse(f).expect("a valid filter")
}

fn session() -> String {
    format!("ms-{:032x}", rand::random::<u128>())
}

fn granted(qos: Qos) -> SubscribeOutcome {
    SubscribeOutcome::Granted { qos }
}

/// The session's state folded from its whole stream, read straight from the store.
async fn folded(store: &Store, id: &str) -> ManagedSession {
    let events = store
        .load(MANAGED_SESSION_AGGREGATE, id)
        .await
        .expect("the stream");
    let decoded: Vec<_> = events
        .iter()
        .map(|e| {
            wharf::domain::session::ManagedFilterEvent::decode(&e.event_type, e.payload.get())
                .expect("a session event")
        })
        .collect();
    ManagedSession::fold(&decoded)
}

fn not_in_history(result: Result<impl std::fmt::Debug, SessionError>, f: &str) {
    match result {
        Err(SessionError::Session(ManagedSessionError::NotInHistory { filter })) => {
            assert_eq!(filter.as_str(), f);
        }
        other => panic!("expected NotInHistory for {f}, got {other:?}"),
    }
}

async fn a_handle_folds_what_another_handle_appended(backend: Backend) {
    let test = TestStore::new(backend).await;
    let wharf = test.wharf();
    // Two handles with their own state caches: two processes on one store.
    let (a, b) = (wharf.session_ledger(), wharf.session_ledger());
    let id = session();
    a.seed(&id, vec![filter("old/#")], "test")
        .await
        .expect("seed");
    a.remember(&id, vec![(filter("a/#"), Qos::AtLeastOnce)])
        .await
        .expect("remember a");

    // Behind a's back: b forgets the seeded filter and remembers another.
    b.forget(&id, vec![(filter("old/#"), 0x00)])
        .await
        .expect("forget");
    b.remember(&id, vec![(filter("b/#"), Qos::AtMostOnce)])
        .await
        .expect("remember b");

    // a decides on the whole ledger: b's filter is in the history, the forgotten one is not.
    a.record_suback(
        &id,
        vec![
            (filter("a/#"), Qos::AtLeastOnce, granted(Qos::AtLeastOnce)),
            (filter("b/#"), Qos::AtMostOnce, granted(Qos::AtMostOnce)),
        ],
    )
    .await
    .expect("both filters are in the history");
    not_in_history(
        a.record_suback(
            &id,
            vec![(filter("old/#"), Qos::AtLeastOnce, granted(Qos::AtLeastOnce))],
        )
        .await,
        "old/#",
    );
    // A Remember that changes nothing appends nothing, on either handle.
    let unchanged = vec![(filter("b/#"), Qos::AtMostOnce)];
    assert!(a
        .remember(&id, unchanged.clone())
        .await
        .expect("a")
        .is_empty());
    assert!(b.remember(&id, unchanged).await.expect("b").is_empty());

    let whole = folded(&test.store, &id).await;
    assert_eq!(a.load(&id).await.expect("a loads"), whole);
    assert_eq!(b.load(&id).await.expect("b loads"), whole);
    assert_eq!(
        whole.history_filters(),
        vec![filter("a/#"), filter("b/#")],
        "the history after both handles' writes"
    );
}

on_both_backends!(another_handle, a_handle_folds_what_another_handle_appended);

/// Two handles (two processes) writing one session at once: on Postgres each write goes
/// optimistic first, and one that lost the race to the other's commit runs again locked; no
/// write is lost and the stream stays gapless, whatever the interleaving.
async fn concurrent_handles_lose_no_write(backend: Backend) {
    const EACH: usize = 25;
    let test = TestStore::new(backend).await;
    let wharf = test.wharf();
    let id = session();
    wharf
        .session_ledger()
        .seed(&id, Vec::new(), "test")
        .await
        .expect("seed");
    let writers = ["a", "b"].map(|name| {
        let ledger = wharf.session_ledger();
        let id = id.clone();
        tokio::spawn(async move {
            for i in 0..EACH {
                let remembered = vec![(filter(&format!("{name}/{i}/#")), Qos::AtLeastOnce)];
                ledger.remember(&id, remembered).await.expect("remember");
            }
        })
    });
    for writer in writers {
        writer.await.expect("a writer");
    }
    let events = test
        .store
        .load(MANAGED_SESSION_AGGREGATE, &id)
        .await
        .expect("the stream");
    let sequences: Vec<i64> = events.iter().map(|e| e.sequence).collect();
    let expected: Vec<i64> = (1..=(1 + 2 * EACH as i64)).collect();
    assert_eq!(sequences, expected, "one event per write, no gap");
    let whole = folded(&test.store, &id).await;
    assert_eq!(whole.history_filters().len(), 2 * EACH);
    assert_eq!(wharf.session_ledger().load(&id).await.expect("load"), whole);
}

on_both_backends!(concurrent_handles, concurrent_handles_lose_no_write);

/// Deletes the session's events after `keep` (a restore of an older backup of the ledger).
async fn cut_stream(test: &TestStore, id: &str, keep: i64) {
    match &test.store {
        Store::Postgres(pg) => {
            sqlx::query(
                "DELETE FROM events WHERE aggregate_type = $1 AND aggregate_id = $2 \
                 AND sequence > $3",
            )
            .bind(MANAGED_SESSION_AGGREGATE)
            .bind(id)
            .bind(keep)
            .execute(pg.pool())
            .await
            .expect("delete on Postgres");
        }
        Store::Sqlite(sqlite) => {
            let conn = rusqlite::Connection::open(sqlite.path()).expect("open the SQLite file");
            conn.busy_timeout(std::time::Duration::from_secs(5))
                .expect("busy timeout");
            conn.execute(
                "DELETE FROM events WHERE aggregate_type = ?1 AND aggregate_id = ?2 \
                 AND sequence > ?3",
                rusqlite::params![MANAGED_SESSION_AGGREGATE, id, keep],
            )
            .expect("delete on SQLite");
        }
    }
}

async fn a_ledger_that_moved_backwards_is_read_again(backend: Backend) {
    let test = TestStore::new(backend).await;
    let ledger = test.wharf().session_ledger();
    let id = session();
    ledger.seed(&id, vec![], "test").await.expect("seed");
    ledger
        .remember(&id, vec![(filter("a/#"), Qos::AtLeastOnce)])
        .await
        .expect("remember a");
    ledger
        .remember(&id, vec![(filter("b/#"), Qos::AtLeastOnce)])
        .await
        .expect("remember b");

    // The ledger goes back to its seed: the cached state (at sequence 3) is ahead of it.
    cut_stream(&test, &id, 1).await;

    // The handle must decide on the ledger as it is now, where neither filter was remembered.
    not_in_history(
        ledger
            .record_suback(
                &id,
                vec![(filter("a/#"), Qos::AtLeastOnce, granted(Qos::AtLeastOnce))],
            )
            .await,
        "a/#",
    );
    let again = ledger
        .remember(&id, vec![(filter("a/#"), Qos::AtLeastOnce)])
        .await
        .expect("remember a again");
    assert_eq!(again.len(), 1, "a is remembered again: {again:?}");
    assert_eq!(
        ledger.load(&id).await.expect("load").history_filters(),
        vec![filter("a/#")]
    );
}

on_both_backends!(moved_backwards, a_ledger_that_moved_backwards_is_read_again);

fn row<'a>(rows: &'a [ManagedFilterView], f: &str) -> &'a ManagedFilterView {
    rows.iter()
        .find(|r| r.filter == f)
        .unwrap_or_else(|| panic!("no row for {f}: {rows:?}"))
}

async fn remember_rows_are_what_a_rebuild_replays(backend: Backend) {
    let test = TestStore::new(backend).await;
    let wharf = test.wharf();
    let ledger = wharf.session_ledger();
    let id = session();
    ledger
        .seed(&id, vec![filter("seeded/#"), filter("kept/#")], "test")
        .await
        .expect("seed");
    // One Remember over a seeded row (updated) and a new filter (inserted).
    ledger
        .remember(
            &id,
            vec![
                (filter("seeded/#"), Qos::AtLeastOnce),
                (filter("new/#"), Qos::AtMostOnce),
            ],
        )
        .await
        .expect("remember");
    ledger
        .record_suback(
            &id,
            vec![
                (
                    filter("seeded/#"),
                    Qos::AtLeastOnce,
                    granted(Qos::AtLeastOnce),
                ),
                (
                    filter("new/#"),
                    Qos::AtMostOnce,
                    SubscribeOutcome::Refused { reason_code: 0x87 },
                ),
            ],
        )
        .await
        .expect("record");
    let acknowledged = wharf
        .read_model()
        .managed_sessions(Some(&id))
        .await
        .expect("rows");
    let refused = row(&acknowledged[0].filters, "new/#");
    assert_eq!(
        (
            refused.state.as_str(),
            refused.requested_qos,
            refused.granted_qos,
            refused.reason_code
        ),
        ("refused", Some(0), None, Some(0x87)),
        "a refusal keeps its reason code and no granted QoS"
    );
    let granted_row = row(&acknowledged[0].filters, "seeded/#");
    assert_eq!(
        (granted_row.granted_qos, granted_row.reason_code),
        (Some(1), None)
    );
    // Remembered again at another QoS: the acknowledged row goes back to remembered.
    ledger
        .remember(&id, vec![(filter("new/#"), Qos::AtLeastOnce)])
        .await
        .expect("remember again");

    let read = wharf.read_model();
    let sessions = read.managed_sessions(Some(&id)).await.expect("rows");
    let rows = &sessions[0].filters;
    assert_eq!(rows.len(), 3, "{rows:?}");
    let kept = row(rows, "kept/#");
    assert_eq!(
        (kept.state.as_str(), kept.requested_qos, kept.granted_qos),
        ("seeded", None, None)
    );
    let seeded = row(rows, "seeded/#");
    assert_eq!(
        (
            seeded.state.as_str(),
            seeded.requested_qos,
            seeded.granted_qos
        ),
        ("granted", Some(1), Some(1))
    );
    assert_eq!(
        seeded.since_position, kept.since_position,
        "still since the seed"
    );
    let new = row(rows, "new/#");
    assert_eq!(
        (
            new.state.as_str(),
            new.requested_qos,
            new.granted_qos,
            new.reason_code
        ),
        ("remembered", Some(1), None, None),
        "the refusal is cleared by the new Remember"
    );
    assert!(new.since_position < new.updated_position, "{new:?}");
    assert_eq!(new.updated_position, sessions[0].last_position);

    let progress: wharf::store::Progress = Arc::new(|_, _| {});
    let verified = read
        .rebuild(RebuildMode::Verify, progress.clone())
        .await
        .expect("verify");
    assert!(verified.is_clean(), "{:?}", verified.differences);
    read.rebuild(RebuildMode::Apply, progress)
        .await
        .expect("rebuild");
    assert_eq!(
        read.managed_sessions(Some(&id)).await.expect("rows"),
        sessions,
        "a rebuild replays the same rows"
    );
}

on_both_backends!(remember_rows, remember_rows_are_what_a_rebuild_replays);
