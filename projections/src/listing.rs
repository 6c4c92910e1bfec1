//! The paged group listing (ADR 0024): what a page asks for, what it answers, and how the rows
//! of one page become views.
//!
//! Every read here is index-driven and bounded by the page: a page of groups walks
//! `effective_declaration` by name from the cursor (by `(topic, group_name)` with a topic
//! filter), and reads the waiters and instances of those groups only, each list by its own key
//! from its own cursor, at most a page of each. Nothing reads `events`, and no read of one
//! group touches another group's rows.

use wharf_domain::{GroupName, TopicName};
use wharf_store::InstanceRecord;

use crate::cursor::{GroupCursor, InstanceCursor, WaiterCursor};
use crate::error::ProjectionError;
use crate::views::{self, EffectiveRow, GroupView, WaitingRow};

/// How many groups (or waiters, or instances of one group) a page holds by default.
pub const DEFAULT_PAGE: u32 = 100;

/// The largest page.
pub const MAX_PAGE: u32 = 1_000;

/// A page of the group listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupQuery {
    /// Only groups after this one, by name (the previous page's `next_after`).
    pub after: Option<GroupCursor>,
    /// At most this many groups (1 to [`MAX_PAGE`]).
    pub limit: u32,
    /// Only groups consuming this topic.
    pub topic: Option<TopicName>,
    /// Only groups with at least one open waiter.
    pub waiting: bool,
}

impl Default for GroupQuery {
    fn default() -> Self {
        Self {
            after: None,
            limit: DEFAULT_PAGE,
            topic: None,
            waiting: false,
        }
    }
}

/// A page of one group's waiters and of its instances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberQuery {
    /// At most this many waiters, and at most this many instances (1 to [`MAX_PAGE`]).
    pub limit: u32,
    /// Only waiters after this one (the previous answer's `waiters_next_after`).
    pub waiters_after: Option<WaiterCursor>,
    /// Only instances after this one (the previous answer's `instances_next_after`).
    pub instances_after: Option<InstanceCursor>,
}

impl Default for MemberQuery {
    fn default() -> Self {
        Self {
            limit: DEFAULT_PAGE,
            waiters_after: None,
            instances_after: None,
        }
    }
}

/// Checks a page size given as `field`.
pub fn check_limit(field: &'static str, limit: u32) -> Result<(), ProjectionError> {
    if (1..=MAX_PAGE).contains(&limit) {
        return Ok(());
    }
    Err(ProjectionError::InvalidParameter {
        field,
        value: limit.to_string(),
        reason: "must be between 1 and 1000",
    })
}

impl GroupQuery {
    /// Refuses out-of-range sizes, naming the field.
    pub fn validate(&self) -> Result<(), ProjectionError> {
        check_limit("limit", self.limit)
    }
}

impl MemberQuery {
    /// Refuses an out-of-range size, naming the field.
    pub fn validate(&self) -> Result<(), ProjectionError> {
        check_limit("limit", self.limit)
    }
}

/// One page of the group listing.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct GroupPage {
    /// The groups, by name.
    pub groups: Vec<GroupView>,
    /// Pass as `after` for the next page; `None` when no group follows this page.
    pub next_after: Option<String>,
}

/// What one backend read for a page: the effective rows (one more than the page when more
/// follow), and for those groups their waiters and instances (one more than a member page per
/// group when more follow).
pub(crate) struct PageRows {
    pub effective: Vec<EffectiveRow>,
    pub waiting: Vec<WaitingRow>,
    pub instances: Vec<InstanceRecord>,
}

/// What one read answered: the rows, the store's clock, and whether the catch-up projector
/// was behind the log when it was taken (then the rows may miss the caller's writes).
pub(crate) struct Snapshot<T> {
    pub rows: T,
    pub now: chrono::DateTime<chrono::Utc>,
    pub behind: bool,
}

/// The rows a member read starts after, as SQL-ready keys.
#[derive(Clone)]
pub(crate) struct MemberKeys {
    /// Waiters after `(declared_at micros, declarer)`; `None`: from the first.
    pub waiters_after: Option<(i64, String)>,
    /// Instances after this declarer; `""`: from the first.
    pub instances_after: String,
    /// One more than the member page, so that a following page shows.
    pub fetch: i64,
}

impl MemberKeys {
    pub(crate) fn new(query: &MemberQuery) -> Self {
        Self {
            waiters_after: query
                .waiters_after
                .as_ref()
                .map(|c| (c.declared_at_micros, c.declarer.clone())),
            instances_after: query
                .instances_after
                .as_ref()
                .map_or(String::new(), |c| c.0.clone()),
            fetch: i64::from(query.limit) + 1,
        }
    }

    pub(crate) fn first(limit: u32) -> Self {
        Self::new(&MemberQuery {
            limit,
            ..MemberQuery::default()
        })
    }
}

/// Builds the page from what was read at `now`: cuts each list to its page and names the
/// cursor of what follows.
pub(crate) fn page(
    rows: PageRows,
    limit: u32,
    members: u32,
    now: chrono::DateTime<chrono::Utc>,
    ttl: chrono::Duration,
) -> GroupPage {
    let PageRows {
        mut effective,
        waiting,
        instances,
    } = rows;
    let more = effective.len() > limit as usize;
    effective.truncate(limit as usize);
    let next_after = if more {
        effective.last().and_then(|row| {
            GroupName::parse("group", &row.group)
                .ok()
                .map(|name| GroupCursor(name).encode())
        })
    } else {
        None
    };
    let groups = views::assemble(effective, waiting, instances, now, ttl)
        .into_iter()
        .map(|view| cut(view, members))
        .collect();
    GroupPage { groups, next_after }
}

/// Cuts a view's waiters and instances to `members` each, naming the cursors of the rest.
fn cut(mut view: GroupView, members: u32) -> GroupView {
    let members = members as usize;
    if view.waiters.len() > members {
        view.waiters.truncate(members);
        view.waiters_next_after = view
            .waiters
            .last()
            .map(|w| WaiterCursor::after(w.declared_at, &w.declarer).encode());
    }
    if view.instances.len() > members {
        view.instances.truncate(members);
        view.instances_next_after = view
            .instances
            .last()
            .map(|i| InstanceCursor(i.declarer.clone()).encode());
    }
    view
}

/// What a listing read found of its groups' queue figures: one group's (ADR 0071) or a
/// page's (ADR 0072).
#[derive(Debug, Clone, PartialEq)]
pub enum CarriedFigures {
    /// Read by the same statement (Postgres): each group's figures, by name, in the read's
    /// order; a group without a queue row is left out.
    Read(Vec<(String, wharf_store::GroupFiguresRow)>),
    /// Not read (SQLite, where a second read costs no round trip, or a read that did not ask
    /// for them): ask the queue.
    NotRead,
}
