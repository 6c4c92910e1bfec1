//! The listing views: what the REST API and the CLI show about consumer groups.
//!
//! Assembled from three sources: the inline `effective_declaration` rows, the catch-up
//! `declarer_attempt` rows (open waiters, resolved by set comparison against the effective set)
//! and the worker-instance heartbeats (live by the store's clock).

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use wharf_store::InstanceRecord;

/// One consumer group as listed.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = GroupDeclaration))]
pub struct GroupView {
    /// The group's name.
    pub group: String,
    /// The log topic the group consumes.
    pub topic: String,
    /// The effective declaration (newest installed).
    pub effective: EffectiveView,
    /// Open waits (attempts blocked on live instances that declare the effective set), by when
    /// each first stated its set, then declarer: one page.
    pub waiters: Vec<WaiterView>,
    /// Pass as `waiters_after` to `GET /api/v1/groups/{group}` for the next page of waiters;
    /// null when none follows.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub waiters_next_after: Option<String>,
    /// Recorded worker instances, live or not, by declarer: one page.
    pub instances: Vec<InstanceView>,
    /// Pass as `instances_after` to `GET /api/v1/groups/{group}` for the next page of
    /// instances; null when none follows.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub instances_next_after: Option<String>,
}

/// The group's effective (newest installed) declaration.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EffectiveView {
    /// The effective set; empty means the whole topic.
    pub patterns: Vec<String>,
    /// True when the set is the whole topic.
    pub whole_topic: bool,
    /// Who installed it.
    pub declarer: String,
    /// The installer's application version.
    pub version: String,
    /// When the installer first stated the set (start of its wait, if it waited).
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub declared_at: DateTime<Utc>,
    /// When it was installed.
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub installed_at: DateTime<Utc>,
    /// The ledger position of the install.
    pub position: i64,
    /// How many set changes the group has had.
    pub installs: i64,
    /// The set this one replaced; null on the first install.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub previous: Option<Vec<String>>,
}

/// An open wait.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WaiterView {
    /// Who waits.
    pub declarer: String,
    /// Its application version.
    pub version: String,
    /// The set it asks for.
    pub patterns: Vec<String>,
    /// The set it waited on at its newest attempt.
    pub incumbent: Vec<String>,
    /// When it first stated its set.
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub declared_at: DateTime<Utc>,
    /// Its newest attempt: its liveness as a waiter.
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub last_attempt_at: DateTime<Utc>,
    /// Seconds since the waiter first stated its set, by the store's clock.
    pub waiting_seconds: f64,
    /// Seconds since its newest attempt: a large value means a dead waiter.
    pub silent_seconds: f64,
}

/// A worker instance.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InstanceView {
    /// The instance's declarer identity.
    pub declarer: String,
    /// Its application version.
    pub version: String,
    /// The set it runs with.
    pub patterns: Vec<String>,
    /// When it first heartbeated.
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub started_at: DateTime<Utc>,
    /// Its newest heartbeat.
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub heartbeat_at: DateTime<Utc>,
    /// True when the newest heartbeat is fresher than the instance TTL.
    pub live: bool,
}

/// A row of `effective_declaration`.
#[derive(Debug, Clone)]
pub(crate) struct EffectiveRow {
    pub group: String,
    pub topic: String,
    pub declarer: String,
    pub version: String,
    pub patterns: Vec<String>,
    pub previous: Option<Vec<String>>,
    pub declared_at: DateTime<Utc>,
    pub attempt_at: DateTime<Utc>,
    pub position: i64,
    pub installs: i64,
}

/// A waiting row of `declarer_attempt`.
#[derive(Debug, Clone)]
pub(crate) struct WaitingRow {
    pub group: String,
    pub declarer: String,
    pub version: String,
    pub patterns: Vec<String>,
    pub incumbent: Vec<String>,
    pub declared_at: DateTime<Utc>,
    pub attempt_at: DateTime<Utc>,
}

fn seconds_between(from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    (to - from).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6
}

/// Builds the views from rows read at `now` with instance TTL `ttl`. The waiting rows are
/// open waits already (their set differs from the effective one); each list keeps its order.
pub(crate) fn assemble(
    effective: Vec<EffectiveRow>,
    waiting: Vec<WaitingRow>,
    instances: Vec<InstanceRecord>,
    now: DateTime<Utc>,
    ttl: chrono::Duration,
) -> Vec<GroupView> {
    let mut waiters_of: HashMap<String, Vec<WaiterView>> = HashMap::new();
    for w in waiting {
        waiters_of.entry(w.group).or_default().push(WaiterView {
            waiting_seconds: seconds_between(w.declared_at, now),
            silent_seconds: seconds_between(w.attempt_at, now),
            declarer: w.declarer,
            version: w.version,
            patterns: w.patterns,
            incumbent: w.incumbent,
            declared_at: w.declared_at,
            last_attempt_at: w.attempt_at,
        });
    }
    let mut instances_of: HashMap<String, Vec<InstanceView>> = HashMap::new();
    for i in instances {
        instances_of.entry(i.group).or_default().push(InstanceView {
            live: i.heartbeat_at > now - ttl,
            declarer: i.declarer,
            version: i.version,
            patterns: i.patterns,
            started_at: i.started_at,
            heartbeat_at: i.heartbeat_at,
        });
    }
    effective
        .into_iter()
        .map(|row| GroupView {
            waiters: waiters_of.remove(&row.group).unwrap_or_default(),
            waiters_next_after: None,
            instances: instances_of.remove(&row.group).unwrap_or_default(),
            instances_next_after: None,
            effective: EffectiveView {
                whole_topic: row.patterns.is_empty(),
                patterns: row.patterns,
                declarer: row.declarer,
                version: row.version,
                declared_at: row.declared_at,
                installed_at: row.attempt_at,
                position: row.position,
                installs: row.installs,
                previous: row.previous,
            },
            group: row.group,
            topic: row.topic,
        })
        .collect()
}
