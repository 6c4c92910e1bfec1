//! The managed-filter ledger's events and their stored form.
//!
//! One command appends at most one event: a Remember of 10,000 filters is one
//! `FiltersRemembered` listing them all, so a reconcile's ledger cost does not grow by a
//! store round trip per filter. `DomainEvent::event_type` names the variant; the payload is
//! the variant's fields as a JSON object (`{"filters":[{"filter":"a/#","qos":1}]}`). Decode a
//! stored event with [`ManagedFilterEvent::decode`], which reads the type first: several
//! variants have a `filters` field.

use cqrs_es::DomainEvent;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::exact_filter::{ExactFilter, Qos};

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

/// A filter about to be SUBSCRIBEd, at the QoS it will be requested at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RememberedFilter {
    /// The filter.
    pub filter: ExactFilter,
    /// The QoS it will be requested at.
    pub qos: Qos,
}

/// The broker's SUBACK answer for one filter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubAckEntry {
    /// The filter.
    pub filter: ExactFilter,
    /// The QoS requested.
    pub requested: Qos,
    /// What the broker answered.
    pub outcome: SubscribeOutcome,
}

/// A filter an UNSUBACK proved gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForgottenFilter {
    /// The filter.
    pub filter: ExactFilter,
    /// The UNSUBACK reason code (0x00 or 0x11).
    pub reason_code: u8,
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
    /// Filters about to be SUBSCRIBEd: from now on they may exist at the broker.
    FiltersRemembered {
        /// The filters, sorted, each once, with the QoS they will be requested at.
        filters: Vec<RememberedFilter>,
    },
    /// A SUBACK's answers, one per filter it acknowledged.
    SubscribesAcknowledged {
        /// Filter, requested QoS and outcome, in the order given.
        outcomes: Vec<SubAckEntry>,
    },
    /// UNSUBACKs proved these filters gone (0x00 or 0x11): they leave the history.
    FiltersForgotten {
        /// The filters and their UNSUBACK reason codes, each once.
        filters: Vec<ForgottenFilter>,
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
    /// [`super::ManagedFilterEvent::FiltersRemembered`].
    pub const FILTERS_REMEMBERED: &str = "FiltersRemembered";
    /// [`super::ManagedFilterEvent::SubscribesAcknowledged`].
    pub const SUBSCRIBES_ACKNOWLEDGED: &str = "SubscribesAcknowledged";
    /// [`super::ManagedFilterEvent::FiltersForgotten`].
    pub const FILTERS_FORGOTTEN: &str = "FiltersForgotten";
    /// [`super::ManagedFilterEvent::MigrationRequired`].
    pub const MIGRATION_REQUIRED: &str = "MigrationRequired";
    /// [`super::ManagedFilterEvent::MigrationResolved`].
    pub const MIGRATION_RESOLVED: &str = "MigrationResolved";
}

// The stored payload of each event type, read strictly (no unknown field).

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Baseline {
    filters: Vec<ExactFilter>,
    source: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Remembered {
    filters: Vec<RememberedFilter>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Acknowledged {
    outcomes: Vec<SubAckEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Forgotten {
    filters: Vec<ForgottenFilter>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Migration {
    reason: String,
    filters: Vec<ExactFilter>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Resolution {
    source: String,
}

fn read<T: DeserializeOwned>(payload: &str) -> Result<T, serde_json::Error> {
    serde_json::from_str(payload)
}

impl ManagedFilterEvent {
    /// Decodes a stored event from its type name and payload (the variant's fields, as JSON
    /// text).
    pub fn decode(event_type: &str, payload: &str) -> Result<Self, serde_json::Error> {
        use serde::de::Error as _;
        Ok(match event_type {
            event_types::BASELINE_SEEDED => {
                let Baseline { filters, source } = read(payload)?;
                Self::BaselineSeeded { filters, source }
            }
            event_types::BASELINE_EXTENDED => {
                let Baseline { filters, source } = read(payload)?;
                Self::BaselineExtended { filters, source }
            }
            event_types::FILTERS_REMEMBERED => Self::FiltersRemembered {
                filters: read::<Remembered>(payload)?.filters,
            },
            event_types::SUBSCRIBES_ACKNOWLEDGED => Self::SubscribesAcknowledged {
                outcomes: read::<Acknowledged>(payload)?.outcomes,
            },
            event_types::FILTERS_FORGOTTEN => Self::FiltersForgotten {
                filters: read::<Forgotten>(payload)?.filters,
            },
            event_types::MIGRATION_REQUIRED => {
                let Migration { reason, filters } = read(payload)?;
                Self::MigrationRequired { reason, filters }
            }
            event_types::MIGRATION_RESOLVED => Self::MigrationResolved {
                source: read::<Resolution>(payload)?.source,
            },
            other => {
                return Err(serde_json::Error::custom(format!(
                    "unknown managed-session event type \"{other}\""
                )))
            }
        })
    }
}

impl DomainEvent for ManagedFilterEvent {
    fn event_type(&self) -> String {
        match self {
            Self::BaselineSeeded { .. } => event_types::BASELINE_SEEDED,
            Self::BaselineExtended { .. } => event_types::BASELINE_EXTENDED,
            Self::FiltersRemembered { .. } => event_types::FILTERS_REMEMBERED,
            Self::SubscribesAcknowledged { .. } => event_types::SUBSCRIBES_ACKNOWLEDGED,
            Self::FiltersForgotten { .. } => event_types::FILTERS_FORGOTTEN,
            Self::MigrationRequired { .. } => event_types::MIGRATION_REQUIRED,
            Self::MigrationResolved { .. } => event_types::MIGRATION_RESOLVED,
        }
        .into()
    }

    fn event_version(&self) -> String {
        "1.0".into()
    }
}
