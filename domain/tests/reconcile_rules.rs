//! The reconcile state machine, one rule at a time: inputs in, actions out.

use std::collections::BTreeMap;
use std::time::Duration;

use wharf_domain::session::{
    plan, subscription_id, Action, ExactFilter, FilterRecord, Input, Plan, Qos, ReconcileSettings,
    Reconciler, SessionLevel, SubscribeOutcome,
};

const GRACE: Duration = Duration::from_secs(10);
const Q1: Qos = Qos::AtLeastOnce;

fn f(text: &str) -> ExactFilter {
    ExactFilter::parse(text).expect("valid filter")
}

fn history(texts: &[&str]) -> BTreeMap<ExactFilter, FilterRecord> {
    texts
        .iter()
        .map(|t| {
            (
                f(t),
                FilterRecord {
                    qos: Some(Q1),
                    ..FilterRecord::default()
                },
            )
        })
        .collect()
}

fn granted(qos: Qos) -> SubscribeOutcome {
    SubscribeOutcome::Granted { qos }
}

/// A machine plus the driver's clock and connection counter.
struct Driver {
    machine: Reconciler,
    now: Duration,
    generation: u64,
    next_id: u64,
}

impl Driver {
    fn new(desired: &[&str], hist: &[&str]) -> Self {
        let desired = desired.iter().map(|t| (f(t), Q1)).collect();
        let settings = ReconcileSettings::new(GRACE);
        Self {
            machine: Reconciler::new(desired, history(hist), settings).expect("valid desired set"),
            now: Duration::from_secs(1000),
            generation: 0,
            next_id: 0,
        }
    }

    fn feed(&mut self, input: Input) -> Vec<Action> {
        self.machine.handle(input, self.now)
    }

    fn connect(&mut self) -> Vec<Action> {
        self.generation += 1;
        let generation = self.generation;
        self.feed(Input::Connected {
            generation,
            session_present: true,
        })
    }

    fn disconnect(&mut self) -> Vec<Action> {
        let generation = self.generation;
        self.feed(Input::Disconnected { generation })
    }

    fn suback(&mut self, outcomes: &[(&str, SubscribeOutcome)]) -> Vec<Action> {
        let outcomes = outcomes.iter().map(|(t, o)| (f(t), *o)).collect();
        let generation = self.generation;
        self.feed(Input::SubAck {
            generation,
            outcomes,
        })
    }

    fn unsuback(&mut self, outcomes: &[(&str, u8)]) -> Vec<Action> {
        let outcomes = outcomes.iter().map(|(t, r)| (f(t), *r)).collect();
        let generation = self.generation;
        self.feed(Input::UnsubAck {
            generation,
            outcomes,
        })
    }

    fn deliver(&mut self, topic: &str, dup: bool, ids: Vec<u32>) -> (u64, Vec<Action>) {
        self.next_id += 1;
        let id = self.next_id;
        let input = Input::Delivery {
            id,
            generation: self.generation,
            topic: topic.into(),
            dup,
            subscription_ids: ids,
        };
        (id, self.feed(input))
    }

    fn advance(&mut self, by: Duration) -> Vec<Action> {
        self.now += by;
        self.feed(Input::Tick)
    }

    /// Connects and gets every desired filter granted; returns the SUBACK's actions.
    fn converge_connection(&mut self, desired: &[&str]) -> Vec<Action> {
        self.connect();
        let all: Vec<(&str, SubscribeOutcome)> =
            desired.iter().map(|t| (*t, granted(Q1))).collect();
        self.suback(&all)
    }

    /// From a stale `old` filter: subscribe `new`, unsubscribe `old` with `reason`, recycle,
    /// re-subscribe on the replacement connection. Stops inside the verification window.
    fn reach_window(&mut self, new: &str, old: &str, reason: u8) {
        assert_eq!(
            self.converge_connection(&[new]),
            vec![
                Action::Level(SessionLevel::Subscribed),
                Action::Unsubscribe(vec![f(old)])
            ]
        );
        assert_eq!(self.unsuback(&[(old, reason)]), vec![Action::Recycle]);
        assert_eq!(
            self.disconnect(),
            vec![Action::Level(SessionLevel::Starting)]
        );
        self.converge_connection(&[new]);
    }
}

fn subscribe(texts: &[&str]) -> Action {
    Action::Subscribe(texts.iter().map(|t| (f(t), Q1)).collect())
}

// --- Remember before SUBSCRIBE ------------------------------------------------------------------

#[test]
fn a_new_filter_is_remembered_before_it_is_subscribed_and_known_ones_go_at_once() {
    let mut d = Driver::new(&["a/#", "b"], &["b"]);
    assert_eq!(
        d.connect(),
        vec![
            Action::Level(SessionLevel::Connected),
            subscribe(&["b"]),
            Action::Remember(vec![(f("a/#"), Q1)])
        ]
    );
    assert_eq!(
        d.advance(GRACE),
        vec![],
        "nothing new is subscribed before the ledger commits"
    );
    assert_eq!(
        d.suback(&[("b", granted(Q1))]),
        vec![],
        "a/# is not answered yet"
    );
    assert_eq!(d.feed(Input::Remembered), vec![subscribe(&["a/#"])]);
    assert!(d.machine.history().contains_key(&f("a/#")));
    assert_eq!(
        d.suback(&[("a/#", granted(Q1))]),
        vec![
            Action::Level(SessionLevel::Subscribed),
            Action::Level(SessionLevel::Full)
        ]
    );
}

/// A machine whose first Remember carries at most `wave` filters.
fn waves(desired: &[&str], hist: &[&str], wave: usize) -> Driver {
    let mut d = Driver::new(desired, hist);
    let desired = desired.iter().map(|t| (f(t), Q1)).collect();
    let settings = ReconcileSettings::new(GRACE).with_first_wave(wave);
    d.machine = Reconciler::new(desired, history(hist), settings).expect("valid desired set");
    d
}

#[test]
fn remembers_go_in_growing_waves_each_subscribed_once_durable_while_the_next_is_written() {
    let mut d = waves(&["a", "b", "c", "d", "e", "f", "g", "h"], &[], 1);
    assert_eq!(
        d.connect(),
        vec![
            Action::Level(SessionLevel::Connected),
            Action::Remember(vec![(f("a"), Q1)])
        ],
        "one small wave first, nothing subscribed before it is durable"
    );
    assert_eq!(
        d.feed(Input::Remembered),
        vec![
            subscribe(&["a"]),
            Action::Remember(vec![(f("b"), Q1), (f("c"), Q1)])
        ],
        "each wave up to twice the one before"
    );
    // The broker answers the first wave while the second is written.
    assert_eq!(d.suback(&[("a", granted(Q1))]), vec![]);
    let third: Vec<_> = ["d", "e", "f", "g"].iter().map(|t| (f(t), Q1)).collect();
    assert_eq!(
        d.feed(Input::Remembered),
        vec![subscribe(&["b", "c"]), Action::Remember(third)]
    );
    assert_eq!(
        d.feed(Input::Remembered),
        vec![
            subscribe(&["d", "e", "f", "g"]),
            Action::Remember(vec![(f("h"), Q1)])
        ]
    );
    assert_eq!(d.feed(Input::Remembered), vec![subscribe(&["h"])]);
    // Answers in any order; judged once every Subscribe is answered.
    assert_eq!(d.suback(&[("h", granted(Q1))]), vec![]);
    let rest: Vec<_> = ["d", "e", "f", "g"]
        .iter()
        .map(|t| (*t, granted(Q1)))
        .collect();
    assert_eq!(d.suback(&rest), vec![]);
    assert_eq!(
        d.suback(&[("b", granted(Q1)), ("c", granted(Q1))]),
        vec![
            Action::Level(SessionLevel::Subscribed),
            Action::Level(SessionLevel::Full)
        ]
    );
}

#[test]
fn a_refusal_in_an_early_wave_fails_the_reconcile_once_all_are_answered_naming_it() {
    let mut d = waves(&["a", "b", "c"], &[], 2);
    d.connect();
    d.feed(Input::Remembered);
    let refused = SubscribeOutcome::Refused { reason_code: 0x87 };
    assert_eq!(d.suback(&[("a", refused), ("b", granted(Q1))]), vec![]);
    assert_eq!(d.feed(Input::Remembered), vec![subscribe(&["c"])]);
    let actions = d.suback(&[("c", granted(Q1))]);
    assert!(
        matches!(&actions[..], [Action::Failed { reason }] if reason.contains("\"a\" refused with reason 0x87")),
        "{actions:?}"
    );
    assert_eq!(d.machine.level(), SessionLevel::Connected);
    assert!(d.machine.history().contains_key(&f("a")), "history kept");
}

#[test]
fn a_wave_committed_after_its_connection_ended_is_subscribed_on_the_next_one() {
    let mut d = waves(&["a", "b", "c"], &[], 2);
    d.connect();
    assert_eq!(d.disconnect(), vec![Action::Level(SessionLevel::Starting)]);
    assert_eq!(
        d.feed(Input::Remembered),
        vec![],
        "no connection to subscribe on"
    );
    assert_eq!(
        d.connect(),
        vec![
            Action::Level(SessionLevel::Connected),
            subscribe(&["a", "b"]),
            Action::Remember(vec![(f("c"), Q1)])
        ]
    );
}

#[test]
fn a_suback_nobody_asked_for_is_ignored() {
    let mut d = waves(&["a", "b"], &[], 1);
    d.connect();
    assert_eq!(
        d.suback(&[("a", granted(Q1))]),
        vec![],
        "a is not subscribed yet"
    );
    assert_eq!(d.machine.ignored_inputs(), 1);
    assert_eq!(
        d.feed(Input::Remembered),
        vec![subscribe(&["a"]), Action::Remember(vec![(f("b"), Q1)])]
    );
}

#[test]
fn a_seeded_filter_without_a_qos_is_remembered_at_its_qos() {
    let mut hist = history(&[]);
    hist.insert(f("a"), FilterRecord::default());
    let settings = ReconcileSettings::new(GRACE);
    let mut m = Reconciler::new(vec![(f("a"), Q1)], hist, settings).unwrap();
    let actions = m.handle(
        Input::Connected {
            generation: 1,
            session_present: true,
        },
        GRACE,
    );
    assert!(
        actions.contains(&Action::Remember(vec![(f("a"), Q1)])),
        "{actions:?}"
    );
}

#[test]
fn all_desired_filters_are_subscribed_on_every_connection() {
    let mut d = Driver::new(&["a", "b"], &["a", "b"]);
    assert_eq!(
        d.connect(),
        vec![
            Action::Level(SessionLevel::Connected),
            subscribe(&["a", "b"])
        ]
    );
    d.disconnect();
    assert_eq!(
        d.connect()[1],
        subscribe(&["a", "b"]),
        "even with session_present"
    );
}

#[test]
fn a_remember_committed_while_disconnected_subscribes_on_the_next_connection() {
    let mut d = Driver::new(&["a"], &[]);
    d.connect();
    d.disconnect();
    assert_eq!(d.feed(Input::Remembered), vec![]);
    assert_eq!(
        d.connect(),
        vec![Action::Level(SessionLevel::Connected), subscribe(&["a"])]
    );
}

#[test]
fn nothing_desired_and_nothing_stale_is_full_without_a_subscribe() {
    let mut d = Driver::new(&[], &[]);
    assert_eq!(
        d.connect(),
        vec![
            Action::Level(SessionLevel::Connected),
            Action::Level(SessionLevel::Subscribed),
            Action::Level(SessionLevel::Full),
        ]
    );
}

// --- SUBACK -------------------------------------------------------------------------------------

#[test]
fn all_granted_with_nothing_stale_reaches_full() {
    let mut d = Driver::new(&["a", "b"], &["a", "b"]);
    d.connect();
    let two = granted(Qos::ExactlyOnce);
    assert_eq!(
        d.suback(&[("a", granted(Q1)), ("b", two)]),
        vec![
            Action::Level(SessionLevel::Subscribed),
            Action::Level(SessionLevel::Full)
        ]
    );
    assert!(d.machine.level().is_ready());
}

#[test]
fn a_refused_short_or_downgraded_suback_fails_and_keeps_history() {
    let cases: [(&[(&str, SubscribeOutcome)], &str); 3] = [
        (
            &[
                ("a", granted(Q1)),
                ("b", SubscribeOutcome::Refused { reason_code: 0x87 }),
            ],
            "\"b\" refused with reason 0x87",
        ),
        (&[("a", granted(Q1))], "no SUBACK outcome for \"b\""),
        (
            &[("a", granted(Q1)), ("b", granted(Qos::AtMostOnce))],
            "\"b\" granted QoS 0, below the requested 1",
        ),
    ];
    for (outcomes, expected) in cases {
        let mut d = Driver::new(&["a", "b"], &["a", "b", "old"]);
        d.connect();
        let actions = d.suback(outcomes);
        let [Action::Failed { reason }] = actions.as_slice() else {
            panic!("expected one Failed, got {actions:?}");
        };
        assert!(reason.contains(expected), "{reason}");
        assert_eq!(d.machine.level(), SessionLevel::Connected);
        assert_eq!(d.machine.history().len(), 3);
        let (_, delivered) = d.deliver("a", false, vec![]);
        assert_eq!(delivered, vec![], "nothing is dispatched below Subscribed");
        assert_eq!(d.advance(GRACE * 3), vec![]);
    }
}

#[test]
fn after_a_failure_the_next_connection_retries() {
    let mut d = Driver::new(&["a"], &["a"]);
    d.connect();
    d.suback(&[]);
    d.disconnect();
    assert_eq!(
        d.converge_connection(&["a"]).last(),
        Some(&Action::Level(SessionLevel::Full))
    );
}

// --- Stale filters, UNSUBACK, recycle, window, Forget -------------------------------------------

#[test]
fn stale_filters_are_unsubscribed_by_their_exact_strings() {
    let mut d = Driver::new(&["a"], &["a", "$share/g/old/#", "old/#"]);
    assert_eq!(
        d.converge_connection(&["a"]),
        vec![
            Action::Level(SessionLevel::Subscribed),
            Action::Unsubscribe(vec![f("$share/g/old/#"), f("old/#")]),
        ]
    );
}

#[test]
fn a_verified_removal_recycles_watches_one_window_then_forgets_and_reaches_full() {
    let mut d = Driver::new(&["new/#"], &["new/#", "old/#", "gone"]);
    d.converge_connection(&["new/#"]);
    assert_eq!(
        d.unsuback(&[("old/#", 0x00), ("gone", 0x11)]),
        vec![Action::Recycle]
    );
    d.disconnect();
    assert_eq!(
        d.connect(),
        vec![
            Action::Level(SessionLevel::Connected),
            subscribe(&["new/#"])
        ]
    );
    assert_eq!(
        d.suback(&[("new/#", granted(Q1))]),
        vec![Action::Level(SessionLevel::Subscribed)]
    );
    assert_eq!(d.machine.next_deadline(), Some(d.now + GRACE));
    assert_eq!(d.advance(GRACE - Duration::from_millis(1)), vec![]);
    assert_eq!(
        d.advance(Duration::from_millis(1)),
        vec![Action::Forget(vec![(f("gone"), 0x11), (f("old/#"), 0x00)])]
    );
    assert_eq!(
        d.machine.level(),
        SessionLevel::Subscribed,
        "not Full before the ledger commits"
    );
    assert_eq!(
        d.machine.status().pending_stale,
        vec![f("gone"), f("old/#")]
    );
    assert_eq!(
        d.feed(Input::Forgotten),
        vec![Action::Level(SessionLevel::Full)]
    );
    let status = d.machine.status();
    assert_eq!(status.history, vec![f("new/#")]);
    assert!(status.pending_stale.is_empty() && status.last_failure.is_none());
    assert_eq!(status.level, SessionLevel::Full);
}

#[test]
fn a_failed_or_missing_unsuback_keeps_the_filter_and_fails() {
    for outcome in [vec![("old", 0x87)], vec![]] {
        let mut d = Driver::new(&["a"], &["a", "old"]);
        d.converge_connection(&["a"]);
        let actions = d.unsuback(&outcome);
        let [Action::Failed { reason }] = actions.as_slice() else {
            panic!("expected one Failed, got {actions:?}");
        };
        assert!(reason.contains("\"old\""), "{reason}");
        assert_eq!(d.machine.level(), SessionLevel::Subscribed);
        assert_eq!(d.advance(GRACE * 5), vec![], "never forgotten");
        assert_eq!(d.machine.pending_stale(), vec![f("old")]);
    }
}

#[test]
fn a_partial_unsuback_forgets_the_verified_one_and_retries_the_other() {
    let mut d = Driver::new(&["a"], &["a", "x", "y"]);
    d.converge_connection(&["a"]);
    assert_eq!(d.unsuback(&[("x", 0x00)]), vec![Action::Recycle]);
    d.disconnect();
    d.converge_connection(&["a"]);
    assert_eq!(d.advance(GRACE), vec![Action::Forget(vec![(f("x"), 0x00)])]);
    assert_eq!(
        d.feed(Input::Forgotten),
        vec![Action::Unsubscribe(vec![f("y")])]
    );
    assert_eq!(d.unsuback(&[("y", 0x80)]).len(), 1, "Failed");
    assert_eq!(d.machine.pending_stale(), vec![f("y")]);
}

#[test]
fn a_window_cut_short_by_a_disconnect_starts_again_on_the_next_connection() {
    let mut d = Driver::new(&["a"], &["a", "old"]);
    d.reach_window("a", "old", 0x00);
    d.advance(GRACE / 2);
    d.disconnect();
    d.converge_connection(&["a"]);
    assert_eq!(d.advance(GRACE / 2), vec![], "a fresh window");
    assert_eq!(
        d.advance(GRACE / 2),
        vec![Action::Forget(vec![(f("old"), 0x00)])]
    );
}

#[test]
fn a_crash_between_unsuback_and_forget_is_reconciled_by_the_next_start() {
    let mut d = Driver::new(&["a"], &["a", "old"]);
    d.reach_window("a", "old", 0x00);
    // Crash: the ledger still holds "old"; a new machine starts from it.
    let mut d2 = Driver::new(&["a"], &["a", "old"]);
    d2.generation = d.generation;
    d2.reach_window("a", "old", 0x11);
    assert_eq!(
        d2.advance(GRACE),
        vec![Action::Forget(vec![(f("old"), 0x11)])]
    );
}

// --- Deliveries ---------------------------------------------------------------------------------

#[test]
fn desired_deliveries_dispatch_once_subscribed_in_arrival_order() {
    let mut d = Driver::new(&["a/#"], &["a/#"]);
    d.connect();
    let (first, early) = d.deliver("a/1", false, vec![]);
    assert_eq!(early, vec![], "waits for the SUBACK");
    assert_eq!(
        d.machine.next_deadline(),
        None,
        "no clock involved in that wait"
    );
    let actions = d.suback(&[("a/#", granted(Q1))]);
    assert!(
        actions.contains(&Action::Dispatch { id: first }),
        "{actions:?}"
    );
    let (second, now) = d.deliver("a/2", true, vec![]);
    assert_eq!(now, vec![Action::Dispatch { id: second }]);
}

#[test]
fn with_a_removal_pending_nothing_dispatches_before_the_recycle() {
    let mut d = Driver::new(&["a"], &["a", "old"]);
    d.converge_connection(&["a"]);
    let (_, held_back) = d.deliver("a", false, vec![]);
    assert_eq!(held_back, vec![]);
    d.unsuback(&[("old", 0x00)]);
    assert_eq!(d.advance(GRACE * 2), vec![], "no dispatch while recycling");
    d.disconnect();
    d.converge_connection(&["a"]);
    let (id, actions) = d.deliver("a", true, vec![]);
    assert_eq!(
        actions,
        vec![Action::Dispatch { id }],
        "dispatch during the window"
    );
}

#[test]
fn a_delivery_covered_only_by_a_pending_stale_filter_is_held_forever() {
    let mut d = Driver::new(&["a"], &["a", "old/#", "$share/g/s/#"]);
    d.converge_connection(&["a"]);
    let (id, actions) = d.deliver("old/x", false, vec![]);
    assert_eq!(actions, vec![Action::Hold { id }]);
    let (id, actions) = d.deliver("s/1", true, vec![]);
    assert_eq!(
        actions,
        vec![Action::Hold { id }],
        "pending, not removed: no migration"
    );
    assert_eq!(d.advance(GRACE * 10), vec![]);
}

#[test]
fn a_delivery_matching_nothing_is_acked_after_the_grace_on_its_connection_only() {
    let mut d = Driver::new(&["a"], &["a"]);
    d.converge_connection(&["a"]);
    let (id, actions) = d.deliver("zzz", false, vec![]);
    assert_eq!(actions, vec![]);
    assert_eq!(d.machine.next_deadline(), Some(d.now + GRACE));
    assert_eq!(d.advance(GRACE - Duration::from_millis(1)), vec![]);
    assert_eq!(
        d.advance(Duration::from_millis(1)),
        vec![Action::AckUnmatched { id }]
    );
    d.deliver("zzz", false, vec![]);
    d.disconnect();
    d.converge_connection(&["a"]);
    assert_eq!(
        d.advance(GRACE * 2),
        vec![],
        "the old connection's delivery is not acked"
    );
}

#[test]
fn the_dollar_rule_applies_to_matching() {
    let mut d = Driver::new(&["#"], &["#"]);
    d.converge_connection(&["#"]);
    let (_, actions) = d.deliver("$SYS/x", false, vec![]);
    assert_eq!(actions, vec![], "'#' does not cover a $ topic: unmatched");
}

// --- Removed shared filters: replays in the window -----------------------------------------------

fn migration_actions(id: u64, actions: &[Action]) {
    assert_eq!(
        actions[0],
        Action::Level(SessionLevel::MigrationRequired),
        "{actions:?}"
    );
    assert_eq!(actions[1], Action::Hold { id });
    assert_eq!(actions[2], Action::Disconnect);
    let Action::RequireMigration { reason, filters } = &actions[3] else {
        panic!("expected RequireMigration, got {actions:?}");
    };
    assert_eq!(filters, &vec![f("$share/g/s/#")]);
    assert!(reason.contains("$share/g/s/#"), "{reason}");
}

#[test]
fn a_replay_through_a_removed_shared_filter_requires_migration() {
    let mut d = Driver::new(&["a"], &["a", "$share/g/s/#"]);
    d.reach_window("a", "$share/g/s/#", 0x00);
    let (id, actions) = d.deliver("s/1", true, vec![]);
    migration_actions(id, &actions);
    assert_eq!(d.machine.level(), SessionLevel::MigrationRequired);
    assert_eq!(d.advance(GRACE * 3), vec![], "no Forget: history kept");
    assert_eq!(d.machine.history().len(), 2);
    let (other, actions) = d.deliver("a", false, vec![]);
    assert_eq!(
        actions,
        vec![Action::Hold { id: other }],
        "terminal: nothing acked"
    );
    d.disconnect();
    assert_eq!(d.connect(), vec![Action::Disconnect]);
}

#[test]
fn a_replay_arriving_before_the_replacement_subscribes_is_caught_too() {
    let mut d = Driver::new(&["a"], &["a", "$share/g/s/#"]);
    d.converge_connection(&["a"]);
    d.unsuback(&[("$share/g/s/#", 0x11)]);
    d.disconnect();
    d.connect();
    let (id, actions) = d.deliver("s/1", true, vec![]);
    migration_actions(id, &actions);
}

#[test]
fn a_replay_is_attributed_by_subscription_id_over_a_matching_desired_filter() {
    let mut d = Driver::new(&["s/+"], &["s/+", "$share/g/s/#"]);
    d.reach_window("s/+", "$share/g/s/#", 0x00);
    let (id, actions) = d.deliver("s/1", true, vec![subscription_id(&f("$share/g/s/#"))]);
    migration_actions(id, &actions);
}

#[test]
fn without_ids_a_topic_a_desired_filter_matches_is_dispatched() {
    let mut d = Driver::new(&["s/+"], &["s/+", "$share/g/s/#"]);
    d.reach_window("s/+", "$share/g/s/#", 0x00);
    let (id, actions) = d.deliver("s/1", true, vec![]);
    assert_eq!(actions, vec![Action::Dispatch { id }]);
}

#[test]
fn new_messages_or_plain_filters_in_the_window_are_held_not_migrated() {
    let mut d = Driver::new(&["a"], &["a", "$share/g/s/#", "p/#"]);
    d.converge_connection(&["a"]);
    d.unsuback(&[("$share/g/s/#", 0x00), ("p/#", 0x00)]);
    let (id, actions) = d.deliver("s/1", true, vec![]);
    assert_eq!(
        actions,
        vec![Action::Hold { id }],
        "old connection: coverage only"
    );
    d.disconnect();
    d.converge_connection(&["a"]);
    let (id, actions) = d.deliver("s/1", false, vec![]);
    assert_eq!(actions, vec![Action::Hold { id }], "not a replay");
    let (id, actions) = d.deliver("p/1", true, vec![]);
    assert_eq!(actions, vec![Action::Hold { id }], "not shared");
    assert_eq!(d.advance(GRACE).len(), 1, "Forget");
}

// --- Generations ---------------------------------------------------------------------------------

#[test]
fn inputs_of_an_old_generation_are_ignored_and_counted() {
    let mut d = Driver::new(&["a"], &["a"]);
    d.connect();
    d.disconnect();
    d.connect();
    let old = d.generation - 1;
    let before = d.machine.ignored_inputs();
    let suback = Input::SubAck {
        generation: old,
        outcomes: vec![(f("a"), granted(Q1))],
    };
    assert_eq!(d.feed(suback), vec![]);
    let delivery = Input::Delivery {
        id: 99,
        generation: old,
        topic: "a".into(),
        dup: false,
        subscription_ids: vec![],
    };
    assert_eq!(d.feed(delivery), vec![]);
    assert_eq!(d.feed(Input::Disconnected { generation: old }), vec![]);
    assert_eq!(
        d.feed(Input::Connected {
            generation: old,
            session_present: true
        }),
        vec![]
    );
    assert_eq!(d.machine.ignored_inputs(), before + 4);
    assert_eq!(d.machine.level(), SessionLevel::Connected);
}

// --- Plan and construction -----------------------------------------------------------------------

#[test]
fn plan_lists_remember_subscribe_unsubscribe_and_forget() {
    let desired = vec![
        (f("new"), Q1),
        (f("kept"), Q1),
        (f("new"), Qos::ExactlyOnce),
    ];
    let p = plan(&desired, &history(&["kept", "$share/g/old"]));
    assert_eq!(
        p,
        Plan {
            remember: vec![(f("new"), Qos::ExactlyOnce)],
            subscribe: vec![(f("kept"), Q1), (f("new"), Qos::ExactlyOnce)],
            unsubscribe: vec![f("$share/g/old")],
            forget_after_verify: vec![f("$share/g/old")],
        }
    );
}

#[test]
fn a_filter_desired_at_two_qos_levels_is_refused_by_name() {
    let settings = ReconcileSettings::new(GRACE);
    let err = Reconciler::new(
        vec![(f("a"), Q1), (f("a"), Qos::AtMostOnce)],
        history(&[]),
        settings,
    )
    .unwrap_err();
    assert_eq!(err.value, "a");
    assert!(err.to_string().contains("QoS 1 and at QoS 0"), "{err}");
}

#[test]
fn subscription_ids_are_stable_and_in_range() {
    let id = subscription_id(&f("$share/g/s/#"));
    assert_eq!(id, subscription_id(&f("$share/g/s/#")));
    assert!((2..=268_435_455).contains(&id));
    assert_ne!(id, subscription_id(&f("$share/h/s/#")));
    // Every plain filter shares one identifier, which no shared filter has.
    assert_eq!(
        subscription_id(&f("s/#")),
        wharf_domain::session::PLAIN_SUBSCRIPTION_ID
    );
    assert_eq!(subscription_id(&f("a/+/b")), subscription_id(&f("s/#")));
    assert_ne!(id, subscription_id(&f("s/#")));
}

#[test]
fn from_ledger_fails_closed_on_unknown_history_and_migration() {
    use wharf_domain::session::{ManagedFilterEvent, ManagedSession, ManagedSessionError};
    let settings = ReconcileSettings::new(GRACE);
    let unknown = ManagedSession::default();
    let err = Reconciler::from_ledger(vec![(f("a"), Q1)], &unknown, settings).unwrap_err();
    assert_eq!(err, ManagedSessionError::HistoryUnknown);
    let seeded = ManagedFilterEvent::BaselineSeeded {
        filters: vec![f("old")],
        source: "cli".into(),
    };
    let known = ManagedSession::fold(std::slice::from_ref(&seeded));
    let m = Reconciler::from_ledger(vec![(f("a"), Q1)], &known, settings).expect("known history");
    assert_eq!(m.pending_stale(), vec![f("old")]);
    let migration = ManagedFilterEvent::MigrationRequired {
        reason: "replay".into(),
        filters: vec![],
    };
    let terminal = ManagedSession::fold(&[seeded, migration]);
    let err = Reconciler::from_ledger(vec![], &terminal, settings).unwrap_err();
    assert_eq!(
        err,
        ManagedSessionError::MigrationRequired {
            reason: "replay".into()
        }
    );
    let err = Reconciler::from_ledger(
        vec![(f("a"), Q1), (f("a"), Qos::ExactlyOnce)],
        &known,
        settings,
    )
    .unwrap_err();
    assert!(
        matches!(err, ManagedSessionError::ConflictingQos { .. }),
        "{err}"
    );
}
