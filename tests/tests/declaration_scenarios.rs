//! The seed's consequences, end to end on real stores: a rolling deploy converges when the old
//! fleet's heartbeats lapse; rollback is symmetric; two divergent apps on one group leave the
//! first untouched and the second waiting forever, never ready; a dead waiter shows its age;
//! `consume` re-attempts even after `register` installed.

use std::time::Duration;

use wharf::domain::{DeclarationEvent, DeclarerId, GroupName, RegisterOutcome};
use wharf::{Consumer, ConsumerState, Registration, Wharf, WharfError};
use wharf_tests::states::StateLog;
use wharf_tests::{on_both_backends, wait_until, Backend, TestStore};

const DEADLINE: Duration = Duration::from_secs(20);

fn as_declarer(wharf: &Wharf, name: &str) -> Wharf {
    wharf.as_declarer(DeclarerId::parse("declarer", name).unwrap())
}

fn registration(version: &str, patterns: &[&str]) -> Registration {
    Registration::new("billing", "orders", version, patterns).unwrap()
}

fn group() -> GroupName {
    GroupName::parse("group", "billing").unwrap()
}

async fn ready(consumer: &Consumer, what: &str) {
    let mut watch = consumer.watch();
    tokio::time::timeout(DEADLINE, watch.wait_for(ConsumerState::is_ready))
        .await
        .unwrap_or_else(|_| panic!("{what} never became ready: {:?}", consumer.state()))
        .unwrap();
}

async fn waiting(consumer: &Consumer, what: &str) {
    let mut watch = consumer.watch();
    tokio::time::timeout(
        DEADLINE,
        watch.wait_for(|s| matches!(s, ConsumerState::Waiting { .. })),
    )
    .await
    .unwrap_or_else(|_| panic!("{what} never waited: {:?}", consumer.state()))
    .unwrap();
}

async fn effective(wharf: &Wharf) -> Vec<String> {
    wharf
        .read_model()
        .effective_bindings(&group())
        .await
        .unwrap()
}

async fn ledger(wharf: &Wharf) -> Vec<DeclarationEvent> {
    wharf
        .store()
        .load("consumer_group", "billing")
        .await
        .unwrap()
        .iter()
        .map(|e| e.decode().unwrap())
        .collect()
}

async fn rolling_deploy_converges_when_old_heartbeats_lapse(backend: Backend) {
    let store = TestStore::new(backend).await;
    let wharf = store.wharf();
    let old_a = as_declarer(&wharf, "old-a").consume(registration("1.0", &["orders/+/paid"]));
    let old_b = as_declarer(&wharf, "old-b").consume(registration("1.0", &["orders/+/paid"]));
    ready(&old_a, "old-a").await;
    ready(&old_b, "old-b").await;

    let new_a = as_declarer(&wharf, "new-a").consume(registration("2.0", &["orders/#"]));
    let new_states = StateLog::record(&new_a);
    waiting(&new_a, "new-a").await;
    assert_eq!(effective(&wharf).await, vec!["orders/+/paid"]);

    // The deploy kills the old instances: one crashes (heartbeat lapses), one stops cleanly.
    drop(old_a);
    old_b.shutdown().await;
    ready(&new_a, "new-a after the old fleet is gone").await;
    assert_eq!(effective(&wharf).await, vec!["orders/#"]);

    let events = ledger(&wharf).await;
    let DeclarationEvent::Installed { attempt, previous } = events.last().unwrap() else {
        panic!("the last ledger entry must be the install: {events:?}");
    };
    assert_eq!(
        attempt.declarer.as_str(),
        "new-a/1",
        "new-a's consumer instance"
    );
    assert_eq!(previous.as_ref().unwrap().patterns(), vec!["orders/+/paid"]);
    assert!(
        attempt.declared_at < attempt.attempt_at,
        "the install records the whole wait span on its own"
    );
    assert!(
        events.iter().any(|e| !e.is_installed()),
        "the wait was recorded"
    );
    let states = new_states.until_ready().await;
    let first_ready = states.iter().position(ConsumerState::is_ready).unwrap();
    assert!(
        states[..first_ready]
            .iter()
            .any(|s| matches!(s, ConsumerState::Waiting { .. })),
        "new-a waited before it became ready: {states:?}"
    );
    new_a.shutdown().await;
}
on_both_backends!(
    rolling_deploy,
    rolling_deploy_converges_when_old_heartbeats_lapse
);

async fn rollback_is_symmetric(backend: Backend) {
    let store = TestStore::new(backend).await;
    let wharf = store.wharf();
    let v2 = as_declarer(&wharf, "v2").consume(registration("2.0", &["orders/#"]));
    ready(&v2, "v2").await;
    let v1 = as_declarer(&wharf, "v1-again").consume(registration("1.0", &["orders/+/paid"]));
    waiting(&v1, "rolled-back v1").await;
    assert_eq!(effective(&wharf).await, vec!["orders/#"]);
    drop(v2);
    ready(&v1, "rolled-back v1").await;
    assert_eq!(effective(&wharf).await, vec!["orders/+/paid"]);
    v1.shutdown().await;
}
on_both_backends!(rollback, rollback_is_symmetric);

async fn divergent_apps_first_wins_second_waits_forever(backend: Backend) {
    let store = TestStore::new(backend).await;
    // app-x must stay live while app-y retries: a lapse under load would let app-y install.
    let wharf = store.steady_wharf();
    let first = as_declarer(&wharf, "app-x").consume(registration("x", &["orders/eu/#"]));
    ready(&first, "app-x").await;
    let second = as_declarer(&wharf, "app-y").consume(registration("y", &["orders/us/#"]));
    let states = StateLog::record(&second);
    // Many retries later the second app still waits, and the first is untouched.
    let mut watch = second.watch();
    tokio::time::timeout(
        DEADLINE,
        watch.wait_for(|s| matches!(s, ConsumerState::Waiting { attempts, .. } if *attempts >= 8)),
    )
    .await
    .expect("app-y keeps retrying")
    .unwrap();
    assert!(first.is_ready());
    assert!(!second.is_ready());
    assert!(
        !states.so_far().iter().any(ConsumerState::is_ready),
        "app-y must never report ready"
    );
    assert_eq!(effective(&wharf).await, vec!["orders/eu/#"]);
    let installs = ledger(&wharf)
        .await
        .iter()
        .filter(|e| e.is_installed())
        .count();
    assert_eq!(installs, 1, "nothing but app-x's first install");
    let ConsumerState::Waiting {
        incumbent,
        live_declarers,
        ..
    } = second.state()
    else {
        panic!("app-y should be waiting: {:?}", second.state());
    };
    assert_eq!(incumbent.patterns(), vec!["orders/eu/#"]);
    assert_eq!(live_declarers[0].as_str(), "app-x/1");
    first.shutdown().await;
    second.shutdown().await;
}
on_both_backends!(
    divergent_apps,
    divergent_apps_first_wins_second_waits_forever
);

async fn a_dead_waiter_shows_its_age(backend: Backend) {
    let store = TestStore::new(backend).await;
    let wharf = store.wharf();
    let incumbent = as_declarer(&wharf, "incumbent").consume(registration("1", &["a/#"]));
    ready(&incumbent, "incumbent").await;
    let waiter = as_declarer(&wharf, "doomed").consume(registration("2", &["b/#"]));
    waiting(&waiter, "doomed").await;
    drop(waiter); // crashes while waiting
    let read = wharf.read_model().clone();
    wait_until("the dead waiter's silence exceeds 300 ms", DEADLINE, || {
        let read = read.clone();
        async move {
            let view = read.group(&group()).await.unwrap().unwrap();
            view.waiters
                .iter()
                .any(|w| w.declarer == "doomed/1" && w.silent_seconds > 0.3)
        }
    })
    .await;
    let view = read.group(&group()).await.unwrap().unwrap();
    let dead = view
        .waiters
        .iter()
        .find(|w| w.declarer == "doomed/1")
        .unwrap();
    assert_eq!(dead.patterns, vec!["b/#"]);
    assert_eq!(dead.incumbent, vec!["a/#"]);
    assert!(dead.waiting_seconds >= dead.silent_seconds);
    assert!(dead.declared_at <= dead.last_attempt_at);
    let live: Vec<_> = view.instances.iter().filter(|i| i.live).collect();
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].declarer, "incumbent/1");
    incumbent.shutdown().await;
}
on_both_backends!(dead_waiter, a_dead_waiter_shows_its_age);

async fn consume_reattempts_even_after_register_installed(backend: Backend) {
    let store = TestStore::new(backend).await;
    let wharf = store.steady_wharf();
    let p = as_declarer(&wharf, "p");
    let outcome = p.register(&registration("1", &["b/#"])).await.unwrap();
    assert!(matches!(
        outcome,
        RegisterOutcome::Installed { previous: None, .. }
    ));
    // Before p consumes it has no heartbeat, so q may legitimately replace the set.
    let q = as_declarer(&wharf, "q").consume(registration("1", &["a/#"]));
    ready(&q, "q").await;
    assert_eq!(effective(&wharf).await, vec!["a/#"]);
    let p_consumer = p.consume(registration("1", &["b/#"]));
    waiting(&p_consumer, "p").await;
    assert!(!p_consumer.is_ready());
    q.shutdown().await;
    ready(&p_consumer, "p after q left").await;
    assert_eq!(effective(&wharf).await, vec!["b/#"]);
    p_consumer.shutdown().await;
}
on_both_backends!(
    consume_reattempts,
    consume_reattempts_even_after_register_installed
);

async fn register_reports_each_outcome(backend: Backend) {
    let store = TestStore::new(backend).await;
    let wharf = store.steady_wharf();
    let a = as_declarer(&wharf, "a");
    let b = as_declarer(&wharf, "b");
    let first = a
        .register(&registration("1", &["x/+", "y/#"]))
        .await
        .unwrap();
    assert!(matches!(
        first,
        RegisterOutcome::Installed { previous: None, .. }
    ));
    let same = b
        .register(&registration("9", &["y/#", "x/+", "x/+"]))
        .await
        .unwrap();
    assert!(matches!(same, RegisterOutcome::Joined { .. }), "{same:?}");
    let live = a.consume(registration("1", &["x/+", "y/#"]));
    ready(&live, "a").await;
    let blocked = b.register(&registration("2", &["z"])).await.unwrap();
    let RegisterOutcome::Waiting {
        incumbent,
        live_declarers,
        ..
    } = blocked
    else {
        panic!("expected waiting, got {blocked:?}");
    };
    assert_eq!(incumbent.patterns(), vec!["x/+", "y/#"]);
    assert_eq!(live_declarers.len(), 1);
    assert_eq!(live_declarers[0].as_str(), "a/1", "a's consumer instance");
    live.shutdown().await;
    let swapped = b.register(&registration("2", &["z"])).await.unwrap();
    assert!(matches!(
        swapped,
        RegisterOutcome::Installed {
            previous: Some(_),
            ..
        }
    ));
    let whole = a.register(&registration("3", &[])).await.unwrap();
    assert!(matches!(whole, RegisterOutcome::Installed { .. }));
    assert!(
        effective(&wharf).await.is_empty(),
        "no bindings = whole topic"
    );
}
on_both_backends!(register_outcomes, register_reports_each_outcome);

async fn refusals_write_nothing(backend: Backend) {
    let store = TestStore::new(backend).await;
    let wharf = store.wharf();
    wharf.register(&registration("1", &["a/#"])).await.unwrap();
    let other_topic = Registration::new("billing", "invoices", "1", &["a/#"]).unwrap();
    let err = wharf.register(&other_topic).await.unwrap_err();
    assert!(
        matches!(err, WharfError::Declaration(_)),
        "topic mismatch is a declaration refusal: {err}"
    );
    assert!(err.to_string().contains("orders") && err.to_string().contains("invoices"));
    assert_eq!(ledger(&wharf).await.len(), 1, "nothing appended");
    let consumer = wharf.consume(other_topic);
    let mut watch = consumer.watch();
    tokio::time::timeout(
        DEADLINE,
        watch.wait_for(|s| matches!(s, ConsumerState::Failed { .. })),
    )
    .await
    .expect("a refused consumer fails")
    .unwrap();
    assert!(!consumer.is_ready());
    consumer.shutdown().await;
}
on_both_backends!(refusals, refusals_write_nothing);

#[test]
fn bad_input_names_the_field_and_value() {
    let err = Registration::new("billing", "orders", "1", &["ok/#", "bad/#/x"]).unwrap_err();
    assert_eq!(err.field, "bindings[1]");
    assert_eq!(err.value, "bad/#/x");
    let err = Registration::new("bil ling", "orders", "1", &["a"]).unwrap_err();
    assert_eq!(err.field, "group");
    let err = Registration::new("billing", "", "1", &["a"]).unwrap_err();
    assert_eq!(err.field, "topic");
    let err = Registration::new("billing", "orders", "", &["a"]).unwrap_err();
    assert_eq!(err.field, "version");
}

async fn system_groups_declare_and_their_consumers_join(backend: Backend) {
    let store = TestStore::new(backend).await;
    let wharf = store.wharf();
    let alerts = Registration::new("alerts", "events", "system", &["alerts/#"]).unwrap();
    let declared = wharf.register_system(&alerts).await.unwrap();
    assert!(matches!(declared, RegisterOutcome::Installed { .. }));
    let again = wharf.register_system(&alerts).await.unwrap();
    assert!(
        matches!(again, RegisterOutcome::Joined { .. }),
        "idempotent: {again:?}"
    );
    let consumer = as_declarer(&wharf, "alert-worker")
        .consume(Registration::new("alerts", "events", "3.1", &["alerts/#"]).unwrap());
    ready(&consumer, "alert consumer").await;
    let installs = wharf
        .store()
        .load("consumer_group", "alerts")
        .await
        .unwrap()
        .len();
    assert_eq!(installs, 1, "the consumer joined: nothing appended");
    consumer.shutdown().await;
}
on_both_backends!(
    system_groups,
    system_groups_declare_and_their_consumers_join
);

async fn graceful_shutdown_leaves_at_once(backend: Backend) {
    let store = TestStore::new(backend).await;
    let wharf = store.wharf();
    let consumer = wharf.consume(registration("1", &["a"]));
    ready(&consumer, "consumer").await;
    assert_eq!(wharf.store().instances(None).await.unwrap().len(), 1);
    consumer.shutdown().await;
    assert!(wharf.store().instances(None).await.unwrap().is_empty());
}
on_both_backends!(graceful_shutdown, graceful_shutdown_leaves_at_once);

async fn the_state_cache_follows_other_writers_and_a_restored_ledger(backend: Backend) {
    let store = TestStore::new(backend).await;
    // Two Wharf handles on one store: separate processes with separate caches.
    let (one, two) = (store.wharf(), store.wharf());
    let a = as_declarer(&one, "a");
    let b = as_declarer(&two, "b");
    a.register(&registration("1", &["x/#"])).await.unwrap();
    // b installs behind a's back; a's cached state must learn it from the newer events.
    b.register(&registration("2", &["y/#"])).await.unwrap();
    let joined = a.register(&registration("1", &["y/#"])).await.unwrap();
    assert!(
        matches!(joined, RegisterOutcome::Joined { .. }),
        "{joined:?}"
    );
    // The ledger moves backwards (a restore): a's cache is ahead of it and must be dropped.
    wipe_group_ledger(&store).await;
    let fresh = a.register(&registration("1", &["z/#"])).await.unwrap();
    assert!(
        matches!(fresh, RegisterOutcome::Installed { previous: None, .. }),
        "after the restore the group has no declaration: {fresh:?}"
    );
    assert_eq!(ledger(&a).await.len(), 1);
}
on_both_backends!(
    state_cache,
    the_state_cache_follows_other_writers_and_a_restored_ledger
);

/// Deletes the group's events and effective rows, as restoring an older backup would.
async fn wipe_group_ledger(store: &TestStore) {
    match &store.store {
        wharf::store::Store::Sqlite(s) => s
            .write(|ctx| {
                ctx.tx
                    .execute_batch("DELETE FROM events; DELETE FROM effective_declaration;")?;
                Ok(())
            })
            .await
            .unwrap(),
        wharf::store::Store::Postgres(s) => {
            sqlx::raw_sql("DELETE FROM events; DELETE FROM effective_declaration;")
                .execute(s.pool())
                .await
                .unwrap();
        }
    }
}
