//! The message log and delivery on Postgres (cluster mode).

mod claim;
mod publish;
mod retention;
mod route;
mod route_sql;
mod stats;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use wharf_domain::{GroupName, TopicName};
use wharf_store::{Finishing, PgStore};

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
use retention::PgRetention;

pub(crate) use claim::{settle_in, ACK, BURY, EXTEND, KEYED_PLANS, NACK_MARK, NACK_RETRY, SETTLE};
pub(crate) use route::{INSTALL_IN_EFFECT, INSTALL_ON_TOPIC, SETTLED_LOOK, SLICE as ROUTE_SLICE};
pub(crate) use stats::GROUP_FIGURES_SQL;

fn headers_json(value: serde_json::Value) -> crate::message::Headers {
    serde_json::from_value(value).unwrap_or_default()
}

/// Headers stored as JSON, read as text (`headers::text`): decoded straight into the map, with
/// no JSON tree in between (the claim's hot path).
fn headers_text(text: &str) -> crate::message::Headers {
    serde_json::from_str(text).unwrap_or_default()
}

/// The queue's operations on a Postgres store.
pub(crate) struct PgQueue {
    pub store: PgStore,
    pub settings: QueueSettings,
    pub matchers: Arc<Matchers>,
}

impl QueueBackend for PgQueue {
    /// Routing is a step of its own (ADR 0050).
    fn routes_in_claims(&self) -> bool {
        false
    }

    fn publish<'a>(
        &'a self,
        topic: &'a TopicName,
        messages: &'a [OutgoingMessage],
    ) -> Pending<'a, Vec<i64>> {
        Box::pin(publish::publish(&self.store, topic, messages))
    }

    fn route<'a>(
        &'a self,
        group: &'a GroupName,
        batch: i64,
        fence: Option<InstallFence>,
        on_locked: OnLocked,
    ) -> Pending<'a, RouteReport> {
        // A step runs to its end even if its caller is dropped meanwhile (a fetch's deadline):
        // dropped mid-transaction, its connection could be lost to the pool (ADR 0068). The
        // caller's next steps are not taken.
        let (store, matchers, group) = (self.store.clone(), self.matchers.clone(), group.clone());
        Box::pin(Finishing::new(async move {
            route::route(&store, &matchers, &group, batch, fence, on_locked).await
        }))
    }

    fn effective_install<'a>(
        &'a self,
        group: &'a GroupName,
    ) -> Pending<'a, Option<EffectiveInstall>> {
        Box::pin(route::effective_install(&self.store, group))
    }

    fn claim<'a>(
        &'a self,
        held: &'a mut HeldConnection,
        request: ClaimRequest,
    ) -> Pending<'a, ClaimStep> {
        Box::pin(claim::claim(&self.store, held, &self.settings, request))
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
        Box::pin(claim::ack_many(&self.store, keys))
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
        Box::pin(stats::swaps(&self.store, group, limit))
    }

    fn topic_stats(&self) -> Pending<'_, Vec<TopicStats>> {
        Box::pin(stats::topic_stats(&self.store))
    }

    fn all_group_stats(&self) -> Pending<'_, Vec<GroupQueueStats>> {
        Box::pin(stats::all_group_stats(&self.store))
    }

    fn group_stats_of<'a>(&'a self, groups: &'a [String]) -> Pending<'a, Vec<GroupQueueStats>> {
        Box::pin(stats::group_stats_of(&self.store, groups))
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
        Box::pin(async move { crate::retention::retain(&PgRetention(&self.store), limits).await })
    }
}
