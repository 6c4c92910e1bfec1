//! What a swap does to a group's routing, as plain functions both backends share (ADR 0014).
//!
//! The rule: after install N commits, a claim hands out only deliveries stamped with N, and N
//! applies to everything the group has not consumed while the log still holds it. The router
//! applies N at its first step after the swap, under the group row lock:
//!
//! - each delivery routed under an earlier install and not yet acked is **kept** (re-stamped
//!   with N) when N's set matches its subject, and **set aside** otherwise; set-aside
//!   deliveries that N's set matches are **restored**;
//! - forward routing of new messages goes on from where the old install stopped, under N;
//! - beside it, one batch per routing step, N **rescans** what the log still holds from its
//!   oldest message (never before the group's start) up to where the old install stopped, and
//!   delivers each message N matches unless an earlier install whose ranges covered that
//!   position matched it too: that install delivered it then, so it is pending (kept or set
//!   aside), acked, or dead, and must not come again.

use std::sync::Arc;

use wharf_domain::BindingMatcher;

/// An earlier install and the log ranges routed under it (forward and rescanned, inclusive;
/// an empty range has its end before its start).
pub(crate) struct Generation {
    /// The forward range.
    pub forward: (i64, i64),
    /// The rescanned range.
    pub rescan: (i64, i64),
    /// Its set.
    pub matcher: Arc<BindingMatcher>,
}

impl Generation {
    fn covers(&self, position: i64) -> bool {
        let within = |(from, through): (i64, i64)| from <= position && position <= through;
        within(self.forward) || within(self.rescan)
    }
}

/// The earlier installs whose ranges overlap a routing step's slice.
#[derive(Default)]
pub(crate) struct History(pub Vec<Generation>);

impl History {
    /// True when an earlier install routed `position` and matched `subject`: it delivered the
    /// message then.
    pub(crate) fn delivered(&self, position: i64, subject: &str) -> bool {
        self.0
            .iter()
            .any(|g| g.covers(position) && g.matcher.matches_str(subject))
    }
}

/// Whether a routing step under `current` makes a delivery of the message at `position`.
pub(crate) fn delivers(
    current: &BindingMatcher,
    history: &History,
    position: i64,
    subject: &str,
) -> bool {
    current.matches_str(subject) && !history.delivered(position, subject)
}

/// The positions of a forward slice (never routed before) that `current` delivers.
pub(crate) fn forward_matches(current: &BindingMatcher, slice: &[(i64, String)]) -> Vec<i64> {
    slice
        .iter()
        .filter(|(_, subject)| current.matches_str(subject))
        .map(|(position, _)| *position)
        .collect()
}

/// The positions of a rescanned slice that `current` delivers: those it matches and no earlier
/// install delivered.
pub(crate) fn rescan_matches(
    current: &BindingMatcher,
    history: &History,
    slice: &[(i64, String)],
) -> Vec<i64> {
    slice
        .iter()
        .filter(|(position, subject)| delivers(current, history, *position, subject))
        .map(|(position, _)| *position)
        .collect()
}

/// The log ranges (inclusive) one routing step reads: up to `batch` positions forward of the
/// cursor, up to the committed head, and up to `batch` positions of a pending rescan.
///
/// Steps are bounded by position, not by a row count: positions are gapless up to the head
/// (retention only removes old ones, and the cursor then simply moves past the gap), so a step
/// reads at most `batch` rows whatever plan the store picks for the range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StepRanges {
    /// New positions to route.
    pub forward: Option<(i64, i64)>,
    /// Older positions to rescan under a new install.
    pub rescan: Option<(i64, i64)>,
}

impl StepRanges {
    pub(crate) fn new(
        routed: i64,
        head: i64,
        rescan_position: i64,
        rescan_until: i64,
        batch: i64,
    ) -> Self {
        let batch = batch.max(1);
        Self {
            forward: (routed < head).then(|| (routed + 1, head.min(routed + batch))),
            rescan: (rescan_position <= rescan_until).then(|| {
                (
                    rescan_position,
                    rescan_until.min(rescan_position + batch - 1),
                )
            }),
        }
    }
}

/// The first position a new install rescans: the oldest message the log still holds, but never
/// before the group's start; `routed + 1` (nothing to rescan) when the log is empty.
pub(crate) fn rescan_start(start: i64, oldest_retained: Option<i64>, routed: i64) -> i64 {
    oldest_retained.map_or(routed + 1, |oldest| oldest.max(start).min(routed + 1))
}

/// Pending deliveries split by the new set: `(kept, set_aside)` positions. A delivery whose
/// log row is gone (retention) is set aside: nothing could hand it out.
pub(crate) fn split_pending(
    current: &BindingMatcher,
    pending: &[(i64, Option<String>)],
) -> (Vec<i64>, Vec<i64>) {
    let mut kept = Vec::new();
    let mut aside = Vec::new();
    for (position, subject) in pending {
        match subject {
            Some(subject) if current.matches_str(subject) => kept.push(*position),
            _ => aside.push(*position),
        }
    }
    (kept, aside)
}

/// The set-aside deliveries the new set matches again.
pub(crate) fn restorable(current: &BindingMatcher, aside: &[(i64, String)]) -> Vec<i64> {
    aside
        .iter()
        .filter(|(_, subject)| current.matches_str(subject))
        .map(|(position, _)| *position)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use wharf_domain::BindingSet;

    fn matcher(patterns: &[&str]) -> Arc<BindingMatcher> {
        Arc::new(BindingMatcher::new(&BindingSet::parse(patterns).unwrap()))
    }

    #[test]
    fn an_earlier_match_inside_its_ranges_counts_as_delivered() {
        let history = History(vec![Generation {
            forward: (10, 20),
            rescan: (3, 5),
            matcher: matcher(&["x/+"]),
        }]);
        let current = matcher(&["x/+", "y/+"]);
        assert!(
            !delivers(&current, &history, 15, "x/1"),
            "x/1 was delivered under x/+"
        );
        assert!(
            !delivers(&current, &history, 4, "x/1"),
            "and so was x/1 at 4, rescanned"
        );
        assert!(
            delivers(&current, &history, 15, "y/1"),
            "y/1 was routed past, never delivered"
        );
        assert!(
            delivers(&current, &history, 21, "x/1"),
            "21 lies past x/+'s ranges"
        );
        assert!(
            delivers(&current, &history, 7, "x/1"),
            "7 lies between x/+'s ranges"
        );
        assert!(
            !delivers(&current, &history, 15, "z/1"),
            "the current set does not match z/1"
        );
    }

    #[test]
    fn a_rescan_starts_at_the_oldest_retained_message_after_the_start() {
        assert_eq!(
            rescan_start(5, Some(1), 100),
            5,
            "never before the group's start"
        );
        assert_eq!(
            rescan_start(5, Some(40), 100),
            40,
            "never before what the log holds"
        );
        assert_eq!(
            rescan_start(5, None, 100),
            101,
            "an empty log: nothing to rescan"
        );
        assert_eq!(
            rescan_start(5, Some(120), 100),
            101,
            "nothing held below the cursor"
        );
    }

    #[test]
    fn a_step_reads_at_most_a_batch_of_positions_each_way() {
        let both = StepRanges::new(100, 1_000, 10, 100, 50);
        assert_eq!(both.forward, Some((101, 150)));
        assert_eq!(both.rescan, Some((10, 59)));
        let near_the_end = StepRanges::new(100, 120, 90, 100, 50);
        assert_eq!(
            near_the_end.forward,
            Some((101, 120)),
            "never past the head"
        );
        assert_eq!(
            near_the_end.rescan,
            Some((90, 100)),
            "never past the rescan's end"
        );
        let idle = StepRanges::new(120, 120, 101, 100, 50);
        assert_eq!((idle.forward, idle.rescan), (None, None));
        let current = matcher(&["y/+"]);
        let slice = vec![(3, "y/1".to_owned()), (4, "x/1".to_owned())];
        assert_eq!(forward_matches(&current, &slice), vec![3]);
        assert_eq!(
            rescan_matches(&current, &History::default(), &slice),
            vec![3]
        );
    }

    #[test]
    fn pending_deliveries_split_by_the_new_set() {
        let current = matcher(&["y/+"]);
        let pending = vec![
            (1, Some("x/1".to_owned())),
            (2, Some("y/1".to_owned())),
            (3, None),
        ];
        assert_eq!(split_pending(&current, &pending), (vec![2], vec![1, 3]));
        let aside = vec![(4, "y/2".to_owned()), (5, "x/2".to_owned())];
        assert_eq!(restorable(&current, &aside), vec![4]);
    }
}
