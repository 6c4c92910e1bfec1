//! One declaration attempt: the edge around the pure Register decision.
//!
//! Loads the group's events and live instances through the store's executor, folds
//! them into the aggregate, decides with the store's time, and hands back what to append.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use cqrs_es::Aggregate;
use wharf_domain::{
    decide, AppVersion, BindingSet, ConsumerGroup, DeclarationError, DeclarationEvent, DeclarerId,
    GroupName, LiveInstance, Register, RegisterOutcome, TopicName, ValidationError,
};
use wharf_store::{GroupLock, GroupSnapshot, GroupWrite, Heartbeat, NewEvent, Store, StoreError};

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
    Refused(DeclarationError),
    Corrupt(StoreError),
    /// The cached state is ahead of the ledger (it was restored or replaced): drop it, reload.
    Stale,
}

/// Each group's folded state as of a ledger sequence, kept by one `Wharf` (in memory, per
/// process) so an attempt loads only the events appended since. Pruning never changes a folded
/// state (ADR 0004), so a cached state stays exact; a ledger that moved backwards is detected and
/// the state reloaded in full.
#[derive(Clone, Default)]
pub(crate) struct GroupStates(Arc<Mutex<HashMap<String, (i64, ConsumerGroup)>>>);

impl GroupStates {
    fn get(&self, group: &str) -> (i64, ConsumerGroup) {
        self.lock().get(group).cloned().unwrap_or_default()
    }

    fn put(&self, group: &str, sequence: i64, state: ConsumerGroup) {
        let mut states = self.lock();
        let newer = states.get(group).is_none_or(|(held, _)| *held <= sequence);
        if newer {
            states.insert(group.to_owned(), (sequence, state));
        }
    }

    fn forget(&self, group: &str) {
        self.lock().remove(group);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (i64, ConsumerGroup)>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Everything one attempt needs besides the registration.
pub(crate) struct Attempter<'a> {
    pub store: &'a Store,
    pub states: &'a GroupStates,
    pub declarer: &'a DeclarerId,
    pub instance_ttl: std::time::Duration,
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
        // Optimistic first (two round trips on Postgres); after a conflict, locked, which
        // cannot conflict. A stale cache is dropped and the attempt run again.
        let mut locked = false;
        for _ in 0..3 {
            let (after_sequence, state) = self.states.get(group);
            let lock = GroupLock {
                group: group.to_owned(),
                topic: registration.topic.to_string(),
                instance_ttl: self.instance_ttl,
                after_sequence,
            };
            let decide = decision(
                state,
                registration.clone(),
                self.declarer.clone(),
                heartbeat,
                first_declared_at,
            );
            let attempt = if locked {
                self.store.execute_group(lock, decide).await
            } else {
                self.store.execute_optimistic(lock, decide).await
            };
            let decided = match attempt {
                Err(StoreError::Conflict { .. }) if !locked => {
                    locked = true;
                    continue;
                }
                other => other?,
            };
            match decided {
                Ok((outcome, next, sequence)) => {
                    self.states.put(group, sequence, next);
                    return Ok(outcome);
                }
                Err(AttemptError::Stale) => self.states.forget(group),
                Err(AttemptError::Refused(e)) => return Err(e.into()),
                Err(AttemptError::Corrupt(e)) => return Err(e.into()),
            }
        }
        Err(StoreError::decode(0, "the group's ledger changed under the state cache twice").into())
    }
}

type Decided = (RegisterOutcome, ConsumerGroup, i64);

/// The pure closure the locked executor runs: fold the new events into the cached state,
/// decide, and say what to write and what state results.
fn decision(
    mut state: ConsumerGroup,
    registration: Registration,
    declarer: DeclarerId,
    heartbeat: bool,
    first_declared_at: Option<DateTime<Utc>>,
) -> impl FnOnce(&GroupSnapshot) -> Result<(GroupWrite, Decided), AttemptError> + Send + 'static {
    move |snapshot| {
        if snapshot.stream_head < snapshot.after_sequence {
            return Err(AttemptError::Stale);
        }
        fold(&mut state, snapshot).map_err(AttemptError::Corrupt)?;
        let command = Register {
            group: registration.group.clone(),
            topic: registration.topic.clone(),
            declarer: declarer.clone(),
            version: registration.version.clone(),
            requested: registration.bindings.clone(),
            first_declared_at,
            now: snapshot.now,
            live_instances: live_instances(snapshot).map_err(AttemptError::Corrupt)?,
        };
        let decision = decide(&state, &command).map_err(AttemptError::Refused)?;
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
        let sequence = snapshot.last_sequence() + decision.events.len() as i64;
        for event in decision.events {
            state.apply(event);
        }
        Ok((
            GroupWrite {
                events,
                extra: heartbeat,
            },
            (decision.outcome, state, sequence),
        ))
    }
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
