//! Group snapshots' maintenance (ADR 0034): re-deriving them after a rebuild, and verifying them.
//!
//! A group snapshot is a saved [`ConsumerGroup`] as of a sequence of the group's stream; a
//! process that does not hold the group yet starts from it and folds only the events after it.
//! It is derived data, so it is checked against the only source of truth, the events: a saved
//! state is right when it, with the events after its sequence folded in, equals a fold of the
//! whole stream. That is what a cold load computes, and it stays true across a prune (ADR 0004):
//! the pruner may delete a superseded wait at or below the snapshot's sequence whose newer
//! event is above it, so a fold of only the events up to the sequence may legitimately differ
//! from a snapshot taken before the prune, while the fold a load makes does not.

use wharf_domain::declaration::AGGREGATE_TYPE;
use wharf_domain::{
    decode_group_state, encode_group_state, fold_group, ConsumerGroup, DeclarationEvent,
    GROUP_STATE_FORMAT,
};
use wharf_store::{RecordedEvent, SavedGroupState, Store, StoreError};

/// How many saved states a verify reads per page.
const VERIFY_PAGE: i64 = 100;

/// A saved state a verify did not accept, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotFinding {
    /// The group.
    pub group: String,
    /// The sequence the saved state claims to fold up to.
    pub sequence: i64,
    /// What is wrong with it.
    pub problem: String,
}

/// What a verify of the saved states found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotReport {
    /// How many saved states were read.
    pub checked: u64,
    /// Saved states a load would decode into a wrong state.
    pub wrong: Vec<SnapshotFinding>,
    /// Saved states every load ignores (a format this build does not read, a sequence above
    /// the stream's head): harmless, rewritten at the group's next attempt.
    pub ignored: Vec<SnapshotFinding>,
}

impl SnapshotReport {
    /// True when no saved state is wrong.
    pub fn is_clean(&self) -> bool {
        self.wrong.is_empty()
    }
}

fn fold_events(state: &mut ConsumerGroup, events: &[RecordedEvent]) -> Result<(), StoreError> {
    let decoded = events
        .iter()
        .map(|event| event.decode::<DeclarationEvent>())
        .collect::<Result<Vec<_>, _>>()?;
    fold_group(state, decoded);
    Ok(())
}

/// Replaces every saved group state with one re-derived from the events: one per group whose
/// stream holds at least `min_events` events, as of its newest event (none when `min_events`
/// is 0). Returns how many were written. Safe beside running attempts: a state derived from a
/// stream's events up to a sequence stays right for that sequence, whatever is appended later.
pub async fn rederive(store: &Store, min_events: u64) -> Result<u64, StoreError> {
    let mut saved = Vec::new();
    if min_events > 0 {
        let floor = i64::try_from(min_events).unwrap_or(i64::MAX);
        for stream in store.stream_heads(AGGREGATE_TYPE).await? {
            if stream.head < floor {
                continue;
            }
            let events = store.load(AGGREGATE_TYPE, &stream.aggregate_id).await?;
            let mut state = ConsumerGroup::default();
            fold_events(&mut state, &events)?;
            let sequence = events.last().map_or(0, |e| e.sequence);
            saved.push(SavedGroupState {
                group: stream.aggregate_id,
                sequence,
                format: GROUP_STATE_FORMAT,
                state: encode_group_state(&state),
                stream_rewritten: false,
            });
        }
    }
    let written = saved.len() as u64;
    store.replace_saved_group_states(saved).await?;
    Ok(written)
}

/// Checks every saved group state against its group's events (see the module doc).
pub async fn verify(store: &Store) -> Result<SnapshotReport, StoreError> {
    let mut report = SnapshotReport::default();
    let mut after = String::new();
    loop {
        let page = store.saved_group_states(after.clone(), VERIFY_PAGE).await?;
        let Some(last) = page.last() else {
            break;
        };
        after = last.group.clone();
        for saved in page {
            report.checked += 1;
            check(store, saved, &mut report).await?;
        }
    }
    Ok(report)
}

async fn check(
    store: &Store,
    saved: SavedGroupState,
    report: &mut SnapshotReport,
) -> Result<(), StoreError> {
    let finding = |problem: String| SnapshotFinding {
        group: saved.group.clone(),
        sequence: saved.sequence,
        problem,
    };
    if saved.stream_rewritten {
        report.ignored.push(finding(
            "another event holds its sequence now (the stream was restored or replaced since \
             it was saved): ignored by loads"
                .to_owned(),
        ));
        return Ok(());
    }
    let events = store.load(AGGREGATE_TYPE, &saved.group).await?;
    let head = events.last().map_or(0, |e| e.sequence);
    if saved.sequence > head {
        report.ignored.push(finding(format!(
            "its sequence is above the stream's head {head}: ignored by loads"
        )));
        return Ok(());
    }
    let mut from_saved = match decode_group_state(saved.format, &saved.state) {
        Ok(state) => state,
        Err(refused @ wharf_domain::StateRefused::Format { .. }) => {
            report
                .ignored
                .push(finding(format!("{refused}: ignored by loads")));
            return Ok(());
        }
        Err(refused) => {
            report.wrong.push(finding(refused.to_string()));
            return Ok(());
        }
    };
    let after: Vec<RecordedEvent> = events
        .iter()
        .filter(|e| e.sequence > saved.sequence)
        .cloned()
        .collect();
    fold_events(&mut from_saved, &after)?;
    let mut full = ConsumerGroup::default();
    fold_events(&mut full, &events)?;
    if from_saved != full {
        report.wrong.push(finding(format!(
            "the saved state with the {} events after it folded in differs from a fold of the \
             stream's {} events",
            after.len(),
            events.len()
        )));
    }
    Ok(())
}
