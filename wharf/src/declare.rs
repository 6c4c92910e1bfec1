//! One declaration attempt: the edge around the pure Register decision.
//!
//! Loads the group's events and live instances through the store's executor (optimistic
//! first, ADR 0037), folds them into the aggregate, decides with the store's time, and hands
//! back what to append, with the group's saved state every `declarations.snapshot_every`
//! events (ADR 0034).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use cqrs_es::Aggregate;
use wharf_domain::{
    decide, decode_group_state, encode_group_state, fold_group, is_current_format, AppVersion,
    BindingSet, ConsumerGroup, DeclarationError, DeclarationEvent, DeclarerId, GroupName,
    LiveInstance, OpenWait, Register, RegisterOutcome, TopicName, ValidationError,
    GROUP_STATE_FORMAT,
};
use wharf_store::{
    GroupExtra, GroupLock, GroupSnapshot, GroupWrite, Heartbeat, NewEvent, SavedGroupState, Store,
    StoreError,
};

use crate::error::WharfError;

/// A consumer group's full declaration: what an instance states at Register.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// The group.
    pub group: GroupName,
    /// The topic it consumes.
    pub topic: TopicName,
    /// The application's version (audit only).
    pub version: AppVersion,
    /// The full binding set; empty = the whole topic.
    pub bindings: BindingSet,
}

impl Registration {
    /// Validates every field, naming the first one that is wrong.
    pub fn new<S: AsRef<str>>(
        group: &str,
        topic: &str,
        version: &str,
        bindings: &[S],
    ) -> Result<Self, ValidationError> {
        Ok(Self {
            group: GroupName::parse("group", group)?,
            topic: TopicName::parse("topic", topic)?,
            version: AppVersion::parse("version", version)?,
            bindings: BindingSet::parse(bindings)?,
        })
    }
}

/// Why a decision inside the locked transaction failed.
enum AttemptError {
    /// The decision refused; the state (with the loaded events folded in) is still good.
    Refused(Box<(DeclarationError, Held)>),
    Corrupt(StoreError),
    /// The held state is ahead of the ledger (it was restored or replaced): drop it, reload.
    Stale,
}

/// One group's folded state as this process holds it.
pub(crate) struct Held {
    /// The stream sequence the state folds up to.
    sequence: i64,
    state: ConsumerGroup,
    /// The sequence of the group's saved state as far as this process knows (0: none).
    saved_at: i64,
    /// The saved state was refused (unknown format, undecodable, ahead of the ledger): write a
    /// good one at the next attempt, whatever the interval.
    rewrite: bool,
}

impl Held {
    fn empty(rewrite: bool) -> Self {
        Self {
            sequence: 0,
            state: ConsumerGroup::default(),
            saved_at: 0,
            rewrite,
        }
    }
}

/// One group's slot: its held state, behind an async lock that serializes this process's
/// attempts on the group (they serialize on the group's row lock anyway), so an attempt folds
/// into the held state in place instead of copying it.
type Slot = Arc<tokio::sync::Mutex<Option<Held>>>;

/// Each group's folded state as of a ledger sequence, kept by one `Wharf` (in memory, per
/// process) so an attempt loads only the events appended since. A group this process does not
/// hold yet starts from its saved state (ADR 0034), else from its first event. Pruning never
/// changes a folded state (ADR 0004), so a held or saved state stays exact; a ledger that moved
/// backwards is detected and the state reloaded in full.
#[derive(Clone, Default)]
pub(crate) struct GroupStates(Arc<Mutex<HashMap<String, Slot>>>);

impl GroupStates {
    fn slot(&self, group: &str) -> Slot {
        let mut slots = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        slots.entry(group.to_owned()).or_default().clone()
    }

    /// A copy of the group's held state and the sequence it folds up to, if held.
    pub(crate) async fn held(&self, group: &str) -> Option<(i64, ConsumerGroup)> {
        let slot = self.slot(group);
        let held = slot.lock().await;
        held.as_ref().map(|h| (h.sequence, h.state.clone()))
    }
}

/// Everything one attempt needs besides the registration.
pub(crate) struct Attempter<'a> {
    pub store: &'a Store,
    pub states: &'a GroupStates,
    pub declarer: &'a DeclarerId,
    pub instance_ttl: std::time::Duration,
    /// Save the group's state once its stream has grown this many events past the saved one
    /// (0: never).
    pub snapshot_every: u64,
}

impl Attempter<'_> {
    /// Runs one attempt: optimistic first (on Postgres an unlocked read and one checked write,
    /// ADR 0037), locked after a conflict. With `heartbeat`, a joined or installed outcome also
    /// records this instance's heartbeat in the same transaction, so no other declarer can swap
    /// the set between the join and the first heartbeat.
    pub(crate) async fn attempt(
        &self,
        registration: &Registration,
        heartbeat: bool,
        first_declared_at: Option<DateTime<Utc>>,
    ) -> Result<RegisterOutcome, WharfError> {
        let group = registration.group.as_str();
        let slot = self.states.slot(group);
        // Held across the attempt: a failed or cancelled attempt leaves the slot empty, and
        // the next one starts cold (from the saved state).
        let mut held = slot.lock().await;
        // Optimistic first (two round trips on Postgres); after a conflict, locked, which
        // cannot conflict, from the saved state (the held one went into the conflicted
        // decision). After a stale start, from the first event.
        let mut locked = false;
        let mut trust_saved = true;
        for _ in 0..3 {
            let start = match held.take() {
                Some(start) => start,
                None if trust_saved => self.cold_start(group).await?,
                None => Held::empty(true),
            };
            let lock = GroupLock {
                group: group.to_owned(),
                topic: registration.topic.to_string(),
                declarer: self.declarer.to_string(),
                instance_ttl: self.instance_ttl,
                after_sequence: start.sequence,
            };
            let decide = decision(
                start,
                registration.clone(),
                self.declarer.clone(),
                heartbeat,
                first_declared_at,
                self.snapshot_every,
            );
            let Some(decided) = self.store.attempt(lock, decide, &mut locked).await? else {
                continue;
            };
            match decided {
                Ok((outcome, next)) => {
                    *held = Some(next);
                    return Ok(outcome);
                }
                Err(AttemptError::Stale) => trust_saved = false,
                Err(AttemptError::Refused(refused)) => {
                    let (e, state) = *refused;
                    *held = Some(state);
                    return Err(e.into());
                }
                Err(AttemptError::Corrupt(e)) => return Err(e.into()),
            }
        }
        Err(StoreError::decode(0, "the group's ledger changed under the state cache twice").into())
    }

    /// The state a group this process does not hold starts from: its saved state when it has
    /// a readable one, else nothing (fold from the first event). A refused saved state is
    /// rewritten by the attempt.
    async fn cold_start(&self, group: &str) -> Result<Held, WharfError> {
        let Some(saved) = self.store.saved_group_state(group).await? else {
            return Ok(Held::empty(false));
        };
        if saved.stream_rewritten {
            tracing::warn!(
                group,
                sequence = saved.sequence,
                "ignoring the group's saved state: its stream was restored or replaced since \
                 (another event holds that sequence now); folding its events instead"
            );
            return Ok(Held::empty(true));
        }
        match decode_group_state(saved.format, &saved.state) {
            // A state in an older format is rewritten at the next attempt.
            Ok(state) => Ok(Held {
                sequence: saved.sequence,
                state,
                saved_at: saved.sequence,
                rewrite: !is_current_format(saved.format),
            }),
            Err(refused) => {
                tracing::warn!(
                    group,
                    sequence = saved.sequence,
                    %refused,
                    "ignoring the group's saved state; folding its events instead"
                );
                Ok(Held::empty(true))
            }
        }
    }
}

type Decided = (RegisterOutcome, Held);

/// The pure closure the locked executor runs: fold the new events into the held state,
/// decide, and say what to write (with the group's saved state when one is due) and what state
/// results.
fn decision(
    mut held: Held,
    registration: Registration,
    declarer: DeclarerId,
    heartbeat: bool,
    first_declared_at: Option<DateTime<Utc>>,
    snapshot_every: u64,
) -> impl FnOnce(&GroupSnapshot) -> Result<(GroupWrite, Decided), AttemptError> + Send + 'static {
    move |snapshot| {
        if snapshot.stream_head < snapshot.after_sequence {
            return Err(AttemptError::Stale);
        }
        fold(&mut held.state, snapshot).map_err(AttemptError::Corrupt)?;
        held.sequence = snapshot.last_sequence();
        let command = Register {
            group: registration.group.clone(),
            topic: registration.topic.clone(),
            declarer: declarer.clone(),
            version: registration.version.clone(),
            requested: registration.bindings.clone(),
            first_declared_at,
            now: snapshot.now,
            live_instances: live_instances(snapshot).map_err(AttemptError::Corrupt)?,
            open_wait: open_wait(snapshot).map_err(AttemptError::Corrupt)?,
        };
        let decision = match decide(&held.state, &command) {
            Ok(decision) => decision,
            Err(e) => return Err(AttemptError::Refused(Box::new((e, held)))),
        };
        let metadata = serde_json::json!({
            "declarer": declarer.as_str(),
            "wharf_version": env!("CARGO_PKG_VERSION"),
        });
        let events = decision
            .events
            .iter()
            .map(|event| NewEvent::from_domain(event, metadata.clone()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(AttemptError::Corrupt)?;
        let heartbeat = (heartbeat && decision.outcome.may_consume()).then(|| Heartbeat {
            declarer: declarer.to_string(),
            version: registration.version.to_string(),
            patterns: registration.bindings.patterns(),
        });
        held.sequence += decision.events.len() as i64;
        fold_group(&mut held.state, decision.events);
        let saved_state = save_due(&held, snapshot_every).then(|| SavedGroupState {
            group: registration.group.to_string(),
            sequence: held.sequence,
            format: GROUP_STATE_FORMAT,
            state: encode_group_state(&held.state),
            stream_rewritten: false,
        });
        if saved_state.is_some() {
            held.saved_at = held.sequence;
            held.rewrite = false;
        }
        let extra = (heartbeat.is_some() || saved_state.is_some()).then_some(GroupExtra {
            heartbeat,
            saved_state,
        });
        Ok((GroupWrite { events, extra }, (decision.outcome, held)))
    }
}

/// Whether the attempt saves the group's state: the saved one was refused, or the stream has
/// grown `every` events past it. Never for an empty stream, never with `every` 0.
fn save_due(held: &Held, every: u64) -> bool {
    if held.sequence == 0 || every == 0 {
        return false;
    }
    held.rewrite || held.sequence - held.saved_at >= i64::try_from(every).unwrap_or(i64::MAX)
}

/// Folds the snapshot's events into the aggregate.
fn fold(state: &mut ConsumerGroup, snapshot: &GroupSnapshot) -> Result<(), StoreError> {
    for event in &snapshot.events {
        state.apply(event.decode::<DeclarationEvent>()?);
    }
    Ok(())
}

fn live_instances(snapshot: &GroupSnapshot) -> Result<Vec<LiveInstance>, StoreError> {
    snapshot
        .observed
        .live
        .iter()
        .map(|row| {
            Ok(LiveInstance {
                declarer: DeclarerId::parse("declarer", &row.declarer)
                    .map_err(|e| StoreError::decode(0, e))?,
                patterns: BindingSet::parse(&row.patterns).map_err(|e| StoreError::decode(0, e))?,
            })
        })
        .collect()
}

/// The attempting declarer's open wait, as the store observed it.
fn open_wait(snapshot: &GroupSnapshot) -> Result<Option<OpenWait>, StoreError> {
    let Some(row) = &snapshot.observed.open_wait else {
        return Ok(None);
    };
    Ok(Some(OpenWait {
        patterns: BindingSet::parse(&row.patterns).map_err(|e| StoreError::decode(0, e))?,
        declared_at: row.declared_at,
    }))
}
