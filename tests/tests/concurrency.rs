//! Concurrent declarations on real stores, released together behind a barrier:
//! - sixteen declarers racing on one group all succeed, and the installs they cause are serial:
//!   the ledger's sequences are contiguous, every install's `previous` is the set installed just
//!   before it (no lost update), the binding rows equal the newest install, and the outcomes
//!   callers were told match the ledger one for one;
//! - with a live incumbent, every racing registration of another set waits and nothing is
//!   installed;
//! - installers racing on eight different groups all finish (no deadlock between group locks
//!   and the append lock) with each group's ledger just as consistent.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Barrier;
use wharf::domain::{BindingSet, DeclarationEvent, DeclarerId, GroupName, RegisterOutcome};
use wharf::{ConsumerState, Registration, Wharf};
use wharf_tests::{on_both_backends, Backend, TestStore};

/// The pool of binding sets declarers pick from; set 3 is the whole topic.
fn set(k: usize) -> Vec<String> {
    let patterns: &[&str] = match k % 4 {
        0 => &["orders/+/paid"],
        1 => &["orders/+/paid", "orders/eu/#"],
        2 => &["orders/us/#", "orders/+/refunded"],
        _ => &[],
    };
    patterns.iter().map(|p| (*p).to_owned()).collect()
}

fn declarer(name: &str) -> DeclarerId {
    DeclarerId::parse("declarer", name).expect("a valid declarer id")
}

fn group_name(group: &str) -> GroupName {
    GroupName::parse("group", group).expect("a valid group name")
}

fn registration(group: &str, version: &str, k: usize) -> Registration {
    Registration::new(group, "orders", version, &set(k)).expect("a valid registration")
}

/// One racing registration: who, and what.
struct Racer {
    declarer: DeclarerId,
    registration: Registration,
}

/// What a racer was told.
struct Finished {
    declarer: DeclarerId,
    registration: Registration,
    outcome: RegisterOutcome,
}

/// Spawns every racer at once behind a barrier and collects what each was told; any error
/// fails the test naming the racer.
async fn race(wharf: &Wharf, racers: Vec<Racer>) -> Vec<Finished> {
    let barrier = Arc::new(Barrier::new(racers.len()));
    let tasks: Vec<_> = racers
        .into_iter()
        .map(|racer| {
            let wharf = wharf.as_declarer(racer.declarer.clone());
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                let result = wharf.register(&racer.registration).await;
                (racer, result)
            })
        })
        .collect();
    let mut finished = Vec::new();
    for task in tasks {
        let (racer, result) = task.await.expect("a racing task");
        let outcome = result.unwrap_or_else(|e| {
            panic!(
                "register by {} on {} failed: {e}",
                racer.declarer, racer.registration.group
            )
        });
        finished.push(Finished {
            declarer: racer.declarer,
            registration: racer.registration,
            outcome,
        });
    }
    finished
}

/// Loads a group's ledger and checks its shape: contiguous sequences from 1, positions rising
/// with them, and installs chained (each `previous` is the set installed before it, and a
/// swap always changes the set). Returns the decoded events.
async fn checked_ledger(wharf: &Wharf, group: &str) -> Vec<DeclarationEvent> {
    let recorded = wharf
        .store()
        .load("consumer_group", group)
        .await
        .expect("loading the group's ledger");
    let sequences: Vec<i64> = recorded.iter().map(|e| e.sequence).collect();
    let contiguous: Vec<i64> = (1..=recorded.len() as i64).collect();
    assert_eq!(sequences, contiguous, "{group}: sequences must be 1..=n");
    assert!(
        recorded.windows(2).all(|w| w[0].position < w[1].position),
        "{group}: positions rise with sequences"
    );
    let events: Vec<DeclarationEvent> = recorded
        .iter()
        .map(|e| e.decode().expect("a declaration event"))
        .collect();
    let mut installed: Option<&BindingSet> = None;
    for (i, event) in events.iter().enumerate() {
        if let DeclarationEvent::Installed { attempt, previous } = event {
            assert_eq!(
                previous.as_ref(),
                installed,
                "{group}: install at sequence {} must replace the set installed before it",
                i + 1
            );
            assert_ne!(
                Some(&attempt.patterns),
                installed,
                "{group}: an install at sequence {} re-installed the effective set",
                i + 1
            );
            installed = Some(&attempt.patterns);
        }
    }
    events
}

/// The newest installed set in a ledger.
fn newest_installed(events: &[DeclarationEvent]) -> Option<BindingSet> {
    events.iter().rev().find_map(|e| match e {
        DeclarationEvent::Installed { attempt, .. } => Some(attempt.patterns.clone()),
        DeclarationEvent::Waiting { .. } => None,
    })
}

/// Checks that the Installed outcomes are exactly the installs in the ledger, each told the
/// `previous` and `effective` its event records, and that every Joined racer was told its own
/// set.
fn outcomes_match_ledger(group: &str, finished: &[&Finished], events: &[DeclarationEvent]) {
    let installs: Vec<(&DeclarerId, &Option<BindingSet>, &BindingSet)> = events
        .iter()
        .filter_map(|e| match e {
            DeclarationEvent::Installed { attempt, previous } => {
                Some((&attempt.declarer, previous, &attempt.patterns))
            }
            DeclarationEvent::Waiting { .. } => None,
        })
        .collect();
    let mut told_installed = 0;
    for f in finished {
        match &f.outcome {
            RegisterOutcome::Installed {
                previous,
                effective,
            } => {
                told_installed += 1;
                assert_eq!(effective, &f.registration.bindings);
                assert!(
                    installs.contains(&(&f.declarer, previous, effective)),
                    "{group}: {} was told it installed {effective} over {previous:?}, \
                     but the ledger has no such install",
                    f.declarer
                );
            }
            RegisterOutcome::Joined { effective } => {
                assert_eq!(
                    effective, &f.registration.bindings,
                    "{group}: {} joined a set it did not ask for",
                    f.declarer
                );
            }
            RegisterOutcome::Waiting { .. } => {}
        }
    }
    assert_eq!(
        told_installed,
        installs.len(),
        "{group}: Installed outcomes must equal installed events"
    );
}

async fn effective_rows(wharf: &Wharf, group: &str) -> Vec<String> {
    wharf
        .read_model()
        .effective_bindings(&group_name(group))
        .await
        .expect("reading binding rows")
}

// ---------------------------------------------------------------------------------------------

async fn sixteen_racers_on_one_group_install_serially(backend: Backend) {
    let ts = TestStore::new(backend).await;
    let wharf = ts.wharf();
    let racers = (0..16)
        .map(|i| Racer {
            declarer: declarer(&format!("d{i}")),
            registration: registration("racing", &format!("1.{i}.0"), i % 4),
        })
        .collect();
    let finished = race(&wharf, racers).await;

    let events = checked_ledger(&wharf, "racing").await;
    assert!(
        events.iter().all(DeclarationEvent::is_installed),
        "no instance heartbeats, so nothing may wait"
    );
    assert!(!events.is_empty(), "the first racer must install");
    assert!(
        finished
            .iter()
            .all(|f| !matches!(f.outcome, RegisterOutcome::Waiting { .. })),
        "no racer may be told to wait without a live incumbent"
    );
    let all: Vec<&Finished> = finished.iter().collect();
    outcomes_match_ledger("racing", &all, &events);

    let newest = newest_installed(&events).expect("an install");
    assert_eq!(effective_rows(&wharf, "racing").await, newest.patterns());
    let view = wharf
        .read_model()
        .group(&group_name("racing"))
        .await
        .expect("listing")
        .expect("the group is declared");
    assert_eq!(view.effective.patterns, newest.patterns());
    assert_eq!(view.effective.installs, events.len() as i64);
}

on_both_backends!(
    sixteen_racers_on_one_group_install_serially,
    sixteen_racers_on_one_group_install_serially
);

async fn racers_wait_on_a_live_incumbent(backend: Backend) {
    let ts = TestStore::new(backend).await;
    // A TTL long enough that the incumbent cannot lapse on a slow machine mid-race.
    let mut config = ts.config();
    config.declarations.instance_ttl = Duration::from_secs(30);
    let wharf = Wharf::with_store(ts.store.clone(), &config.settings());

    // Its consumer is the instance `incumbent/1`: the declarer the racers wait on.
    let incumbent = wharf
        .as_declarer(declarer("incumbent"))
        .consume(registration("guarded", "0.9.0", 0));
    let mut state = incumbent.watch();
    tokio::time::timeout(
        Duration::from_secs(20),
        state.wait_for(ConsumerState::is_ready),
    )
    .await
    .unwrap_or_else(|_| panic!("the incumbent never became ready: {:?}", incumbent.state()))
    .expect("state channel");
    drop(state);
    let incumbent_id = incumbent.declarer().clone();
    let before = checked_ledger(&wharf, "guarded").await;
    assert_eq!(before.len(), 1, "the incumbent installed its set once");

    let racers = (0..16)
        .map(|i| Racer {
            declarer: declarer(&format!("d{i}")),
            registration: registration("guarded", &format!("1.{i}.0"), i % 4),
        })
        .collect();
    let finished = race(&wharf, racers).await;

    let incumbent_set = BindingSet::parse(&set(0)).expect("valid");
    let mut told_waiting = 0;
    for f in &finished {
        if f.registration.bindings == incumbent_set {
            assert!(
                matches!(&f.outcome, RegisterOutcome::Joined { effective } if *effective == incumbent_set),
                "{} asked for the incumbent's set and must join: {:?}",
                f.declarer,
                f.outcome
            );
        } else {
            match &f.outcome {
                RegisterOutcome::Waiting {
                    incumbent,
                    live_declarers,
                    ..
                } => {
                    told_waiting += 1;
                    assert_eq!(incumbent, &incumbent_set);
                    assert_eq!(live_declarers, &vec![incumbent_id.clone()]);
                }
                other => panic!(
                    "{} asked for another set while the incumbent is live and must wait: {other:?}",
                    f.declarer
                ),
            }
        }
    }
    assert_eq!(told_waiting, 12);

    let events = checked_ledger(&wharf, "guarded").await;
    assert_eq!(events[0], before[0]);
    assert_eq!(
        events.iter().filter(|e| e.is_installed()).count(),
        1,
        "nothing may be installed while the incumbent is live"
    );
    assert_eq!(
        events.len(),
        1 + told_waiting,
        "one waiting event per waiting outcome"
    );
    let all: Vec<&Finished> = finished.iter().collect();
    // The racers' outcomes against what they appended (the incumbent's install came before).
    outcomes_match_ledger("guarded", &all, &events[before.len()..]);
    assert_eq!(effective_rows(&wharf, "guarded").await, set(0));

    let view = wharf
        .read_model()
        .group(&group_name("guarded"))
        .await
        .expect("listing")
        .expect("declared");
    let mut waiters: Vec<&str> = view.waiters.iter().map(|w| w.declarer.as_str()).collect();
    waiters.sort_unstable();
    let mut expected: Vec<String> = (0..16)
        .filter(|i| i % 4 != 0)
        .map(|i| format!("d{i}"))
        .collect();
    expected.sort_unstable();
    assert_eq!(
        waiters, expected,
        "every waiting racer is listed as a waiter"
    );
    assert!(incumbent.is_ready(), "the incumbent was never disturbed");
    incumbent.shutdown().await;
}

on_both_backends!(
    racers_wait_on_a_live_incumbent,
    racers_wait_on_a_live_incumbent
);

async fn racers_on_different_groups_do_not_deadlock(backend: Backend) {
    let ts = TestStore::new(backend).await;
    let wharf = ts.wharf();
    let groups: Vec<String> = (0..8).map(|g| format!("group-{g}")).collect();
    let mut racers = Vec::new();
    for (g, group) in groups.iter().enumerate() {
        for j in 0..4 {
            racers.push(Racer {
                declarer: declarer(&format!("g{g}-d{j}")),
                registration: registration(group, "1.0.0", j),
            });
        }
    }
    let finished = tokio::time::timeout(Duration::from_secs(60), race(&wharf, racers))
        .await
        .expect("32 installers on 8 groups must all finish (deadlock?)");
    assert_eq!(finished.len(), 32);

    for group in &groups {
        let events = checked_ledger(&wharf, group).await;
        assert!(events.iter().all(DeclarationEvent::is_installed));
        assert!(!events.is_empty());
        let mine: Vec<&Finished> = finished
            .iter()
            .filter(|f| f.registration.group.as_str() == group)
            .collect();
        assert_eq!(mine.len(), 4);
        outcomes_match_ledger(group, &mine, &events);
        let newest = newest_installed(&events).expect("an install");
        assert_eq!(effective_rows(&wharf, group).await, newest.patterns());
    }
}

on_both_backends!(
    racers_on_different_groups_do_not_deadlock,
    racers_on_different_groups_do_not_deadlock
);
