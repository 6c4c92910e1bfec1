//! The open-waits projector (inline, ADR 0049): each group's declarers that wait, with the set
//! they wait for and when they first stated it, in `open_wait`.
//!
//! It follows [`wharf_domain::OpenWaits`] event by event: a `DeclarationWaiting` upserts its
//! declarer's row; a `DeclarationInstalled` deletes the installer's row and every row waiting
//! for the installed set. It runs in the append transaction (fused into the event's insert on
//! Postgres), so the register decision can read its own declarer's row by key under the same
//! lock that orders the appends, instead of folding every wait of the group's ledger. A rebuild
//! folds the same changes into its image of the table (ADR 0077).

use wharf_domain::declaration::AGGREGATE_TYPE;
use wharf_domain::DeclarationEvent;
use wharf_store::projector::{Column, EventView, OnConflict, RowChange, RowProjector, Test, Value};
use wharf_store::rebuild::Decoded;
use wharf_store::StoreError;

use crate::declaration::declaration;

/// Inline projector of `open_wait`.
pub struct OpenWaitRows;

impl OpenWaitRows {
    /// The projector's name.
    pub const NAME: &'static str = "open_waits";
    const TABLES: &'static [&'static str] = &["open_wait"];
}

const OPEN_WAIT_KEY: &[Column] = &["group_name", "declarer"];

impl RowProjector for OpenWaitRows {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn tables(&self) -> &'static [&'static str] {
        Self::TABLES
    }

    fn aggregate_types(&self) -> Option<&'static [&'static str]> {
        Some(&[AGGREGATE_TYPE])
    }

    fn changes(
        &self,
        event: &EventView<'_>,
        decoded: &mut Decoded,
        changes: &mut Vec<RowChange>,
    ) -> Result<(), StoreError> {
        let Some(declared) = declaration(event, decoded)? else {
            return Ok(());
        };
        let (group, declarer, set) = (&declared.group, &declared.declarer, &declared.set);
        let change = match &declared.event {
            DeclarationEvent::Waiting { attempt, .. } => RowChange::Upsert {
                table: "open_wait",
                key: OPEN_WAIT_KEY,
                columns: &["patterns", "declared_at"],
                values: vec![
                    group.clone(),
                    declarer.clone(),
                    set.clone(),
                    Value::Time(attempt.declared_at),
                ],
                on_conflict: OnConflict::SET,
            },
            DeclarationEvent::Installed { .. } => RowChange::DeleteWhere {
                table: "open_wait",
                within: ("group_name", group.clone()),
                tests: vec![Test::Any(vec![
                    Test::Eq("declarer", declarer.clone()),
                    Test::Eq("patterns", set.clone()),
                ])],
            },
        };
        changes.push(change);
        Ok(())
    }
}
