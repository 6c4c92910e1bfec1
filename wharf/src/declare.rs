//! One declaration attempt: the edge around the pure Register decision.
//!
//! Loads the group's events and live instances inside the store's locked transaction, folds
//! them into the aggregate, decides with the store's time, and hands back what to append.

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
}

/// Runs one locked attempt. With `heartbeat`, a joined or installed outcome also records this
/// instance's heartbeat in the same transaction, so no other declarer can swap the set between
/// the join and the first heartbeat.
pub(crate) async fn attempt(
    store: &Store,
    declarer: &DeclarerId,
    registration: &Registration,
    instance_ttl: std::time::Duration,
    heartbeat: bool,
    first_declared_at: Option<DateTime<Utc>>,
) -> Result<RegisterOutcome, WharfError> {
    let lock = GroupLock {
        group: registration.group.to_string(),
        topic: registration.topic.to_string(),
        instance_ttl,
    };
    let registration = registration.clone();
    let declarer = declarer.clone();
    let result = store
        .execute_group(lock, move |snapshot| {
            let state = fold(snapshot).map_err(AttemptError::Corrupt)?;
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
            Ok((GroupWrite { events, heartbeat }, decision.outcome))
        })
        .await?;
    match result {
        Ok(outcome) => Ok(outcome),
        Err(AttemptError::Refused(e)) => Err(e.into()),
        Err(AttemptError::Corrupt(e)) => Err(e.into()),
    }
}

/// Folds the group's stored events into the aggregate.
fn fold(snapshot: &GroupSnapshot) -> Result<ConsumerGroup, StoreError> {
    let mut state = ConsumerGroup::default();
    for event in &snapshot.events {
        state.apply(event.decode::<DeclarationEvent>()?);
    }
    Ok(state)
}

fn live_instances(snapshot: &GroupSnapshot) -> Result<Vec<LiveInstance>, StoreError> {
    snapshot
        .live_instances
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
