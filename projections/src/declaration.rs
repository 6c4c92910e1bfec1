//! The declaration projectors.
//!
//! - [`EffectiveBindings`] (inline): the group's effective declaration, whose `patterns` are
//!   the binding set that routes and claims read (`binding` is a view that unnests them, ADR
//!   0064). Runs inside the install/swap transaction, so the set changes in the same commit as
//!   the ledger and a reader sees exactly one declared set.
//! - [`DeclarerAttempts`] (catch-up): each declarer's newest attempt per group, from which the
//!   listing derives open waiters. An install also marks every other waiter for the same set
//!   `resolved`, mirroring the aggregate: those declarers join without appending anything.
//!   Beside them, `waiting_group` names each group that has a waiting attempt, in the same
//!   transaction, so the page of waiting groups walks one index (ADR 0060).

use wharf_domain::declaration::AGGREGATE_TYPE;
use wharf_domain::{BindingSet, DeclarationEvent};
use wharf_store::projector::{
    Column, EventView, Exists, OnConflict, RowChange, RowProjector, Test, Value,
};
use wharf_store::rebuild::Decoded;
use wharf_store::StoreError;

/// A declaration event with the values every declaration projector's rows name, built once
/// per event: the projectors share them (a [`Value`]'s text is shared, not copied).
pub(crate) struct Declared {
    pub(crate) event: DeclarationEvent,
    pub(crate) group: Value,
    pub(crate) declarer: Value,
    /// The attempt's set.
    pub(crate) set: Value,
}

/// The event's declaration, decoded once for every projector of the event (`None` for other
/// aggregates).
pub(crate) fn declaration<'d>(
    event: &EventView<'_>,
    decoded: &'d mut Decoded,
) -> Result<Option<&'d Declared>, StoreError> {
    if event.aggregate_type != AGGREGATE_TYPE {
        return Ok(None);
    }
    event
        .decode_with(decoded, |_, payload| {
            serde_json::from_str::<DeclarationEvent>(payload).map(|event| {
                let attempt = event.attempt();
                Declared {
                    group: Value::text(attempt.group.as_str()),
                    declarer: Value::text(attempt.declarer.as_str()),
                    set: Value::list(attempt.patterns.patterns()),
                    event,
                }
            })
        })
        .map(Some)
}

/// Inline projector of `effective_declaration`, each group's installed set (the `binding` view
/// unnests its patterns).
pub struct EffectiveBindings;

impl EffectiveBindings {
    /// The projector's name.
    pub const NAME: &'static str = "effective_bindings";
    const TABLES: &'static [&'static str] = &["effective_declaration"];
}

const EFFECTIVE_COLUMNS: &[Column] = &[
    "topic",
    "declarer",
    "version",
    "patterns",
    "previous",
    "declared_at",
    "attempt_at",
    "position",
];

impl RowProjector for EffectiveBindings {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn tables(&self) -> &'static [&'static str] {
        Self::TABLES
    }

    fn aggregate_types(&self) -> Option<&'static [&'static str]> {
        Some(&[AGGREGATE_TYPE])
    }

    /// An install replaces its group's row, patterns included, and counts it. Readers see the
    /// row at commit, or not at all (on Postgres it rides in the event's insert).
    fn changes(
        &self,
        event: &EventView<'_>,
        decoded: &mut Decoded,
        changes: &mut Vec<RowChange>,
    ) -> Result<(), StoreError> {
        let Some(declared) = declaration(event, decoded)? else {
            return Ok(());
        };
        let DeclarationEvent::Installed { attempt, previous } = &declared.event else {
            return Ok(());
        };
        changes.push(RowChange::Upsert {
            table: "effective_declaration",
            key: &["group_name"],
            columns: EFFECTIVE_COLUMNS,
            values: vec![
                declared.group.clone(),
                Value::text(attempt.topic.as_str()),
                declared.declarer.clone(),
                Value::text(attempt.version.as_str()),
                declared.set.clone(),
                Value::list_or_null(previous.as_ref().map(BindingSet::patterns)),
                Value::Time(attempt.declared_at),
                Value::Time(attempt.attempt_at),
                Value::Position,
            ],
            on_conflict: OnConflict::Update {
                keep: &[],
                counter: Some("installs"),
                if_greater: None,
            },
        });
        Ok(())
    }
}

/// Catch-up projector of each declarer's newest attempt per group (`declarer_attempt`), and of
/// the groups that have a waiting one (`waiting_group`).
pub struct DeclarerAttempts;

impl DeclarerAttempts {
    /// The projector's name (its checkpoint key).
    pub const NAME: &'static str = "declarer_attempts";
    const TABLES: &'static [&'static str] = &["declarer_attempt", "waiting_group"];
}

const ATTEMPT_KEY: &[Column] = &["group_name", "declarer"];
const ATTEMPT_COLUMNS: &[Column] = &[
    "status",
    "version",
    "patterns",
    "incumbent",
    "declared_at",
    "attempt_at",
    "position",
];
const WAITING_GROUP_KEY: &[Column] = &["group_name"];

impl RowProjector for DeclarerAttempts {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn tables(&self) -> &'static [&'static str] {
        Self::TABLES
    }

    fn aggregate_types(&self) -> Option<&'static [&'static str]> {
        Some(&[AGGREGATE_TYPE])
    }

    /// Every attempt becomes its declarer's row, when newer than the row's. A wait names its
    /// group in `waiting_group` (events apply in position order, so the wait is then its
    /// declarer's newest attempt). An install resolves the group's other waiters for its set
    /// and drops the group from `waiting_group` unless an attempt is left waiting: the ones
    /// neither the install nor the resolution touch (on Postgres the three are one statement,
    /// whose drop cannot see the other two's rows).
    fn changes(
        &self,
        event: &EventView<'_>,
        decoded: &mut Decoded,
        changes: &mut Vec<RowChange>,
    ) -> Result<(), StoreError> {
        let Some(declared) = declaration(event, decoded)? else {
            return Ok(());
        };
        let (attempt, status, incumbent) = match &declared.event {
            DeclarationEvent::Installed { attempt, .. } => (attempt, "installed", None),
            DeclarationEvent::Waiting {
                attempt, incumbent, ..
            } => (attempt, "waiting", Some(incumbent)),
        };
        let (group, declarer, set) = (&declared.group, &declared.declarer, &declared.set);
        let recorded = RowChange::Upsert {
            table: "declarer_attempt",
            key: ATTEMPT_KEY,
            columns: ATTEMPT_COLUMNS,
            values: vec![
                group.clone(),
                declarer.clone(),
                Value::Const(status),
                Value::text(attempt.version.as_str()),
                set.clone(),
                Value::list_or_null(incumbent.map(BindingSet::patterns)),
                Value::Time(attempt.declared_at),
                Value::Time(attempt.attempt_at),
                Value::Position,
            ],
            on_conflict: OnConflict::Update {
                keep: &[],
                counter: None,
                if_greater: Some("position"),
            },
        };
        if incumbent.is_some() {
            let named = RowChange::Upsert {
                table: "waiting_group",
                key: WAITING_GROUP_KEY,
                columns: &[],
                values: vec![group.clone()],
                on_conflict: OnConflict::Nothing,
            };
            changes.extend([recorded, named]);
            return Ok(());
        }
        let waiting = || Test::Eq("status", Value::Const("waiting"));
        let resolved = RowChange::UpdateWhere {
            table: "declarer_attempt",
            within: ("group_name", group.clone()),
            tests: vec![
                waiting(),
                Test::Eq("patterns", set.clone()),
                Test::Ne("declarer", declarer.clone()),
            ],
            columns: &["status"],
            values: vec![Value::Const("resolved")],
        };
        let unnamed = RowChange::DeleteUnless {
            table: "waiting_group",
            key: WAITING_GROUP_KEY,
            values: vec![group.clone()],
            unless: Exists {
                table: "declarer_attempt",
                within: ("group_name", group.clone()),
                tests: vec![
                    waiting(),
                    Test::Ne("declarer", declarer.clone()),
                    Test::Ne("patterns", set.clone()),
                ],
            },
        };
        changes.extend([recorded, resolved, unnamed]);
        Ok(())
    }
}
