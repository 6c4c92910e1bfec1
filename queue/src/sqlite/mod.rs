//! The message log and delivery on SQLite (embedded mode). Every write is one `BEGIN
//! IMMEDIATE` transaction on the store's single writer, so positions are commit-ordered and
//! claims cannot race; times are microseconds since the epoch by the store's clock.

mod claim;
mod claimed;
mod fetch;
mod log;
mod retention;
mod route;
mod route_sql;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use wharf_domain::{GroupName, TopicName};
use wharf_store::SqliteStore;

use crate::backend::{ClaimKey, ClaimRequest, OnLocked, Pending, QueueBackend};
use crate::fence::InstallFence;
use crate::held::HeldConnection;
use crate::matchers::Matchers;
use crate::message::{
    AckOutcome, ClaimStep, DeadLetter, EffectiveInstall, ExtendOutcome, GroupQueueStats,
    NackOutcome, OutgoingMessage, QueueSettings, RetentionReport, RouteReport, SwapRecord,
    TopicStats,
};
use crate::retention::RetentionLimits;
use retention::SqliteRetention;

pub(crate) use log::{group_stats_sql, GROUPS_NAMED};

fn headers_from(text: &str) -> crate::message::Headers {
    if text == "{}" {
        // Most messages carry none: no parse.
        return crate::message::Headers::default();
    }
    serde_json::from_str(text).unwrap_or_default()
}

/// The queue's operations on a SQLite store.
pub(crate) struct SqliteQueue {
    pub store: SqliteStore,
    pub settings: QueueSettings,
    pub matchers: Arc<Matchers>,
}

impl QueueBackend for SqliteQueue {
    fn routes_in_claims(&self) -> bool {
        true
    }

    fn publish<'a>(
        &'a self,
        topic: &'a TopicName,
        messages: &'a [OutgoingMessage],
    ) -> Pending<'a, Vec<i64>> {
        Box::pin(log::publish(&self.store, topic, messages.to_vec()))
    }

    /// SQLite's steps are serialized by its write lock: they always wait.
    fn route<'a>(
        &'a self,
        group: &'a GroupName,
        batch: i64,
        fence: Option<InstallFence>,
        _on_locked: OnLocked,
    ) -> Pending<'a, RouteReport> {
        let matchers = self.matchers.clone();
        Box::pin(route::route(&self.store, matchers, group, batch, fence))
    }

    fn effective_install<'a>(
        &'a self,
        group: &'a GroupName,
    ) -> Pending<'a, Option<EffectiveInstall>> {
        Box::pin(route::effective_install(&self.store, group))
    }

    fn claim<'a>(
        &'a self,
        _held: &'a mut HeldConnection,
        request: ClaimRequest,
    ) -> Pending<'a, ClaimStep> {
        Box::pin(fetch::claim(
            &self.store,
            &self.matchers,
            &self.settings,
            request,
        ))
    }

    fn ack<'a>(
        &'a self,
        group: &'a GroupName,
        position: i64,
        token: i64,
    ) -> Pending<'a, AckOutcome> {
        Box::pin(claim::ack(&self.store, group, position, token))
    }

    fn ack_many<'a>(&'a self, keys: &'a [ClaimKey]) -> Pending<'a, HashSet<ClaimKey>> {
        Box::pin(claim::ack_many(&self.store, keys.to_vec()))
    }

    fn extend<'a>(
        &'a self,
        group: &'a GroupName,
        position: i64,
        token: i64,
        by: Duration,
    ) -> Pending<'a, ExtendOutcome> {
        Box::pin(claim::extend(&self.store, group, position, token, by))
    }

    fn nack<'a>(
        &'a self,
        group: &'a GroupName,
        position: i64,
        token: i64,
        error: &'a str,
    ) -> Pending<'a, NackOutcome> {
        let settings = &self.settings;
        Box::pin(claim::nack(
            &self.store,
            settings,
            group,
            position,
            token,
            error,
        ))
    }

    fn dead_letters<'a>(
        &'a self,
        group: &'a GroupName,
        after: i64,
        limit: i64,
    ) -> Pending<'a, Vec<DeadLetter>> {
        Box::pin(claim::dead_letters(&self.store, group, after, limit))
    }

    fn replay_dead_letter<'a>(&'a self, group: &'a GroupName, position: i64) -> Pending<'a, bool> {
        Box::pin(claim::replay_dead_letter(&self.store, group, position))
    }

    fn swaps<'a>(&'a self, group: &'a GroupName, limit: i64) -> Pending<'a, Vec<SwapRecord>> {
        Box::pin(log::swaps(&self.store, group, limit))
    }

    fn topic_stats(&self) -> Pending<'_, Vec<TopicStats>> {
        Box::pin(log::topic_stats(&self.store))
    }

    fn all_group_stats(&self) -> Pending<'_, Vec<GroupQueueStats>> {
        Box::pin(log::all_group_stats(&self.store))
    }

    fn group_stats_of<'a>(&'a self, groups: &'a [String]) -> Pending<'a, Vec<GroupQueueStats>> {
        Box::pin(log::group_stats_of(&self.store, groups.to_vec()))
    }

    fn retain(
        &self,
        retention: Duration,
        instance_ttl: Duration,
        batch: i64,
    ) -> Pending<'_, RetentionReport> {
        let limits = RetentionLimits {
            retention,
            instance_ttl,
            batch,
        };
        Box::pin(
            async move { crate::retention::retain(&SqliteRetention(&self.store), limits).await },
        )
    }
}
