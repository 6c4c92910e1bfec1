//! Group snapshots (ADR 0034) on a real SQLite file and a real Postgres schema. A process that
//! does not hold a group yet starts from the group's saved state and folds only the events
//! after it; every test compares the state such a cold `Wharf` ends up deciding on with a fold
//! of the group's whole stream:
//! - a cold register after a snapshot equals the full fold, and the snapshot is what it used;
//! - a snapshot taken before a prune still folds exactly (and `verify` stays clean), although a
//!   fold of only the events up to its sequence no longer matches it;
//! - a crash between the snapshot and the event: the attempt that writes both is one
//!   transaction, so an aborted one leaves neither; a snapshot whose event never committed
//!   (above the stream's head) is ignored and rewritten;
//! - a snapshot of an old format is never decoded: the fold runs from the events, and the row
//!   is rewritten in the current format;
//! - `verify` names the group of a wrong snapshot;
//! - a rebuild re-derives the snapshots.

use std::time::Duration;

use wharf::domain::{
    decode_group_state, encode_group_state, fold_group, AppVersion, Attempt, BindingSet,
    ConsumerGroup, DeclarationEvent, DeclarerId, GroupName, RegisterOutcome, TopicName,
    GROUP_STATE_FORMAT,
};
use wharf::projections::PruneOptions;
use wharf::store::{NewEvent, RebuildMode, SavedGroupState, Store};
use wharf::{Registration, Wharf};
use wharf_tests::{keep_live, on_both_backends, Backend, TestStore};

const GROUP: &str = "snap";
const EVERY: u64 = 10;

fn wharf_for(test: &TestStore, every: u64) -> Wharf {
    let mut config = test.config();
    config.declarations.snapshot_every = every;
    Wharf::with_store(test.store.clone(), &config.settings())
}

fn group() -> GroupName {
    GroupName::parse("group", GROUP).unwrap()
}

fn set(k: usize) -> &'static [&'static str] {
    match k % 3 {
        0 => &["orders/+/paid"],
        1 => &["orders/eu/#"],
        _ => &["orders/+/paid", "orders/us/#"],
    }
}

async fn register(wharf: &Wharf, declarer: &str, k: usize) -> RegisterOutcome {
    let registration = Registration::new(GROUP, "orders", &format!("{k}"), set(k)).unwrap();
    wharf
        .as_declarer(DeclarerId::parse("declarer", declarer).unwrap())
        .register(&registration)
        .await
        .unwrap()
}

/// Makes `declarer` a live instance declaring set `k` for a day, by the store's clock.
async fn live(store: &Store, declarer: &str, k: usize) {
    keep_live(store, GROUP, declarer, set(k)).await;
}

/// The group's stream folded from its first event, and its newest sequence.
async fn full_fold(store: &Store) -> (i64, ConsumerGroup) {
    let events = store.load("consumer_group", GROUP).await.unwrap();
    let mut state = ConsumerGroup::default();
    let head = events.last().map_or(0, |e| e.sequence);
    fold_group(
        &mut state,
        events
            .iter()
            .map(|e| e.decode::<DeclarationEvent>().unwrap()),
    );
    (head, state)
}

/// The events up to `sequence` only, folded.
async fn fold_through(store: &Store, sequence: i64) -> ConsumerGroup {
    let events = store.load("consumer_group", GROUP).await.unwrap();
    let mut state = ConsumerGroup::default();
    fold_group(
        &mut state,
        events
            .iter()
            .filter(|e| e.sequence <= sequence)
            .map(|e| e.decode::<DeclarationEvent>().unwrap()),
    );
    state
}

async fn saved(store: &Store) -> SavedGroupState {
    store
        .saved_group_state(GROUP)
        .await
        .unwrap()
        .expect("the group has a saved state")
}

/// Checks that the saved state is the fold of the whole stream, at its newest sequence, and
/// returns it.
async fn saved_is_full_fold(store: &Store) -> SavedGroupState {
    let found = saved(store).await;
    let (head, truth) = full_fold(store).await;
    assert_eq!(found.sequence, head);
    assert_eq!(
        decode_group_state(found.format, &found.state).unwrap(),
        truth
    );
    found
}

/// A register on a `Wharf` that holds nothing yet, then what it holds, checked against a fold
/// of the whole stream (the register may itself have appended an event).
async fn cold_register_matches_full_fold(test: &TestStore, declarer: &str, k: usize) {
    let cold = wharf_for(test, EVERY);
    assert!(cold.held_group_state(&group()).await.is_none());
    register(&cold, declarer, k).await;
    let held = cold
        .held_group_state(&group())
        .await
        .expect("held after an attempt");
    assert_eq!(
        held,
        full_fold(&test.store).await,
        "cold state != full fold"
    );
}

/// A mixed ledger: installs while nobody is live, and rounds of waits (each declarer retrying,
/// so earlier waits are superseded) behind a live incumbent. Returns the stream's head.
async fn workload(test: &TestStore, wharf: &Wharf, rounds: usize) -> i64 {
    for round in 0..rounds {
        let incumbent = format!("incumbent-{round}");
        let installed = register(wharf, &incumbent, round).await;
        assert!(
            matches!(installed, RegisterOutcome::Installed { .. }),
            "{installed:?}"
        );
        live(&test.store, &incumbent, round).await;
        for retry in 0..3 {
            for waiter in 0..3 {
                let outcome = register(wharf, &format!("waiter-{waiter}"), round + 1).await;
                assert!(
                    matches!(outcome, RegisterOutcome::Waiting { .. }),
                    "retry {retry} of waiter {waiter}: {outcome:?}"
                );
            }
        }
        test.store.leave(GROUP, &incumbent).await.unwrap();
    }
    full_fold(&test.store).await.0
}

async fn cold_register_after_a_snapshot(backend: Backend) {
    let test = TestStore::new(backend).await;
    let writer = wharf_for(&test, EVERY);
    let head = workload(&test, &writer, 4).await;
    let snapshot = saved(&test.store).await;
    assert_eq!(snapshot.format, GROUP_STATE_FORMAT);
    assert!(
        snapshot.sequence >= head - EVERY as i64 && snapshot.sequence <= head,
        "a snapshot at most {EVERY} events behind the head {head}: {snapshot:?}"
    );
    assert_eq!(
        decode_group_state(snapshot.format, &snapshot.state).unwrap(),
        fold_through(&test.store, snapshot.sequence).await,
        "an unpruned snapshot is the fold of the events up to its sequence"
    );
    cold_register_matches_full_fold(&test, "waiter-0", 0).await;

    // The cold load really starts from the snapshot: doctor it (the decision does not read
    // the install count) and a cold Wharf carries the doctored count.
    let mut doctored = decode_group_state(snapshot.format, &snapshot.state).unwrap();
    doctored.installs += 1000;
    let truth = full_fold(&test.store).await.1.installs;
    test.store
        .save_group_state(SavedGroupState {
            state: encode_group_state(&doctored),
            ..saved(&test.store).await
        })
        .await
        .unwrap();
    let cold = wharf_for(&test, 0);
    register(&cold, "waiter-0", 0).await;
    let (_, held) = cold.held_group_state(&group()).await.unwrap();
    assert_eq!(held.installs, truth + 1000);
}
on_both_backends!(
    a_cold_register_after_a_snapshot_equals_a_full_fold,
    cold_register_after_a_snapshot
);

async fn snapshot_before_prune(backend: Backend) {
    let test = TestStore::new(backend).await;
    let writer = wharf_for(&test, EVERY);
    workload(&test, &writer, 3).await;
    let before = saved(&test.store).await;
    // More retries of the same waiters: their waits at or below the snapshot's sequence are
    // now superseded by events above it.
    let incumbent = "incumbent-late";
    register(&writer, incumbent, 0).await;
    live(&test.store, incumbent, 0).await;
    for waiter in 0..3 {
        let outcome = register(&writer, &format!("waiter-{waiter}"), 1).await;
        assert!(matches!(outcome, RegisterOutcome::Waiting { .. }));
    }
    // Pin the snapshot taken before those retries (the writer may have taken a newer one).
    test.store.save_group_state(before.clone()).await.unwrap();
    let pruned = writer
        .read_model()
        .prune(PruneOptions {
            retention: Duration::ZERO,
            dry_run: false,
            batch: 1000,
        })
        .await
        .unwrap();
    assert!(pruned.deleted > 0, "{pruned:?}");
    // The state holds no waits (ADR 0049), and a prune deletes waits only: the pruned ledger
    // still folds to the snapshot at its sequence. The open waits, kept inline, are what a
    // replay of the pruned ledger gives.
    let snapshot_state = decode_group_state(before.format, &before.state).unwrap();
    assert_eq!(
        fold_through(&test.store, before.sequence).await,
        snapshot_state,
    );
    let replayed = writer
        .read_model()
        .rebuild(RebuildMode::Verify, std::sync::Arc::new(|_, _| {}))
        .await
        .unwrap();
    assert!(replayed.is_clean(), "{replayed:?}");
    let report = writer.read_model().verify_snapshots().await.unwrap();
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.checked, 1);
    cold_register_matches_full_fold(&test, "waiter-1", 1).await;
}
on_both_backends!(
    a_snapshot_taken_before_a_prune_still_folds_exactly,
    snapshot_before_prune
);

/// Makes every write of a saved group state fail: the transaction that appended an event and
/// then saves the state dies between the two.
async fn break_snapshots(store: &Store, broken: bool) {
    let statements: &[&str] = match (store, broken) {
        (Store::Sqlite(_), true) => &[
            "CREATE TRIGGER crash_insert BEFORE INSERT ON group_snapshot \
             BEGIN SELECT RAISE(ABORT, 'crash between event and snapshot'); END",
            "CREATE TRIGGER crash_update BEFORE UPDATE ON group_snapshot \
             BEGIN SELECT RAISE(ABORT, 'crash between event and snapshot'); END",
        ],
        (Store::Sqlite(_), false) => &["DROP TRIGGER crash_insert", "DROP TRIGGER crash_update"],
        (Store::Postgres(_), true) => &[
            "CREATE FUNCTION crash_snapshot() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'crash between event and snapshot'; END $$",
            "CREATE TRIGGER crash_snapshot BEFORE INSERT OR UPDATE ON group_snapshot \
             FOR EACH ROW EXECUTE FUNCTION crash_snapshot()",
        ],
        (Store::Postgres(_), false) => &["DROP TRIGGER crash_snapshot ON group_snapshot"],
    };
    for sql in statements {
        match store {
            Store::Sqlite(s) => {
                let sql = (*sql).to_owned();
                s.write(move |ctx| {
                    ctx.tx.execute_batch(&sql)?;
                    Ok(())
                })
                .await
                .unwrap();
            }
            Store::Postgres(s) => {
                sqlx::query(sql).execute(s.pool()).await.unwrap();
            }
        }
    }
}

async fn crash_between_snapshot_and_event(backend: Backend) {
    let test = TestStore::new(backend).await;
    let writer = wharf_for(&test, EVERY);
    workload(&test, &writer, 2).await;
    let (head, _) = full_fold(&test.store).await;
    let before = saved(&test.store).await;

    // An attempt that appends an install and is due to save the state (every event), whose
    // transaction dies at the save: neither is left behind.
    break_snapshots(&test.store, true).await;
    let crashing = wharf_for(&test, 1);
    let registration = Registration::new(GROUP, "orders", "9", set(0)).unwrap();
    let crashed = crashing
        .as_declarer(DeclarerId::parse("declarer", "crasher").unwrap())
        .register(&registration)
        .await;
    assert!(crashed.is_err(), "{crashed:?}");
    assert_eq!(full_fold(&test.store).await.0, head, "no event committed");
    assert_eq!(saved(&test.store).await, before, "no snapshot committed");
    break_snapshots(&test.store, false).await;
    // The process that crashed holds nothing of that attempt: its next one starts cold.
    assert!(crashing.held_group_state(&group()).await.is_none());

    // A snapshot whose event never committed (as a writer that saved first would leave it,
    // or a restore of the events to an older point): above the stream's head.
    let (_, truth) = full_fold(&test.store).await;
    let mut ahead = truth.clone();
    ahead.installs += 1;
    test.store
        .save_group_state(SavedGroupState {
            group: GROUP.to_owned(),
            sequence: head + 1,
            format: GROUP_STATE_FORMAT,
            state: encode_group_state(&ahead),
            stream_rewritten: false,
        })
        .await
        .unwrap();
    let report = writer.read_model().verify_snapshots().await.unwrap();
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.ignored.len(), 1, "{report:?}");
    cold_register_matches_full_fold(&test, "waiter-0", 0).await;
    saved_is_full_fold(&test.store).await;
}
on_both_backends!(
    a_crash_between_snapshot_and_event_leaves_a_true_fold,
    crash_between_snapshot_and_event
);

async fn old_format(backend: Backend) {
    let test = TestStore::new(backend).await;
    let writer = wharf_for(&test, EVERY);
    workload(&test, &writer, 2).await;
    let current = saved(&test.store).await;
    // A row in a format this build does not read, whose text would decode into a wrong state
    // if it were read as the current format.
    let mut wrong = decode_group_state(current.format, &current.state).unwrap();
    wrong.effective = None;
    wrong.installs = 0;
    test.store
        .save_group_state(SavedGroupState {
            format: 0,
            state: encode_group_state(&wrong),
            ..current.clone()
        })
        .await
        .unwrap();
    let report = writer.read_model().verify_snapshots().await.unwrap();
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.ignored.len(), 1, "{report:?}");
    assert!(report.ignored[0].problem.contains("format 0"), "{report:?}");
    cold_register_matches_full_fold(&test, "waiter-2", 2).await;
    let rewritten = saved_is_full_fold(&test.store).await;
    assert_eq!(rewritten.format, GROUP_STATE_FORMAT);
}
on_both_backends!(
    a_snapshot_of_an_old_format_is_ignored_and_rewritten,
    old_format
);

/// Format 1 (before ADR 0049) carried every waiter's newest attempt beside the effective
/// declaration: it is read with that map skipped, and rewritten in the current format.
async fn format_1(backend: Backend) {
    let test = TestStore::new(backend).await;
    let writer = wharf_for(&test, EVERY);
    workload(&test, &writer, 2).await;
    let current = saved(&test.store).await;
    let mut text: serde_json::Value = serde_json::from_str(&current.state).unwrap();
    text["waiting"] = serde_json::json!({
        "waiter-0": {"attempt": {"declarer": "waiter-0"}, "incumbent": ["orders/#"]}
    });
    test.store
        .save_group_state(SavedGroupState {
            format: 1,
            state: text.to_string(),
            ..current.clone()
        })
        .await
        .unwrap();
    let report = writer.read_model().verify_snapshots().await.unwrap();
    assert!(report.is_clean(), "{report:?}");
    assert!(report.ignored.is_empty(), "format 1 is read: {report:?}");
    cold_register_matches_full_fold(&test, "waiter-2", 2).await;
    let rewritten = saved_is_full_fold(&test.store).await;
    assert_eq!(rewritten.format, GROUP_STATE_FORMAT);
    assert!(!rewritten.state.contains("waiting"), "{}", rewritten.state);
}
on_both_backends!(
    a_snapshot_of_format_1_is_read_without_its_waiters_and_rewritten,
    format_1
);

/// The group's events after sequence `keep` are replaced by installs of other declarers, up
/// past the saved state's sequence: what restoring `events` alone from an older backup and
/// then declaring again leaves. The events at the saved sequence now have other positions.
async fn rewrite_stream_after(store: &Store, keep: i64, through: i64) {
    let sql = format!(
        "DELETE FROM events WHERE aggregate_type = 'consumer_group' AND aggregate_id = '{GROUP}' \
         AND sequence > {keep}"
    );
    match store {
        Store::Sqlite(s) => s
            .write(move |ctx| {
                ctx.tx.execute_batch(&sql)?;
                Ok(())
            })
            .await
            .unwrap(),
        Store::Postgres(s) => {
            sqlx::query(&sql).execute(s.pool()).await.unwrap();
        }
    }
    let now = store.now().await.unwrap();
    let events = (keep + 1..=through)
        .map(|sequence| {
            let k = sequence as usize;
            let attempt = Attempt {
                group: group(),
                topic: TopicName::parse("topic", "orders").unwrap(),
                declarer: DeclarerId::parse("declarer", &format!("restorer-{sequence}")).unwrap(),
                version: AppVersion::parse("version", "9").unwrap(),
                patterns: BindingSet::parse(set(k)).unwrap(),
                declared_at: now,
                attempt_at: now,
            };
            let installed = DeclarationEvent::Installed {
                attempt,
                previous: Some(BindingSet::parse(set(k + 1)).unwrap()),
            };
            NewEvent::from_domain(&installed, serde_json::json!({})).unwrap()
        })
        .collect();
    store
        .append("consumer_group", GROUP, keep, events)
        .await
        .unwrap();
}

async fn rewritten_stream(backend: Backend) {
    let test = TestStore::new(backend).await;
    let writer = wharf_for(&test, EVERY);
    workload(&test, &writer, 2).await;
    let before = saved(&test.store).await;
    assert!(!before.stream_rewritten);
    let (head, _) = full_fold(&test.store).await;
    rewrite_stream_after(&test.store, before.sequence - 3, head + 2).await;
    // The test means something: the saved state is not the new stream's fold at its sequence.
    let old_state = decode_group_state(before.format, &before.state).unwrap();
    assert_ne!(fold_through(&test.store, before.sequence).await, old_state);

    let found = saved(&test.store).await;
    assert!(found.stream_rewritten, "{found:?}");
    let report = writer.read_model().verify_snapshots().await.unwrap();
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.ignored.len(), 1, "{report:?}");
    assert!(
        report.ignored[0]
            .problem
            .contains("another event holds its sequence"),
        "{report:?}"
    );
    // A fresh process folds the whole stream, and its attempt saves a state that fits it.
    cold_register_matches_full_fold(&test, "waiter-2", 2).await;
    let rewritten = saved_is_full_fold(&test.store).await;
    assert!(!rewritten.stream_rewritten, "{rewritten:?}");
}
on_both_backends!(
    a_snapshot_of_a_rewritten_stream_is_ignored_and_rewritten,
    rewritten_stream
);

async fn wrong_snapshot(backend: Backend) {
    let test = TestStore::new(backend).await;
    let writer = wharf_for(&test, EVERY);
    workload(&test, &writer, 2).await;
    let clean = writer.read_model().verify_snapshots().await.unwrap();
    assert!(clean.is_clean() && clean.checked == 1, "{clean:?}");
    let current = saved(&test.store).await;
    let mut wrong = decode_group_state(current.format, &current.state).unwrap();
    wrong.installs += 1;
    test.store
        .save_group_state(SavedGroupState {
            state: encode_group_state(&wrong),
            ..current.clone()
        })
        .await
        .unwrap();
    let report = writer.read_model().verify_snapshots().await.unwrap();
    assert!(!report.is_clean(), "{report:?}");
    assert_eq!(report.wrong.len(), 1);
    assert_eq!(report.wrong[0].group, GROUP);
    assert_eq!(report.wrong[0].sequence, current.sequence);
    // Garbage in the current format is wrong too (a load ignores it, but it is corrupt).
    test.store
        .save_group_state(SavedGroupState {
            state: "{not json".to_owned(),
            ..current
        })
        .await
        .unwrap();
    let report = writer.read_model().verify_snapshots().await.unwrap();
    assert_eq!(report.wrong.len(), 1, "{report:?}");
    cold_register_matches_full_fold(&test, "waiter-0", 0).await;
}
on_both_backends!(verify_reports_a_wrong_snapshot, wrong_snapshot);

async fn rebuild_recreates(backend: Backend) {
    let test = TestStore::new(backend).await;
    // Saving off: only the rebuild writes snapshots.
    let writer = wharf_for(&test, 0);
    let head = workload(&test, &writer, 3).await;
    assert!(test.store.saved_group_state(GROUP).await.unwrap().is_none());
    // A second group too short to get one, and a leftover row of a group with no events.
    let short = Registration::new("short", "orders", "1", set(0)).unwrap();
    writer.register(&short).await.unwrap();
    test.store
        .save_group_state(SavedGroupState {
            group: "gone".to_owned(),
            sequence: 3,
            format: GROUP_STATE_FORMAT,
            state: encode_group_state(&ConsumerGroup::default()),
            stream_rewritten: false,
        })
        .await
        .unwrap();
    let written = writer.read_model().rederive_snapshots(EVERY).await.unwrap();
    assert_eq!(written, 1);
    let snapshot = saved(&test.store).await;
    assert_eq!(snapshot.sequence, head);
    assert_eq!(
        decode_group_state(snapshot.format, &snapshot.state).unwrap(),
        full_fold(&test.store).await.1
    );
    assert!(test
        .store
        .saved_group_state("short")
        .await
        .unwrap()
        .is_none());
    assert!(test
        .store
        .saved_group_state("gone")
        .await
        .unwrap()
        .is_none());
    let report = writer.read_model().verify_snapshots().await.unwrap();
    assert!(report.is_clean() && report.checked == 1, "{report:?}");
    cold_register_matches_full_fold(&test, "waiter-1", 1).await;
}
on_both_backends!(a_rebuild_re_derives_the_snapshots, rebuild_recreates);
