//! The seam between the queue's policy and a backend (ADR 0078).
//!
//! [`Queue`](crate::Queue) holds one [`QueueBackend`] and keeps everything that is policy:
//! input checks, the fetch (claim, route when short, claim again), the claim rounds that bury
//! exhausted messages, the acks' outcomes, limits and clamps. A backend supplies each
//! operation as one transaction (or one statement) in its dialect. The routing step itself
//! is written once too, over a narrower seam ([`crate::routing::RouteDialect`]).
//!
//! Architecture invariant: nothing here or above names a backend; the one place that picks
//! one is [`for_store`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use wharf_domain::{GroupName, TopicName};
use wharf_store::Store;

use crate::error::QueueError;
use crate::fence::InstallFence;
use crate::held::HeldConnection;
use crate::matchers::Matchers;
use crate::message::{
    AckOutcome, ClaimStep, DeadLetter, EffectiveInstall, ExtendOutcome, GroupQueueStats,
    NackOutcome, OutgoingMessage, QueueSettings, RetentionReport, RouteReport, SwapRecord,
    TopicStats,
};

/// A backend operation under way.
pub(crate) type Pending<'a, T> = Pin<Box<dyn Future<Output = Result<T, QueueError>> + Send + 'a>>;

/// How a routing step takes the group when another step or a swap holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnLocked {
    /// Skip: the step does nothing and reports the group busy.
    Skip,
    /// Wait for the holder to commit (bounded).
    Wait,
}

/// One claim statement: who claims what, and the acks it settles first.
pub(crate) struct ClaimRequest {
    pub group: GroupName,
    pub instance: String,
    /// How many messages at most.
    pub max: i64,
    /// The install the claiming instance holds, when its fetch is fenced.
    pub fence: Option<InstallFence>,
    /// `(position, token)` claims of the same group whose handlers succeeded.
    pub acks: Vec<(i64, i64)>,
}

/// A claim `(group, position, token)`.
pub(crate) type ClaimKey = (String, i64, i64);

/// What a backend supplies: each operation in its dialect, one transaction each.
pub(crate) trait QueueBackend: Send + Sync {
    /// True when a claim routes what is new itself (ADR 0069).
    fn routes_in_claims(&self) -> bool;

    /// Appends `messages` to `topic` in one transaction; their positions.
    fn publish<'a>(
        &'a self,
        topic: &'a TopicName,
        messages: &'a [OutgoingMessage],
    ) -> Pending<'a, Vec<i64>>;

    /// One routing step of up to `batch` positions (the step: `routing.rs`).
    fn route<'a>(
        &'a self,
        group: &'a GroupName,
        batch: i64,
        fence: Option<InstallFence>,
        on_locked: OnLocked,
    ) -> Pending<'a, RouteReport>;

    /// The install in effect for `group`.
    fn effective_install<'a>(
        &'a self,
        group: &'a GroupName,
    ) -> Pending<'a, Option<EffectiveInstall>>;

    /// One claim statement: settles the request's acks, then claims (on `held`'s connection
    /// where the backend has one to keep).
    fn claim<'a>(
        &'a self,
        held: &'a mut HeldConnection,
        request: ClaimRequest,
    ) -> Pending<'a, ClaimStep>;

    /// Acks one claim.
    fn ack<'a>(
        &'a self,
        group: &'a GroupName,
        position: i64,
        token: i64,
    ) -> Pending<'a, AckOutcome>;

    /// Acks `keys` in one transaction; the keys it acked.
    fn ack_many<'a>(
        &'a self,
        keys: &'a [ClaimKey],
    ) -> Pending<'a, std::collections::HashSet<ClaimKey>>;

    /// Pushes a held claim's visibility to `by` from now.
    fn extend<'a>(
        &'a self,
        group: &'a GroupName,
        position: i64,
        token: i64,
        by: Duration,
    ) -> Pending<'a, ExtendOutcome>;

    /// Gives a held claim back with `error`.
    fn nack<'a>(
        &'a self,
        group: &'a GroupName,
        position: i64,
        token: i64,
        error: &'a str,
    ) -> Pending<'a, NackOutcome>;

    /// A page of dead letters after `after`.
    fn dead_letters<'a>(
        &'a self,
        group: &'a GroupName,
        after: i64,
        limit: i64,
    ) -> Pending<'a, Vec<DeadLetter>>;

    /// Puts a dead letter back; false when there is none.
    fn replay_dead_letter<'a>(&'a self, group: &'a GroupName, position: i64) -> Pending<'a, bool>;

    /// The installs the group's routing applied, newest first.
    fn swaps<'a>(&'a self, group: &'a GroupName, limit: i64) -> Pending<'a, Vec<SwapRecord>>;

    /// Every topic's head and size.
    fn topic_stats(&self) -> Pending<'_, Vec<TopicStats>>;

    /// Queue figures of every group.
    fn all_group_stats(&self) -> Pending<'_, Vec<GroupQueueStats>>;

    /// Queue figures of the groups named, each read by its key.
    fn group_stats_of<'a>(&'a self, groups: &'a [String]) -> Pending<'a, Vec<GroupQueueStats>>;

    /// One retention pass.
    fn retain(
        &self,
        retention: Duration,
        instance_ttl: Duration,
        batch: i64,
    ) -> Pending<'_, RetentionReport>;
}

/// The backend of `store`.
pub(crate) fn for_store(
    store: &Store,
    settings: QueueSettings,
    matchers: Arc<Matchers>,
) -> Arc<dyn QueueBackend> {
    match store {
        Store::Sqlite(store) => Arc::new(crate::sqlite::SqliteQueue {
            store: store.clone(),
            settings,
            matchers,
        }),
        Store::Postgres(store) => Arc::new(crate::postgres::PgQueue {
            store: store.clone(),
            settings,
            matchers,
        }),
    }
}
