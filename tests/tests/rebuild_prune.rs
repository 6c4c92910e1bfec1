//! Rebuild and prune after a randomized (seeded, printed) workload on real stores: several
//! groups and declarers, random sets, live consumers started, shut down and dropped at random
//! so that waits happen and resolve. Proves that
//! - `rebuild --verify` finds the projections clean, names each table a deliberate corruption
//!   touched without repairing it, and `rebuild` (Apply) repairs it;
//! - the pruner deletes exactly the superseded waiting attempts it counts (dry run deletes
//!   nothing), never an install nor any declarer's newest event, leaves the effective rows and
//!   the listing's waiter facts unchanged, and a rebuild from the pruned ledger reproduces them;
//! - a retention longer than the ledger's age deletes nothing.
//!
//! Rerun a failing seed with `WHARF_TEST_SEED=<seed>`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use wharf::domain::{DeclarationEvent, DeclarerId, GroupName, RegisterOutcome};
use wharf::projections::{EffectiveView, PruneOptions};
use wharf::store::{Progress, RebuildMode, RebuildReport, RecordedEvent, Store};
use wharf::{Consumer, ConsumerState, Registration, Wharf};
use wharf_tests::{execute_sql, on_both_backends, wait_until, Backend, TestStore};

const GROUPS: [&str; 3] = ["alpha", "beta", "gamma"];
const DECLARERS: usize = 5;
const STEPS: usize = 60;
const DEADLINE: Duration = Duration::from_secs(20);

/// The pool of binding sets: all non-empty, so every installed group has binding rows.
fn set(k: usize) -> Vec<String> {
    let patterns: &[&str] = match k % 4 {
        0 => &["orders/+/paid"],
        1 => &["orders/+/paid", "orders/eu/#"],
        2 => &["orders/us/#"],
        _ => &["orders/+/refunded", "orders/us/#"],
    };
    patterns.iter().map(|p| (*p).to_owned()).collect()
}

fn declarer(d: usize) -> DeclarerId {
    DeclarerId::parse("declarer", &format!("p{d}")).expect("a valid declarer id")
}

fn registration(group: &str, k: usize) -> Registration {
    Registration::new(group, "orders", &format!("{k}.0.0"), &set(k)).expect("valid registration")
}

fn group_name(group: &str) -> GroupName {
    GroupName::parse("group", group).expect("a valid group name")
}

fn seed() -> u64 {
    let seed = std::env::var("WHARF_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("workload seed = {seed} (rerun with WHARF_TEST_SEED={seed})");
    seed
}

// ---------------------------------------------------------------------------------------------
// Consumers
// ---------------------------------------------------------------------------------------------

/// Waits until a consumer's state satisfies `done`.
async fn reach(consumer: &Consumer, what: &str, done: impl FnMut(&ConsumerState) -> bool) {
    let mut watch = consumer.watch();
    tokio::time::timeout(DEADLINE, watch.wait_for(done))
        .await
        .unwrap_or_else(|_| panic!("{what}: stuck in {:?}", consumer.state()))
        .expect("state channel");
}

/// Waits until a freshly started consumer has made its first attempt.
async fn attempted(consumer: &Consumer, what: &str) {
    reach(consumer, what, |s| !matches!(s, ConsumerState::Declaring)).await;
    let state = consumer.state();
    assert!(
        matches!(
            state,
            ConsumerState::Consuming { .. } | ConsumerState::Waiting { .. }
        ),
        "{what}: a declaration attempt must consume or wait, got {state:?}"
    );
}

/// Running consumers by (group index, declarer index).
type Fleet = BTreeMap<(usize, usize), Consumer>;

/// Lets every wait in `group` resolve: repeatedly shuts down the group's consuming instances
/// until none of its consumers is waiting.
async fn settle(fleet: &mut Fleet, group: usize) {
    loop {
        let in_group: Vec<(usize, usize)> =
            fleet.keys().filter(|k| k.0 == group).copied().collect();
        let waiting: Vec<(usize, usize)> = in_group
            .iter()
            .filter(|k| matches!(fleet[*k].state(), ConsumerState::Waiting { .. }))
            .copied()
            .collect();
        if waiting.is_empty() {
            return;
        }
        let ready: Vec<(usize, usize)> = in_group
            .iter()
            .filter(|k| fleet[*k].is_ready())
            .copied()
            .collect();
        for key in ready {
            if let Some(consumer) = fleet.remove(&key) {
                consumer.shutdown().await;
            }
        }
        let watches: Vec<_> = waiting.iter().map(|k| fleet[k].watch()).collect();
        let what = format!(
            "a waiter of {} to install once its incumbents are gone",
            GROUPS[group]
        );
        wait_until(&what, DEADLINE, || {
            let resolved = watches.iter().any(|w| w.borrow().is_ready());
            async move { resolved }
        })
        .await;
    }
}

/// Lets every waiting consumer make one more attempt (each retry appends a waiting event
/// that supersedes its previous one), or stop waiting.
async fn retried(fleet: &Fleet, step: usize) {
    for consumer in fleet.values() {
        let ConsumerState::Waiting { attempts, .. } = consumer.state() else {
            continue;
        };
        reach(
            consumer,
            &format!("step {step}: a waiter retrying"),
            |s| match s {
                ConsumerState::Waiting { attempts: now, .. } => *now > attempts,
                _ => true,
            },
        )
        .await;
    }
}

/// Runs the seeded workload and leaves the store quiet (every consumer stopped); returns the
/// Wharf it used.
async fn workload(ts: &TestStore, rng: &mut StdRng) -> Wharf {
    // A wait that certainly happens and resolves: p1 waits on p0's live instance (retrying,
    // so superseded waiting attempts pile up) until p0 shuts down, then installs. These two
    // judge liveness with a long TTL, so a slow machine cannot lapse p0 early.
    let mut patient = ts.config();
    patient.declarations.instance_ttl = Duration::from_secs(30);
    let patient = Wharf::with_store(ts.store.clone(), &patient.settings());
    let incumbent = patient
        .as_declarer(declarer(0))
        .consume(registration(GROUPS[0], 0));
    reach(&incumbent, "p0 consuming", ConsumerState::is_ready).await;
    let waiter = patient
        .as_declarer(declarer(1))
        .consume(registration(GROUPS[0], 1));
    reach(
        &waiter,
        "p1 retrying its wait",
        |s| matches!(s, ConsumerState::Waiting { attempts, .. } if *attempts >= 5),
    )
    .await;
    incumbent.shutdown().await;
    reach(
        &waiter,
        "p1 installing after p0 left",
        ConsumerState::is_ready,
    )
    .await;
    waiter.shutdown().await;

    // The random part runs with the harness's fast timings (400 ms TTL).
    let wharf = ts.wharf();
    let mut fleet = Fleet::new();
    for step in 0..STEPS {
        let g = rng.gen_range(0..GROUPS.len());
        let d = rng.gen_range(0..DECLARERS);
        let k = rng.gen_range(0..4);
        match rng.gen_range(0..10) {
            0..=2 => {
                let outcome = wharf
                    .as_declarer(declarer(d))
                    .register(&registration(GROUPS[g], k))
                    .await
                    .unwrap_or_else(|e| panic!("step {step}: register failed: {e}"));
                if let RegisterOutcome::Waiting { live_declarers, .. } = &outcome {
                    assert!(
                        !live_declarers.is_empty(),
                        "a wait names its live incumbents"
                    );
                }
            }
            3..=5 if !fleet.contains_key(&(g, d)) => {
                let consumer = wharf
                    .as_declarer(declarer(d))
                    .consume(registration(GROUPS[g], k));
                attempted(&consumer, &format!("step {step}: p{d} on {}", GROUPS[g])).await;
                fleet.insert((g, d), consumer);
            }
            6 => retried(&fleet, step).await,
            3..=8 if !fleet.is_empty() => {
                let keys: Vec<_> = fleet.keys().copied().collect();
                let key = keys[rng.gen_range(0..keys.len())];
                if let Some(consumer) = fleet.remove(&key) {
                    consumer.shutdown().await;
                }
            }
            _ if !fleet.is_empty() => {
                // An abrupt stop, like a crash: the heartbeat row lapses after the TTL.
                let keys: Vec<_> = fleet.keys().copied().collect();
                let key = keys[rng.gen_range(0..keys.len())];
                drop(fleet.remove(&key));
            }
            _ => {}
        }
    }
    for g in 0..GROUPS.len() {
        settle(&mut fleet, g).await;
    }
    for (_, consumer) in std::mem::take(&mut fleet) {
        consumer.shutdown().await;
    }
    wharf
}

// ---------------------------------------------------------------------------------------------
// Observations
// ---------------------------------------------------------------------------------------------

async fn ledger(store: &Store) -> Vec<RecordedEvent> {
    store
        .read_after(0, 1_000_000)
        .await
        .expect("reading the ledger")
}

/// Every group's effective binding rows and effective declaration.
async fn effective_facts(wharf: &Wharf) -> BTreeMap<String, (Vec<String>, EffectiveView)> {
    let mut facts = BTreeMap::new();
    for view in wharf.read_model().groups().await.expect("listing") {
        let rows = wharf
            .read_model()
            .effective_bindings(&group_name(&view.group))
            .await
            .expect("binding rows");
        facts.insert(view.group.clone(), (rows, view.effective));
    }
    facts
}

/// The listing's open waiters: (group, declarer, declared_at, patterns).
async fn waiter_facts(wharf: &Wharf) -> BTreeSet<(String, String, DateTime<Utc>, Vec<String>)> {
    let mut facts = BTreeSet::new();
    for view in wharf.read_model().groups().await.expect("listing") {
        for w in view.waiters {
            facts.insert((view.group.clone(), w.declarer, w.declared_at, w.patterns));
        }
    }
    facts
}

/// Checks each group's ledger: sequences rising from 1 (gaps only after pruning), installs
/// chained, and the binding rows equal to the newest install.
async fn check_groups(wharf: &Wharf, contiguous: bool) {
    for group in GROUPS {
        let recorded = wharf
            .store()
            .load("consumer_group", group)
            .await
            .expect("load");
        let sequences: Vec<i64> = recorded.iter().map(|e| e.sequence).collect();
        if contiguous {
            assert_eq!(
                sequences,
                (1..=recorded.len() as i64).collect::<Vec<_>>(),
                "{group}"
            );
        } else {
            assert!(
                sequences.windows(2).all(|w| w[0] < w[1]),
                "{group}: {sequences:?}"
            );
        }
        let mut installed = None;
        for e in &recorded {
            if let DeclarationEvent::Installed { attempt, previous } = e.decode().expect("decode") {
                assert_eq!(
                    previous, installed,
                    "{group}: install chain at sequence {}",
                    e.sequence
                );
                installed = Some(attempt.patterns);
            }
        }
        let rows = wharf
            .read_model()
            .effective_bindings(&group_name(group))
            .await
            .expect("binding rows");
        assert_eq!(
            rows,
            installed.map(|s| s.patterns()).unwrap_or_default(),
            "{group}: binding rows must be the newest install"
        );
    }
}

/// Runs a rebuild, checking the progress it reports against the ledger.
async fn rebuild(wharf: &Wharf, mode: RebuildMode) -> RebuildReport {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let progress: Progress = {
        let calls = calls.clone();
        Arc::new(move |done, total| {
            calls.lock().expect("progress log").push((done, total));
        })
    };
    let report = wharf
        .read_model()
        .rebuild(mode, progress)
        .await
        .expect("rebuild");
    let events = ledger(wharf.store()).await;
    assert_eq!(
        report.events,
        events.len() as u64,
        "{mode:?} replays the whole ledger"
    );
    assert_eq!(
        report.last_position,
        events.last().map_or(0, |e| e.position)
    );
    assert_eq!(report.applied, mode == RebuildMode::Apply);
    let calls = calls.lock().expect("progress log").clone();
    assert_eq!(
        calls.last().copied(),
        Some((report.events, report.events)),
        "progress ends at (all, all)"
    );
    report
}

fn installed_count(events: &[RecordedEvent]) -> usize {
    events
        .iter()
        .filter(|e| e.event_type == "DeclarationInstalled")
        .count()
}

/// Each (group, declarer)'s newest event position.
fn newest_per_declarer(events: &[RecordedEvent]) -> BTreeMap<(String, String), i64> {
    let mut newest = BTreeMap::new();
    for e in events
        .iter()
        .filter(|e| e.aggregate_type == "consumer_group")
    {
        let who = e.payload.to_value()["declarer"]
            .as_str()
            .expect("a declaration names its declarer")
            .to_owned();
        let slot = newest.entry((e.aggregate_id.clone(), who)).or_insert(0);
        *slot = e.position.max(*slot);
    }
    newest
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

async fn rebuild_and_prune_after_a_random_workload(backend: Backend) {
    let mut rng = StdRng::seed_from_u64(seed());
    let ts = TestStore::new(backend).await;
    let wharf = workload(&ts, &mut rng).await;
    check_groups(&wharf, true).await;
    let events = ledger(wharf.store()).await;
    println!(
        "workload: {} events, {} installs, {} open waiters",
        events.len(),
        installed_count(&events),
        waiter_facts(&wharf).await.len()
    );

    // Verify is clean after the workload.
    let clean = rebuild(&wharf, RebuildMode::Verify).await;
    assert!(
        clean.is_clean(),
        "fresh projections must verify: {:?}",
        clean.differences
    );

    // Corrupt one binding row (a pattern of the effective declaration, which the `binding`
    // view unnests) and the declaration's install count on purpose.
    let alpha = GROUPS[0];
    let before = effective_facts(&wharf).await;
    let (rows, view) = before.get(alpha).expect("alpha has an install").clone();
    let victim = rows.first().expect("alpha has binding rows").clone();
    let corrupted_patterns = match wharf.store() {
        Store::Sqlite(_) => format!("replace(patterns, '\"{victim}\"', '\"corrupted/#\"')"),
        Store::Postgres(_) => format!("array_replace(patterns, '{victim}', 'corrupted/#')"),
    };
    execute_sql(
        wharf.store(),
        &format!(
            "UPDATE effective_declaration SET patterns = {corrupted_patterns}, \
             installs = installs + 100 WHERE group_name = '{alpha}'"
        ),
    )
    .await;
    let corrupted = effective_facts(&wharf).await;

    let report = rebuild(&wharf, RebuildMode::Verify).await;
    let mut tables: Vec<(&str, u64, u64)> = report
        .differences
        .iter()
        .map(|d| (d.table.as_str(), d.only_live, d.only_rebuilt))
        .collect();
    tables.sort_unstable();
    assert_eq!(
        tables,
        vec![("effective_declaration", 1, 1)],
        "Verify must name exactly the corrupted tables"
    );
    let after_verify = effective_facts(&wharf).await;
    assert_eq!(after_verify, corrupted, "Verify must change nothing");
    let (rows_now, view_now) = &after_verify[alpha];
    assert!(rows_now.contains(&"corrupted/#".to_owned()));
    assert_eq!(view_now.installs, view.installs + 100);

    let applied = rebuild(&wharf, RebuildMode::Apply).await;
    assert!(applied.differences.is_empty());
    assert_eq!(
        effective_facts(&wharf).await,
        before,
        "Apply restores the projections"
    );
    let again = rebuild(&wharf, RebuildMode::Verify).await;
    assert!(
        again.is_clean(),
        "clean after Apply: {:?}",
        again.differences
    );

    // Prune: record what must survive.
    let effective_before = effective_facts(&wharf).await;
    let waiters_before = waiter_facts(&wharf).await;
    let events_before = ledger(wharf.store()).await;
    let installs_before = installed_count(&events_before);
    let newest_before = newest_per_declarer(&events_before);

    let dry = wharf
        .read_model()
        .prune(PruneOptions {
            retention: Duration::ZERO,
            dry_run: true,
            batch: 3,
        })
        .await
        .expect("dry prune");
    assert!(dry.dry_run);
    assert!(
        dry.eligible > 3,
        "the workload left superseded waits: {dry:?}"
    );
    assert_eq!(dry.deleted, 0);
    assert_eq!(
        ledger(wharf.store()).await,
        events_before,
        "a dry run deletes nothing"
    );

    let pruned = wharf
        .read_model()
        .prune(PruneOptions {
            retention: Duration::ZERO,
            dry_run: false,
            batch: 3,
        })
        .await
        .expect("prune");
    assert!(!pruned.dry_run);
    assert_eq!(
        pruned.eligible, dry.eligible,
        "nothing was appended in between"
    );
    assert_eq!(
        pruned.deleted, pruned.eligible,
        "everything eligible is deleted"
    );

    let events_after = ledger(wharf.store()).await;
    assert_eq!(
        events_after.len() as u64,
        events_before.len() as u64 - pruned.deleted
    );
    assert_eq!(
        installed_count(&events_after),
        installs_before,
        "no install is pruned"
    );
    let remaining: BTreeSet<i64> = events_after.iter().map(|e| e.position).collect();
    for ((group, who), position) in &newest_before {
        assert!(
            remaining.contains(position),
            "{who}'s newest event in {group} (position {position}) was pruned"
        );
    }
    assert!(
        events_after.iter().all(|e| events_before.contains(e)),
        "pruning only deletes"
    );
    let redo = wharf
        .read_model()
        .prune(PruneOptions {
            retention: Duration::ZERO,
            dry_run: true,
            batch: 3,
        })
        .await
        .expect("second dry prune");
    assert_eq!(redo.eligible, 0, "nothing superseded is left");

    check_groups(&wharf, false).await;
    assert_eq!(effective_facts(&wharf).await, effective_before);
    assert_eq!(waiter_facts(&wharf).await, waiters_before);

    // A rebuild from the pruned ledger reproduces the same projections.
    rebuild(&wharf, RebuildMode::Apply).await;
    assert_eq!(effective_facts(&wharf).await, effective_before);
    assert_eq!(waiter_facts(&wharf).await, waiters_before);
    let verified = rebuild(&wharf, RebuildMode::Verify).await;
    assert!(
        verified.is_clean(),
        "clean after prune: {:?}",
        verified.differences
    );

    // The next declaration continues the group's sequence.
    let alpha_events = wharf
        .store()
        .load("consumer_group", alpha)
        .await
        .expect("load");
    let last = alpha_events.last().expect("alpha has events").sequence;
    let current = &effective_before[alpha].1.patterns;
    let other = (0..4).find(|k| &set(*k) != current).expect("another set");
    let outcome = wharf
        .as_declarer(declarer(DECLARERS))
        .register(&registration(alpha, other))
        .await
        .expect("register after prune");
    // Installed, or Waiting on an instance dropped mid-workload whose heartbeat has not
    // lapsed yet: either way one event is appended, never a join.
    assert!(
        !matches!(outcome, RegisterOutcome::Joined { .. }),
        "{outcome:?}"
    );
    let next = wharf
        .store()
        .load("consumer_group", alpha)
        .await
        .expect("load");
    assert_eq!(next.last().expect("appended").sequence, last + 1);
    assert!(rebuild(&wharf, RebuildMode::Verify).await.is_clean());
}

on_both_backends!(
    rebuild_and_prune_after_a_random_workload,
    rebuild_and_prune_after_a_random_workload
);

async fn long_retention_prunes_nothing(backend: Backend) {
    let ts = TestStore::new(backend).await;
    let mut config = ts.config();
    config.declarations.instance_ttl = Duration::from_secs(30);
    let wharf = Wharf::with_store(ts.store.clone(), &config.settings());

    // p1 waits three times on p0's live instance: two of its attempts are superseded.
    let incumbent = wharf
        .as_declarer(declarer(0))
        .consume(registration("alpha", 0));
    reach(&incumbent, "p0 consuming", ConsumerState::is_ready).await;
    for _ in 0..3 {
        let outcome = wharf
            .as_declarer(declarer(1))
            .register(&registration("alpha", 1))
            .await
            .expect("register");
        assert!(
            matches!(outcome, RegisterOutcome::Waiting { .. }),
            "{outcome:?}"
        );
    }
    incumbent.shutdown().await;
    let events = ledger(wharf.store()).await;
    assert_eq!(events.len(), 4);

    let kept = wharf
        .read_model()
        .prune(PruneOptions {
            retention: Duration::from_secs(3600),
            dry_run: false,
            batch: 3,
        })
        .await
        .expect("prune");
    assert_eq!((kept.eligible, kept.deleted), (0, 0), "{kept:?}");
    assert!(kept.cutoff < events[0].recorded_at);
    assert_eq!(
        ledger(wharf.store()).await,
        events,
        "nothing younger than the retention goes"
    );

    // The same ledger with no retention has exactly those two candidates.
    let dry = wharf
        .read_model()
        .prune(PruneOptions {
            retention: Duration::ZERO,
            dry_run: true,
            batch: 3,
        })
        .await
        .expect("dry prune");
    assert_eq!(dry.eligible, 2);
    assert_eq!(ledger(wharf.store()).await, events);
}

on_both_backends!(long_retention_prunes_nothing, long_retention_prunes_nothing);
