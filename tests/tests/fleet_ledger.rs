//! The listing benchmark's generated ledger (`wharf_tests::fleet`) is what the library would
//! write: every event of every group is the one event `decide` returns for that attempt, given
//! the group's state folded from the events before it and the live instances the shape says
//! (the installer `a` live while others wait; none when `b` swaps) and the declarer's open
//! wait the events before it leave, and the generated
//! positions keep each group's sequence order.

use std::collections::HashMap;

use cqrs_es::Aggregate;
use wharf::domain::{
    decide, BindingSet, ConsumerGroup, DeclarationEvent, LiveInstance, OpenWaits, Register,
};
use wharf_tests::fleet::{fleet, fleet_ledger, Shape};

#[test]
fn fleet_events_are_decided() {
    let groups = fleet(23, 2_000, &[40, 3]);
    let shapes: HashMap<String, Shape> = groups.iter().map(|g| (g.name.clone(), g.shape)).collect();
    let sizes: HashMap<String, usize> = groups.iter().map(|g| (g.name.clone(), g.events)).collect();
    assert_eq!(sizes.values().sum::<usize>(), 2_000, "the ledger's size");
    let mut states: HashMap<String, (ConsumerGroup, i64, BindingSet, OpenWaits)> = HashMap::new();
    let mut last_time = None;
    for (group, sequence, event) in fleet_ledger(groups) {
        let attempt = event.attempt().clone();
        assert!(
            last_time.is_none_or(|t| t <= attempt.attempt_at),
            "time grows with position"
        );
        last_time = Some(attempt.attempt_at);
        let (state, seen, installed, waits) = states.entry(group.clone()).or_default();
        assert_eq!(sequence, *seen + 1, "{group}: sequences in position order");
        *seen = sequence;
        // While anyone waits, the installer of the effective set is live; the swap finds none.
        let live = match &event {
            DeclarationEvent::Waiting { .. } => vec![LiveInstance {
                declarer: state
                    .effective
                    .as_ref()
                    .expect("a wait follows an install")
                    .attempt
                    .declarer
                    .clone(),
                patterns: installed.clone(),
            }],
            DeclarationEvent::Installed { .. } => Vec::new(),
        };
        let command = Register {
            group: attempt.group.clone(),
            topic: attempt.topic.clone(),
            declarer: attempt.declarer.clone(),
            version: attempt.version.clone(),
            requested: attempt.patterns.clone(),
            first_declared_at: None,
            now: attempt.attempt_at,
            live_instances: live,
            open_wait: waits.get(&attempt.declarer).cloned(),
        };
        let decision = decide(state, &command).expect("a decision");
        assert_eq!(decision.events, vec![event.clone()], "{group} #{sequence}");
        if event.is_installed() {
            *installed = attempt.patterns.clone();
        }
        waits.apply(&event);
        state.apply(event);
    }
    for (group, (_, seen, _, waits)) in &states {
        assert_eq!(
            *seen as usize, sizes[group],
            "{group}: every event generated"
        );
        let open = waits.len();
        let expected = match shapes[group] {
            Shape::Swapped => 0,
            Shape::StillWaiting => 2,
            Shape::Long => sizes[group] - 1,
        };
        assert_eq!(open, expected, "{group}: open waiters");
    }
}
