//! One declaration attempt: the edge around the pure Register decision.
//!
//! Loads the group's events and live instances through the store's executor, folds them into
//! the aggregate, decides with the store's time, and hands back what to append, with the
//! group's saved state every `declarations.snapshot_every` events (ADR 0034). A group this
//! process attempted on last is decided without a read, on what that attempt left it knowing
//! (speculative, ADR 0052: one round trip on Postgres, its write checks those inputs); a miss
//! runs optimistic (ADR 0037), and a conflict there runs locked.

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
    Assumed, AttemptForm, GroupExtra, GroupLock, GroupObserved, GroupSnapshot, GroupWrite,
    Heartbeat, LiveInstanceRow, NewEvent, OpenWaitRow, SavedGroupState, Store, StoreError,
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
#[derive(Clone)]
pub(crate) struct Held {
    /// The stream sequence the state folds up to.
    sequence: i64,
    state: ConsumerGroup,
    /// The sequence of the group's saved state as far as this process knows (0: none).
    saved_at: i64,
    /// The saved state was refused (unknown format, undecodable, ahead of the ledger): write a
    /// good one at the next attempt, whatever the interval.
    rewrite: bool,
    /// What this process's last attempt on the group left it knowing, for a speculative next
    /// one (ADR 0052); `None` after a cold start, on SQLite, and when the next attempt should
    /// read first: after a miss, or after an attempt that found events it did not hold
    /// (another writer is active on the group, so a speculation would likely miss: a
    /// statement wasted and an error in the server's log; a group written by several
    /// processes in turn then reads first every time, as before ADR 0052).
    known: Option<Known>,
}

impl Held {
    fn empty(rewrite: bool) -> Self {
        Self {
            sequence: 0,
            state: ConsumerGroup::default(),
            saved_at: 0,
            rewrite,
            known: None,
        }
    }

    /// The inputs to assume for `declarer`'s next attempt, when this process may speculate.
    fn assumed_for(&self, declarer: &DeclarerId) -> Option<Assumed<GroupObserved>> {
        let known = self.known.as_ref()?;
        let open_wait = if known.declarer == declarer.as_str() {
            known.observed.open_wait.clone()
        } else {
            // Another declarer of this process: most declarers never wait; a wrong guess is
            // a miss, not a wrong decision.
            None
        };
        Some(Assumed {
            version: known.version,
            not_before: known.decided_at,
            observed: GroupObserved {
                live: known.observed.live.clone(),
                open_wait,
            },
        })
    }
}

/// A group's lock-row version after this process's last attempt on it, and what that attempt
/// observed with its own writes applied (its heartbeat, its declarer's open wait).
#[derive(Clone)]
struct Known {
    version: i64,
    /// Whose open wait `observed.open_wait` is.
    declarer: String,
    observed: GroupObserved,
    /// The store time that attempt decided at.
    decided_at: DateTime<Utc>,
}

/// What a decided attempt leaves the group observing: the snapshot's observation with the
/// attempt's own writes applied.
fn observed_after(
    mut observed: GroupObserved,
    declarer: &DeclarerId,
    heartbeat: Option<&Heartbeat>,
    events: &[DeclarationEvent],
) -> GroupObserved {
    if let Some(heartbeat) = heartbeat {
        let row = LiveInstanceRow {
            declarer: heartbeat.declarer.clone(),
            patterns: heartbeat.patterns.clone(),
        };
        // Byte order, as the observation sorts it (`COLLATE "C"`).
        let live = &mut observed.live;
        match live.binary_search_by(|r| r.declarer.as_bytes().cmp(row.declarer.as_bytes())) {
            Ok(at) => live[at] = row,
            Err(at) => live.insert(at, row),
        }
    }
    for event in events {
        match event {
            DeclarationEvent::Waiting { attempt, .. } if attempt.declarer == *declarer => {
                observed.open_wait = Some(OpenWaitRow {
                    patterns: attempt.patterns.patterns(),
                    declared_at: attempt.declared_at,
                });
            }
            DeclarationEvent::Installed { attempt, .. } if attempt.declarer == *declarer => {
                observed.open_wait = None;
            }
            _ => {}
        }
    }
    observed
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
        // Speculative first when this process knows the group from its last attempt (one round
        // trip on Postgres), optimistic otherwise or after a miss (two), locked after a
        // conflict there (which cannot conflict). A speculative miss starts again from a copy
        // of the held state (it is still exact: only what was assumed beside it moved); an
        // optimistic conflict from the saved state (the held one went into the decision).
        // After a stale start, from the first event.
        let mut form = AttemptForm::Optimistic;
        let mut spare: Option<Held> = None;
        let mut speculated = false;
        let mut trust_saved = true;
        for round in 0..4 {
            let start = match held.take().or_else(|| spare.take()) {
                Some(start) => start,
                None if trust_saved => self.cold_start(group).await?,
                None => Held::empty(true),
            };
            if round == 0 {
                if let Some(assumed) = start.assumed_for(self.declarer) {
                    form = AttemptForm::Speculative(assumed);
                    spare = Some(start.clone());
                    speculated = true;
                }
            }
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
            let Some(attempted) = self.store.attempt_in(lock, decide, &mut form).await? else {
                continue;
            };
            // Whatever ran after a miss reads first; the spare is not needed any more.
            let missed = speculated && round > 0;
            spare = None;
            match attempted.outcome {
                Ok((outcome, mut next, seen)) => {
                    let speculate_next = !missed && seen.held_everything;
                    next.known =
                        attempted
                            .version
                            .filter(|_| speculate_next)
                            .map(|version| Known {
                                version,
                                declarer: self.declarer.to_string(),
                                observed: seen.observed,
                                decided_at: seen.decided_at,
                            });
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
                known: None,
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

/// The outcome, the state after it, and what the attempt saw.
type Decided = (RegisterOutcome, Held, Seen);

/// What a decided attempt saw of the group, for the next one.
struct Seen {
    /// What the group observes after the attempt (see [`observed_after`]).
    observed: GroupObserved,
    /// The decision's time.
    decided_at: DateTime<Utc>,
    /// The attempt found no event its held state did not already fold.
    held_everything: bool,
}

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
        // What the caller knew is replaced after the attempt (or forgotten, after a refusal).
        held.known = None;
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
        let observed = observed_after(
            snapshot.observed.clone(),
            &declarer,
            heartbeat.as_ref(),
            &decision.events,
        );
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
        Ok((
            GroupWrite { events, extra },
            (
                decision.outcome,
                held,
                Seen {
                    observed,
                    decided_at: snapshot.now,
                    held_everything: snapshot.events.is_empty(),
                },
            ),
        ))
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

#[cfg(test)]
mod tests {
    use wharf_domain::{AppVersion, Attempt};

    use super::*;

    fn row(declarer: &str, patterns: &[&str]) -> LiveInstanceRow {
        LiveInstanceRow {
            declarer: declarer.to_owned(),
            patterns: patterns.iter().map(|p| (*p).to_owned()).collect(),
        }
    }

    fn heartbeat(declarer: &str, patterns: &[&str]) -> Heartbeat {
        Heartbeat {
            declarer: declarer.to_owned(),
            version: "1".to_owned(),
            patterns: patterns.iter().map(|p| (*p).to_owned()).collect(),
        }
    }

    fn attempt(declarer: &str, patterns: &[&str], at: DateTime<Utc>) -> Attempt {
        Attempt {
            group: GroupName::parse("group", "g").unwrap(),
            topic: TopicName::parse("topic", "t").unwrap(),
            declarer: DeclarerId::parse("declarer", declarer).unwrap(),
            version: AppVersion::parse("version", "1").unwrap(),
            patterns: BindingSet::parse(patterns).unwrap(),
            declared_at: at,
            attempt_at: at,
        }
    }

    #[test]
    fn a_heartbeat_joins_the_live_list_in_byte_order() {
        let observed = GroupObserved {
            live: vec![row("B", &["x"]), row("a", &["x"])],
            open_wait: None,
        };
        let me = DeclarerId::parse("declarer", "Z").unwrap();
        let after = observed_after(observed, &me, Some(&heartbeat("Z", &["y"])), &[]);
        let order: Vec<&str> = after.live.iter().map(|r| r.declarer.as_str()).collect();
        assert_eq!(
            order,
            vec!["B", "Z", "a"],
            "upper case sorts before lower in bytes"
        );
        let again = observed_after(after, &me, Some(&heartbeat("Z", &["z"])), &[]);
        assert_eq!(again.live.len(), 3, "a second heartbeat replaces the row");
        assert_eq!(again.live[1], row("Z", &["z"]));
    }

    #[test]
    fn the_declarer_s_own_events_move_its_open_wait() {
        let me = DeclarerId::parse("declarer", "me").unwrap();
        let at = Utc::now();
        let waiting = DeclarationEvent::Waiting {
            attempt: attempt("me", &["a/#"], at),
            incumbent: BindingSet::parse(&["b/#"]).unwrap(),
            live_declarers: vec![DeclarerId::parse("declarer", "old").unwrap()],
        };
        let after = observed_after(GroupObserved::default(), &me, None, &[waiting]);
        assert_eq!(
            after.open_wait,
            Some(OpenWaitRow {
                patterns: vec!["a/#".to_owned()],
                declared_at: at,
            })
        );
        let someone_else = DeclarationEvent::Installed {
            attempt: attempt("other", &["c/#"], at),
            previous: None,
        };
        let after = observed_after(after, &me, None, &[someone_else]);
        assert!(
            after.open_wait.is_some(),
            "another's install of another set"
        );
        let installed = DeclarationEvent::Installed {
            attempt: attempt("me", &["a/#"], at),
            previous: None,
        };
        let after = observed_after(after, &me, None, &[installed]);
        assert_eq!(after.open_wait, None, "its own install closes its wait");
    }
}
