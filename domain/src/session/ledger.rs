//! The managed-filter ledger: one aggregate per durable session identity.
//!
//! Its history is every exact filter that may exist at the broker for that session. A filter
//! enters it before it is ever SUBSCRIBEd (Remember), or from a seeded baseline (filters that
//! existed before Wharf managed the session), and leaves it only when an UNSUBACK said success
//! (`0x00`) or "no subscription existed" (`0x11`). A history that was never seeded is unknown,
//! which is not the same as empty: startup refuses to reconcile against it.
//!
//! Each command appends at most one event (`events.rs` has them and their stored form).

use std::collections::BTreeMap;

use cqrs_es::event_sink::EventSink;
use cqrs_es::Aggregate;
use serde::{Deserialize, Serialize};

pub use super::events::{
    event_types, ForgottenFilter, ManagedFilterEvent, RememberedFilter, SubAckEntry,
    SubscribeOutcome,
};
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
    /// Record a SUBACK: filter, requested QoS, outcome. Only the outcomes that differ from
    /// the filter's last recorded one are appended (none: no event).
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
        let filters: Vec<RememberedFilter> = wanted
            .into_iter()
            .filter(|(filter, qos)| history.get(filter).and_then(|r| r.qos) != Some(*qos))
            .map(|(filter, qos)| RememberedFilter { filter, qos })
            .collect();
        Ok(if filters.is_empty() {
            Vec::new()
        } else {
            vec![ManagedFilterEvent::FiltersRemembered { filters }]
        })
    }

    fn record_suback(
        &self,
        outcomes: &[(ExactFilter, Qos, SubscribeOutcome)],
    ) -> Result<Vec<ManagedFilterEvent>, ManagedSessionError> {
        let history = self
            .history
            .as_ref()
            .ok_or(ManagedSessionError::HistoryUnknown)?;
        let mut entries = Vec::with_capacity(outcomes.len());
        for (filter, requested, outcome) in outcomes {
            let Some(record) = history.get(filter) else {
                return Err(ManagedSessionError::NotInHistory {
                    filter: filter.clone(),
                });
            };
            // What the ledger already says about this filter is not said again: a reconnect
            // that is granted what the last SUBACK granted appends nothing (ADR 0040).
            let answer = Acknowledgement {
                requested: *requested,
                outcome: *outcome,
            };
            if record.last_ack == Some(answer) {
                continue;
            }
            entries.push(SubAckEntry {
                filter: filter.clone(),
                requested: *requested,
                outcome: *outcome,
            });
        }
        Ok(if entries.is_empty() {
            Vec::new()
        } else {
            vec![ManagedFilterEvent::SubscribesAcknowledged { outcomes: entries }]
        })
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
        let mut forgotten = Vec::new();
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
                forgotten.push(ForgottenFilter {
                    filter: filter.clone(),
                    reason_code: *reason_code,
                });
            }
        }
        Ok(if forgotten.is_empty() {
            Vec::new()
        } else {
            vec![ManagedFilterEvent::FiltersForgotten { filters: forgotten }]
        })
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
            ManagedFilterEvent::FiltersRemembered { filters } => {
                let history = self.history_mut();
                for RememberedFilter { filter, qos } in filters {
                    // A filter remembered again awaits a new SUBACK, as its projected row says.
                    let record = history.entry(filter).or_default();
                    record.qos = Some(qos);
                    record.last_ack = None;
                }
            }
            ManagedFilterEvent::SubscribesAcknowledged { outcomes } => {
                // Never decided for an unknown history; such an event does not make it known.
                if let Some(history) = self.history.as_mut() {
                    for SubAckEntry {
                        filter,
                        requested,
                        outcome,
                    } in outcomes
                    {
                        history.entry(filter).or_default().last_ack =
                            Some(Acknowledgement { requested, outcome });
                    }
                }
            }
            ManagedFilterEvent::FiltersForgotten { filters } => {
                if let Some(history) = self.history.as_mut() {
                    for ForgottenFilter { filter, .. } in filters {
                        history.remove(&filter);
                    }
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
