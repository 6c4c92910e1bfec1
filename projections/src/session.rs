//! The managed-session projector (inline): each durable session identity's exact history.
//!
//! `managed_session` has a row once a baseline was seeded (no row: the history is unknown);
//! `managed_filter` holds every filter that may exist at the broker for it, with the newest
//! SUBACK outcome. A `FiltersForgotten` removes its rows. Each event's rows are changes over
//! all its filters at once (ADR 0077): on Postgres they ride in the event's insert statement
//! (one round trip per event), each as one statement over arrays; a rebuild folds them into
//! its image of the tables.

use wharf_domain::session::{
    ExactFilter, ManagedFilterEvent, Qos, SubscribeOutcome, MANAGED_SESSION_AGGREGATE,
};
use wharf_store::projector::{Column, EventView, OnConflict, RowChange, RowProjector, Value};
use wharf_store::rebuild::Decoded;
use wharf_store::StoreError;

/// Inline projector of `managed_session` and `managed_filter`.
pub struct ManagedSessions;

impl ManagedSessions {
    /// The projector's name.
    pub const NAME: &'static str = "managed_sessions";
    const TABLES: &'static [&'static str] = &["managed_session", "managed_filter"];
}

const SESSION_KEY: &[Column] = &["session_id"];
const FILTER_KEY: &[Column] = &["session_id", "filter"];

/// A filter row's state and outcome columns after a SUBACK.
fn acknowledged(outcome: SubscribeOutcome) -> (&'static str, Option<i64>, Option<i64>) {
    match outcome {
        SubscribeOutcome::Granted { qos } => ("granted", Some(qos_column(qos)), None),
        SubscribeOutcome::Refused { reason_code } => {
            ("refused", None, Some(i64::from(reason_code)))
        }
    }
}

fn qos_column(qos: Qos) -> i64 {
    i64::from(qos.level())
}

fn names<'a>(filters: impl Iterator<Item = &'a ExactFilter>) -> Value {
    Value::EachText(filters.map(|f| f.as_str().to_owned()).collect())
}

/// The session's row touched: its newest event's position.
fn touched(session: Value) -> RowChange {
    RowChange::Update {
        table: "managed_session",
        key: SESSION_KEY,
        columns: &["last_position"],
        values: vec![session, Value::Position],
    }
}

/// Seeded filters, added unless known.
fn seeded(session: Value, filters: &[ExactFilter]) -> RowChange {
    RowChange::Upsert {
        table: "managed_filter",
        key: FILTER_KEY,
        columns: &["state", "since_position", "updated_position"],
        values: vec![
            session,
            names(filters.iter()),
            Value::Const("seeded"),
            Value::Position,
            Value::Position,
        ],
        on_conflict: OnConflict::Nothing,
    }
}

impl RowProjector for ManagedSessions {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn tables(&self) -> &'static [&'static str] {
        Self::TABLES
    }

    fn aggregate_types(&self) -> Option<&'static [&'static str]> {
        Some(&[MANAGED_SESSION_AGGREGATE])
    }

    fn changes(
        &self,
        event: &EventView<'_>,
        decoded: &mut Decoded,
        changes: &mut Vec<RowChange>,
    ) -> Result<(), StoreError> {
        if event.aggregate_type != MANAGED_SESSION_AGGREGATE {
            return Ok(());
        }
        let decoded = event.decode_with(decoded, ManagedFilterEvent::decode)?;
        let session = Value::text(event.aggregate_id);
        let session = || session.clone();
        let stated = match decoded {
            ManagedFilterEvent::BaselineSeeded { filters, source } => vec![
                RowChange::Upsert {
                    table: "managed_session",
                    key: SESSION_KEY,
                    columns: &["baseline_source", "last_position"],
                    values: vec![session(), Value::text(source), Value::Position],
                    on_conflict: OnConflict::Update {
                        keep: &["baseline_source"],
                        counter: None,
                        if_greater: None,
                    },
                },
                seeded(session(), filters),
            ],
            ManagedFilterEvent::BaselineExtended { filters, .. } => {
                vec![seeded(session(), filters), touched(session())]
            }
            // Remembered again: a known filter's outcome is cleared, its `since_position` kept.
            ManagedFilterEvent::FiltersRemembered { filters } => vec![
                RowChange::Upsert {
                    table: "managed_filter",
                    key: FILTER_KEY,
                    columns: &[
                        "state",
                        "requested_qos",
                        "granted_qos",
                        "reason_code",
                        "since_position",
                        "updated_position",
                    ],
                    values: vec![
                        session(),
                        names(filters.iter().map(|r| &r.filter)),
                        Value::Const("remembered"),
                        Value::EachInt(filters.iter().map(|r| Some(qos_column(r.qos))).collect()),
                        Value::Null,
                        Value::Null,
                        Value::Position,
                        Value::Position,
                    ],
                    on_conflict: OnConflict::Update {
                        keep: &["since_position"],
                        counter: None,
                        if_greater: None,
                    },
                },
                touched(session()),
            ],
            ManagedFilterEvent::SubscribesAcknowledged { outcomes } => {
                let answers: Vec<_> = outcomes.iter().map(|e| acknowledged(e.outcome)).collect();
                vec![
                    RowChange::Update {
                        table: "managed_filter",
                        key: FILTER_KEY,
                        columns: &[
                            "state",
                            "requested_qos",
                            "granted_qos",
                            "reason_code",
                            "updated_position",
                        ],
                        values: vec![
                            session(),
                            names(outcomes.iter().map(|e| &e.filter)),
                            Value::EachText(answers.iter().map(|a| a.0.to_owned()).collect()),
                            Value::EachInt(
                                outcomes
                                    .iter()
                                    .map(|e| Some(qos_column(e.requested)))
                                    .collect(),
                            ),
                            Value::EachInt(answers.iter().map(|a| a.1).collect()),
                            Value::EachInt(answers.iter().map(|a| a.2).collect()),
                            Value::Position,
                        ],
                    },
                    touched(session()),
                ]
            }
            ManagedFilterEvent::FiltersForgotten { filters } => vec![
                RowChange::Delete {
                    table: "managed_filter",
                    key: FILTER_KEY,
                    values: vec![session(), names(filters.iter().map(|f| &f.filter))],
                },
                touched(session()),
            ],
            ManagedFilterEvent::MigrationRequired { reason, .. } => {
                vec![migration(session(), Value::text(reason))]
            }
            ManagedFilterEvent::MigrationResolved { .. } => vec![migration(session(), Value::Null)],
        };
        changes.extend(stated);
        Ok(())
    }
}

/// The session's row touched, with why it needs a migration (`NULL`: it no longer does).
fn migration(session: Value, reason: Value) -> RowChange {
    RowChange::Update {
        table: "managed_session",
        key: SESSION_KEY,
        columns: &["last_position", "migration_required"],
        values: vec![session, Value::Position, reason],
    }
}
