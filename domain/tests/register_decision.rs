//! The Register decision, branch by branch.
//!
//! Most tests run the `ConsumerGroup` aggregate through cqrs-es's given/when/then harness (stored
//! events in, command, events out). Tests that care about what the caller is told call
//! [`decide`] directly against a state rebuilt from the same events. The last tests pin the JSON
//! form of the stored events.

use chrono::{DateTime, Utc};
use cqrs_es::test::TestFramework;
use cqrs_es::{Aggregate, DomainEvent};
use serde_json::json;
use wharf_domain::{
    decide, AppVersion, Attempt, BindingSet, ConsumerGroup, DeclarationError, DeclarationEvent,
    DeclarerId, GroupName, LiveInstance, OpenWait, OpenWaits, Register, RegisterOutcome, TopicName,
};

// ---------------------------------------------------------------------------------------------
// Builders
// ---------------------------------------------------------------------------------------------

const GROUP: &str = "billing";
const TOPIC: &str = "orders";

/// A point in time, `secs` seconds after an arbitrary fixed origin.
fn t(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_700_000_000 + secs, 0).expect("timestamp in range")
}

fn group(name: &str) -> GroupName {
    GroupName::parse("group", name).expect("valid group name")
}

fn topic(name: &str) -> TopicName {
    TopicName::parse("topic", name).expect("valid topic name")
}

fn declarer(name: &str) -> DeclarerId {
    DeclarerId::parse("declarer", name).expect("valid declarer id")
}

fn version(text: &str) -> AppVersion {
    AppVersion::parse("version", text).expect("valid version")
}

fn set(patterns: &[&str]) -> BindingSet {
    BindingSet::parse(patterns).expect("valid binding set")
}

fn whole_topic() -> BindingSet {
    BindingSet::whole_topic()
}

fn live(who: &str, patterns: &[&str]) -> LiveInstance {
    LiveInstance {
        declarer: declarer(who),
        patterns: set(patterns),
    }
}

/// A first-time Register by `who` for `requested` at `now`, with no live instances; tests
/// adjust fields with struct-update syntax.
fn register(who: &str, requested: BindingSet, now: DateTime<Utc>) -> Register {
    Register {
        group: group(GROUP),
        topic: topic(TOPIC),
        declarer: declarer(who),
        version: version("1.0.0"),
        requested,
        first_declared_at: None,
        now,
        live_instances: Vec::new(),
        open_wait: None,
    }
}

/// The attempt record `register(who, patterns, attempt_at)` produces, with `declared_at`.
fn attempt(
    who: &str,
    patterns: BindingSet,
    declared_at: DateTime<Utc>,
    attempt_at: DateTime<Utc>,
) -> Attempt {
    Attempt {
        group: group(GROUP),
        topic: topic(TOPIC),
        declarer: declarer(who),
        version: version("1.0.0"),
        patterns,
        declared_at,
        attempt_at,
    }
}

fn installed(attempt: Attempt, previous: Option<BindingSet>) -> DeclarationEvent {
    DeclarationEvent::Installed { attempt, previous }
}

fn waiting(attempt: Attempt, incumbent: BindingSet, live_declarers: &[&str]) -> DeclarationEvent {
    DeclarationEvent::Waiting {
        attempt,
        incumbent,
        live_declarers: live_declarers.iter().map(|who| declarer(who)).collect(),
    }
}

/// The history every "something is stored" test starts from: `incumbent` installed `stored`
/// at t(0) as the group's first declaration.
fn stored(incumbent: &str, stored: BindingSet) -> DeclarationEvent {
    installed(attempt(incumbent, stored, t(0), t(0)), None)
}

/// The aggregate as the ledger rebuilds it from `events`.
fn state(events: &[DeclarationEvent]) -> ConsumerGroup {
    let mut group = ConsumerGroup::default();
    for event in events {
        group.apply(event.clone());
    }
    group
}

fn given(events: Vec<DeclarationEvent>) -> cqrs_es::test::AggregateTestExecutor<ConsumerGroup> {
    TestFramework::<ConsumerGroup>::with(()).given(events)
}

/// The open waits `events` leave, as the store's open-wait table holds them.
fn waits(events: &[DeclarationEvent]) -> OpenWaits {
    let mut waits = OpenWaits::default();
    for event in events {
        waits.apply(event);
    }
    waits
}

/// `cmd` as the store hands it over after `events`: with its declarer's open wait.
fn observed(events: &[DeclarationEvent], cmd: Register) -> Register {
    Register {
        open_wait: waits(events).get(&cmd.declarer).cloned(),
        ..cmd
    }
}

/// Given `events`, when `cmd` (with its declarer's open wait, as the store observes it).
fn given_when(
    events: Vec<DeclarationEvent>,
    cmd: Register,
) -> cqrs_es::test::AggregateResultValidator<ConsumerGroup> {
    let cmd = observed(&events, cmd);
    given(events).when(cmd)
}

fn decide_ok(events: &[DeclarationEvent], cmd: &Register) -> RegisterOutcome {
    decide(&state(events), &observed(events, cmd.clone()))
        .expect("decision succeeds")
        .outcome
}

// ---------------------------------------------------------------------------------------------
// 1. Nothing stored: install at once
// ---------------------------------------------------------------------------------------------

#[test]
fn first_register_installs_with_no_previous_set() {
    TestFramework::<ConsumerGroup>::with(())
        .given_no_previous_events()
        .when(register("d1", set(&["a/#"]), t(5)))
        .then_expect_events(vec![installed(
            attempt("d1", set(&["a/#"]), t(5), t(5)),
            None,
        )]);
}

#[test]
fn first_register_tells_the_caller_it_installed() {
    let outcome = decide_ok(&[], &register("d1", set(&["a/#"]), t(5)));
    assert_eq!(
        outcome,
        RegisterOutcome::Installed {
            previous: None,
            effective: set(&["a/#"]),
        }
    );
    assert!(outcome.may_consume());
}

#[test]
fn first_register_ignores_live_instances() {
    let cmd = Register {
        live_instances: vec![live("w1", &["z/#"])],
        ..register("d1", set(&["a/#"]), t(5))
    };
    TestFramework::<ConsumerGroup>::with(())
        .given_no_previous_events()
        .when(cmd)
        .then_expect_events(vec![installed(
            attempt("d1", set(&["a/#"]), t(5), t(5)),
            None,
        )]);
}

// ---------------------------------------------------------------------------------------------
// 2. Same set as stored: join, append nothing
// ---------------------------------------------------------------------------------------------

#[test]
fn same_set_in_another_order_with_duplicates_joins_without_events() {
    let requested = BindingSet::parse(&["b/+", "a/#", "b/+"]).expect("valid");
    given_when(
        vec![stored("d0", set(&["a/#", "b/+"]))],
        register("d1", requested, t(5)),
    )
    .then_expect_events(vec![]);
}

#[test]
fn same_set_joins_even_while_instances_are_live_on_it() {
    let cmd = Register {
        live_instances: vec![live("d0", &["a/#", "b/+"]), live("w2", &["x"])],
        ..register("d1", set(&["b/+", "a/#"]), t(5))
    };
    let history = [stored("d0", set(&["a/#", "b/+"]))];
    assert_eq!(
        decide_ok(&history, &cmd),
        RegisterOutcome::Joined {
            effective: set(&["a/#", "b/+"]),
        }
    );
    given_when(history.to_vec(), cmd).then_expect_events(vec![]);
}

// ---------------------------------------------------------------------------------------------
// 3. Different set, incumbent still live: wait
// ---------------------------------------------------------------------------------------------

#[test]
fn different_set_waits_while_a_live_instance_declares_the_stored_set() {
    let cmd = Register {
        live_instances: vec![live("w1", &["a/#"]), live("w2", &["other"])],
        ..register("d1", set(&["b/#"]), t(5))
    };
    given_when(vec![stored("d0", set(&["a/#"]))], cmd).then_expect_events(vec![waiting(
        attempt("d1", set(&["b/#"]), t(5), t(5)),
        set(&["a/#"]),
        &["w1"],
    )]);
}

#[test]
fn waiting_outcome_names_incumbent_live_declarers_and_declared_at() {
    let cmd = Register {
        live_instances: vec![
            live("w1", &["a/#"]),
            live("w2", &["other"]),
            live("w3", &["a/#"]),
        ],
        ..register("d1", set(&["b/#"]), t(5))
    };
    let outcome = decide_ok(&[stored("d0", set(&["a/#"]))], &cmd);
    assert_eq!(
        outcome,
        RegisterOutcome::Waiting {
            incumbent: set(&["a/#"]),
            live_declarers: vec![declarer("w1"), declarer("w3")],
            declared_at: t(5),
        }
    );
    assert!(!outcome.may_consume());
}

/// Two consumer instances of one process (`host:1:ab/1`, `host:1:ab/2`, ADR 0015) are two
/// declarers: the second one's different set waits on the first, while an instance never waits
/// on its own row (it re-declares after its own heartbeat lapsed, say).
#[test]
fn instances_of_one_process_are_separate_declarers() {
    let history = [stored("host:1:ab/1", set(&["a/#"]))];
    let second = Register {
        live_instances: vec![live("host:1:ab/1", &["a/#"])],
        ..register("host:1:ab/2", set(&["b/#"]), t(5))
    };
    assert_eq!(
        decide_ok(&history, &second),
        RegisterOutcome::Waiting {
            incumbent: set(&["a/#"]),
            live_declarers: vec![declarer("host:1:ab/1")],
            declared_at: t(5),
        }
    );
    let itself = Register {
        live_instances: vec![live("host:1:ab/1", &["a/#"])],
        ..register("host:1:ab/1", set(&["b/#"]), t(5))
    };
    assert!(matches!(
        decide_ok(&history, &itself),
        RegisterOutcome::Installed { .. }
    ));
}

// ---------------------------------------------------------------------------------------------
// 4. and 5. Different set, no live declarer of the stored set: swap
// ---------------------------------------------------------------------------------------------

#[test]
fn different_set_swaps_when_live_instances_declare_only_other_sets() {
    let cmd = Register {
        live_instances: vec![live("w1", &["c/#"]), live("w2", &["a/#", "c/#"])],
        ..register("d1", set(&["b/#"]), t(5))
    };
    given_when(vec![stored("d0", set(&["a/#"]))], cmd.clone()).then_expect_events(vec![installed(
        attempt("d1", set(&["b/#"]), t(5), t(5)),
        Some(set(&["a/#"])),
    )]);
    assert_eq!(
        decide_ok(&[stored("d0", set(&["a/#"]))], &cmd),
        RegisterOutcome::Installed {
            previous: Some(set(&["a/#"])),
            effective: set(&["b/#"]),
        }
    );
}

#[test]
fn different_set_swaps_when_no_instance_is_live() {
    given_when(
        vec![stored("d0", set(&["a/#"]))],
        register("d1", set(&["b/#"]), t(5)),
    )
    .then_expect_events(vec![installed(
        attempt("d1", set(&["b/#"]), t(5), t(5)),
        Some(set(&["a/#"])),
    )]);
}

#[test]
fn swap_outcome_reports_previous_and_new_effective_set() {
    let outcome = decide_ok(
        &[stored("d0", set(&["a/#"]))],
        &register("d1", set(&["b/#"]), t(5)),
    );
    assert_eq!(
        outcome,
        RegisterOutcome::Installed {
            previous: Some(set(&["a/#"])),
            effective: set(&["b/#"]),
        }
    );
}

// ---------------------------------------------------------------------------------------------
// 6. declared_at spans the whole wait
// ---------------------------------------------------------------------------------------------

/// d0 installed {a/#} at t(0); d1 asked for {b/#} at t(10) and waited on live w1.
fn history_with_d1_waiting_since_t10() -> Vec<DeclarationEvent> {
    vec![
        stored("d0", set(&["a/#"])),
        waiting(
            attempt("d1", set(&["b/#"]), t(10), t(10)),
            set(&["a/#"]),
            &["w1"],
        ),
    ]
}

#[test]
fn retry_keeps_declared_at_from_the_first_wait() {
    let retry = Register {
        live_instances: vec![live("w1", &["a/#"])],
        ..register("d1", set(&["b/#"]), t(20))
    };
    given_when(history_with_d1_waiting_since_t10(), retry).then_expect_events(vec![waiting(
        attempt("d1", set(&["b/#"]), t(10), t(20)),
        set(&["a/#"]),
        &["w1"],
    )]);
}

#[test]
fn retry_outcome_reports_the_original_declared_at() {
    let retry = Register {
        live_instances: vec![live("w1", &["a/#"])],
        ..register("d1", set(&["b/#"]), t(20))
    };
    match decide_ok(&history_with_d1_waiting_since_t10(), &retry) {
        RegisterOutcome::Waiting { declared_at, .. } => assert_eq!(declared_at, t(10)),
        other => panic!("expected to wait, got {other:?}"),
    }
}

#[test]
fn eventual_install_carries_declared_at_of_the_whole_wait() {
    let mut history = history_with_d1_waiting_since_t10();
    history.push(waiting(
        attempt("d1", set(&["b/#"]), t(10), t(20)),
        set(&["a/#"]),
        &["w1"],
    ));
    // w1 has gone: no live instances at t(30).
    given_when(history, register("d1", set(&["b/#"]), t(30))).then_expect_events(vec![installed(
        attempt("d1", set(&["b/#"]), t(10), t(30)),
        Some(set(&["a/#"])),
    )]);
}

#[test]
fn asking_for_another_set_starts_a_new_wait_span() {
    let cmd = Register {
        live_instances: vec![live("w1", &["a/#"])],
        ..register("d1", set(&["c/#"]), t(20))
    };
    given_when(history_with_d1_waiting_since_t10(), cmd).then_expect_events(vec![waiting(
        attempt("d1", set(&["c/#"]), t(20), t(20)),
        set(&["a/#"]),
        &["w1"],
    )]);
}

#[test]
fn another_declarer_of_the_same_set_has_its_own_wait_span() {
    let cmd = Register {
        live_instances: vec![live("w1", &["a/#"])],
        ..register("d2", set(&["b/#"]), t(20))
    };
    given_when(history_with_d1_waiting_since_t10(), cmd).then_expect_events(vec![waiting(
        attempt("d2", set(&["b/#"]), t(20), t(20)),
        set(&["a/#"]),
        &["w1"],
    )]);
}

// ---------------------------------------------------------------------------------------------
// 7. first_declared_at from the caller
// ---------------------------------------------------------------------------------------------

#[test]
fn callers_first_declared_at_is_used_on_a_first_install() {
    let cmd = Register {
        first_declared_at: Some(t(2)),
        ..register("d1", set(&["a/#"]), t(5))
    };
    TestFramework::<ConsumerGroup>::with(())
        .given_no_previous_events()
        .when(cmd)
        .then_expect_events(vec![installed(
            attempt("d1", set(&["a/#"]), t(2), t(5)),
            None,
        )]);
}

#[test]
fn callers_first_declared_at_wins_over_the_remembered_wait() {
    let retry = Register {
        first_declared_at: Some(t(7)),
        live_instances: vec![live("w1", &["a/#"])],
        ..register("d1", set(&["b/#"]), t(20))
    };
    given_when(history_with_d1_waiting_since_t10(), retry).then_expect_events(vec![waiting(
        attempt("d1", set(&["b/#"]), t(7), t(20)),
        set(&["a/#"]),
        &["w1"],
    )]);
}

#[test]
fn first_declared_at_in_the_future_is_clamped_to_now() {
    let cmd = Register {
        first_declared_at: Some(t(99)),
        ..register("d1", set(&["a/#"]), t(5))
    };
    TestFramework::<ConsumerGroup>::with(())
        .given_no_previous_events()
        .when(cmd)
        .then_expect_events(vec![installed(
            attempt("d1", set(&["a/#"]), t(5), t(5)),
            None,
        )]);
}

#[test]
fn clamped_first_declared_at_shows_in_the_waiting_outcome() {
    let cmd = Register {
        first_declared_at: Some(t(99)),
        live_instances: vec![live("w1", &["a/#"])],
        ..register("d1", set(&["b/#"]), t(5))
    };
    match decide_ok(&[stored("d0", set(&["a/#"]))], &cmd) {
        RegisterOutcome::Waiting { declared_at, .. } => assert_eq!(declared_at, t(5)),
        other => panic!("expected to wait, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// 8. Refusals
// ---------------------------------------------------------------------------------------------

#[test]
fn another_topic_is_refused_naming_both_topics() {
    let cmd = Register {
        topic: topic("payments"),
        ..register("d1", set(&["b/#"]), t(5))
    };
    given_when(vec![stored("d0", set(&["a/#"]))], cmd).then_expect_error(
        DeclarationError::TopicMismatch {
            group: group(GROUP),
            bound: topic(TOPIC),
            requested: topic("payments"),
        },
    );
}

#[test]
fn topic_mismatch_message_names_both_topics() {
    let cmd = Register {
        topic: topic("payments"),
        ..register("d1", set(&["a/#"]), t(5))
    };
    let err =
        decide(&state(&[stored("d0", set(&["a/#"]))]), &cmd).expect_err("another topic is refused");
    let message = err.to_string();
    assert!(message.contains(TOPIC), "{message}");
    assert!(message.contains("payments"), "{message}");
}

#[test]
fn another_topic_is_refused_even_for_the_stored_set() {
    let cmd = Register {
        topic: topic("payments"),
        ..register("d1", set(&["a/#"]), t(5))
    };
    given_when(vec![stored("d0", set(&["a/#"]))], cmd).then_expect_error(
        DeclarationError::TopicMismatch {
            group: group(GROUP),
            bound: topic(TOPIC),
            requested: topic("payments"),
        },
    );
}

#[test]
fn command_for_another_group_is_refused() {
    let cmd = Register {
        group: group("shipping"),
        ..register("d1", set(&["a/#"]), t(5))
    };
    given_when(vec![stored("d0", set(&["a/#"]))], cmd).then_expect_error(
        DeclarationError::WrongAggregate {
            held: group(GROUP),
            requested: group("shipping"),
        },
    );
}

// ---------------------------------------------------------------------------------------------
// 9. Whole-topic (empty) sets
// ---------------------------------------------------------------------------------------------

#[test]
fn whole_topic_over_a_stored_set_waits_while_its_declarers_are_live() {
    let cmd = Register {
        live_instances: vec![live("w1", &["a/#"])],
        ..register("d1", whole_topic(), t(5))
    };
    given_when(vec![stored("d0", set(&["a/#"]))], cmd).then_expect_events(vec![waiting(
        attempt("d1", whole_topic(), t(5), t(5)),
        set(&["a/#"]),
        &["w1"],
    )]);
}

#[test]
fn a_set_over_stored_whole_topic_waits_while_whole_topic_instances_are_live() {
    let cmd = Register {
        live_instances: vec![live("w1", &[])],
        ..register("d1", set(&["a/#"]), t(5))
    };
    given_when(vec![stored("d0", whole_topic())], cmd).then_expect_events(vec![waiting(
        attempt("d1", set(&["a/#"]), t(5), t(5)),
        whole_topic(),
        &["w1"],
    )]);
}

#[test]
fn whole_topic_over_whole_topic_joins() {
    let history = [stored("d0", whole_topic())];
    let cmd = Register {
        live_instances: vec![live("d0", &[])],
        ..register("d1", whole_topic(), t(5))
    };
    assert_eq!(
        decide_ok(&history, &cmd),
        RegisterOutcome::Joined {
            effective: whole_topic(),
        }
    );
    given_when(history.to_vec(), cmd).then_expect_events(vec![]);
}

// ---------------------------------------------------------------------------------------------
// 10. apply(): the waiting book-keeping
// ---------------------------------------------------------------------------------------------

#[test]
fn install_closes_the_installers_wait() {
    let mut history = history_with_d1_waiting_since_t10();
    assert!(waits(&history).get(&declarer("d1")).is_some());

    history.push(installed(
        attempt("d1", set(&["b/#"]), t(10), t(30)),
        Some(set(&["a/#"])),
    ));
    let group = state(&history);
    assert!(waits(&history).is_empty());
    assert_eq!(group.effective_set(), set(&["b/#"]));
    assert_eq!(group.installs, 2);
}

#[test]
fn a_wait_is_open_with_its_set_and_first_declared_at() {
    let open: Vec<_> = waits(&history_with_d1_waiting_since_t10())
        .iter()
        .map(|(who, wait)| (who.clone(), wait.clone()))
        .collect();
    assert_eq!(
        open,
        vec![(
            declarer("d1"),
            OpenWait {
                patterns: set(&["b/#"]),
                declared_at: t(10),
            }
        )]
    );
}

#[test]
fn someone_else_installing_the_awaited_set_closes_the_wait() {
    let mut history = history_with_d1_waiting_since_t10();
    history.push(waiting(
        attempt("d4", set(&["z/#"]), t(12), t(12)),
        set(&["a/#"]),
        &["w1"],
    ));
    history.push(installed(
        attempt("d2", set(&["b/#"]), t(25), t(25)),
        Some(set(&["a/#"])),
    ));
    // Someone else installing d1's set ends d1's wait: its entry goes, so a later change of
    // the effective set cannot resurrect it as an open wait. d4 waits for another set.
    let open: Vec<_> = waits(&history).iter().map(|(who, _)| who.clone()).collect();
    assert_eq!(open, vec![declarer("d4")]);
}

#[test]
fn the_aggregate_state_does_not_grow_with_waits() {
    let mut history = vec![stored("d0", set(&["a/#"]))];
    let one = state(&history);
    for i in 0..100 {
        history.push(waiting(
            attempt(&format!("d{i}x"), set(&["b/#"]), t(i), t(i)),
            set(&["a/#"]),
            &["w1"],
        ));
    }
    assert_eq!(state(&history), one);
    assert_eq!(waits(&history).len(), 100);
}

#[test]
fn a_resolved_wait_does_not_come_back_when_the_set_changes_again() {
    let mut history = history_with_d1_waiting_since_t10();
    history.push(installed(
        attempt("d2", set(&["b/#"]), t(25), t(25)),
        Some(set(&["a/#"])),
    ));
    history.push(installed(
        attempt("d3", set(&["c/#"]), t(40), t(40)),
        Some(set(&["b/#"])),
    ));
    assert!(waits(&history).is_empty());
    // d1 asking for b/# again starts a new wait with a fresh declared_at.
    let cmd = Register {
        live_instances: vec![live("d3", &["c/#"])],
        ..register("d1", set(&["b/#"]), t(90))
    };
    let decision = decide(&state(&history), &observed(&history, cmd)).unwrap();
    let DeclarationEvent::Waiting { attempt, .. } = &decision.events[0] else {
        panic!("expected a waiting event, got {decision:?}");
    };
    assert_eq!(attempt.declared_at, t(90));
}

#[test]
fn an_open_wait_for_another_set_is_not_remembered() {
    let cmd = Register {
        live_instances: vec![live("w1", &["a/#"])],
        open_wait: Some(OpenWait {
            patterns: set(&["z/#"]),
            declared_at: t(1),
        }),
        ..register("d1", set(&["b/#"]), t(20))
    };
    match decide(&state(&history_with_d1_waiting_since_t10()), &cmd)
        .unwrap()
        .outcome
    {
        RegisterOutcome::Waiting { declared_at, .. } => assert_eq!(declared_at, t(20)),
        other => panic!("expected to wait, got {other:?}"),
    }
}

#[test]
fn a_declarer_never_waits_on_its_own_live_instance() {
    let history = vec![installed(attempt("d1", set(&["a/#"]), t(0), t(0)), None)];
    let decision = decide(
        &state(&history),
        &Register {
            live_instances: vec![live("d1", &["a/#"])],
            ..register("d1", set(&["b/#"]), t(5))
        },
    )
    .unwrap();
    assert!(matches!(
        decision.outcome,
        RegisterOutcome::Installed { .. }
    ));
}

#[test]
fn a_waiter_whose_set_was_installed_by_someone_else_joins() {
    let mut history = history_with_d1_waiting_since_t10();
    history.push(installed(
        attempt("d2", set(&["b/#"]), t(25), t(25)),
        Some(set(&["a/#"])),
    ));
    given_when(history, register("d1", set(&["b/#"]), t(30))).then_expect_events(vec![]);
}

#[test]
fn waiting_events_do_not_change_the_effective_set() {
    let group = state(&history_with_d1_waiting_since_t10());
    assert_eq!(group.effective_set(), set(&["a/#"]));
    assert_eq!(group.installs, 1);
}

#[test]
fn nothing_installed_means_whole_topic() {
    assert_eq!(ConsumerGroup::default().effective_set(), whole_topic());
}

// ---------------------------------------------------------------------------------------------
// 11. The version is recorded, never decides
// ---------------------------------------------------------------------------------------------

#[test]
fn same_set_with_another_version_joins() {
    let cmd = Register {
        version: version("2.0.0"),
        ..register("d1", set(&["a/#"]), t(5))
    };
    given_when(vec![stored("d0", set(&["a/#"]))], cmd).then_expect_events(vec![]);
}

#[test]
fn version_is_recorded_on_the_attempt() {
    let cmd = Register {
        version: version("2.0.0"),
        ..register("d1", set(&["b/#"]), t(5))
    };
    let mut expected = attempt("d1", set(&["b/#"]), t(5), t(5));
    expected.version = version("2.0.0");
    given_when(vec![stored("d0", set(&["a/#"]))], cmd)
        .then_expect_events(vec![installed(expected, Some(set(&["a/#"])))]);
}

// ---------------------------------------------------------------------------------------------
// The stored format
// ---------------------------------------------------------------------------------------------

#[test]
fn installed_event_json_is_pinned_and_round_trips() {
    let event = installed(
        attempt("d1", set(&["b/#", "a/+"]), t(10), t(30)),
        Some(set(&["a/#"])),
    );
    let value = serde_json::to_value(&event).expect("serializes");
    assert_eq!(
        value,
        json!({
            "kind": "installed",
            "group": GROUP,
            "topic": TOPIC,
            "declarer": "d1",
            "version": "1.0.0",
            "patterns": ["a/+", "b/#"],
            "declared_at": "2023-11-14T22:13:30Z",
            "attempt_at": "2023-11-14T22:13:50Z",
            "previous": ["a/#"],
        })
    );
    let back: DeclarationEvent = serde_json::from_value(value).expect("deserializes");
    assert_eq!(back, event);
}

#[test]
fn first_install_json_has_null_previous_and_round_trips() {
    let event = installed(attempt("d1", whole_topic(), t(0), t(0)), None);
    let value = serde_json::to_value(&event).expect("serializes");
    assert_eq!(value["kind"], "installed");
    assert_eq!(value["patterns"], json!([]));
    assert_eq!(value["previous"], json!(null));
    let back: DeclarationEvent = serde_json::from_value(value).expect("deserializes");
    assert_eq!(back, event);
}

#[test]
fn waiting_event_json_is_pinned_and_round_trips() {
    let event = waiting(
        attempt("d1", set(&["b/#"]), t(10), t(20)),
        set(&["a/#"]),
        &["w1", "w2"],
    );
    let value = serde_json::to_value(&event).expect("serializes");
    assert_eq!(
        value,
        json!({
            "kind": "waiting",
            "group": GROUP,
            "topic": TOPIC,
            "declarer": "d1",
            "version": "1.0.0",
            "patterns": ["b/#"],
            "declared_at": "2023-11-14T22:13:30Z",
            "attempt_at": "2023-11-14T22:13:40Z",
            "incumbent": ["a/#"],
            "live_declarers": ["w1", "w2"],
        })
    );
    let back: DeclarationEvent = serde_json::from_value(value).expect("deserializes");
    assert_eq!(back, event);
}

#[test]
fn stored_json_with_an_invalid_pattern_is_refused() {
    let value = json!({
        "kind": "installed",
        "group": GROUP,
        "topic": TOPIC,
        "declarer": "d1",
        "version": "1.0.0",
        "patterns": ["a/#/b"],
        "declared_at": "2023-11-14T22:13:30Z",
        "attempt_at": "2023-11-14T22:13:50Z",
        "previous": null,
    });
    assert!(serde_json::from_value::<DeclarationEvent>(value).is_err());
}

#[test]
fn event_type_names_and_version_are_pinned() {
    let install = stored("d0", set(&["a/#"]));
    let wait = waiting(
        attempt("d1", set(&["b/#"]), t(1), t(1)),
        set(&["a/#"]),
        &["w1"],
    );
    assert_eq!(install.event_type(), "DeclarationInstalled");
    assert_eq!(wait.event_type(), "DeclarationWaiting");
    assert_eq!(install.event_version(), "1.0");
    assert_eq!(wait.event_version(), "1.0");
    assert_eq!(ConsumerGroup::TYPE, "consumer_group");
}
