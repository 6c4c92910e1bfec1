//! Wharf's message log and consumer-group delivery.
//!
//! - **Publish** appends to a topic with a per-topic, gapless, commit-ordered position.
//! - **Route** moves a group's cursor through the log, matching subjects against the group's
//!   effective binding set (read in the same transaction, under the group row lock the
//!   declaration swap also takes) and recording a delivery per match. The cost is per log row,
//!   once; messages a group does not want never reach its claim path (ADR 0007).
//! - **Claim / ack / nack / extend** is a plain `SKIP LOCKED` queue over the group's deliveries,
//!   starting at the group's claim floor (ADR 0009), with a visibility timeout the holder can
//!   extend, attempt counting, backoff and dead letters.
//! - **Retain** deletes what every group is done with, and what aged out and no live group needs.
//!
//! Architecture invariant: the queue never decides bindings; it reads the effective binding rows
//! the declaration transaction wrote, and matches with `wharf-domain`'s trie.

mod backend;
pub mod error;
mod fence;
mod generations;
mod handler_error;
mod held;
mod matchers;
pub mod message;
mod nack;
mod postgres;
mod retention;
mod routing;
mod sqlite;
pub mod wakeups;

use std::sync::Arc;
use std::time::Duration;

use wharf_domain::{GroupName, TopicName, ValidationError};
use wharf_store::Store;

use backend::{ClaimRequest, OnLocked, QueueBackend};
use message::ClaimStep;

pub use error::QueueError;
pub use fence::InstallFence;
pub use handler_error::{HandlerError, HandlerResultExt};
pub use held::HeldConnection;
pub use message::{
    doubled, validate_batch, AckOutcome, AckedFetch, Claimed, DeadLetter, EffectiveInstall,
    ExtendOutcome, GroupQueueStats, Headers, NackOutcome, OutgoingMessage, QueueSettings,
    RetentionReport, RouteReport, SwapRecord, SwapReport, TopicStats,
};
pub use wakeups::{Wakeups, PUBLISH_CHANNEL};

/// The queue over a store.
#[derive(Clone)]
pub struct Queue {
    store: Store,
    settings: QueueSettings,
    backend: Arc<dyn QueueBackend>,
    wakeups: Arc<Wakeups>,
}

/// The SQL of the hot-path statements whose plans the tests check on a large table with stale
/// statistics (not an API: the text may change with any release).
#[doc(hidden)]
pub mod plans {
    /// A routing step's read of the log on Postgres (`$1` topic, positions `$2..=$3`).
    pub const ROUTE_SLICE: &str = crate::postgres::ROUTE_SLICE;
    /// A routing step's unlocked first look on Postgres (`$1` the group).
    pub const ROUTE_LOOK: &str = crate::postgres::SETTLED_LOOK;
    /// The install in effect on Postgres that a routing step matches with (`$1` the group,
    /// `$2` its topic, from the group row the step holds).
    pub const INSTALL_ON_TOPIC: &str = crate::postgres::INSTALL_ON_TOPIC;
    /// The install in effect for a group on Postgres (`$1` the group), for a caller that does
    /// not hold the group's row.
    pub const INSTALL_IN_EFFECT: &str = crate::postgres::INSTALL_IN_EFFECT;
    /// A listing's queue figures on Postgres, what `wharf_group_figures` runs (`$1` the groups).
    pub const GROUP_FIGURES: &str = crate::postgres::GROUP_FIGURES_SQL;
    /// An ack's call on Postgres: `wharf_ack` (ADR 0048).
    pub const ACK: &str = crate::postgres::ACK;
    /// A batch of acks' call on Postgres: `wharf_settle` with the keys as three arrays (ADR
    /// 0048).
    pub const SETTLE: &str = crate::postgres::SETTLE;
    /// A claim extension's call on Postgres: `wharf_extend` (ADR 0048).
    pub const EXTEND: &str = crate::postgres::EXTEND;
    /// What the queue's settling transactions run first on Postgres (ADR 0048).
    pub const KEYED_PLANS: &str = crate::postgres::KEYED_PLANS;
    /// A burial's statement on Postgres (run after [`KEYED_PLANS`]).
    pub const BURY: &str = crate::postgres::BURY;
    /// A nack's first statement on Postgres (run after [`KEYED_PLANS`]).
    pub const NACK_MARK: &str = crate::postgres::NACK_MARK;
    /// A nack's retry statement on Postgres (run after [`KEYED_PLANS`]).
    pub const NACK_RETRY: &str = crate::postgres::NACK_RETRY;

    /// The settle of set-aside claims in `table` on Postgres (run after [`KEYED_PLANS`]).
    pub fn settle_in(table: &str) -> String {
        crate::postgres::settle_in(table)
    }

    /// A listing's queue figures on SQLite, one statement (`?1` the groups as a JSON array,
    /// `?2` the store's clock in microseconds).
    pub fn sqlite_group_figures() -> String {
        crate::sqlite::group_stats_sql(crate::sqlite::GROUPS_NAMED)
    }
}

/// How many routing steps one `fetch` may take before it claims anyway, so a long unmatched
/// stretch of the log cannot delay a claim without bound.
const MAX_ROUTE_STEPS_PER_FETCH: usize = 8;

/// The longest single claim extension.
const MAX_EXTENSION: Duration = Duration::from_secs(24 * 3600);

/// How many times one `claim` call claims again after burying exhausted messages.
const MAX_CLAIM_ROUNDS: usize = 4;

impl Queue {
    /// A queue over `store` with `settings`.
    pub fn new(store: Store, settings: QueueSettings) -> Self {
        let backend = backend::for_store(&store, settings, Arc::default());
        Self {
            store,
            settings,
            backend,
            wakeups: Arc::default(),
        }
    }

    /// The settings.
    pub fn settings(&self) -> &QueueSettings {
        &self.settings
    }

    /// The store underneath.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Publishes a batch to `topic` in one transaction; durable on return. Returns positions.
    #[tracing::instrument(skip_all, fields(topic = %topic, count = messages.len()))]
    pub async fn publish(
        &self,
        topic: &TopicName,
        messages: &[OutgoingMessage],
    ) -> Result<Vec<i64>, QueueError> {
        if messages.is_empty() || messages.len() > message::MAX_BATCH {
            return Err(wharf_domain::ValidationError::new(
                "messages",
                &format!("{} messages", messages.len()),
                "a publish carries 1 to 10000 messages",
            )
            .into());
        }
        for (i, message) in messages.iter().enumerate() {
            message.check().map_err(|e| wharf_domain::ValidationError {
                field: format!("messages[{i}].{}", e.field),
                ..e
            })?;
        }
        let positions = self.backend.publish(topic, messages).await?;
        self.wakeups.wake(topic.as_str());
        Ok(positions)
    }

    /// The publish wake-ups of this queue (and its clones).
    pub fn wakeups(&self) -> &Arc<Wakeups> {
        &self.wakeups
    }

    /// Publishes one message.
    pub async fn publish_one(
        &self,
        topic: &TopicName,
        message: OutgoingMessage,
    ) -> Result<i64, QueueError> {
        let positions = self.publish(topic, std::slice::from_ref(&message)).await?;
        Ok(positions[0])
    }

    /// True when a claim routes what is new itself, in its own transaction, whenever the
    /// routed deliveries cannot fill it (SQLite, ADR 0069): routing ahead of the claims then
    /// only adds write transactions, and takes from the claims the deliveries they would
    /// insert already claimed. On Postgres routing is a step of its own (ADR 0050).
    pub fn routes_in_claims(&self) -> bool {
        self.backend.routes_in_claims()
    }

    /// Routes one batch of the log for `group`.
    pub async fn route(&self, group: &GroupName) -> Result<RouteReport, QueueError> {
        self.route_fenced(group, None).await
    }

    /// One routing step; with a fence, fails with [`QueueError::Fenced`] (routing nothing)
    /// when the group's install is not the fenced one. The check rides on the step's own reads.
    pub async fn route_fenced(
        &self,
        group: &GroupName,
        fence: Option<InstallFence>,
    ) -> Result<RouteReport, QueueError> {
        self.route_step(group, fence, OnLocked::Skip).await
    }

    /// One routing step that, on Postgres, skips or waits for a step already running.
    /// (SQLite's steps are serialized by its write lock: they always wait.)
    async fn route_step(
        &self,
        group: &GroupName,
        fence: Option<InstallFence>,
        on_locked: OnLocked,
    ) -> Result<RouteReport, QueueError> {
        let batch = self.settings.route_batch;
        self.backend.route(group, batch, fence, on_locked).await
    }

    /// The install in effect for `group` (the ledger position of its `Installed` event and its
    /// set), or `None` for a group never declared.
    pub async fn effective_install(
        &self,
        group: &GroupName,
    ) -> Result<Option<EffectiveInstall>, QueueError> {
        self.backend.effective_install(group).await
    }

    /// Claims up to `max` claimable messages without routing first. Messages that used their
    /// attempts while their claims expired go to the dead letters on the way and do not count
    /// against `max`. Only messages routed under the install in effect are handed out.
    pub async fn claim(
        &self,
        group: &GroupName,
        instance: &str,
        max: u32,
    ) -> Result<Vec<Claimed>, QueueError> {
        Ok(self
            .claim_fenced(
                &mut HeldConnection::default(),
                group,
                instance,
                None,
                max,
                Vec::new(),
            )
            .await?
            .claimed)
    }

    async fn claim_fenced(
        &self,
        held: &mut HeldConnection,
        group: &GroupName,
        instance: &str,
        fence: Option<InstallFence>,
        max: u32,
        acks: Vec<(i64, i64)>,
    ) -> Result<ClaimStep, QueueError> {
        let max = i64::from(max.max(1));
        let mut step = ClaimStep::default();
        let mut acks = Some(acks);
        for _ in 0..MAX_CLAIM_ROUNDS {
            let wanted = max - step.claimed.len() as i64;
            // The acks ride on the first claim statement only.
            let acks = acks.take().unwrap_or_default();
            let request = ClaimRequest {
                group: group.clone(),
                instance: instance.to_owned(),
                max: wanted,
                fence,
                acks,
            };
            let mut got = self.backend.claim(held, request).await?;
            step.claimed.append(&mut got.claimed);
            step.acked.extend(got.acked);
            step.buried += got.buried;
            if got.buried == 0 || step.claimed.len() as i64 >= max {
                break;
            }
        }
        Ok(step)
    }

    /// Claims up to `max` messages, routing what is new for the group (a bounded number of
    /// steps) only when the deliveries already routed cannot fill the request.
    ///
    /// Routing lazily keeps a busy group's fetch at one statement, and keeps its routed but
    /// unclaimed deliveries within about one routing batch: each routing step matches the log
    /// against the set in effect at that moment, so a swap applies to everything not yet routed.
    /// On SQLite the claim itself routes what it takes once the group's routing is aligned
    /// with its install (ADR 0069); a routing step is then taken only for a swap, a rescan,
    /// or a log the claim's scan found too little in.
    pub async fn fetch(
        &self,
        group: &GroupName,
        instance: &str,
        max: u32,
    ) -> Result<Vec<Claimed>, QueueError> {
        let held = &mut HeldConnection::default();
        self.fetch_inner(held, group, instance, None, max, Vec::new())
            .await?
            .fetched
    }

    /// Like [`fetch`](Self::fetch) for an instance that joined the group under the install
    /// `install` (its fence): once the group's install has moved on, nothing is claimed and
    /// the call fails with [`QueueError::Fenced`], so the instance re-declares before it
    /// claims again (an instance only handles messages of the set it declared).
    pub async fn fetch_fenced(
        &self,
        group: &GroupName,
        instance: &str,
        install: InstallFence,
        max: u32,
    ) -> Result<Vec<Claimed>, QueueError> {
        let held = &mut HeldConnection::default();
        self.fetch_inner(held, group, instance, Some(install), max, Vec::new())
            .await?
            .fetched
    }

    /// Acks `acks` (claims of `group` whose handlers succeeded) and fetches up to `max` more,
    /// like [`fetch`](Self::fetch) (fenced by `install` when given, like
    /// [`fetch_fenced`](Self::fetch_fenced)). The acks are settled by the fetch's first claim
    /// statement, in its commit: one round trip and one commit for the acks of one batch and
    /// the claim of the next, where [`ack_many`](Self::ack_many) then `fetch` take two
    /// (ADR 0035).
    ///
    /// An error before the acks were settled is the outer error (nothing acked, nothing
    /// claimed); a failure after it (a routing step, or the fence) is in
    /// [`AckedFetch::fetched`], beside the acks' outcomes.
    pub async fn ack_and_fetch(
        &self,
        acks: &[Claimed],
        group: &GroupName,
        instance: &str,
        install: Option<InstallFence>,
        max: u32,
    ) -> Result<AckedFetch, QueueError> {
        let held = &mut HeldConnection::default();
        self.ack_and_fetch_holding(held, acks, group, instance, install, max)
            .await
    }

    /// [`ack_and_fetch`](Self::ack_and_fetch) on a connection the caller keeps between its
    /// fetches (ADR 0051): the claim statement runs on `held`'s connection, or takes one from
    /// the pool and leaves it in `held` when the fetch needs nothing else. A fetch that comes
    /// back short routes through the pool and releases `held` first. The caller releases it
    /// before it waits for long ([`HeldConnection::release`]).
    pub async fn ack_and_fetch_holding(
        &self,
        held: &mut HeldConnection,
        acks: &[Claimed],
        group: &GroupName,
        instance: &str,
        install: Option<InstallFence>,
        max: u32,
    ) -> Result<AckedFetch, QueueError> {
        let mut keys = Vec::with_capacity(acks.len());
        for (i, message) in acks.iter().enumerate() {
            if message.group != group.as_str() {
                return Err(ValidationError::new(
                    &format!("acks[{i}].group"),
                    &message.group,
                    &format!("acks carried by a fetch must be of the fetching group {group}"),
                )
                .into());
            }
            keys.push((message.position, message.claim_token));
        }
        self.fetch_inner(held, group, instance, install, max, keys)
            .await
    }

    async fn fetch_inner(
        &self,
        held: &mut HeldConnection,
        group: &GroupName,
        instance: &str,
        fence: Option<InstallFence>,
        max: u32,
        acks: Vec<(i64, i64)>,
    ) -> Result<AckedFetch, QueueError> {
        let max = max.max(1);
        let keys = acks.clone();
        let step = self
            .claim_fenced(held, group, instance, fence, max, acks)
            .await?;
        if step.claimed.len() < max as usize {
            // The rest routes through the pool; a pool of one must have this connection back.
            held.release();
        }
        let outcomes = keys
            .iter()
            .map(|key| {
                if step.acked.contains(key) {
                    AckOutcome::Acked
                } else {
                    AckOutcome::ClaimLost
                }
            })
            .collect();
        let fetched = self
            .fetch_rest(group, instance, fence, max, step.claimed)
            .await;
        Ok(AckedFetch {
            acks: outcomes,
            fetched,
        })
    }

    /// The rest of a fetch whose first claim got `claimed`: routes and claims again when that
    /// came back short.
    async fn fetch_rest(
        &self,
        group: &GroupName,
        instance: &str,
        fence: Option<InstallFence>,
        max: u32,
        mut claimed: Vec<Claimed>,
    ) -> Result<Vec<Claimed>, QueueError> {
        let wanted = max - claimed.len() as u32;
        if wanted == 0 {
            return Ok(claimed);
        }
        let (mut routed, mut busy) = (0u64, false);
        for _ in 0..MAX_ROUTE_STEPS_PER_FETCH {
            // A short claim may be short because the install moved on: the fenced step says
            // so rather than route for a set this instance no longer holds.
            let report = match self.route_fenced(group, fence).await {
                Err(QueueError::Fenced { .. }) if !claimed.is_empty() => return Ok(claimed),
                other => other?,
            };
            routed += report.routed;
            busy = report.busy;
            if !report.more(self.settings.route_batch) {
                break;
            }
            if routed >= u64::from(wanted) {
                break;
            }
        }
        // Claim again when this fetch routed, when another step was routing right now (this
        // instance's router, another instance's fetch), and whenever it has nothing yet: a step
        // that committed between the claim above and the routing here left deliveries this
        // fetch did not route, and a claim loop whose fetch comes back empty sleeps until the
        // next publish or its poll interval.
        if routed > 0 || busy || claimed.is_empty() {
            claimed.append(&mut self.claim_more(group, instance, fence, wanted).await?);
        }
        // Nothing to claim while that step was still running: what it routes commits after
        // this claim, and a claim loop woken by the publish would sleep until the next
        // one. Wait for the step, then claim what it (or this step, after it) routed.
        if busy && claimed.is_empty() {
            // Whatever it routed itself, the step it waited for has committed.
            match self.route_step(group, fence, OnLocked::Wait).await {
                Err(QueueError::Fenced { .. }) => return Ok(claimed),
                other => other?,
            };
            claimed.append(&mut self.claim_more(group, instance, fence, wanted).await?);
        }
        Ok(claimed)
    }

    /// A claim of up to `wanted` more after routing, on a connection of its own.
    async fn claim_more(
        &self,
        group: &GroupName,
        instance: &str,
        fence: Option<InstallFence>,
        wanted: u32,
    ) -> Result<Vec<Claimed>, QueueError> {
        let held = &mut HeldConnection::default();
        let step = self
            .claim_fenced(held, group, instance, fence, wanted, Vec::new())
            .await?;
        Ok(step.claimed)
    }

    /// Acknowledges a claimed message.
    pub async fn ack(&self, message: &Claimed) -> Result<AckOutcome, QueueError> {
        let group = GroupName::parse("group", &message.group)?;
        self.backend
            .ack(&group, message.position, message.claim_token)
            .await
    }

    /// Acknowledges several claimed messages (of any groups) in one transaction; returns each
    /// one's outcome, in the order given. Cheaper than one [`ack`](Self::ack) each: one commit.
    pub async fn ack_many(&self, messages: &[Claimed]) -> Result<Vec<AckOutcome>, QueueError> {
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        let mut keys = Vec::with_capacity(messages.len());
        for message in messages {
            let group = GroupName::parse("group", &message.group)?;
            keys.push((group.to_string(), message.position, message.claim_token));
        }
        let acked = self.backend.ack_many(&keys).await?;
        Ok(keys
            .iter()
            .map(|key| {
                if acked.contains(key) {
                    AckOutcome::Acked
                } else {
                    AckOutcome::ClaimLost
                }
            })
            .collect())
    }

    /// Keeps a claimed message hidden from other instances for `by` from now (by the store's
    /// clock), for a handler that needs longer than the visibility timeout. Only the holder of
    /// the claim can extend it; an extension does not count as an attempt. `by` must be above
    /// zero and at most a day.
    pub async fn extend(
        &self,
        message: &Claimed,
        by: Duration,
    ) -> Result<ExtendOutcome, QueueError> {
        if by.is_zero() || by > MAX_EXTENSION {
            return Err(ValidationError::new(
                "by",
                &format!("{by:?}"),
                "a claim extension must be above 0 and at most 1 day",
            )
            .into());
        }
        let group = GroupName::parse("group", &message.group)?;
        let (position, token) = (message.position, message.claim_token);
        self.backend.extend(&group, position, token, by).await
    }

    /// Gives a claimed message back with the handler's error; it is retried after a backoff or
    /// dead-lettered once it has used its attempts.
    pub async fn nack(&self, message: &Claimed, error: &str) -> Result<NackOutcome, QueueError> {
        let group = GroupName::parse("group", &message.group)?;
        let (position, token) = (message.position, message.claim_token);
        self.backend.nack(&group, position, token, error).await
    }

    /// A page of the group's dead letters, after position `after` (`limit` is clamped to
    /// 1..=1000).
    pub async fn dead_letters(
        &self,
        group: &GroupName,
        after: i64,
        limit: i64,
    ) -> Result<Vec<DeadLetter>, QueueError> {
        let limit = limit.clamp(1, 1_000);
        self.backend.dead_letters(group, after, limit).await
    }

    /// Puts a dead letter back in the group's queue with fresh attempts; false if absent.
    pub async fn replay_dead_letter(
        &self,
        group: &GroupName,
        position: i64,
    ) -> Result<bool, QueueError> {
        self.backend.replay_dead_letter(group, position).await
    }

    /// The installs the group's routing applied, newest first (at most `limit`, clamped to
    /// 1..=1000): what each swap kept, set aside, restored and rescanned.
    pub async fn swaps(
        &self,
        group: &GroupName,
        limit: i64,
    ) -> Result<Vec<SwapRecord>, QueueError> {
        let limit = limit.clamp(1, 1_000);
        self.backend.swaps(group, limit).await
    }

    /// Every topic's head and size.
    pub async fn topic_stats(&self) -> Result<Vec<TopicStats>, QueueError> {
        self.backend.topic_stats().await
    }

    /// Queue figures of every group, or of one.
    pub async fn group_stats(
        &self,
        group: Option<&GroupName>,
    ) -> Result<Vec<GroupQueueStats>, QueueError> {
        match group {
            Some(group) => self.group_stats_of(std::slice::from_ref(group)).await,
            None => self.backend.all_group_stats().await,
        }
    }

    /// Queue figures of the groups named (a listing page), by name; each read by its key, so
    /// the cost follows the page, not the number of groups.
    pub async fn group_stats_of(
        &self,
        groups: &[GroupName],
    ) -> Result<Vec<GroupQueueStats>, QueueError> {
        let names: Vec<String> = groups.iter().map(ToString::to_string).collect();
        self.backend.group_stats_of(&names).await
    }

    /// One retention pass: deletes what every group is done with, and what is older than
    /// `retention` and not needed by a live group (instance heartbeat fresher than
    /// `instance_ttl`), in batches of `batch` rows.
    pub async fn retain(
        &self,
        retention: Duration,
        instance_ttl: Duration,
        batch: i64,
    ) -> Result<RetentionReport, QueueError> {
        let batch = batch.max(1);
        self.backend.retain(retention, instance_ttl, batch).await
    }
}
