//! The managed-filter ledger, branch by branch: given stored events, when a command, then the
//! events appended (cqrs-es's harness), plus the JSON form of the stored events.

use cqrs_es::test::TestFramework;
use cqrs_es::{Aggregate, DomainEvent};
use serde_json::json;
use wharf_domain::session::{
    ExactFilter, ForgottenFilter, ManagedFilterEvent, ManagedSession, ManagedSessionCommand,
    ManagedSessionError, Qos, RememberedFilter, SubAckEntry, SubscribeOutcome,
};

fn f(text: &str) -> ExactFilter {
    ExactFilter::parse(text).expect("valid filter")
}

fn filters(texts: &[&str]) -> Vec<ExactFilter> {
    texts.iter().map(|t| f(t)).collect()
}

fn seeded(texts: &[&str]) -> ManagedFilterEvent {
    ManagedFilterEvent::BaselineSeeded {
        filters: filters(texts),
        source: "cli".into(),
    }
}

/// One `FiltersRemembered` of the given filters, in the order given.
fn remembered_all(entries: &[(&str, Qos)]) -> ManagedFilterEvent {
    ManagedFilterEvent::FiltersRemembered {
        filters: entries
            .iter()
            .map(|(t, qos)| RememberedFilter {
                filter: f(t),
                qos: *qos,
            })
            .collect(),
    }
}

fn remembered(text: &str, qos: Qos) -> ManagedFilterEvent {
    remembered_all(&[(text, qos)])
}

/// One `FiltersForgotten` of the given filters, in the order given.
fn forgotten_all(entries: &[(&str, u8)]) -> ManagedFilterEvent {
    ManagedFilterEvent::FiltersForgotten {
        filters: entries
            .iter()
            .map(|(t, reason_code)| ForgottenFilter {
                filter: f(t),
                reason_code: *reason_code,
            })
            .collect(),
    }
}

fn forgotten(text: &str, reason_code: u8) -> ManagedFilterEvent {
    forgotten_all(&[(text, reason_code)])
}

fn acked(entries: &[(&str, Qos, SubscribeOutcome)]) -> ManagedFilterEvent {
    ManagedFilterEvent::SubscribesAcknowledged {
        outcomes: entries
            .iter()
            .map(|(t, requested, outcome)| SubAckEntry {
                filter: f(t),
                requested: *requested,
                outcome: *outcome,
            })
            .collect(),
    }
}

fn migration(reason: &str, texts: &[&str]) -> ManagedFilterEvent {
    ManagedFilterEvent::MigrationRequired {
        reason: reason.into(),
        filters: filters(texts),
    }
}

fn seed(texts: &[&str], source: &str) -> ManagedSessionCommand {
    ManagedSessionCommand::Seed {
        filters: filters(texts),
        source: source.into(),
    }
}

fn remember(entries: &[(&str, Qos)]) -> ManagedSessionCommand {
    ManagedSessionCommand::Remember {
        filters: entries.iter().map(|(t, q)| (f(t), *q)).collect(),
    }
}

fn forget(entries: &[(&str, u8)]) -> ManagedSessionCommand {
    ManagedSessionCommand::Forget {
        filters: entries.iter().map(|(t, r)| (f(t), *r)).collect(),
    }
}

fn given(events: Vec<ManagedFilterEvent>) -> cqrs_es::test::AggregateTestExecutor<ManagedSession> {
    TestFramework::<ManagedSession>::with(()).given(events)
}

fn fresh() -> cqrs_es::test::AggregateTestExecutor<ManagedSession> {
    TestFramework::<ManagedSession>::with(()).given_no_previous_events()
}

const Q0: Qos = Qos::AtMostOnce;
const Q1: Qos = Qos::AtLeastOnce;
const Q2: Qos = Qos::ExactlyOnce;

// --- Seed -------------------------------------------------------------------------------------

#[test]
fn first_seed_establishes_a_sorted_deduplicated_baseline() {
    fresh()
        .when(seed(
            &["sensors/#", "$share/g/sensors/#", "sensors/#"],
            "cli",
        ))
        .then_expect_events(vec![seeded(&["$share/g/sensors/#", "sensors/#"])]);
}

#[test]
fn an_empty_first_seed_is_an_explicit_empty_baseline() {
    fresh()
        .when(seed(&[], "cli"))
        .then_expect_events(vec![seeded(&[])]);
    let state = ManagedSession::fold(&[seeded(&[])]);
    assert!(state.is_known());
    assert_eq!(state.history.map(|h| h.len()), Some(0));
    assert!(!ManagedSession::default().is_known());
}

#[test]
fn a_later_seed_adds_only_the_missing_filters() {
    given(vec![seeded(&["a/#"]), remembered("b", Q1)])
        .when(seed(&["a/#", "b", "c/+"], "init"))
        .then_expect_events(vec![ManagedFilterEvent::BaselineExtended {
            filters: filters(&["c/+"]),
            source: "init".into(),
        }]);
}

#[test]
fn a_later_seed_of_known_filters_or_of_nothing_appends_nothing() {
    given(vec![seeded(&["a/#"])])
        .when(seed(&["a/#"], "cli"))
        .then_expect_events(vec![]);
    given(vec![seeded(&["a/#"])])
        .when(seed(&[], "cli"))
        .then_expect_events(vec![]);
}

#[test]
fn seeding_is_allowed_while_a_migration_is_required() {
    given(vec![seeded(&[]), migration("replay", &[])])
        .when(seed(&["x"], "cli"))
        .then_expect_events(vec![ManagedFilterEvent::BaselineExtended {
            filters: filters(&["x"]),
            source: "cli".into(),
        }]);
}

// --- Remember ---------------------------------------------------------------------------------

#[test]
fn remember_is_refused_while_the_history_is_unknown() {
    fresh()
        .when(remember(&[("a", Q1)]))
        .then_expect_error(ManagedSessionError::HistoryUnknown);
    let text = ManagedSessionError::HistoryUnknown.to_string();
    assert!(text.contains("wharf sessions seed"), "{text}");
}

#[test]
fn remember_records_new_filters_and_qos_changes_only() {
    given(vec![seeded(&["seeded/#"]), remembered("a", Q1)])
        .when(remember(&[
            ("a", Q1),
            ("a", Q1),
            ("b", Q0),
            ("seeded/#", Q2),
        ]))
        .then_expect_events(vec![remembered_all(&[("b", Q0), ("seeded/#", Q2)])]);
    given(vec![seeded(&[]), remembered("a", Q1)])
        .when(remember(&[("a", Q2)]))
        .then_expect_events(vec![remembered("a", Q2)]);
}

#[test]
fn remember_refuses_one_filter_at_two_qos_levels() {
    let err = ManagedSession::fold(&[seeded(&[])])
        .decide(&remember(&[("a", Q1), ("a", Q2)]))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "filter \"a\" is listed twice, at QoS 1 and QoS 2"
    );
}

#[test]
fn remember_is_refused_once_a_migration_is_required() {
    given(vec![
        seeded(&[]),
        migration("shared replay", &["$share/g/a"]),
    ])
    .when(remember(&[("a", Q1)]))
    .then_expect_error(ManagedSessionError::MigrationRequired {
        reason: "shared replay".into(),
    });
}

// --- RecordSubAck -----------------------------------------------------------------------------

#[test]
fn suback_outcomes_are_recorded_per_filter_and_kept_in_history() {
    let granted = SubscribeOutcome::Granted { qos: Q0 };
    let refused = SubscribeOutcome::Refused { reason_code: 0x87 };
    let cmd = ManagedSessionCommand::RecordSubAck {
        outcomes: vec![(f("a"), Q1, granted), (f("b"), Q1, refused)],
    };
    let history = vec![seeded(&[]), remembered("a", Q1), remembered("b", Q1)];
    let expected = vec![acked(&[("a", Q1, granted), ("b", Q1, refused)])];
    given(history.clone())
        .when(cmd)
        .then_expect_events(expected.clone());
    let state = ManagedSession::fold(history.iter().chain(&expected));
    let records = state.history.expect("known");
    assert_eq!(
        records.len(),
        2,
        "a refused or downgraded filter stays in history"
    );
    assert_eq!(records[&f("b")].last_ack.map(|a| a.outcome), Some(refused));
    assert!(!granted.satisfies(Q1));
    assert!(SubscribeOutcome::Granted { qos: Q2 }.satisfies(Q1));
}

#[test]
fn a_suback_that_repeats_what_the_ledger_says_appends_only_what_changed() {
    let granted = SubscribeOutcome::Granted { qos: Q1 };
    let downgraded = SubscribeOutcome::Granted { qos: Q0 };
    let refused = SubscribeOutcome::Refused { reason_code: 0x87 };
    let history = vec![
        seeded(&[]),
        remembered_all(&[("a", Q1), ("b", Q1), ("c", Q1)]),
        acked(&[("a", Q1, granted), ("b", Q1, granted), ("c", Q1, refused)]),
    ];
    // A reconnect granted the same: nothing to append.
    given(history.clone())
        .when(ManagedSessionCommand::RecordSubAck {
            outcomes: vec![
                (f("a"), Q1, granted),
                (f("b"), Q1, granted),
                (f("c"), Q1, refused),
            ],
        })
        .then_expect_events(vec![]);
    // One filter downgraded, one now granted: exactly those two, in the order given.
    given(history.clone())
        .when(ManagedSessionCommand::RecordSubAck {
            outcomes: vec![
                (f("c"), Q1, granted),
                (f("a"), Q1, granted),
                (f("b"), Q1, downgraded),
            ],
        })
        .then_expect_events(vec![acked(&[("c", Q1, granted), ("b", Q1, downgraded)])]);
}

#[test]
fn a_filter_remembered_again_records_its_next_suback_even_when_it_repeats_the_last() {
    let granted = SubscribeOutcome::Granted { qos: Q1 };
    let history = vec![
        seeded(&[]),
        remembered("a", Q1),
        acked(&[("a", Q1, granted)]),
        remembered("a", Q2),
    ];
    let state = ManagedSession::fold(history.iter());
    assert_eq!(
        state.history.expect("known")[&f("a")].last_ack,
        None,
        "remembered again: it awaits a new SUBACK"
    );
    given(history)
        .when(ManagedSessionCommand::RecordSubAck {
            outcomes: vec![(f("a"), Q1, granted)],
        })
        .then_expect_events(vec![acked(&[("a", Q1, granted)])]);
}

#[test]
fn a_suback_for_a_filter_never_remembered_is_refused() {
    given(vec![seeded(&[])])
        .when(ManagedSessionCommand::RecordSubAck {
            outcomes: vec![(f("x"), Q1, SubscribeOutcome::Granted { qos: Q1 })],
        })
        .then_expect_error(ManagedSessionError::NotInHistory { filter: f("x") });
    fresh()
        .when(ManagedSessionCommand::RecordSubAck { outcomes: vec![] })
        .then_expect_error(ManagedSessionError::HistoryUnknown);
}

// --- Forget -----------------------------------------------------------------------------------

#[test]
fn forget_removes_filters_on_0x00_and_0x11() {
    let history = vec![seeded(&["old/#", "$share/g/old/#"]), remembered("keep", Q1)];
    given(history.clone())
        .when(forget(&[
            ("old/#", 0x00),
            ("$share/g/old/#", 0x11),
            ("old/#", 0x00),
        ]))
        .then_expect_events(vec![forgotten_all(&[
            ("old/#", 0x00),
            ("$share/g/old/#", 0x11),
        ])]);
    let state = ManagedSession::fold(
        history
            .iter()
            .chain(&[forgotten_all(&[("old/#", 0x00), ("$share/g/old/#", 0x11)])]),
    );
    assert_eq!(state.history_filters(), filters(&["keep"]));
}

#[test]
fn forget_refuses_other_reason_codes_naming_the_filter() {
    let err = ManagedSession::fold(&[seeded(&["old/#"])])
        .decide(&forget(&[("old/#", 0x87)]))
        .unwrap_err();
    assert_eq!(
        err,
        ManagedSessionError::RemovalNotVerified {
            filter: f("old/#"),
            reason_code: 0x87
        }
    );
    assert!(
        err.to_string().contains("\"old/#\"") && err.to_string().contains("0x87"),
        "{err}"
    );
}

#[test]
fn forget_refuses_a_filter_not_in_history() {
    given(vec![seeded(&["a"])])
        .when(forget(&[("a", 0), ("b", 0)]))
        .then_expect_error(ManagedSessionError::NotInHistory { filter: f("b") });
    fresh()
        .when(forget(&[("a", 0)]))
        .then_expect_error(ManagedSessionError::HistoryUnknown);
}

#[test]
fn forget_is_refused_once_a_migration_is_required() {
    given(vec![seeded(&["a"]), migration("replay", &["a"])])
        .when(forget(&[("a", 0)]))
        .then_expect_error(ManagedSessionError::MigrationRequired {
            reason: "replay".into(),
        });
}

// --- RequireMigration -------------------------------------------------------------------------

#[test]
fn require_migration_is_recorded_and_keeps_history() {
    let history = vec![seeded(&["$share/g/a/#"])];
    given(history.clone())
        .when(ManagedSessionCommand::RequireMigration {
            reason: "replay through a removed shared filter".into(),
            filters: filters(&["$share/g/a/#", "$share/g/a/#"]),
        })
        .then_expect_events(vec![migration(
            "replay through a removed shared filter",
            &["$share/g/a/#"],
        )]);
    let state = ManagedSession::fold(history.iter().chain(&[migration("r", &["$share/g/a/#"])]));
    assert_eq!(state.migration_required.as_deref(), Some("r"));
    assert_eq!(state.history_filters(), filters(&["$share/g/a/#"]));
}

// --- Stored form ------------------------------------------------------------------------------

#[test]
fn payloads_are_the_variants_fields_and_types_name_the_variant() {
    let cases = [
        (
            seeded(&["a/#"]),
            "BaselineSeeded",
            json!({"filters": ["a/#"], "source": "cli"}),
        ),
        (
            ManagedFilterEvent::BaselineExtended {
                filters: filters(&["b"]),
                source: "init".into(),
            },
            "BaselineExtended",
            json!({"filters": ["b"], "source": "init"}),
        ),
        (
            remembered_all(&[("$share/g/x", Q1), ("y", Q2)]),
            "FiltersRemembered",
            json!({"filters": [{"filter": "$share/g/x", "qos": 1}, {"filter": "y", "qos": 2}]}),
        ),
        (
            acked(&[
                ("x", Q2, SubscribeOutcome::Granted { qos: Q1 }),
                ("y", Q1, SubscribeOutcome::Refused { reason_code: 135 }),
            ]),
            "SubscribesAcknowledged",
            json!({"outcomes": [
                {"filter": "x", "requested": 2, "outcome": {"granted": {"qos": 1}}},
                {"filter": "y", "requested": 1, "outcome": {"refused": {"reason_code": 135}}},
            ]}),
        ),
        (
            forgotten_all(&[("x", 17), ("z", 0)]),
            "FiltersForgotten",
            json!({"filters": [{"filter": "x", "reason_code": 17}, {"filter": "z", "reason_code": 0}]}),
        ),
        (
            migration("why", &["x"]),
            "MigrationRequired",
            json!({"reason": "why", "filters": ["x"]}),
        ),
    ];
    for (event, event_type, payload) in cases {
        assert_eq!(event.event_type(), event_type);
        assert_eq!(
            serde_json::to_value(&event).unwrap(),
            payload,
            "{event_type}"
        );
        assert_eq!(
            ManagedFilterEvent::decode(event_type, &payload.to_string()).unwrap(),
            event
        );
        let plain: ManagedFilterEvent = serde_json::from_value(payload).unwrap();
        if event_type != "BaselineExtended" {
            assert_eq!(plain, event, "plain Deserialize of {event_type}");
        }
    }
}

#[test]
fn decode_refuses_unknown_types_mismatched_bodies_and_invalid_filters() {
    assert!(ManagedFilterEvent::decode("Nope", "{}").is_err());
    let body = json!({"filters": [{"filter": "x", "reason_code": 0}]});
    assert!(ManagedFilterEvent::decode("FiltersRemembered", &body.to_string()).is_err());
    let bad = json!({"filters": [{"filter": "$share//x", "qos": 1}]});
    assert!(ManagedFilterEvent::decode("FiltersRemembered", &bad.to_string()).is_err());
    let seed_as_remember = json!({"filters": ["x"], "source": "cli"});
    assert!(
        ManagedFilterEvent::decode("FiltersRemembered", &seed_as_remember.to_string()).is_err()
    );
}

#[test]
fn a_plain_deserialize_of_an_extension_folds_to_the_same_state() {
    let events = [
        seeded(&["a"]),
        ManagedFilterEvent::BaselineExtended {
            filters: filters(&["b"]),
            source: "cli".into(),
        },
    ];
    let reread: Vec<ManagedFilterEvent> = events
        .iter()
        .map(|e| serde_json::from_value(serde_json::to_value(e).unwrap()).unwrap())
        .collect();
    assert_eq!(ManagedSession::fold(&reread), ManagedSession::fold(&events));
}

#[test]
fn the_state_round_trips_through_json() {
    let state = ManagedSession::fold(&[seeded(&["a", "$share/g/b"]), remembered("a", Q1)]);
    let json = serde_json::to_value(&state).unwrap();
    let back: ManagedSession = serde_json::from_value(json).unwrap();
    assert_eq!(back, state);
    assert_eq!(ManagedSession::TYPE, "managed_session");
}

#[test]
fn acknowledgements_and_forgets_never_make_an_unknown_history_known() {
    let ack = acked(&[("a", Q1, SubscribeOutcome::Granted { qos: Q1 })]);
    assert!(!ManagedSession::fold(&[ack, forgotten("a", 0)]).is_known());
}

#[test]
fn a_required_migration_is_resolved_by_the_operator_and_the_session_may_run_again() {
    let resolve = || ManagedSessionCommand::ResolveMigration {
        source: "cli".into(),
    };
    given(vec![
        seeded(&["a/#"]),
        migration("replay via $share/g/a/#", &["a/#"]),
    ])
    .when(resolve())
    .then_expect_events(vec![ManagedFilterEvent::MigrationResolved {
        source: "cli".into(),
    }]);
    given(vec![
        seeded(&["a/#"]),
        migration("replay", &["a/#"]),
        ManagedFilterEvent::MigrationResolved {
            source: "cli".into(),
        },
    ])
    .when(remember(&[("b/#", Qos::AtLeastOnce)]))
    .then_expect_events(vec![remembered("b/#", Qos::AtLeastOnce)]);
    given(vec![seeded(&[])])
        .when(resolve())
        .then_expect_error(ManagedSessionError::NoMigrationRequired);
}

#[test]
fn a_resolution_is_stored_with_its_source_only_and_decodes_exactly() {
    let event = ManagedFilterEvent::MigrationResolved {
        source: "cli".into(),
    };
    let payload = serde_json::to_value(&event).unwrap();
    assert_eq!(payload, serde_json::json!({ "source": "cli" }));
    let decoded = ManagedFilterEvent::decode("MigrationResolved", &payload.to_string()).unwrap();
    assert_eq!(decoded, event);
    assert!(ManagedFilterEvent::decode("MigrationResolved", "{}").is_err());
}
