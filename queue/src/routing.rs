//! A routing step and the swap it applies, written once for both backends over
//! [`RouteDialect`] (ADR 0078).
//!
//! The step: read the install in effect (under whatever makes it stable: the group row lock
//! on Postgres, the single writer on SQLite), check the caller's fence, apply a swap when the
//! group's routing is aligned with an older install (ADR 0014), match the next forward slice
//! and any rescan slice, record a delivery per match, and move the cursor. What each backend
//! supplies is its statements: each [`RouteDialect`] method is one read or one write.
//!
//! SQLite's dialect works on a `rusqlite` transaction and never waits: its methods complete on
//! their first poll, so `wharf_store::run_ready` drives the same step inside SQLite's write
//! closure.

use wharf_domain::{BindingMatcher, GroupName};

use crate::error::QueueError;
use crate::fence::{self, InstallFence};
use crate::generations::{
    forward_matches, rescan_matches, rescan_start, restorable, split_pending, Generation, History,
    StepRanges,
};
use crate::matchers::Matchers;
use crate::message::{EffectiveInstall, RouteReport, SwapReport};

/// A group's routing state, read where the step holds the group.
#[derive(Debug, Clone)]
pub(crate) struct Cursor {
    pub topic: String,
    /// The topic's committed head when the state was read.
    pub head: i64,
    pub routed_position: i64,
    pub routed_install: i64,
    pub start_position: Option<i64>,
    pub rescan_position: i64,
    pub rescan_until: i64,
}

impl Cursor {
    /// True when no rescan is pending.
    pub(crate) fn rescanned(&self) -> bool {
        self.rescan_position > self.rescan_until
    }
}

/// A step's first look, read without holding the group, so an idle poll costs one read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Look {
    pub routed_position: i64,
    pub head: i64,
    pub routed_install: i64,
    pub rescanned: bool,
    /// The install in effect (`None`: none readable).
    pub install: Option<i64>,
}

impl Look {
    /// The routed position when the group is caught up (routing aligned with its install, no
    /// rescan pending, the head reached): the step has nothing to do. `Fenced` when the caller's
    /// fence is not the install in effect.
    pub(crate) fn settled(
        &self,
        group: &GroupName,
        fence: Option<InstallFence>,
    ) -> Result<Option<i64>, QueueError> {
        fence::check(group.as_str(), fence, self.install)?;
        let aligned = self
            .install
            .is_none_or(|install| install == self.routed_install);
        let caught_up = aligned && self.rescanned && self.routed_position >= self.head;
        Ok(caught_up.then_some(self.routed_position))
    }
}

/// An earlier install's ranges, as recorded when the swap after it was applied.
pub(crate) struct GenerationRow {
    pub install: i64,
    pub patterns: Vec<String>,
    pub forward: (i64, i64),
    pub rescan: (i64, i64),
}

/// A backend's statements for one routing step, all inside the step's transaction.
pub(crate) trait RouteDialect {
    /// The install in effect for `group` (whose routing is on `topic`).
    async fn install(
        &mut self,
        group: &GroupName,
        topic: &str,
    ) -> Result<Option<EffectiveInstall>, QueueError>;

    /// The log rows `(position, subject)` of `topic` in `from..=to`, in position order.
    async fn slice(
        &mut self,
        topic: &str,
        from: i64,
        to: i64,
    ) -> Result<Vec<(i64, String)>, QueueError>;

    /// The closed earlier installs of `group` (not `current`) whose ranges overlap
    /// `first..=last`.
    async fn generations(
        &mut self,
        group: &GroupName,
        current: i64,
        first: i64,
        last: i64,
    ) -> Result<Vec<GenerationRow>, QueueError>;

    /// Records a delivery of each of `positions` stamped with `install` (an existing one is
    /// left as it is).
    async fn deliver(
        &mut self,
        group: &GroupName,
        topic: &str,
        positions: &[i64],
        install: i64,
    ) -> Result<(), QueueError>;

    /// Moves the group's cursor; `lowest_delivered` is the lowest position this step
    /// delivered, if any (where a backend keeps a claim floor, it comes down to it).
    async fn advance(
        &mut self,
        group: &GroupName,
        routed_position: i64,
        rescan_position: i64,
        lowest_delivered: Option<i64>,
    ) -> Result<(), QueueError>;

    /// Closes the ranges of the group's open generation `install`.
    async fn close_generation(
        &mut self,
        group: &GroupName,
        install: i64,
        through: i64,
        rescan_through: i64,
    ) -> Result<(), QueueError>;

    /// The deliveries not stamped with `install`, with their subjects (`None`: the log row is
    /// gone).
    async fn pending(
        &mut self,
        group: &GroupName,
        install: i64,
    ) -> Result<Vec<(i64, Option<String>)>, QueueError>;

    /// Re-stamps the deliveries at `positions` with `install`; how many.
    async fn restamp(
        &mut self,
        group: &GroupName,
        positions: &[i64],
        install: i64,
    ) -> Result<u64, QueueError>;

    /// Moves the deliveries at `positions` to the set-aside ones, by `install`; how many.
    async fn set_aside(
        &mut self,
        group: &GroupName,
        positions: &[i64],
        install: i64,
    ) -> Result<u64, QueueError>;

    /// The set-aside deliveries whose log rows remain, with their subjects.
    async fn parked(&mut self, group: &GroupName) -> Result<Vec<(i64, String)>, QueueError>;

    /// Moves the set-aside deliveries at `positions` back, stamped with `install`; how many.
    async fn restore(
        &mut self,
        group: &GroupName,
        positions: &[i64],
        install: i64,
    ) -> Result<u64, QueueError>;

    /// The oldest position `topic`'s log still holds.
    async fn oldest(&mut self, topic: &str) -> Result<Option<i64>, QueueError>;

    /// Records the generation the swap opens: `install`'s set, routing forward from
    /// `from_position`, and what the swap did.
    async fn open_generation(
        &mut self,
        group: &GroupName,
        install: &EffectiveInstall,
        from_position: i64,
        swap: &SwapReport,
    ) -> Result<(), QueueError>;

    /// Aligns the group's routing state with the swap: its start, install and rescan range.
    async fn realign(
        &mut self,
        group: &GroupName,
        start: i64,
        swap: &SwapReport,
    ) -> Result<(), QueueError>;
}

/// One routing step of up to `batch` log positions for `group`, from `cursor` (read where the
/// step holds the group). Nothing is routed when the caller's fence is not the install in
/// effect.
pub(crate) async fn step<D: RouteDialect>(
    db: &mut D,
    matchers: &Matchers,
    group: &GroupName,
    mut cursor: Cursor,
    batch: i64,
    fence: Option<InstallFence>,
) -> Result<RouteReport, QueueError> {
    let Some(install) = db.install(group, &cursor.topic).await? else {
        return Err(QueueError::UnknownGroup(group.to_string()));
    };
    fence::check(group.as_str(), fence, Some(install.position))?;
    let matcher = matchers.get(group, install.position, install.patterns.iter().cloned())?;
    let mut report = RouteReport::default();
    if cursor.routed_install != install.position {
        report.swap = Some(apply(db, group, &mut cursor, &install, &matcher).await?);
    }
    let ranges = StepRanges::new(
        cursor.routed_position,
        cursor.head,
        cursor.rescan_position,
        cursor.rescan_until,
        batch,
    );
    let mut matched = Vec::new();
    let mut routed_position = cursor.routed_position;
    if let Some((from, to)) = ranges.forward {
        let slice = db.slice(&cursor.topic, from, to).await?;
        matched = forward_matches(&matcher, &slice);
        routed_position = to;
        report.scanned = (to - from + 1) as u64;
    }
    let mut rescan_position = cursor.rescan_position;
    if let Some((from, to)) = ranges.rescan {
        let slice = db.slice(&cursor.topic, from, to).await?;
        if !slice.is_empty() {
            let history = history(db, matchers, group, install.position, from, to).await?;
            matched.extend(rescan_matches(&matcher, &history, &slice));
        }
        rescan_position = to + 1;
        report.rescanned = (to - from + 1) as u64;
        report.rescan_pending = to < cursor.rescan_until;
    }
    if !matched.is_empty() {
        db.deliver(group, &cursor.topic, &matched, install.position)
            .await?;
    }
    let lowest = matched.iter().copied().min();
    db.advance(group, routed_position, rescan_position, lowest)
        .await?;
    report.routed = matched.len() as u64;
    report.position = routed_position;
    Ok(report)
}

/// Aligns the group's routing with `install`: closes the previous install's ranges, keeps or
/// sets aside its pending deliveries, restores set-aside ones the new set matches, and starts
/// the new install's rescan (the rules: `generations.rs`, ADR 0014). Updates `cursor`.
async fn apply<D: RouteDialect>(
    db: &mut D,
    group: &GroupName,
    cursor: &mut Cursor,
    install: &EffectiveInstall,
    matcher: &BindingMatcher,
) -> Result<SwapReport, QueueError> {
    let start = cursor.start_position.unwrap_or(cursor.routed_position + 1);
    let rescan_through = (cursor.rescan_position - 1).min(cursor.rescan_until);
    db.close_generation(
        group,
        cursor.routed_install,
        cursor.routed_position,
        rescan_through,
    )
    .await?;
    let pending = db.pending(group, install.position).await?;
    let (kept, aside) = split_pending(matcher, &pending);
    let kept = db.restamp(group, &kept, install.position).await?;
    let set_aside = db.set_aside(group, &aside, install.position).await?;
    let parked = db.parked(group).await?;
    let restore = restorable(matcher, &parked);
    let restored = db.restore(group, &restore, install.position).await?;
    let oldest = db.oldest(&cursor.topic).await?;
    let report = SwapReport {
        install: install.position,
        kept,
        set_aside,
        restored,
        rescan_from: rescan_start(start, oldest, cursor.routed_position),
        rescan_until: cursor.routed_position,
    };
    db.open_generation(group, install, cursor.routed_position + 1, &report)
        .await?;
    db.realign(group, start, &report).await?;
    report.log(group.as_str());
    cursor.start_position = Some(start);
    cursor.routed_install = install.position;
    cursor.rescan_position = report.rescan_from;
    cursor.rescan_until = report.rescan_until;
    Ok(report)
}

/// The earlier installs whose ranges overlap `first..=last`, with their compiled sets.
async fn history<D: RouteDialect>(
    db: &mut D,
    matchers: &Matchers,
    group: &GroupName,
    current: i64,
    first: i64,
    last: i64,
) -> Result<History, QueueError> {
    let rows = db.generations(group, current, first, last).await?;
    let mut generations = Vec::with_capacity(rows.len());
    for row in rows {
        generations.push(Generation {
            forward: row.forward,
            rescan: row.rescan,
            matcher: matchers.get(group, row.install, row.patterns.into_iter())?,
        });
    }
    Ok(History(generations))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn look(routed: i64, head: i64, routed_install: i64, install: Option<i64>) -> Look {
        Look {
            routed_position: routed,
            head,
            routed_install,
            rescanned: true,
            install,
        }
    }

    fn group() -> GroupName {
        GroupName::parse("group", "g").unwrap()
    }

    #[test]
    fn a_caught_up_aligned_group_is_settled_at_its_position() {
        assert_eq!(
            look(5, 5, 3, Some(3)).settled(&group(), None).unwrap(),
            Some(5)
        );
    }

    #[test]
    fn a_group_behind_its_head_or_its_install_is_not_settled() {
        assert_eq!(
            look(4, 5, 3, Some(3)).settled(&group(), None).unwrap(),
            None
        );
        assert_eq!(
            look(5, 5, 3, Some(8)).settled(&group(), None).unwrap(),
            None
        );
        let rescanning = Look {
            rescanned: false,
            ..look(5, 5, 3, Some(3))
        };
        assert_eq!(rescanning.settled(&group(), None).unwrap(), None);
    }

    #[test]
    fn a_look_with_another_install_than_the_fence_is_fenced() {
        let fenced = look(5, 5, 3, Some(8)).settled(&group(), Some(InstallFence::joined(3)));
        assert!(matches!(fenced, Err(QueueError::Fenced { joined: 3, .. })));
    }
}
