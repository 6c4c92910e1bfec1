//! A generated ledger for the listing benchmark: a fleet of `groups` groups over ten topics
//! sharing `events` events, some of them groups with a long ledger of their own.
//!
//! - A fleet group of `n` events installs (declarer `a`), then two declarers (`b`, `c`) retry
//!   a new set while `a` is live, each retry a `Waiting` event with the declarer's first
//!   statement as `declared_at`; its last event is the swap to the new set by `b` (which
//!   resolves `c`), except in every tenth group, whose last event is one more retry: those
//!   groups keep two open waiters.
//! - A long group of `n` events installs, then `n - 1` distinct declarers each wait once for
//!   the new set (a crash-looping deploy: every restart is a new declarer): it keeps `n - 1`
//!   open waiters.
//!
//! Every event is what `decide` returns for that attempt (the test `fleet_events_are_decided`
//! replays each group through the domain and compares). Events of all groups interleave in
//! position order by their time, which grows with position. Loaded with
//! [`append_bulk`](crate::ledger::append_bulk), so a rebuild is what makes the projections.

use chrono::{DateTime, Duration, Utc};
use wharf::domain::{
    AppVersion, Attempt, BindingSet, DeclarationEvent, DeclarerId, GroupName, TopicName,
};

/// How many topics the fleet's groups spread over (group `i` consumes `orders-{i % 10}`).
pub const TOPICS: usize = 10;

/// One group of a fleet ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetGroup {
    /// The group's name.
    pub name: String,
    /// The topic it consumes.
    pub topic: String,
    /// How many events its ledger holds.
    pub events: usize,
    /// Its shape.
    pub shape: Shape,
}

/// What a group's ledger does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Install, retries of two waiters, then the swap: no open waiter.
    Swapped,
    /// Install, retries of two waiters that are still waiting: two open waiters.
    StillWaiting,
    /// Install, then every other event a new declarer's wait: `events - 1` open waiters.
    Long,
}

/// The groups of a fleet ledger: `groups` groups sharing `events` events, of which the groups
/// named in `long` (their own sizes) take their share first; the rest split the remainder.
pub fn fleet(groups: usize, events: usize, long: &[usize]) -> Vec<FleetGroup> {
    let fleet_groups = groups.saturating_sub(long.len()).max(1);
    let rest = events.saturating_sub(long.iter().sum());
    let mut all: Vec<FleetGroup> = (0..fleet_groups)
        .map(|i| FleetGroup {
            name: format!("group-{i:06}"),
            topic: format!("orders-{}", i % TOPICS),
            events: (rest / fleet_groups + usize::from(i < rest % fleet_groups)).max(1),
            shape: if i % 10 == 0 {
                Shape::StillWaiting
            } else {
                Shape::Swapped
            },
        })
        .collect();
    all.extend(long.iter().map(|&n| FleetGroup {
        name: format!("long-{n:07}"),
        topic: "orders-0".to_owned(),
        events: n.max(1),
        shape: Shape::Long,
    }));
    all
}

fn old_set() -> BindingSet {
    BindingSet::parse(&["orders/+/paid", "orders/eu/#"]).expect("a valid set")
}

fn new_set() -> BindingSet {
    BindingSet::parse(&["orders/#"]).expect("a valid set")
}

/// Where `step` of a group of `n` events, the `index`-th of `groups`, falls in the ledger's
/// time span (0 to 1): every group's events spread over the whole span, so that time (and so
/// position) interleaves every group.
fn time_of(index: usize, groups: usize, step: usize, n: usize) -> f64 {
    let offset = index as f64 / groups.max(1) as f64 * 0.5;
    (step as f64 + offset + 0.25) / n as f64
}

/// The time at `key` of a span of 20 hours from `base`.
fn at(base: DateTime<Utc>, key: f64) -> DateTime<Utc> {
    base + Duration::microseconds((key * 20.0 * 3_600.0 * 1e6) as i64)
}

fn attempt(
    group: &FleetGroup,
    who: &str,
    patterns: BindingSet,
    declared_at: DateTime<Utc>,
    attempt_at: DateTime<Utc>,
) -> Attempt {
    Attempt {
        group: GroupName::parse("group", &group.name).expect("group"),
        topic: TopicName::parse("topic", &group.topic).expect("topic"),
        declarer: DeclarerId::parse("declarer", who).expect("declarer"),
        version: AppVersion::parse("version", "1.0.0").expect("version"),
        patterns,
        declared_at,
        attempt_at,
    }
}

/// The `step`-th event (0-based) of `group`, the `index`-th of `groups`.
fn event(
    group: &FleetGroup,
    index: usize,
    groups: usize,
    step: usize,
    base: DateTime<Utc>,
) -> DeclarationEvent {
    let n = group.events;
    let time = |s: usize| at(base, time_of(index, groups, s, n));
    let now = time(step);
    let incumbent = format!("a-{index}");
    let waiting = |who: &str, declared_at| DeclarationEvent::Waiting {
        attempt: attempt(group, who, new_set(), declared_at, now),
        incumbent: old_set(),
        live_declarers: vec![DeclarerId::parse("declarer", &incumbent).expect("declarer")],
    };
    if step == 0 {
        return DeclarationEvent::Installed {
            attempt: attempt(group, &incumbent, old_set(), now, now),
            previous: None,
        };
    }
    if group.shape == Shape::Long {
        return waiting(&format!("w{step:06}-{index}"), now);
    }
    let (b, c) = (format!("b-{index}"), format!("c-{index}"));
    if step + 1 == n && group.shape == Shape::Swapped {
        // b's first statement of the new set: its first retry, or now if it never waited.
        let declared_at = if step > 1 { time(1) } else { now };
        return DeclarationEvent::Installed {
            attempt: attempt(group, &b, new_set(), declared_at, now),
            previous: Some(old_set()),
        };
    }
    if step % 2 == 1 {
        waiting(&b, time(1))
    } else {
        waiting(&c, time(2))
    }
}

/// The fleet's ledger in position order: (group name, sequence from 1, event).
pub fn fleet_ledger(
    groups: Vec<FleetGroup>,
) -> impl Iterator<Item = (String, i64, DeclarationEvent)> + Send + 'static {
    let base = Utc::now() - Duration::hours(21);
    let count = groups.len();
    let mut order: Vec<(f64, u32, u32)> = groups
        .iter()
        .enumerate()
        .flat_map(|(index, group)| {
            (0..group.events).map(move |step| {
                (
                    time_of(index, count, step, group.events),
                    index as u32,
                    step as u32,
                )
            })
        })
        .collect();
    order.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
    order.into_iter().map(move |(_, index, step)| {
        let (index, step) = (index as usize, step as usize);
        let group = &groups[index];
        (
            group.name.clone(),
            step as i64 + 1,
            event(group, index, count, step, base),
        )
    })
}
