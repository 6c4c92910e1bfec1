//! The consumer-group declaration aggregate and the Register decision (design record 0511).
//!
//! A consumer group states its full binding set at Register. The decision is a plain function of
//! the group's state, the command, the live instances the caller observed and the time it was
//! given: same set (or nothing stored) joins or installs at once; a different set waits while any
//! live instance still declares the stored set; with zero live declarers it swaps. It never
//! produces a union of two sets and never fences a running incumbent.
//!
//! The aggregate's state is the effective declaration and a count, nothing that grows with the
//! ledger: which declarers wait ([`OpenWaits`]) is kept by the store in a table that follows
//! the same rule inline, and the decision is handed the registering declarer's own entry with
//! the live instances (ADR 0049).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use cqrs_es::event_sink::EventSink;
use cqrs_es::{Aggregate, DomainEvent};
use serde::{Deserialize, Serialize};

use crate::binding_set::BindingSet;
use crate::names::{AppVersion, DeclarerId, GroupName, TopicName};

/// The aggregate type name under which declaration events are stored.
pub const AGGREGATE_TYPE: &str = "consumer_group";

/// The payload field that names an attempt's declarer, in every declaration event (the
/// [`Attempt`] fields are flattened into each): the pruner compares it between events.
pub const DECLARER_FIELD: &str = "declarer";

/// Event type names, as stored.
pub mod event_types {
    /// [`super::DeclarationEvent::Installed`].
    pub const INSTALLED: &str = "DeclarationInstalled";
    /// [`super::DeclarationEvent::Waiting`].
    pub const WAITING: &str = "DeclarationWaiting";
}

/// The fields every declaration attempt carries, installed or waiting. Each event is
/// self-contained so that pruning older attempts never loses when a wait began.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// The group the attempt is for.
    pub group: GroupName,
    /// The log topic the group consumes.
    pub topic: TopicName,
    /// Who attempted (`hostname:pid:random`).
    pub declarer: DeclarerId,
    /// The declaring application's version, for audit.
    pub version: AppVersion,
    /// The requested binding set (empty = whole topic).
    pub patterns: BindingSet,
    /// When this declarer first stated this set; constant across its retries.
    pub declared_at: DateTime<Utc>,
    /// When this attempt ran.
    pub attempt_at: DateTime<Utc>,
}

/// What happened to a group's declaration. A joined attempt appends nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DeclarationEvent {
    /// A set change (including the first install): the group's effective set is now `patterns`.
    Installed {
        /// The attempt that installed.
        #[serde(flatten)]
        attempt: Attempt,
        /// The set it replaced; `None` for the group's first install.
        previous: Option<BindingSet>,
    },
    /// An attempt blocked because live instances still declare a different stored set.
    /// Re-appended on every retry; informational only.
    Waiting {
        /// The attempt that waits.
        #[serde(flatten)]
        attempt: Attempt,
        /// The stored set it waits on.
        incumbent: BindingSet,
        /// The live instances that still declare the incumbent set.
        live_declarers: Vec<DeclarerId>,
    },
}

impl DeclarationEvent {
    /// The attempt this event records.
    pub fn attempt(&self) -> &Attempt {
        match self {
            Self::Installed { attempt, .. } | Self::Waiting { attempt, .. } => attempt,
        }
    }

    /// True for a set change.
    pub fn is_installed(&self) -> bool {
        matches!(self, Self::Installed { .. })
    }
}

impl DomainEvent for DeclarationEvent {
    fn event_type(&self) -> String {
        match self {
            Self::Installed { .. } => event_types::INSTALLED.into(),
            Self::Waiting { .. } => event_types::WAITING.into(),
        }
    }

    fn event_version(&self) -> String {
        "1.0".into()
    }
}

/// A live worker instance of the group and the set it declares, as observed by the caller in the
/// same transaction as the decision (heartbeat fresher than the TTL by the store's clock).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveInstance {
    /// The instance's declarer identity.
    pub declarer: DeclarerId,
    /// The set the instance runs with.
    pub patterns: BindingSet,
}

/// The Register command: a declarer states the group's full binding set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Register {
    /// The group.
    pub group: GroupName,
    /// The topic the group consumes.
    pub topic: TopicName,
    /// Who is registering.
    pub declarer: DeclarerId,
    /// The application's version, for audit.
    pub version: AppVersion,
    /// The requested set.
    pub requested: BindingSet,
    /// When this declarer first stated this set, if it has attempted before.
    pub first_declared_at: Option<DateTime<Utc>>,
    /// The decision's time (the store's clock).
    pub now: DateTime<Utc>,
    /// Instances of the group with a fresh heartbeat.
    pub live_instances: Vec<LiveInstance>,
    /// The registering declarer's open wait in this group, observed with the live instances
    /// (the [`OpenWaits`] entry the ledger leaves for it), if it has one.
    pub open_wait: Option<OpenWait>,
}

/// The effective (newest installed) declaration of a group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Effective {
    /// The attempt that installed it.
    pub attempt: Attempt,
    /// The set it replaced.
    pub previous: Option<BindingSet>,
}

/// A declarer's open wait: the set it waits to install and when it first stated it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenWait {
    /// The set the declarer waits to install.
    pub patterns: BindingSet,
    /// When the declarer first stated that set (its waiting attempts carry it unchanged).
    pub declared_at: DateTime<Utc>,
}

/// Which declarers of one group wait, and for what: the rule the store's inline open-wait
/// table follows, and the replay of it. A declarer's wait opens (or moves) with its
/// `Waiting` event and closes when it installs, or when anyone installs the set it waits for
/// (it joins at its next attempt, appending nothing).
///
/// This grows with every declarer that ever waited and was never resolved (each restart of a
/// waiting deployment is a new declarer), so it is not part of [`ConsumerGroup`]: a cold
/// register would load all of it to read one entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenWaits(BTreeMap<DeclarerId, OpenWait>);

impl OpenWaits {
    /// Follows one event of the group's ledger.
    pub fn apply(&mut self, event: &DeclarationEvent) {
        match event {
            DeclarationEvent::Installed { attempt, .. } => {
                self.0.remove(&attempt.declarer);
                self.0.retain(|_, wait| !closes(attempt, wait));
            }
            // A retry (the common case) updates its entry in place, copying nothing.
            DeclarationEvent::Waiting { attempt, .. } => match self.0.get_mut(&attempt.declarer) {
                Some(wait) => {
                    if wait.patterns != attempt.patterns {
                        wait.patterns = attempt.patterns.clone();
                    }
                    wait.declared_at = attempt.declared_at;
                }
                None => {
                    self.0.insert(
                        attempt.declarer.clone(),
                        OpenWait {
                            patterns: attempt.patterns.clone(),
                            declared_at: attempt.declared_at,
                        },
                    );
                }
            },
        }
    }

    /// `declarer`'s open wait, if it has one.
    pub fn get(&self, declarer: &DeclarerId) -> Option<&OpenWait> {
        self.0.get(declarer)
    }

    /// Every open wait, by declarer.
    pub fn iter(&self) -> impl Iterator<Item = (&DeclarerId, &OpenWait)> {
        self.0.iter()
    }

    /// How many declarers wait.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when no declarer waits.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Whether an install of `installed` closes another declarer's `wait`: it installed the very
/// set that declarer waits for.
pub fn closes(installed: &Attempt, wait: &OpenWait) -> bool {
    installed.patterns == wait.patterns
}

/// The consumer-group aggregate: what the ledger says about one group, bounded whatever the
/// ledger's length (the open waits are kept apart, see [`OpenWaits`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerGroup {
    /// The effective declaration; `None` until the first install (whole topic meanwhile).
    pub effective: Option<Effective>,
    /// How many set changes the ledger holds.
    pub installs: u64,
}

impl ConsumerGroup {
    /// The group's effective set: its newest installed set, or the whole topic.
    pub fn effective_set(&self) -> BindingSet {
        self.effective
            .as_ref()
            .map(|e| e.attempt.patterns.clone())
            .unwrap_or_default()
    }
}

/// The result of a Register attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum RegisterOutcome {
    /// The requested set is already effective: the instance joins; nothing is appended.
    Joined {
        /// The effective set.
        effective: BindingSet,
    },
    /// The requested set was installed (first install or swap).
    Installed {
        /// The set it replaced (`None` on a first install).
        previous: Option<BindingSet>,
        /// The newly effective set.
        effective: BindingSet,
    },
    /// Live instances still declare a different stored set: the attempt waits.
    Waiting {
        /// The stored set being waited on.
        incumbent: BindingSet,
        /// The live instances that declare it.
        live_declarers: Vec<DeclarerId>,
        /// When this declarer first stated its set.
        declared_at: DateTime<Utc>,
    },
}

impl RegisterOutcome {
    /// True when the instance may consume (joined or installed).
    pub fn may_consume(&self) -> bool {
        !matches!(self, Self::Waiting { .. })
    }
}

/// A refused Register.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeclarationError {
    /// The group is bound to another topic.
    #[error(
        "group \"{group}\" consumes topic \"{bound}\"; a registration named topic \"{requested}\""
    )]
    TopicMismatch {
        /// The group.
        group: GroupName,
        /// The topic it is bound to.
        bound: TopicName,
        /// The topic the registration named.
        requested: TopicName,
    },
    /// The command names a different group than the aggregate holds.
    #[error("command for group \"{requested}\" reached the aggregate of group \"{held}\"")]
    WrongAggregate {
        /// The aggregate's group.
        held: GroupName,
        /// The command's group.
        requested: GroupName,
    },
}

/// The decision and the events that record it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// What the caller is told.
    pub outcome: RegisterOutcome,
    /// What the ledger records (empty for a join).
    pub events: Vec<DeclarationEvent>,
}

/// Decides a Register against the group's state. Pure: no clock, no I/O.
///
/// The registering declarer's own instance never counts as a live incumbent: a process that
/// re-registers with a new set would otherwise wait on itself forever.
pub fn decide(state: &ConsumerGroup, cmd: &Register) -> Result<Decision, DeclarationError> {
    check_identity(state, cmd)?;
    let Some(effective) = &state.effective else {
        return Ok(install(cmd, None));
    };
    let stored = &effective.attempt.patterns;
    if *stored == cmd.requested {
        return Ok(Decision {
            outcome: RegisterOutcome::Joined {
                effective: stored.clone(),
            },
            events: Vec::new(),
        });
    }
    let live_declarers: Vec<DeclarerId> = cmd
        .live_instances
        .iter()
        .filter(|instance| instance.patterns == *stored && instance.declarer != cmd.declarer)
        .map(|instance| instance.declarer.clone())
        .collect();
    if live_declarers.is_empty() {
        return Ok(install(cmd, Some(stored.clone())));
    }
    let attempt = attempt_of(cmd);
    Ok(Decision {
        outcome: RegisterOutcome::Waiting {
            incumbent: stored.clone(),
            live_declarers: live_declarers.clone(),
            declared_at: attempt.declared_at,
        },
        events: vec![DeclarationEvent::Waiting {
            attempt,
            incumbent: stored.clone(),
            live_declarers,
        }],
    })
}

fn check_identity(state: &ConsumerGroup, cmd: &Register) -> Result<(), DeclarationError> {
    let Some(effective) = &state.effective else {
        return Ok(());
    };
    let held = &effective.attempt;
    if held.group != cmd.group {
        return Err(DeclarationError::WrongAggregate {
            held: held.group.clone(),
            requested: cmd.group.clone(),
        });
    }
    if held.topic != cmd.topic {
        return Err(DeclarationError::TopicMismatch {
            group: cmd.group.clone(),
            bound: held.topic.clone(),
            requested: cmd.topic.clone(),
        });
    }
    Ok(())
}

fn install(cmd: &Register, previous: Option<BindingSet>) -> Decision {
    let attempt = attempt_of(cmd);
    Decision {
        outcome: RegisterOutcome::Installed {
            previous: previous.clone(),
            effective: cmd.requested.clone(),
        },
        events: vec![DeclarationEvent::Installed { attempt, previous }],
    }
}

/// Builds the attempt record. `declared_at` is the declarer's own first statement of the set
/// when it says so; otherwise its open wait's, when it waits for the same set; otherwise now.
fn attempt_of(cmd: &Register) -> Attempt {
    let remembered = cmd
        .open_wait
        .as_ref()
        .filter(|w| w.patterns == cmd.requested)
        .map(|w| w.declared_at);
    let declared_at = cmd
        .first_declared_at
        .or(remembered)
        .unwrap_or(cmd.now)
        .min(cmd.now);
    Attempt {
        group: cmd.group.clone(),
        topic: cmd.topic.clone(),
        declarer: cmd.declarer.clone(),
        version: cmd.version.clone(),
        patterns: cmd.requested.clone(),
        declared_at,
        attempt_at: cmd.now,
    }
}

impl Aggregate for ConsumerGroup {
    const TYPE: &'static str = AGGREGATE_TYPE;
    type Command = Register;
    type Event = DeclarationEvent;
    type Error = DeclarationError;
    type Services = ();

    async fn handle(
        &mut self,
        command: Self::Command,
        _services: &Self::Services,
        sink: &EventSink<Self>,
    ) -> Result<(), Self::Error> {
        let decision = decide(self, &command)?;
        for event in decision.events {
            sink.write(event, self).await;
        }
        Ok(())
    }

    fn apply(&mut self, event: Self::Event) {
        match event {
            DeclarationEvent::Installed { attempt, previous } => {
                self.installs += 1;
                self.effective = Some(Effective { attempt, previous });
            }
            // A wait changes no decision but its own declarer's, which is handed its entry
            // (`Register::open_wait`).
            DeclarationEvent::Waiting { .. } => {}
        }
    }
}

#[cfg(test)]
mod error_text_tests {
    use super::*;

    #[test]
    fn refusals_show_names_not_rust_debug_forms() {
        let group = GroupName::parse("group", "known").unwrap();
        let err = DeclarationError::TopicMismatch {
            group: group.clone(),
            bound: TopicName::parse("topic", "orders").unwrap(),
            requested: TopicName::parse("topic", "payments").unwrap(),
        };
        assert_eq!(
            err.to_string(),
            "group \"known\" consumes topic \"orders\"; a registration named topic \"payments\""
        );
        let err = DeclarationError::WrongAggregate {
            held: group,
            requested: GroupName::parse("group", "other").unwrap(),
        };
        assert!(!err.to_string().contains("GroupName("), "{err}");
    }
}

#[cfg(test)]
mod stored_form_tests {
    use super::*;

    #[test]
    fn every_declaration_event_names_its_declarer_under_the_declarer_field() {
        let names = |s: &str| BindingSet::parse(&[s]).unwrap();
        let attempt = Attempt {
            group: GroupName::parse("group", "g").unwrap(),
            topic: TopicName::parse("topic", "t").unwrap(),
            declarer: DeclarerId::parse("declarer", "host:1:a").unwrap(),
            version: AppVersion::parse("version", "1").unwrap(),
            patterns: names("a/#"),
            declared_at: chrono::DateTime::UNIX_EPOCH,
            attempt_at: chrono::DateTime::UNIX_EPOCH,
        };
        let events = [
            DeclarationEvent::Installed {
                attempt: attempt.clone(),
                previous: None,
            },
            DeclarationEvent::Waiting {
                attempt,
                incumbent: names("b/#"),
                live_declarers: vec![],
            },
        ];
        for event in events {
            let payload = serde_json::to_value(&event).unwrap();
            assert_eq!(
                payload[DECLARER_FIELD],
                "host:1:a",
                "{}",
                event.event_type()
            );
        }
    }
}
