//! The managed-filter ledger: one aggregate per durable session identity.
//!
//! Its history is every exact filter that may exist at the broker for that session. A filter
//! enters it before it is ever SUBSCRIBEd (Remember), or from a seeded baseline (filters that
//! existed before Wharf managed the session), and leaves it only when an UNSUBACK said success
//! (`0x00`) or "no subscription existed" (`0x11`). A history that was never seeded is unknown,
//! which is not the same as empty: startup refuses to reconcile against it.
//!
//! Stored events: `DomainEvent::event_type` names the variant and the payload is the variant's
//! fields as a JSON object (`{"filter":"a/#","qos":1}`). Because `BaselineSeeded` and
//! `BaselineExtended` have the same fields, decode a stored event with
//! [`ManagedFilterEvent::decode`], which reads the type; plain `Deserialize` reads such a body
//! as `BaselineSeeded`, and both fold into the same state.

use std::collections::BTreeMap;

use cqrs_es::event_sink::EventSink;
use cqrs_es::{Aggregate, DomainEvent};
use serde::{Deserialize, Serialize};

use super::exact_filter::{ExactFilter, Qos};

/// The aggregate type name under which managed-filter events are stored.
pub const MANAGED_SESSION_AGGREGATE: &str = "managed_session";

/// UNSUBACK reason code: success.
pub const UNSUBACK_SUCCESS: u8 = 0x00;
/// UNSUBACK reason code: no subscription existed (as good as removed).
pub const UNSUBACK_NO_SUBSCRIPTION_EXISTED: u8 = 0x11;

/// True for the UNSUBACK reasons that prove a filter is gone from the broker session.
pub fn is_removal_verified(reason_code: u8) -> bool {
    matches!(
        reason_code,
        UNSUBACK_SUCCESS | UNSUBACK_NO_SUBSCRIPTION_EXISTED
    )
}

/// What the broker answered to one filter of a SUBSCRIBE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SubscribeOutcome {
    /// Subscribed, at `qos` (possibly below the requested level).
    Granted {
        /// The granted maximum QoS.
        qos: Qos,
    },
    /// Refused with a SUBACK reason code of 0x80 or above.
    Refused {
        /// The SUBACK reason code.
        reason_code: u8,
    },
}

impl SubscribeOutcome {
    /// True when granted at `requested` or above: the only outcome a reconcile accepts.
    pub fn satisfies(self, requested: Qos) -> bool {
        matches!(self, Self::Granted { qos } if qos >= requested)
    }
}

/// One event of a managed session's ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ManagedFilterEvent {
    /// The first seed: establishes the history (possibly empty).
    BaselineSeeded {
        /// The exact filters that exist at the broker, sorted, without duplicates.
        filters: Vec<ExactFilter>,
        /// Who seeded (`cli`, `init`, `builder`...), for audit.
        source: String,
    },
    /// A later seed that listed filters not yet in the history: only those.
    BaselineExtended {
        /// The newly listed filters, sorted, without duplicates.
        filters: Vec<ExactFilter>,
        /// Who seeded.
        source: String,
    },
    /// A filter about to be SUBSCRIBEd: from now on it may exist at the broker.
    FilterRemembered {
        /// The filter.
        filter: ExactFilter,
        /// The QoS it will be requested at.
        qos: Qos,
    },
    /// The broker's SUBACK for one filter.
    SubscribeAcknowledged {
        /// The filter.
        filter: ExactFilter,
        /// The QoS requested.
        requested: Qos,
        /// What the broker answered.
        outcome: SubscribeOutcome,
    },
    /// An UNSUBACK proved the filter gone (0x00 or 0x11): it leaves the history.
    FilterForgotten {
        /// The filter.
        filter: ExactFilter,
        /// The UNSUBACK reason code.
        reason_code: u8,
    },
    /// A replay that only a removed filter could have delivered: terminal, history kept.
    MigrationRequired {
        /// Why, for the operator.
        reason: String,
        /// The filters involved.
        filters: Vec<ExactFilter>,
    },
    /// The operator finished the restore/drain step of the migration procedure: the session
    /// may run again (with the configuration that was restored). History unchanged.
    MigrationResolved {
        /// Who resolved it (`cli`, ...), for audit.
        source: String,
    },
}

/// Event type names, as stored.
pub mod event_types {
    /// [`super::ManagedFilterEvent::BaselineSeeded`].
    pub const BASELINE_SEEDED: &str = "BaselineSeeded";
    /// [`super::ManagedFilterEvent::BaselineExtended`].
    pub const BASELINE_EXTENDED: &str = "BaselineExtended";
    /// [`super::ManagedFilterEvent::FilterRemembered`].
    pub const FILTER_REMEMBERED: &str = "FilterRemembered";
    /// [`super::ManagedFilterEvent::SubscribeAcknowledged`].
    pub const SUBSCRIBE_ACKNOWLEDGED: &str = "SubscribeAcknowledged";
    /// [`super::ManagedFilterEvent::FilterForgotten`].
    pub const FILTER_FORGOTTEN: &str = "FilterForgotten";
    /// [`super::ManagedFilterEvent::MigrationRequired`].
    pub const MIGRATION_REQUIRED: &str = "MigrationRequired";
    /// [`super::ManagedFilterEvent::MigrationResolved`].
    pub const MIGRATION_RESOLVED: &str = "MigrationResolved";
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Resolution {
    source: String,
}

#[derive(Deserialize)]
struct Baseline {
    filters: Vec<ExactFilter>,
    source: String,
}

impl ManagedFilterEvent {
    /// Decodes a stored event from its type name and payload (the variant's fields).
    pub fn decode(
        event_type: &str,
        payload: &serde_json::Value,
    ) -> Result<Self, serde_json::Error> {
        use serde::de::Error as _;
        let baseline = || serde_json::from_value::<Baseline>(payload.clone());
        let event: Self = match event_type {
            event_types::BASELINE_SEEDED => {
                let b = baseline()?;
                Self::BaselineSeeded {
                    filters: b.filters,
                    source: b.source,
                }
            }
            event_types::BASELINE_EXTENDED => {
                let b = baseline()?;
                Self::BaselineExtended {
                    filters: b.filters,
                    source: b.source,
                }
            }
            event_types::FILTER_REMEMBERED
            | event_types::SUBSCRIBE_ACKNOWLEDGED
            | event_types::FILTER_FORGOTTEN
            | event_types::MIGRATION_REQUIRED => serde_json::from_value(payload.clone())?,
            event_types::MIGRATION_RESOLVED => Self::MigrationResolved {
                source: serde_json::from_value::<Resolution>(payload.clone())?.source,
            },
            other => {
                return Err(serde_json::Error::custom(format!(
                    "unknown managed-session event type \"{other}\""
                )))
            }
        };
        if event.event_type() != event_type {
            return Err(serde_json::Error::custom(format!(
                "payload of a \"{event_type}\" event has the fields of \"{}\"",
                event.event_type()
            )));
        }
        Ok(event)
    }
}

impl DomainEvent for ManagedFilterEvent {
    fn event_type(&self) -> String {
        match self {
            Self::BaselineSeeded { .. } => event_types::BASELINE_SEEDED,
            Self::BaselineExtended { .. } => event_types::BASELINE_EXTENDED,
            Self::FilterRemembered { .. } => event_types::FILTER_REMEMBERED,
            Self::SubscribeAcknowledged { .. } => event_types::SUBSCRIBE_ACKNOWLEDGED,
            Self::FilterForgotten { .. } => event_types::FILTER_FORGOTTEN,
            Self::MigrationRequired { .. } => event_types::MIGRATION_REQUIRED,
            Self::MigrationResolved { .. } => event_types::MIGRATION_RESOLVED,
        }
        .into()
    }

    fn event_version(&self) -> String {
        "1.0".into()
    }
}

/// A SUBACK outcome as the ledger keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Acknowledgement {
    /// The QoS requested.
    pub requested: Qos,
    /// What the broker answered.
    pub outcome: SubscribeOutcome,
}

/// What the ledger knows about one filter in the history.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilterRecord {
    /// The QoS it was last remembered at; `None` for a seeded filter never remembered.
    pub qos: Option<Qos>,
    /// The seed that listed it, if it came from a baseline.
    pub seeded_by: Option<String>,
    /// The newest SUBACK outcome for it.
    pub last_ack: Option<Acknowledgement>,
}

/// The managed-filter ledger of one durable session identity.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManagedSession {
    /// The filters that may exist at the broker; `None` while unknown (never seeded).
    pub history: Option<BTreeMap<ExactFilter, FilterRecord>>,
    /// Set once a migration is required (terminal): why.
    pub migration_required: Option<String>,
    /// The filters the migration is about.
    pub migration_filters: Vec<ExactFilter>,
}

/// A command to the managed-filter ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ManagedSessionCommand {
    /// Establish the baseline, or add listed filters missing from it. Idempotent.
    Seed {
        /// The exact filters that exist at the broker (possibly none).
        filters: Vec<ExactFilter>,
        /// Who seeds, for audit.
        source: String,
    },
    /// Record filters about to be SUBSCRIBEd, at the QoS they will be requested at.
    Remember {
        /// Filter and requested QoS.
        filters: Vec<(ExactFilter, Qos)>,
    },
    /// Record a SUBACK: filter, requested QoS, outcome.
    RecordSubAck {
        /// One entry per acknowledged filter.
        outcomes: Vec<(ExactFilter, Qos, SubscribeOutcome)>,
    },
    /// Remove filters an UNSUBACK proved gone (reason 0x00 or 0x11 only).
    Forget {
        /// Filter and UNSUBACK reason code.
        filters: Vec<(ExactFilter, u8)>,
    },
    /// Leave the migration-required state once the operator restored and drained.
    ResolveMigration {
        /// Who resolves it, for audit.
        source: String,
    },
    /// Enter the terminal migration-required state.
    RequireMigration {
        /// Why.
        reason: String,
        /// The filters involved.
        filters: Vec<ExactFilter>,
    },
}

/// A refused ledger command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManagedSessionError {
    /// Nothing was ever seeded: the broker may hold filters no one knows about.
    #[error(
        "the session's managed-filter history is unknown (no baseline was seeded); seed it with \
         `wharf sessions seed <session-id>` (empty) or `wharf sessions seed \
         '<session-id>=<filter>,<filter>'` (the filters that exist at the broker)"
    )]
    HistoryUnknown,
    /// One command listed a filter twice with different QoS levels.
    #[error("filter \"{filter}\" is listed twice, at QoS {first} and QoS {second}")]
    ConflictingQos {
        /// The filter.
        filter: ExactFilter,
        /// The first QoS listed.
        first: Qos,
        /// The other.
        second: Qos,
    },
    /// The filter is not in the history.
    #[error("filter \"{filter}\" is not in the session's managed-filter history")]
    NotInHistory {
        /// The filter.
        filter: ExactFilter,
    },
    /// An UNSUBACK reason that does not prove removal.
    #[error(
        "filter \"{filter}\" cannot be forgotten on UNSUBACK reason 0x{reason_code:02x}: only \
         0x00 (success) and 0x11 (no subscription existed) prove it gone"
    )]
    RemovalNotVerified {
        /// The filter.
        filter: ExactFilter,
        /// The reason code given.
        reason_code: u8,
    },
    /// A resolution was asked for a session that requires no migration.
    #[error("the session requires no managed-filter migration: nothing to resolve")]
    NoMigrationRequired,
    /// The session is in the terminal migration-required state.
    #[error("the session requires a managed-filter migration ({reason}); its history is kept")]
    MigrationRequired {
        /// Why the migration is required.
        reason: String,
    },
}

impl ManagedSession {
    /// The state the ledger's `events` fold into.
    pub fn fold<'a>(events: impl IntoIterator<Item = &'a ManagedFilterEvent>) -> Self {
        let mut state = Self::default();
        for event in events {
            state.apply(event.clone());
        }
        state
    }

    /// True once a baseline was seeded.
    pub fn is_known(&self) -> bool {
        self.history.is_some()
    }

    /// The filters in the history with the QoS they were remembered at (sorted).
    pub fn history_filters(&self) -> Vec<ExactFilter> {
        self.history
            .as_ref()
            .map(|h| h.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Decides `command` against this state: the events to append. Pure.
    pub fn decide(
        &self,
        command: &ManagedSessionCommand,
    ) -> Result<Vec<ManagedFilterEvent>, ManagedSessionError> {
        match command {
            ManagedSessionCommand::Seed { filters, source } => Ok(self.seed(filters, source)),
            ManagedSessionCommand::Remember { filters } => self.remember(filters),
            ManagedSessionCommand::RecordSubAck { outcomes } => self.record_suback(outcomes),
            ManagedSessionCommand::Forget { filters } => self.forget(filters),
            ManagedSessionCommand::ResolveMigration { source } => {
                if self.migration_required.is_none() {
                    return Err(ManagedSessionError::NoMigrationRequired);
                }
                Ok(vec![ManagedFilterEvent::MigrationResolved {
                    source: source.clone(),
                }])
            }
            ManagedSessionCommand::RequireMigration { reason, filters } => {
                Ok(vec![ManagedFilterEvent::MigrationRequired {
                    reason: reason.clone(),
                    filters: sorted_unique(filters.iter().cloned()),
                }])
            }
        }
    }

    fn seed(&self, filters: &[ExactFilter], source: &str) -> Vec<ManagedFilterEvent> {
        let listed = sorted_unique(filters.iter().cloned());
        let Some(history) = &self.history else {
            return vec![ManagedFilterEvent::BaselineSeeded {
                filters: listed,
                source: source.to_owned(),
            }];
        };
        let missing: Vec<ExactFilter> = listed
            .into_iter()
            .filter(|f| !history.contains_key(f))
            .collect();
        if missing.is_empty() {
            return Vec::new();
        }
        vec![ManagedFilterEvent::BaselineExtended {
            filters: missing,
            source: source.to_owned(),
        }]
    }

    fn remember(
        &self,
        filters: &[(ExactFilter, Qos)],
    ) -> Result<Vec<ManagedFilterEvent>, ManagedSessionError> {
        self.refuse_if_migrating()?;
        let history = self
            .history
            .as_ref()
            .ok_or(ManagedSessionError::HistoryUnknown)?;
        let wanted = unique_by_filter(filters)?;
        Ok(wanted
            .into_iter()
            .filter(|(filter, qos)| history.get(filter).and_then(|r| r.qos) != Some(*qos))
            .map(|(filter, qos)| ManagedFilterEvent::FilterRemembered { filter, qos })
            .collect())
    }

    fn record_suback(
        &self,
        outcomes: &[(ExactFilter, Qos, SubscribeOutcome)],
    ) -> Result<Vec<ManagedFilterEvent>, ManagedSessionError> {
        let history = self
            .history
            .as_ref()
            .ok_or(ManagedSessionError::HistoryUnknown)?;
        outcomes
            .iter()
            .map(|(filter, requested, outcome)| {
                if !history.contains_key(filter) {
                    return Err(ManagedSessionError::NotInHistory {
                        filter: filter.clone(),
                    });
                }
                Ok(ManagedFilterEvent::SubscribeAcknowledged {
                    filter: filter.clone(),
                    requested: *requested,
                    outcome: *outcome,
                })
            })
            .collect()
    }

    fn forget(
        &self,
        filters: &[(ExactFilter, u8)],
    ) -> Result<Vec<ManagedFilterEvent>, ManagedSessionError> {
        self.refuse_if_migrating()?;
        let history = self
            .history
            .as_ref()
            .ok_or(ManagedSessionError::HistoryUnknown)?;
        let mut events = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for (filter, reason_code) in filters {
            if !is_removal_verified(*reason_code) {
                return Err(ManagedSessionError::RemovalNotVerified {
                    filter: filter.clone(),
                    reason_code: *reason_code,
                });
            }
            if !history.contains_key(filter) {
                return Err(ManagedSessionError::NotInHistory {
                    filter: filter.clone(),
                });
            }
            if seen.insert(filter.clone()) {
                events.push(ManagedFilterEvent::FilterForgotten {
                    filter: filter.clone(),
                    reason_code: *reason_code,
                });
            }
        }
        Ok(events)
    }

    fn refuse_if_migrating(&self) -> Result<(), ManagedSessionError> {
        match &self.migration_required {
            Some(reason) => Err(ManagedSessionError::MigrationRequired {
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    fn history_mut(&mut self) -> &mut BTreeMap<ExactFilter, FilterRecord> {
        self.history.get_or_insert_with(BTreeMap::new)
    }
}

fn sorted_unique(filters: impl IntoIterator<Item = ExactFilter>) -> Vec<ExactFilter> {
    let set: std::collections::BTreeSet<ExactFilter> = filters.into_iter().collect();
    set.into_iter().collect()
}

fn unique_by_filter(
    filters: &[(ExactFilter, Qos)],
) -> Result<BTreeMap<ExactFilter, Qos>, ManagedSessionError> {
    let mut wanted = BTreeMap::new();
    for (filter, qos) in filters {
        if let Some(first) = wanted.insert(filter.clone(), *qos) {
            if first != *qos {
                return Err(ManagedSessionError::ConflictingQos {
                    filter: filter.clone(),
                    first,
                    second: *qos,
                });
            }
        }
    }
    Ok(wanted)
}

impl Aggregate for ManagedSession {
    const TYPE: &'static str = MANAGED_SESSION_AGGREGATE;
    type Command = ManagedSessionCommand;
    type Event = ManagedFilterEvent;
    type Error = ManagedSessionError;
    type Services = ();

    async fn handle(
        &mut self,
        command: Self::Command,
        _services: &Self::Services,
        sink: &EventSink<Self>,
    ) -> Result<(), Self::Error> {
        for event in self.decide(&command)? {
            sink.write(event, self).await;
        }
        Ok(())
    }

    fn apply(&mut self, event: Self::Event) {
        match event {
            // A seed on an established history (never decided, but possible when a plain
            // `Deserialize` read an extension) adds its filters, exactly like an extension.
            ManagedFilterEvent::BaselineSeeded { filters, source }
            | ManagedFilterEvent::BaselineExtended { filters, source } => {
                let history = self.history_mut();
                for filter in filters {
                    history.entry(filter).or_default().seeded_by = Some(source.clone());
                }
            }
            ManagedFilterEvent::FilterRemembered { filter, qos } => {
                self.history_mut().entry(filter).or_default().qos = Some(qos);
            }
            ManagedFilterEvent::SubscribeAcknowledged {
                filter,
                requested,
                outcome,
            } => {
                // Never decided for an unknown history; such an event does not make it known.
                if let Some(history) = self.history.as_mut() {
                    history.entry(filter).or_default().last_ack =
                        Some(Acknowledgement { requested, outcome });
                }
            }
            ManagedFilterEvent::FilterForgotten { filter, .. } => {
                if let Some(history) = self.history.as_mut() {
                    history.remove(&filter);
                }
            }
            ManagedFilterEvent::MigrationRequired { reason, filters } => {
                self.migration_required = Some(reason);
                self.migration_filters = filters;
            }
            ManagedFilterEvent::MigrationResolved { .. } => {
                self.migration_required = None;
                self.migration_filters.clear();
            }
        }
    }
}
